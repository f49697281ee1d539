"""adaptive_avg_pool2d: the mean over ``out`` (OH, OW) bins of an NCHW input, bin i spanning
[floor(i H / OH), ceil((i + 1) H / OH)) as torch defines it; (1, 1) is the global average pool.

The global pool has an NHWC twin (``global_avg_pool_nhwc``, e-graph only: [N, H, W, C] -> [N, 1, 1, C]) and a
``layout`` rule ``adaptive_avg_pool2d(nchw(x)) = nchw(global_avg_pool_nhwc(x))`` at (1, 1), so that the last
feature map of an NHWC chain is averaged where it lies, and only the [N, C] result changes layout."""
from __future__ import annotations

import math

import numpy as np
from egglog import rewrite

from .base import Library, Op, ints, need


def _bins(n, o):
    return [(i * n // o, -(-(i + 1) * n // o)) for i in range(o)]


def shape(s, attrs):
    x = s[0]
    need(len(x) == 4, f"adaptive average pooling needs an NCHW input, got {x}")
    oh, ow = attrs["out"]
    need(oh >= 1 and ow >= 1, f"output size {attrs['out']} must be positive")
    return (x[0], x[1], int(oh), int(ow))


def reference(a, attrs):
    x = a[0]
    oh, ow = attrs["out"]
    y = np.empty(x.shape[:2] + (oh, ow), x.dtype)
    for i, (h0, h1) in enumerate(_bins(x.shape[2], oh)):
        for j, (w0, w1) in enumerate(_bins(x.shape[3], ow)):
            y[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return y


def _step(ins, out, attrs):
    x = ins[0]
    oh, ow = attrs["out"]
    if (oh, ow) == (1, 1):
        flat = out.reshape(out.shape[0], out.shape[1])
        inv = np.float32(1.0 / (x.shape[2] * x.shape[3]))

        def run():
            np.sum(x.reshape(x.shape[0], x.shape[1], -1), axis=2, out=flat)
            np.multiply(flat, inv, out=flat)
        return run
    return lambda: np.copyto(out, reference([x], attrs))


def _torch(em, node, a, kw):
    xs = em.shape(a[0])
    out = [int(v) if v is not None else xs[2 + i] for i, v in enumerate(a[1])]
    return em.node("adaptive_avg_pool2d", [a[0]], node.name, out=tuple(out))


def _onnx(em, node, ins, at, opset):
    if len(em.shape(ins[0])) != 4:
        raise em.unsupported("GlobalAveragePool of a non-NCHW input")
    return em.node("adaptive_avg_pool2d", [ins[0]], node.output[0], out=(1, 1))


def _gap_shape(s, attrs):
    x = s[0]
    need(len(x) == 4, f"the NHWC global average pool needs an NHWC input, got {x}")
    return (x[0], 1, 1, x[3])


def _gap_step(ins, out, attrs):
    """The mean as one matrix product per image, a row of 1 / (H W) times the [H W, C] map: BLAS reads the map
    row by row, where numpy's sum over the middle axis of [N, H W, C] walks it column by column (1x24x24x16:
    20 us against 4 alone; in MobileNetV3-small's chain 110 us for that step)."""
    x = ins[0]
    n, h, w, c = x.shape
    rows = x.reshape(n, h * w, c)
    flat = out.reshape(n, 1, c)
    mean = np.full((1, h * w), 1.0 / (h * w), np.float32)
    return lambda: np.matmul(mean, rows, out=flat)


def _layout(E, v):
    nchw = lambda t: E("transpose", t, attr="0,3,1,2")  # noqa: E731 (conv_fused's NHWC -> NCHW)
    return {"layout": [rewrite(E("adaptive_avg_pool2d", nchw(v.x), attr="1,1")).to(
        nchw(E("global_avg_pool_nhwc", v.x)))]}


OPS = [Op("global_avg_pool_nhwc", 1, _gap_shape, lambda a, attrs: a[0].mean(axis=(1, 2), keepdims=True),
          library={"global_avg_pool_nhwc": Library(_gap_step)}, rules=_layout,
          flops=lambda s, out, attrs: float(math.prod(s[0])), internal=True,
          doc="the mean over H and W of an NHWC input (the layout rules' global average pool)"), Op(
    "adaptive_avg_pool2d", 1, shape, reference,
    library={"adaptive_avg_pool2d": Library(_step, passes=2)},
    egg_attr=lambda at: ",".join(map(str, at["out"])),
    from_egg=lambda s: {"out": ints(s)},
    flops=lambda s, out, attrs: float(math.prod(s[0])),
    torch={"adaptive_avg_pool2d": _torch, "_adaptive_avg_pool2d": _torch},
    onnx={"GlobalAveragePool": _onnx},
    doc="adaptive average pooling to (OH, OW) (NCHW; (1, 1): global average pool)",
)]
