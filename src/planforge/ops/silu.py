"""silu (swish): ``x * sigmoid(x)``."""
from __future__ import annotations

import numpy as np

from .base import Epilogue, Library, Op, elementwise_flops, keep_shape
from .kernel import eltwise_kernel


def reference(a, attrs):
    from scipy.special import expit  # exact in both tails, no overflow

    return a[0] * expit(a[0])


def _step(ins, out, attrs):
    a = ins[0]
    t = np.empty_like(out)

    def run():  # x / (1 + exp(-x)), with one scratch buffer; -x clamped at 88 so exp stays finite in fp32
        np.negative(a, out=t)
        np.minimum(t, 88.0, out=t)
        np.exp(t, out=t)
        np.add(t, 1.0, out=t)
        np.divide(a, t, out=out)

    return run


def _onnx_swish(em, node, ins, at, opset):
    alpha = float(at.get("alpha", 1.0))
    if alpha != 1.0:
        raise em.unsupported(f"Swish with alpha={alpha:g}; the IR has x * sigmoid(x) (alpha 1) only")
    return em.node("silu", [ins[0]], node.output[0])


OPS = [Op(
    "silu", 1, keep_shape, reference,
    library={"silu": Library(_step)},
    templated=True,
    flops=elementwise_flops(5),
    kernel=eltwise_kernel("silu"),
    epilogue=Epilogue("v = v / (1.0f + vexp(-v));", "v = v / (1.0f + expf(-v));", flops=5,
                      torch=lambda v, _: v * v.sigmoid()),
    torch={"silu": lambda em, node, a, kw: em.node("silu", [a[0]], node.name)},
    onnx={"Swish": _onnx_swish},  # opset 24; exporters to older opsets write Mul(x, Sigmoid(x))
    doc="x * sigmoid(x)",
)]
