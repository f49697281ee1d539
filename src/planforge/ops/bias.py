"""bias: ``x + b`` with ``b`` a vector as wide as ``x``'s last axis (what the importers make of a broadcast add)."""
from __future__ import annotations

import numpy as np
from egglog import rewrite

from .base import Epilogue, Library, Op, need, ufunc_step
from .kernel import eltwise_kernel


def shape(s, attrs):
    need(len(s[1]) == 1 and len(s[0]) >= 1 and s[1][0] == s[0][-1],
         f"bias {s[1]} does not match last dimension of {s[0]}")
    return tuple(s[0])


def _rules(E, v):
    # two biases in a row are one (their sum is folded into a constant at load time)
    return {"algebra": [rewrite(E("bias", E("bias", v.x, v.b), v.b2)).to(E("bias", v.x, E("add", v.b, v.b2)))]}


OPS = [Op(
    "bias", 2, shape,
    reference=lambda a, attrs: a[0] + a[1],
    library={"bias": Library(ufunc_step(np.add))},
    rules=_rules,
    templated=True,
    kernel=eltwise_kernel("bias"),
    epilogue=Epilogue("v = v + vload(bias + c);", "v = v + bias[c];", flops=1, operand="bias",
                      torch=lambda v, b: v + b),
    doc="x + b (b broadcast over the last axis)",
)]
