"""Comparisons and logic, elementwise with broadcasting; results are booleans held as 0/1.

``eq ne lt le gt ge`` compare, ``logical_and logical_or logical_xor`` combine
truth values (nonzero is true), ``logical_not`` negates one, ``isnan`` tests. Masks in
attention code are built from these (and mostly folded to constants at import,
since every shape is known).
"""
from __future__ import annotations

import numpy as np

from .base import Library, Op, broadcast_shape, keep_shape, operand


def _ufunc_step(f):
    def step(ins, out, attrs):
        args = tuple(ins)
        return lambda: f(*args, out=out)    # a bool result written into the fp32 slot as 0/1
    return step


def _mapping(name):
    def torch(em, node, a, kw):
        return em.node(name, [operand(em, x, f"{node.name}.{i}") for i, x in enumerate(a[:2])], node.name)

    def onnx(em, node, ins, at, opset):
        return em.node(name, ins[:2], node.output[0])
    return torch, onnx


def _is_bool(node, i: int = 0) -> bool:
    import torch

    arg = node.args[i]
    val = getattr(arg, "meta", {}).get("val")
    return isinstance(val, torch.Tensor) and val.dtype == torch.bool


def _bitwise(name):
    """``&``, ``|``, ``^`` and ``~`` on booleans are logic; on integers they are bit operations the IR has not."""
    logical = _mapping(name)[0] if name != "logical_not" else None

    def torch(em, node, a, kw):
        if not all(_is_bool(node, i) for i in range(len(a)) if hasattr(node.args[i], "meta")):
            raise em.unsupported("bitwise operation on integers; the IR has it on booleans only")
        if logical is None:
            return em.node("logical_not", [a[0]], node.name)
        return logical(em, node, a, kw)
    return torch


COMPARE = {"eq": (np.equal, "Equal"), "ne": (np.not_equal, None), "lt": (np.less, "Less"),
           "le": (np.less_equal, "LessOrEqual"), "gt": (np.greater, "Greater"), "ge": (np.greater_equal, "GreaterOrEqual"),
           "logical_and": (np.logical_and, "And"), "logical_or": (np.logical_or, "Or"),
           "logical_xor": (np.logical_xor, "Xor")}
BITWISE = {"logical_and": ("__and__", "bitwise_and"), "logical_or": ("__or__", "bitwise_or"),
           "logical_xor": ("__xor__", "bitwise_xor")}


def _binary(name, f, onnx_name):
    torch, onnx = _mapping(name)
    tm = {name: torch, **{k: _bitwise(name) for k in BITWISE.get(name, ())}}
    return Op(name, 2, broadcast_shape,
              reference=lambda a, attrs, f=f: f(a[0], a[1]).astype(np.result_type(a[0], a[1], np.float32)),
              library={name: Library(_ufunc_step(f))},
              torch=tm, onnx={onnx_name: onnx} if onnx_name else {},
              doc=f"{name} (0/1, broadcast)")


def _unary(name, f, torch_names, onnx_name, doc):
    return Op(name, 1, keep_shape,
              reference=lambda a, attrs: f(a[0]).astype(a[0].dtype),
              library={name: Library(_ufunc_step(f))},
              torch={t: (_bitwise(name) if t.startswith("bitwise") else
                         lambda em, node, a, kw: em.node(name, [a[0]], node.name)) for t in torch_names},
              onnx={onnx_name: lambda em, node, ins, at, opset: em.node(name, [ins[0]], node.output[0])},
              doc=doc)


OPS = [_binary(n, f, o) for n, (f, o) in COMPARE.items()] + [
    _unary("logical_not", np.logical_not, ("logical_not", "bitwise_not"), "Not", "not x (0/1)"),
    _unary("isnan", np.isnan, ("isnan",), "IsNaN", "x is NaN (0/1)"),
]
