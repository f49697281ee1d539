"""mean and sum over ``axes`` (``keepdim`` keeps them as size 1): RMSNorm's ``mean(x**2, -1, keepdim=True)``."""
from __future__ import annotations

import math

import numpy as np

from .base import Library, Op, ints, need


def _axes(attrs, rank):
    axes = attrs.get("axes")
    return tuple(range(rank)) if not axes else tuple(sorted({int(a) % max(rank, 1) for a in axes}))


def shape(s, attrs):
    x = s[0]
    axes = _axes(attrs, len(x))
    need(all(0 <= a < max(len(x), 1) for a in axes), f"axes {axes} out of range for {x}")
    if attrs.get("keepdim"):
        return tuple(1 if i in axes else d for i, d in enumerate(x))
    return tuple(d for i, d in enumerate(x) if i not in axes)


def _reduce(f):
    def reference(a, attrs):
        return np.asarray(f(a[0], axis=_axes(attrs, a[0].ndim), keepdims=bool(attrs.get("keepdim"))))

    def step(ins, out, attrs):
        x = ins[0]
        axes, kd = _axes(attrs, x.ndim), bool(attrs.get("keepdim"))
        return lambda: f(x, axis=axes, keepdims=kd, out=out)
    return reference, step


def _torch(name):
    def lower(em, node, a, kw):
        dims = kw.get("dim", a[1] if len(a) > 1 else None)
        keep = bool(kw.get("keepdim", a[2] if len(a) > 2 else False))
        if kw.get("dtype") is not None:
            raise em.unsupported(f"{name} with dtype={kw['dtype']}; the IR computes in fp32")
        rank = len(em.shape(a[0]))
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        return em.node(name, [a[0]], node.name, axes=tuple(em.axis(int(d), rank) for d in dims), keepdim=keep)
    return lower


def _onnx(name, axes_input_from: int):
    def lower(em, node, ins, at, opset):
        x, rank = ins[0], len(em.shape(ins[0]))
        if opset >= axes_input_from:
            axes = em.const_ints(ins[1], "the axes") if len(ins) > 1 and ins[1] is not None else []
        else:
            axes = list(at.get("axes", []))
        if not axes and at.get("noop_with_empty_axes", 0):
            return x
        keep = bool(at.get("keepdims", 1))
        return em.node(name, [x], node.output[0], axes=tuple(em.axis(int(d), rank) for d in axes), keepdim=keep)
    return lower


def _egg(attrs):
    return ",".join(map(str, attrs.get("axes") or ())) + (";k" if attrs.get("keepdim") else "")


def _from_egg(s):
    axes, _, k = s.partition(";")
    return {"axes": ints(axes), "keepdim": k == "k"}


def _op(name, f, onnx_name, from_opset, per):
    reference, step = _reduce(f)
    return Op(name, 1, shape, reference, library={name: Library(step)}, egg_attr=_egg, from_egg=_from_egg,
              flops=lambda s, out, attrs: per * math.prod(s[0]),
              torch={name: _torch(name)}, onnx={onnx_name: _onnx(name, from_opset)},
              tolerance_terms=lambda s: max(s[0][-1:] or (1,)), doc=f"{name} over axes")


OPS = [_op("mean", np.mean, "ReduceMean", 18, 1.0), _op("sum", np.sum, "ReduceSum", 13, 1.0)]
