"""Weights cold, activations hot: measuring a large model's kernels and parts in its whole call's cache state
(``targets/cpu/scrub.py``, ``TimingConfig.scrub_bytes``, ``workloads.models.weights_cold``)."""
from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from planforge.ir import ZOO
from planforge.measure import TimingConfig
from planforge.targets import Ceilings, get_target
from planforge.targets.cpu.scrub import scrub_bytes, scrubber
from planforge.targets.cpu.templates import TEMPLATES, Problem, limits
from planforge.workloads.models import weights_cold

FEW = TimingConfig(warmup_s=0.0, budget_s=0.0, min_repeats=4, max_repeats=4)


def _ceilings(cache: dict, threads: int = 2, kind: str = "cpu") -> Ceilings:
    return Ceilings(rate_bits={256: 1e10}, speedup=2.0, threads=threads, bw={}, cache=cache, call_s=1e-7,
                    launch_s=1e-6, kind=kind)


def _counting(monkeypatch, module):
    """Replace ``module.scrubber`` by the real one that also counts its calls; the list of counts per scrubber."""
    calls: list[int] = []
    real = module.scrubber

    def make(nbytes, threads, warm):
        fn = real(nbytes, threads, warm)
        assert fn is not None, "the scrub does not build here"
        calls.append(0)
        k = len(calls) - 1

        def counted():
            calls[k] += 1
            fn()
        return counted
    monkeypatch.setattr(module, "scrubber", make)
    return calls


def test_scrub_bytes_covers_twice_every_cache_and_the_scrubber_runs():
    from planforge.targets.cpu.probe import CacheLevel

    caches = {"L1": CacheLevel(32 << 10, 1, 2), "L2": CacheLevel(1 << 20, 1, 2), "L3": CacheLevel(32 << 20, 2, 1)}
    assert scrub_bytes(caches) == 2 * (2 * (32 << 10) + 2 * (1 << 20) + (32 << 20))
    assert scrub_bytes({}) == 8 << 20  # no caches read: still a scrub
    warm = [np.arange(1001, dtype=np.float32), np.zeros((3, 5), np.float32)[:, ::2], np.zeros(0, np.float32)]
    fn = scrubber(2 << 20, 2, warm)  # an odd size, a strided view (not read back) and an empty array
    assert fn is not None
    for _ in range(3):
        fn()


def test_weights_are_cold_when_the_model_outgrows_half_the_last_cache_level():
    g = ZOO["policy-mlp"]()
    w = g.param_bytes()
    cache = {"L2": (w // 4, 2, 1), "L3": (w, 1, 2)}  # the last level holds the weights, but not twice over
    assert weights_cold(g, SimpleNamespace(ceilings=lambda: _ceilings(cache)))
    big = {"L2": (w // 4, 2, 1), "L3": (2 * w + 2, 1, 2)}
    assert not weights_cold(g, SimpleNamespace(ceilings=lambda: _ceilings(big)))
    assert not weights_cold(g, SimpleNamespace(ceilings=lambda: None))  # nothing to model: hot
    assert not weights_cold(g, SimpleNamespace(ceilings=lambda: _ceilings(cache, kind="gpu")))


def test_a_last_level_that_reads_no_faster_than_memory_holds_no_weights():
    """A guest's reported L3 read at DRAM's rate: the weights are cold once they outgrow the L2s, not the L3."""
    g = ZOO["policy-mlp"]()
    w = g.param_bytes()
    cache = {"L2": (w // 2, 2, 1), "L3": (100 * w, 1, 2)}  # the L2s hold the weights once, the L3 fifty times over
    slow = {"L2": {"read": (1e11, 2e11)}, "L3": {"read": (1.6e10, 3.4e10)}, "DRAM": {"read": (1.6e10, 3.1e10)}}
    fast = {**slow, "L3": {"read": (5e10, 1.5e11)}}
    assert weights_cold(g, SimpleNamespace(ceilings=lambda: replace(_ceilings(cache), bw=slow)))
    assert not weights_cold(g, SimpleNamespace(ceilings=lambda: replace(_ceilings(cache), bw=fast)))
    roomy = {"L2": (2 * w + 2, 2, 1), "L3": (100 * w, 1, 2)}  # the L2s alone hold the weights twice over: hot
    assert not weights_cold(g, SimpleNamespace(ceilings=lambda: replace(_ceilings(roomy), bw=slow)))


def test_a_cpu_backend_for_cold_weights_scrubs_and_a_cold_target_keeps_its_flush(profile):
    t = get_target("cpu")
    p = Problem("gemm", (8, 64, 48), "bias")
    hot, cold = t.kernel_backend(p), t.kernel_backend(p, constant_weights=True, cold_weights=True)
    try:
        fast = {name: c for name, c in t.profile().caches.items()
                if {"L1d": "L1"}.get(name, name) in t.ceilings().caching_levels()}
        assert hot.timing.scrub_bytes == 0 and cold.timing.scrub_bytes == scrub_bytes(fast)
        assert cold.timing.flush_bytes == 0
    finally:
        hot.close(), cold.close()
    flushing = type(t)(timing=TimingConfig(flush_bytes=1 << 20))  # all caches cold already: nothing to add
    assert flushing._timing(True) == flushing.timing


def test_the_scrub_reads_only_the_caches_that_read_faster_than_memory(profile):
    """A guest's 480 MiB L3 read at DRAM's rate is not read through before each sample (a gigabyte a sample); a
    fast one is."""
    from planforge.targets.cpu.probe import CacheLevel

    caches = {"L1d": CacheLevel(48 << 10, 1, 2), "L2": CacheLevel(2 << 20, 1, 2), "L3": CacheLevel(480 << 20, 2, 1)}
    dram = profile.bandwidth["DRAM"]
    for l3, want in ((1.1, scrub_bytes({k: caches[k] for k in ("L1d", "L2")})), (3.0, scrub_bytes(caches))):
        bw = {**profile.bandwidth, "L3": {k: l3 * x for k, x in dram.items()}}
        bw1 = {**profile.bandwidth_1t, "L3": {k: l3 * x for k, x in profile.bandwidth_1t["DRAM"].items()}}
        t = type(get_target("cpu"))()
        t.pinned = replace(profile, caches=caches, held_bytes={}, bandwidth=bw, bandwidth_1t=bw1)
        assert t._timing(True).scrub_bytes == want


def test_a_kernel_timed_with_cold_weights_is_scrubbed_before_every_sample(profile, monkeypatch):
    from planforge.targets.cpu import job
    from planforge.targets.cpu.build import build
    from planforge.targets.cpu.kernel import CpuBackend

    calls = _counting(monkeypatch, job)
    p = Problem("gemm", (9, 40, 33), "bias")
    knobs = dict(TEMPLATES["gemm"].defaults(p, limits(profile)), pack_b=1, threads=2)
    be = CpuBackend(p, TEMPLATES["gemm"], profile, timing=replace(FEW, scrub_bytes=1 << 20), constant_weights=True)
    try:
        got = job.run_job(be._job("kernel", knobs, str(build(TEMPLATES["gemm"].source(p, knobs)).path)))
    finally:
        be.close()
    assert got["status"] == "ok" and len(got["times"]) == 4 and calls == [4]  # one scrub before each sample
    hot = CpuBackend(p, TEMPLATES["gemm"], profile, timing=FEW, constant_weights=True)
    try:
        got = job.run_job(hot._job("kernel", knobs, str(build(TEMPLATES["gemm"].source(p, knobs)).path)))
    finally:
        hot.close()
    assert got["status"] == "ok" and calls == [4]  # hot: no scrub


def test_a_part_of_a_model_is_timed_with_cold_weights_through_its_backend(profile, monkeypatch):
    """A task built as a part (``shared``) of a model whose weights are cold measures its plans after a scrub;
    the same graph as a whole model (measured call after call, in that state already) does not."""
    from planforge.targets.cpu import graph as cpu_graph
    from planforge.workloads.measured import Measured
    from planforge.workloads.models import graph_task

    calls = _counting(monkeypatch, cpu_graph)
    from planforge.targets.cpu.target import CpuTarget

    t = CpuTarget(pinned=profile, timing=FEW)
    g = ZOO["policy-mlp"]()
    part = graph_task(g, "part0", t, 1 << 30, shared=True, cold_weights=True, measured=Measured(trials=0))
    whole = graph_task(g, "graph", t, 1 << 30, cold_weights=True, measured=Measured(trials=0))
    assert part.info["weights_cold"] and whole.info["weights_cold"]
    assert part.backend.timing.scrub_bytes > 0 and whole.backend.timing.scrub_bytes == 0
    try:
        built = part.backend._build(part.seeds[:1])[0]
        got = cpu_graph.run_plan_job(part.backend._job("plan", *built))
    finally:
        part.backend.close(), whole.backend.close()
    assert got["status"] == "ok" and calls == [len(got["times"])] and len(got["times"]) == 4


def test_the_kernels_of_a_cold_model_are_measured_cold_and_only_those_with_constant_weights():
    from planforge.workloads.measured import Measured, measure_first_settings
    from planforge.space import Knob, Space
    from planforge.outcome import Outcome

    log = []

    class Target:
        def knob_space(self, problem):
            return Space([Knob("tile", (0, 1), "categorical")])

        def kernel_backend(self, problem, seed=0, constant_weights=False, cold_weights=False):
            log.append((problem, constant_weights, cold_weights))
            return SimpleNamespace(measure=lambda cs: [Outcome.measured([1e-3] * 3) for _ in cs],
                                   remeasure=lambda cs, libraries=None, rounds=3: (
                                       [Outcome.measured([1e-3] * 3 * rounds) for _ in cs], {}),
                                   close=lambda: None)

    g = SimpleNamespace(problems={"w": "gemm-a", "x": "gemm-b"}, strata_firsts={}, configs={n: [{"tile": 0}, {"tile": 1}] for n in "wx"},
                        predicted={"w": 2.0, "x": 1.0})
    measure_first_settings(g, Target(), {"w": {}, "x": {}}, 1, Measured(trials=2), constant=lambda n: n == "w",
                           cold=True)
    # each problem's backend three times (its first settings, their second pass, then the race of the two, which
    # tie), the same way every time
    assert sorted(log) == [("gemm-a", True, True)] * 3 + [("gemm-b", False, False)] * 3


def test_a_small_zoo_model_stays_hot():
    from planforge.workloads.models import graph_workload

    wl = graph_workload(ZOO["policy-mlp"](), "policy-mlp", kernel_trials=0)
    assert not any(t.info["weights_cold"] for t in wl.tasks)
    assert "out of the caches" not in wl.description
