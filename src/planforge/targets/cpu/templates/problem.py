"""Kernel problems by kind: inputs, fp64 reference, tolerance, FLOPs, bytes and library baselines.

Each kind's facts live beside its template (``gemm.FACTS``, ``gemv.FACTS``,
``rowwise.FACTS`` for softmax, layernorm and eltwise); the functions here look
them up. The library baselines are the same problem through numpy (OpenBLAS)
and, when installed, torch (MKL/oneDNN): the hand-written elite a tuned kernel
is compared with.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ....ops.kernel import KERNELS, Problem, ProblemError
from . import attention, conv, gemm, gemv, irb, rowwise
from .facts import Facts

OPS = tuple(KERNELS)
FACTS: dict[str, Facts] = {"gemm": gemm.FACTS, "gemv": gemv.FACTS, "softmax": rowwise.FACTS,
                           "layernorm": rowwise.FACTS, "rms": rowwise.FACTS, "eltwise": rowwise.FACTS, "conv": conv.FACTS,
                           "dwconv": conv.FACTS, "attention": attention.FACTS,
                           "rope": attention.ROPE_FACTS, "swap12": attention.SWAP_FACTS,
                           "slab": attention.SLAB_FACTS, "irb": irb.FACTS}


def facts(p) -> Facts:
    f = FACTS.get(p.op)
    if f is None:  # the fused MLP runs inside a plan only, on the model's own weights
        raise ProblemError(f"{p.op} problems are tuned inside a model's plan, not as a kernel workload; "
                           f"kernel workloads: {', '.join(FACTS)}")
    return f


def make_inputs(p: Problem, seed: int = 0, shapes_only: bool = False) -> dict[str, np.ndarray]:
    """Deterministic fp32 inputs, named as the op's arguments. Values are
    standard normal, scaled by 1/sqrt(K) for weights so outputs stay O(1)."""
    rng = np.random.default_rng(seed)
    if shapes_only:
        rand = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    else:
        rand = lambda *shape: rng.standard_normal(shape, dtype=np.float32)  # noqa: E731
    return facts(p).inputs(p, rand)


def output_shape(p: Problem) -> tuple[int, ...]:
    return tuple(facts(p).output_shape(p))


def reference(p: Problem, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The exact answer in fp64."""
    return facts(p).reference(p, {k: v.astype(np.float64) for k, v in inputs.items()})


def tolerance(p: Problem, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """Per-element absolute tolerance for an fp32 result (see each kind's facts for the bound)."""
    return facts(p).tolerance(p, {k: v.astype(np.float64) for k, v in inputs.items()})


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


def flops(p: Problem) -> float:
    return float(facts(p).flops(p))


def min_bytes(p: Problem) -> float:
    """Bytes any implementation must move at least once (inputs read, output written)."""
    ins = make_inputs(p, 0, shapes_only=True)
    return 4.0 * (sum(v.size for v in ins.values()) + math.prod(output_shape(p)))


LIBRARIES: dict[str, Callable] = {"numpy": lambda p, inp, out: facts(p).numpy(p, inp, out),
                                  "torch": lambda p, inp, out: facts(p).torch(p, inp, out)}


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
