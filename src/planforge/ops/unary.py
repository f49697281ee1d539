"""Elementwise math functions, one numpy ufunc each: rsqrt, sqrt, reciprocal, exp, log, cos, sin, abs.

RMSNorm divides by ``rsqrt(mean(x**2) + eps)``; rotary embeddings take
``cos``/``sin`` of position angles (folded to constants at import when the
positions are known, as they are at a fixed sequence length).
"""
from __future__ import annotations

import numpy as np

from .base import Library, Op, elementwise_flops, keep_shape, ufunc_step


def _rsqrt(x, out=None):
    out = np.sqrt(x, out=out)
    return np.divide(1.0, out, out=out)


FUNCTIONS = {  # name: (numpy, ONNX op type, FLOPs per element)
    "rsqrt": (_rsqrt, None, 2), "sqrt": (np.sqrt, "Sqrt", 1), "reciprocal": (np.reciprocal, "Reciprocal", 1),
    "exp": (np.exp, "Exp", 4), "log": (np.log, "Log", 4), "cos": (np.cos, "Cos", 8), "sin": (np.sin, "Sin", 8),
    "abs": (np.abs, "Abs", 1),
}


def _op(name, f, onnx_name, per):
    def lower(em, x, name_):
        return em.node(name, [x], name_)
    return Op(name, 1, keep_shape, reference=lambda a, attrs: f(a[0]), library={name: Library(ufunc_step(f))},
              flops=elementwise_flops(per), torch={name: lambda em, node, a, kw: lower(em, a[0], node.name)},
              onnx={onnx_name: lambda em, node, ins, at, opset: lower(em, ins[0], node.output[0])} if onnx_name else {},
              doc=f"{name}(x)")


OPS = [_op(n, f, o, p) for n, (f, o, p) in FUNCTIONS.items()]
