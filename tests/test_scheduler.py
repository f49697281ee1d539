"""The task scheduler: one budget across a workload's tasks, by estimated end-to-end gain or round-robin.

Table-backed tasks measure by lookup (deterministic and instant), so every allocation is checked exactly.
"""
import random
import sqlite3

import pytest

from planforge.search import Budget, make_strategy, search
from planforge.search.scheduler import (DEFAULT_WARMUP, Gradient, RoundRobin, TaskSearch, TaskState, compact, make_scheduler,
                                        schedule)
from planforge.measure.executor import InlineExecutor
from planforge.space import Space, int_range
from planforge.targets.table.target import TableTarget
from planforge.tuning import tune
from planforge.workloads import Manifest, Task, Workload


def table_task(key: str, latencies, weight: int = 1, delay_s: float = 0.0) -> Task:
    """A task whose plan x (0..len-1) runs in latencies[x] seconds, measured by lookup."""
    space = Space([int_range("x", 0, len(latencies) - 1)])
    table = {space.make({"x": i}).fingerprint: float(t) for i, t in enumerate(latencies)}
    return Task(key=key, space=space, backend=TableTarget().table_backend(table, label=key, delay_s=delay_s),
                weight=weight)


def spread(n: int, lo: float, hi: float, seed: int) -> list[float]:
    """n latencies spread evenly over [lo, hi], shuffled: a random search keeps finding better ones."""
    vals = [lo + (hi - lo) * i / (n - 1) for i in range(n)]
    random.Random(seed).shuffle(vals)
    return vals


def workload(*tasks: Task, name: str = "synthetic") -> Workload:
    return Workload(Manifest(name, options={"tasks": [t.key for t in tasks]}), list(tasks))


def three_tasks() -> Workload:
    return workload(table_task("attn", spread(60, 1e-3, 3e-3, 1), weight=6),
                    table_task("mlp", spread(60, 2e-3, 4e-3, 2), weight=6),
                    table_task("head", spread(60, 1e-4, 2e-4, 3), weight=1))


class Synthetic:
    """A Grantable whose best-so-far after n evaluations is ``curve(n)``: no search behind it."""

    def __init__(self, key, weight, curve):
        self.state, self.f = TaskState(key, weight), curve

    def grant(self, evals, seconds=None):
        for _ in range(evals):
            self.state.evals += 1
            b = self.f(self.state.evals)
            self.state.metrics.append(b)
            if self.state.best is None or b < self.state.best:
                self.state.curve.append((self.state.evals, b))
        return evals


def test_gradient_favours_the_task_whose_curve_still_improves():
    improving = Synthetic("improving", 1, lambda n: 1.0 * 0.97 ** n)
    flat = Synthetic("flat", 1, lambda n: 1.0)
    grants = schedule([improving, flat], Gradient(), total=60, warmup=4)
    assert improving.state.evals + flat.state.evals == 60 == sum(g.spent for g in grants)
    assert improving.state.evals >= 2 * flat.state.evals
    assert flat.state.evals >= 4  # the warm-up round
    assert [g.score for g in grants[:2]] == [None, None]  # the warm-up is not scored

    # round-robin on the same curves splits evenly
    a, b = Synthetic("improving", 1, lambda n: 0.97 ** n), Synthetic("flat", 1, lambda n: 1.0)
    schedule([a, b], RoundRobin(), total=60, warmup=4)
    assert a.state.evals == b.state.evals == 30


def test_gradient_weighs_end_to_end_share():
    # the same curve c / n, one task running 10x as often: the sum of w c / n over the tasks is least when
    # n goes as sqrt(w) (where the marginal gains w c / n^2 meet), about 152 : 48 of 200 (a curve that
    # falls at every evaluation is all slope: the hope's spacing takes over from best / n after k + 1
    # evaluations, which at a small budget shifts the split a little towards the light task)
    heavy = Synthetic("heavy", 10, lambda n: 1.0 / n)
    light = Synthetic("light", 1, lambda n: 1.0 / n)
    schedule([light, heavy], Gradient(), total=200, warmup=2)
    assert 2.5 * light.state.evals < heavy.state.evals < 4 * light.state.evals


def test_a_task_without_a_valid_plan_comes_first_within_patience():
    s = TaskState("t", 1, evals=3)
    assert Gradient(patience=4).gain(s) == float("inf")
    s.evals = 4
    assert Gradient(patience=4).gain(s) == 0.0


def test_gradient_favours_an_improving_table_task_end_to_end(tmp_path):
    # "flat" runs 3x as often and costs more, but every plan of it is equally fast: after the warm-up its
    # curve is flat, while a random search of "improving" keeps finding faster plans
    wl = workload(table_task("improving", spread(200, 1e-3, 3e-3, 7)), table_task("flat", [1.5e-3] * 200, weight=3))
    res = tune(wl, strategy="random", budget=Budget(evals=60), out=tmp_path / "g", scheduler="gradient")
    ev = res.spec["schedule"]["evaluations"]
    assert ev["improving"] > 2 * ev["flat"] and ev["flat"] >= DEFAULT_WARMUP
    rr = tune(wl, strategy="random", budget=Budget(evals=60), out=tmp_path / "r", scheduler="round-robin")
    assert rr.spec["schedule"]["evaluations"] == {"improving": 30, "flat": 30}
    # the gradient's plan for the improving task is at least as good as round-robin's
    assert res.spec["tasks"]["improving"]["latency_s"] <= rr.spec["tasks"]["improving"]["latency_s"]


def test_round_robin_splits_evenly_and_budgets_add_up(tmp_path):
    res = tune(three_tasks(), strategy="random", budget=Budget(evals=30), out=tmp_path, scheduler="round-robin")
    sched = res.spec["schedule"]
    assert sched["evaluations"] == {"attn": 10, "mlp": 10, "head": 10}
    assert {k: t["search"]["evaluations"] for k, t in res.spec["tasks"].items()} == sched["evaluations"]
    assert sum(n for _, n in sched["grants"]) == 30 == sched["spent"]
    con = sqlite3.connect(tmp_path / "records.db")
    rows = con.execute("SELECT task, COUNT(*), COUNT(DISTINCT fingerprint) FROM measurements GROUP BY task").fetchall()
    assert sorted(rows) == [("attn", 10, 10), ("head", 10, 10), ("mlp", 10, 10)]  # each measured once
    # evaluation numbers run on across grants: 1..10 per task
    ev = con.execute("SELECT task, MIN(evaluation), MAX(evaluation) FROM measurements GROUP BY task").fetchall()
    assert all(lo == 1 and hi == 10 for _, lo, hi in ev)


@pytest.mark.parametrize("total", [37, 3, 64])
def test_gradient_budgets_add_up(tmp_path, total):
    res = tune(three_tasks(), strategy="random", budget=Budget(evals=total), out=tmp_path, scheduler="gradient")
    sched = res.spec["schedule"]
    evals = {k: t["search"]["evaluations"] for k, t in res.spec["tasks"].items()}
    assert sum(evals.values()) == total == sched["spent"] == sum(n for _, n in sched["grants"])
    assert evals == sched["evaluations"]
    assert all(n >= min(DEFAULT_WARMUP, total // 3) for n in evals.values())  # the warm-up round
    if total == 64:  # the tiny head task (1/60 of the end-to-end time) gets the least
        assert evals["head"] < evals["attn"] and evals["head"] < evals["mlp"]


def test_a_budget_too_small_for_the_tasks_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="cannot give each of the 3 tasks one"):
        tune(three_tasks(), strategy="random", budget=Budget(evals=2), out=tmp_path)
    with pytest.raises(ValueError, match="unknown scheduler 'fair'"):
        tune(three_tasks(), budget=Budget(evals=20), out=tmp_path, scheduler="fair")
    with pytest.raises(ValueError, match="has no option 'alpha'"):
        make_scheduler("round-robin", alpha=0.3)
    with pytest.raises(ValueError, match="alpha must be within"):
        make_scheduler("gradient", alpha=2)
    with pytest.raises(ValueError, match="window, k and patience must be at least 1"):
        make_scheduler("gradient", k=0)


class Stop(KeyboardInterrupt):
    pass


@pytest.mark.parametrize("scheduler", ["gradient", "round-robin"])
def test_a_resumed_scheduled_run_equals_an_uninterrupted_one(tmp_path, scheduler):
    clean = tune(three_tasks(), strategy="auto", budget=Budget(evals=40), out=tmp_path / "clean", scheduler=scheduler)
    seen = []

    def interrupt(task, trial):
        seen.append((task.key, trial.n))
        if len(seen) == 23:
            raise Stop()

    with pytest.raises(Stop):
        tune(three_tasks(), strategy="auto", budget=Budget(evals=40), out=tmp_path / "run", scheduler=scheduler,
             on_trial=interrupt)
    assert not (tmp_path / "run" / "spec.json").exists()
    resumed = tune(three_tasks(), strategy="auto", budget=Budget(evals=40), out=tmp_path / "run",
                   scheduler=scheduler, resume=True)
    assert resumed.resumed
    assert (tmp_path / "run" / "spec.json").read_bytes() == (tmp_path / "clean" / "spec.json").read_bytes()
    con = sqlite3.connect(tmp_path / "run" / "records.db")
    assert con.execute("SELECT COUNT(*), COUNT(DISTINCT task || fingerprint) FROM measurements").fetchone() == (40, 40)
    assert clean.spec["schedule"]["grants"] == resumed.spec["schedule"]["grants"]


def _space_and_table():
    space = Space([int_range("a", 0, 6), int_range("b", 0, 5)])
    rng = random.Random(5)
    table = {c.fingerprint: rng.uniform(1e-3, 2e-3) for c in space.enumerate()}
    return space, TableTarget().table_backend(table, label="grid")


@pytest.mark.parametrize("name,options", [("exhaustive", {}), ("genetic", {"initial": "two"}), ("bandit", {}),
                                          ("random", {}), ("annealing", {}), ("hillclimb", {}), ("tpe", {})])
def test_grants_go_on_where_the_last_one_stopped(name, options):
    """A search granted 3 + 1 + 4 + 2 evaluations asks and tells its strategy as one search of 10 does."""
    space, backend = _space_and_table()
    if options.get("initial"):
        options = {"initial": [space.make({"a": 3, "b": 2}), space.make({"a": 0, "b": 5})]}
    if name == "bandit":
        from planforge.search.registry import AUTO_PORTFOLIO

        options = dict(AUTO_PORTFOLIO)
    whole = search(space, make_strategy(name, space, 4, **options), backend, Budget(evals=10))
    recorded = []
    ts = TaskSearch("grid", 1, space, lambda w: make_strategy(name, space, 4, **options),
                    lambda: InlineExecutor(backend), backend.fingerprint, on_done=lambda t, w: recorded.append(t.n))
    for k in (3, 1, 4, 2):
        assert ts.grant(k) == k
    res = ts.result()
    assert [t.candidate.fingerprint for t in res.trials] == [t.candidate.fingerprint for t in whole.trials]
    assert [t.n for t in res.trials] == [t.n for t in whole.trials] == recorded
    assert res.curve == whole.curve and res.evaluations == 10 and res.counts == whole.counts
    assert [e.candidate.fingerprint for e in res.ranked] == [e.candidate.fingerprint for e in whole.ranked]
    assert ts.state.evals == 10 and ts.state.curve == whole.curve and not ts.state.stopped
    ts.close()


def test_a_search_that_runs_dry_stops_its_task():
    space, backend = _space_and_table()  # 42 points
    ts = TaskSearch("grid", 1, space, lambda w: make_strategy("exhaustive", space, 0),
                    lambda: InlineExecutor(backend), backend.fingerprint)
    assert ts.grant(40) == 40 and not ts.state.stopped
    assert ts.grant(5) == 2 and ts.state.stopped == "space exhausted"
    assert ts.grant(5) == 0
    assert ts.result("the budget ran out").stop_reason == "space exhausted"


def test_a_one_task_workload_is_searched_as_before(tmp_path):
    task = table_task("only", spread(50, 1e-3, 2e-3, 4))
    res = tune(workload(task), strategy="random", budget=Budget(evals=12), seed=2, out=tmp_path / "a")
    assert "schedule" not in res.spec
    s = res.spec["tasks"]["only"]["search"]
    plain = search(task.space, make_strategy("random", task.space, 2, budget=12), task.backend, Budget(evals=12))
    assert s["curve"] == [list(p) for p in plain.curve] and s["stop_reason"] == plain.stop_reason
    assert s["evaluations"] == 12 and s["budget"] == {"evals": 12, "seconds": None}
    # the scheduler does not touch a single task: any scheduler gives the same spec, byte for byte
    tune(workload(task), strategy="random", budget=Budget(evals=12), seed=2, out=tmp_path / "b",
         scheduler="round-robin")
    assert (tmp_path / "a" / "spec.json").read_bytes() == (tmp_path / "b" / "spec.json").read_bytes()


def test_progress_hears_of_every_grant(tmp_path):
    heard = []
    tune(three_tasks(), strategy="random", budget=Budget(evals=20), out=tmp_path,
         on_grant=lambda g, states: heard.append((g.task, g.spent, sum(s.evals for s in states))))
    assert [h[0] for h in heard[:3]] == ["attn", "mlp", "head"]  # the warm-up round, in order
    assert heard[-1][2] == 20 and sum(h[1] for h in heard) == 20
    assert compact([]) == []


def test_cli_scheduler_option(cli, tmp_path):
    r = cli("tune", "-w", "drill", "--budget", "5", "--scheduler", "fair", "--out", tmp_path, "--quiet")
    assert r.returncode != 0 and "unknown scheduler 'fair'" in r.stderr + r.stdout and "Traceback" not in r.stderr
    r = cli("tune", "-w", "drill", "--budget", "5", "--strategy", "random", "--scheduler", "round-robin",
            "--out", tmp_path, "--quiet", check=True)


def test_the_hope_is_the_expected_saving_of_one_more_exchangeable_plan():
    # the same best, evaluations and weight; the second task's nine best plans lie ten times further apart
    def state(metrics):
        s = TaskState("t", 2.0, evals=len(metrics), metrics=list(metrics))
        s.curve = [(1, min(metrics))]  # its best came first: the slope is 0, the gain is all hope
        return s
    tight = state([1.0 + 0.001 * i for i in range(12)])
    wide = state([1.0 + 0.01 * i for i in range(12)])
    g = Gradient(alpha=0.2, k=8)
    # hope = (9th best - best) / k / n, times weight and (1 - alpha)
    assert g.gain(tight) == pytest.approx(2.0 * 0.8 * 0.008 / 8 / 12)
    assert g.gain(wide) == pytest.approx(10 * g.gain(tight))
    # fewer than k + 1 valid measurements: the optimistic best / n
    few = state([1.0, 1.5, 2.0])
    assert g.gain(few) == pytest.approx(2.0 * 0.8 * 1.0 / 3)


def test_parked_executors_close_between_grants_and_the_search_goes_on_as_before():
    """With open_limit 1 each task's executor is closed when another task is granted, and made anew at its
    next grant: the searches propose, measure and rank exactly as with every executor kept open."""
    space, backend = _space_and_table()
    opened, closed = [], []

    class Counting(InlineExecutor):
        def __init__(self, be, key):
            super().__init__(be)
            self.key = key
            opened.append(key)

        def close(self):
            closed.append(self.key)
            super().close()

    def searches():
        return [TaskSearch(k, w, space, lambda where: make_strategy("random", space, 3),
                           (lambda k=k: Counting(backend, k)), backend.fingerprint)
                for k, w in (("a", 3), ("b", 1), ("c", 2))]

    kept, parked = searches(), searches()
    schedule(kept, Gradient(), total=30)
    assert len(opened) == 3 and not closed
    results = [k.result() for k in kept]
    opened.clear(), closed.clear()
    schedule(parked, Gradient(), total=30, open_limit=1)
    assert len(opened) > 3  # parked executors were made anew at a later grant
    assert len(opened) - len(closed) <= 1  # at most one stays open
    for rk, k, p in zip(results, kept, parked):
        rp = p.result()
        assert [t.candidate.fingerprint for t in rk.trials] == [t.candidate.fingerprint for t in rp.trials]
        assert rk.curve == rp.curve and k.state.evals == p.state.evals
        assert rp.executor["kind"] == "inline" and rp.executor["slots"] == 1
    assert len(opened) == len(closed)  # result() closes what is still open
    with pytest.raises(ValueError, match="at least one executor"):
        schedule(searches(), Gradient(), total=30, open_limit=0)
