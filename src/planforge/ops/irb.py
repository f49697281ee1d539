"""irb_nhwc: an inverted-residual block (MobileNetV2's, and MobileNetV3's without squeeze-excitation) as one kernel.

``y = pw(dw(act1(x @ w1 + b1)), w2) + b2 (+ x)``: a 1x1 expansion with an activation, a KxK depthwise convolution
with an activation, a linear 1x1 projection, and the residual connection where the block keeps its shape. As three
kernels the expanded tensor (6x the block's channels) is written out and read back twice over, and each step's
output is split between the cores that wrote it (MobileNetV2 at 96x96: its 1x1 expansion at 48x48 writes 0.9 MB,
and a depthwise step after a two-thread GEMM ran 5-6 us alone and 25-30 in the whole call). The template
(``Problem("irb", ...)``) keeps a ring of ``K`` expanded rows per thread: each output row expands the input rows it
newly needs, runs the depthwise row and projects it, so the expanded values live in L1 and L2 only.

The rules (``epilogue``) match the NHWC forms the convolution rules make (``pw_gemm`` for each 1x1 convolution,
``conv_act_nhwc`` for the depthwise one), with or without the expansion (MobileNetV2's first block has none) and
with or without the residual add. An e-node takes three operands at most, so the block's weights travel as one
parameter, ``irb_pack(gemm_pack(w1, b1), conv_pack(wd, bd), gemm_pack(w2, b2))`` (without the first for a block
without expansion): the three packed forms flattened one after the other, folded when a plan is loaded.

Attribute: ``act1|G;act2|res``: the expansion's activation (``copy``: no expansion), the depthwise convolution's
geometry and activation (``conv_act_nhwc``'s attribute), ``add`` or ``none``. The shape rule refuses geometries
the template does not run (not depthwise, not square, padding other than ``K // 2``, dilated, stride over 2), so
such a match stays unavailable and the three-kernel forms run.
"""
from __future__ import annotations

import math

import numpy as np
from egglog import rewrite, vars_

from .base import Library, Op, need
from .conv2d import geom_attrs
from .conv_fused import _pw_ref, fused_ref
from .egg import T
from .kernel import Problem

COPY = "copy"  # the expansion field of a block without expansion


def parse(attr: str) -> tuple[str, str, bool]:
    """(act1, the depthwise convolution's ``G;act2``, residual) of an ``irb_nhwc`` attribute."""
    parts = attr.split("|")
    need(len(parts) == 3 and parts[2] in ("add", "none"), f"irb attribute {attr!r}: expected act1|G;act2|add|none")
    return parts[0], parts[1], parts[2] == "add"


def dims(x, pack_len: int, attr: str) -> tuple[int, ...]:
    """(N, H, W, C, E, O, K, S) of a block on an NHWC input ``x`` whose packed weights are ``pack_len`` floats."""
    act1, dwa, res = parse(attr)
    need(len(x) == 4, f"irb_nhwc needs an NHWC input, got {x}")
    g = geom_attrs(dwa)
    (kh, kw), (sh, sw), pads, (dh, dw_), E = g["kernel"], g["stride"], g["pads"], g["dilation"], g["groups"]
    need(kh == kw and kh % 2 == 1 and tuple(pads) == (kh // 2,) * 4 and (dh, dw_) == (1, 1) and sh == sw
         and sh in (1, 2),
         f"irb_nhwc runs square odd depthwise kernels padded K//2, undilated, stride 1 or 2; got {dwa}")
    N, H, W, C = x
    expand = act1 != COPY
    need(expand or C == E, f"a block without expansion keeps its {C} channels, got {E} depthwise groups")
    rest = pack_len - E * (kh * kw + 2) - ((C + 1) * E if expand else 0)
    need(rest > 0 and rest % (E + 1) == 0, f"packed block weights of {pack_len} floats do not fit {C} -> {E} channels")
    O = rest // (E + 1)
    need(not res or (O == C and sh == 1), f"a residual block keeps its shape: {C} -> {O} channels at stride {sh}")
    return N, H, W, C, E, O, kh, sh


def out_shape(d) -> tuple[int, int, int, int]:
    N, H, W, C, E, O, K, S = d
    P = K // 2
    return N, (H + 2 * P - K) // S + 1, (W + 2 * P - K) // S + 1, O


def unpack(pack: np.ndarray, d, expand: bool):
    """(w1 [C, E], b1 [E], wd [E, 1, K, K], scale [E], shift [E], w2 [E, O], b2 [O]) of a packed block (w1, b1 None
    without expansion)."""
    N, H, W, C, E, O, K, S = d
    pack = np.asarray(pack).reshape(-1)
    off = 0
    w1 = b1 = None
    if expand:
        g1 = pack[: (C + 1) * E].reshape(C + 1, E)
        w1, b1, off = g1[:C], g1[C], (C + 1) * E
    cp = pack[off: off + E * (K * K + 2)].reshape(E, K * K + 2)
    off += E * (K * K + 2)
    g2 = pack[off:].reshape(E + 1, O)
    return w1, b1, cp[:, :K * K].reshape(E, 1, K, K), cp[:, K * K], cp[:, K * K + 1], g2[:E], g2[E]


def _shape(s, attrs):
    need(len(s[1]) == 1, f"irb_nhwc's weights are one packed vector, got {s[1]}")
    return out_shape(dims(s[0], s[1][0], attrs["attr"]))


def reference(a, attrs):
    x, pack = a
    act1, dwa, res = parse(attrs["attr"])
    d = dims(x.shape, pack.size, attrs["attr"])
    w1, b1, wd, scale, shift, w2, b2 = unpack(pack, d, act1 != COPY)
    h = x if act1 == COPY else _pw_ref([x, w1, b1], {"act": act1})
    h = fused_ref("conv_act", [h, wd * scale.reshape(-1, 1, 1, 1), shift], dwa, nhwc=True)
    y = _pw_ref([h, w2, b2], {"act": "none"})
    return y + x if res else y


def kernel(s, out, attrs):
    act1, dwa, res = parse(attrs["attr"])
    act2 = dwa.split(";")[1] if ";" in dwa else "none"
    return Problem("irb", dims(s[0], s[1][0], attrs["attr"]), f"{act1}/{act2}/{'add' if res else 'none'}")


def flops(s, out, attrs):
    N, H, W, C, E, O, K, S = dims(s[0], s[1][0], attrs["attr"])
    _, OH, OW, _ = out_shape((N, H, W, C, E, O, K, S))
    expand = 0 if parse(attrs["attr"])[0] == COPY else 2.0 * N * H * W * C * E
    return expand + 2.0 * N * OH * OW * E * (K * K + O + 1)


# -- irb_pack: the block's packed weights as one vector -------------------------------------------------------------

def pack_ref(a, attrs):
    return np.concatenate([np.asarray(t).reshape(-1) for t in a])


def _pack_shape(s, attrs):
    need(all(len(t) == 2 for t in s), f"irb_pack takes packed 2-D weights, got {list(s)}")
    *first, dw_, g2 = [tuple(t) for t in s]
    need(g2[0] == dw_[0] + 1 and (not first or first[0][1] == dw_[0]),
         f"irb_pack: {list(s)} are not a block's expansion [C+1, E], depthwise [E, KK+2] and projection [E+1, O]")
    return (sum(math.prod(t) for t in s),)


def _rules(E, v):
    x, w, b, y, s, s2 = v.x, v.w, v.b, v.y, v.s, v.s2
    wd, bd, w2, b2 = vars_("irb_wd irb_bd irb_w2 irb_b2", T)
    expanded = E("pw_gemm", x, w, b, attr=s)
    out = []
    for src, act1, pack in (
            (expanded, s, E("irb_pack", E("gemm_pack", w, b), E("conv_pack", wd, bd), E("gemm_pack", w2, b2))),
            (x, COPY, E("irb_pack", E("conv_pack", wd, bd), E("gemm_pack", w2, b2)))):
        proj = E("pw_gemm", E("conv_act_nhwc", src, wd, bd, attr=s2), w2, b2, attr="none")
        out.append(rewrite(proj).to(E("irb_nhwc", x, pack, attr=act1 + "|" + s2 + "|none")))
        fused = E("irb_nhwc", x, pack, attr=act1 + "|" + s2 + "|add")
        out += [rewrite(E("add", proj, x)).to(fused), rewrite(E("add", x, proj)).to(fused)]
    return {"epilogue": out}


OPS = [
    Op("irb_pack", (2, 3), _pack_shape, pack_ref,
       library={"irb_pack": Library(lambda ins, out, attrs: lambda: np.copyto(out, pack_ref(ins, attrs)))},
       flops=lambda s, out, attrs: 0.0, internal=True,
       doc="an inverted-residual block's packed weights as one vector"),
    Op("irb_nhwc", 2, _shape, reference, egg_attr=lambda at: at["attr"], from_egg=lambda s: {"attr": s},
       rules=_rules, templated=True, kernel=kernel, flops=flops, roofline=True,
       internal=True,
       doc="an inverted-residual block: 1x1 expansion, depthwise convolution, 1x1 projection (+ residual)"),
]
