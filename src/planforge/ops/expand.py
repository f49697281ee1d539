"""expand: ``x`` broadcast to a larger ``shape`` (numpy's rules), materialised.

What the importers make of ``expand``/``expand_as``/ONNX ``Expand``, and how a
binary op between two tensors of different shapes is brought to one shape
(``Emitter.broadcast``) for the ops that need equal shapes (``add``).
"""
from __future__ import annotations

import numpy as np

from .base import Library, Op, ints, need, torch_out_shape


def shape(s, attrs):
    want = tuple(attrs["shape"])
    try:
        ok = np.broadcast_shapes(tuple(s[0]), want) == want
    except ValueError:
        ok = False
    need(ok, f"cannot expand {s[0]} to {want}")
    return want


def _step(ins, out, attrs):
    src = np.broadcast_to(ins[0], out.shape)
    return lambda: np.copyto(out, src)


def _onnx(em, node, ins, at, opset):
    want = em.const_ints(ins[1], "the target shape")
    try:
        out = np.broadcast_shapes(em.shape(ins[0]), tuple(want))
    except ValueError:
        raise em.unsupported(f"cannot expand {em.shape(ins[0])} to {want}") from None
    return em.broadcast(ins[0], out, node.output[0])


def _torch(em, node, a, kw):
    return em.broadcast(a[0], torch_out_shape(node), node.name)


OPS = [Op(
    "expand", 1, shape,
    reference=lambda a, attrs: np.array(np.broadcast_to(a[0], tuple(attrs["shape"]))),
    library={"expand": Library(_step)},
    egg_attr=lambda attrs: ",".join(map(str, attrs["shape"])),
    from_egg=lambda s: {"shape": ints(s)},
    flops=lambda s, out, attrs: 0.0,
    torch={"expand": _torch, "expand_as": _torch, "expand_copy": _torch, "broadcast_to": _torch},
    onnx={"Expand": _onnx},
    doc="broadcast to a larger shape",
)]
