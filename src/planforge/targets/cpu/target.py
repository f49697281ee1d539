"""The CPU Target: this machine's probe, the C templates, and the kernel and plan backends.

Everything outside ``targets/cpu/`` reaches the templates (``templates/``), the
probe (``probe.py``) and the backends (``kernel.py``, ``graph.py``) through
this object, so a change inside them touches this file and no caller.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from ...measure import TimingConfig
from ...space import Space
from ..target import LEVELS, Ceilings, TargetError
from . import templates
from .probe import DeviceProfile, get_profile, hardware

_CACHE_OF = {"L1": "L1d", "L2": "L2", "L3": "L3"}


def quick_probe() -> bool:
    """Whether ``PLANFORGE_PROBE=quick`` asks for a quick profile (tests and CI set it)."""
    return os.environ.get("PLANFORGE_PROBE", "") == "quick"


def ceilings_of(profile: DeviceProfile, launch_s: float | None = None) -> Ceilings:
    """The analytic ceilings of a CPU profile.

    Parameters:
        profile: a measured ``DeviceProfile``.
        launch_s: seconds of one OpenMP fork and join of the profile's threads
            (default None: measured once per machine and cached, see ``launch.py``;
            0 on one thread or without OpenMP).
    Raises ``TargetError`` when the profile has no DRAM bandwidth (every bound needs it).
    """
    from .launch import launch_overhead

    rates = {int(b): float(r) for b, r in profile.peak_flops_1t_by_bits.items() if r and r > 0}
    if not rates:
        rates = {int(profile.peak_bits): float(profile.peak_flops_1t)}
    threads = max(1, int(profile.threads))
    bw: dict[str, dict[str, tuple[float, float]]] = {}
    for lvl in LEVELS:
        one = profile.bandwidth_1t.get(lvl, {})
        allt = profile.bandwidth.get(lvl, {})
        kinds = {}
        for kind in ("read", "copy", "read4"):
            if one.get(kind):
                kinds[kind] = (float(one[kind]), float(allt.get(kind) or one[kind]))
        if kinds.keys() & {"read", "copy"}:
            kinds.setdefault("read", kinds.get("copy"))
            kinds.setdefault("copy", kinds["read"])
            bw[lvl] = kinds
    if "DRAM" not in bw:
        raise TargetError(f"device profile {profile.fingerprint} has no DRAM bandwidth; run `planforge probe --force`")
    cache = {}
    for lvl, name in _CACHE_OF.items():
        c = profile.caches.get(name)
        if c is not None and lvl in bw:
            size, inst, share = int(c.bytes), max(1, int(c.instances)), max(1, int(c.shared_by))
            held = profile.held_bytes.get(lvl)
            if held:  # what the probe found it keeps hitting, over the instances its threads reach
                size = min(size, int(held) // min(inst, math.ceil(threads / share)))
            cache[lvl] = (size, inst, share)
    if launch_s is None:
        launch_s = launch_overhead(profile.fingerprint, threads, profile.quick) if profile.openmp else 0.0
    return Ceilings(rates, max(1.0, profile.peak_flops_all / profile.peak_flops_1t), threads, bw, cache,
                    float(profile.call_overhead_s), float(launch_s), profile.fingerprint,
                    templates.limits(profile).vector_registers)


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _problem_of(p: dict[str, Any]):
    """A spec's serialised problem: a template ``Problem`` or a fused MLP's ``MlpProblem``."""
    return templates.problem_from_json(p)


@dataclass
class _LibraryPlan:
    """The numpy baseline of a graph as a plan (what a spec that fell back to it runs)."""

    fn: Callable[..., list]
    output_classes: list[str]

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        return self.fn(*inputs)

    def run_on(self, *inputs: np.ndarray) -> list[np.ndarray]:
        return self.fn(*inputs)

    def feed(self, *inputs: np.ndarray) -> list[np.ndarray]:
        return self.fn(*inputs)

    def single(self) -> Callable[[np.ndarray], np.ndarray]:
        fn = self.fn
        return lambda x: fn(x)[0]


@dataclass
class CpuTarget:
    """The CPU of this machine: C templates built with the system compiler, measured in isolated,
    pinned worker processes.

    Parameters:
        pinned: a ``DeviceProfile`` to use instead of this machine's cached one
            (tests pin the session's; default None: ``get_profile``, quick when
            ``PLANFORGE_PROBE=quick``). The profile is read once per target object.
        timing: the measurement protocol of its backends (default ``TimingConfig()``).
    """

    pinned: DeviceProfile | None = None
    timing: TimingConfig = field(default_factory=TimingConfig)
    name: str = "cpu"
    pin_cores: bool = True  # a measurement owns its cores: another process on them would be timed too
    _ceilings: Ceilings | None = field(default=None, init=False, repr=False)
    _limits: Any = field(default=None, init=False, repr=False)

    def __post_init__(self):
        # the kernels' shared pool reads PLANFORGE_POOL_SPIN_US when a plan or a measuring worker first opens a
        # library: a bad value is refused here, before any measurement, not as every kernel's failure
        from .templates.parfor import PoolError, spin_us

        try:
            spin_us()
        except PoolError as e:
            raise TargetError(str(e)) from None

    # -- the device ----------------------------------------------------------------
    @property
    def cold(self) -> bool:
        return self.timing.flush_bytes > 0

    @property
    def fingerprint(self) -> str:
        # the hardware facts alone (no measuring): enough to tell machines apart
        return self.pinned.fingerprint if self.pinned is not None else hardware().fingerprint

    def profile(self, force: bool = False, quick: bool | None = None,
                progress: Callable[[str], None] | None = None) -> DeviceProfile:
        """This machine's profile: cached, or measured and cached (``force`` measures again; ``quick``
        None follows ``PLANFORGE_PROBE``; ``progress`` gets a label before each probe step)."""
        if self.pinned is None or force:
            self.pinned = get_profile(force=force, quick=quick_probe() if quick is None else quick, progress=progress)
            self._ceilings = self._limits = None
        return self.pinned

    def describe(self) -> dict[str, Any]:
        return {"target": self.name, "fingerprint": self.fingerprint, "templates": sorted(templates.TEMPLATES),
                "libraries": self.libraries()}

    def facts(self, profile: DeviceProfile) -> list[tuple[str, str]]:
        prof = profile
        clock = f", reported clock {prof.nominal_clock_hz / 1e9:.2f} GHz" if prof.nominal_clock_hz else ""
        widths = ", ".join(f"{b}-bit {v / 1e9:.1f}"
                           for b, v in sorted(prof.peak_flops_1t_by_bits.items(), key=lambda x: -int(x[0])))
        held = {_CACHE_OF[lvl]: b for lvl, b in prof.held_bytes.items() if lvl in _CACHE_OF}
        caches = ", ".join(f"{name} {_size(c.bytes)} x{c.instances} " +
                           ("(private)" if c.shared_by == 1 else f"(shared by {c.shared_by})") +
                           (f", holds about {_size(held[name])} in use" if name in held else "")
                           for name, c in prof.caches.items()) or "unknown"
        load = "unknown" if prof.other_load is None else (
            f"{prof.other_load:.0%} of all CPUs used by other processes while measuring" +
            (": figures may be low" if prof.measured_busy else ""))
        return [
            ("CPU", f"{prof.cpu_model} ({prof.arch}{clock})"),
            ("ISA", f"{' '.join(prof.isa) or '-'}; {prof.vector_lanes_fp32} fp32 lanes"),
            ("cores", f"{prof.logical_cores} logical, {prof.physical_cores} physical; all-thread runs use "
                      f"{prof.threads}"),
            ("caches", caches),
            ("memory", _size(prof.memory_bytes) if prof.memory_bytes else "unknown"),
            ("peak fp32", f"{prof.peak_flops_1t / 1e9:.1f} GFLOP/s on 1 thread ({widths}), "
                          f"{prof.peak_flops_all / 1e9:.1f} on {prof.threads}"),
            ("call overhead", f"{prof.call_overhead_s * 1e9:.0f} ns per ctypes call"),
            ("measured", f"{prof.measured_at} in {prof.probe_seconds:.1f} s{' (quick)' if prof.quick else ''}; "
                         f"{prof.compiler}{'' if prof.openmp else ', no OpenMP'}"),
            ("other load", load),
        ]

    def ceilings(self) -> Ceilings:
        if self._ceilings is None:
            self._ceilings = ceilings_of(self.profile())
        return self._ceilings

    # -- the templates ---------------------------------------------------------------
    def limits(self) -> templates.Limits:
        """The template-facing view of the profile (vector lanes, registers, cores, cache bytes)."""
        if self._limits is None:
            self._limits = templates.limits(self.profile())
        return self._limits

    def problem(self, op: str, dims: Sequence[int], epilogue: str = "none") -> templates.Problem:
        if op not in templates.TEMPLATES:
            raise TargetError(f"target 'cpu' has no template for op {op!r}; its templates: "
                              f"{', '.join(sorted(templates.TEMPLATES))}")
        return templates.Problem(op, tuple(int(d) for d in dims), epilogue)

    def knob_space(self, problem) -> Space:
        return templates.knob_space(problem, self.limits())

    def quant_variants(self, problem) -> tuple[str, ...]:
        """The quantised variants ``problem``'s template runs here (``planforge.quant.variant``: fp32, bf16, int8,
        int8+a8 where there is VNNI or AVX2, int4:32...; fp32 alone for most templates)."""
        return templates.quant_variants(problem, self.limits())

    def quant_space(self, problem, variants: Sequence[str]) -> Space:
        """The knob space of ``problem`` with the weight format as a gene, among ``variants``."""
        return templates.quant_space(problem, self.limits(), tuple(variants))

    def variant_errors(self, problem, variants: Sequence[str], seed: int, metric) -> dict[str, float]:
        """Each variant's error on ``problem`` before any kernel runs (``qcheck.variant_errors``)."""
        from .qcheck import variant_errors

        return variant_errors(problem, templates.TEMPLATES[problem.op], tuple(variants), seed, metric)

    def validation_output(self, problem, knobs: dict[str, Any], seed: int) -> tuple[np.ndarray, np.ndarray]:
        """The kernel of ``knobs`` run on ``problem``'s inputs of ``seed``, and the fp64 reference (``qcheck``)."""
        from .qcheck import validation_output

        return validation_output(problem, templates.TEMPLATES[problem.op], knobs, seed)

    def default_knobs(self, problem) -> dict[str, Any]:
        return templates.default_knobs(problem, self.limits())

    def flops(self, problem) -> float:
        return templates.flops(problem)

    def input_shapes(self, problem) -> dict[str, list[int]]:
        return {k: list(v.shape) for k, v in templates.make_inputs(problem, 0, shapes_only=True).items()}

    def libraries(self) -> list[str]:
        return list(templates.available_libraries())

    # -- the backends ------------------------------------------------------------------
    def kernel_backend(self, problem, seed: int = 0, constant_weights: bool = False, cold_weights: bool = False):
        """A ``TargetError`` at once for a problem no kernel workload measures (a fused MLP, which runs inside a
        plan only), not a failure per measured setting."""
        from .kernel import CpuBackend
        from .templates.problem import ProblemError, facts

        try:
            facts(problem)
        except ProblemError as e:
            raise TargetError(str(e)) from None

        return CpuBackend(problem, templates.TEMPLATES[problem.op], self.profile(), timing=self._timing(cold_weights),
                          seed=seed, constant_weights=constant_weights)

    def graph_backend(self, graph, genome, seed: int = 0, accuracy: dict | None = None, cold_weights: bool = False):
        """``accuracy``: the budget plans with quantised weights are judged by (``Accuracy.to_json()``)."""
        from .graph import GraphBackend

        return GraphBackend(graph, genome, self.profile(), timing=self._timing(cold_weights), seed=seed,
                            accuracy=accuracy)

    def _timing(self, cold_weights: bool) -> TimingConfig:
        """This target's timing; with ``cold_weights`` (and hot caches otherwise), each sample after a scrub of
        twice the bytes of the caches that read faster than memory (``Ceilings.caching_levels``: reading a guest's
        480 MiB L3 that streams at DRAM's rate twice over took 30 ms a sample) that leaves the activations in them
        (``scrub.py``)."""
        if not cold_weights or self.cold or self.timing.scrub_bytes:
            return self.timing
        from .scrub import scrub_bytes

        fast = self.ceilings().caching_levels()
        caches = {name: c for lvl, name in _CACHE_OF.items() if lvl in fast
                  for c in [self.profile().caches.get(name)] if c is not None}
        return replace(self.timing, scrub_bytes=scrub_bytes(caches))

    def peak_bytes(self, graph, program: list[dict[str, Any]]) -> int:
        from .plan import peak_bytes_of

        return peak_bytes_of(program, graph)

    def plan(self, graph, program: list[dict[str, Any]] | None, inputs: dict[str, Any] | None = None,
             shared=None):
        """``program`` (a spec's steps) compiled here and bound to ``graph``'s weights; None: the numpy
        baseline. ``TargetError`` names the first step that does not compile. ``inputs``: arrays the plan
        reads those inputs from in place; ``shared``: a chain's ``SharedArena`` (``Plan``'s; default None)."""
        from . import plan as plan_mod
        from .build import build_many
        from .graph import numpy_forward, template_source
        from .plan import Plan
        from .templates.scratch import Pages, huge_pages

        if program is None:
            return _LibraryPlan(numpy_forward(graph), list(graph.outputs))
        problems = {s["cls"]: _problem_of(s["problem"]) for s in program if s.get("problem") is not None}
        knobs = {s["cls"]: s["knobs"] for s in program if s.get("problem") is not None}
        items = list(problems.items())
        built = build_many([template_source(p, knobs[c]) for c, p in items])
        libs = {}
        for (c, _), (b, err, _log) in zip(items, built):
            if b is None:
                raise TargetError(f"step {c} does not compile here: {err}")
            libs[c] = str(b.path)
        pages = (shared.pages if shared is not None else Pages()) if plan_mod.HUGE_PAGES else None
        with huge_pages(pages):  # its packed weights and arenas in huge pages
            return Plan(graph, program, libs, problems, inputs=inputs, shared=shared)


__all__ = ["CpuTarget", "ceilings_of", "quick_probe"]
