"""add: ``x + y`` of two tensors of one shape (a residual connection)."""
from __future__ import annotations

import numpy as np

from .base import Epilogue, Library, Op, need, ufunc_step
from .kernel import eltwise_kernel


def shape(s, attrs):
    need(tuple(s[0]) == tuple(s[1]), f"shape mismatch: {s[0]} vs {s[1]}")
    return tuple(s[0])


def _torch(em, node, a, kw):
    x, y = a[0], a[1]
    alpha = float(kw.get("alpha", a[2] if len(a) > 2 else 1))
    kind = node.target.overloadpacket.__name__
    if kind == "rsub":                  # y - alpha * x
        return em.add(em.scale(x, -alpha, node.name + ".neg"), y, node.name)
    return em.add(x, y, node.name, alpha=-alpha if kind == "sub" else alpha)


def _onnx(em, node, ins, at, opset):
    return em.add(ins[0], ins[1], node.output[0], alpha=-1.0 if node.op_type == "Sub" else 1.0)


OPS = [Op(
    "add", 2, shape,
    reference=lambda a, attrs: a[0] + a[1],
    library={"add": Library(ufunc_step(np.add))},
    templated=True,
    kernel=eltwise_kernel("add"),
    epilogue=Epilogue("v = v + vload(res + c);", "v = v + res[c];", flops=1, operand="residual",
                      torch=lambda v, res: v + res),
    torch={"add": _torch, "sub": _torch, "rsub": _torch},
    onnx={"Add": _onnx, "Sub": _onnx},
    doc="x + y (same shapes)",
)]
