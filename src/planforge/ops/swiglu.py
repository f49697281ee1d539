"""swiglu: ``silu(g) * u``, a gated MLP's gate (Llama's SwiGLU) as one elementwise step.

The importers see ``silu(gate_proj(x)) * up_proj(x)`` as a ``silu`` and a
``multiply``: two passes over the hidden activations, the product a library
step between native kernels. The ``algebra`` rule here makes a ``multiply``
of a ``silu`` by a value of the same shape equal to this internal op (both
operand orders), which the elementwise template computes in one pass with
``u`` as its residual operand (``Problem("eltwise", (rows, cols),
"swiglu")`` where both have the output's shape; a broadcast one runs the
library step, which broadcasts as ``multiply`` does.
"""
from __future__ import annotations

import numpy as np
from egglog import rewrite

from .base import Epilogue, Library, Op, broadcast_shape, elementwise_flops
from .kernel import eltwise_kernel


def kernel(s, out, attrs):
    if not (tuple(s[0]) == tuple(s[1]) == tuple(out)):
        return None
    return _eltwise(s, out, attrs)


_eltwise = eltwise_kernel("swiglu")


def reference(a, attrs):
    from scipy.special import expit

    return a[0] * expit(a[0]) * a[1]


def _step(ins, out, attrs):
    g, u = ins
    t = np.empty_like(out)

    def run():  # g / (1 + exp(-g)) * u; -g clamped at 88 so exp stays finite in fp32
        np.negative(g, out=t)
        np.minimum(t, 88.0, out=t)
        np.exp(t, out=t)
        np.add(t, 1.0, out=t)
        np.divide(g, t, out=out)
        np.multiply(out, u, out=out)

    return run


def _rules(E, v):
    g, u = v.x, v.y
    return {"algebra": [rewrite(E("multiply", E("silu", g), u)).to(E("swiglu", g, u)),
                        rewrite(E("multiply", u, E("silu", g))).to(E("swiglu", g, u))]}


OPS = [Op(
    "swiglu", 2, broadcast_shape, reference,
    library={"swiglu": Library(_step)},
    rules=_rules,
    templated=True,
    kernel=kernel,
    epilogue=Epilogue("v = v / (1.0f + vexp(-v)) * vload(res + c);", "v = v / (1.0f + expf(-v)) * res[c];", flops=6,
                      operand="residual", torch=lambda v, res: v * v.sigmoid() * res),
    flops=elementwise_flops(6),
    internal=True,
    doc="silu(g) * u (a gated MLP's gate)",
)]
