"""The knob spaces of the Triton templates, their restrictions, and the setting tried first.

Nothing here imports Triton: a space is plain data, built from the problem
and the GPU's ``GpuProfile`` (shared memory per block, registers, SM count),
so the funnel can plan for a GPU that is not in this machine.

The restrictions are what would make a launch fail or waste itself:
- shared memory: Triton's pipeline keeps ``num_stages`` copies of the A and B
  tiles (attention: of the K and V tiles, plus the Q tile), which must fit in
  the shared memory one block may use;
- registers: the fp32 accumulator tile, spread over the block's threads, may
  use at most half of the registers a thread can address (``ACC_SHARE``), the
  rest being the operands' and the addresses';
- blocks larger than the problem, and knobs that only matter where there is
  something to group, split or pipeline, are kept at their smallest value, so
  that two points of the space are never the same plan.
"""
from __future__ import annotations

from typing import Any

from ...space import Space, categorical, pow2
from .devices import GpuProfile
from .problem import CudaProblem

REGS_PER_THREAD = 255  # the most 32-bit registers one thread can address, on every NVIDIA GPU since sm_35
MAX_THREADS_PER_BLOCK = 1024
ACC_SHARE = 0.5  # share of a thread's registers the accumulator tile may take


def _pow2_upto(n: int, lo: int, hi: int) -> int:
    """The smallest power of two >= n, clamped to [lo, hi]."""
    p = lo
    while p < n and p < hi:
        p *= 2
    return p


def constants(p: CudaProblem, prof: GpuProfile) -> dict[str, Any]:
    acc_regs = int(REGS_PER_THREAD * ACC_SHARE) + 1  # 128: a power of two, so 128x128 on 4 warps just fits
    c = {"smem_block": prof.smem_per_block, "acc_regs": acc_regs, "sms": prof.sms, "eb": p.bytes_per_element,
         "max_warps": MAX_THREADS_PER_BLOCK // 32}
    if p.op == "gemm":
        c.update(m=p.dims[0], n=p.dims[1], k=p.dims[2])
    elif p.op == "attention":
        c.update(s=p.dims[2], d=p.dims[3])
    elif p.op == "mlp":
        c.update(nmax=max(n for _, n, _ in p.layers), kmax=max(k for k, _, _ in p.layers))
    else:
        c.update(rows=p.dims[0], cols=p.dims[1], n=p.dims[0] * p.dims[1])
    return c


def space(p: CudaProblem, prof: GpuProfile) -> Space:
    """The knob space of ``p``'s template on the GPU ``prof``."""
    c = constants(p, prof)
    warps = tuple(w for w in (1, 2, 4, 8, 16) if w <= c["max_warps"])
    if p.op == "gemm":
        return Space([
            pow2("BLOCK_M", 16, 256), pow2("BLOCK_N", 16, 256), pow2("BLOCK_K", 16, 128),
            categorical("GROUP_M", (1, 4, 8)), categorical("num_warps", (2, 4, 8)),
            categorical("num_stages", (1, 2, 3, 4, 5)), categorical("SPLIT_K", (1, 2, 4, 8, 16)),
        ], [
            "num_stages * (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) * eb <= smem_block",
            "BLOCK_M * BLOCK_N <= acc_regs * 32 * num_warps",
            "BLOCK_M < 2 * m or BLOCK_M == 16",
            "BLOCK_N < 2 * n or BLOCK_N == 16",
            "BLOCK_K < 2 * k or BLOCK_K == 16",
            # grouping reorders tile rows: only where there are several
            "GROUP_M == 1 or m > 2 * BLOCK_M",
            # pipelining needs at least two K steps per program
            "num_stages == 1 or k >= 2 * SPLIT_K * BLOCK_K",
            # split K only where the output tiles alone leave SMs idle, two K steps per slice at least
            "SPLIT_K == 1 or ((m + BLOCK_M - 1) // BLOCK_M) * ((n + BLOCK_N - 1) // BLOCK_N) < sms",
            "SPLIT_K == 1 or k >= 2 * SPLIT_K * BLOCK_K",
        ], constants=c)
    if p.op in ("softmax", "layernorm", "rmsnorm"):
        top = _pow2_upto(p.dims[1], 32, 65536)
        return Space([pow2("BLOCK", 32, top), categorical("num_warps", warps)], [
            "32 * num_warps <= BLOCK",
            # a one-pass row lives in registers: at most 64 fp32 values a thread
            "BLOCK <= 64 * 32 * num_warps",
        ], constants=c)
    if p.op == "eltwise":
        top = _pow2_upto(c["n"], 64, 16384)
        return Space([pow2("BLOCK", 64, top), categorical("num_warps", warps)], [
            "32 * num_warps <= BLOCK",
            "BLOCK <= 32 * 32 * num_warps",
        ], constants=c)
    if p.op == "mlp":
        return Space([pow2("BLOCK_N", 16, 256), pow2("BLOCK_K", 16, 256), categorical("num_warps", warps)], [
            "BLOCK_N * BLOCK_K <= 64 * 32 * num_warps",
            "BLOCK_N * BLOCK_K >= 32 * num_warps",
            "BLOCK_N < 2 * nmax or BLOCK_N == 16",
            "BLOCK_K < 2 * kmax or BLOCK_K == 16",
        ], constants=c)
    if p.op == "attention":
        return Space([
            pow2("BLOCK_M", 16, 256), pow2("BLOCK_N", 16, 256), categorical("num_warps", (2, 4, 8)),
            categorical("num_stages", (1, 2, 3, 4)),
        ], [
            "(2 * num_stages * BLOCK_N + BLOCK_M) * d * eb <= smem_block",
            "BLOCK_M * (d + BLOCK_N) <= acc_regs * 32 * num_warps",
            "BLOCK_M < 2 * s or BLOCK_M == 16",
            "BLOCK_N < 2 * s or BLOCK_N == 16",
            "num_stages == 1 or s >= 2 * BLOCK_N",
        ], constants=c)
    raise ValueError(f"no template for {p.op!r}")


# the settings a careful engineer tries first, in order of preference; the first valid one is the default
_PREFERRED: dict[str, list[dict[str, Any]]] = {
    "gemm": [
        {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "SPLIT_K": 1},
        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 4, "SPLIT_K": 1},
        {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3, "SPLIT_K": 1},
        {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4, "num_stages": 3, "SPLIT_K": 1},
    ],
    "attention": [
        {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    ],
    "mlp": [{"BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4}],
}


def defaults(p: CudaProblem, prof: GpuProfile) -> dict[str, Any]:
    """The preferred setting that is valid for ``p``, else the valid point nearest to the first
    preference (rowwise and eltwise: the smallest valid BLOCK covering a row, with 4 warps)."""
    sp = space(p, prof)
    for want in _PREFERRED.get(p.op, []):
        if not sp.violations(want):
            return dict(want)
    if p.op in ("softmax", "layernorm", "rmsnorm", "eltwise"):
        for c in sp.enumerate():
            d = c.as_dict()
            if d["BLOCK"] >= min(p.dims[-1], 4096) and d["num_warps"] >= min(4, d["BLOCK"] // 32):
                return d
    first = _PREFERRED.get(p.op, [{}])[0]
    best, score = None, None
    for c in sp.enumerate():
        d = c.as_dict()
        s = sum(abs(d[k] - v) / max(v, 1) for k, v in first.items() if k in d)
        if score is None or s < score:
            best, score = d, s
    if best is None:
        raise ValueError(f"the {p.op} template has no valid setting for {p.label} on {prof.name}")
    return best


__all__ = ["ACC_SHARE", "REGS_PER_THREAD", "constants", "defaults", "space"]
