"""The elementwise template: a chain of steps (bias, add, activations) over a [rows, cols] tensor.

One program handles BLOCK consecutive elements of the flattened tensor; the
chain is unrolled at compile time from a tuple of step codes, so the whole
chain costs one read of each operand and one write.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ....ops.kernel import parse_chain
from .common import ACT_CODE, act

BIAS, ADD = 100, 101


@triton.jit
def _eltwise(X, Y, bias, R, n, cols, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, S3: tl.constexpr,
             S4: tl.constexpr, S5: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    v = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)
    v = _step(v, S0, bias, R, offs, ok, cols)
    v = _step(v, S1, bias, R, offs, ok, cols)
    v = _step(v, S2, bias, R, offs, ok, cols)
    v = _step(v, S3, bias, R, offs, ok, cols)
    v = _step(v, S4, bias, R, offs, ok, cols)
    v = _step(v, S5, bias, R, offs, ok, cols)
    tl.store(Y + offs, v.to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _step(v, S: tl.constexpr, bias, R, offs, ok, cols):
    if S == 100:
        v += tl.load(bias + offs % cols, mask=ok, other=0.0).to(tl.float32)
    elif S == 101:
        v += tl.load(R + offs, mask=ok, other=0.0).to(tl.float32)
    elif S > 0:
        v = act(v, S)
    return v


MAX_STEPS = 6


def codes(chain: str) -> tuple[int, ...]:
    """The step codes of an eltwise chain, padded with 0 (no step) to ``MAX_STEPS``."""
    steps = [BIAS if s == "bias" else ADD if s == "add" else ACT_CODE[s] for s in parse_chain(chain)]
    if len(steps) > MAX_STEPS:
        raise ValueError(f"an eltwise chain of {len(steps)} steps; the template fuses at most {MAX_STEPS}")
    return tuple(steps) + (0,) * (MAX_STEPS - len(steps))


def launcher(problem, knobs: dict, t: dict, out):
    """A no-argument call running the eltwise chain of ``problem`` with ``knobs`` (BLOCK, num_warps)."""
    rows, cols = problem.dims
    n = rows * cols
    x = t["x"]
    s = codes(problem.epilogue)
    block = knobs["BLOCK"]
    grid = (triton.cdiv(n, block),)
    bias, res = t.get("bias", x), t.get("res", x)

    def run():
        _eltwise[grid](x, out, bias, res, n, cols, *s, BLOCK=block, num_warps=knobs["num_warps"])
    return run
