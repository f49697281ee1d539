"""scale: ``x * factor`` for a constant scalar ``factor`` (what the importers make of mul, div and neg by a constant;
other products and quotients become ``multiply`` and ``divide``)."""
from __future__ import annotations

import numpy as np

from .base import Library, Op, keep_shape


def _step(ins, out, attrs):
    a, f = ins[0], np.float32(float(attrs["factor"]))
    return lambda: np.multiply(a, f, out=out)


def _torch_div(em, node, a, kw):
    if kw.get("rounding_mode") is not None:
        raise em.unsupported(f"division with rounding_mode={kw['rounding_mode']!r}")
    return em.div(a[0], a[1], node.name)


def _onnx_div(em, node, ins, at, opset):
    return em.div(ins[0], ins[1], node.output[0])


OPS = [Op(
    "scale", 1, keep_shape,
    reference=lambda a, attrs: a[0] * attrs["factor"],
    library={"scale": Library(_step)},
    egg_attr=lambda attrs: repr(float(attrs["factor"])),
    from_egg=lambda s: {"factor": float(s)},
    torch={"mul": lambda em, node, a, kw: em.mul(a[0], a[1], node.name), "div": _torch_div,
           "neg": lambda em, node, a, kw: em.scale(a[0], -1.0, node.name)},
    onnx={"Mul": lambda em, node, ins, at, opset: em.mul(ins[0], ins[1], node.output[0]), "Div": _onnx_div,
          "Neg": lambda em, node, ins, at, opset: em.scale(ins[0], -1.0, node.output[0])},
    doc="x * factor (a constant scalar)",
)]
