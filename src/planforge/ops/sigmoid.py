"""sigmoid: ``1 / (1 + exp(-x))``."""
from __future__ import annotations

import numpy as np

from .base import Epilogue, Library, Op, elementwise_flops, keep_shape
from .kernel import eltwise_kernel


def reference(a, attrs):
    from scipy.special import expit  # exact in both tails, no overflow

    return expit(a[0])


def _step(ins, out, attrs):
    a = ins[0]

    def run():  # 1 / (1 + exp(-x)) in place, no temporaries; -x clamped at 88 so exp stays finite in fp32
        np.negative(a, out=out)
        np.minimum(out, 88.0, out=out)
        np.exp(out, out=out)
        np.add(out, 1.0, out=out)
        np.reciprocal(out, out=out)

    return run


OPS = [Op(
    "sigmoid", 1, keep_shape, reference,
    library={"sigmoid": Library(_step)},
    templated=True,
    flops=elementwise_flops(4),
    kernel=eltwise_kernel("sigmoid"),
    epilogue=Epilogue("v = 1.0f / (1.0f + vexp(-v));", "v = 1.0f / (1.0f + expf(-v));", flops=4,
                      torch=lambda v, _: v.sigmoid()),
    torch={"sigmoid": lambda em, node, a, kw: em.node("sigmoid", [a[0]], node.name)},
    onnx={"Sigmoid": lambda em, node, ins, at, opset: em.node("sigmoid", [ins[0]], node.output[0])},
    doc="1 / (1 + exp(-x))",
)]
