"""pair: groups several graph outputs under one root of the e-graph (internal; nothing to compute)."""
from __future__ import annotations

from .base import Library, Op

OPS = [Op(
    "pair", 2, lambda s, attrs: tuple(s[0]),
    reference=lambda a, attrs: a[0],
    library={"pair": Library(lambda ins, out, attrs: (lambda: None))},
    flops=lambda s, out, attrs: 0.0,
    view=True,
    internal=True,
    doc="several outputs",
)]
