"""Flash-attention forward: ``softmax(Q K^T / sqrt(d)) V`` without materialising the scores.

One program takes BLOCK_M queries of one (batch, head) and streams the keys
and values in BLOCK_N blocks, keeping a running row maximum and sum (the
online softmax) and rescaling its fp32 output accumulator when the maximum
grows. Scores are scaled into base 2 once (``exp2``). With ``CAUSAL`` the
key loop stops at the query block's diagonal, so a causal pass does about
half the work. The probabilities are rounded to the input dtype before the
second product, as the tensor cores take them.
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

from .common import precision, widen


@triton.jit
def _attn(Q, K, V, O, S, sb, sh, ss, qk_scale, H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    start = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    base = (bh // H) * sb + (bh % H) * sh
    rm = start + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, D)
    q = tl.load(Q + base + rm[:, None] * ss + rd[None, :], mask=rm[:, None] < S, other=0.0)
    if WIDEN:
        q = q.to(tl.float32)
    m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, start + BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):
        keys = n0 + rn
        kt = tl.load(K + base + keys[None, :] * ss + rd[:, None], mask=keys[None, :] < S, other=0.0)
        v = tl.load(V + base + keys[:, None] * ss + rd[None, :], mask=keys[:, None] < S, other=0.0)
        if WIDEN:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        qk = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        ok = keys[None, :] < S
        if CAUSAL:
            ok = ok & (keys[None, :] <= rm[:, None])
        qk = tl.where(ok, qk, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(O + base + rm[:, None] * ss + rd[None, :], out.to(O.dtype.element_ty), mask=rm[:, None] < S)


def launcher(problem, knobs: dict, t: dict, out):
    """A no-argument call running attention ``problem`` with ``knobs`` (BLOCK_M, BLOCK_N, num_warps,
    num_stages) on ``t`` (``q``, ``k``, ``v``, contiguous [batch, heads, seq, head_dim])."""
    B, H, S, D = problem.dims
    q, k, v = t["q"], t["k"], t["v"]
    bm, bn = knobs["BLOCK_M"], knobs["BLOCK_N"]
    grid = (triton.cdiv(S, bm), B * H)
    scale = 1.4426950408889634 / math.sqrt(D)  # log2(e) / sqrt(d): scores in base 2
    prec, wide = precision(problem.dtype), widen(problem.dtype)

    def run():
        _attn[grid](q, k, v, out, S, q.stride(0), q.stride(1), q.stride(2), scale, H=H, D=D, BLOCK_M=bm,
                    BLOCK_N=bn, CAUSAL=problem.causal, PRECISION=prec, WIDEN=wide, num_warps=knobs["num_warps"],
                    num_stages=knobs["num_stages"])
    return run
