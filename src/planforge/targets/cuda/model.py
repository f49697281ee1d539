"""The GPU's analytic ceilings and the analytic model of the Triton templates (the L0 funnel's).

``gpu_ceilings(profile)`` turns a ``GpuProfile`` into a ``GpuCeilings``: a
``Ceilings`` of kind ``"gpu"`` (shared memory as L1, L2, HBM as DRAM; one
"thread" is one SM), so every reader of ``Ceilings`` (the e-graph's node
estimates) works, plus the GPU facts this model needs (peak FLOP/s per input
dtype, SMs, shared memory and registers, clocks).

``GpuModel`` scores whole columns of knob values at once (the funnel's
``Analytic`` protocol) with:
- a roofline over the tensor cores (or the fp32 pipes), shared memory, L2
  and HBM, each at the measured (or published) ceiling;
- occupancy: resident blocks per SM from shared memory, registers, threads
  and the block limit; a configuration no SM can hold does not fit;
- wave quantisation: the busiest SM runs ``ceil(programs / SMs)`` programs;
- memory-level parallelism (Little's law): the bytes a configuration keeps in
  flight over the memory latency bound the bandwidth it can draw, which is
  what makes small blocks and single-program kernels slow;
- HBM traffic under L2 reuse: a GEMM's concurrent tiles share the rows of A
  and columns of B that their wave spans (GROUP_M shapes that span).

``bound_s`` uses only the compulsory work at the whole GPU's peaks (useful
FLOPs, compulsory bytes from HBM with cold caches), so it stays below any
measured time; ``predicted_s`` adds the losses above and the launch.

Assumptions (named, not ceilings): ``MEM_LATENCY_S`` (a loaded HBM access,
about 600 ns on Ampere and Hopper), ``SMEM_BYTES_PER_CLOCK`` (32 banks of 4
bytes per SM per clock), ``OVERLAP_LOSS`` (the share of non-limiting terms
that shows, as in the CPU model) and ``REG_OVERHEAD`` (registers a thread
needs besides its accumulators).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ...space import Candidate, Space
from ..target import Ceilings
from .devices import GpuProfile
from .problem import CudaProblem

MEM_LATENCY_S = 600e-9
SMEM_BYTES_PER_CLOCK = 128
OVERLAP_LOSS = 0.25
REG_OVERHEAD = 40


@dataclass(frozen=True)
class GpuCeilings(Ceilings):
    """``Ceilings`` of kind "gpu" with the GPU facts the template model reads.

    Extra parameters:
        flops_by_dtype: peak FLOP/s of the whole GPU per input dtype (``devices.DTYPES``).
        clock_hz: SM clock.
        smem_per_block / smem_per_sm: shared memory bytes.
        regs_per_sm: 32-bit registers per SM.
        max_threads_per_sm / max_blocks_per_sm: residency limits.
    """

    flops_by_dtype: dict[str, float] = field(default_factory=dict)
    clock_hz: float = 1.0e9
    smem_per_block: int = 48 * 1024
    smem_per_sm: int = 48 * 1024
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32

    @property
    def sms(self) -> int:
        return self.threads

    @property
    def hbm_bw(self) -> float:
        return self.bw["DRAM"]["read"][1]

    @property
    def l2_bw(self) -> float:
        return self.bw["L2"]["read"][1]

    @property
    def smem_bw_sm(self) -> float:
        return self.bw["L1"]["read"][0]


def gpu_ceilings(p: GpuProfile) -> GpuCeilings:
    """The analytic ceilings of the GPU ``p``: one SM is one "thread"; the shared memory is L1."""
    sms = p.sms
    smem_bw = SMEM_BYTES_PER_CLOCK * p.clock_hz
    fp32_sm = p.flops["fp32"] / sms
    bw = {"L1": {"read": (smem_bw, smem_bw * sms), "copy": (smem_bw, smem_bw * sms)},
          # one SM alone draws at most what its load path takes per clock, and no more than the whole
          "L2": {"read": (min(smem_bw, p.l2_bw), p.l2_bw), "copy": (min(smem_bw, p.l2_bw), p.l2_bw)},
          "DRAM": {"read": (min(smem_bw, p.hbm_bw), p.hbm_bw), "copy": (min(smem_bw, p.hbm_bw), p.hbm_bw)}}
    cache = {"L1": (p.smem_per_sm, sms, 1), "L2": (p.l2_bytes, 1, sms)}
    from .templates import REGS_PER_THREAD

    return GpuCeilings({32: fp32_sm}, float(sms), sms, bw, cache, p.launch_s, 0.0, p.fingerprint, REGS_PER_THREAD,
                       "gpu", dict(p.flops), p.clock_hz, p.smem_per_block, p.smem_per_sm, p.regs_per_sm,
                       p.max_threads_per_sm, p.max_blocks_per_sm)


@dataclass
class GpuEstimate:
    """Per-point results (arrays of one length), as the funnel and the report read them."""

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
        """FLOPs per byte moved from HBM."""
        return self.useful_flops / np.maximum(self.bytes["DRAM"], 1.0)

    @property
    def limiter(self) -> np.ndarray:
        names = ["compute", *self.memory_s]
        stack = np.stack([self.compute_s, *self.memory_s.values()])
        return np.array(names, dtype=object)[np.argmax(stack, axis=0)]

    def row(self, i: int) -> dict[str, Any]:
        return {"flops": float(self.flops[i]), "bytes": {k: float(v[i]) for k, v in self.bytes.items()},
                "intensity": float(self.intensity[i]), "bound_s": float(self.bound_s[i]),
                "predicted_s": float(self.predicted_s[i]), "limiter": str(self.limiter[i]),
                "fits": bool(self.fits[i]), "reason": str(self.reason[i])}


def _cdiv(a, b):
    return -(-np.asarray(a, dtype=np.int64) // np.asarray(b, dtype=np.int64))


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=float)


class GpuModel:
    """The analytic model of one Triton template on one problem and GPU.

    Parameters:
        problem: the ``CudaProblem``.
        ceilings: the GPU's ``GpuCeilings`` (``CudaTarget.ceilings()``).
        space: the task's knob space (decodes candidates into columns).
        cold: whether every timed run starts with a flushed L2 (the CUDA timing flushes it; default True).
    """

    name = "gpu-roofline"

    def __init__(self, problem: CudaProblem, ceilings: GpuCeilings, space: Space, cold: bool = True):
        if not isinstance(ceilings, GpuCeilings):
            raise ValueError(f"the GPU model needs GPU ceilings, got {type(ceilings).__name__} of kind "
                             f"{getattr(ceilings, 'kind', '?')}")
        self.p, self.c, self.space, self.cold = problem, ceilings, space, cold

    def describe(self) -> dict[str, Any]:
        c = self.c
        return {"name": self.name, "problem": self.p.to_json(), "cold": self.cold, "device": c.fingerprint,
                "peak_flops": c.flops_by_dtype.get(self.p.dtype), "hbm_bw": c.hbm_bw, "l2_bw": c.l2_bw,
                "launch_s": c.call_s, "assumptions": {"MEM_LATENCY_S": MEM_LATENCY_S,
                                                      "SMEM_BYTES_PER_CLOCK": SMEM_BYTES_PER_CLOCK,
                                                      "OVERLAP_LOSS": OVERLAP_LOSS, "REG_OVERHEAD": REG_OVERHEAD}}

    # -- shared pieces ------------------------------------------------------------
    @property
    def peak(self) -> float:
        return self.c.flops_by_dtype[self.p.dtype]

    def residency(self, threads, smem, regs_thread):
        """Blocks one SM holds at once, and why it is none (the capacity check)."""
        c = self.c
        threads, smem, regs_thread = _f(threads), _f(smem), _f(regs_thread)
        by_threads = np.floor(c.max_threads_per_sm / threads)
        by_smem = np.floor(c.smem_per_sm / np.maximum(smem, 1.0))
        by_regs = np.floor(c.regs_per_sm / np.maximum(threads * np.minimum(regs_thread, 255), 1.0))
        bps = np.minimum.reduce([by_threads, by_smem, by_regs, np.full(threads.shape, float(c.max_blocks_per_sm))])
        reason = np.full(threads.shape, "", dtype=object)
        reason = np.where(smem > c.smem_per_block, "shared memory per block exceeded", reason)
        reason = np.where(regs_thread > 255, "accumulators exceed a thread's registers", reason)
        reason = np.where((bps < 1) & (reason == ""), "no SM can hold one block", reason)
        return np.maximum(bps, 0.0), reason == "", reason

    def reachable_bw(self, level_bw: float, in_flight_bytes) -> np.ndarray:
        """What a kernel keeping ``in_flight_bytes`` in flight can draw from a level (Little's law)."""
        return np.minimum(level_bw, _f(in_flight_bytes) / MEM_LATENCY_S)

    def finish(self, n, flops, useful, compute_s, traffic: dict[str, np.ndarray], times: dict[str, np.ndarray],
               compulsory, launches, fits, reason, extra) -> GpuEstimate:
        c = self.c
        terms = [np.broadcast_to(_f(compute_s), (n,)), *(np.broadcast_to(_f(t), (n,)) for t in times.values())]
        top = np.maximum.reduce(terms)
        rest = np.sum(terms, axis=0) - top
        over = np.broadcast_to(_f(launches) * c.call_s, (n,))
        pred = top + OVERLAP_LOSS * rest + over
        comp_bytes = np.broadcast_to(_f(compulsory), (n,))
        mem_lb = comp_bytes / (c.hbm_bw if self.cold else c.l2_bw)
        bound = np.maximum(np.broadcast_to(_f(useful), (n,)) / self.peak, mem_lb)
        return GpuEstimate(np.broadcast_to(_f(flops), (n,)), np.broadcast_to(_f(useful), (n,)),
                           {k: np.broadcast_to(_f(v), (n,)) for k, v in traffic.items()},
                           np.broadcast_to(_f(compute_s), (n,)),
                           {k: np.broadcast_to(_f(v), (n,)) for k, v in times.items()}, over, bound, pred,
                           np.broadcast_to(np.asarray(fits, dtype=bool), (n,)),
                           np.broadcast_to(np.asarray(reason, dtype=object), (n,)),
                           {k: np.broadcast_to(_f(v), (n,)) for k, v in extra.items()})

    # -- the Analytic protocol -------------------------------------------------------
    def evaluate(self, cols: Mapping[str, np.ndarray]) -> GpuEstimate:
        fn = {"gemm": _gemm, "attention": _attention, "mlp": _mlp}.get(self.p.op, _streaming)
        return fn(self, cols)

    def estimate(self, candidates: Sequence[Candidate]) -> GpuEstimate:
        return self.evaluate(_columns(self.space, candidates))

    def predict(self, candidates: Sequence[Candidate]) -> list[float]:
        if not candidates:
            return []
        e = self.estimate(candidates)
        return [float(p) if f else math.inf for p, f in zip(e.predicted_s, e.fits)]

    def lower_bound(self, candidates: Sequence[Candidate]) -> list[float]:
        if not candidates:
            return []
        return [float(b) for b in self.estimate(candidates).bound_s]

    def capacity(self, candidates: Sequence[Candidate]) -> list[str | None]:
        if not candidates:
            return []
        e = self.estimate(candidates)
        return [None if f else str(r) for f, r in zip(e.fits, e.reason)]

    def _features(self, e: GpuEstimate) -> dict[str, np.ndarray]:
        tiny = 1e-12
        f = {"log_bound": np.log(e.bound_s + tiny), "log_pred": np.log(e.predicted_s + tiny),
             "log_compute": np.log(e.compute_s + tiny), "log_intensity": np.log(e.intensity + tiny),
             "fits": e.fits.astype(float)}
        for lvl, t in e.memory_s.items():
            f[f"log_mem_{lvl}"] = np.log(t + tiny)
        for k, v in sorted(e.extra.items()):
            f[k] = np.asarray(v, dtype=float)
        return f

    def feature_names(self) -> list[str]:
        one = _columns(self.space, [self.space.sample(random.Random(0))])
        return list(self._features(self.evaluate(one)))

    def features(self, candidates: Sequence[Candidate]) -> np.ndarray:
        if not candidates:
            return np.zeros((0, len(self.feature_names())))
        return self.features_of(self.estimate(candidates))

    def features_of(self, e: GpuEstimate) -> np.ndarray:
        return np.column_stack(list(self._features(e).values())).astype(float)


def _columns(space: Space, candidates: Sequence[Candidate]) -> dict[str, np.ndarray]:
    idx = np.array([c.index for c in candidates], dtype=np.int64).reshape(len(candidates), len(space.knobs))
    return {k.name: np.array(k.values)[idx[:, i]] for i, k in enumerate(space.knobs)}


# -- the templates ---------------------------------------------------------------------

def _gemm(m: GpuModel, k: Mapping[str, np.ndarray]) -> GpuEstimate:
    c, p = m.c, m.p
    M, N, K = p.dims
    eb = p.bytes_per_element
    bm, bn, bk = (_f(k[x]) for x in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    gm, warps, stages, split = _f(k["GROUP_M"]), _f(k["num_warps"]), _f(k["num_stages"]), _f(k["SPLIT_K"])
    n = len(bm)
    tm, tn = _f(_cdiv(M, bm)), _f(_cdiv(N, bn))
    k_per = _f(_cdiv(_cdiv(K, split), bk)) * bk
    split = _f(_cdiv(K, k_per))
    tiles = tm * tn
    programs = tiles * split
    threads = 32 * warps
    smem = stages * (bm * bk + bk * bn) * eb
    regs = bm * bn / threads + REG_OVERHEAD
    bps, fits, reason = m.residency(threads, smem, regs)
    bps_safe = np.maximum(bps, 1.0)
    # the busiest SM's programs (wave quantisation), each at the SM's share of the peak
    per_sm = _f(_cdiv(programs, c.sms))
    flops = 2.0 * tm * bm * tn * bn * split * k_per
    compute_s = per_sm * 2.0 * bm * bn * k_per / (m.peak / c.sms)
    # operand tiles stream through shared memory on every K step
    smem_s = per_sm * (bm + bn) * k_per * eb / c.smem_bw_sm
    # L2 -> SM traffic: A once per tile column, B once per tile row
    l2_bytes = (M * K * tn + K * N * tm) * eb + M * N * eb + np.where(split > 1, 2 * split * M * N * 4, 0.0)
    # HBM: what the concurrent tiles of one wave span, once per wave; all of it once where A and B fit in L2
    conc = np.minimum(programs, c.sms * bps_safe)
    rows_span = np.where(gm > 1, np.minimum(tm, np.minimum(gm, conc)), np.minimum(tm, _f(_cdiv(conc, tn))))
    cols_span = np.minimum(tn, _f(_cdiv(conc, np.maximum(rows_span, 1))))
    waves = _f(_cdiv(programs, conc))
    per_wave = (rows_span * bm + cols_span * bn) * K * eb / split
    compulsory = (M * K + K * N) * eb + M * N * eb + (N * eb if p.epilogue != "none" else 0) + \
        (M * N * eb if p.residual else 0)
    fit_l2 = (M * K + K * N) * eb <= c.cache["L2"][0] / 2
    hbm_bytes = np.where(fit_l2, compulsory, np.maximum(compulsory, waves * per_wave + M * N * eb))
    hbm_bytes = hbm_bytes + np.where(split > 1, 2 * split * M * N * 4 * (split * M * N * 4 > c.cache["L2"][0]), 0.0)
    # loads in flight: every resident block keeps (stages - 1) K steps of A and B tiles coming
    inflight = conc * np.maximum(stages - 1, 1) * (bm + bn) * bk * eb
    hbm_s = hbm_bytes / m.reachable_bw(c.hbm_bw, inflight)
    l2_s = l2_bytes / m.reachable_bw(c.l2_bw, inflight)
    occupancy = np.minimum(1.0, bps * warps / (c.max_threads_per_sm / 32))
    wave_eff = programs / (per_sm * c.sms)
    return m.finish(n, flops, p.flops(), compute_s, {"L1": per_sm * c.sms * (bm + bn) * k_per * eb, "L2": l2_bytes,
                                                      "DRAM": hbm_bytes},
                    {"L1": smem_s, "L2": l2_s, "DRAM": hbm_s}, compulsory, np.where(split > 1, 2, 1), fits, reason,
                    {"occupancy": occupancy, "wave_eff": wave_eff, "log_programs": np.log(programs)})


def _streaming(m: GpuModel, k: Mapping[str, np.ndarray]) -> GpuEstimate:
    """softmax, layernorm, rmsnorm (one program per row) and eltwise (one per BLOCK elements)."""
    c, p = m.c, m.p
    rows, cols = p.dims
    eb = p.bytes_per_element
    block, warps = _f(k["BLOCK"]), _f(k["num_warps"])
    n = len(block)
    compulsory = p.min_bytes()
    if p.op == "eltwise":
        programs = _f(_cdiv(rows * cols, block))
        operands = len(p.input_shapes())
        passes = np.ones(n)
        per_prog_flight = block * eb * operands
    else:
        programs = np.full(n, float(rows))
        one = block >= cols
        reads = {"softmax": 2, "layernorm": 3, "rmsnorm": 2}[p.op]
        passes = np.where(one, 1.0, float(reads))
        per_prog_flight = np.minimum(block, cols) * eb
    threads = 32 * warps
    regs = 2 * block / threads + REG_OVERHEAD  # the chunk (and its exponentials) in registers
    bps, fits, reason = m.residency(threads, np.zeros(n), regs)
    conc = np.minimum(programs, c.sms * np.maximum(bps, 1.0))
    # the first pass streams from HBM; later passes re-read the row from L2 (it was just read)
    x_bytes = rows * cols * eb
    hbm_s = compulsory / m.reachable_bw(c.hbm_bw, conc * per_prog_flight)
    l2_bytes = compulsory + (passes - 1) * x_bytes
    l2_s = l2_bytes / m.reachable_bw(c.l2_bw, conc * per_prog_flight)
    compute_s = np.full(n, p.flops() / c.flops_by_dtype["fp32"])
    return m.finish(n, p.flops(), p.flops(), compute_s, {"L2": l2_bytes, "DRAM": np.full(n, compulsory)},
                    {"L2": l2_s, "DRAM": hbm_s}, compulsory, 1, fits, reason,
                    {"passes": passes, "log_programs": np.log(programs)})


def _mlp(m: GpuModel, k: Mapping[str, np.ndarray]) -> GpuEstimate:
    """One program walks every layer: a chain of dependent tile loads on one SM."""
    c, p = m.c, m.p
    eb = p.bytes_per_element
    bn, bk, warps = _f(k["BLOCK_N"]), _f(k["BLOCK_K"]), _f(k["num_warps"])
    n = len(bn)
    threads = 32 * warps
    regs = bn * bk / threads * 2 + REG_OVERHEAD
    bps, fits, reason = m.residency(threads, np.zeros(n), regs)
    sm_bw = c.bw["DRAM"]["read"][0]
    t = np.zeros(n)
    flops = np.zeros(n)
    for K, N, _ in p.layers:
        steps = _f(_cdiv(N, bn)) * _f(_cdiv(K, bk))
        tile = bn * bk * eb
        # each step waits for its tile (no pipelining across the reduction), at one SM's load rate
        t = t + steps * (MEM_LATENCY_S + tile / sm_bw) + MEM_LATENCY_S  # the barrier and the next layer's input
        flops = flops + 2.0 * steps * bn * bk
    compute_s = flops / (c.flops_by_dtype["fp32"] / c.sms)
    compulsory = p.min_bytes()
    return m.finish(n, flops, p.flops(), compute_s, {"DRAM": np.full(n, compulsory)}, {"DRAM": t}, compulsory, 1,
                    fits, reason, {"log_steps": np.log(np.maximum(t / MEM_LATENCY_S, 1.0))})


def _attention(m: GpuModel, k: Mapping[str, np.ndarray]) -> GpuEstimate:
    c, p = m.c, m.p
    B, H, S, D = p.dims
    eb = p.bytes_per_element
    bm, bn, warps, stages = _f(k["BLOCK_M"]), _f(k["BLOCK_N"]), _f(k["num_warps"]), _f(k["num_stages"])
    n = len(bm)
    qb = _f(_cdiv(S, bm))
    programs = qb * B * H
    # keys each query block visits (padded to BLOCK_N); causal: up to its diagonal
    if p.causal:
        keys_total = np.zeros(n)
        for i in range(int(qb.max())):
            live = i < qb
            keys_total = keys_total + np.where(live, _f(_cdiv(np.minimum(S, (i + 1) * bm), bn)) * bn, 0.0)
        keys_max = _f(_cdiv(S, bn)) * bn
    else:
        keys_total = qb * _f(_cdiv(S, bn)) * bn
        keys_max = _f(_cdiv(S, bn)) * bn
    flops = 4.0 * bm * D * keys_total * B * H
    threads = 32 * warps
    smem = (2 * stages * bn + bm) * D * eb
    regs = bm * (D + bn) / threads + REG_OVERHEAD
    bps, fits, reason = m.residency(threads, smem, regs)
    per_sm = _f(_cdiv(programs, c.sms))
    avg_prog = flops / programs
    longest = 4.0 * bm * D * keys_max
    compute_s = np.maximum(per_sm * avg_prog, longest) / (m.peak / c.sms)
    kv_bytes = 2.0 * keys_total * D * eb * B * H
    smem_s = per_sm * (kv_bytes / programs) / c.smem_bw_sm
    compulsory = p.min_bytes()
    conc = np.minimum(programs, c.sms * np.maximum(bps, 1.0))
    inflight = conc * np.maximum(stages - 1, 1) * 2 * bn * D * eb
    l2_bytes = kv_bytes + 2.0 * B * H * S * D * eb
    l2_s = l2_bytes / m.reachable_bw(c.l2_bw, inflight)
    hbm_s = compulsory / m.reachable_bw(c.hbm_bw, inflight)
    return m.finish(n, flops, p.flops(), compute_s, {"L1": kv_bytes, "L2": l2_bytes, "DRAM": np.full(n, compulsory)},
                    {"L1": smem_s, "L2": l2_s, "DRAM": hbm_s}, compulsory, 1, fits, reason,
                    {"wave_eff": programs / (per_sm * c.sms), "log_programs": np.log(programs)})


__all__ = ["GpuCeilings", "GpuEstimate", "GpuModel", "MEM_LATENCY_S", "gpu_ceilings"]
