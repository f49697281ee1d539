"""softmax over the last axis, and its two halves (``exp_shifted``, ``div_rowsum``) that the algebra rule exposes."""
from __future__ import annotations

import math

import numpy as np
from egglog import rewrite

from .base import Library, Op, keep_shape
from .kernel import rowwise_kernel


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _exp_step(normalise: bool):
    def step(ins, out, attrs):
        a = ins[0]
        red = tuple(a.shape[:-1]) + (1,)
        mx = np.empty(red, np.float32)
        s = np.empty(red, np.float32)

        def run():
            np.max(a, axis=-1, keepdims=True, out=mx)
            np.subtract(a, mx, out=out)
            np.exp(out, out=out)
            if normalise:
                np.sum(out, axis=-1, keepdims=True, out=s)
                np.divide(out, s, out=out)

        return run
    return step


def _div_step(ins, out, attrs):
    a = ins[0]
    s = np.empty(tuple(a.shape[:-1]) + (1,), np.float32)

    def run():
        np.sum(a, axis=-1, keepdims=True, out=s)
        np.divide(a, s, out=out)

    return run


def _rules(E, v):
    return {"algebra": [rewrite(E("softmax", v.x)).to(E("div_rowsum", E("exp_shifted", v.x)))]}


def lower(em, x, axis: int, name: str):
    """softmax over ``axis``: over the last axis directly, over another between two swaps of it with the last."""
    rank = len(em.shape(x))
    axis = em.axis(axis, rank)
    if axis == rank - 1:
        return em.node("softmax", [x], name)
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]        # a swap is its own inverse
    y = em.node("softmax", [em.transpose(x, perm, name + ".in")], name + ".last")
    return em.transpose(y, perm, name)


def _torch(em, node, a, kw):
    return lower(em, a[0], int(kw.get("dim", a[1])), node.name)


def _onnx(em, node, ins, at, opset):
    x, name = ins[0], node.output[0]
    if opset >= 13:
        return lower(em, x, int(at.get("axis", -1)), name)
    s = em.shape(x)
    axis = int(at.get("axis", 1)) % max(len(s), 1)     # before opset 13: over all axes from `axis` on, jointly
    flat = em.reshape(x, (math.prod(s[:axis]), math.prod(s[axis:])), name + ".flat")
    y = lower(em, flat, -1, name if flat is x else name + ".2d")
    return em.reshape(y, s, name)


OPS = [
    Op("softmax", 1, keep_shape, reference=lambda a, attrs: softmax(a[0]),
       library={"softmax": Library(_exp_step(True), passes=5)}, rules=_rules, templated=True,
       kernel=rowwise_kernel("softmax"), flops=lambda s, out, attrs: 25.0 * math.prod(out),
       torch={"softmax": _torch, "_softmax": _torch}, onnx={"Softmax": _onnx},
       tolerance_terms=lambda s: s[0][-1], doc="softmax over the last axis"),
    Op("exp_shifted", 1, keep_shape, reference=lambda a, attrs: np.exp(a[0] - a[0].max(axis=-1, keepdims=True)),
       library={"exp_shifted": Library(_exp_step(False))}, internal=True, doc="exp(x - rowmax(x))"),
    Op("div_rowsum", 1, keep_shape, reference=lambda a, attrs: a[0] / a[0].sum(axis=-1, keepdims=True),
       library={"div_rowsum": Library(_div_step)}, internal=True, doc="x / rowsum(x)"),
]
