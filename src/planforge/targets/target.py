"""The Target protocol: everything planforge needs from a place candidates run.

A target is one folder of ``targets/`` (``cpu``, ``replay``, ``table``; later
``cuda``) and one line of ``targets/registry.py``. Workloads, the API and the
CLI ask ``get_target(name)`` for one and use only what ``Target`` declares, so
a new target needs no edits to them, to ``search/`` or to the funnel.

``Ceilings`` is the plain data a target hands the analytic cost model (peak
FLOP/s, bandwidth per level, capacities, call and launch overhead). This
module imports nothing of the stages after it: a target knows nothing of
workloads, strategies or cost models.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ..space import Space
from .base import Backend

LEVELS = ("L1", "L2", "L3", "DRAM")


class TargetError(ValueError):
    """An unknown target, or a request a target cannot serve (a template on a table target...)."""


# a cache level holds data for speed only where it reads at least this many times faster than DRAM (a Zen 4's
# 32 MiB L3 at about 150 GB/s against its DRAM's 61; the Xeon guest's reported L3 at 1.1 times its DRAM's)
CACHE_OVER_DRAM = 1.5


@dataclass(frozen=True)
class Ceilings:
    """What a device can do at best, measured: the numbers analytic cost models read.

    Plain data a target hands the cost model (``Target.ceilings()``), so that
    no cost model reads a device profile's own fields. Levels are named as in
    ``LEVELS``, from the fastest to the slowest; a target whose memory has
    other levels maps them onto these (a GPU: shared memory as L1, L2, HBM
    as DRAM).

    Parameters:
        rate_bits: one-thread (one-core, one-SM) FLOP/s per vector width in bits.
        speedup: all-thread peak over one-thread peak.
        threads: the threads an all-thread run uses.
        bw: per level, per kind ("read", "copy"; optionally "read4": a read of four
            sequential streams per thread at once), (one-thread, all-thread) bytes/s.
        cache: per cache level, (bytes of one instance, instances, threads sharing one).
        call_s: seconds of one call into a compiled kernel.
        launch_s: seconds of one start and join of a team of ``threads`` threads.
        fingerprint: the device's fingerprint (default "").
        registers: vector registers a kernel can keep live (default 16).
        kind: the machine model these figures describe (default "cpu": cores with SIMD
            lanes and a cache hierarchy); a cost model applies its reuse models only to
            ceilings of a kind it knows (a GPU target hands "gpu").
    """

    rate_bits: dict[int, float]
    speedup: float
    threads: int
    bw: dict[str, dict[str, tuple[float, float]]]
    cache: dict[str, tuple[int, int, int]]
    call_s: float
    launch_s: float
    fingerprint: str = ""
    registers: int = 16
    kind: str = "cpu"

    # -- the plain roofline of a whole node (what the e-graph's extraction estimates read) --------------------
    @property
    def peak_flops(self) -> float:
        """All-thread FLOP/s at the widest measured vectors."""
        return max(self.rate_bits.values()) * self.speedup

    @property
    def stream_bandwidth(self) -> float:
        """All-thread read bandwidth of the level a node's operands stream from (L2 where measured, else DRAM)."""
        return self.bw.get("L2", self.bw["DRAM"])["read"][1]

    # -- compute ---------------------------------------------------------------
    def rate_bound(self, lanes) -> np.ndarray:
        """One-thread FLOP/s no code of ``lanes``-wide vectors can exceed: the
        measured rate of the narrowest width at least as wide (wider vectors
        than measured run as several of the widest)."""
        lanes = np.asarray(lanes)
        widths = sorted(self.rate_bits)
        out = np.full(lanes.shape, self.rate_bits[widths[-1]], dtype=float)
        for b in reversed(widths):
            out = np.where(lanes * 32 <= b, self.rate_bits[b], out)
        return out

    def rate_est(self, lanes) -> np.ndarray:
        """Expected one-thread FLOP/s of ``lanes``-wide vectors: the per-lane rate
        of the nearest measured width, times the lanes used."""
        lanes = np.asarray(lanes, dtype=float)
        widths = sorted(self.rate_bits)
        out = np.full(lanes.shape, self.rate_bits[widths[-1]], dtype=float)
        for b in reversed(widths):
            out = np.where(lanes * 32 <= b, self.rate_bits[b] * lanes * 32 / b, out)
        return out

    def scale(self, threads) -> np.ndarray:
        """How many one-thread peaks ``threads`` threads reach together."""
        return np.minimum(np.asarray(threads, dtype=float), self.speedup)

    # -- memory ----------------------------------------------------------------
    def bandwidth(self, level: str, threads, kind: str = "read", streams=1) -> np.ndarray:
        """Bytes/s ``threads`` threads reach at ``level``; a "read" of ``streams`` sequential streams per
        thread at once (a GEMV's K split walks that many regions) is read at the measured one-stream and
        four-stream rates, interpolated in log2(streams) and held past four. Without a "read4" figure
        every read is a one-stream read."""
        one, allt = self.bw[level][kind]
        t = np.asarray(threads, dtype=float)
        if kind == "read" and "read4" in self.bw[level]:
            w = np.clip(np.log2(np.maximum(1.0, np.asarray(streams, dtype=float))) / 2.0, 0.0, 1.0)
            one4, all4 = self.bw[level]["read4"]
            return np.minimum(t * (one + w * (one4 - one)), allt + w * (all4 - allt))
        return np.minimum(t * one, allt)

    def caching_levels(self) -> list[str]:
        """The cache levels that hold data for speed: those whose all-thread read rate is at least
        ``CACHE_OVER_DRAM`` times DRAM's (a level without a measured read counts; none left: every level). A
        virtual machine can report its host's last level and read it at DRAM's rate (a 2-CPU Xeon guest: 480 MiB
        of L3 at 34.7 GB/s against 31.4), and then what outgrows its L2s comes from memory whatever the L3's size."""
        dram = self.bw.get("DRAM", {}).get("read")

        def fast(level: str) -> bool:
            read = self.bw.get(level, {}).get("read")
            return dram is None or read is None or read[1] >= CACHE_OVER_DRAM * dram[1]

        return [level for level in self.cache if fast(level)] or list(self.cache)

    def capacity(self, level: str, threads=1) -> np.ndarray:
        """Bytes of ``level`` that ``threads`` threads have between them."""
        size, inst, share = self.cache[level]
        return size * np.minimum(inst, np.ceil(np.asarray(threads, dtype=float) / share))

    def per_thread(self, level: str, threads) -> np.ndarray:
        """Bytes of one instance of ``level`` left to each thread sharing it."""
        size, inst, share = self.cache[level]
        return size / np.minimum(share, np.maximum(1, np.asarray(threads, dtype=float)))

    def home(self, nbytes, threads, per_thread: bool = False) -> np.ndarray:
        """Index into ``LEVELS`` of the fastest level holding ``nbytes`` (of each
        thread when ``per_thread``, else of them all)."""
        nbytes = np.asarray(nbytes, dtype=float)
        out = np.full(np.broadcast(nbytes, np.asarray(threads)).shape, LEVELS.index("DRAM"))
        for i in reversed(range(len(LEVELS) - 1)):
            lvl = LEVELS[i]
            if lvl in self.cache:
                cap = self.per_thread(lvl, threads) if per_thread else self.capacity(lvl, threads)
                out = np.where(nbytes <= cap, i, out)
        return out

    def memory_bound(self, nbytes, threads, cold: bool) -> np.ndarray:
        """Seconds the compulsory traffic ``nbytes`` needs at least. Every byte
        passes through L1; with hot caches, the bytes that cannot sit in the
        levels above a level come from it or below it; with cold caches they
        all come from DRAM. Each at no more than the level's best bandwidth;
        the bound is the largest of these times."""
        nbytes = np.asarray(nbytes, dtype=float)
        t = np.zeros(np.broadcast(nbytes, np.asarray(threads)).shape)
        above = np.zeros_like(t)
        for lvl in LEVELS:
            if lvl not in self.bw:
                continue
            must = nbytes if cold else np.maximum(0.0, nbytes - above)
            fastest = np.maximum.reduce([self.bandwidth(lvl, threads, k) for k in self.bw[lvl]])
            t = np.maximum(t, must / fastest)
            if lvl in self.cache:
                above = above + self.capacity(lvl, threads)
        return t

    def bandwidth_at(self, level_idx, threads) -> np.ndarray:
        """Read bandwidth of the level each entry of ``level_idx`` (into ``LEVELS``) names."""
        level_idx = np.asarray(level_idx)
        out = np.zeros(level_idx.shape)
        for i, lvl in enumerate(LEVELS):
            if lvl in self.bw:
                out = np.where(level_idx == i, self.bandwidth(lvl, threads), out)
        return np.where(out > 0, out, self.bandwidth("DRAM", threads))



class RunnablePlan(Protocol):
    """A plan built for a device, called on a graph's inputs (numpy arrays) in order.

    ``plan(*inputs)`` checks the inputs' shapes; ``run_on(*inputs)`` trusts
    them (the caller checked); both return the outputs as fresh arrays;
    ``feed(*inputs)`` is ``run_on`` returning the plan's own output buffers,
    valid until its next call (a chain of plans hands them on without a copy).
    ``output_classes`` names the outputs; ``single()`` is the hot path of a
    one-input, one-output plan: ``f(x) -> y`` with everything bound."""

    output_classes: list[str]

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]: ...

    def run_on(self, *inputs: np.ndarray) -> list[np.ndarray]: ...

    def feed(self, *inputs: np.ndarray) -> list[np.ndarray]: ...

    def single(self) -> Callable[[np.ndarray], np.ndarray]: ...


class Target(Protocol):
    """Where a workload's candidates are built and measured.

    Attributes:
        name: the registry name (``"cpu"``); specs record it as ``target.backend``.
        pin_cores: executor hint: True when a measuring slot should own and pin
            physical cores (the CPU), False when measuring takes no core of this
            machine (a table lookup, a recording, a GPU whose host thread waits).
    The device side:
        cold: whether the measurement protocol starts every timed call with cold
            caches (it flushes them between repeats); cost models predict for that.
        fingerprint: identifies the device cheaply (no measurement): times
            measured under different fingerprints are never compared.
        profile(force, quick, progress): the measured device profile (cached;
            ``quick`` None follows ``PLANFORGE_PROBE=quick``), None for a target
            that measures no device.
        facts(profile): the profile as labelled lines for ``planforge probe``.
        ceilings(): the analytic ceilings (None when there is no device to model).
    The template side (TargetError where the target runs no templates):
        problem(op, dims, epilogue): a validated kernel problem for one of its templates.
        knob_space(problem) / default_knobs(problem): a template node's knobs, and the
            setting tried first.
        flops(problem): the problem's useful FLOPs.
        input_shapes(problem): the shape of each of the problem's inputs, by name.
        libraries(): the library baselines measured beside a tuned kernel.
    The makers of backends:
        kernel_backend(problem, seed, constant_weights, cold_weights): measures candidates of one template
            problem (``constant_weights``: its weight operand is a plan's constant, prepared once when bound;
            ``cold_weights``: timed with that operand out of the caches, as in a large model's whole call).
        graph_backend(graph, genome, seed, accuracy, cold_weights): measures whole plans of ``genome``.
        peak_bytes(graph, program): the memory a plan holds while it runs, without building it.
        plan(graph, program, inputs, shared): a tuned plan (a spec's program; None: the library baseline)
            built for this device (a ``RunnablePlan``); ``TargetError`` when a step does
            not build here.
    """

    name: str
    pin_cores: bool

    @property
    def cold(self) -> bool: ...

    @property
    def fingerprint(self) -> str: ...

    def describe(self) -> dict[str, Any]: ...

    def profile(self, force: bool = False, quick: bool | None = None,
                progress: Callable[[str], None] | None = None) -> Any: ...

    def facts(self, profile: Any) -> list[tuple[str, str]]: ...

    def ceilings(self) -> Ceilings | None: ...

    def problem(self, op: str, dims: Sequence[int], epilogue: str = "none") -> Any: ...

    def knob_space(self, problem: Any) -> Space: ...

    def default_knobs(self, problem: Any) -> dict[str, Any]: ...

    def flops(self, problem: Any) -> float: ...

    def input_shapes(self, problem: Any) -> dict[str, list[int]]: ...

    def libraries(self) -> list[str]: ...

    def kernel_backend(self, problem: Any, seed: int = 0, constant_weights: bool = False,
                       cold_weights: bool = False) -> Backend:
        """Measures settings of ``problem``'s kernel. ``constant_weights``: its weight operand is a constant of a
        model's plan, which a kernel may prepare once when the plan is loaded (a GEMM packs B into panels), so
        that the preparation is not timed; default False: every operand is an input of each call.
        ``cold_weights``: time each call with the weights out of the caches and the activation in them, as a
        step of a model whose weights the caches cannot hold runs in the model's whole call (default False:
        hot; a target whose caches play no such part ignores it)."""

    def graph_backend(self, graph: Any, genome: Any, seed: int = 0, accuracy: dict | None = None,
                      cold_weights: bool = False) -> Backend:
        """``accuracy``: the budget a plan with quantised weights is judged by (``quant.Accuracy.to_json()``;
        None: fp32 weights only); a target whose templates read fp32 only refuses one. ``cold_weights``: as
        ``kernel_backend``'s, for a part of a larger model (its inputs hot, its weights out of the caches)."""

    def peak_bytes(self, graph: Any, program: list[dict[str, Any]]) -> int: ...

    def plan(self, graph: Any, program: list[dict[str, Any]] | None,
             inputs: dict[str, Any] | None = None, shared: Any = None) -> RunnablePlan:
        """``inputs``: arrays (by input name) that will hold those inputs whenever the plan runs (an earlier
        part's ``out_views`` in a chain), which the plan may read in place instead of copying; a target may
        ignore them (default None). ``shared``: a region the plans of one chain's parts share for the values
        that live within a part (``targets.cpu.plan.SharedArena``); a target may ignore it (default None)."""


class Lookup:
    """The template side of a target that measures by looking results up (``table``, ``replay``).

    It has no device of its own to probe or model and compiles nothing, so
    every template and backend request is a ``TargetError`` that says what the
    target does instead. A subclass sets ``name``, ``pin_cores`` and ``does``
    (what it measures, for those messages)."""

    name: str
    pin_cores: bool = False
    does: str = ""

    def _refuse(self, what: str) -> TargetError:
        return TargetError(f"target {self.name!r} has no {what}: it {self.does}")

    @property
    def cold(self) -> bool:
        return False  # a recorded time was measured however it was measured; nothing is timed here

    @property
    def fingerprint(self) -> str:
        # each table or recording carries its own device; its backend's fingerprint names it
        return self.name

    def profile(self, force: bool = False, quick: bool | None = None,
                progress: Callable[[str], None] | None = None) -> None:
        return None

    def facts(self, profile: Any) -> list[tuple[str, str]]:
        return [("target", f"it {self.does}")]

    def ceilings(self) -> None:
        return None

    def problem(self, op: str, dims: Sequence[int], epilogue: str = "none") -> Any:
        raise self._refuse(f"kernel templates (asked for {op})")

    def knob_space(self, problem: Any) -> Space:
        raise self._refuse("kernel templates")

    def default_knobs(self, problem: Any) -> dict[str, Any]:
        raise self._refuse("kernel templates")

    def flops(self, problem: Any) -> float:
        raise self._refuse("kernel templates")

    def input_shapes(self, problem: Any) -> dict[str, list[int]]:
        raise self._refuse("kernel templates")

    def libraries(self) -> list[str]:
        return []

    def kernel_backend(self, problem: Any, seed: int = 0, constant_weights: bool = False,
                       cold_weights: bool = False) -> Backend:
        raise self._refuse("kernel backend")

    def graph_backend(self, graph: Any, genome: Any, seed: int = 0, accuracy: dict | None = None,
                      cold_weights: bool = False) -> Backend:
        raise self._refuse("plan backend")

    def peak_bytes(self, graph: Any, program: list[dict[str, Any]]) -> int:
        raise self._refuse("plans")

    def plan(self, graph: Any, program: list[dict[str, Any]] | None,
             inputs: dict[str, Any] | None = None, shared: Any = None) -> RunnablePlan:
        raise self._refuse("runnable plans")
