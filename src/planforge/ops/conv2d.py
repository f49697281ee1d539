"""conv2d: 2-D convolution in NCHW, ``y[n, o] = b[o] + sum_{c, i, j} w[o, c, i, j] x[n, g*Cg + c, ...]``.

Inputs ``x`` [N, C, H, W], ``w`` [O, C/groups, KH, KW] and an optional bias ``b`` [O]; attributes
``stride`` (sh, sw), ``pads`` (top, left, bottom, right), ``dilation`` (dh, dw), ``groups`` (depthwise:
groups == C == O) and ``kernel`` (KH, KW, checked against ``w``; the e-graph's fused forms need it in their
attribute string). The e-graph attribute is the geometry ``G`` as eleven integers
``KH,KW,SH,SW,PT,PL,PB,PR,DH,DW,G``; the fused forms (``conv_fused``) extend it. The module also holds the
convolution arithmetic the fused forms, the templates' facts and the library steps share.
"""
from __future__ import annotations

import math

import numpy as np

from .base import Library, Op, ShapeError, ints, need
from .kernel import Problem, ProblemError, activations

GEOM_KEYS = ("KH", "KW", "SH", "SW", "PT", "PL", "PB", "PR", "DH", "DW", "G")


def geom(attrs) -> tuple[int, ...]:
    """(KH, KW, SH, SW, PT, PL, PB, PR, DH, DW, G) from IR attributes."""
    kh, kw = (int(v) for v in attrs["kernel"])
    sh, sw = (int(v) for v in attrs.get("stride", (1, 1)))
    pads = tuple(int(v) for v in attrs.get("pads", (0, 0, 0, 0)))
    dh, dw = (int(v) for v in attrs.get("dilation", (1, 1)))
    g = int(attrs.get("groups", 1))
    return (kh, kw, sh, sw, *pads, dh, dw, g)


def geom_str(attrs) -> str:
    return ",".join(map(str, geom(attrs)))


def geom_attrs(s: str) -> dict:
    """IR attributes from the geometry string (the first ``;`` field of a fused form's attribute)."""
    v = ints(s.split(";")[0])
    if len(v) != len(GEOM_KEYS):
        raise ShapeError(f"convolution geometry {s!r} needs {len(GEOM_KEYS)} integers ({','.join(GEOM_KEYS)})")
    return {"kernel": v[0:2], "stride": v[2:4], "pads": v[4:8], "dilation": v[8:10], "groups": v[10]}


def out_hw(H: int, W: int, gm) -> tuple[int, int]:
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, _ = gm
    return (H + pt + pb - dh * (kh - 1) - 1) // sh + 1, (W + pl + pr - dw * (kw - 1) - 1) // sw + 1


def conv_shape(x, w, attrs, nhwc: bool = False) -> tuple[int, ...]:
    """Output shape of a convolution of ``x`` (NCHW, or NHWC) by ``w`` [O, C/g, KH, KW]."""
    need(len(x) == 4 and len(w) == 4, f"conv2d needs a 4-D input and a 4-D weight, got {x} and {w}")
    gm = geom(attrs)
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, g = gm
    N, H, W_, C = (x[0], x[1], x[2], x[3]) if nhwc else (x[0], x[2], x[3], x[1])
    O, Cg = w[0], w[1]
    need(min(sh, sw, dh, dw, g) >= 1 and min(pt, pl, pb, pr) >= 0, f"bad convolution geometry {gm}")
    need((kh, kw) == (w[2], w[3]), f"kernel {kh}x{kw} does not match the weight {w}")
    need(C == Cg * g and O % g == 0, f"input channels {C} and weight {w} do not fit groups={g}")
    OH, OW = out_hw(H, W_, gm)
    need(OH >= 1 and OW >= 1, f"the kernel {kh}x{kw} (dilation {dh},{dw}) does not fit the padded input {x}")
    return (N, OH, OW, O) if nhwc else (N, O, OH, OW)


def shape(s, attrs):
    out = conv_shape(s[0], s[1], attrs)
    if len(s) == 3:
        need(tuple(s[2]) == (out[1],), f"bias {s[2]} does not match the {out[1]} output channels")
    return out


def _cols_into(xp, gm, OH, OW, cols):
    """im2col: ``cols[n, c, i, j, p, q] = xp[n, c, i*dh + p*sh, j*dw + q*sw]`` (xp padded)."""
    kh, kw, sh, sw, _, _, _, _, dh, dw, _ = gm
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = xp[:, :, i * dh: i * dh + sh * (OH - 1) + 1: sh, j * dw: j * dw + sw * (OW - 1) + 1: sw]


def conv_ref(x, w, b, attrs):
    """The convolution in ``x``'s dtype (fp64 inputs: the reference)."""
    gm = geom(attrs)
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, g = gm
    N, C, H, W = x.shape
    O = w.shape[0]
    OH, OW = out_hw(H, W, gm)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    cols = np.empty((N, C, kh, kw, OH, OW), x.dtype)
    _cols_into(xp, gm, OH, OW, cols)
    cols = cols.reshape(N, g, C // g * kh * kw, OH * OW)
    y = np.matmul(w.reshape(g, O // g, -1).astype(x.dtype), cols).reshape(N, O, OH, OW)
    return y if b is None else y + b.reshape(1, O, 1, 1)


def reference(a, attrs):
    return conv_ref(a[0], a[1], a[2] if len(a) > 2 else None, attrs)


def conv_step(x, w, out, attrs, tail=None):
    """A library convolution writing ``out`` (NCHW): im2col into a preallocated buffer, then one batched matmul
    per call; ``tail(out)`` (an epilogue, bound in place) runs after it."""
    gm = geom(attrs)
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, g = gm
    N, C, H, W = x.shape
    O, OH, OW = out.shape[1], out.shape[2], out.shape[3]
    xp = np.zeros((N, C, H + pt + pb, W + pl + pr), np.float32)
    inner = xp[:, :, pt:pt + H, pl:pl + W]
    cols = np.empty((N, C, kh, kw, OH, OW), np.float32)
    wg = np.ascontiguousarray(w.reshape(g, O // g, -1), dtype=np.float32)
    c2 = cols.reshape(N, g, C // g * kh * kw, OH * OW)
    o2 = out.reshape(N, g, O // g, OH * OW)

    def run():
        np.copyto(inner, x)
        _cols_into(xp, gm, OH, OW, cols)
        np.matmul(wg, c2, out=o2)
        if tail is not None:
            tail()

    return run


def _step(ins, out, attrs):
    bias = ins[2].reshape(1, -1, 1, 1) if len(ins) > 2 else None
    tail = None if bias is None else (lambda: np.add(out, bias, out=out))
    return conv_step(ins[0], ins[1], out, attrs, tail)


def _workspace(s):
    x, w = s[0], s[1]
    return 4 * x[0] * x[1] * w[2] * w[3] * x[2] * x[3]  # the im2col buffer (at stride 1; an upper bound)


def conv_flops(x, w, out) -> float:
    """2 x (MACs): every output element sums C/g * KH * KW products."""
    return 2.0 * math.prod(out) * w[1] * w[2] * w[3]


def flops(s, out, attrs):
    return conv_flops(s[0], s[1], out) + (math.prod(out) if len(s) == 3 else 0)


def _pair(v, n=2):
    v = [int(t) for t in (v if isinstance(v, (list, tuple)) else [v])]
    return v * n if len(v) == 1 else v


def _torch(em, node, a, kw):
    """aten.conv2d(x, w, b, stride, padding, dilation, groups) and aten.convolution (not transposed)."""
    name = node.target.overloadpacket.__name__
    x, w = a[0], a[1]
    b = kw.get("bias", a[2] if len(a) > 2 else None)
    stride = _pair(kw.get("stride", a[3] if len(a) > 3 else 1))
    padding = kw.get("padding", a[4] if len(a) > 4 else 0)
    dilation = _pair(kw.get("dilation", a[5] if len(a) > 5 else 1))
    if name == "convolution":
        if a[6] if len(a) > 6 else kw.get("transposed", False):
            raise em.unsupported("transposed convolution")
        groups = int(kw.get("groups", a[8] if len(a) > 8 else 1))
    else:
        groups = int(kw.get("groups", a[6] if len(a) > 6 else 1))
    ws = em.shape(w)
    if len(ws) != 4:
        raise em.unsupported(f"{len(ws) - 2}-D convolution; the IR has conv2d only")
    if isinstance(padding, str):
        if padding == "valid":
            padding = [0, 0]
        elif padding == "same" and all(s == 1 for s in stride):
            th, tw = (dilation[0] * (ws[2] - 1), dilation[1] * (ws[3] - 1))
            pads = [th // 2, tw // 2, th - th // 2, tw - tw // 2]
            return conv(em, x, w, b, node.name, stride, pads, dilation, groups)
        else:
            raise em.unsupported(f"padding={padding!r}")
    ph, pw = _pair(padding)
    return conv(em, x, w, b, node.name, stride, [ph, pw, ph, pw], dilation, groups)


def conv(em, x, w, b, name, stride, pads, dilation, groups):
    """Emit ``conv2d``; the bias is dropped when absent (a zero bias stays: it costs one add)."""
    ws = em.shape(w)
    ins = [x, w] + ([b] if b is not None else [])
    return em.node("conv2d", ins, name, kernel=(int(ws[2]), int(ws[3])), stride=tuple(stride), pads=tuple(pads),
                   dilation=tuple(dilation), groups=int(groups))


def _onnx(em, node, ins, at, opset):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    ws = em.shape(w)
    if len(ws) != 4:
        raise em.unsupported(f"{len(ws) - 2}-D Conv; the IR has 2-D convolution only")
    stride = list(at.get("strides", [1, 1]))
    dilation = list(at.get("dilations", [1, 1]))
    pad = at.get("auto_pad", "NOTSET")
    if pad in ("NOTSET", "VALID"):
        p = list(at.get("pads", [0, 0, 0, 0])) if pad == "NOTSET" else [0, 0, 0, 0]
        pads = [p[0], p[1], p[2], p[3]]           # ONNX: [top, left, bottom, right]
    else:                                          # SAME_UPPER / SAME_LOWER
        xs = em.shape(x)
        pads = [0, 0, 0, 0]
        for k, (n, s, d, kk) in enumerate(zip(xs[2:], stride, dilation, ws[2:])):
            total = max(0, (-(-n // s) - 1) * s + d * (kk - 1) + 1 - n)
            small, big = total // 2, total - total // 2
            pads[k], pads[k + 2] = (small, big) if pad == "SAME_UPPER" else (big, small)
    return conv(em, x, w, b, node.output[0], stride, pads, dilation, int(at.get("group", 1)))


# kind -> (operand forms, number of activation fields in its attribute after G)
KINDS = {"conv2d": ("w", "wb"), "conv_act": ("w", "wb"), "conv_bn": ("wss",), "conv_bn_act": ("wss",),
         "conv_add": ("packed",), "conv_add_act": ("packed",)}
ACT_FIELDS = {"conv2d": 0, "conv_act": 1, "conv_bn": 0, "conv_bn_act": 1, "conv_add": 1, "conv_add_act": 2}


def chain_of(kind: str, acts: list[str]) -> str:
    """The epilogue chain a template applies after the per-channel scale and shift: activations and ``add``."""
    steps = []
    if kind in ("conv_act", "conv_bn_act", "conv_add", "conv_add_act") and acts[0] != "none":
        steps.append(acts[0])
    if kind in ("conv_add", "conv_add_act"):
        steps.append("add")
    if kind == "conv_add_act":
        steps.append(acts[1])
    return "_".join(steps) or "none"


def conv_problem(kind: str, nhwc: bool, s, out, attrs):
    """The template problem of a convolution e-node: ``conv`` (direct) or ``dwconv`` (depthwise); the epilogue
    ``layout/form/chain`` says how the operands come (``w``, ``wb``, ``wss``, ``packed``) and what follows."""
    g = attrs["groups"]
    kh, kw = attrs["kernel"]
    x = s[0]
    N, C, H, W = (x[0], x[3], x[1], x[2]) if nhwc else tuple(x)
    O = out[3] if nhwc else out[1]
    forms = KINDS[kind]
    form = forms[0] if len(forms) == 1 else ("wb" if len(s) == 3 else "w")
    acts = attrs.get("acts", [])
    if any(a not in activations() for a in acts if a != "none"):
        return None
    dims = (N, C, H, W, O, kh, kw, *attrs["stride"], *attrs["pads"], *attrs["dilation"], g)
    op = "dwconv" if g == C == O and g > 1 else "conv"
    try:
        return Problem(op, dims, f"{'nhwc' if nhwc else 'nchw'}/{form}/{chain_of(kind, acts)}")
    except ProblemError:
        return None


OPS = [Op(
    "conv2d", (2, 3), shape, reference,
    library={"conv2d": Library(_step, workspace=_workspace, passes=lambda at: 3)},
    egg_attr=geom_str,
    from_egg=geom_attrs,
    templated=True,
    kernel=lambda s, out, attrs: conv_problem("conv2d", False, s, out, attrs),
    flops=flops,
    roofline=True,
    layout_bytes=lambda s, out, attrs: 8.0 * math.prod(out),  # conv_fused.nchw_copies: NHWC scratch, written back
    torch={"conv2d": _torch, "convolution": _torch},
    onnx={"Conv": _onnx},
    tolerance_terms=lambda s: s[1][1] * s[1][2] * s[1][3],
    doc="2-D convolution (NCHW; groups, stride, padding, dilation)",
)]
