"""where: ``cond ? a : b`` elementwise with broadcasting; ``masked_fill`` is ``where(mask, value, x)``.

Conditions are IR values like any other: booleans held as 0/1 (nonzero is true).
"""
from __future__ import annotations

import numpy as np

from .base import Library, Op, broadcast_shape, operand


def reference(a, attrs):
    return np.where(a[0] != 0, a[1], a[2])


def _step(ins, out, attrs):
    c, x, y = ins
    mask = np.empty(c.shape, np.bool_)

    def run():
        np.not_equal(c, 0, out=mask)
        np.copyto(out, y)
        np.copyto(out, x, where=mask)

    return run


def _torch_where(em, node, a, kw):
    if len(a) == 1:
        raise em.unsupported("where(cond) with one argument (the indices of nonzero entries: a data-dependent shape)")
    return em.node("where", [a[0], operand(em, a[1], node.name + ".a"), operand(em, a[2], node.name + ".b")],
                   node.name)


def _torch_masked_fill(em, node, a, kw):
    return em.node("where", [a[1], operand(em, a[2], node.name + ".value"), a[0]], node.name)


OPS = [Op(
    "where", 3, broadcast_shape, reference,
    library={"where": Library(_step, passes=3)},
    torch={"where": _torch_where, "masked_fill": _torch_masked_fill},
    onnx={"Where": lambda em, node, ins, at, opset: em.node("where", ins[:3], node.output[0])},
    doc="cond ? a : b (broadcast)",
)]
