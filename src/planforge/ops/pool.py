"""maxpool2d and avgpool2d over NCHW windows: ``kernel`` (KH, KW), ``stride``, ``pads`` (top, left, bottom, right),
``dilation`` (max only), ``ceil_mode``; avgpool's ``count_include_pad`` says whether padding counts in the mean.

Each has an NHWC twin (``maxpool2d_nhwc``, ``avgpool2d_nhwc``, e-graph only) and a ``layout`` rule that moves a pool
behind the transpose of an NHWC input (``pool(nchw(x)) = nchw(pool_nhwc(x))``), so that a pool between two NHWC
convolutions (ResNet's stem) needs no transpose: the one before it and the one after it cancel."""
from __future__ import annotations

import math

import numpy as np
from egglog import rewrite

from .base import Library, Op, ints, need

KEYS = ("kernel", "stride", "pads", "dilation")


def _geom(attrs):
    kh, kw = attrs["kernel"]
    sh, sw = attrs.get("stride") or (kh, kw)
    pt, pl, pb, pr = attrs.get("pads", (0, 0, 0, 0))
    dh, dw = attrs.get("dilation", (1, 1))
    return int(kh), int(kw), int(sh), int(sw), int(pt), int(pl), int(pb), int(pr), int(dh), int(dw)


def _out(n, k, s, p0, p1, d, ceil):
    span = n + p0 + p1 - d * (k - 1) - 1
    o = (-(-span // s) if ceil else span // s) + 1
    if ceil and (o - 1) * s >= n + p0:   # torch/ONNX: the last window must start inside the input or left pad
        o -= 1
    return o


def out_hw(x, attrs):
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw = _geom(attrs)
    ceil = bool(attrs.get("ceil_mode", False))
    return _out(x[2], kh, sh, pt, pb, dh, ceil), _out(x[3], kw, sw, pl, pr, dw, ceil)


def shape(s, attrs):
    x = s[0]
    need(len(x) == 4, f"2-D pooling needs an NCHW input, got {x}")
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw = _geom(attrs)
    need(min(kh, kw, sh, sw, dh, dw) >= 1 and min(pt, pl, pb, pr) >= 0, f"bad pooling geometry {_geom(attrs)}")
    # every window must cover at least one input element (a max over padding alone is -inf)
    need(max(pt, pb) < dh * (kh - 1) + 1 and max(pl, pr) < dw * (kw - 1) + 1,
         f"padding {(pt, pl, pb, pr)} is as wide as the {kh}x{kw} window")
    oh, ow = out_hw(x, attrs)
    need(oh >= 1 and ow >= 1, f"the {kh}x{kw} window does not fit the input {x}")
    return (x[0], x[1], oh, ow)


def _windows(xp, attrs, oh, ow, nhwc=False):
    """Each window position's strided view of the padded input, one per kernel offset."""
    kh, kw, sh, sw, _, _, _, _, dh, dw = _geom(attrs)
    for i in range(kh):
        for j in range(kw):
            hs = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
            ws = slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)
            yield xp[:, hs, ws, :] if nhwc else xp[:, :, hs, ws]


def _padded(x, attrs, oh, ow, fill, nhwc=False):
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw = _geom(attrs)
    h, w = (x.shape[1], x.shape[2]) if nhwc else (x.shape[2], x.shape[3])
    H = max(h + pt + pb, (oh - 1) * sh + dh * (kh - 1) + 1)
    W = max(w + pl + pr, (ow - 1) * sw + dw * (kw - 1) + 1)
    if nhwc:
        xp = np.full((x.shape[0], H, W, x.shape[3]), fill, x.dtype)
        return xp, xp[:, pt:pt + h, pl:pl + w, :]
    xp = np.full(x.shape[:2] + (H, W), fill, x.dtype)
    return xp, xp[:, :, pt:pt + h, pl:pl + w]


def _counts(x_shape, attrs, oh, ow, dtype):
    """Per output position, how many window entries the mean divides by."""
    ones = np.zeros((1, 1) + tuple(x_shape[2:]), dtype)
    ones[:] = 1
    include = attrs.get("count_include_pad", True)
    kh, kw, sh, sw, pt, pl, pb, pr, _, _ = _geom(attrs)
    mp, inner = _padded(ones, attrs, oh, ow, 0.0)
    inner[:] = 1
    if include:   # padding counts, the part of a ceil-mode window past the padding does not
        mp[:, :, :x_shape[2] + pt + pb, :x_shape[3] + pl + pr] = 1
    return sum(_windows(mp, attrs, oh, ow))


def max_ref(a, attrs):
    x = a[0]
    oh, ow = out_hw(x.shape, attrs)
    xp, inner = _padded(x, attrs, oh, ow, -np.inf)
    inner[:] = x
    return np.maximum.reduce(list(_windows(xp, attrs, oh, ow)))


def avg_ref(a, attrs):
    x = a[0]
    oh, ow = out_hw(x.shape, attrs)
    xp, inner = _padded(x, attrs, oh, ow, 0.0)
    inner[:] = x
    return sum(_windows(xp, attrs, oh, ow)) / _counts(x.shape, attrs, oh, ow, x.dtype)


def _step(kind, nhwc=False):
    def step(ins, out, attrs):
        x = ins[0]
        oh, ow = (out.shape[1], out.shape[2]) if nhwc else (out.shape[2], out.shape[3])
        xp, inner = _padded(x.astype(np.float32, copy=False), attrs, oh, ow, -np.inf if kind == "max" else 0.0, nhwc)
        views = list(_windows(xp, attrs, oh, ow, nhwc))
        inv = None
        if kind != "max":
            nchw_shape = (x.shape[0], x.shape[3], x.shape[1], x.shape[2]) if nhwc else x.shape
            inv = (1.0 / _counts(nchw_shape, attrs, oh, ow, np.float64)).astype(np.float32)
            inv = np.transpose(inv, (0, 2, 3, 1)) if nhwc else inv
        f = np.maximum if kind == "max" else np.add

        def run():
            np.copyto(inner, x)
            np.copyto(out, views[0])
            for v in views[1:]:
                f(out, v, out=out)
            if inv is not None:
                np.multiply(out, inv, out=out)

        return run
    return step


def geometry(attrs) -> tuple[int, ...]:
    """(kh, kw, sh, sw, pt, pl, pb, pr, dh, dw) of a pooling node's attributes (what a compiled pool takes)."""
    return _geom(attrs)


def _passes(kind):
    """Calls a step makes: the max pool one (the CPU target compiles it, ``targets/cpu/templates/maxpool.py``), the
    numpy average pool one per window tap (9 for 3x3)."""
    return (lambda at: 1) if kind == "max" else (lambda at: 9)


def _egg(attrs):
    g = _geom(attrs)
    return ",".join(map(str, g)) + f";{int(bool(attrs.get('ceil_mode', False)))};" \
        f"{int(bool(attrs.get('count_include_pad', True)))}"


def _from_egg(s):
    g, ceil, inc = s.split(";")
    v = ints(g)
    return {"kernel": v[0:2], "stride": v[2:4], "pads": v[4:8], "dilation": v[8:10], "ceil_mode": bool(int(ceil)),
            "count_include_pad": bool(int(inc))}


def _pair(v):
    v = [int(t) for t in (v if isinstance(v, (list, tuple)) else [v])]
    return v * 2 if len(v) == 1 else v


def _torch(kind):
    def lower(em, node, a, kw):
        k = _pair(a[1] if len(a) > 1 else kw["kernel_size"])
        s = _pair(kw.get("stride", a[2] if len(a) > 2 and a[2] else k)) or k
        p = _pair(kw.get("padding", a[3] if len(a) > 3 else 0))
        at = {"kernel": tuple(k), "stride": tuple(s), "pads": (p[0], p[1], p[0], p[1])}
        if kind == "max":
            at["dilation"] = tuple(_pair(kw.get("dilation", a[4] if len(a) > 4 else 1)))
            at["ceil_mode"] = bool(kw.get("ceil_mode", a[5] if len(a) > 5 else False))
        else:
            at["ceil_mode"] = bool(kw.get("ceil_mode", a[4] if len(a) > 4 else False))
            at["count_include_pad"] = bool(kw.get("count_include_pad", a[5] if len(a) > 5 else True))
            if kw.get("divisor_override", a[6] if len(a) > 6 else None) is not None:
                raise em.unsupported("avg_pool2d with divisor_override")
        y = em.node(f"{kind}pool2d", [a[0]], node.name, **at)
        return (y, em.unavailable("max_pool2d's indices")) if "with_indices" in str(node.target) else y
    return lower


def _onnx(kind):
    def lower(em, node, ins, at, opset):
        xs = em.shape(ins[0])
        if len(xs) != 4:
            raise em.unsupported(f"{len(xs) - 2}-D pooling; the IR pools 2-D NCHW inputs")
        if node.op_type.startswith("Global"):
            a = {"kernel": tuple(xs[2:]), "stride": (1, 1), "pads": (0, 0, 0, 0)}
        else:
            if at.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
                raise em.unsupported(f"auto_pad={at['auto_pad']}")
            k = list(at["kernel_shape"])
            a = {"kernel": tuple(k), "stride": tuple(at.get("strides", [1, 1])),
                 "pads": tuple(at.get("pads", [0, 0, 0, 0])) if at.get("auto_pad", "NOTSET") == "NOTSET" else (0,) * 4,
                 "ceil_mode": bool(at.get("ceil_mode", 0))}
            if kind == "max":
                if at.get("storage_order", 0):
                    raise em.unsupported("MaxPool with storage_order=1")
                a["dilation"] = tuple(at.get("dilations", [1, 1]))
            else:
                a["count_include_pad"] = bool(at.get("count_include_pad", 0))
        y = em.node(f"{kind}pool2d", [ins[0]], node.output[0], **a)
        return (y,) + tuple(em.unavailable("MaxPool's indices") for _ in node.output[1:])
    return lower


def _flops(s, out, attrs):
    kh, kw = attrs["kernel"]
    return float(math.prod(out) * kh * kw)


def _nhwc(f):
    """An NCHW function of one input as the NHWC one: ``f`` on the transposed input, transposed back."""
    return lambda a, attrs: np.transpose(f([np.transpose(a[0], (0, 3, 1, 2))], attrs), (0, 2, 3, 1))


def _nhwc_shape(s, attrs):
    x = s[0]
    need(len(x) == 4, f"2-D NHWC pooling needs an NHWC input, got {x}")
    n, c, oh, ow = shape([(x[0], x[3], x[1], x[2])], attrs)
    return (n, oh, ow, c)


def _layout(E, v):
    """``pool(nchw(x)) = nchw(pool_nhwc(x))`` for both pools (the transposes' attributes are ``conv_fused``'s)."""
    def nchw(t):
        return E("transpose", t, attr="0,3,1,2")

    return {"layout": [rewrite(E(f"{k}pool2d", nchw(v.x), attr=v.s)).to(nchw(E(f"{k}pool2d_nhwc", v.x, attr=v.s)))
                       for k in ("max", "avg")]}


NHWC_OPS = [
    Op(f"{k}pool2d_nhwc", 1, _nhwc_shape, _nhwc(ref), library={f"{k}pool2d_nhwc": Library(_step(k, True),
                                                                                           passes=_passes(k))},
       egg_attr=_egg, from_egg=_from_egg, flops=_flops, internal=True, rules=_layout if k == "max" else None,
       doc=f"2-D {k} pooling of an NHWC input (the layout rules' form)")
    for k, ref in (("max", max_ref), ("avg", avg_ref))]

OPS = NHWC_OPS + [
    Op("maxpool2d", 1, shape, max_ref, library={"maxpool2d": Library(_step("max"), passes=_passes("max"))},
       egg_attr=_egg, from_egg=_from_egg, flops=_flops,
       torch={"max_pool2d": _torch("max"), "max_pool2d_with_indices": _torch("max")},
       onnx={"MaxPool": _onnx("max"), "GlobalMaxPool": _onnx("max")}, doc="2-D max pooling (NCHW)"),
    Op("avgpool2d", 1, shape, avg_ref, library={"avgpool2d": Library(_step("avg"), passes=lambda at: 9)},
       egg_attr=_egg, from_egg=_from_egg, flops=_flops,
       torch={"avg_pool2d": _torch("avg")}, onnx={"AveragePool": _onnx("avg")}, doc="2-D average pooling (NCHW)"),
]
