"""linear_add: ``x @ w + b + r``, a projection and the residual connection after it as one GEMM.

Every transformer block ends its attention and its MLP with ``h + proj(y)``: as a GEMM and an add, the add is a
step of its own that reads the GEMM's output back (1-4 us a block at GPT-2's width 256, in the whole call). The
``epilogue`` rules here make it one GEMM whose kernel copies ``r`` into its output block before the first K block
and accumulates onto it (the GEMM epilogue ``bias_add``, ``ops.kernel.RESIDUAL``). An e-node takes three
operands at most (``ops.egg.MAX_ARITY``), so the weight and the bias travel as one parameter, ``gemm_pack(w[, b])``:
``w`` [K, N] with the bias (zeros without one) as its row K, folded when the plan is loaded. The output has the
residual's shape; the GEMM's rows are ``x``'s leading axes (GPT-2's ``Conv1D`` reshapes its [32, N] output to
[1, 32, N] before the add: the rules look through that reshape).
"""
from __future__ import annotations

import math

import numpy as np
from egglog import rewrite

from .base import Library, Op, need
from .kernel import RESIDUAL, Problem


# -- gemm_pack: (w[, b]) as one [K + 1, N] parameter --------------------------------------------------------------

def pack_ref(a, attrs):
    w = np.asarray(a[0])
    b = np.asarray(a[1], w.dtype) if len(a) == 2 else np.zeros(w.shape[1], w.dtype)
    return np.concatenate([w, b[None, :]], axis=0)


def _pack_shape(s, attrs):
    w = s[0]
    need(len(w) == 2, f"gemm_pack packs a 2-D weight, got {w}")
    if len(s) == 2:
        need(tuple(s[1]) == (w[1],), f"bias {s[1]} does not match the weight's {w[1]} columns")
    return (w[0] + 1, w[1])


def _pack_step(ins, out, attrs):
    return lambda: np.copyto(out, pack_ref(ins, attrs))


# -- linear_add(x, gemm_pack(w, b), r) = (x @ w + b).reshape(r.shape) + r ----------------------------------------------

def _shape(s, attrs):
    x, wb, r = s
    need(len(x) >= 1 and len(wb) == 2 and wb[0] == x[-1] + 1,
         f"linear_add of {x} by a packed weight {wb}: expected [K + 1, N] with K = {x[-1] if x else '?'}")
    need(math.prod(x[:-1]) * wb[1] == math.prod(r),
         f"linear_add: the product of {x} by {wb} has {math.prod(x[:-1]) * wb[1]} elements, the residual {r} "
         f"{math.prod(r)}")
    return tuple(r)


def reference(a, attrs):
    x, wb, r = a
    K = wb.shape[0] - 1
    return (x.reshape(-1, K) @ wb[:K] + wb[K]).reshape(r.shape) + r


def _step(ins, out, attrs):
    x, wb, r = ins
    K = wb.shape[0] - 1
    a, w, b = x.reshape(-1, K), wb[:K], wb[K]
    o = out.reshape(a.shape[0], w.shape[1])
    rr = r.reshape(o.shape)

    def run():
        np.matmul(a, w, out=o)
        np.add(o, b, out=o)
        np.add(o, rr, out=o)

    return run


def kernel(s, out, attrs):
    """The GEMM ``[rows, K] @ [K, N] + bias + R`` (``bias_add``); None for one row (no GEMV template takes a
    residual: a batch-1 layer keeps its add)."""
    x, wb = s[0], s[1]
    rows, K, N = math.prod(x[:-1]), wb[0] - 1, wb[1]
    return Problem("gemm", (rows, N, K), RESIDUAL) if rows > 1 else None


def _rules(E, v):
    x, w, b, y, s = v.x, v.w, v.b, v.y, v.s
    out = []
    for src, packed in ((E("linear", x, w, b, attr="none"), E("gemm_pack", w, b)),
                        (E("matmul", x, w), E("gemm_pack", w))):
        fused = E("linear_add", x, packed, y)
        for t in (src, E("reshape", src, attr=s)):
            out += [rewrite(E("add", t, y)).to(fused), rewrite(E("add", y, t)).to(fused)]
    return {"epilogue": out}


OPS = [
    Op("gemm_pack", (1, 2), _pack_shape, pack_ref, library={"gemm_pack": Library(_pack_step)},
       flops=lambda s, out, attrs: 0.0, internal=True, doc="a GEMM weight with its bias as one more row"),
    Op("linear_add", 3, _shape, reference,
       library={"linear_add": Library(_step, passes=lambda at: 3)},
       rules=_rules,
       templated=True,
       kernel=kernel,
       flops=lambda s, out, attrs: 2.0 * math.prod(s[0][:-1]) * (s[1][0] - 1) * s[1][1] + 2.0 * math.prod(out),
       tolerance_terms=lambda s: s[0][-1] + 2,
       internal=True,
       doc="x @ w + b + r (a projection and its residual connection)"),
]
