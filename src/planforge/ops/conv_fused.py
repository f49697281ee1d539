"""The fused convolutions of the e-graph, and the rules that make them: the seeds' phase-ordering example.

For ``y = act(batchnorm(conv2d(x, w)))`` the rules are
- A, ``algebra``: fold the batch norm into the convolution's weight and bias (``bn_fold_w``, ``bn_fold_b``:
  parameters only, computed once when a plan is loaded);
- B, ``epilogue``: a fused Conv+BN kernel, ``conv_bn(x, w, bn_affine(stats))`` (the normalisation applied per
  output channel in the kernel's epilogue, the weights left as they are);
- C, ``epilogue``: a convolution with an activation epilogue, ``conv_act`` (after A: ``act(conv2d(x, w', b'))``);
- the three-in-one Conv+BN+act kernel, ``conv_bn_act``;
- a residual add in the epilogue, before or after the activation (``conv_add``, ``conv_add_act``); the
  weight and its per-channel [scale; shift] travel as one packed parameter (``conv_pack``) so that the
  e-node keeps three operands;
- ``layout``: every convolution may run in NHWC between two transposes, and a transpose followed by its
  inverse cancels, so consecutive NHWC convolutions (and the elementwise ops between them, which commute
  with a transpose) never go back to NCHW.
A fixed order of these rule groups loses options (fold first: no B; fuse first: no A); the e-graph keeps
them all, and extraction chooses by cost.

Attributes: ``G`` (``conv2d``'s geometry string), then ``;act`` for an activation epilogue; ``conv_add``'s is
``G;act1`` (act1 before the add, ``none`` for none), ``conv_add_act``'s ``G;act1;act2``.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from egglog import rewrite

from .base import Library, Op, need
from .conv2d import ACT_FIELDS, KINDS, chain_of, conv_flops, conv_problem, conv_ref, conv_shape, geom_attrs, geom_str
from .kernel import activations

NCHW_TO_NHWC, NHWC_TO_NCHW = "0,2,3,1", "0,3,1,2"

def split_attr(s: str) -> tuple[dict, list[str]]:
    """(geometry attributes, activation fields) of a fused form's attribute string."""
    parts = s.split(";")
    return geom_attrs(parts[0]), parts[1:]


def apply_act(y, name: str):
    """An activation by name (``relu``, ``gelu:tanh``) with its op's reference."""
    from .registry import REGISTRY

    if name == "none":
        return y
    op_name, _, attr = name.partition(":")
    op = REGISTRY[op_name]
    return op.reference([y], op.from_egg(attr))


def unpack(wss, w_shape):
    """(w, scale, shift) of a ``conv_pack`` parameter [O, Cg*KH*KW + 2]."""
    k = math.prod(w_shape[1:])
    return wss[:, :k].reshape(w_shape), wss[:, k], wss[:, k + 1]


def _w_shape(kind, s, attrs, nhwc=False):
    """The weight shape [O, Cg, KH, KW] of a fused form (a packed one keeps it in the geometry)."""
    if KINDS[kind] != ("packed",):
        return tuple(s[1])
    g = attrs["groups"]
    kh, kw = attrs["kernel"]
    C = s[0][3] if nhwc else s[0][1]
    O = s[1][0]
    need(s[1][1] == C // g * kh * kw + 2, f"packed convolution parameter {s[1]} does not fit {C} channels")
    return (O, C // g, kh, kw)


def _scale_shift(kind, a, w_shape):
    """(w, scale, shift) of any form's operands (None: 1, resp. 0)."""
    if kind in ("conv2d", "conv_act"):
        return a[1], None, a[2] if len(a) > 2 else None
    if kind in ("conv_bn", "conv_bn_act"):
        return a[1], a[2][0], a[2][1]
    return unpack(a[1], w_shape)


def fused_ref(kind: str, a, s: str, nhwc: bool = False):
    """The fp64 (or input-dtype) semantics of a fused form."""
    attrs, acts = split_attr(s)
    x = np.transpose(a[0], (0, 3, 1, 2)) if nhwc else a[0]
    shapes = [x.shape] + [np.shape(t) for t in a[1:]]
    w, scale, shift = _scale_shift(kind, a, _w_shape(kind, shapes, attrs))  # x is NCHW here
    y = conv_ref(x, np.asarray(w, x.dtype), None, attrs)
    if scale is not None:
        y = y * np.asarray(scale, x.dtype).reshape(1, -1, 1, 1)
    if shift is not None:
        y = y + np.asarray(shift, x.dtype).reshape(1, -1, 1, 1)
    if kind in ("conv_act", "conv_bn_act", "conv_add", "conv_add_act"):
        y = apply_act(y, acts[0])
    if kind in ("conv_add", "conv_add_act"):
        r = np.transpose(a[2], (0, 3, 1, 2)) if nhwc else a[2]
        y = y + r
    if kind == "conv_add_act":
        y = apply_act(y, acts[1])
    return np.transpose(y, (0, 2, 3, 1)) if nhwc else y


def _shape(kind, nhwc):
    def shape(s, attrs):
        out = conv_shape(s[0], _w_shape(kind, s, attrs, nhwc), attrs, nhwc)
        O = out[3] if nhwc else out[1]
        if kind in ("conv2d", "conv_act") and len(s) == 3:
            need(tuple(s[2]) == (O,), f"bias {s[2]} does not match the {O} output channels")
        if kind in ("conv_bn", "conv_bn_act"):
            need(tuple(s[2]) == (2, O), f"per-channel [scale; shift] {s[2]} must be [2, {O}]")
        if kind in ("conv_add", "conv_add_act"):
            need(tuple(s[2]) == tuple(out), f"residual {s[2]} does not match the output {out}")
        return out
    return shape


def _from_egg(s: str) -> dict:
    attrs, acts = split_attr(s)
    return {**attrs, "acts": acts}


def _egg(kind):
    def egg(attrs):
        acts = list(attrs.get("acts", []))
        need(len(acts) == ACT_FIELDS[kind], f"{kind} needs {ACT_FIELDS[kind]} activation fields, got {acts}")
        return ";".join([geom_str(attrs), *acts])
    return egg


def _flops(kind, nhwc):
    def flops(s, out, attrs):
        return conv_flops(s[0], _w_shape(kind, s, attrs, nhwc), out) + 2.0 * math.prod(out)
    return flops


def nchw_copies(residual: bool = False):
    """An NCHW form's own layout passes (``Op.layout_bytes``): its output computed in NHWC scratch, then read and
    written back transposed, and a residual read and written into NHWC before (the NHWC forms do neither)."""
    return lambda s, out, attrs: 4.0 * (2 + 2 * residual) * math.prod(out)


def _op(kind: str, nhwc: bool) -> Op:
    arity = (2, 3) if kind in ("conv_act",) else (3 if kind != "conv2d" else (2, 3))
    name = kind + ("_nhwc" if nhwc else "")
    return Op(name, arity, _shape(kind, nhwc),
              reference=lambda a, attrs, kind=kind, nhwc=nhwc: fused_ref(kind, a, _egg(kind)(attrs), nhwc),
              egg_attr=_egg(kind), from_egg=_from_egg, templated=True,
              kernel=lambda s, out, attrs, kind=kind, nhwc=nhwc: conv_problem(kind, nhwc, s, out, attrs),
              flops=_flops(kind, nhwc), roofline=True, internal=True,
              layout_bytes=None if nhwc else nchw_copies(kind in ("conv_add", "conv_add_act")),
              doc=f"{kind} in {'NHWC' if nhwc else 'NCHW'} (a form of the convolution rules)")


# -- conv_pack: (w[, b | ss]) as one [O, Cg*KH*KW + 2] parameter (folded at load time) ------------------------

def pack_ref(a, attrs):
    w = np.asarray(a[0])
    O = w.shape[0]
    scale, shift = np.ones(O, w.dtype), np.zeros(O, w.dtype)
    if len(a) == 2 and np.ndim(a[1]) == 2:
        scale, shift = a[1][0], a[1][1]
    elif len(a) == 2:
        shift = a[1]
    return np.concatenate([w.reshape(O, -1), np.asarray(scale, w.dtype)[:, None], np.asarray(shift, w.dtype)[:, None]],
                          axis=1)


def _pack_shape(s, attrs):
    w = s[0]
    need(len(w) == 4, f"conv_pack packs a 4-D weight, got {w}")
    if len(s) == 2:
        need(tuple(s[1]) in ((w[0],), (2, w[0])), f"{s[1]} is neither a bias nor a [scale; shift] for {w}")
    return (w[0], math.prod(w[1:]) + 2)


def _pack_step(ins, out, attrs):
    return lambda: np.copyto(out, pack_ref(ins, attrs))


PACK = Op("conv_pack", (1, 2), _pack_shape, pack_ref, library={"conv_pack": Library(_pack_step)},
          flops=lambda s, out, attrs: 0.0, internal=True, doc="a convolution weight and its per-channel scale, shift")


# -- a 1x1 convolution in NHWC is a GEMM: [N*H*W, C] @ [C, O] ---------------------------------------------------

POINTWISE = "1,1,1,1,0,0,0,0,1,1,1"  # the geometry of a 1x1, stride 1, unpadded, ungrouped convolution


def _wt_ref(a, attrs):
    w = a[0]
    return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)


def _pw_shape(s, attrs):
    x, wt, b = s
    need(len(x) == 4 and tuple(wt) == (x[3], wt[1]) and tuple(b) == (wt[1],),
         f"pointwise GEMM of {x} by {wt} (+ bias {b}): an NHWC input, a [C, O] weight and an [O] bias")
    return (*x[:3], wt[1])


def _pw_ref(a, attrs):
    x, wt, b = a
    y = (x.reshape(-1, x.shape[3]) @ wt + b).reshape(*x.shape[:3], wt.shape[1])
    return apply_act(y, attrs.get("act", "none"))


def _pw_step(ins, out, attrs):
    from .registry import REGISTRY

    x, wt, b = ins
    x2, o2 = x.reshape(-1, x.shape[3]), out.reshape(-1, wt.shape[1])
    name = attrs.get("act", "none")
    op = None if name == "none" else REGISTRY[activations()[name]]
    tail = None if op is None else op.library[op.name].step([out], out, op.from_egg(name.partition(":")[2]))

    def run():
        np.matmul(x2, wt, out=o2)
        np.add(o2, b, out=o2)
        if tail is not None:
            tail()

    return run


def _pw_problem(s, out, attrs):
    from .kernel import epilogue_of_act
    from .matmul import gemm_problem

    x, wt = s[0], s[1]
    return gemm_problem([(x[0] * x[1] * x[2], x[3]), tuple(wt)], out, epilogue_of_act(attrs.get("act", "none")))


POINTWISE_OPS = [
    Op("conv_wt", 1, lambda s, attrs: (math.prod(s[0][1:]), s[0][0]), _wt_ref,
       library={"conv_wt": Library(lambda ins, out, attrs: lambda: np.copyto(out, _wt_ref(ins, attrs)))},
       flops=lambda s, out, attrs: 0.0, internal=True, doc="a 1x1 convolution's weight as a [C, O] matrix"),
    Op("pw_gemm", 3, _pw_shape, _pw_ref, library={"pw_gemm": Library(_pw_step, passes=3)},
       egg_attr=lambda at: at.get("act", "none"), from_egg=lambda s: {"act": s or "none"}, templated=True,
       kernel=_pw_problem, flops=lambda s, out, attrs: 2.0 * math.prod(out) * s[0][3], roofline=True,
       internal=True, doc="a 1x1 NHWC convolution as act(x @ w + b) over its pixels"),
]


def _pointwise(E, v, rw=rewrite):
    x, w, b = v.x, v.w, v.b
    rules = [rw(E("conv2d_nhwc", x, w, b, attr=POINTWISE)).to(E("pw_gemm", x, E("conv_wt", w), b, attr="none"))]
    for name in activations():
        rules.append(rw(E("conv_act_nhwc", x, w, b, attr=POINTWISE + ";" + name)).to(
            E("pw_gemm", x, E("conv_wt", w), b, attr=name)))
    return rules


# -- the rules -----------------------------------------------------------------------------------------------------

def _act_nodes(E, y):
    """(activation name, e-node act(y)) for every activation with a compiled epilogue."""
    return [(name, E(op, y, attr=name.partition(":")[2])) for name, op in activations().items()]


GROUPS = ("fold", "fuse", "epilogue", "layout")
RULESET_OF = {"fold": "algebra", "fuse": "epilogue", "epilogue": "epilogue", "layout": "layout"}


def rule_groups(E, v, subsume: bool = False) -> dict[str, list]:
    """The rules by the seeds' groups: ``fold`` (A), ``fuse`` (B and the three-in-one), ``epilogue`` (C and the
    residual adds), ``layout`` (NHWC, transpose cancellation, 1x1 as GEMM). ``subsume``: each rewrite removes what
    it matched (a destructive, sequential rewriter: a later group no longer sees the form it replaced)."""
    def rw(lhs):
        return rewrite(lhs, subsume=subsume)

    x, w, b, g, s, s2, y = v.x, v.w, v.b, v.g, v.s, v.s2, v.y
    conv3, conv2 = E("conv2d", x, w, b, attr=s), E("conv2d", x, w, attr=s)
    fold = [  # A
        rw(E("batchnorm", conv3, g, attr=s2)).to(
            E("conv2d", x, E("bn_fold_w", w, g, attr=s2), E("bn_fold_b", b, g, attr=s2), attr=s)),
        rw(E("batchnorm", conv2, g, attr=s2)).to(
            E("conv2d", x, E("bn_fold_w", w, g, attr=s2), E("bn_fold_b", g, attr=s2), attr=s)),
    ]
    fuse = [  # B
        rw(E("batchnorm", conv3, g, attr=s2)).to(E("conv_bn", x, w, E("bn_affine", b, g, attr=s2), attr=s)),
        rw(E("batchnorm", conv2, g, attr=s2)).to(E("conv_bn", x, w, E("bn_affine", g, attr=s2), attr=s)),
    ]
    bn = E("conv_bn", x, w, b, attr=s)
    for name, abn in _act_nodes(E, bn):  # the three-in-one
        fuse.append(rw(abn).to(E("conv_bn_act", x, w, b, attr=s + ";" + name)))
    epi = []
    for name, a3 in _act_nodes(E, conv3):  # C
        epi.append(rw(a3).to(E("conv_act", x, w, b, attr=s + ";" + name)))
    for name, a2 in _act_nodes(E, conv2):
        epi.append(rw(a2).to(E("conv_act", x, w, attr=s + ";" + name)))
    # residual adds: the weight and its scale/shift packed into one operand
    sources = [(conv3, E("conv_pack", w, b), s + ";none"), (conv2, E("conv_pack", w), s + ";none"),
               (E("conv_act", x, w, b, attr=s), E("conv_pack", w, b), s),
               (E("conv_act", x, w, attr=s), E("conv_pack", w), s),
               (bn, E("conv_pack", w, b), s + ";none"), (E("conv_bn_act", x, w, b, attr=s), E("conv_pack", w, b), s)]
    for src, packed, attr in sources:
        fused = E("conv_add", x, packed, y, attr=attr)
        epi += [rw(E("add", src, y)).to(fused), rw(E("add", y, src)).to(fused)]
    for name, a in _act_nodes(E, E("conv_add", x, w, y, attr=s)):
        epi.append(rw(a).to(E("conv_add_act", x, w, y, attr=s + ";" + name)))
    return {"fold": fold, "fuse": fuse, "epilogue": epi, "layout": _layout(E, v, rw) + _pointwise(E, v, rw)}


def group_rules(E, v):
    """Every group's rules in the rule set it belongs to (``RULESET_OF``): what the e-graph applies together."""
    out: dict[str, list] = {}
    for group, rules in rule_groups(E, v).items():
        out.setdefault(RULESET_OF[group], []).extend(rules)
    return out


def _nhwc(E, t):
    return E("transpose", t, attr=NCHW_TO_NHWC)


def _nchw(E, t):
    return E("transpose", t, attr=NHWC_TO_NCHW)


def _layout(E, v, rw=rewrite):
    """Each NCHW form as its NHWC twin between transposes; a transpose and its inverse cancel; elementwise ops
    and residual adds commute with the transpose, so a chain of convolutions stays in NHWC."""
    x, w, b, y, s = v.x, v.w, v.b, v.y, v.s
    rules = []
    for kind, forms in KINDS.items():
        if "packed" in forms:
            rules.append(rw(E(kind, x, w, y, attr=s)).to(
                _nchw(E, E(kind + "_nhwc", _nhwc(E, x), w, _nhwc(E, y), attr=s))))
            continue
        if "w" in forms:
            rules.append(rw(E(kind, x, w, attr=s)).to(_nchw(E, E(kind + "_nhwc", _nhwc(E, x), w, attr=s))))
        rules.append(rw(E(kind, x, w, b, attr=s)).to(_nchw(E, E(kind + "_nhwc", _nhwc(E, x), w, b, attr=s))))
    for p, q in ((NCHW_TO_NHWC, NHWC_TO_NCHW), (NHWC_TO_NCHW, NCHW_TO_NHWC)):
        rules.append(rewrite(E("transpose", E("transpose", x, attr=p), attr=q)).to(x))
    for name, op in activations().items():
        attr = name.partition(":")[2]
        rules.append(rw(E(op, _nchw(E, x), attr=attr)).to(_nchw(E, E(op, x, attr=attr))))
    rules.append(rw(E("add", _nchw(E, x), _nchw(E, y))).to(_nchw(E, E("add", x, y))))
    return rules


OPS = [_op(k, nhwc) for k in KINDS if k != "conv2d" for nhwc in (False, True)] + [_op("conv2d", True),
                                                                                 replace(PACK, rules=group_rules),
                                                                                 *POINTWISE_OPS]
