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


OPS = [Op(
    "sdpa", 3, shape, reference,
    library={"sdpa": Library(_step, workspace=_workspace, passes=9)},
    egg_attr=lambda attrs: f"{'causal' if attrs.get('causal') else 'full'},{float(attrs['scale'])!r}",
    from_egg=lambda s: {"causal": s.split(",")[0] == "causal", "scale": float(s.split(",")[1])},
    flops=flops,
    templated=True,
    kernel=kernel,
    torch={"scaled_dot_product_attention": _torch},
    tolerance_terms=lambda s: s[1][-2] + s[0][-1],
    doc="scaled dot-product attention (causal, grouped-query)",
)]
