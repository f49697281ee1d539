"""rope / rope_heads: rotary position embedding ``x * cos + rotate_half(x) * sin`` as one op.

The importers see Hugging Face's rotary embedding as the ops it is written
with: two slices of ``x`` along its last axis, a negation (``scale`` by -1) of
one, their ``concat``, two products with the cos and sin tables and a sum;
between native kernels these were seven library steps per rotated tensor.
The ``algebra`` rule here makes that whole expression equal to one internal
``rope`` e-node whose attribute records what was matched (the first slice,
the factor, the second slice, the concat axis; ``;``-separated), so the op's
semantics are exactly the expression's for any slices, factor and axis: its
reference and library step compute it as written. Only the case that *is*
rotary embedding (the halves of the last axis swapped, the first negated,
tables of ``S x D`` broadcast over the leading axes) has a compiled kernel
(``Problem("rope", (B, H, S, D), "bhsd")``, ``templates/attention.py``);
anything else runs the library step.

``rope_heads`` is ``rope`` of ``transpose(y, (0, 2, 1, 3))``: the projection's
``[B, S, H, D]`` rows read in place and written as ``[B, H, S, D]`` heads, so
the head transpose before the rotation is no copy of its own (``"bshd"``).
"""
from __future__ import annotations

import math

import numpy as np
from egglog import String, join, rewrite, var

from .base import Library, Op, ShapeError, ints, need

SPLIT = ";"


def _parse(s: str) -> dict:
    parts = s.split(SPLIT)
    if len(parts) != 4:
        raise ShapeError(f"rope attribute {s!r}: expected slice;factor;slice;axis")
    try:
        hi, lo, ax = ints(parts[0]), ints(parts[2]), int(parts[3])
        factor = float(parts[1])
    except ValueError:
        raise ShapeError(f"rope attribute {s!r}: expected slice;factor;slice;axis") from None
    if len(hi) != 4 or len(lo) != 4:
        raise ShapeError(f"rope attribute {s!r}: each slice is axis,start,stop,step")
    return {"first": tuple(hi), "factor": factor, "second": tuple(lo), "axis": ax}


def _unparse(attrs) -> str:
    return SPLIT.join((",".join(map(str, attrs["first"])), repr(float(attrs["factor"])),
                       ",".join(map(str, attrs["second"])), str(int(attrs["axis"]))))


def _slice_attrs(t) -> dict:
    return dict(zip(("axis", "start", "stop", "step"), t))


def _rotated_shape(x, attrs):
    from .registry import REGISTRY

    a = REGISTRY["slice"].shape([x], _slice_attrs(attrs["first"]))
    b = REGISTRY["slice"].shape([x], _slice_attrs(attrs["second"]))
    return REGISTRY["concat"].shape([a, b], {"axis": attrs["axis"]})


def _broadcast(*shapes):
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ShapeError(f"rope operands {', '.join(map(str, shapes))} do not broadcast") from None


def shape(s, attrs):
    x, c, sn = s
    return _broadcast(x, c, _rotated_shape(x, attrs), sn)


def reference(a, attrs):
    from .registry import REGISTRY

    x, c, sn = a
    first = REGISTRY["slice"].reference([x], _slice_attrs(attrs["first"])) * attrs["factor"]
    second = REGISTRY["slice"].reference([x], _slice_attrs(attrs["second"]))
    rot = REGISTRY["concat"].reference([first, second], {"axis": attrs["axis"]})
    return x * c + rot * sn


def _step(ins, out, attrs):
    x, c, sn = ins
    rank = x.ndim
    f = np.float32(attrs["factor"])

    def index(t):
        ax, start, stop, step = t
        return (slice(None),) * (ax % rank) + (slice(start, stop, step),)

    i1, i2 = index(attrs["first"]), index(attrs["second"])
    ax = attrs["axis"] % rank
    rot = np.empty(_rotated_shape(x.shape, attrs), np.float32)
    n1 = x[i1].shape[ax]
    tmp = np.empty(out.shape, np.float32)

    def run():
        np.multiply(x[i1], f, out=rot[(slice(None),) * ax + (slice(0, n1),)])
        rot[(slice(None),) * ax + (slice(n1, None),)] = x[i2]
        np.multiply(x, c, out=out)
        np.multiply(rot, sn, out=tmp)
        np.add(out, tmp, out=out)

    return run


def half_rotation(x, c, sn, attrs) -> bool:
    """Whether ``rope`` on these shapes is rotary embedding proper: the last axis's halves swapped with the
    first negated, and cos/sin one ``[S, D]`` table each, broadcast over the leading axes."""
    if len(x) < 2 or x[-1] % 2:
        return False
    r, D = len(x), x[-1]
    h = D // 2
    last = {r - 1, -1}
    a1, s1, e1, st1 = attrs["first"]
    a2, s2, e2, st2 = attrs["second"]
    if not (a1 in last and a2 in last and attrs["axis"] in last and attrs["factor"] == -1.0):
        return False
    if (s1, e1, st1, s2, e2, st2) != (h, D, 1, 0, h, 1):
        return False
    table = tuple(x[-2:])
    return all(tuple(t[-2:]) == table and math.prod(t) == math.prod(table) for t in (c, sn))


def kernel(s, out, attrs):
    from .kernel import Problem

    x, c, sn = s
    if len(x) != 4 or tuple(out) != tuple(x) or not half_rotation(x, c, sn, attrs):
        return None
    return Problem("rope", tuple(x), "bhsd")


# -- rope_heads: the rotation of transpose(y, (0, 2, 1, 3)) ----------------------------------------------------------

def _heads(y):
    need(len(y) == 4, f"rope_heads takes a [B, S, H, D] value, got {tuple(y)}")
    return (y[0], y[2], y[1], y[3])


def heads_shape(s, attrs):
    return shape([_heads(s[0]), s[1], s[2]], attrs)


def heads_reference(a, attrs):
    return reference([np.transpose(a[0], (0, 2, 1, 3)), a[1], a[2]], attrs)


def _heads_step(ins, out, attrs):
    y = ins[0]
    x = np.empty(_heads(y.shape), np.float32)
    inner = _step([x, ins[1], ins[2]], out, attrs)

    def run():
        np.copyto(x, np.transpose(y, (0, 2, 1, 3)))
        inner()

    return run


def heads_kernel(s, out, attrs):
    from .kernel import Problem

    x = _heads(s[0])
    if tuple(out) != x or not half_rotation(x, s[1], s[2], attrs):
        return None
    return Problem("rope", x, "bshd")


def _flops(s, out, attrs):
    return 3.0 * math.prod(out)


def _rules(E, v):
    x, c, sn, y = v.x, v.w, v.b, v.y
    s1, s2 = v.s, v.s2
    f, ax, a = var("rope_f", String), var("rope_ax", String), var("rope_a", String)
    rot = E("concat", E("scale", E("slice", x, attr=s1), attr=f), E("slice", x, attr=s2), attr=ax)
    rope = E("rope", x, c, sn, attr=join(s1, SPLIT, f, SPLIT, s2, SPLIT, ax))
    return {"algebra": [
        rewrite(E("add", E("multiply", x, c), E("multiply", rot, sn))).to(rope),
        rewrite(E("add", E("multiply", rot, sn), E("multiply", x, c))).to(rope),
        rewrite(E("rope", E("transpose", y, attr="0,2,1,3"), c, sn, attr=a)).to(E("rope_heads", y, c, sn, attr=a)),
    ]}


OPS = [
    Op("rope", 3, shape, reference,
       library={"rope": Library(_step, passes=5)},
       egg_attr=_unparse, from_egg=_parse, rules=_rules,
       templated=True, kernel=kernel, flops=_flops, internal=True,
       doc="x * cos + concat(factor * x[first], x[second]) * sin (rotary embedding, matched from its ops)"),
    Op("rope_heads", 3, heads_shape, heads_reference,
       library={"rope_heads": Library(_heads_step, passes=6)},
       egg_attr=_unparse, from_egg=_parse,
       templated=True, kernel=heads_kernel, flops=_flops, internal=True,
       doc="rope of transpose(y, (0, 2, 1, 3)): [B, S, H, D] rows rotated into [B, H, S, D] heads"),
]
