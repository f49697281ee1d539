"""hardswish: ``x * relu6(x + 3) / 6`` (MobileNetV3)."""
from __future__ import annotations

import numpy as np

from .base import Epilogue, Library, Op, elementwise_flops, keep_shape
from .kernel import eltwise_kernel


def reference(a, attrs):
    x = a[0]
    return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0


def _step(ins, out, attrs):
    a = ins[0]
    t = np.empty_like(out)

    def run():
        np.add(a, 3.0, out=t)
        np.clip(t, 0.0, 6.0, out=t)
        np.multiply(t, 1.0 / 6.0, out=t)
        np.multiply(a, t, out=out)

    return run


OPS = [Op(
    "hardswish", 1, keep_shape, reference,
    library={"hardswish": Library(_step, passes=4)},
    templated=True,
    kernel=eltwise_kernel("hardswish"),
    flops=elementwise_flops(5),
    epilogue=Epilogue("{ vf t = vmaxf(v + 3.0f, vset(0.0f)); t = -vmaxf(-t, vset(-6.0f)); v = v * t * (1.0f / 6.0f); }",
                      "v = v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f);", flops=5,
                      torch=lambda v, _: v * (v + 3.0).clamp(0.0, 6.0) / 6.0),
    torch={"hardswish": lambda em, node, a, kw: em.node("hardswish", [a[0]], node.name)},
    onnx={"HardSwish": lambda em, node, ins, at, opset: em.node("hardswish", [ins[0]], node.output[0])},
    doc="x * relu6(x + 3) / 6",
)]
