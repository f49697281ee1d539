"""hardsigmoid: ``max(0, min(1, alpha * x + beta))``; torch's (and MobileNetV3's) is alpha 1/6, beta 1/2.

The compiled epilogue implements the torch form (attribute ""); ONNX's default (alpha 0.2) keeps its
attributes and runs as a library step."""
from __future__ import annotations

import numpy as np

from .base import Epilogue, Library, Op, elementwise_flops, keep_shape
from .kernel import eltwise_kernel

TORCH_FORM = (1.0 / 6.0, 0.5)


def _ab(attrs):
    return float(attrs.get("alpha", TORCH_FORM[0])), float(attrs.get("beta", TORCH_FORM[1]))


def reference(a, attrs):
    al, be = _ab(attrs)
    return np.clip(a[0] * al + be, 0.0, 1.0)


def _step(ins, out, attrs):
    a = ins[0]
    al, be = _ab(attrs)

    def run():
        np.multiply(a, al, out=out)
        np.add(out, be, out=out)
        np.clip(out, 0.0, 1.0, out=out)

    return run


def _egg(attrs):
    ab = _ab(attrs)
    return "" if np.allclose(ab, TORCH_FORM, rtol=0, atol=1e-12) else f"{ab[0]!r},{ab[1]!r}"


def _from_egg(s):
    if not s:
        return {}
    al, be = s.split(",")
    return {"alpha": float(al), "beta": float(be)}


OPS = [Op(
    "hardsigmoid", 1, keep_shape, reference,
    library={"hardsigmoid": Library(_step, passes=3)},
    egg_attr=_egg,
    from_egg=_from_egg,
    templated=True,
    kernel=eltwise_kernel("hardsigmoid"),
    flops=elementwise_flops(4),
    epilogue=Epilogue("v = vmaxf(v * (1.0f / 6.0f) + 0.5f, vset(0.0f)); v = -vmaxf(-v, vset(-1.0f));",
                      "v = fminf(fmaxf(v * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f);", flops=4,
                      torch=lambda v, _: (v / 6.0 + 0.5).clamp(0.0, 1.0)),
    torch={"hardsigmoid": lambda em, node, a, kw: em.node("hardsigmoid", [a[0]], node.name)},
    onnx={"HardSigmoid": lambda em, node, ins, at, opset: em.node(
        "hardsigmoid", [ins[0]], node.output[0], alpha=float(at.get("alpha", 0.2)), beta=float(at.get("beta", 0.5)))},
    doc="max(0, min(1, alpha x + beta))",
)]
