"""relu: ``max(x, 0)``."""
from __future__ import annotations

import numpy as np

from .base import Epilogue, Library, Op, keep_shape
from .kernel import eltwise_kernel


def _step(ins, out, attrs):
    a = ins[0]
    return lambda: np.maximum(a, 0, out=out)


OPS = [Op(
    "relu", 1, keep_shape,
    reference=lambda a, attrs: np.maximum(a[0], 0),
    library={"relu": Library(_step)},
    templated=True,
    kernel=eltwise_kernel("relu"),
    epilogue=Epilogue("v = vmaxf(v, vset(0.0f));", "v = fmaxf(v, 0.0f);", flops=1, torch=lambda v, _: v.relu()),
    torch={"relu": lambda em, node, a, kw: em.node("relu", [a[0]], node.name)},
    onnx={"Relu": lambda em, node, ins, at, opset: em.node("relu", [ins[0]], node.output[0])},
    doc="max(x, 0)",
)]
