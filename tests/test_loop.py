"""The one tuning loop: every backend behind one protocol, the same spec on one slot or many, the roofline
screen in front of every executor, and one-way imports on the search and driver side."""
import ast
import inspect
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

import replay_data as data
from planforge.measure.executor import InlineExecutor, LocalExecutor
from planforge.outcome import Outcome
from planforge.search import Budget, make_strategy, search, search_async
from planforge.targets.base import Backend
from planforge.targets.replay.replay import load_replay
from planforge.targets.table import TableBackend
from planforge.tuning import tune
from planforge.workloads import Manifest, Task, Workload, load_workload

SRC = Path(__file__).resolve().parents[1] / "src" / "planforge"


def _members(proto) -> list[str]:
    """The members a class must have to follow ``proto``: its annotated attributes and its methods."""
    names = set(getattr(proto, "__annotations__", {}))
    names |= {n for n, v in vars(proto).items() if inspect.isfunction(v) and not n.startswith("_")}
    return sorted(names)


def _replay_workload(tmp_path) -> Workload:
    """The test recording (in ``tmp_path``, written once) as a one-task workload."""
    kt = tmp_path / "cachefiles" / "synth" / "kt.json.gz"
    r = load_replay(kt if kt.exists() else data.hub(tmp_path)["kt"])
    return Workload(Manifest(f"replay:{r.label}"), [Task(key="replay", space=r.space, backend=r.backend)])


def _spec(res) -> str:
    """The spec as written, less the toolchain (the same run on another Python would differ only there)."""
    spec = json.loads(res.spec_path.read_text())
    spec.pop("toolchain")
    return json.dumps(spec, sort_keys=True, indent=1)


# -- the Backend protocol ---------------------------------------------------------------------------
def test_every_backend_follows_the_backend_protocol(tmp_path, profile):
    from planforge.targets.cpu.graph import GraphBackend
    from planforge.targets.cpu.kernel import CpuBackend
    from planforge.targets.replay.replay import ReplayBackend

    members = _members(Backend)
    assert {"pin_cores", "factory", "builder", "measure_built", "baselines", "remeasure", "close"} <= set(members)
    for cls in (CpuBackend, GraphBackend, TableBackend, ReplayBackend):
        missing = [m for m in members if not hasattr(cls, m) and m not in getattr(cls, "__dataclass_fields__", {})
                   and m != "fingerprint"]  # (set in __post_init__)
        assert not missing, f"{cls.__name__} lacks {missing}"
    assert CpuBackend.pin_cores and GraphBackend.pin_cores  # they measure on this node's cores
    assert not TableBackend.pin_cores and not ReplayBackend.pin_cores  # lookups take none
    table = load_workload("drill").tasks[0].backend
    replay = _replay_workload(tmp_path).tasks[0].backend
    for be in (table, replay):  # the lookups: no build step, nothing to compare with, a copy that agrees
        assert be.builder() is None and be.baselines() == {} and be.program(None) is None and be.work() is None
        copy = pickle.loads(pickle.dumps(be.factory()))(None)
        assert copy.fingerprint == be.fingerprint and type(copy) is type(be)


def test_replay_remeasure_reads_the_recording_again_without_counting_a_lookup(tmp_path):
    task = _replay_workload(tmp_path).tasks[0]
    cands = list(task.space.enumerate())[:3]
    first = task.backend.measure(cands)
    again, libs = task.backend.remeasure(cands, rounds=3)
    assert [o.metric for o in again] == [o.metric for o in first] and libs == {}
    assert task.backend.lookups == 3  # re-reading a recording is not an evaluation


def test_graph_backend_copies_through_its_factory_with_the_same_plans(profile):
    task = load_workload("policy-mlp").tasks[0]
    be = task.backend
    try:
        make = pickle.loads(pickle.dumps(be.factory()))  # what a Ray actor or a slot thread receives
        copy = make((sorted(os.sched_getaffinity(0))[0],))
        try:
            assert copy.fingerprint == be.fingerprint and copy.cpus is not None
            for c in task.seeds:  # the genome travels whole: every copy extracts the same program
                assert copy.program(c) == be.program(c)
            assert be.work()["flops"] > 0 and be.device_profile()["fingerprint"] == be.fingerprint
            # the build stage builds apart from the slots and ships a plan's libraries by content
            build = pickle.loads(pickle.dumps(be.builder()))
            seed = task.seeds[0]
            parts = build([seed])[0]
            assert not isinstance(parts, Outcome) and parts[0] == be.program(seed)
            program, libs, problems = build.install(pickle.loads(pickle.dumps(build.pack(parts))))
            assert program == parts[0] and libs == parts[1] and all(Path(p).exists() for p in libs.values())
            o = copy.measure_built(seed, (program, libs, problems))
            assert o.ok, o.message
        finally:
            copy.close()
    finally:
        be.close()


# -- one loop ---------------------------------------------------------------------------------------
def test_search_is_the_loop_over_one_inline_slot():
    task = load_workload("drill").tasks[0]
    runs = []
    for how in ("search", "inline"):
        strat = make_strategy("genetic", task.space, 5)
        if how == "search":
            res = search(task.space, strat, task.backend, Budget(evals=12), batch=2)
        else:
            res = search_async(task.space, strat, InlineExecutor(task.backend, 2), Budget(evals=12))
        runs.append([(t.n, t.candidate.fingerprint, t.outcome.status) for t in res.trials])
        assert res.evaluations == 12 and res.stop_reason == "budget of 12 evaluations spent"
    assert runs[0] == runs[1]


class _Slow(TableBackend):
    """The drill table; the first candidate it is asked for takes 0.5 s, the others 0.02 s."""

    def measure(self, candidates):
        for c in candidates:
            time.sleep(0.5 if c.fingerprint == self.label.split(":")[1] else 0.02)
        return super().measure(candidates)

    def factory(self):
        from functools import partial

        return partial(_Slow, dict(self.table), self.label)


def test_ordered_settling_gives_the_plain_trials_whichever_slot_is_quicker():
    task = load_workload("drill").tasks[0]
    first = make_strategy("random", task.space, 1).ask(1)[0]
    plain = search(task.space, make_strategy("random", task.space, 1), task.backend, Budget(evals=8))
    ex = LocalExecutor(_Slow(task.backend.table, f"slow:{first.fingerprint}"), workers=2)
    try:
        res = search_async(task.space, make_strategy("random", task.space, 1), ex, Budget(evals=8), ordered=True)
    finally:
        ex.close()
    assert [(t.n, t.candidate.fingerprint) for t in res.trials] == [(t.n, t.candidate.fingerprint)
                                                                      for t in plain.trials]
    assert res.curve == plain.curve and [e.candidate for e in res.ranked] == [e.candidate for e in plain.ranked]


class _Refuse:
    """A screen that refuses every candidate slower than twice the incumbent, and remembers what it saw."""

    def __init__(self, table):
        self.table, self.seen, self.refused = table, [], set()

    def admit(self, c, best):
        self.seen.append(best)
        if best is not None and self.table[c.fingerprint] > 2 * best:
            self.refused.add(c.fingerprint)
            return f"slower than twice {best}"
        return None

    def observe(self, c, metric):
        assert metric == self.table[c.fingerprint]


class _Counting(TableBackend):
    def measure(self, candidates):
        _Counting.measured.extend(c.fingerprint for c in candidates)
        return super().measure(candidates)

    def factory(self):
        from functools import partial

        return partial(_Counting, dict(self.table), self.label)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_roofline_screen_runs_in_front_of_every_executor(workers):
    task = load_workload("drill").tasks[0]
    table = task.backend.table
    _Counting.measured = []
    screen = _Refuse(table)
    be = _Counting(table, "drill")
    ex = InlineExecutor(be) if workers == 1 else LocalExecutor(be, workers=workers)
    try:
        res = search_async(task.space, make_strategy("random", task.space, 0), ex, Budget(evals=24), screen=screen)
    finally:
        ex.close()
    assert screen.refused and not screen.refused & set(_Counting.measured)  # refused: never measured
    refused = [t for t in res.trials if t.outcome.status == "rejected" and t.candidate.fingerprint in screen.refused]
    assert len(refused) == len(screen.refused) and all(t.n == 0 for t in refused)  # not evaluations either
    assert res.counts["rejected"] >= len(screen.refused) and res.evaluations == len(_Counting.measured)


def test_the_screen_starts_from_the_best_of_an_interrupted_run():
    task = load_workload("drill").tasks[0]
    table = task.backend.table
    best_fp = min(table, key=table.get)
    screen = _Refuse(table)
    search(task.space, make_strategy("exhaustive", task.space), task.backend, Budget(evals=3),
           cache={best_fp: Outcome.measured([table[best_fp]])}, screen=screen)
    assert screen.seen[0] == table[best_fp]  # the first proposal already faces the recorded best


# -- the same spec on one slot and on many -----------------------------------------------------------
# auto on the whole drill (24 points) is exhaustive; random proposes what its seed says whatever it is told
@pytest.mark.parametrize("strategy,evals", [("auto", 24), ("random", 12)])
def test_drill_gives_the_same_spec_with_two_local_workers(tmp_path, strategy, evals):
    one = tune(load_workload("drill"), strategy=strategy, budget=Budget(evals=evals), seed=4, out=tmp_path / "one")
    two = tune(load_workload("drill"), strategy=strategy, budget=Budget(evals=evals), seed=4, out=tmp_path / "two",
               executor={"kind": "local", "workers": 2})
    assert one.ok and two.ok
    assert _spec(two) == _spec(one)


def test_replay_gives_the_same_spec_with_two_local_workers(tmp_path):
    one = tune(_replay_workload(tmp_path), strategy="random", budget=Budget(evals=10), seed=2,
               out=tmp_path / "one")
    two = tune(_replay_workload(tmp_path), strategy="random", budget=Budget(evals=10), seed=2,
               out=tmp_path / "two", executor={"kind": "local", "workers": 2})
    assert one.ok and _spec(two) == _spec(one)


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray instance of this machine (2 CPUs) in a temporary folder of its own, shut down after the module."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'planforge[ray]')")
    env = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent)] + [p for p in sys.path if p])}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    tmp = tempfile.mkdtemp(prefix="pfloop-")  # short: Ray's socket paths must fit in 107 bytes
    try:
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_drill_and_replay_give_the_same_spec_on_ray(tmp_path, ray_cluster):
    ray = {"kind": "ray", "slots": 2}
    one = tune(load_workload("drill"), strategy="random", budget=Budget(evals=10), seed=6, out=tmp_path / "d1")
    two = tune(load_workload("drill"), strategy="random", budget=Budget(evals=10), seed=6, out=tmp_path / "d2",
               executor=ray)
    assert one.ok and _spec(two) == _spec(one)
    assert two.tasks[0].result.executor["kind"] == "ray"
    one = tune(_replay_workload(tmp_path), strategy="random", budget=Budget(evals=8), seed=1,
               out=tmp_path / "r1")
    two = tune(_replay_workload(tmp_path), strategy="random", budget=Budget(evals=8), seed=1,
               out=tmp_path / "r2", executor=ray)
    assert one.ok and _spec(two) == _spec(one)


def _two_slot_model_run(tmp_path, executor):
    """The default model workload tuned on two slots: it finishes, writes a spec, and every measurement ran
    in a slot's own copy of the graph backend (made through its factory) under this machine's fingerprint."""
    wl = load_workload("policy-mlp")
    res = tune(wl, budget=Budget(evals=4), seed=0, out=tmp_path, executor=executor)
    assert res.ok and res.spec_path.exists() and "program" in res.spec["tasks"]["graph"]
    run = res.tasks[0].result
    assert run.executor["slots"] == 2 and run.executor["targets"] == {wl.tasks[0].backend.fingerprint: 2}
    assert run.counts["measured"] >= 1 and run.evaluations == 4


def test_the_default_model_tunes_with_two_local_workers(tmp_path, profile):
    _two_slot_model_run(tmp_path, {"kind": "local", "workers": 2})


def test_the_default_model_tunes_on_ray(tmp_path, profile, ray_cluster):
    _two_slot_model_run(tmp_path, {"kind": "ray", "slots": 2})


# -- the API function and one-way imports ---------------------------------------------------------------
def test_planforge_tune_is_the_api_function_even_after_the_driver_is_imported():
    import planforge
    import planforge.api
    import planforge.tuning  # noqa: F401  (a submodule named tune would rebind planforge.tune)

    assert inspect.isfunction(planforge.tune)
    assert inspect.signature(planforge.tune) is not None and planforge.tune.__doc__
    with pytest.raises(TypeError, match="planforge.tune takes"):
        planforge.tune(42)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (inside functions too), as absolute names."""
    pkg = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    base = pkg.split(".")[:-1] if path.name != "__init__.py" else pkg.split(".")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                root = base[: len(base) - node.level + 1]
                out.add(".".join(root + ([node.module] if node.module else [])))
            else:
                out.add(node.module or "")
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_measure_sits_below_the_targets_and_results_below_the_driver():
    for p in (SRC / "measure").glob("*.py"):
        assert not [m for m in _imports(p) if m.startswith("planforge.targets")], p.name
    for name in ("results.py", "report/run.py", "report/summary.py", "report/html.py"):
        bad = [m for m in _imports(SRC / name) if m in ("planforge.tuning", "planforge.api", "planforge.tune")]
        assert not bad, (name, bad)
    assert "planforge.api" not in _imports(SRC / "tuning.py")
    assert not (SRC / "tune.py").exists()  # no submodule shadows planforge.tune


def test_strategy_modules_register_nothing_on_import():
    for p in (SRC / "search").glob("*.py"):
        tree = ast.parse(p.read_text())
        for node in tree.body:  # module level: no `STRATEGIES[...] = ...`
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    assert not (isinstance(t, ast.Subscript) and getattr(t.value, "id", "") == "STRATEGIES"), p.name
    assert "planforge.search.registry" not in _imports(SRC / "search" / "strategies.py")


def test_strategies_that_take_seed_candidates_say_so():
    from planforge.search import STRATEGIES

    for name, cls in STRATEGIES.items():
        assert cls.takes_initial == ("initial" in inspect.signature(cls.__init__).parameters), name
    space = load_workload("drill").tasks[0].space
    seeds = list(space.enumerate())[5:7]
    assert make_strategy("genetic", space, 0, initial=seeds).ask(2) == seeds  # proposed first
    make_strategy("random", space, 0, initial=seeds)  # left out: random takes none (no TypeError)
    for name, cls in STRATEGIES.items():
        assert cls.takes_later == ("later" in inspect.signature(cls.__init__).parameters), name
        assert not cls.takes_later or cls.takes_initial, name


def test_a_seeded_genetic_search_steps_from_its_best_seed_then_takes_the_later_seeds():
    """Seeded, the rest of the first phase are one-knob steps from the best measured candidate (its kernels'
    settings before its graph choices, kind ``gene``), not random points; the ``later`` seeds come when that phase
    ends; a strategy without such a phase takes the later seeds first with the others."""
    from planforge.outcome import Outcome
    from planforge.space import Knob, Space

    space = Space([Knob("impl", ("a", "b", "c"), "gene"), Knob("tile", tuple(range(6)), "categorical"),
                   Knob("unroll", (1, 2, 4), "categorical")])
    first, second, later = space.make({"impl": "a", "tile": 0, "unroll": 1}), \
        space.make({"impl": "b", "tile": 0, "unroll": 1}), space.make({"impl": "c", "tile": 5, "unroll": 4})
    g = make_strategy("genetic", space, 0, population=5, initial=[first, second], later=[later])
    assert g.ask(2) == [first, second]
    g.tell([(first, Outcome.measured([1.0])), (second, Outcome.measured([2.0]))])
    steps = []
    for _ in range(3):
        (c,) = g.ask(1)
        steps.append(c)
        g.tell([(c, Outcome.measured([3.0]))])
    for c in steps:  # one knob of the best seed changed, and not its graph choice while settings remain
        changed = [k for k in ("impl", "tile", "unroll") if c[k] != first[k]]
        assert len(changed) == 1 and changed != ["impl"], c.as_dict()
    assert g.ask(1) == [later]  # the first phase (5 proposals) is over
    # a strategy without a first phase of its own measures every seed first
    assert make_strategy("model", space, 0, initial=[first], later=[later]).ask(2) == [first, later]
    make_strategy("random", space, 0, initial=[first], later=[later])  # neither taken: no TypeError


def test_a_backend_without_the_protocol_is_a_clear_error():
    from planforge.measure.executor import ExecutorError, make_executor

    class Half:
        name, fingerprint = "half", "x"

        def measure(self, cs):
            return []

    kinds = ["local"]
    try:
        import ray  # noqa: F401
        kinds.append("ray")  # (without Ray the error is that Ray is missing)
    except ImportError:
        pass
    for kind in kinds:
        with pytest.raises(ExecutorError, match=r"Backend protocol.*no factory\(\), builder\(\)"):
            make_executor(kind, Half(), **({"workers": 2} if kind == "local" else {}))
