"""GPU kernel problems: one invocation of a Triton template with concrete shapes and an input dtype.

A ``CudaProblem`` carries what ``ops.kernel.Problem`` carries (op, dims,
epilogue) plus what a GPU kernel also depends on: the input dtype, a residual
added after the activation, attention's causal mask and a fused MLP's layers.
The kinds:

- ``gemm`` (M, N, K): ``act(A @ B + bias) [+ R]``; fp32 accumulation whatever the inputs;
- ``softmax``, ``layernorm``, ``rmsnorm`` (rows, cols): row-wise over the last axis;
- ``eltwise`` (rows, cols): a chain of elementwise steps (``bias_gelu_add``);
- ``mlp``: ``layers`` = ((K, N, act), ...), one row through every layer in one launch;
- ``attention`` (batch, heads, seq, head_dim): ``softmax(Q K^T / sqrt(d)) V``, ``causal`` optional.

Dtypes: ``fp32`` (IEEE fp32 products), ``tf32`` (fp32 in memory, TF32 tensor-core
products), ``bf16`` and ``fp16`` (inputs and output in that type). Inputs are
drawn in fp32 and rounded to the storage dtype first, so that the fp64
reference sees exactly the values the kernel reads; the tolerance then covers
the accumulation, the rounding of TF32 products and of the stored output.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...ops.kernel import ProblemError, activations, parse_chain
from .devices import DTYPES

OPS = {"gemm": "M,N,K", "softmax": "rows,cols", "layernorm": "rows,cols", "rmsnorm": "rows,cols",
       "eltwise": "rows,cols", "attention": "batch,heads,seq,head_dim", "mlp": ""}
# activations the Triton epilogues implement (an op added to the registry later needs its Triton line in
# jit/common.py before a GPU template may fuse it)
TRITON_ACTS = ("relu", "gelu", "sigmoid", "silu", "tanh")
# unit roundoff of each storage dtype, and of the products TF32 tensor cores form
UNIT = {"fp32": 2.0**-24, "tf32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}
PRODUCT_UNIT = {"fp32": 0.0, "tf32": 2.0**-11, "bf16": 0.0, "fp16": 0.0}
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}


def gemm_epilogues() -> tuple[str, ...]:
    """``none``, ``bias`` and ``bias_<act>`` for every registry activation with a Triton epilogue."""
    ops = [op for op in activations().values() if op in TRITON_ACTS]
    return ("none", "bias", *(f"bias_{op}" for op in ops))


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` (fp32) rounded to the storage ``dtype`` and back to fp32 (round to nearest even)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.astype(np.uint32).view(np.float32)
    return x


@dataclass(frozen=True)
class CudaProblem:
    """One GPU kernel invocation.

    Parameters:
        op: a key of ``OPS``.
        dims: the sizes ``OPS[op]`` names (``mlp``: empty; its sizes are in ``layers``).
        epilogue: gemm: one of ``gemm_epilogues()``; eltwise: a chain (``bias_gelu``); else ``none``.
        dtype: the input dtype, one of ``DTYPES`` (default fp32).
        residual: gemm only: add a residual tensor R of the output's shape last (default False).
        causal: attention only: mask keys after the query (default False).
        layers: mlp only: ((K, N, act), ...), ``act`` ``none`` or a ``TRITON_ACTS`` name.
    Raises ``ProblemError`` with the reason for anything else.
    """

    op: str
    dims: tuple[int, ...] = ()
    epilogue: str = "none"
    dtype: str = "fp32"
    residual: bool = False
    causal: bool = False
    layers: tuple[tuple[int, int, str], ...] = ()

    def __post_init__(self):
        if self.op not in OPS:
            raise ProblemError(f"the cuda target has no template for op {self.op!r}; its templates: "
                               f"{', '.join(OPS)}")
        if self.dtype not in DTYPES:
            raise ProblemError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.op == "mlp":
            if not self.layers:
                raise ProblemError("a fused MLP needs at least one layer (K, N, act)")
            for i, (k, n, act) in enumerate(self.layers):
                if not (isinstance(k, int) and isinstance(n, int) and k >= 1 and n >= 1):
                    raise ProblemError(f"layer {i}: sizes must be positive integers, got ({k}, {n})")
                if act != "none" and act not in TRITON_ACTS:
                    raise ProblemError(f"layer {i}: activation {act!r}; choose none or one of {', '.join(TRITON_ACTS)}")
                if i and self.layers[i - 1][1] != k:
                    raise ProblemError(f"layer {i} takes {k} inputs, layer {i - 1} gives {self.layers[i - 1][1]}")
            if self.dtype == "fp16":
                raise ProblemError("the fused MLP runs in fp32, tf32 or bf16")
            return
        names = OPS[self.op]
        want = names.count(",") + 1
        if len(self.dims) != want or not all(isinstance(d, int) and d >= 1 for d in self.dims):
            raise ProblemError(f"{self.op} needs {want} positive integer sizes ({names}), got {self.dims}")
        if self.op == "gemm":
            if self.epilogue not in gemm_epilogues():
                raise ProblemError(f"unknown GEMM epilogue {self.epilogue!r}; choose one of "
                                   f"{', '.join(gemm_epilogues())}")
        elif self.op == "eltwise":
            try:
                steps = parse_chain(self.epilogue)
            except ValueError as e:
                raise ProblemError(str(e)) from None
            bad = [s for s in steps if s not in TRITON_ACTS + ("bias", "add")]
            if bad:
                raise ProblemError(f"eltwise step(s) {', '.join(bad)} have no Triton epilogue")
        elif self.epilogue != "none":
            raise ProblemError(f"{self.op} takes no epilogue")
        if self.residual and self.op != "gemm":
            raise ProblemError("only a GEMM takes a residual (an eltwise chain adds one with its 'add' step)")
        if self.causal and self.op != "attention":
            raise ProblemError("only attention takes a causal mask")
        if self.op == "attention" and self.dims[3] not in (16, 32, 64, 128, 256):
            raise ProblemError(f"attention head_dim must be 16, 32, 64, 128 or 256, got {self.dims[3]}")

    # -- identity ------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op, "dims": list(self.dims), "epilogue": self.epilogue, "dtype": self.dtype}
        if self.residual:
            d["residual"] = True
        if self.causal:
            d["causal"] = True
        if self.layers:
            d["layers"] = [list(x) for x in self.layers]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CudaProblem":
        return cls(d["op"], tuple(int(x) for x in d.get("dims", ())), d.get("epilogue", "none"),
                   d.get("dtype", "fp32"), bool(d.get("residual", False)), bool(d.get("causal", False)),
                   tuple((int(k), int(n), str(a)) for k, n, a in d.get("layers", ())))

    @property
    def key(self) -> str:
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        if self.op == "mlp":
            shape = "-".join([str(self.layers[0][0])] + [str(n) for _, n, _ in self.layers])
        else:
            shape = "x".join(map(str, self.dims))
        extra = "_res" if self.residual else "_causal" if self.causal else ""
        return f"{self.op}_{shape}_{self.epilogue}{extra}_{self.dtype}"

    @property
    def bytes_per_element(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    # -- facts ---------------------------------------------------------------------
    def flops(self) -> float:
        if self.op == "gemm":
            M, N, K = self.dims
            return 2.0 * M * N * K + (M * N * (1 + (self.epilogue != "none")) if self.epilogue != "none" else 0)
        if self.op == "mlp":
            return float(sum(2 * k * n + 2 * n for k, n, _ in self.layers))
        if self.op == "attention":
            B, H, S, D = self.dims
            full = 4.0 * B * H * S * S * D
            return full / 2 if self.causal else full
        rows, cols = self.dims
        per = {"softmax": 5, "layernorm": 8, "rmsnorm": 5}.get(self.op) or len(parse_chain(self.epilogue)) * 2
        return float(rows * cols * per)

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each input's shape, by name (the names the launchers bind)."""
        if self.op == "gemm":
            M, N, K = self.dims
            out = {"A": (M, K), "B": (K, N)}
            if self.epilogue != "none":
                out["bias"] = (N,)
            if self.residual:
                out["R"] = (M, N)
            return out
        if self.op == "mlp":
            out = {"x": (self.layers[0][0],)}
            for i, (k, n, _) in enumerate(self.layers):
                out[f"W{i}"] = (k, n)
                out[f"b{i}"] = (n,)
            return out
        if self.op == "attention":
            return {"q": self.dims, "k": self.dims, "v": self.dims}
        rows, cols = self.dims
        if self.op == "layernorm":
            return {"x": (rows, cols), "gamma": (cols,), "beta": (cols,)}
        if self.op == "rmsnorm":
            return {"x": (rows, cols), "gamma": (cols,)}
        if self.op == "eltwise":
            steps = parse_chain(self.epilogue)
            out = {"x": (rows, cols)}
            if "bias" in steps:
                out["bias"] = (cols,)
            if "add" in steps:
                out["res"] = (rows, cols)
            return out
        return {"x": (rows, cols)}

    def output_shape(self) -> tuple[int, ...]:
        if self.op == "gemm":
            return (self.dims[0], self.dims[1])
        if self.op == "mlp":
            return (self.layers[-1][1],)
        return tuple(self.dims)

    def min_bytes(self) -> float:
        """Bytes any implementation moves at least once (inputs read, output written)."""
        n = sum(math.prod(s) for s in self.input_shapes().values()) + math.prod(self.output_shape())
        return float(n * self.bytes_per_element)

    def inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Deterministic inputs (fp32 arrays holding values exact in ``dtype``), scaled so outputs stay O(1)."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, shape in self.input_shapes().items():
            x = rng.standard_normal(shape, dtype=np.float32)
            if name in ("B",) or name.startswith("W"):
                x = x / np.float32(math.sqrt(shape[0]))
            elif name in ("bias", "beta") or (name.startswith("b") and name[1:].isdigit()):
                x = x * np.float32(0.1)
            elif name == "gamma":
                x = np.float32(1.0) + np.float32(0.1) * x
            out[name] = round_to(x, self.dtype)
        return out

    def reference(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The exact answer in fp64 on ``inputs`` (as ``inputs`` gives them)."""
        x = {k: v.astype(np.float64) for k, v in inputs.items()}
        if self.op == "gemm":
            y = x["A"] @ x["B"]
            if self.epilogue != "none":
                y = y + x["bias"]
                if self.epilogue != "bias":
                    y = act64(self.epilogue[len("bias_"):], y)
            return y + x["R"] if self.residual else y
        if self.op == "mlp":
            h = x["x"]
            for i, (_, _, act) in enumerate(self.layers):
                h = act64(act, h @ x[f"W{i}"] + x[f"b{i}"])
            return h
        if self.op == "attention":
            q, k, v = x["q"], x["k"], x["v"]
            s = q @ np.swapaxes(k, -1, -2) / math.sqrt(self.dims[3])
            if self.causal:
                S = self.dims[2]
                s = np.where(np.tril(np.ones((S, S), dtype=bool)), s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            return (p / p.sum(-1, keepdims=True)) @ v
        v = x["x"]
        if self.op == "softmax":
            e = np.exp(v - v.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)
        if self.op == "layernorm":
            mu = v.mean(-1, keepdims=True)
            var = ((v - mu) ** 2).mean(-1, keepdims=True)
            return (v - mu) / np.sqrt(var + EPS) * x["gamma"] + x["beta"]
        if self.op == "rmsnorm":
            return v / np.sqrt((v * v).mean(-1, keepdims=True) + EPS) * x["gamma"]
        for step in parse_chain(self.epilogue):
            v = v + x["bias"] if step == "bias" else v + x["res"] if step == "add" else act64(step, v)
        return v

    def tolerance(self, inputs: dict[str, np.ndarray], ref: np.ndarray) -> np.ndarray:
        """Per-element absolute tolerance of a result in ``dtype`` with fp32 accumulation.

        A sum of n products in fp32 is off by at most about n * 2^-24 times the sum of the
        products' magnitudes (TF32 adds 2^-11 per product); storing the result in ``dtype``
        adds its unit roundoff times the result's magnitude. Activations and the epilogue
        stretch errors by at most their slope (below 1.2 for every ``TRITON_ACTS`` one).
        The bound is doubled, and floored at a few units of fp32 roundoff, so that a
        correct kernel never fails it while a wrong index or a dropped tile does."""
        u_acc, u_out, u_prod = 2.0**-24, UNIT[self.dtype], PRODUCT_UNIT[self.dtype]
        x = {k: np.abs(v.astype(np.float64)) for k, v in inputs.items()}
        mag = np.abs(ref)
        if self.op == "gemm":
            s = x["A"] @ x["B"] + (x["bias"] if "bias" in x else 0.0) + (x["R"] if self.residual else 0.0)
            # a library that does not fuse the epilogue rounds after every step: a unit of each step's result
            a64, b64 = inputs["A"].astype(np.float64), inputs["B"].astype(np.float64)
            y = a64 @ b64
            stored = np.abs(y)
            if self.epilogue != "none":
                y = y + inputs["bias"].astype(np.float64)
                stored = stored + np.abs(y)
                if self.epilogue != "bias":
                    y = act64(self.epilogue[len("bias_"):], y)
                    stored = stored + np.abs(y)
            if self.residual:
                stored = stored + np.abs(y + inputs["R"].astype(np.float64))
            # TF32's rounding of each product has either sign: a root-sum-square of them, four times over
            rss = 4.0 * u_prod * np.sqrt(a64**2 @ b64**2)
            tol = 1.2 * (self.dims[2] * u_acc * s + rss + u_out * stored)
            return 2.0 * tol + 8 * u_acc * (1 + mag)
        if self.op == "mlp":
            # each layer's own error (its sum, in fp32 with TF32 products), plus the error it was handed,
            # carried through its weights and its activation's slope; the fused kernel keeps the
            # intermediates in fp32, a library rounds each layer's sum and activation to the dtype: two units
            hv, err = inputs["x"].astype(np.float64), np.zeros(self.layers[0][0])
            for i, (k, _, act) in enumerate(self.layers):
                w, b = inputs[f"W{i}"].astype(np.float64), inputs[f"b{i}"].astype(np.float64)
                s = np.abs(hv) @ np.abs(w) + np.abs(b)  # the magnitudes this layer's sums add up
                z = hv @ w + b
                # errors of both signs (a handed-on one meeting weights of both signs, TF32's rounding of
                # each product) grow as a root-sum-square, not a sum (a sum would let a 10% wrong output
                # pass); a stored result is off by its unit times itself
                rss = np.sqrt((err * err) @ (w * w)) + u_prod * np.sqrt((hv * hv) @ (w * w))
                hv = act64(act, z)
                err = 1.2 * (rss + k * u_acc * s) + 1.2 * u_out * (np.abs(z) + np.abs(hv))
            err = 2.0 * err  # a safety factor, once (per layer it would compound); doubled again below
            return 2.0 * (err + u_out * mag) + 8 * u_acc * (1 + mag)
        if self.op == "attention":
            S, D = self.dims[2], self.dims[3]
            # P has entries in [0, 1] summing to 1: P V is off by its inputs' rounding (P is rounded to the input
            # dtype before the second product, as every flash kernel does) times the largest |v|
            vmax = np.max(x["v"], axis=-2, keepdims=True)
            return 4.0 * ((u_out + (S + D) * u_acc) * vmax + u_out * mag) + 8 * u_acc
        cols = self.dims[1]
        return 4.0 * (cols * u_acc + u_out) * (mag + 1.0) + 8 * u_acc


EPS = 1e-5  # layernorm and rmsnorm epsilon (torch's default for LayerNorm)


def act64(name: str, y: np.ndarray) -> np.ndarray:
    """Activation ``name`` (``none``, ``TRITON_ACTS``) in fp64; GELU in its tanh form, as the templates compute."""
    if name == "none":
        return y
    if name == "relu":
        return np.maximum(y, 0.0)
    if name == "gelu":
        return 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y**3)))
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-y))
    if name == "silu":
        return y / (1.0 + np.exp(-y))
    if name == "tanh":
        return np.tanh(y)
    raise ProblemError(f"unknown activation {name!r}")


def check(p: CudaProblem, inputs: dict[str, np.ndarray], out: np.ndarray, ref: np.ndarray | None = None) -> str | None:
    """Why ``out`` is wrong, or None when every element is within ``p.tolerance``."""
    ref = p.reference(inputs) if ref is None else ref
    out = np.asarray(out, dtype=np.float64)
    if out.shape != ref.shape:
        return f"output shape {out.shape} != expected {ref.shape}"
    if not np.all(np.isfinite(out)):
        bad = np.argwhere(~np.isfinite(out))[0]
        return f"non-finite output at {tuple(int(i) for i in bad)}"
    tol = p.tolerance(inputs, ref)
    err = np.abs(out - ref)
    ratio = err / tol
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    if ratio[worst] > 1.0:
        return (f"wrong result: |out - ref| = {err[worst]:.3g} at {tuple(int(i) for i in worst)} exceeds the "
                f"tolerance {tol[worst]:.3g} ({int((ratio > 1).sum())} of {ratio.size} elements off)")
    return None


def parse(op: str, dims, epilogue: str = "none", dtype: str = "fp32", residual: bool = False,
          causal: bool = False) -> CudaProblem:
    """A problem from the target's arguments; ``epilogue`` may carry ``+res`` (a GEMM's residual),
    ``+causal`` (attention) and ``:DTYPE`` (``bias_relu+res:bf16``), so that the command line's
    ``--epilogue`` can say them. ``gemv`` (N, K) is a GEMM of one row."""
    epi, _, dt = str(epilogue).partition(":")
    parts = epi.split("+")
    epi, flags = parts[0] or "none", set(parts[1:])
    unknown = flags - {"res", "causal"}
    if unknown:
        raise ProblemError(f"epilogue flag(s) {', '.join(sorted(unknown))}: known +res (GEMM) and +causal (attention)")
    dims = tuple(int(d) for d in dims)
    if op == "gemv":
        if len(dims) != 2:
            raise ProblemError(f"gemv needs 2 sizes (N,K), got {dims}")
        op, dims = "gemm", (1, *dims)
    return CudaProblem(op, dims, epi, dt or dtype, residual or "res" in flags, causal or "causal" in flags)


def from_kernel(p, dtype: str = "fp32") -> CudaProblem:
    """The GPU problem of a target-neutral kernel problem (``ops.kernel.Problem`` or ``MlpProblem``, or its
    JSON), as the e-graph analysis makes them for a template node: a GEMV (N, K) is a GEMM of one row, a fused
    MLP's activations (``gelu:tanh``) are named by their ops. ``ProblemError`` where no Triton template runs it
    (an op or a chain step with no Triton epilogue)."""
    if isinstance(p, CudaProblem):
        return p
    d = p if isinstance(p, dict) else p.to_json()
    op = d.get("op", "mlp")
    if op == "mlp":
        acts = activations()
        layers = tuple((int(k), int(n), "none" if a == "none" else acts.get(a, a)) for k, n, a in d["layers"])
        return CudaProblem("mlp", (), "none", dtype, layers=layers)
    if op == "attention":
        return _attention(d, dtype)
    return parse(op, d["dims"], d.get("epilogue", "none"), dtype)


def _attention(d: dict, dtype: str) -> CudaProblem:
    """The flash-attention template's problem of a neutral ``attention`` problem: dims (BH, G, S, T, D, DV),
    epilogue ``causal:SCALE`` or ``full:SCALE``. The template takes one query head per key/value head, as many
    keys as queries, equal head dims and the scale 1/sqrt(D): the (1, BH, S, D) problem."""
    bh, g, s, t, dk, dv = (int(x) for x in d["dims"])
    mask, _, scale = str(d.get("epilogue", "")).partition(":")
    if scale.count(":"):  # a token-major or packed layout (``ops.kernel.AttentionLayout``)
        raise ProblemError(f"the attention template reads head-major q, k, v only, not the layout of "
                           f"{d.get('epilogue')!r}")
    why = ("grouped-query heads" if g != 1 else "fewer keys than queries" if t != s else
           "different value and key head dims" if dv != dk else
           f"the scale {scale} (the template's is 1/sqrt({dk}))" if abs(float(scale or 0) * math.sqrt(dk) - 1) > 1e-9
           else None)
    if why:
        raise ProblemError(f"the attention template does not run {why}")
    return CudaProblem("attention", (1, bh, s, dk), "none", dtype, causal=mask == "causal")


__all__ = ["CudaProblem", "EPS", "OPS", "ProblemError", "TRITON_ACTS", "UNIT", "act64", "check", "from_kernel",
           "gemm_epilogues", "parse", "round_to"]
