"""multiply and divide: ``x * y`` and ``x / y`` of two tensors, elementwise with numpy's broadcasting.

What the importers make of a product or quotient that is not by a uniform
constant (that one is ``scale``): rotary embeddings (``q * cos``), RMSNorm's
weight, gates (``silu(g) * u``), a division by a computed norm. The torch
``mul``/``div`` and ONNX ``Mul``/``Div`` mappings are ``scale``'s, whose
lowerings (``Emitter.mul``, ``div``) come here for such operands.
"""
from __future__ import annotations

import numpy as np
from egglog import rewrite

from .base import Library, Op, broadcast_shape, ufunc_step


def _true_divide(em, node, a, kw):
    if kw.get("rounding_mode") is not None:
        raise em.unsupported(f"division with rounding_mode={kw['rounding_mode']!r}")
    return em.node("divide", [a[0], a[1]], node.name)


def _layout(E, v):
    """Two 4-D operands that come out of the same transpose to NCHW are multiplied where they lie (a
    squeeze-excite's feature map by its per-channel gate, both of an NHWC chain): broadcasting pairs the same
    axes before and after the permutation."""
    def nchw(t):
        return E("transpose", t, attr="0,3,1,2")
    return {"layout": [rewrite(E("multiply", nchw(v.x), nchw(v.y))).to(nchw(E("multiply", v.x, v.y)))]}


OPS = [
    Op("multiply", 2, broadcast_shape, reference=lambda a, attrs: a[0] * a[1],
       library={"multiply": Library(ufunc_step(np.multiply))}, rules=_layout,
       doc="x * y (broadcast)"),
    Op("divide", 2, broadcast_shape, reference=lambda a, attrs: a[0] / a[1],
       library={"divide": Library(ufunc_step(np.divide))},
       torch={"true_divide": _true_divide},
       doc="x / y (broadcast)"),
]
