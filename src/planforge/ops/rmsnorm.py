"""rmsnorm: ``x / sqrt(mean(x**2, axis) + eps)``, what RMSNorm (Llama) writes out as pow, mean, add, rsqrt, mul.

The importers see RMSNorm as five ops; the ``algebra`` rule here makes them
equal to this one (internal) op, which the row-wise template computes in one
sweep for the sum of squares and one for the scaling (``Problem("rms",
(rows, cols))``, over the last axis). ``eps`` stays an operand (a constant of
shape ``(1,)``, as the importers make it): the e-graph cannot read a
constant's value, and the kernel reads it from there when the plan binds it.
The model's weight, when it has one, stays the ``multiply`` after it.
"""
from __future__ import annotations

import math

import numpy as np
from egglog import rewrite

from .base import Library, Op, need
from .kernel import Problem

MAX_RANK = 6  # the rule is written out per reduced axis (the e-graph has no shapes): axes 1 .. MAX_RANK - 1


def shape(s, attrs):
    x, e = s
    ax = int(attrs["axis"])
    need(0 <= ax < len(x), f"rmsnorm over axis {ax} of a rank-{len(x)} value")
    need(tuple(e) == (1,), f"rmsnorm's eps must have shape (1,), got {e}")
    return tuple(x)


def reference(a, attrs):
    x, e = a
    return x / np.sqrt(np.mean(x * x, axis=int(attrs["axis"]), keepdims=True) + e[0])


def _step(ins, out, attrs):
    x, e = ins
    ax = int(attrs["axis"])
    red = np.empty(tuple(1 if i == ax else d for i, d in enumerate(x.shape)), np.float32)

    def run():
        np.multiply(x, x, out=out)
        np.mean(out, axis=ax, keepdims=True, out=red)
        np.add(red, e, out=red)
        np.sqrt(red, out=red)
        np.divide(x, red, out=out)

    return run


def kernel(s, out, attrs) -> Problem | None:
    """The row-wise template's problem, over the last axis only."""
    x = s[0]
    if not x or int(attrs["axis"]) != len(x) - 1:
        return None
    return Problem("rms", (math.prod(x[:-1]), x[-1]))


def _rules(E, v):
    x, e = v.x, v.b
    out = []
    for ax in range(1, MAX_RANK):
        inv = E("rsqrt", E("bias", E("mean", E("pow", x, attr="2.0"), attr=f"{ax};k"), e))
        norm = E("rmsnorm", x, e, attr=str(ax))
        out += [rewrite(E("multiply", x, inv)).to(norm), rewrite(E("multiply", inv, x)).to(norm)]
    return {"algebra": out}


OPS = [Op(
    "rmsnorm", 2, shape, reference,
    library={"rmsnorm": Library(_step, passes=5)},
    egg_attr=lambda attrs: str(int(attrs["axis"])),
    from_egg=lambda s: {"axis": int(s)},
    rules=_rules,
    templated=True,
    kernel=kernel,
    flops=lambda s, out, attrs: 4.0 * math.prod(out),
    tolerance_terms=lambda s: s[0][-1],
    internal=True,
    doc="x / sqrt(mean(x**2) + eps) over one axis (RMSNorm without its weight)",
)]
