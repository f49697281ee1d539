"""The Target interface: the registry, the CPU target's view of its profile, the lookup targets'
refusals, workloads on a target, and a new target plugged in by one registry entry."""
import dataclasses
import hashlib
import inspect

import pytest

from planforge.targets import TARGETS, Ceilings, Target, TargetError, get_target
from planforge.targets.cpu.target import CpuTarget, ceilings_of
from planforge.targets.table import TableBackend
from planforge.workloads import WorkloadError, load_workload


def _members(protocol) -> set[str]:
    names = {n for n in protocol.__annotations__}
    names |= {n for n, v in vars(protocol).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_registered_target_has_every_member_of_the_protocol(name):
    t = get_target(name)
    assert t.name == name and isinstance(t.pin_cores, bool)
    missing = sorted(m for m in _members(Target) if not hasattr(t, m))
    assert not missing, f"target {name!r} lacks {missing}"
    for m in _members(Target) - {"name", "pin_cores", "cold", "fingerprint"}:  # same parameters as the protocol declares
        want = list(inspect.signature(getattr(Target, m)).parameters)[1:]
        assert list(inspect.signature(getattr(t, m)).parameters) == want, (name, m)
    assert isinstance(t.fingerprint, str) and t.fingerprint
    assert t.describe()["target"] == name


def test_unknown_target_lists_the_known_ones():
    with pytest.raises(TargetError, match=r"target 'tpu' is not available; known targets: cpu, cuda, replay, table"):
        get_target("tpu")
    t = CpuTarget()
    assert get_target(t) is t and get_target(None).name == "cpu"


@pytest.mark.parametrize("name", ["table", "replay"])
def test_lookup_targets_refuse_templates_and_say_what_they_do(name):
    t = get_target(name)
    assert t.profile() is None and t.ceilings() is None and t.libraries() == [] and not t.pin_cores
    for call in (lambda: t.problem("gemm", (2, 2, 2)), lambda: t.knob_space(None), lambda: t.kernel_backend(None),
                 lambda: t.graph_backend(None, None), lambda: t.plan(None, []), lambda: t.peak_bytes(None, [])):
        with pytest.raises(TargetError, match=f"target '{name}' has no .*: it measures by looking candidates up"):
            call()


def test_cpu_target_hands_the_cost_model_its_profiles_ceilings(profile, lim):
    t = CpuTarget(profile)
    assert t.profile() is profile and t.fingerprint == profile.fingerprint and t.pin_cores
    c = t.ceilings()
    assert isinstance(c, Ceilings) and c.fingerprint == profile.fingerprint
    assert max(c.rate_bits.values()) == pytest.approx(profile.peak_flops_1t)
    assert c.threads == profile.threads and c.call_s == profile.call_overhead_s
    assert c.speedup == pytest.approx(max(1.0, profile.peak_flops_all / profile.peak_flops_1t))
    assert c.bw["DRAM"]["read"] == (profile.bandwidth_1t["DRAM"]["read"], profile.bandwidth["DRAM"]["read"])
    assert c.cache["L1"][0] == profile.caches["L1d"].bytes and c.registers == lim.vector_registers
    assert t.limits() == lim and "numpy" in t.libraries()
    # launch overhead: none on one thread, taken as given when the caller knows it
    assert ceilings_of(profile, launch_s=2e-6).launch_s == 2e-6
    one = dataclasses.replace(profile, openmp=False)
    assert ceilings_of(one).launch_s == 0.0
    no_dram = dataclasses.replace(profile, bandwidth={}, bandwidth_1t={})
    with pytest.raises(TargetError, match="no DRAM bandwidth"):
        ceilings_of(no_dram, launch_s=0.0)


def test_cpu_target_problems_and_knobs(profile):
    t = CpuTarget(profile)
    p = t.problem("softmax", [4, 32])
    assert p.dims == (4, 32) and t.flops(p) > 0 and t.input_shapes(p) == {"x": [4, 32]}
    space = t.knob_space(p)
    assert space.make(t.default_knobs(p)).fingerprint  # the first setting tried is a point of the space
    with pytest.raises(TargetError, match="no template for op 'fft'; its templates: .*eltwise, gemm"):
        t.problem("fft", (1, 1))


def test_workloads_run_on_the_target_they_are_given(profile):
    t = CpuTarget(profile)
    wl = load_workload("softmax", {"shape": "4,32"}, target=t)
    task = wl.tasks[0]
    assert task.backend.name == "cpu" and task.backend.fingerprint == profile.fingerprint
    assert task.cost_model.ceil is t.ceilings()  # the roofline reads the target's ceilings
    assert wl.manifest.options == {"dims": [4, 32], "epilogue": "none", "seed": 0}
    # the default is the workload's own target: the CPU for kernels, the table for the drill
    assert load_workload("drill").tasks[0].backend.name == "table"
    assert load_workload("drill", target="table").tasks[0].backend.fingerprint.startswith("table:drill:")


def test_remeasure_measures_the_libraries_it_is_given_and_none_for_an_empty_list(profile):
    from planforge.targets.cpu.templates import available_libraries

    t = CpuTarget(profile)
    task = load_workload("softmax", {"shape": "4,32"}, target=t).tasks[0]
    try:
        c = task.space.make(t.default_knobs(t.problem("softmax", [4, 32])))
        outs, libs = task.backend.remeasure([c], libraries=(), rounds=1)
        assert outs[0].ok and libs == {}  # the finalist walk's later batches: plans only
        outs, libs = task.backend.remeasure([c], libraries=["numpy"], rounds=1)
        assert set(libs) == {"numpy"}
        assert set(task.backend.remeasure([c], rounds=1)[1]) == set(available_libraries())
    finally:
        task.backend.close()


@pytest.mark.parametrize("name, options, target, message", [
    ("drill", {}, "cpu", "the drill runs on the 'table' target only"),
    ("gemm", {}, "table", "target 'table' has no kernel templates"),
    ("gemm", {}, "tpu", "target 'tpu' is not available; known targets: cpu"),
    ("gemm", {"target": "cpu"}, None, "not a workload option: pass it as --target"),
])
def test_a_workload_on_a_target_it_cannot_use_is_a_clear_error(name, options, target, message):
    with pytest.raises(WorkloadError, match=message):
        load_workload(name, options, target)


# -- a new target: one class and one registry entry; no edit to workloads, search or the funnel --------
@dataclasses.dataclass
class SimTarget:
    """A simulated device: the CPU templates' spaces on a synthetic machine, each candidate's time a
    stable hash of its fingerprint (a stand-in for a GPU target's measurements)."""

    name: str = "sim"
    pin_cores: bool = False
    cold: bool = False

    @property
    def fingerprint(self) -> str:
        return "sim-device"

    def describe(self):
        return {"target": self.name, "fingerprint": self.fingerprint}

    def profile(self, force=False, quick=None, progress=None):
        return None

    def facts(self, profile):
        return [("device", "simulated")]

    def ceilings(self):
        return Ceilings(rate_bits={256: 100e9}, speedup=2.0, threads=2,
                        bw={"L1": {"read": (400e9, 800e9), "copy": (400e9, 800e9)},
                            "DRAM": {"read": (20e9, 30e9), "copy": (20e9, 30e9)}},
                        cache={"L1": (48 * 1024, 2, 1)}, call_s=1e-7, launch_s=1e-6, fingerprint=self.fingerprint)

    def _cpu(self):
        from planforge.targets.cpu import templates

        return templates

    def _lim(self):
        return self._cpu().Limits("sim-device", 8, 16, 2, {"L1d": 48 * 1024, "L2": 1 << 20, "L3": 8 << 20})

    def problem(self, op, dims, epilogue="none"):
        return self._cpu().Problem(op, tuple(dims), epilogue)

    def knob_space(self, problem):
        return self._cpu().knob_space(problem, self._lim())

    def default_knobs(self, problem):
        return self._cpu().default_knobs(problem, self._lim())

    def flops(self, problem):
        return self._cpu().flops(problem)

    def input_shapes(self, problem):
        return {k: list(v.shape) for k, v in self._cpu().make_inputs(problem, 0, shapes_only=True).items()}

    def libraries(self):
        return []

    def kernel_backend(self, problem, seed=0, constant_weights=False):
        table = {c.fingerprint: 1e-6 * (1 + int(hashlib.sha256(c.fingerprint.encode()).hexdigest()[:6], 16) / 2**24)
                 for c in self.knob_space(problem).enumerate()}
        return TableBackend(table, label="sim", name="sim")

    def graph_backend(self, graph, genome, seed=0, accuracy=None):
        raise TargetError("the simulated target runs kernels only")

    def peak_bytes(self, graph, program):
        raise TargetError("the simulated target runs kernels only")

    def plan(self, graph, program):
        raise TargetError("the simulated target runs kernels only")


def test_a_new_target_plugs_in_with_one_registry_entry(monkeypatch, tmp_path):
    from planforge.search import Budget
    from planforge.tuning import tune

    monkeypatch.setitem(TARGETS, "sim", f"{__name__}:SimTarget")
    assert _members(Target) <= set(dir(SimTarget))
    wl = load_workload("softmax", {"shape": "4,32"}, target="sim")
    task = wl.tasks[0]
    assert task.backend.name == "sim" and task.cost_model.ceil.fingerprint == "sim-device"
    res = tune(wl, strategy="exhaustive", budget=Budget(evals=task.space.size), out=tmp_path, funnel=False)
    assert res.ok and res.spec["target"]["backend"] == "sim"
    assert next(iter(res.spec["tasks"].values()))["latency_s"] == pytest.approx(min(task.backend.table.values()))


def test_the_api_takes_a_target(tmp_path):
    import planforge

    res = planforge.tune("drill", target="table", budget=24, strategy="exhaustive", out=tmp_path)
    assert res.ok and res.spec["target"]["backend"] == "table"
    with pytest.raises(ValueError, match="the drill runs on the 'table' target only"):
        planforge.tune("drill", target="cpu")
    with pytest.raises(ValueError, match="was built for target table, not 'cpu'"):
        planforge.tune(load_workload("drill"), target="cpu")
    with pytest.raises(ValueError, match="target 'tpu' is not available; known targets: cpu, cuda, replay, table"):
        planforge.tune("gemm", target="tpu")


@dataclasses.dataclass
class GpuSimTarget(SimTarget):
    """The simulated device, described as a machine no analytic model knows yet."""

    name: str = "gpusim"

    def ceilings(self):
        return dataclasses.replace(super().ceilings(), kind="gpu")


def test_a_target_no_analytic_model_knows_is_searched_without_one(monkeypatch, tmp_path):
    from planforge.costmodel.analytic import AnalyticModel, analytic_model
    from planforge.search import Budget
    from planforge.tuning import tune

    monkeypatch.setitem(TARGETS, "gpusim", f"{__name__}:GpuSimTarget")
    wl = load_workload("softmax", {"shape": "4,32"}, target="gpusim")
    task = wl.tasks[0]
    assert task.cost_model is None and task.backend.name == "sim"
    t = get_target("gpusim")
    p = t.problem("softmax", (4, 32))
    assert analytic_model(p, t.knob_space(p), t) is None
    with pytest.raises(ValueError, match="no analytic model for a gpu machine"):
        AnalyticModel.for_problem(p, t.knob_space(p), t)
    res = tune(wl, strategy="exhaustive", budget=Budget(evals=task.space.size), out=tmp_path)
    assert res.ok and next(iter(res.spec["tasks"].values()))["latency_s"] == pytest.approx(
        min(task.backend.table.values()))
