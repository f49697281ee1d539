"""The batch-1 fused MLP: every layer of ``h = act(h @ W + b)`` in one launch of one program.

At batch 1 a small MLP is launch-bound: each layer is a GEMV of a few
hundred thousand FLOPs, far less than one launch costs. This template runs
the whole chain in one program (one SM): each layer reads its input vector,
walks its weights in BLOCK_K x BLOCK_N tiles with fp32 accumulation, applies
bias and activation and writes the result to an fp32 scratch vector that
stays in L1/L2; a barrier between layers makes the block's writes visible to
all its threads before the next layer reads them. Layer sizes, weight
offsets and activations come from a small int32 table, so one compiled
kernel serves every chain of the same depth.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import ACT_CODE


@triton.jit
def _act_rt(y, code):
    """Activation by a run-time code (ACT_CODE); all candidates are cheap at GEMV sizes."""
    g = y * tl.sigmoid(2.0 * 0.7978845608028654 * (y + 0.044715 * y * y * y))
    y = tl.where(code == 1, tl.maximum(y, 0.0), tl.where(code == 2, g, tl.where(
        code == 3, tl.sigmoid(y), tl.where(code == 4, y * tl.sigmoid(y), tl.where(
            code == 5, 2.0 * tl.sigmoid(2.0 * y) - 1.0, y)))))
    return y


@triton.jit
def _layer(src, dst, W, Bv, K, N, code, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rk = tl.arange(0, BLOCK_K)
    rn = tl.arange(0, BLOCK_N)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + rn
        acc = tl.zeros((BLOCK_N,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + rk
            x = tl.load(src + ks, mask=ks < K, other=0.0).to(tl.float32)
            w = tl.load(W + ks[:, None] * N + cols[None, :], mask=(ks[:, None] < K) & (cols[None, :] < N),
                        other=0.0).to(tl.float32)
            acc += tl.sum(x[:, None] * w, axis=0)
        acc += tl.load(Bv + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc = _act_rt(acc, code)
        tl.store(dst + cols, acc.to(dst.dtype.element_ty), mask=cols < N)


@triton.jit
def _mlp(X, Y, H, Wcat, Bcat, meta, NL: tl.constexpr, HMAX: tl.constexpr, BLOCK_N: tl.constexpr,
         BLOCK_K: tl.constexpr):
    # meta row l: K, N, weight offset, bias offset, activation code
    K = tl.load(meta + 0)
    N = tl.load(meta + 1)
    if NL == 1:
        _layer(X, Y, Wcat + tl.load(meta + 2), Bcat + tl.load(meta + 3), K, N, tl.load(meta + 4), BLOCK_N, BLOCK_K)
    else:
        _layer(X, H, Wcat + tl.load(meta + 2), Bcat + tl.load(meta + 3), K, N, tl.load(meta + 4), BLOCK_N, BLOCK_K)
        for l in range(1, NL - 1):
            tl.debug_barrier()
            row = meta + l * 5
            src = H + ((l - 1) % 2) * HMAX
            _layer(src, H + (l % 2) * HMAX, Wcat + tl.load(row + 2), Bcat + tl.load(row + 3), tl.load(row + 0),
                   tl.load(row + 1), tl.load(row + 4), BLOCK_N, BLOCK_K)
        tl.debug_barrier()
        row = meta + (NL - 1) * 5
        _layer(H + ((NL - 2) % 2) * HMAX, Y, Wcat + tl.load(row + 2), Bcat + tl.load(row + 3), tl.load(row + 0),
               tl.load(row + 1), tl.load(row + 4), BLOCK_N, BLOCK_K)


def launcher(problem, knobs: dict, t: dict, out):
    """A no-argument call running the fused MLP ``problem`` with ``knobs`` (BLOCK_N, BLOCK_K, num_warps).
    The weights are packed once, here, into one buffer (as a plan would hold them)."""
    import torch

    layers = problem.layers
    dev = out.device
    ws = [t[f"W{i}"].reshape(-1) for i in range(len(layers))]
    bs = [t[f"b{i}"].reshape(-1) for i in range(len(layers))]
    wcat, bcat = torch.cat(ws).contiguous(), torch.cat(bs).contiguous()
    rows, wo, bo = [], 0, 0
    for (k, n, a), w in zip(layers, ws):
        rows.append([k, n, wo, bo, ACT_CODE[a]])
        wo, bo = wo + k * n, bo + n
    meta = torch.tensor(rows, dtype=torch.int32, device=dev).reshape(-1)
    hmax = max(n for _, n, _ in layers)
    scratch = torch.empty(2 * hmax, dtype=torch.float32, device=dev)
    x = t["x"]

    def run():
        _mlp[(1,)](x, out, scratch, wcat, bcat, meta, NL=len(layers), HMAX=hmax, BLOCK_N=knobs["BLOCK_N"],
                   BLOCK_K=knobs["BLOCK_K"], num_warps=knobs["num_warps"])
    return run
