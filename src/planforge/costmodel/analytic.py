"""Analytic cost model: roofline bounds, on-chip capacity and launch latency, from a target's ceilings.

For each candidate of a CPU template the model counts the FLOPs, the bytes it
moves at each memory level given its tiling (a reuse model per template), and
from the measured ceilings its target hands it (``Target.ceilings()``, a
``Ceilings``: peak FLOP/s per vector width and thread count, bandwidth per
level, call overhead, fork-join cost) derives:

- ``bound_s``: a lower bound no run of the plan can beat: the slowest thread's
  FLOPs at the peak of its vector width, or the bytes that cannot come from a
  faster level at that level's bandwidth, whichever is larger, plus the thread
  launch (fork and join) of a parallel plan. It uses only what the plan must
  do, never a guess of what it will waste, so it stays below what is measured.
- ``predicted_s``: a latency estimate: the same roofline with the losses the
  model knows about (scalar edge tiles, too few FMA chains to hide latency,
  load imbalance between threads, re-streamed tiles and wasted cache lines).
- ``fits``: the working-set capacity checks (register tile, micro-panels in
  L1, blocks in L2 and L3); ``reason`` says which one a point fails.

Everything is computed on numpy columns (one array per knob), so the funnel
scores a space of hundreds of thousands of points at once; ``predict`` and
``lower_bound`` take candidates, as every ``CostModel`` does.

Assumptions (not device ceilings, and named here so they can be checked):
``LINE_BYTES`` (a cache line), ``PAGE_BYTES`` (past this stride a stream
defeats the hardware prefetchers), ``FMA_CHAINS`` (independent accumulators
needed to keep the FMA pipes busy: latency 4 x 2 pipes on current x86 and Arm
cores; the probe's own peak kernel uses 12-16) and ``OVERLAP_LOSS`` (the share
of the non-limiting roofline terms that shows in the prediction, since compute
and memory traffic never overlap perfectly). The bound uses none of them.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..ops.kernel import RESIDUAL
from ..quant import bytes_per_weight
from ..space import Candidate, Space
from ..targets.cpu.templates import winograd
from ..targets.target import LEVELS, Ceilings, Target
from .columns import columns

LINE_BYTES = 64
PAGE_BYTES = 4096
FMA_CHAINS = 8
CONV_TILE_ACC = 24
OVERLAP_LOSS = 0.25
F32 = 4


@dataclass
class Estimate:
    """Per-point results, all arrays of one length.

    flops: FLOPs the plan executes (padding included); useful_flops: the
    problem's; bytes: per level, the bytes the reuse model moves there;
    compute_s / memory_s: per-term times of the prediction; bound_s, predicted_s
    (seconds); fits (bool) and reason (str, "" when it fits); limiter: the
    level name or "compute" that sets the prediction."""

    flops: np.ndarray
    useful_flops: np.ndarray
    bytes: dict[str, np.ndarray]
    compute_s: np.ndarray
    memory_s: dict[str, np.ndarray]
    overhead_s: np.ndarray
    bound_s: np.ndarray
    predicted_s: np.ndarray
    fits: np.ndarray
    reason: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def intensity(self) -> np.ndarray:
        """FLOPs per byte moved from the slowest level any bytes come from."""
        moved = np.zeros_like(self.flops)
        for lvl in reversed(LEVELS):
            b = self.bytes.get(lvl)
            if b is not None:
                moved = np.where(moved > 0, moved, b)
        return self.useful_flops / np.maximum(moved, 1.0)

    @property
    def limiter(self) -> np.ndarray:
        names = ["compute", *self.memory_s]
        stack = np.stack([self.compute_s, *self.memory_s.values()])
        return np.array(names, dtype=object)[np.argmax(stack, axis=0)]

    def row(self, i: int) -> dict[str, Any]:
        """One point's figures as plain JSON values."""
        return {"flops": float(self.flops[i]), "bytes": {k: float(v[i]) for k, v in self.bytes.items()},
                "intensity": float(self.intensity[i]), "bound_s": float(self.bound_s[i]),
                "predicted_s": float(self.predicted_s[i]), "limiter": str(self.limiter[i]),
                "fits": bool(self.fits[i]), "reason": str(self.reason[i])}


def _ceil(a, b):
    return -(-np.asarray(a) // np.asarray(b))


def _split(extent, blk, tile):
    """(columns covered by full tiles, columns when edge tiles are padded) of
    ``extent`` cut into blocks of ``blk``, each cut into tiles of ``tile``."""
    extent, blk, tile = (np.asarray(x, dtype=np.int64) for x in (extent, blk, tile))
    blk = np.minimum(blk, np.maximum(extent, 1))
    nfull, rem = extent // blk, extent % blk
    full = nfull * (blk // tile * tile) + rem // tile * tile
    padded = nfull * _ceil(blk, tile) * tile + _ceil(rem, tile) * tile
    return full, padded


def _codes(col, value) -> np.ndarray:
    return np.asarray(col == value, dtype=bool)


def has_model(op: str, kind: str = "cpu") -> bool:
    """Whether there is a reuse model of the template for ``op`` on a machine of ``kind``
    (``Ceilings.kind``; default "cpu", the only kind modelled so far)."""
    return kind == "cpu" and op in _MODELS


def analytic_model(problem, space: Space, target: Target, cold: bool = False) -> "AnalyticModel | None":
    """The roofline model of ``problem`` over ``space`` on ``target`` (see ``AnalyticModel.for_problem``),
    or None when there is none: the target hands no ceilings (a table, a recording), or no reuse
    model knows this op on its kind of machine. A task without one is still searched and its funnel
    still applies the restrictions."""
    ceil = target.ceilings()
    if ceil is None or not has_model(problem.op, ceil.kind):
        return None
    return AnalyticModel.for_problem(problem, space, target, cold)


class AnalyticModel:
    """The analytic model of one template on one problem and device.

    Parameters:
        op, dims, epilogue: the problem (as a CPU template ``Problem`` holds it).
        flops: the problem's useful FLOPs.
        ceilings: the device's, from ``Target.ceilings()``.
        space: the task's space (decodes candidates into columns).
        cold: True when every timed call starts with cold caches (the timing
            flushes them); default False: hot repeated calls, as measured.
        vregs: vector registers a micro-kernel can keep live (default 16;
            ``for_problem`` takes the ceilings' ``registers``).
    """

    name = "roofline"

    def __init__(self, op: str, dims: Sequence[int], epilogue: str, flops: float, ceilings: Ceilings,
                 space: Space, cold: bool = False, vregs: int = 16):
        if op not in _MODELS:
            raise ValueError(f"no analytic model for op {op!r}; known: {', '.join(_MODELS)}")
        self.op, self.dims, self.epilogue = op, tuple(int(d) for d in dims), epilogue
        self.useful = float(flops)
        self.ceil = ceilings
        self.space = space
        self.cold = cold
        self.vregs = vregs

    @classmethod
    def for_problem(cls, problem, space: Space, target: Target, cold: bool = False) -> "AnalyticModel":
        """The model of ``problem`` (a template problem of ``target``) over ``space``, on the
        ceilings ``target.ceilings()`` hands it; ``cold`` as for the constructor (default False)."""
        ceil = target.ceilings()
        if ceil is None:
            raise ValueError(f"target {target.name!r} has no analytic ceilings to model {problem.op} with")
        if ceil.kind != "cpu":
            raise ValueError(f"no analytic model for a {ceil.kind} machine (target {target.name!r}); known: cpu")
        return cls(problem.op, problem.dims, problem.epilogue, target.flops(problem), ceil, space, cold,
                   ceil.registers)

    def at(self, dims: Sequence[int]) -> "AnalyticModel":
        """The same template, space and device at another problem size (a warm start's source shape, for
        the learned ranker's features); its useful FLOPs scale with the product of the sizes."""
        scale = math.prod(int(d) for d in dims) / max(math.prod(self.dims), 1)
        return AnalyticModel(self.op, dims, self.epilogue, self.useful * scale, self.ceil, self.space, self.cold,
                             self.vregs)

    def describe(self) -> dict[str, Any]:
        c = self.ceil
        return {"name": self.name, "op": self.op, "dims": list(self.dims), "cold": self.cold,
                "peak_flops_1t_by_bits": {str(k): v for k, v in sorted(c.rate_bits.items())},
                "call_s": c.call_s, "launch_s": c.launch_s}

    # -- the vectorised core -------------------------------------------------
    def evaluate(self, cols: Mapping[str, np.ndarray]) -> Estimate:
        """The estimate of every point whose knob values are ``cols``."""
        return _MODELS[self.op](self, cols)

    def estimate(self, candidates: Sequence[Candidate]) -> Estimate:
        return self.evaluate(columns(self.space, candidates))

    # -- the CostModel protocol and friends -----------------------------------
    def predict(self, candidates: Sequence[Candidate]) -> list[float]:
        """Predicted seconds per candidate; +inf for one that fails a capacity check."""
        if not candidates:
            return []
        e = self.estimate(candidates)
        return [float(p) if f else math.inf for p, f in zip(e.predicted_s, e.fits)]

    def lower_bound(self, candidates: Sequence[Candidate]) -> list[float]:
        """Seconds no run of each candidate can beat."""
        if not candidates:
            return []
        return [float(b) for b in self.estimate(candidates).bound_s]

    def capacity(self, candidates: Sequence[Candidate]) -> list[str | None]:
        """Per candidate, the capacity check it fails (None when it fits)."""
        if not candidates:
            return []
        e = self.estimate(candidates)
        return [None if f else str(r) for f, r in zip(e.fits, e.reason)]

    def feature_names(self) -> list[str]:
        return list(self._features(self.evaluate(_one_point(self.space))).keys())

    def features(self, candidates: Sequence[Candidate]) -> np.ndarray:
        """Analytic features per candidate (rows), for learned models: log bound,
        log prediction, the compute and per-level memory terms, intensity, and
        the template's own loss factors."""
        if not candidates:
            return np.zeros((0, len(self.feature_names())))
        return self.features_of(self.estimate(candidates))

    def features_of(self, e: Estimate) -> np.ndarray:
        return np.column_stack(list(self._features(e).values())).astype(float)

    def _features(self, e: Estimate) -> dict[str, np.ndarray]:
        tiny = 1e-12
        f = {"log_bound": np.log(e.bound_s + tiny), "log_pred": np.log(e.predicted_s + tiny),
             "log_compute": np.log(e.compute_s + tiny), "log_intensity": np.log(e.intensity + tiny),
             "fits": e.fits.astype(float)}
        for lvl, t in e.memory_s.items():
            f[f"log_mem_{lvl}"] = np.log(t + tiny)
        for k, v in sorted(e.extra.items()):
            f[k] = np.asarray(v, dtype=float)
        return f


def _one_point(space: Space) -> dict[str, np.ndarray]:
    c = space.sample(random.Random(0))
    return columns(space, [c])


# -- the templates' reuse models ----------------------------------------------

def _finish(m: AnalyticModel, n: int, *, flops, threads, active, compute_lb, compute_pred,
            traffic: dict[str, np.ndarray], compulsory, serial_s=0.0, fits=None, reason=None,
            extra=None, streams=1) -> Estimate:
    """Turn per-level traffic (the slowest thread's bytes) and compute terms into bounds and a prediction
    (``streams``: the sequential streams each thread reads at once, which every level's read bandwidth
    depends on)."""
    c = m.ceil
    threads = np.broadcast_to(np.asarray(threads), (n,))
    active = np.broadcast_to(np.asarray(active), (n,))
    launch = np.where(threads > 1, c.launch_s, 0.0)
    over = c.call_s + launch
    mem_lb = c.memory_bound(compulsory, active, m.cold)
    # the probe's call is a ctypes call with four arguments; a kernel's may cost less, so the
    # bound leaves the call out and keeps only the fork-join a parallel kernel cannot avoid
    bound = np.maximum(compute_lb, mem_lb) + launch
    memory_s = {}
    # ``traffic`` is the slowest thread's bytes; the team's bandwidth is shared by its active threads
    share = np.maximum(1.0, active.astype(float))
    for lvl, b in traffic.items():
        if lvl in c.bw:
            memory_s[lvl] = np.broadcast_to(b, (n,)) * share / c.bandwidth(lvl, active, "read", streams)
    terms = [np.broadcast_to(compute_pred, (n,)), *memory_s.values()]
    top = np.maximum.reduce(terms)
    # compute and the memory levels overlap, but not perfectly: a share of the other terms shows
    pred = top + OVERLAP_LOSS * (np.add.reduce(terms) - top) + over + serial_s
    pred = np.maximum(pred, bound)  # a prediction below what is provably needed is never right
    fits = np.ones(n, dtype=bool) if fits is None else fits
    reason = np.full(n, "", dtype=object) if reason is None else reason
    return Estimate(np.broadcast_to(np.asarray(flops, dtype=float), (n,)), np.full(n, m.useful),
                    {k: np.broadcast_to(np.asarray(v, dtype=float), (n,)) for k, v in traffic.items()},
                    np.broadcast_to(np.asarray(compute_pred, dtype=float), (n,)), memory_s, over,
                    np.asarray(bound, dtype=float), np.asarray(pred, dtype=float), fits, reason, extra or {})


def _add(traffic: dict[str, np.ndarray], level_idx, nbytes) -> None:
    level_idx = np.asarray(level_idx)
    for i, lvl in enumerate(LEVELS):
        part = np.where(level_idx == i, nbytes, 0.0)
        traffic[lvl] = traffic.get(lvl, 0.0) + part


def _check(fits, reason, ok, why: str):
    fresh = fits & ~ok
    reason[fresh] = why
    return fits & ok


# per weight format: vector instructions to widen one vector of weights, per FMA (bf16: a zero-extend and a
# shift; int8: a sign-extend and a convert; int4: two values per sign-extend, a shift pair and two converts);
# int8 weights with int8 activations: one dot-product instruction per 4 multiply-adds (VNNI), so -0.75; where
# the space's constant ``a8_vnni`` is false, AVX2's path spends 6 on 4 (two widenings to int16, two
# multiply-adds, two adds: qgemv.DOT), so +0.5
WIDEN_OPS = {"fp32": 0.0, "bf16": 1.0, "int8": 1.0, "int4": 1.5, "int8+a8": -0.75, "int8+a8 avx2": 0.5}


def _weight_format(k: Mapping[str, np.ndarray], n: int, K: int,
                   constants: Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Bytes per weight and widening instructions per FMA of each point (fp32 where there is no ``wfmt`` knob)."""
    if "wfmt" not in k:
        return np.full(n, float(F32)), np.zeros(n)
    fmts, blocks = np.asarray(k["wfmt"], dtype=object), np.asarray(k["qblock"])
    acts = np.asarray(k["act"], dtype=object) if "act" in k else np.full(n, "fp32", dtype=object)
    wb = np.array([bytes_per_weight(f, K, int(b)) for f, b in zip(fmts, blocks)])
    a8 = "int8+a8" if (constants or {}).get("a8_vnni", True) else "int8+a8 avx2"
    widen = np.array([WIDEN_OPS[a8 if a == "int8" and f == "int8" else f] for f, a in zip(fmts, acts)])
    return wb, widen


def _gemm(m: AnalyticModel, k: Mapping[str, np.ndarray]) -> Estimate:
    c = m.ceil
    M, N, K = m.dims
    vec, mr, nv = (np.asarray(k[x], dtype=np.int64) for x in ("vec", "mr", "nv"))
    pa, pb = np.asarray(k["pack_a"], dtype=np.int64), np.asarray(k["pack_b"], dtype=np.int64)
    ji = _codes(k["order"], "ji")
    mc, kc, nc = (np.asarray(k[x], dtype=np.int64) for x in ("mc", "kc", "nc"))
    T = np.asarray(k["threads"], dtype=np.int64)
    par_n = _codes(k["par"], "n") | (T == 1)
    n = len(vec)
    NR = nv * vec
    kc_, mc_ = np.minimum(kc, K), np.minimum(mc, M)
    # the largest thread's share of the output (static split over NR or MR units)
    per_n = _ceil(_ceil(N, NR), T)
    per_m = _ceil(_ceil(M, mr), T)
    Nt = np.where(par_n, np.minimum(N, per_n * NR), N)
    Mt = np.where(par_n, M, np.minimum(M, per_m * mr))
    active = np.where(par_n, np.minimum(T, _ceil(N, NR)), np.minimum(T, _ceil(M, mr)))
    nc_ = np.minimum(nc, np.maximum(Nt, 1))
    # FLOPs: full tiles in the vector micro-kernel; edges padded (both packed) or scalar
    m_full, m_pad = _split(Mt, mc_, mr)
    n_full, n_pad = _split(Nt, nc_, NR)
    both = (pa == 1) & (pb == 1)
    vec_flops = 2.0 * K * np.where(both, m_pad * n_pad, m_full * n_full)
    scalar_flops = np.where(both, 0.0, 2.0 * K * (Mt * Nt - m_full * n_full))
    share_useful = 2.0 * K * Mt * Nt  # what the slowest thread must compute at least
    rate_lb = c.rate_bound(vec)
    compute_lb = np.where(both, vec_flops, share_useful) / rate_lb
    ilp = np.minimum(1.0, mr * nv / FMA_CHAINS)
    scalar_rate = c.rate_est(1)
    compute_pred = vec_flops / (c.rate_est(vec) * ilp) + scalar_flops / scalar_rate
    # traffic per level (the slowest thread's, at the bandwidth its team shares)
    wb, _ = _weight_format(k, n, K)  # a quantised B is read at its own size, widened as it is packed
    res = 1.0 if m.epilogue == RESIDUAL else 0.0  # a residual: read once more, copied into C
    foot = F32 * (M * K + (1 + res) * M * N + N) + wb * K * N
    home = np.broadcast_to(c.home(foot, active), (n,)) if not m.cold else np.full(n, LEVELS.index("DRAM"))
    traffic: dict[str, np.ndarray] = {}
    a_reads_home = _ceil(Nt, nc_) * Mt * K * float(F32)
    b_reads_home = 1.0 * K * Nt * wb
    _add(traffic, home, a_reads_home + b_reads_home + (2.0 + res) * Mt * Nt * F32)
    b_block = kc_ * nc_ * F32
    a_block = mc_ * kc_ * F32
    lvl_b = c.home(b_block, 1, per_thread=True)
    lvl_a = c.home(a_block, 1, per_thread=True)
    # ji: the A block is re-streamed per NR panel, the B micro-panel stays in L1 across row tiles;
    # ij: the B block is re-streamed per MR panel, the A micro-panel stays in L1
    b_stream = np.where(ji, _ceil(Mt, mc_), _ceil(Mt, mr)) * 1.0 * K * Nt * F32
    a_stream = np.where(ji, _ceil(Nt, NR), _ceil(Nt, nc_)) * 1.0 * Mt * K * F32
    _add(traffic, lvl_b, b_stream)
    _add(traffic, lvl_a, a_stream)
    c_passes = 2.0 * _ceil(K, kc_) - 1
    lvl_c = c.home(Mt * nc_ * F32, 1, per_thread=True)
    _add(traffic, lvl_c, c_passes * Mt * Nt * F32)
    # micro-kernel loads: per k step nv vectors of B and mr broadcasts of A, each one load; the micro-panels are
    # read again by every tile of a block from where both fit: L1, or past it L2 (no capacity failure: a
    # 32x1024x256 GEMM whose 40 KB of micro-panels overflow a 32 KB L1, kc 256, measured 80 us against 95 at
    # kc 32, which fit; failing them kept every such setting from the ranked settings a model's kernels run)
    tiles_k = vec_flops / (2.0 * mr * NR)
    lvl_micro = c.home(kc_ * (mr + NR) * F32, T, per_thread=True) if "L1" in c.cache else np.zeros(n, dtype=int)
    _add(traffic, lvl_micro, tiles_k * nv * vec * F32)  # B's vectors, streamed
    _add(traffic, 0, tiles_k * mr * vec * F32)  # A's broadcasts: a few rows, each read down k
    # capacity: register tile, A block + B panel in L2, B blocks of every thread in L3
    fits = np.ones(n, dtype=bool)
    reason = np.full(n, "", dtype=object)
    fits = _check(fits, reason, mr * nv + nv + 1 <= m.vregs, "register tile exceeds the vector registers")
    if "L2" in c.cache:
        fits = _check(fits, reason, (mc_ * kc_ + kc_ * NR) * F32 <= c.per_thread("L2", T),
                      "A block and B micro-panel exceed L2")
    if "L3" in c.cache:
        fits = _check(fits, reason, active * (kc_ * nc_ + mc_ * kc_) * F32 <= c.capacity("L3", T),
                      "the threads' B and A blocks exceed L3")
    extra = {"imbalance": (Mt * Nt * active) / float(M * N), "scalar_frac": scalar_flops / np.maximum(
        vec_flops + scalar_flops, 1.0), "pad_frac": vec_flops / np.maximum(share_useful, 1.0), "ilp": ilp,
        "lanes_frac": vec / float(max(8, max(c.rate_bits) // 32))}
    return _finish(m, n, flops=vec_flops + scalar_flops, threads=T, active=active,
                   compute_lb=compute_lb, compute_pred=compute_pred, traffic=traffic, compulsory=foot, fits=fits,
                   reason=reason, extra=extra)


def _gemv(m: AnalyticModel, k: Mapping[str, np.ndarray]) -> Estimate:
    c = m.ceil
    N, K = m.dims
    vec, jb, ks = (np.asarray(k[x], dtype=np.int64) for x in ("vec", "jb", "ksplit"))
    T = np.asarray(k["threads"], dtype=np.int64)
    n = len(vec)
    # a quantised weight format (issue 17) streams fewer bytes per weight, always from packed panels, and
    # widens each vector of weights before its FMA (a few more vector instructions per FMA)
    wb, widen = _weight_format(k, n, K, m.space.constants)
    packed = _codes(k["w_layout"], "packed") | (wb < F32)
    jbv = jb * vec
    nblk = N // jbv
    tail = N - nblk * jbv
    per = _ceil(nblk, T)
    active = np.maximum(1, np.minimum(T, nblk))
    vec_flops = 2.0 * K * jbv * per  # the slowest thread's blocks
    tail_flops = 2.0 * K * tail  # after the parallel loop, on one thread, scalar
    rate_lb = c.rate_bound(vec)
    compute_lb = vec_flops / rate_lb
    ilp = np.minimum(1.0, jb * ks / FMA_CHAINS)
    compute_pred = vec_flops * (1.0 + widen) / (c.rate_est(vec) * ilp)
    foot = wb * N * K + F32 * (K + 2 * N)
    home = np.broadcast_to(c.home(foot, active), (n,)) if not m.cold else np.full(n, LEVELS.index("DRAM"))
    traffic: dict[str, np.ndarray] = {}
    w_share = wb * K * jbv * per
    # row layout reads W a few floats per row at a stride of a whole row: past a page the
    # hardware prefetchers lose the stream, and the bytes arrive at the next level's pace
    strided = ~packed & (N * F32 >= PAGE_BYTES)
    w_level = np.where(strided, np.minimum(home + 1, LEVELS.index("DRAM")), home)
    _add(traffic, w_level, w_share)
    _add(traffic, home, F32 * (K + 2.0 * jbv * per))
    # row layout: each row of a block is jbv floats at a stride of N; a line shared with the
    # next block is fetched again from L2 when K lines do not stay in L1 meanwhile
    used = np.minimum(1.0, jbv * F32 / LINE_BYTES)
    refetch = np.where(packed, 0.0, (1.0 / used - 1.0)) * w_share
    if "L1" in c.cache:
        refetch = np.where(K * LINE_BYTES > c.per_thread("L1", T), refetch, 0.0)
    _add(traffic, np.minimum(home, 1), refetch)
    _add(traffic, 0, F32 * 1.0 * K * per * (1 + jb) * vec)  # x broadcasts and W vector loads
    # the tail columns: one thread, scalar, one cache line per element read
    tail_s = tail_flops / c.rate_est(1) + tail * K * LINE_BYTES / c.bandwidth_at(home, 1)
    extra = {"imbalance": jbv * per * active / float(N), "tail_frac": tail / float(N), "ilp": ilp,
             "packed": packed.astype(float)}
    # each block walks its ksplit chunks of K together: that many sequential streams per thread
    return _finish(m, n, flops=vec_flops + tail_flops, threads=T, active=active,
                   compute_lb=compute_lb + tail_flops / c.rate_bound(1),
                   compute_pred=compute_pred, traffic=traffic, compulsory=foot, serial_s=tail_s, extra=extra,
                   streams=ks)


_ROW_SWEEPS = {"softmax": (2, 2, 1), "eltwise": (1, 1, 0)}  # reads of x, writes of y, re-reads of y per element


def _rowwise(m: AnalyticModel, k: Mapping[str, np.ndarray]) -> Estimate:
    c = m.ceil
    R, C = m.dims
    vec = np.asarray(k["vec"], dtype=np.int64)
    T = np.asarray(k["threads"], dtype=np.int64)
    n = len(vec)
    rows_t = _ceil(R, T)
    active = np.minimum(T, R)
    per_elem = m.useful / float(R * C)
    body = C // vec * vec
    vec_flops = per_elem * rows_t * body
    scalar_flops = per_elem * rows_t * (C - body)
    compute_lb = per_elem * rows_t * C / c.rate_bound(vec)
    compute_pred = np.where(vec > 1, vec_flops / c.rate_est(vec), 0.0) + \
        np.where(vec > 1, scalar_flops, vec_flops + scalar_flops) / c.rate_est(1)
    if m.op == "layernorm":
        x_reads, y_writes, y_reads = np.where(np.asarray(k["passes"]) == 1, 2, 3), 1, 0
    else:
        x_reads, y_writes, y_reads = _ROW_SWEEPS["softmax" if m.op == "softmax" else "eltwise"]
    params = {"layernorm": 2 * C, "eltwise": C + (R * C if "add" in m.epilogue.split("_") else 0)}.get(m.op, 0)
    foot = F32 * (2.0 * R * C + params)
    home = np.broadcast_to(c.home(foot, active), (n,)) if not m.cold else np.full(n, LEVELS.index("DRAM"))
    traffic: dict[str, np.ndarray] = {}
    row_bytes = F32 * 1.0 * rows_t * C
    _add(traffic, home, 2.0 * row_bytes + F32 * params * rows_t / max(R, 1))
    # later sweeps over a row find it in L1 when x and y of one row fit there
    again = (np.asarray(x_reads) - 1 + np.asarray(y_writes) - 1 + np.asarray(y_reads)) * row_bytes
    lvl_row = c.home(2.0 * F32 * C, T, per_thread=True)
    _add(traffic, lvl_row, again)
    extra = {"tail_frac": (C - body) / float(C), "imbalance": rows_t * active / float(R)}
    return _finish(m, n, flops=vec_flops + scalar_flops, threads=T, active=active,
                   compute_lb=compute_lb, compute_pred=compute_pred, traffic=traffic, compulsory=foot, extra=extra)


def _conv(m: AnalyticModel, k: Mapping[str, np.ndarray]) -> Estimate:
    """Direct (``conv``) and depthwise (``dwconv``) NHWC convolutions: register tiles of ``owb`` output columns x
    ``ob`` (``cbv``) channel vectors, rows split over threads, the input copied once into a padded scratch or read
    in place."""
    c = m.ceil
    N, C, H, W, O, KH, KW, SH, SW, PT, PL, PB, PR, DH, DW, G = m.dims
    OH = (H + PT + PB - DH * (KH - 1) - 1) // SH + 1
    OW = (W + PL + PR - DW * (KW - 1) - 1) // SW + 1
    Cg, Og = C // G, O // G
    dw = m.op == "dwconv"
    vec, owb = (np.asarray(k[x], dtype=np.int64) for x in ("vec", "owb"))
    cv = np.asarray(k["cbv" if dw else "ob"], dtype=np.int64)
    T = np.asarray(k["threads"], dtype=np.int64)
    n = len(vec)
    rows = N * OH
    rows_t = _ceil(rows, T)
    active = np.minimum(T, rows)
    lanes = cv * vec
    # executed FMAs per row, padding lanes and the columns past the row's end included
    ch_tiles = _ceil(C, lanes) if dw else G * _ceil(Og, lanes)
    col_tiles = _ceil(OW, owb)
    per_tap = 1 if dw else Cg                      # products per kernel tap and output lane
    cols = col_tiles * owb if dw else np.full(n, OW)  # the direct template's tail tile computes no column past OW
    row_flops = 2.0 * ch_tiles * cols * lanes * per_tap * KH * KW
    flops = row_flops * rows_t
    compute_lb = m.useful / np.maximum(1, active) / c.rate_bound(vec)
    # FMA chains in flight, and the loads each FMA needs (two loads and two FMAs per cycle on current cores)
    ilp = np.minimum(1.0, owb * cv / FMA_CHAINS)
    loads = np.where(dw, (owb * cv + cv) / (owb * cv), (owb + cv) / (owb * cv))
    # the direct template's tiles below CONV_TILE_ACC accumulators ran slower than the chain and load counts say
    # (measured alone, one thread, AVX-512, 3x3 at 64-256 channels: 16 accumulators 1.2-1.6x, 12 1.2-1.5x, 8
    # 1.3-1.7x the time of ob 4 x owb 6): about the square root of the shortfall
    small = np.where(dw, 1.0, np.sqrt(np.maximum(1.0, CONV_TILE_ACC / (owb * cv))))
    compute_pred = flops * np.maximum(1.0, loads) * small / (c.rate_est(vec) * ilp)
    _, _, steps = (m.epilogue.split("/") + ["", "", ""])[:3]
    res = "add" in steps.split("_")
    nchw = m.epilogue.startswith("nchw")
    x_b, y_b = F32 * N * C * H * W, F32 * N * O * OH * OW
    w_b = F32 * O * Cg * KH * KW
    # the input read, and written once more into the padded scratch unless the template reads it in place (NHWC:
    # direct without padding, depthwise where its channel tiles divide the channels)
    if nchw:
        in_place = np.zeros(n, dtype=bool)
    elif dw:
        in_place = C % lanes == 0
    else:
        in_place = np.full(n, not (PT or PL or PB or PR))
    foot = np.where(in_place, 1.0, 2.0) * x_b + w_b + y_b * (2 if res else 1)
    home = np.broadcast_to(c.home(foot, active), (n,)) if not m.cold else np.full(n, LEVELS.index("DRAM"))
    traffic: dict[str, np.ndarray] = {}
    _add(traffic, home, (foot + (2.0 * y_b * (2 if res else 1) if nchw else 0.0)) * rows_t / rows)
    # each column tile reads its channel block's weights again: from L1 when a tile's taps fit there
    tile_w = F32 * KH * KW * lanes * (1 if dw else np.minimum(np.asarray(k.get("cb", Cg)), Cg))
    w_lvl = c.home(tile_w, T, per_thread=True)
    _add(traffic, w_lvl, rows_t * col_tiles * ch_tiles * F32 * KH * KW * lanes * per_tap)
    # every row reads the weights again after the first: all of them from where they all fit (rows outermost,
    # ``order`` 0), or, channel blocks outermost (``order`` 1, direct only), its blocks from where one block fits
    order = np.asarray(k["order"], dtype=np.int64) if "order" in k else np.zeros(n, dtype=np.int64)
    again_w = np.maximum(0, rows_t - 1) * w_b
    _add(traffic, np.broadcast_to(c.home(w_b, T), (n,)), np.where(order == 0, again_w, 0.0))
    _add(traffic, c.home(F32 * KH * KW * Cg * lanes, T, per_thread=True),
         np.where(order == 1, (rows - 1) * w_b / np.maximum(1, active), 0.0))
    # the input rows a row of output reads, once per channel tile (they stay in L1/L2 between tiles)
    in_row = F32 * KH * (OW * SW + KW * DW) * (C if dw else Cg)
    _add(traffic, c.home(in_row, T, per_thread=True), rows_t * (1 if dw else ch_tiles) * in_row)
    if not dw:  # partial sums between input-channel blocks
        blocks = _ceil(Cg, np.maximum(1, np.asarray(k["cb"], dtype=np.int64)))
        part = 2.0 * F32 * OW * G * _ceil(Og, vec) * vec * (blocks - 1)
        _add(traffic, c.home(F32 * OW * O, T, per_thread=True), rows_t * part)
    extra = {"ilp": ilp, "loads_per_fma": loads, "waste": flops * active / np.maximum(1.0, m.useful * 1.0) - 1.0}
    if "algo" in k:  # the Winograd forms of a 3x3 layer (templates/winograd.py) replace their points' figures
        algo = np.asarray(k["algo"], dtype=object)
        for name, wm in winograd.ALGOS.items():
            sel = algo == name
            if sel.any():
                w = _winograd(m, k, wm, res, OH, OW)
                flops, compute_lb, compute_pred, active = (np.where(sel, w[key], old) for key, old in (
                    ("flops", flops), ("compute_lb", compute_lb), ("compute_pred", compute_pred), ("active", active)))
                foot = np.where(sel, w["foot"], foot)
                for lvl in set(traffic) | set(w["traffic"]):
                    traffic[lvl] = np.where(sel, w["traffic"].get(lvl, 0.0), traffic.get(lvl, 0.0))
                extra["waste"] = np.where(sel, 0.0, extra["waste"])
    return _finish(m, n, flops=flops, threads=T, active=active, compute_lb=compute_lb, compute_pred=compute_pred,
                   traffic=traffic, compulsory=foot, extra=extra)


def _winograd(m: AnalyticModel, k: Mapping[str, np.ndarray], wm: int, res: bool, OH: int, OW: int) -> dict[str, Any]:
    """The Winograd F(wm x wm, 3x3) form of every point: t^2 GEMMs of [tiles, C] x [C, O] in register tiles of
    ``owb`` tiles x ``ob`` vectors, plus the two transforms; work split in units of (block of ``tb`` tiles, share of
    the output-channel blocks). The bound counts only the GEMMs' multiply-adds on real tiles and channels (the
    problem's useful FLOPs overstate what this form must execute, so they cannot bound it)."""
    c = m.ceil
    N, C, H, W, O = m.dims[:5]
    g = {"N": N, "C": C, "O": O, "OH": OH, "OW": OW}
    vec, mr, ob, tb = (np.asarray(k[x], dtype=np.int64) for x in ("vec", "owb", "ob", "tb"))
    T = np.asarray(k["threads"], dtype=np.int64)
    obw = ob * vec
    f = winograd.executed_flops(g, wm, tb, mr, obw)
    nt = winograd.tiles(g, wm)
    nblk = _ceil(nt, np.minimum(tb, nt))
    nob = _ceil(O, obw)
    split = np.where(nblk >= 2 * T, 1, np.minimum(nob, _ceil(2 * T, nblk)))
    units = nblk * split
    active = np.minimum(T, units)
    share = _ceil(units, T) / units  # the slowest thread's share of the work
    tin, _ = winograd.op_counts(wm)
    tf = f["transform"] + (split - 1) * float(nt) * C * tin  # each share of a block transforms its input again
    ilp = np.minimum(1.0, mr * ob / FMA_CHAINS)
    loads = (mr + ob) / (mr * ob)
    small = np.sqrt(np.maximum(1.0, CONV_TILE_ACC / (mr * ob)))
    rate = c.rate_est(vec)
    # a transform's vector operation (an add, a load, a store) issues at two a cycle where an FMA counts two FLOPs
    # a lane at two a cycle: a FLOP per lane of a transform costs two of the FMA's
    compute_pred = share * (f["gemm"] * np.maximum(1.0, loads) * small / (rate * ilp) + 2.0 * tf / rate)
    compute_lb = f["gemm_useful"] / active / c.rate_bound(vec)
    x_b, y_b = F32 * N * C * H * W, F32 * N * O * g["OH"] * g["OW"]
    u_b = winograd.weight_bytes(g, wm, obw)
    foot = x_b + u_b + y_b * (2 if res else 1)
    traffic: dict[str, np.ndarray] = {}
    home = c.home(foot, active) if not m.cold else np.full(len(vec), LEVELS.index("DRAM"))
    _add(traffic, home, foot * share)
    # every unit streams its share of the transformed weights; after the first pass they come from where they fit
    _add(traffic, c.home(u_b, T), np.maximum(0, units * share - 1) * u_b / split)
    # a block's transformed input, written once, read by each of its output-channel blocks' GEMMs
    vs_b = winograd.scratch_bytes(g, wm, np.minimum(tb, nt))
    _add(traffic, c.home(vs_b, T, per_thread=True), units * share * vs_b * (1 + nob / split))
    return {"flops": f["gemm"] + tf, "compute_lb": compute_lb, "compute_pred": compute_pred, "active": active,
            "foot": foot, "traffic": traffic}


def _irb(m: AnalyticModel, k: Mapping[str, np.ndarray]) -> Estimate:
    """The inverted-residual block (``irb``, templates/irb.py): per work item (a band of rows, or a group of the
    expanded channels) the expansion, depthwise and projection tiles over the item's pixels and channels, the
    expanded rows in a ring (or the whole padded map) in the item's thread's caches, the weights read again per row
    through the ring and once with the whole map."""
    c = m.ceil
    N, H, W, C, E, O, K, S = m.dims
    P = K // 2
    OH, OW = (H + 2 * P - K) // S + 1, (W + 2 * P - K) // S + 1
    expand = not m.epilogue.startswith("copy/")
    vec, mr1, nv1, owb, mr2, nv2 = (np.asarray(k[x], dtype=np.int64) for x in ("vec", "mr1", "nv1", "owb", "mr2",
                                                                            "nv2"))
    T = np.asarray(k["threads"], dtype=np.int64)
    whole = np.asarray(k["whole"], dtype=np.int64) == 1
    split_e = (np.asarray(k["split"], dtype=object) == "e") & (T > 1)
    n = len(vec)
    nb1, nb2 = nv1 * vec, nv2 * vec
    nblk1 = _ceil(E, nb1)
    ec = np.where(split_e, _ceil(nblk1, T), nblk1) * nb1          # the slowest item's expanded channels
    op = _ceil(O, nb2) * nb2
    rows = np.where(split_e, OH, _ceil(OH, T))                     # its output rows
    rows_in = np.minimum(H, (rows - 1) * S + K)                     # and the input rows it expands
    active = np.minimum(T, np.where(split_e, nblk1, OH))
    px1 = np.where(whole, _ceil(H * W, mr1) * mr1, rows_in * _ceil(W, mr1) * mr1)
    px2 = np.where(whole, _ceil(OH * OW, mr2) * mr2, rows * _ceil(OW, mr2) * mr2)
    f1 = 2.0 * N * px1 * C * ec * expand
    fd = 2.0 * N * rows * OW * ec * K * K
    f2 = 2.0 * N * px2 * ec * op
    flops = f1 + fd + f2
    rate = c.rate_est(vec)
    # FMA chains in flight and loads per FMA (two of each a cycle): broadcasts and weight vectors of the GEMM tiles;
    # the depthwise tile's input vectors, each loaded once per kernel row for the columns it covers
    cbv = np.asarray(k["cbv"], dtype=np.int64) if "cbv" in k else np.ones(n, dtype=np.int64)
    ilp1, ilp2, ilpd = (np.minimum(1.0, a / FMA_CHAINS) for a in (mr1 * nv1, mr2 * nv2, owb * cbv))
    ld1, ld2 = (mr1 + nv1) / (mr1 * nv1), (mr2 + nv2) / (mr2 * nv2)
    ldd = ((owb - 1) * S + K) / (owb * K)
    compute_pred = (f1 * np.maximum(1.0, ld1) / ilp1 + fd * np.maximum(1.0, ldd) / ilpd
                    + f2 * np.maximum(1.0, ld2) / ilp2) / rate
    compute_lb = m.useful / np.maximum(1, active) / c.rate_bound(vec)
    w_b = F32 * ((C + 1) * E * expand + E * (K * K + 1) + (E + 1) * O)
    part = np.where(split_e, 2.0 * F32 * (T - 1) * N * OH * OW * op, 0.0)
    foot = F32 * N * (H * W * C + OH * OW * O) + w_b + part
    home = np.broadcast_to(c.home(foot, active), (n,)) if not m.cold else np.full(n, LEVELS.index("DRAM"))
    traffic: dict[str, np.ndarray] = {}
    _add(traffic, home, foot / np.maximum(1, active))
    # the item's weights: once with the whole map; through the ring, the expansion's per input row and the
    # projection's per output row after the first, from where the item's share fits
    w_item = F32 * (C * ec * expand + ec * op)
    again = np.where(whole, 0.0, F32 * (np.maximum(0, rows_in - 1) * C * ec * expand
                                        + np.maximum(0, rows - 1) * ec * op))
    _add(traffic, c.home(w_item, T, per_thread=True), N * again)
    # the expanded rows (written once, read by the depthwise tiles K times) and the depthwise output
    buf = F32 * ec * np.where(whole, (H + 2 * P) * (W + 2 * P) + OH * OW, (K + 1) * (W + 2 * P) + OW)
    _add(traffic, c.home(buf, T, per_thread=True), F32 * N * ec * (rows_in * W + K * rows * (OW * S + K) + rows * OW))
    serial = np.where(split_e, c.launch_s, 0.0)  # the second parallel loop: the groups' partial sums added
    extra = {"ilp": np.minimum.reduce([ilp1, ilp2, ilpd]), "waste": flops * active / max(1.0, m.useful) - 1.0}
    return _finish(m, n, flops=flops, threads=T, active=active, compute_lb=compute_lb, compute_pred=compute_pred,
                   traffic=traffic, compulsory=foot, serial_s=serial, extra=extra)


_MODELS = {"gemm": _gemm, "gemv": _gemv, "softmax": _rowwise, "layernorm": _rowwise, "eltwise": _rowwise,
           "conv": _conv, "dwconv": _conv, "irb": _irb}
