"""tanh: the hyperbolic tangent."""
from __future__ import annotations

import numpy as np

from .base import Epilogue, Library, Op, elementwise_flops, keep_shape, ufunc_step
from .kernel import eltwise_kernel

OPS = [Op(
    "tanh", 1, keep_shape,
    reference=lambda a, attrs: np.tanh(a[0]),
    library={"tanh": Library(ufunc_step(np.tanh))},
    templated=True,
    flops=elementwise_flops(5),
    kernel=eltwise_kernel("tanh"),
    # 1 - 2 / (exp(2x) + 1): saturates to +-1 where exp's argument is clamped, never inf/inf
    epilogue=Epilogue("v = 1.0f - 2.0f / (vexp(2.0f * v) + 1.0f);", "v = tanhf(v);", flops=5,
                      torch=lambda v, _: v.tanh()),
    torch={"tanh": lambda em, node, a, kw: em.node("tanh", [a[0]], node.name)},
    onnx={"Tanh": lambda em, node, ins, at, opset: em.node("tanh", [ins[0]], node.output[0])},
    doc="tanh(x)",
)]
