"""pow: ``x ** exponent`` for a constant scalar exponent (RMSNorm's square, GELU's cube)."""
from __future__ import annotations

import numpy as np

from .base import Library, Op, elementwise_flops, keep_shape


def _step(ins, out, attrs):
    """Small integer exponents as products (libm's pow takes a slow path on many inputs: GPT-2's x**3 over a
    32 x 1024 tile took 2.8 ms through np.power, 25 us as two multiplies), 0.5 as a square root."""
    x, e = ins[0], float(attrs["exponent"])
    if e == 0.5:
        return lambda: np.sqrt(x, out=out)
    if e.is_integer() and 1 <= abs(e) <= 4:
        n = int(abs(e))

        def run():
            np.copyto(out, x)
            for _ in range(n - 1):
                np.multiply(out, x, out=out)
            if e < 0:
                np.reciprocal(out, out=out)
        return run
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
