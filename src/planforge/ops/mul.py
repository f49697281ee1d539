"""mul: ``x * g`` elementwise with broadcasting (internal: layer norm's scale after the algebra rule)."""
from __future__ import annotations

import numpy as np

from .base import Library, Op, need, ufunc_step


def shape(s, attrs):
    try:
        out = np.broadcast_shapes(tuple(s[0]), tuple(s[1]))
    except ValueError:
        out = None
    need(out == tuple(s[0]), f"mul of {s[0]} by {s[1]} must keep the first operand's shape")
    return tuple(s[0])


OPS = [Op(
    "mul", 2, shape,
    reference=lambda a, attrs: a[0] * a[1],
    library={"mul": Library(ufunc_step(np.multiply))},
    internal=True,
    doc="x * g (broadcast)",
)]
