"""A convolution as im2col + GEMM, an implementation choice beside the direct template for every NHWC convolution.

``im2col`` copies each output pixel's receptive field into one row, ``cols[n, oh, ow, (kh*KW + kw)*C + c] =
xpad[n, oh*SH + kh*DH, ow*SW + kw*DW, c]`` (zeros where the window covers padding); ``conv_wt_hwc`` is the weight
as the matching [KH*KW*Cg, O] matrix (a parameter: computed once when a plan is loaded); ``conv_gemm`` is then
``act(cols @ wt + b)`` per group, which for an ungrouped convolution is one GEMM of [N*OH*OW, KH*KW*C] by
[KH*KW*C, O] that the GEMM template runs (its epilogue adds the bias and applies the activation in registers).
A grouped convolution has only the library step (each group's columns are strided in a row). The rule
(``rules``) rewrites ``conv2d_nhwc`` and ``conv_act_nhwc`` with a bias (a folded batch norm gives every
convolution one) into this form without removing the direct one: extraction and the measured search choose.
Attributes: ``conv_gemm``'s is ``G;act`` (``conv_act``'s), ``im2col``'s the same or ``G`` alone (its geometry is
the first field).
"""
from __future__ import annotations

import math

import numpy as np
from egglog import rewrite

from .base import Library, Op, need
from .conv2d import geom_attrs, geom_str, out_hw
from .kernel import activations


def _geom(attrs):
    kh, kw = attrs["kernel"]
    sh, sw = attrs["stride"]
    pt, pl, pb, pr = attrs["pads"]
    dh, dw = attrs["dilation"]
    return kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, attrs["groups"]


def _cols_shape(s, attrs):
    x = s[0]
    need(len(x) == 4, f"im2col needs an NHWC input, got {x}")
    gm = _geom(attrs)
    OH, OW = out_hw(x[1], x[2], gm)
    need(OH >= 1 and OW >= 1, f"the {gm[0]}x{gm[1]} window does not fit the padded input {x}")
    return (x[0], OH, OW, gm[0] * gm[1] * x[3])


def _windows(xp, gm, OH, OW):
    """(kh, kw, the strided [N, OH, OW, C] view of the padded NHWC input at that kernel offset)."""
    kh, kw, sh, sw, _, _, _, _, dh, dw, _ = gm
    for i in range(kh):
        for j in range(kw):
            yield i, j, xp[:, i * dh: i * dh + sh * (OH - 1) + 1: sh, j * dw: j * dw + sw * (OW - 1) + 1: sw]


def _padded(x, gm):
    _, _, _, _, pt, pl, pb, pr, _, _, _ = gm
    return np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))


def im2col_ref(a, attrs):
    x = a[0]
    gm = _geom(attrs)
    N, OH, OW, KC = _cols_shape([x.shape], attrs)
    C = x.shape[3]
    out = np.empty((N, OH, OW, KC), x.dtype)
    for i, j, v in _windows(_padded(x, gm), gm, OH, OW):
        k = (i * gm[1] + j) * C
        out[..., k:k + C] = v
    return out


def _im2col_step(ins, out, attrs):
    x = ins[0]
    gm = _geom(attrs)
    _, _, _, _, pt, pl, pb, pr, _, _, _ = gm
    N, H, W, C = x.shape
    OH, OW = out.shape[1], out.shape[2]
    xp = np.zeros((N, H + pt + pb, W + pl + pr, C), np.float32)  # the border stays zero between calls
    inner = xp[:, pt:pt + H, pl:pl + W]
    copies = [(out[..., (i * gm[1] + j) * C:(i * gm[1] + j + 1) * C], v) for i, j, v in _windows(xp, gm, OH, OW)]

    def run():
        np.copyto(inner, x)
        for dst, src in copies:
            np.copyto(dst, src)

    return run


def _wt_shape(s, attrs):
    w = s[0]
    need(len(w) == 4, f"conv_wt_hwc reshapes a 4-D [O, Cg, KH, KW] weight, got {w}")
    return (w[2] * w[3] * w[1], w[0])


def wt_ref(a, attrs):
    w = a[0]
    return np.ascontiguousarray(np.transpose(w, (2, 3, 1, 0)).reshape(-1, w.shape[0]))


def _act(attrs) -> str:
    return attrs.get("act", "none")


def _gemm_attrs(s: str) -> dict:
    geo, _, act = s.partition(";")
    return {**geom_attrs(geo), "act": act or "none"}


def _gemm_egg(attrs) -> str:
    return geom_str(attrs) + ";" + _act(attrs)


def _gemm_shape(s, attrs):
    cols, wt, b = s
    g = attrs["groups"]
    kk = attrs["kernel"][0] * attrs["kernel"][1]
    need(len(cols) == 4 and len(wt) == 2 and tuple(b) == (wt[1],),
         f"conv_gemm of columns {cols} by {wt} (+ bias {b}): [N, OH, OW, KH*KW*C], [KH*KW*Cg, O] and [O]")
    need(cols[3] == wt[0] * g and wt[0] % kk == 0 and wt[1] % g == 0,
         f"conv_gemm: columns {cols} and weight {wt} do not fit a {attrs['kernel']} kernel in {g} groups")
    return (*cols[:3], wt[1])


def _grouped(cols2, wt, g, kk):
    """Per group: (its columns [M, KK*Cg] as a strided view, its weight [KK*Cg, Og]) of (kh, kw, c) rows."""
    M, KC = cols2.shape
    cg, og = KC // kk // g, wt.shape[1] // g
    c4 = cols2.reshape(M, kk, g, cg)
    return [(c4[:, :, k, :], wt[:, k * og:(k + 1) * og]) for k in range(g)], og


def gemm_ref(a, attrs):
    from .conv_fused import apply_act

    cols, wt, b = a
    g, kk = attrs["groups"], attrs["kernel"][0] * attrs["kernel"][1]
    c2 = cols.reshape(-1, cols.shape[3])
    parts, _ = _grouped(c2, wt, g, kk)
    y = np.concatenate([cg.reshape(c2.shape[0], -1) @ w for cg, w in parts], axis=1) + b
    return apply_act(y.reshape(*cols.shape[:3], wt.shape[1]), _act(attrs))


def _gemm_step(ins, out, attrs):
    from .registry import REGISTRY

    cols, wt, b = ins
    g, kk = attrs["groups"], attrs["kernel"][0] * attrs["kernel"][1]
    c2, o2 = cols.reshape(-1, cols.shape[3]), out.reshape(-1, wt.shape[1])
    parts, og = _grouped(c2, wt, g, kk)
    bufs = [np.empty((c2.shape[0], kk * (c2.shape[1] // kk // g)), np.float32) for _ in range(g if g > 1 else 0)]
    name = _act(attrs)
    op = None if name == "none" else REGISTRY[activations()[name]]
    tail = None if op is None else op.library[op.name].step([out], out, op.from_egg(name.partition(":")[2]))

    def run():
        if g == 1:
            np.matmul(c2, wt, out=o2)
        else:
            for k, ((cg, w), buf) in enumerate(zip(parts, bufs)):
                np.copyto(buf.reshape(cg.shape), cg)
                np.matmul(buf, w, out=o2[:, k * og:(k + 1) * og])
        np.add(o2, b, out=o2)
        if tail is not None:
            tail()

    return run


def _problem(s, out, attrs):
    from .kernel import epilogue_of_act
    from .matmul import gemm_problem

    if attrs["groups"] != 1:
        return None  # a grouped convolution's columns are strided per group: no one GEMM
    cols, wt = s[0], s[1]
    return gemm_problem([(cols[0] * cols[1] * cols[2], cols[3]), tuple(wt)], out, epilogue_of_act(_act(attrs)))


def rules(E, v):
    """Every NHWC convolution with a bias (with or without an activation epilogue) also as im2col + GEMM; the
    direct form stays (not subsumed, in a fixed order too: an implementation choice, not a phase)."""
    x, w, b, s = v.x, v.w, v.b, v.s
    conv_act = E("conv_act_nhwc", x, w, b, attr=s)  # its attribute G;act is conv_gemm's too
    return {"layout": [
        rewrite(E("conv2d_nhwc", x, w, b, attr=s)).to(
            E("conv_gemm", E("im2col", x, attr=s), E("conv_wt_hwc", w), b, attr=s + ";none")),
        rewrite(conv_act).to(E("conv_gemm", E("im2col", x, attr=s), E("conv_wt_hwc", w), b, attr=s))]}


OPS = [
    Op("im2col", 1, _cols_shape, im2col_ref,
       library={"im2col": Library(_im2col_step, passes=lambda at: at["kernel"][0] * at["kernel"][1] + 1)},
       egg_attr=geom_str, from_egg=geom_attrs, flops=lambda s, out, attrs: 0.0, internal=True,
       doc="an NHWC input's receptive fields as rows [N, OH, OW, KH*KW*C] (a convolution's im2col)"),
    Op("conv_wt_hwc", 1, _wt_shape, wt_ref,
       library={"conv_wt_hwc": Library(lambda ins, out, attrs: lambda: np.copyto(out, wt_ref(ins, attrs)))},
       flops=lambda s, out, attrs: 0.0, internal=True,
       doc="a convolution weight [O, Cg, KH, KW] as the [KH*KW*Cg, O] matrix im2col's rows multiply"),
    Op("conv_gemm", 3, _gemm_shape, gemm_ref, library={"conv_gemm": Library(_gemm_step, passes=3)},
       egg_attr=_gemm_egg, from_egg=_gemm_attrs, templated=True, kernel=_problem,
       flops=lambda s, out, attrs: 2.0 * math.prod(out) * s[1][0], roofline=True,
       tolerance_terms=lambda s: s[1][0], internal=True, rules=rules,
       doc="act(im2col columns @ weight + bias) per group: a convolution as a GEMM"),
]
