"""Projection fusion: several products of one input by different weights computed as one wider GEMM.

Attention's Q, K and V projections, and a gated MLP's gate and up
projections, multiply the same activation ``x`` by two or three weights.
The ``algebra`` rules here make ``x @ w1`` equal to the first columns of
``x @ concat(w1, w2)`` (``take_cols``) and ``x @ w2`` equal to the rest
(``drop_cols``); a third weight joins a fused pair the same way, and
``linear`` (bias and activation fused) is fused with the biases
concatenated too. The concatenated weights and biases are constants, folded
once when the plan is loaded; at run time there is one GEMM and a copy per
projection. The two slicing ops take a row of the leading weight as their
second operand only for its width (the e-graph has no shapes), so their
shape rules read it from there.
"""
from __future__ import annotations

from egglog import String, eq, ne, rule, union, var, vars_

from .base import Library, Op, need
from .egg import T


def _width(s) -> int:
    need(len(s[1]) >= 1 and len(s[0]) >= 1, f"column slice of {s[0]} by a weight of shape {s[1]}")
    return s[1][-1]


def _take_shape(s, attrs):
    n = _width(s)
    need(n <= s[0][-1], f"take_cols: {n} columns of a value {s[0][-1]} wide")
    return (*s[0][:-1], n)


def _drop_shape(s, attrs):
    n = _width(s)
    need(n < s[0][-1], f"drop_cols: dropping {n} columns of a value {s[0][-1]} wide leaves nothing")
    return (*s[0][:-1], s[0][-1] - n)


def _take_step(ins, out, attrs):
    view = ins[0][..., :ins[1].shape[-1]]
    return lambda: out.__setitem__(Ellipsis, view)


def _drop_step(ins, out, attrs):
    view = ins[0][..., ins[1].shape[-1]:]
    return lambda: out.__setitem__(Ellipsis, view)


def _rules(E, v):
    a, c = vars_("fp_a fp_c", T)
    x = v.x
    n1, n2, n3, m1, m2, m3 = (var(f"fp_{k}", String) for k in ("n1", "n2", "n3", "m1", "m2", "m3"))
    s = v.s
    P = T.param

    def cat(p, q):
        return E("concat", p, q, attr="-1")

    def mm(w):
        return E("matmul", x, w)

    def lin(w, b):
        return E("linear", x, w, b, attr=s)

    def fuse(first, second, lead, whole):
        """``first`` is the leading columns of ``whole``, ``second`` the rest; ``lead`` is the leading weight,
        whose first row (a constant folded at load time) tells the slices their width."""
        row = E("slice", lead, attr="0,0,1,1")
        return (union(first).with_(E("take_cols", whole, row)), union(second).with_(E("drop_cols", whole, row)))

    pair_mm = rule(eq(a).to(E("matmul", x, P(n1))), eq(c).to(E("matmul", x, P(n2))), ne(n1).to(n2)).then(
        *fuse(a, c, P(n1), mm(cat(P(n1), P(n2)))))
    three_mm = rule(eq(a).to(E("matmul", x, cat(P(n1), P(n2)))), eq(c).to(E("matmul", x, P(n3))),
                    ne(n3).to(n1), ne(n3).to(n2)).then(
        *fuse(a, c, cat(P(n1), P(n2)), mm(cat(cat(P(n1), P(n2)), P(n3)))))
    pair_lin = rule(eq(a).to(lin(P(n1), P(m1))), eq(c).to(lin(P(n2), P(m2))), ne(n1).to(n2)).then(
        *fuse(a, c, P(n1), lin(cat(P(n1), P(n2)), cat(P(m1), P(m2)))))
    three_lin = rule(eq(a).to(lin(cat(P(n1), P(n2)), cat(P(m1), P(m2)))), eq(c).to(lin(P(n3), P(m3))),
                     ne(n3).to(n1), ne(n3).to(n2)).then(
        *fuse(a, c, cat(P(n1), P(n2)), lin(cat(cat(P(n1), P(n2)), P(n3)), cat(cat(P(m1), P(m2)), P(m3)))))
    return {"algebra": [pair_mm, three_mm, pair_lin, three_lin]}


_COPY = dict(flops=lambda s, out, attrs: 0.0, internal=True)

OPS = [
    Op("take_cols", 2, _take_shape, reference=lambda a, attrs: a[0][..., :a[1].shape[-1]],
       library={"take_cols": Library(_take_step)}, rules=_rules,
       doc="the leading columns of a fused projection (as many as the second operand's width)", **_COPY),
    Op("drop_cols", 2, _drop_shape, reference=lambda a, attrs: a[0][..., a[1].shape[-1]:],
       library={"drop_cols": Library(_drop_step)},
       doc="the columns of a fused projection after the second operand's width", **_COPY),
]
