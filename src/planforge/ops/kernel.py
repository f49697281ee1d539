"""Kernel problems: one invocation of a compiled template with concrete shapes.

A ``Problem`` is what the e-graph analysis asks a target's templates to run
(``Op.kernel`` makes it from a template e-node) and what a single-kernel
workload tunes. It is target-neutral: the CPU's C templates and a GPU's
Triton templates implement the same problems.

- ``Problem("gemm", (M, N, K), epilogue)``: ``act(A @ B + bias)``, or with the epilogue ``bias_add`` (``RESIDUAL``)
  ``A @ B + bias + R``, R of the output's shape (a transformer's residual connection);
- ``Problem("gemv", (N, K), epilogue)``: the same for one row;
- ``Problem("softmax" | "layernorm" | "rms", (rows, cols))``: row-wise over the last axis (a layernorm's
  epilogue ``none`` is eps 1e-5, ``eps=1e-12`` another; ``rms``: RMSNorm without its weight, ``eps`` an operand);
- ``Problem("eltwise", (rows, cols), chain)``: a chain of elementwise steps;
- ``Problem("conv" | "dwconv", (N, C, H, W, O, KH, KW, SH, SW, PT, PL, PB, PR, DH, DW, G), epilogue)``: a direct
  (resp. depthwise) convolution; the epilogue is ``layout/form/chain`` (see ``conv_epilogue``);
- ``Problem("irb", (N, H, W, C, E, O, K, S), "act1/act2/res")``: an inverted-residual block in NHWC (a 1x1 expansion
  C -> E with ``act1``, or ``copy`` for none; a KxK depthwise convolution, stride S, padding K // 2, with ``act2``; a
  1x1 projection E -> O; ``add`` the input, or ``none``), see ``irb_epilogue``;
- ``MlpProblem(layers)``: consecutive GEMV layers ``(K, N, act)`` fused into one kernel.

GEMM epilogues are ``none``, ``bias`` and ``bias_<op>`` for every op of the
registry with a unary elementwise epilogue; eltwise chains are steps among
every op with an epilogue, joined by ``_`` (``bias_gelu_add``).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

_CONV_DIMS = "N,C,H,W,O,KH,KW,SH,SW,PT,PL,PB,PR,DH,DW,G"
KERNELS = {"gemm": "M,N,K", "gemv": "N,K", "softmax": "rows,cols", "layernorm": "rows,cols", "rms": "rows,cols",
           "eltwise": "rows,cols",
           "conv": _CONV_DIMS, "dwconv": _CONV_DIMS, "attention": "BH,G,S,T,D,DV", "rope": "B,H,S,D", "swap12": "B,X,Y,D", "slab": "O,A,I,N",
           "irb": "N,H,W,C,E,O,K,S"}
MAY_BE_ZERO = {"PT", "PL", "PB", "PR"}  # a convolution's padding


class ProblemError(ValueError):
    """A problem that cannot be built (bad op, shape or epilogue)."""


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _key(d: Any) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def activations() -> dict[str, str]:
    """Fused-epilogue activation name (``relu``, ``gelu:tanh``) -> the op that applies it."""
    from .registry import REGISTRY

    out = {}
    for op in REGISTRY.values():
        name = op.act_name(op.epilogue.attr) if op.epilogue else None
        if name:
            out[name] = op.name
    return out


def gemm_epilogues() -> tuple[str, ...]:
    """``none``, ``bias``, then ``bias_<op>`` per activation, in registry order (a template's code per name)."""
    return ("none", "bias", *(f"bias_{op}" for op in activations().values()))


RESIDUAL = "bias_add"  # the GEMM epilogue adding a residual R (of the output's shape) after the bias


def gemm_residual(epilogue: str) -> tuple[str, bool]:
    """(the GEMM epilogue without its residual, whether it adds one): ``bias_add`` -> (``bias``, True)."""
    return ("bias", True) if epilogue == RESIDUAL else (epilogue, False)


def epilogue_of_act(act: str) -> str | None:
    """The GEMM epilogue of a fused linear's activation (``none`` -> ``bias``), or None when no template has it."""
    if act == "none":
        return "bias"
    op = activations().get(act)
    return f"bias_{op}" if op else None


def chain_steps() -> tuple[str, ...]:
    """Ops an elementwise template can chain (every op with an epilogue)."""
    from .registry import REGISTRY

    return tuple(op.name for op in REGISTRY.values() if op.epilogue is not None)


def parse_chain(chain: str) -> list[str]:
    steps = [s for s in chain.split("_") if s]
    known = chain_steps()
    bad = [s for s in steps if s not in known]
    if not steps or bad:
        raise ValueError(f"elementwise chain {chain!r}: steps must be among {', '.join(known)} joined by '_'")
    return steps


@dataclass(frozen=True)
class Problem:
    """One kernel invocation with concrete shapes.

    ``dims``: gemm (M, N, K); gemv (N, K); softmax, layernorm, eltwise (rows, cols).
    ``epilogue``: for gemm/gemv one of ``gemm_epilogues()``; for eltwise the
    chain of steps, e.g. ``bias_gelu`` or ``bias_relu_add``.
    """

    op: str
    dims: tuple[int, ...]
    epilogue: str = "none"

    def __post_init__(self):
        if self.op not in KERNELS:
            raise ProblemError(f"unknown op {self.op!r}; known: {', '.join(KERNELS)}")
        names = KERNELS[self.op]
        want = names.count(",") + 1
        low = [0 if n in MAY_BE_ZERO else 1 for n in names.split(",")]
        if len(self.dims) != want or not all(isinstance(d, int) and d >= lo for d, lo in zip(self.dims, low)):
            raise ProblemError(f"{self.op} needs {want} positive integer sizes ({names}), got {self.dims}")
        if self.op in ("conv", "dwconv"):
            conv_epilogue(self)
        if self.op in ("gemm", "gemv"):
            names = gemm_epilogues() + ((RESIDUAL,) if self.op == "gemm" else ())
            if self.epilogue not in names:
                raise ProblemError(f"unknown epilogue {self.epilogue!r} for a {self.op}; choose one of {', '.join(names)}")
        if self.op == "eltwise":
            try:
                parse_chain(self.epilogue)
            except ValueError as e:
                raise ProblemError(str(e)) from None
        if self.op in ("softmax", "rms") and self.epilogue != "none":
            raise ProblemError(f"{self.op} takes no epilogue")
        if self.op == "layernorm":
            layernorm_eps(self.epilogue)
        if self.op == "rope" and (self.epilogue not in ("bhsd", "bshd") or self.dims[3] % 2):
            raise ProblemError(f"rope {self.dims} {self.epilogue!r}: expected an even head width D and layout bhsd or bshd")
        if self.op == "attention":
            attention_layout(self)
        if self.op == "irb":
            irb_epilogue(self)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "dims": list(self.dims), "epilogue": self.epilogue}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Problem | MlpProblem":
        """A problem from its ``to_json`` (a fused MLP's gives an ``MlpProblem``)."""
        return problem_from_json(d)

    @property
    def key(self) -> str:
        return _key(self.to_json())

    @property
    def reduction(self) -> int:
        """Length of the longest sum behind one output (sets the tolerance)."""
        if self.op in ("conv", "dwconv"):
            N, C, H, W, O, KH, KW = self.dims[:7]
            return C // self.dims[15] * KH * KW
        if self.op == "attention":
            return self.dims[3] + self.dims[4]        # a softmax over T keys of dot products of length D
        if self.op == "irb":
            return self.dims[3] + self.dims[6] ** 2 + self.dims[4]  # three sums, one after the other
        return self.dims[2] if self.op == "gemm" else self.dims[1]


@dataclass(frozen=True)
class MlpProblem:
    """Consecutive linear layers of one row fused into one kernel: ``layers`` = ((K, N, act), ...).

    ``shared``: the kernel is one step of a plan whose other parts are timed apart from it (a part of a
    partitioned model), so its thread pool must not keep a core busy after a call: the next call of the same
    kernel comes only after every other part has run, and a spinning worker would take a core from them
    (default False: the kernel's own measurements, called back to back, decide how long its workers spin)."""

    layers: tuple[tuple[int, int, str], ...]
    op: str = "mlp"
    shared: bool = False

    def __post_init__(self):
        if not self.layers:
            raise ProblemError("a fused MLP needs at least one layer")
        acts = activations()
        for i, (k, n, act) in enumerate(self.layers):
            if not (isinstance(k, int) and isinstance(n, int) and k >= 1 and n >= 1):
                raise ProblemError(f"layer {i}: sizes must be positive integers, got ({k}, {n})")
            if act != "none" and act not in acts:
                raise ProblemError(f"layer {i}: activation {act!r} has no fused epilogue; known: none, "
                                   f"{', '.join(acts)}")
            if i and self.layers[i - 1][1] != k:
                raise ProblemError(f"layer {i} takes {k} inputs, layer {i - 1} gives {self.layers[i - 1][1]}")

    def to_json(self) -> dict[str, Any]:
        d = {"op": "mlp", "layers": [list(x) for x in self.layers]}
        if self.shared:
            d["shared"] = True
        return d

    @property
    def key(self) -> str:
        return _key(self.to_json())

    @property
    def reduction(self) -> int:
        return max(k for k, _, _ in self.layers)


CONV_FORMS = ("w", "wb", "wss", "packed")


def conv_epilogue(p) -> tuple[str, str, list[str]]:
    """(layout, form, chain steps) of a convolution problem's epilogue ``layout/form/chain``: layout ``nchw`` or
    ``nhwc``; form: the operands after ``x`` (``w``; ``wb`` a bias; ``wss`` a [2, O] scale and shift; ``packed``
    ``conv_pack``'s [O, Cg*KH*KW + 2], then a residual); chain: ``none`` or activations and ``add`` joined by ``_``."""
    parts = p.epilogue.split("/")
    if len(parts) != 3 or parts[0] not in ("nchw", "nhwc") or parts[1] not in CONV_FORMS:
        raise ProblemError(f"convolution epilogue {p.epilogue!r}: expected layout/form/chain, layout nchw|nhwc, "
                           f"form {'|'.join(CONV_FORMS)}")
    steps = [] if parts[2] == "none" else parts[2].split("_")
    acts = activations()
    bad = [s for s in steps if s != "add" and s not in acts]
    if bad or (("add" in steps) != (parts[1] == "packed")) or steps.count("add") > 1:
        raise ProblemError(f"convolution epilogue {p.epilogue!r}: steps must be activations ({', '.join(acts)}) "
                           f"and one 'add' exactly when the form is 'packed'")
    N, C, H, W, O, KH, KW, SH, SW, PT, PL, PB, PR, DH, DW, G = p.dims
    if C % G or O % G or (p.op == "dwconv" and not G == C == O):
        raise ProblemError(f"{p.op}: channels {C} -> {O} do not fit groups={G}")
    if (H + PT + PB - DH * (KH - 1) - 1) < 0 or (W + PL + PR - DW * (KW - 1) - 1) < 0:
        raise ProblemError(f"{p.op}: a {KH}x{KW} kernel does not fit a padded {H}x{W} input")
    return parts[0], parts[1], steps


def irb_epilogue(p) -> tuple[str, str, bool]:
    """(act1, act2, residual) of an inverted-residual block problem's epilogue ``act1/act2/add|none``: activations
    of the expansion (``copy``: the block has none, C == E) and of the depthwise convolution (``none`` for none)."""
    parts = p.epilogue.split("/")
    acts = activations()
    N, H, W, C, E, O, K, S = p.dims
    if (len(parts) != 3 or parts[0] not in (*acts, "none", "copy") or parts[1] not in (*acts, "none")
            or parts[2] not in ("add", "none")):
        raise ProblemError(f"irb epilogue {p.epilogue!r}: expected act1/act2/add|none, act1 among copy, none, "
                           f"{', '.join(acts)}; act2 among none, {', '.join(acts)}")
    if K % 2 == 0 or S > 2 or (parts[0] == "copy" and C != E) or (parts[2] == "add" and (C != O or S != 1)):
        raise ProblemError(f"irb {p.dims} {p.epilogue!r}: the kernel must be odd, the stride 1 or 2, a block without "
                           f"expansion keeps its channels (C == E), a residual block its shape (C == O, stride 1)")
    return parts[0], parts[1], parts[2] == "add"


LAYERNORM_EPS = 1e-5  # a layernorm problem's eps when its epilogue is "none" (PyTorch's default)


@dataclass(frozen=True)
class AttentionLayout:
    """Where an attention problem's operands sit (``Problem("attention", (BH, G, S, T, D, DV), epilogue)``):

    - ``heads`` (the epilogue ``causal:SCALE`` / ``full:SCALE``): q ``[BH, G * S, D]``, k and v ``[BH, T, D|DV]``,
      the output ``[BH, G * S, DV]``: head-major, as ``sdpa`` takes them;
    - ``tokens`` (``...:tok:HK``): q ``[B, S, HK * G, D]``, k and v ``[B, T, HK, D|DV]``, the output ``[B, S, HK * G,
      DV]`` (``BH = B * HK``): token-major, as the projections write them, so that no head transpose is copied;
    - ``packed`` (``...:qkv:HK:W:OQ:OK:OV``): one ``[B, S, W]`` value (a fused QKV projection's output) holding q, k
      and v as column windows starting at OQ, OK, OV (``T = S``), the output token-major: no split is copied either.
    """

    causal: bool
    scale: float
    kind: str = "heads"  # heads | tokens | packed
    hk: int = 0          # kv heads per batch row (tokens, packed)
    width: int = 0       # the packed value's row (packed)
    offsets: tuple[int, int, int] = (0, 0, 0)  # q, k, v column offsets (packed)

    def epilogue(self) -> str:
        """The attention problem's epilogue that says all of this: ``causal:SCALE``, then ``:tok:HK`` or
        ``:qkv:HK:W:OQ:OK:OV``."""
        head = f"{'causal' if self.causal else 'full'}:{self.scale!r}"
        if self.kind == "tokens":
            return f"{head}:tok:{self.hk}"
        if self.kind == "packed":
            return f"{head}:qkv:{self.hk}:{self.width}:" + ":".join(map(str, self.offsets))
        return head


def attention_layout(p) -> AttentionLayout:
    """The mask, scale and operand layout of an attention problem (``AttentionLayout``); ``ProblemError`` for an
    epilogue that is none of its forms or a layout its dims do not fit."""
    parts = p.epilogue.split(":")
    why = f"attention epilogue {p.epilogue!r}: expected full:SCALE or causal:SCALE, then :tok:HK or :qkv:HK:W:OQ:OK:OV"
    if len(parts) < 2 or parts[0] not in ("full", "causal") or not _is_float(parts[1]):
        raise ProblemError(why)
    causal, scale, rest = parts[0] == "causal", float(parts[1]), parts[2:]
    if not rest:
        return AttentionLayout(causal, scale)
    if not all(x.isdigit() for x in rest[1:]) or (rest[0], len(rest)) not in (("tok", 2), ("qkv", 6)):
        raise ProblemError(why)
    BH, G, S, T, D, DV = p.dims
    nums = [int(x) for x in rest[1:]]
    hk = nums[0]
    if hk < 1 or BH % hk:
        raise ProblemError(f"{why}: {hk} kv heads do not divide BH = {BH}")
    if rest[0] == "tok":
        return AttentionLayout(causal, scale, "tokens", hk)
    w, oq, ok, ov = nums[1:]
    H = hk * G
    if T != S or oq + H * D > w or ok + hk * D > w or ov + hk * DV > w:
        raise ProblemError(f"{why}: q ({H} x {D} at {oq}), k ({hk} x {D} at {ok}) and v ({hk} x {DV} at {ov}) do not "
                           f"fit rows of {w}, or T {T} is not S {S}")
    return AttentionLayout(causal, scale, "packed", hk, w, (oq, ok, ov))


def layernorm_eps(epilogue: str) -> float:
    """The eps of a layernorm problem: ``none`` is ``LAYERNORM_EPS``, ``eps=1e-12`` (BERT's) any other."""
    if epilogue == "none":
        return LAYERNORM_EPS
    kind, _, val = epilogue.partition("=")
    if kind != "eps" or not _is_float(val) or not 0.0 < float(val) < 1.0:
        raise ProblemError(f"layernorm epilogue {epilogue!r}: expected none or eps=FLOAT (0 < eps < 1)")
    return float(val)


def eltwise_kernel(name: str):
    """``Op.kernel`` of an op with an epilogue: one chain step over [rows, cols] (None when its attribute is not
    the one the template implements)."""
    def kernel(s, out, attrs, name=name):
        from .registry import REGISTRY

        op = REGISTRY[name]
        if op.egg_attr(attrs) != op.epilogue.attr or not out:
            return None
        rows = 1
        for d in out[:-1]:
            rows *= d
        return Problem("eltwise", (rows, out[-1]), name)
    return kernel


def rowwise_kernel(kind: str):
    """``Op.kernel`` of a row-wise op (softmax, layernorm) over the last axis."""
    def kernel(s, out, attrs, kind=kind):
        if not out:
            return None
        rows = 1
        for d in out[:-1]:
            rows *= d
        return Problem(kind, (rows, out[-1]))
    return kernel


def problem_from_json(d: dict[str, Any]) -> Problem | MlpProblem:
    """A problem from ``to_json`` (specs before 0.2 stored a fused MLP as ``{"layers": ...}``)."""
    if d.get("op", "mlp") == "mlp" and "layers" in d:
        return MlpProblem(tuple((int(k), int(n), str(a)) for k, n, a in d["layers"]), shared=bool(d.get("shared")))
    return Problem(d["op"], tuple(d["dims"]), d.get("epilogue", "none"))


__all__ = ["CONV_FORMS", "KERNELS", "LAYERNORM_EPS", "MlpProblem", "Problem", "ProblemError", "RESIDUAL", "activations", "chain_steps", "conv_epilogue", "eltwise_kernel", "epilogue_of_act",
           "gemm_epilogues", "gemm_residual", "layernorm_eps", "parse_chain", "problem_from_json", "rowwise_kernel"]
