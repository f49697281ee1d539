"""pow: ``x ** exponent`` for a constant scalar exponent (RMSNorm's square, GELU's cube)."""
from __future__ import annotations

import numpy as np

from .base import Library, Op, elementwise_flops, keep_shape


def _step(ins, out, attrs):
    x, e = ins[0], float(attrs["exponent"])
    if e == 2.0:
        return lambda: np.multiply(x, x, out=out)
    if e == 0.5:
        return lambda: np.sqrt(x, out=out)
    ef = np.float32(e)
    return lambda: np.power(x, ef, out=out)


def lower(em, x, exponent, name: str):
    e = em.uniform(exponent)
    if e is None or (not isinstance(exponent, (int, float)) and em.shape(exponent) not in ((), (1,))):
        raise em.unsupported("raises to a computed or non-scalar power; the IR's pow takes a constant scalar exponent")
    if e == 1.0:
        return x
    return em.node("pow", [x], name, exponent=float(e))


def _torch(em, node, a, kw):
    if not isinstance(a[0], str):
        raise em.unsupported("raises a constant to a computed power")
    return lower(em, a[0], a[1], node.name)


OPS = [Op(
    "pow", 1, keep_shape,
    reference=lambda a, attrs: np.power(a[0], float(attrs["exponent"])),
    library={"pow": Library(_step)},
    egg_attr=lambda attrs: repr(float(attrs["exponent"])),
    from_egg=lambda s: {"exponent": float(s)},
    flops=elementwise_flops(1),
    torch={"pow": _torch},
    onnx={"Pow": lambda em, node, ins, at, opset: lower(em, ins[0], ins[1], node.output[0])},
    doc="x ** exponent (a constant scalar)",
)]
