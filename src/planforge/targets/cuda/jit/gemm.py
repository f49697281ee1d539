"""The GEMM template: ``C = act(A @ B + bias) [+ R]``, fp32 accumulation, optional split-K.

One program computes a BLOCK_M x BLOCK_N tile of C, walking K in BLOCK_K
steps (``num_stages`` of them in flight, Triton's software pipeline). Tiles
are visited in groups of GROUP_M rows of tiles, so that consecutive programs
share B's columns in L2. With SPLIT_K > 1 the K range is cut in SPLIT_K
slices, each program writes its fp32 partial tile to a workspace and a
second kernel sums the slices and applies the epilogue: deterministic (no
atomics), at the price of one more launch and the workspace's traffic, which
pays where M x N alone gives too few tiles to fill the SMs.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import ACT_CODE, act, precision, widen


@triton.jit
def _gemm(A, B, C, bias, R, M, N, K, sam, sak, sbk, sbn, scm, scn, srm, srn, k_per_split,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
          SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
          PRECISION: tl.constexpr, WIDEN: tl.constexpr, EVEN_K: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # edge tiles mask rows and columns (Triton specialises M and N divisible by 16, so the masks stay
    # constant over a vector and the loads stay vectorised); wrapping the indices instead would let a
    # vector read past the end of B's last row
    mm = rm[:, None] < M
    nn = rn[None, :] < N
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + rk
        if EVEN_K:  # every K step whole: no K mask
            a = tl.load(A + rm[:, None] * sam + kk[None, :] * sak, mask=mm, other=0.0)
            b = tl.load(B + kk[:, None] * sbk + rn[None, :] * sbn, mask=nn, other=0.0)
        else:
            a = tl.load(A + rm[:, None] * sam + kk[None, :] * sak, mask=mm & (kk[None, :] < k_hi), other=0.0)
            b = tl.load(B + kk[:, None] * sbk + rn[None, :] * sbn, mask=(kk[:, None] < k_hi) & nn, other=0.0)
        if WIDEN:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT:
        # the partial sums of slice pid_k, in the fp32 workspace C[pid_k]
        tl.store(C + pid_k * M * N + rm[:, None] * N + rn[None, :], acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        acc = act(acc, ACT)
        if HAS_RES:
            acc += tl.load(R + rm[:, None] * srm + rn[None, :] * srn, mask=mask, other=0.0).to(tl.float32)
        tl.store(C + rm[:, None] * scm + rn[None, :] * scn, acc.to(C.dtype.element_ty), mask=mask)


@triton.jit
def _reduce(W, C, bias, R, M, N, scm, scn, srm, srn, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
            HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    m = offs // N
    n = offs % N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(W + s * M * N + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias + n, mask=ok, other=0.0).to(tl.float32)
    acc = act(acc, ACT)
    if HAS_RES:
        acc += tl.load(R + m * srm + n * srn, mask=ok, other=0.0).to(tl.float32)
    tl.store(C + m * scm + n * scn, acc.to(C.dtype.element_ty), mask=ok)


REDUCE_BLOCK = 1024


def launcher(problem, knobs: dict, t: dict, out):
    """A no-argument call running the GEMM of ``problem`` with ``knobs`` on the torch tensors ``t``
    (``A``, ``B``, optional ``bias``, ``R``) into ``out``."""
    import torch

    M, N, K = problem.dims
    A, B = t["A"], t["B"]
    bias, R = t.get("bias"), t.get("R")
    bm, bn, bk, gm = knobs["BLOCK_M"], knobs["BLOCK_N"], knobs["BLOCK_K"], knobs["GROUP_M"]
    split = knobs.get("SPLIT_K", 1)
    # every slice a whole number of BLOCK_K steps, so no slice reads another's K
    k_per = triton.cdiv(triton.cdiv(K, split), bk) * bk
    split = triton.cdiv(K, k_per)
    epi = problem.epilogue
    act_code = ACT_CODE[epi[len("bias_"):]] if epi.startswith("bias_") else 0
    has_bias, has_res = bias is not None, R is not None
    dummy = out  # never read: its flag is off
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), split)
    meta = dict(num_warps=knobs["num_warps"], num_stages=knobs["num_stages"])
    prec = precision(problem.dtype)
    wide = widen(problem.dtype)
    even = K % bk == 0 and k_per % bk == 0  # no partial K step in any slice
    if split == 1:
        def run():
            _gemm[grid](A, B, out, bias if has_bias else dummy, R if has_res else dummy, M, N, K,
                        A.stride(0), A.stride(1), B.stride(0), B.stride(1), out.stride(0), out.stride(1),
                        R.stride(0) if has_res else 0, R.stride(1) if has_res else 0, k_per,
                        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, SPLIT=False, HAS_BIAS=has_bias,
                        ACT=act_code, HAS_RES=has_res, PRECISION=prec, WIDEN=wide, EVEN_K=even, **meta)
        return run
    work = torch.empty((split, M, N), dtype=torch.float32, device=out.device)
    rgrid = (triton.cdiv(M * N, REDUCE_BLOCK),)

    def run_split():
        _gemm[grid](A, B, work, dummy, dummy, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1),
                    N, 1, 0, 0, k_per, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, SPLIT=True,
                    HAS_BIAS=False, ACT=0, HAS_RES=False, PRECISION=prec, WIDEN=wide, EVEN_K=even, **meta)
        _reduce[rgrid](work, out, bias if has_bias else dummy, R if has_res else dummy, M, N,
                       out.stride(0), out.stride(1), R.stride(0) if has_res else 0, R.stride(1) if has_res else 0,
                       SPLIT_K=split, BLOCK=REDUCE_BLOCK, HAS_BIAS=has_bias, ACT=act_code, HAS_RES=has_res,
                       num_warps=4)
    return run_split
