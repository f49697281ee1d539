"""Kernel problems: what an op computes, its inputs, its fp64 reference and its tolerance.

Also the library baselines: the same op through numpy (OpenBLAS) and, when
installed, torch (MKL/oneDNN): the hand-written elite a tuned kernel is
compared with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ....ops import REGISTRY
from ....ops.gelu import numpy_gelu
from ....ops.kernel import KERNELS, Problem, ProblemError, parse_chain
from .rowwise import LN_EPS

OPS = tuple(KERNELS)
U32 = 2.0**-24


def make_inputs(p: Problem, seed: int = 0, shapes_only: bool = False) -> dict[str, np.ndarray]:
    """Deterministic fp32 inputs, named as the op's arguments. Values are
    standard normal, scaled by 1/sqrt(K) for weights so outputs stay O(1)."""
    rng = np.random.default_rng(seed)
    if shapes_only:
        rng_n = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    else:
        rng_n = lambda *shape: rng.standard_normal(shape, dtype=np.float32)  # noqa: E731
    if p.op == "gemm":
        M, N, K = p.dims
        d = {"A": rng_n(M, K), "B": rng_n(K, N) / np.float32(math.sqrt(K))}
        if p.epilogue != "none":
            d["bias"] = rng_n(N)
        return d
    if p.op == "gemv":
        N, K = p.dims
        d = {"x": rng_n(K), "W": rng_n(K, N) / np.float32(math.sqrt(K))}
        if p.epilogue != "none":
            d["bias"] = rng_n(N)
        return d
    R, C = p.dims
    d = {"x": rng_n(R, C) * (np.float32(3.0) if p.op == "softmax" else np.float32(1.0))}
    if p.op == "layernorm":
        d["gamma"] = rng_n(C)
        d["beta"] = rng_n(C)
        if not shapes_only:
            d["x"] += np.float32(2.0)  # a non-zero mean, as activations have
    if p.op == "eltwise":
        steps = parse_chain(p.epilogue)
        if "bias" in steps:
            d["bias"] = rng_n(C)
        if "add" in steps:
            d["res"] = rng_n(R, C)
    return d


def output_shape(p: Problem) -> tuple[int, ...]:
    if p.op == "gemm":
        return (p.dims[0], p.dims[1])
    if p.op == "gemv":
        return (p.dims[0],)
    return tuple(p.dims)


def _apply(x, epilogue: str, bias, res=None):
    """An epilogue chain by its ops' reference semantics (``bias_gelu``, ``relu_add``...)."""
    for step in (parse_chain(epilogue) if epilogue != "none" else []):
        ep = REGISTRY[step].epilogue
        operand = {"bias": bias, "residual": res}.get(ep.operand)
        args = [x] if not ep.operand else [x, operand]
        x = REGISTRY[step].reference(args, REGISTRY[step].from_egg(ep.attr))
    return x


def reference(p: Problem, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The exact answer in fp64."""
    f = {k: v.astype(np.float64) for k, v in inputs.items()}
    if p.op == "gemm":
        return _apply(f["A"] @ f["B"], p.epilogue, f.get("bias"))
    if p.op == "gemv":
        return _apply(f["x"] @ f["W"], p.epilogue, f.get("bias"))
    x = f["x"]
    if p.op == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if p.op == "layernorm":
        mu = x.mean(axis=1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
        return (x - mu) / np.sqrt(var + LN_EPS) * f["gamma"] + f["beta"]
    return _apply(x, p.epilogue, f.get("bias"), f.get("res"))


def tolerance(p: Problem, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """Per-element absolute tolerance for an fp32 result.

    Dot products: the standard bound gamma_K |A||B| (Higham 3.5) with gamma_K
    ~ K u, times 4 for slack, plus the rounding of the epilogue. Row-wise ops:
    a few ulps of the row's scale times the row length's log."""
    f = {k: np.abs(v.astype(np.float64)) for k, v in inputs.items()}
    if p.op in ("gemm", "gemv"):
        K = p.reduction
        mag = (f["A"] @ f["B"]) if p.op == "gemm" else (f["x"] @ f["W"])
        if "bias" in f:
            mag = mag + f["bias"]
        tol = 4.0 * (K + 2) * U32 * mag
        if p.epilogue.startswith("bias_") and p.epilogue != "bias_relu":
            # a smooth activation (GELU, SiLU: slopes below 1.13; sigmoid, tanh below 1) through exp/tanh
            # approximations
            tol = tol * 1.2 + 1e-6 * (1.0 + mag)
        return tol + 1e-30
    C = p.dims[1]
    if p.op == "softmax":
        return np.full(output_shape(p), 64 * U32 * (1 + math.log2(C))) * 1.0
    if p.op == "layernorm":
        x = inputs["x"].astype(np.float64)
        rel = x.std(axis=1, keepdims=True)
        scale = (np.abs(x).max(axis=1, keepdims=True) / np.maximum(rel, 1e-12))  # mean/std: cancellation
        return 64 * U32 * (C ** 0.5) * scale * (f["gamma"] * 4 + 1) + 1e-6 + 0 * x
    mag = f["x"] + (f["bias"] if "bias" in f else 0) + (f["res"] if "res" in f else 0)
    return 8 * U32 * mag + 1e-6


def check(p: Problem, inputs: dict[str, np.ndarray], out: np.ndarray, ref: np.ndarray,
          tol: np.ndarray | None = None) -> str | None:
    """Why ``out`` is wrong, or None when every element is within tolerance."""
    if out.shape != ref.shape:
        return f"output shape {out.shape} != expected {ref.shape}"
    if not np.all(np.isfinite(out)):
        bad = np.argwhere(~np.isfinite(out))[0]
        return f"non-finite output at {tuple(int(i) for i in bad)}"
    tol = tolerance(p, inputs) if tol is None else tol
    err = np.abs(out.astype(np.float64) - ref)
    ratio = err / tol
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    if ratio[worst] > 1.0:
        return (f"wrong result: |out - ref| = {err[worst]:.3g} at {tuple(int(i) for i in worst)} exceeds the "
                f"tolerance {tol[worst]:.3g} ({int((ratio > 1).sum())} of {ratio.size} elements off)")
    return None


def _epi_flops(epilogue: str) -> float:
    """FLOPs per output element of a GEMM epilogue: the bias add and its activation's."""
    if epilogue == "none":
        return 0.0
    act = epilogue[len("bias_"):] if epilogue.startswith("bias_") else ""
    return 1.0 + (REGISTRY[act].epilogue.flops if act else 0.0)


def flops(p: Problem) -> float:
    if p.op == "gemm":
        M, N, K = p.dims
        return 2.0 * M * N * K + _epi_flops(p.epilogue) * M * N
    if p.op == "gemv":
        N, K = p.dims
        return 2.0 * N * K + _epi_flops(p.epilogue) * N
    R, C = p.dims
    per = {"softmax": 25, "layernorm": 8}.get(p.op) or sum(REGISTRY[s].epilogue.flops for s in parse_chain(p.epilogue))
    return float(per * R * C)


def min_bytes(p: Problem) -> float:
    """Bytes any implementation must move at least once (inputs read, output written)."""
    ins = make_inputs(p, 0, shapes_only=True)
    return 4.0 * (sum(v.size for v in ins.values()) + math.prod(output_shape(p)))


# -- library baselines ------------------------------------------------------

def _numpy_impl(p: Problem, inp: dict[str, np.ndarray], out: np.ndarray) -> Callable[[], None]:
    """The fastest numpy formulation we know: out= everywhere, no temporaries where avoidable."""
    if p.op in ("gemm", "gemv"):
        a, b = (inp["A"], inp["B"]) if p.op == "gemm" else (inp["x"], inp["W"])
        bias = inp.get("bias")
        epi = p.epilogue

        act = _act_step(epi, out)

        def run():
            np.matmul(a, b, out=out)
            if epi == "none":
                return
            np.add(out, bias, out=out)
            if act is not None:
                act()

        return run
    x = inp["x"]
    if p.op == "softmax":
        mx = np.empty((x.shape[0], 1), np.float32)
        s = np.empty_like(mx)

        def run():
            np.max(x, axis=1, keepdims=True, out=mx)
            np.subtract(x, mx, out=out)
            np.exp(out, out=out)
            np.sum(out, axis=1, keepdims=True, out=s)
            np.divide(out, s, out=out)

        return run
    if p.op == "layernorm":
        g, b = inp["gamma"], inp["beta"]
        mu = np.empty((x.shape[0], 1), np.float32)
        var = np.empty_like(mu)

        def run():
            np.mean(x, axis=1, keepdims=True, out=mu)
            np.subtract(x, mu, out=out)
            np.mean(np.square(out), axis=1, keepdims=True, out=var)
            np.add(var, LN_EPS, out=var)
            np.sqrt(var, out=var)
            np.divide(out, var, out=out)
            np.multiply(out, g, out=out)
            np.add(out, b, out=out)

        return run
    steps = []  # each step in place on out, by its op's library step
    for step in parse_chain(p.epilogue):
        op = REGISTRY[step]
        ep = op.epilogue
        operand = {"bias": inp.get("bias"), "residual": inp.get("res")}.get(ep.operand)
        steps.append(op.library[op.name].step([out] + ([operand] if ep.operand else []), out, op.from_egg(ep.attr)))
    steps = tuple(steps)

    def run():
        np.copyto(out, x)
        for f in steps:
            f()

    return run


def _act_step(epilogue: str, out: np.ndarray) -> Callable[[], None] | None:
    """The activation of a ``bias_<op>`` epilogue as a library step in place on ``out``."""
    if not epilogue.startswith("bias_"):
        return None
    op = REGISTRY[epilogue[len("bias_"):]]
    return op.library[op.name].step([out], out, op.from_egg(op.epilogue.attr))


def _torch_impl(p: Problem, inp: dict[str, np.ndarray], out: np.ndarray) -> Callable[[], None]:
    import torch

    t = {k: torch.from_numpy(v) for k, v in inp.items()}
    o = torch.from_numpy(out)
    F = torch.nn.functional
    if p.op in ("gemm", "gemv"):
        a, b = (t["A"], t["B"]) if p.op == "gemm" else (t["x"].unsqueeze(0), t["W"])
        o2 = o if p.op == "gemm" else o.unsqueeze(0)
        epi = p.epilogue
        bias = t.get("bias")
        act = REGISTRY[epi[len("bias_"):]].epilogue.torch if epi.startswith("bias_") else None

        def run():
            with torch.inference_mode():
                if epi == "none":
                    torch.mm(a, b, out=o2)
                else:
                    torch.addmm(bias, a, b, out=o2)
                    if act is not None:
                        o2.copy_(act(o2, None))

        return run
    x = t["x"]
    if p.op == "softmax":
        def run():
            with torch.inference_mode():
                torch.softmax(x, dim=1, out=o)

        return run
    if p.op == "layernorm":
        C = p.dims[1]

        def run():
            with torch.inference_mode():
                o.copy_(F.layer_norm(x, (C,), t["gamma"], t["beta"], LN_EPS))

        return run
    steps = [(REGISTRY[s].epilogue.torch, {"bias": t.get("bias"), "residual": t.get("res")}.get(
        REGISTRY[s].epilogue.operand)) for s in parse_chain(p.epilogue)]

    def run():
        with torch.inference_mode():
            y = x
            for f, operand in steps:
                y = f(y, operand)
            o.copy_(y)

    return run


LIBRARIES: dict[str, Callable] = {"numpy": _numpy_impl, "torch": _torch_impl}


def available_libraries() -> list[str]:
    """Baselines that can run here: numpy always, torch when the extra is installed."""
    out = ["numpy"]
    try:
        import importlib.util

        if importlib.util.find_spec("torch") is not None:
            out.append("torch")
    except (ImportError, ValueError):
        pass
    return out
