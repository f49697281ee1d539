"""Library-step fallbacks: a framework op with no IR mapping becomes an ``ops.fallback`` node instead of an error.

``torch_node`` records an ATen call (its non-tensor arguments encoded as
JSON, its tensor operands as the node's inputs), ``onnx_node`` an ONNX node
(the node itself, serialised). Either way the importer notes the op in
``Emitter.fallbacks`` (an ``UnsupportedOp`` each, with where it sits), which a
strict import turns into one ``UnsupportedOps`` listing them all.
"""
from __future__ import annotations

import base64
from typing import Any

from ..ops.egg import MAX_ARITY
from ..ops.fallback import describe
from .frontend import Const, Emitter, Unavailable, UnsupportedOp


class _Operands:
    """Collects a call's tensor operands (runtime values and constants) in order, numbering them."""

    def __init__(self, em: Emitter):
        self.em, self.values, self.dtypes = em, [], []

    def add(self, v: Any, dtype: str) -> dict:
        if isinstance(v, Unavailable):
            self.em.ref(v)          # raises: the value is not computed
        for i, w in enumerate(self.values):
            if w is v:
                return {"in": i}
        self.values.append(v)
        self.dtypes.append(dtype)
        return {"in": len(self.values) - 1}


def _torch_dtype_name(t) -> str:
    return str(t).removeprefix("torch.")


def _encode(torch, x, fx, ops: _Operands):
    """A torch argument as JSON; ``fx`` is the same argument in the FX graph (for a tensor's source dtype)."""
    if isinstance(x, (str, Const)) or (isinstance(x, Unavailable)):
        val = getattr(fx, "meta", {}).get("val")
        if isinstance(x, Const):
            dtype = str(x.value.dtype) if val is None else _torch_dtype_name(val.dtype)
            dtype = {"float64": "float32"}.get(dtype, dtype)
        else:
            dtype = _torch_dtype_name(val.dtype) if val is not None else "float32"
        return ops.add(x, dtype)
    if isinstance(x, (list, tuple)):
        fxs = fx if isinstance(fx, (list, tuple)) else [None] * len(x)
        return {"list": [_encode(torch, y, f, ops) for y, f in zip(x, fxs)]}
    if isinstance(x, torch.dtype):
        return {"dtype": _torch_dtype_name(x)}
    if isinstance(x, torch.device):
        return {"device": x.type}
    if isinstance(x, torch.layout):
        return {"layout": _torch_dtype_name(x)}
    if isinstance(x, torch.memory_format):
        return {"memory_format": _torch_dtype_name(x)}
    if x is None or isinstance(x, (bool, int, float)):
        return x
    raise TypeError(f"argument {x!r} of type {type(x).__name__}")


def torch_node(em: Emitter, node, args, kwargs, why: UnsupportedOp):
    """The value(s) of FX ``node`` computed by torch at run time; ``why`` is noted in ``em.fallbacks``."""
    import torch

    ops = _Operands(em)
    try:
        a = _encode(torch, list(args), list(node.args), ops)["list"]
        kw = {k: _encode(torch, v, node.kwargs.get(k), ops) for k, v in kwargs.items()}
    except TypeError as e:
        raise em.unsupported(f"{why.reason or 'no mapping'}; nor can it run as a fallback step ({e})") from None
    if not 1 <= len(ops.values) <= MAX_ARITY:
        raise em.unsupported(f"{why.reason or 'no mapping'}; nor can it run as a fallback step (it takes "
                             f"{len(ops.values)} tensors, a step takes 1 to {MAX_ARITY})")
    val = node.meta.get("val")
    target = f"{node.target.namespace}.{node.target._opname}.{node.target._overloadname}"
    em.fallbacks.append(why)

    def one(v, item):
        if not isinstance(v, torch.Tensor):
            return em.unavailable(f"the non-tensor output {item} of {target}")
        call = describe("torch", target, a, kw, ops.dtypes, tuple(v.shape), why.where, item)
        return em.node("fallback", ops.values, f"{node.name}.{item}" if item is not None else node.name, call=call)

    if isinstance(val, (tuple, list)):
        return tuple(one(v, i) for i, v in enumerate(val))
    return one(val, None)


def onnx_node(em: Emitter, node, ins, opsets: dict, dtypes: list[str], shapes: list, why: UnsupportedOp):
    """The outputs of ONNX ``node`` computed by ONNX's reference evaluator at run time."""
    ops = _Operands(em)
    names = []
    for name, v, dt in zip(node.input, ins, dtypes):
        if v is None:
            continue
        ops.add(v, dt)
        names.append(name)
    if not 1 <= len(ops.values) <= MAX_ARITY or len(set(names)) != len(ops.values):
        raise em.unsupported(f"{why.reason or 'no mapping'}; nor can it run as a fallback step (it takes "
                             f"{len(ops.values)} tensors, a step takes 1 to {MAX_ARITY})")
    em.fallbacks.append(why)
    blob = base64.b64encode(node.SerializeToString()).decode()
    outs = []
    for i, (o, shp) in enumerate(zip(node.output, shapes)):
        if shp is None:
            outs.append(em.unavailable(f"output {o!r} of {node.op_type}, whose shape is unknown"))
            continue
        call = describe("onnx", node.op_type, [], {}, ops.dtypes, shp, why.where, i, node=blob, opsets=opsets,
                        inputs=names)
        outs.append(em.node("fallback", ops.values, o or f"{node.op_type}.{i}", call=call))
    return tuple(outs)
