"""sdpa: scaled dot-product attention ``softmax(q @ k^T * scale [+ causal mask]) @ v``, grouped-query too.

``q`` is ``[..., H, S, D]``, ``k`` and ``v`` are ``[..., Hk, T, D]`` and
``[..., Hk, T, Dv]`` with ``H`` a multiple of ``Hk`` (grouped-query
attention: query head ``h`` reads key/value head ``h // (H / Hk)``, as
torch's ``enable_gqa``). ``causal`` masks key ``t > s`` for query ``s``
(torch's top-left alignment). An explicit mask that is a known causal or
all-true pattern becomes that attribute; any other mask (a runtime padding
mask, an additive bias) is lowered to the ops it stands for: batched matmul,
scale, ``where``/``add``, softmax, matmul.
"""
from __future__ import annotations

import math

import numpy as np

from .base import Library, Op, need
from .kernel import Problem


def shape(s, attrs):
    q, k, v = s
    need(len(q) >= 2 and len(k) == len(q) and len(v) == len(q), f"sdpa operands {q}, {k}, {v} differ in rank")
    need(q[-1] == k[-1] and k[-2] == v[-2], f"sdpa shapes do not fit: q {q}, k {k}, v {v}")
    need(k[:-2] == v[:-2], f"sdpa: k {k} and v {v} differ in their leading axes")
    if len(q) >= 3:
        need(q[:-3] == k[:-3] and q[-3] % k[-3] == 0,
             f"sdpa: {q[-3]} query heads cannot share {k[-3]} key/value heads (q {q}, k {k})")
    else:
        need(q[:-2] == k[:-2], f"sdpa: q {q} and k {k} differ in their leading axes")
    return (*q[:-1], v[-1])


def _groups(q, k) -> int:
    return q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1


def _causal_bias(rows: int, S: int, T: int, dtype) -> np.ndarray:
    """0 where query row ``r`` (position ``r % S``) may see key ``t``, -inf where it may not."""
    s = np.arange(rows)[:, None] % S
    return np.where(np.arange(T)[None, :] <= s, 0.0, -np.inf).astype(dtype)


def reference(a, attrs):
    q, k, v = a
    G = _groups(q, k)
    lead, S, T = q.shape[:-3] if q.ndim >= 3 else q.shape[:-2], q.shape[-2], k.shape[-2]
    qg = q.reshape(*lead, k.shape[-3], G * S, q.shape[-1]) if q.ndim >= 3 else q
    sc = (qg @ np.swapaxes(k, -1, -2)) * float(attrs["scale"])
    if attrs.get("causal"):
        sc = sc + _causal_bias(sc.shape[-2], S, T, sc.dtype)
    sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
    out = (sc / sc.sum(axis=-1, keepdims=True)) @ v
    return out.reshape(*q.shape[:-1], v.shape[-1])


def _step(ins, out, attrs):
    q, k, v = ins
    G = _groups(q, k)
    S, T = q.shape[-2], k.shape[-2]
    lead = q.shape[:-3] if q.ndim >= 3 else q.shape[:-2]
    qg = q.reshape(*lead, k.shape[-3], G * S, q.shape[-1]) if q.ndim >= 3 else q
    og = out.reshape(*qg.shape[:-1], v.shape[-1])
    kt = np.swapaxes(k, -1, -2)
    sc = np.empty((*qg.shape[:-1], T), np.float32)
    red = np.empty((*qg.shape[:-1], 1), np.float32)
    bias = _causal_bias(qg.shape[-2], S, T, np.float32) if attrs.get("causal") else None
    scale = np.float32(attrs["scale"])

    def run():
        np.matmul(qg, kt, out=sc)
        np.multiply(sc, scale, out=sc)
        if bias is not None:
            np.add(sc, bias, out=sc)
        np.max(sc, axis=-1, keepdims=True, out=red)
        np.subtract(sc, red, out=sc)
        np.exp(sc, out=sc)
        np.sum(sc, axis=-1, keepdims=True, out=red)
        np.divide(sc, red, out=sc)
        np.matmul(sc, v, out=og)

    return run


def kernel(s, out, attrs) -> Problem | None:
    """The fused attention template's problem (``targets/cpu/templates/attention.py``): q [.., H, S, D] as
    [.., Hk, G * S, D], one kv head per ``BH``; None where it does not apply (rank 2)."""
    q, k, v = s
    if len(q) < 3 or q[-3] % k[-3]:
        return None
    return Problem("attention", (math.prod(k[:-2]), q[-3] // k[-3], q[-2], k[-2], q[-1], v[-1]),
                   f"{'causal' if attrs.get('causal') else 'full'}:{float(attrs['scale'])!r}")


def _workspace(s) -> int:
    q, k = s[0], s[1]
    return 4 * math.prod(q[:-1]) * k[-2]


def flops(s, out, attrs):
    q, k, v = s
    return 2.0 * math.prod(q[:-1]) * k[-2] * (q[-1] + v[-1]) + 5.0 * math.prod(q[:-1]) * k[-2]


# -- the importers --------------------------------------------------------------------------------------------------

def _mask_pattern(mask: np.ndarray, S: int, T: int) -> str | None:
    """``"none"`` (nothing masked), ``"causal"`` (a known lower-triangular mask), or None (anything else)."""
    try:
        full = np.broadcast_to(mask, (*mask.shape[:-2], S, T)).reshape(-1, S, T)
    except ValueError:
        return None
    if not np.all(full == full[:1]):
        return None
    m = full[0]
    keep = m if m.dtype == np.bool_ else (m == 0) if np.all((m == 0) | (m <= -1e30)) else None
    if keep is None:
        return None
    if np.all(keep):
        return "none"
    return "causal" if np.array_equal(keep, np.tril(np.ones((S, T), bool))) else None


def _repeat_heads(em, x, groups: int, name: str):
    """``x`` [..., Hk, T, D] with each head repeated ``groups`` times in place: [..., Hk * groups, T, D]."""
    if groups == 1:
        return x
    s = em.shape(x)
    one = em.reshape(x, (*s[:-2], 1, *s[-2:]), name + ".1")
    wide = em.broadcast(one, (*s[:-3], s[-3], groups, *s[-2:]), name + ".rep")
    return em.reshape(wide, (*s[:-3], s[-3] * groups, *s[-2:]), name)


def lower(em, q, k, v, mask, causal: bool, scale, name: str, bool_mask: bool = False):
    """Attention as the ``sdpa`` op where the mask allows it, else as the ops it is made of. ``mask``: None, a
    boolean mask (``bool_mask``: true keeps) or an additive one, broadcast to the scores."""
    from .softmax import lower as softmax

    sq, sk = em.shape(q), em.shape(k)
    S, T = sq[-2], sk[-2]
    scale = 1.0 / math.sqrt(sq[-1]) if scale is None else float(scale)
    if mask is not None and not isinstance(mask, str):
        bool_mask = np.asarray(mask.value).dtype == np.bool_
        pattern = _mask_pattern(np.asarray(mask.value), S, T)
        if pattern == "none" or (pattern == "causal" and (not causal or S == T)):
            mask, causal = None, causal or pattern == "causal"
    if mask is None:
        return em.node("sdpa", [q, k, v], name, causal=bool(causal), scale=scale)
    rank = len(sq)
    groups = sq[-3] // sk[-3] if rank >= 3 and sq[-3] % sk[-3] == 0 else 1
    k, v = _repeat_heads(em, k, groups, name + ".k"), _repeat_heads(em, v, groups, name + ".v")
    kt = em.transpose(k, (*range(rank - 2), rank - 1, rank - 2), name + ".kt")
    sc = em.scale(em.matmul(q, kt, name + ".qk"), scale, name + ".scaled")
    if causal:
        tri = em.const(np.tril(np.ones((S, T), np.float32)), name + ".causal")
        sc = em.node("where", [tri, sc, em.const(np.float32(-np.inf), name + ".ninf")], name + ".causal")
    if bool_mask:
        sc = em.node("where", [mask, sc, em.const(np.float32(-np.inf), name + ".ninf")], name + ".masked")
    else:
        sc = em.add(sc, mask, name + ".masked")
    return em.matmul(softmax(em, sc, -1, name + ".p"), v, name)


def _torch(em, node, a, kw):
    q, k, v = a[:3]
    mask = kw.get("attn_mask", a[3] if len(a) > 3 else None)
    dropout = float(kw.get("dropout_p", a[4] if len(a) > 4 else 0.0))
    causal = bool(kw.get("is_causal", a[5] if len(a) > 5 else False))
    if dropout != 0.0:
        raise em.unsupported(f"attention dropout p={dropout:g} (export the module in eval mode)")
    sq, sk = em.shape(q), em.shape(k)
    if len(sq) >= 3 and sq[-3] != sk[-3] and not kw.get("enable_gqa", False):
        raise em.unsupported(f"{sq[-3]} query heads and {sk[-3]} key heads without enable_gqa")
    arg = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
    val = getattr(arg, "meta", {}).get("val")
    is_bool = val is not None and str(val.dtype) == "torch.bool"
    return lower(em, q, k, v, mask, causal, kw.get("scale"), node.name, bool_mask=is_bool)


# -- sdpa_rep: sdpa of key/value heads repeated by reshape, expand, reshape (Hugging Face's ``repeat_kv``) --------
# The ``algebra`` rule below makes ``sdpa(q, R(k), R(v))``, ``R`` = reshape -> expand -> reshape, equal to the
# internal ``sdpa_rep(q, k, v)`` whose attribute records sdpa's and the six shapes (``|``-separated), so its
# semantics are the matched expression's for any shapes. Where ``R`` is the repetition of each kv head G times in
# place (``[.., Hk, T, D] -> [.., Hk, 1, T, D] -> [.., Hk, G, T, D] -> [.., Hk * G, T, D]``), which is what grouped-
# query attention reads anyway, the attention template runs it on the unrepeated k and v (no copies) and the
# library step runs sdpa's grouped form; otherwise the library step repeats as written.

REP = "|"


def _rep_parse(s: str) -> dict:
    from .base import ints

    parts = s.split(REP)
    if len(parts) != 7:
        raise ValueError(f"sdpa_rep attribute {s!r}: expected sdpa's attribute and six shapes, |-separated")
    at = OPS[0].from_egg(parts[0])
    at["shapes"] = tuple(ints(x) for x in parts[1:])
    return at


def _rep_unparse(attrs) -> str:
    return REP.join([OPS[0].egg_attr(attrs), *(",".join(map(str, x)) for x in attrs["shapes"])])


def _repeated(x, shapes):
    """(x's shape, or x) after reshape, expand, reshape by ``shapes``."""
    from .registry import REGISTRY

    r1, e, r2 = shapes
    if isinstance(x, np.ndarray):
        return np.broadcast_to(x.reshape(r1), e).reshape(r2)
    a = REGISTRY["reshape"].shape([x], {"shape": r1})
    b = REGISTRY["expand"].shape([a], {"shape": e})
    return REGISTRY["reshape"].shape([b], {"shape": r2})


def _rep_shape(s, attrs):
    sh = attrs["shapes"]
    return shape([s[0], _repeated(s[1], sh[:3]), _repeated(s[2], sh[3:])], attrs)


def _rep_reference(a, attrs):
    sh = attrs["shapes"]
    return reference([a[0], _repeated(a[1], sh[:3]), _repeated(a[2], sh[3:])], attrs)


def kv_groups(q, k, v, shapes) -> int | None:
    """G where both repetitions are ``repeat_kv`` by G and q has Hk * G heads; else None."""
    if len(k) < 3 or len(v) != len(k) or len(q) != len(k):
        return None
    g = None
    for x, (r1, e, r2) in ((k, shapes[:3]), (v, shapes[3:])):
        lead, hk, tail = tuple(x[:-3]), x[-3], tuple(x[-2:])
        if len(e) != len(x) + 1:
            return None
        gx = e[-3]
        if (tuple(r1), tuple(e), tuple(r2)) != ((*lead, hk, 1, *tail), (*lead, hk, gx, *tail), (*lead, hk * gx, *tail)):
            return None
        if g not in (None, gx):
            return None
        g = gx
    return g if g is not None and q[-3] == k[-3] * g and tuple(q[:-3]) == tuple(k[:-3]) else None


def _rep_kernel(s, out, attrs):
    q, k, v = s
    if kv_groups(q, k, v, attrs["shapes"]) is None:
        return None
    return kernel(s, out, attrs)


def _rep_step(ins, out, attrs):
    q, k, v = ins
    sh = attrs["shapes"]
    if kv_groups(q.shape, k.shape, v.shape, sh) is not None:
        return _step(ins, out, attrs)                  # sdpa's grouped form reads each kv head for its G queries
    kb, vb = np.empty(sh[2], np.float32), np.empty(sh[5], np.float32)
    inner = _step([q, kb, vb], out, attrs)

    def run():
        np.copyto(kb.reshape(sh[1]), np.broadcast_to(k.reshape(sh[0]), sh[1]))
        np.copyto(vb.reshape(sh[4]), np.broadcast_to(v.reshape(sh[3]), sh[4]))
        inner()

    return run


def _rep_rules(E, v):
    from egglog import String, join, rewrite, var

    q, k, vv = v.x, v.y, v.w
    r = [var(f"kv_{i}", String) for i in range(7)]

    def rep(x, a, b, c):
        return E("reshape", E("expand", E("reshape", x, attr=a), attr=b), attr=c)

    parts = [r[0]]
    for x in r[1:]:
        parts += [REP, x]
    return {"algebra": [rewrite(E("sdpa", q, rep(k, *r[1:4]), rep(vv, *r[4:7]), attr=r[0])).to(
        E("sdpa_rep", q, k, vv, attr=join(*parts)))]}


# -- sdpa_tok, sdpa_qkv: the attention read and written token-major, and read from a packed QKV value -----------
# Models project q, k and v token-major ([B, S, H * D], seen as [B, S, H, D]) and transpose the heads out for the
# attention and back after it: GPT-2 also splits one fused projection [B, S, 3 H D] into three. As imported, one
# layer runs three slices, four head transposes and the attention (seven copies of a few microseconds in GPT-2's
# 0.56 ms whole call). The ``layout`` rules make ``sdpa(T(q), T(k), T(v))`` (T: the head transpose, perm 0,2,1,3)
# equal to ``T(sdpa_tok(q, k, v))``, whose output is token-major too, so that the transpose after the attention
# cancels (``transpose``'s involution rule); and ``sdpa_tok`` of three reshaped slices of one value ``X`` equal to
# ``sdpa_qkv(X)``, whose attribute records sdpa's and the six slice and reshape attributes (``|``-separated): its
# semantics are the matched expression's for any shapes, and where the slices are column windows of X's last axis
# and the reshapes split them into heads, the attention template reads q, k and v in place
# (``AttentionLayout``); otherwise its library step computes what it matched.

HEADS = "0,2,1,3"  # the head transpose [B, S, H, D] <-> [B, H, S, D]


def _swap(s):
    return (s[0], s[2], s[1], *s[3:])


def _tok_shape(s, attrs):
    need(all(len(x) == 4 for x in s), f"token-major attention takes rank-4 operands, got {s}")
    return _swap(shape([_swap(x) for x in s], attrs))


def _tok_reference(a, attrs):
    return np.swapaxes(reference([np.swapaxes(x, 1, 2) for x in a], attrs), 1, 2)


def _tok_step(ins, out, attrs):
    """sdpa's step on head-major copies of the operands, its result transposed into ``out``."""
    bufs = [np.empty(_swap(x.shape), np.float32) for x in ins]
    o = np.empty(_swap(out.shape), np.float32)
    inner = _step(bufs, o, attrs)

    def run():
        for b, x in zip(bufs, ins):
            np.copyto(b, np.swapaxes(x, 1, 2))
        inner()
        np.copyto(out, np.swapaxes(o, 1, 2))

    return run


def _tok_kernel(s, out, attrs):
    from .kernel import AttentionLayout

    q, k, v = s
    if len(q) != 4 or q[2] % k[2]:
        return None
    hk = k[2]
    lay = AttentionLayout(bool(attrs.get("causal")), float(attrs["scale"]), "tokens", hk)
    return Problem("attention", (q[0] * hk, q[2] // hk, q[1], k[1], q[3], v[3]), lay.epilogue())


def _tok_flops(s, out, attrs):
    return flops([_swap(x) for x in s], out, attrs)


def _tok_workspace(s) -> int:
    return _workspace([_swap(x) for x in s]) + 4 * sum(math.prod(x) for x in s) + 4 * math.prod(s[0][:3]) * s[2][3]


def _qkv_parse(s: str) -> dict:
    from .registry import REGISTRY

    parts = s.split(REP)
    if len(parts) != 7:
        raise ValueError(f"sdpa_qkv attribute {s!r}: expected sdpa's attribute, three slices and three shapes, "
                         f"|-separated")
    at = _from_egg(parts[0])
    at["slices"] = tuple(REGISTRY["slice"].from_egg(x) for x in parts[1:4])
    at["shapes"] = tuple(REGISTRY["reshape"].from_egg(x)["shape"] for x in parts[4:])
    return at


def _qkv_unparse(attrs) -> str:
    from .registry import REGISTRY

    return REP.join([_egg_attr(attrs), *(REGISTRY["slice"].egg_attr(sl) for sl in attrs["slices"]),
                     *(",".join(map(str, x)) for x in attrs["shapes"])])


def _qkv_parts(x, attrs):
    """q, k, v (their shapes, or arrays) as the matched slices and reshapes make them of ``x``."""
    from .registry import REGISTRY

    sl, rs = REGISTRY["slice"], REGISTRY["reshape"]
    if isinstance(x, np.ndarray):
        return [sl.reference([x], a).reshape(r) for a, r in zip(attrs["slices"], attrs["shapes"])]
    return [rs.shape([sl.shape([x], a)], {"shape": r}) for a, r in zip(attrs["slices"], attrs["shapes"])]


def _qkv_shape(s, attrs):
    return _tok_shape(_qkv_parts(s[0], attrs), attrs)


def _qkv_reference(a, attrs):
    return _tok_reference(_qkv_parts(a[0], attrs), attrs)


def _qkv_step(ins, out, attrs):
    views = _qkv_parts(ins[0], attrs)  # views of the input's buffer where numpy can (a step-1 slice), else copies
    if not all(np.shares_memory(v, ins[0]) for v in views):
        return lambda: np.copyto(out, _qkv_reference(ins, attrs))
    return _tok_step(views, out, attrs)


def packed_layout(x, attrs):
    """The ``AttentionLayout`` of ``sdpa_qkv`` on an ``x`` of shape [B, S, W] where its slices are step-1 windows of
    the last axis and its reshapes split each into heads [B, S, heads, width]; None otherwise."""
    from .kernel import AttentionLayout

    if len(x) != 3:
        return None
    offsets, heads = [], []
    for sl, r in zip(attrs["slices"], attrs["shapes"]):
        if sl["axis"] % 3 != 2 or sl.get("step", 1) != 1 or not 0 <= sl["start"] < sl["stop"] <= x[2]:
            return None
        if len(r) != 4 or tuple(r[:2]) != tuple(x[:2]) or r[2] * r[3] != sl["stop"] - sl["start"]:
            return None
        offsets.append(sl["start"])
        heads.append((r[2], r[3]))
    (h, d), (hk, dk), (hv, _) = heads
    if dk != d or hv != hk or h % hk:
        return None
    return AttentionLayout(bool(attrs.get("causal")), float(attrs["scale"]), "packed", hk, x[2], tuple(offsets))


def _qkv_kernel(s, out, attrs):
    lay = packed_layout(s[0], attrs)
    if lay is None:
        return None
    q, k, v = _qkv_parts(s[0], attrs)
    return Problem("attention", (q[0] * lay.hk, q[2] // lay.hk, q[1], k[1], q[3], v[3]), lay.epilogue())


def _qkv_flops(s, out, attrs):
    return _tok_flops(_qkv_parts(s[0], attrs), out, attrs)


def _layout_rules(E, v):
    from egglog import String, join, rewrite, var

    x = v.x
    a = [var(f"qkv_{i}", String) for i in range(7)]

    def T(t):
        return E("transpose", t, attr=HEADS)

    def part(i):
        return E("reshape", E("slice", x, attr=a[1 + i]), attr=a[4 + i])

    attr = [a[0]]
    for s in a[1:]:
        attr += [REP, s]
    return {"layout": [
        rewrite(E("sdpa", T(v.x), T(v.y), T(v.w), attr=a[0])).to(T(E("sdpa_tok", v.x, v.y, v.w, attr=a[0]))),
        rewrite(E("sdpa_tok", part(0), part(1), part(2), attr=a[0])).to(E("sdpa_qkv", x, attr=join(*attr))),
    ]}


def _egg_attr(attrs) -> str:
    return f"{'causal' if attrs.get('causal') else 'full'},{float(attrs['scale'])!r}"


def _from_egg(s: str) -> dict:
    return {"causal": s.split(",")[0] == "causal", "scale": float(s.split(",")[1])}


OPS = [Op(
    "sdpa", 3, shape, reference,
    library={"sdpa": Library(_step, workspace=_workspace, passes=9)},
    egg_attr=_egg_attr,
    from_egg=_from_egg,
    flops=flops,
    templated=True,
    kernel=kernel,
    torch={"scaled_dot_product_attention": _torch},
    tolerance_terms=lambda s: s[1][-2] + s[0][-1],
    doc="scaled dot-product attention (causal, grouped-query)",
    rules=_layout_rules,
), Op(
    "sdpa_rep", 3, _rep_shape, _rep_reference,
    library={"sdpa_rep": Library(_rep_step, workspace=_workspace, passes=9)},
    egg_attr=_rep_unparse, from_egg=_rep_parse, rules=_rep_rules,
    flops=lambda s, out, attrs: flops([s[0], _repeated(s[1], attrs["shapes"][:3]), s[2]], out, attrs),
    templated=True, kernel=_rep_kernel,
    tolerance_terms=lambda s: s[1][-2] + s[0][-1],
    internal=True,
    doc="sdpa of key/value heads repeated by reshape, expand, reshape (repeat_kv folded into the attention)",
), Op(
    "sdpa_tok", 3, _tok_shape, _tok_reference,
    library={"sdpa_tok": Library(_tok_step, workspace=_tok_workspace, passes=13)},
    egg_attr=_egg_attr, from_egg=_from_egg,
    flops=_tok_flops, templated=True, kernel=_tok_kernel,
    tolerance_terms=lambda s: s[1][1] + s[0][-1],
    internal=True,
    doc="sdpa of token-major q, k, v [B, S, H, D], its output token-major (the head transposes folded in)",
), Op(
    "sdpa_qkv", 1, _qkv_shape, _qkv_reference,
    library={"sdpa_qkv": Library(_qkv_step, workspace=lambda s: _tok_workspace([(*s[0][:2], 1, s[0][2])] * 3),
                                 passes=13)},
    egg_attr=_qkv_unparse, from_egg=_qkv_parse,
    flops=_qkv_flops, templated=True, kernel=_qkv_kernel,
    tolerance_terms=lambda s: s[0][1] + s[0][-1],
    internal=True,
    doc="sdpa_tok of q, k, v sliced from one packed value (a fused QKV projection's) and split into heads",
)]
