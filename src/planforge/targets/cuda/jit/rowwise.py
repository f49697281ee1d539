"""Row-wise templates: softmax, layernorm and RMSNorm over the last axis, one program per row.

When BLOCK covers the row (``BLOCK >= cols``) the row is read once into
registers and every statistic comes from there; otherwise the program walks
the row in BLOCK-wide chunks, once per statistic and once to write (the
chunks come back from L1/L2, not from HBM, for rows a few KiB long). All
arithmetic is fp32; the output is stored in the input's dtype.
"""
from __future__ import annotations

import triton
import triton.language as tl

KIND = {"softmax": 0, "layernorm": 1, "rmsnorm": 2}


@triton.jit
def _row(X, Y, G, Bt, cols, sx, sy, eps, KIND: tl.constexpr, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
    row = tl.program_id(0)
    x_row = X + row * sx
    y_row = Y + row * sy
    offs = tl.arange(0, BLOCK)
    if ONE_PASS:
        ok = offs < cols
        if KIND == 0:
            x = tl.load(x_row + offs, mask=ok, other=-float("inf")).to(tl.float32)
            e = tl.exp(x - tl.max(x, axis=0))
            y = e / tl.sum(e, axis=0)
        else:
            x = tl.load(x_row + offs, mask=ok, other=0.0).to(tl.float32)
            g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
            if KIND == 1:
                mean = tl.sum(x, axis=0) / cols
                d = tl.where(ok, x - mean, 0.0)
                y = d / tl.sqrt(tl.sum(d * d, axis=0) / cols + eps) * g
                y += tl.load(Bt + offs, mask=ok, other=0.0).to(tl.float32)
            else:
                y = x / tl.sqrt(tl.sum(x * x, axis=0) / cols + eps) * g
        tl.store(y_row + offs, y.to(Y.dtype.element_ty), mask=ok)
    else:
        if KIND == 0:
            # online softmax: a running max and a sum rescaled whenever the max grows
            m = tl.full((BLOCK,), -float("inf"), tl.float32)
            s = tl.zeros((BLOCK,), tl.float32)
            for c0 in range(0, cols, BLOCK):
                x = tl.load(x_row + c0 + offs, mask=c0 + offs < cols, other=-float("inf")).to(tl.float32)
                m_new = tl.maximum(m, x)
                s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
                s = tl.where(m_new == -float("inf"), 0.0, s)
                m = m_new
            mx = tl.max(m, axis=0)
            total = tl.sum(tl.where(m == -float("inf"), 0.0, s * tl.exp(m - mx)), axis=0)
            for c0 in range(0, cols, BLOCK):
                ok = c0 + offs < cols
                x = tl.load(x_row + c0 + offs, mask=ok, other=-float("inf")).to(tl.float32)
                tl.store(y_row + c0 + offs, (tl.exp(x - mx) / total).to(Y.dtype.element_ty), mask=ok)
        else:
            mean = 0.0
            if KIND == 1:
                acc = tl.zeros((BLOCK,), tl.float32)
                for c0 in range(0, cols, BLOCK):
                    acc += tl.load(x_row + c0 + offs, mask=c0 + offs < cols, other=0.0).to(tl.float32)
                mean = tl.sum(acc, axis=0) / cols
            sq = tl.zeros((BLOCK,), tl.float32)
            for c0 in range(0, cols, BLOCK):
                ok = c0 + offs < cols
                x = tl.load(x_row + c0 + offs, mask=ok, other=0.0).to(tl.float32)
                d = tl.where(ok, x - mean, 0.0)
                sq += d * d
            rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / cols + eps)
            for c0 in range(0, cols, BLOCK):
                ok = c0 + offs < cols
                x = tl.load(x_row + c0 + offs, mask=ok, other=0.0).to(tl.float32)
                y = (x - mean) * rstd * tl.load(G + c0 + offs, mask=ok, other=0.0).to(tl.float32)
                if KIND == 1:
                    y += tl.load(Bt + c0 + offs, mask=ok, other=0.0).to(tl.float32)
                tl.store(y_row + c0 + offs, y.to(Y.dtype.element_ty), mask=ok)


def launcher(problem, knobs: dict, t: dict, out):
    """A no-argument call running the row-wise ``problem`` with ``knobs`` (BLOCK, num_warps) on ``t``."""
    from ..problem import EPS

    rows, cols = problem.dims
    x = t["x"]
    g = t.get("gamma", x)
    b = t.get("beta", x)
    block = knobs["BLOCK"]
    kind = KIND[problem.op]

    def run():
        _row[(rows,)](x, out, g, b, cols, x.stride(0), out.stride(0), EPS, KIND=kind, BLOCK=block,
                      ONE_PASS=block >= cols, num_warps=knobs["num_warps"])
    return run
