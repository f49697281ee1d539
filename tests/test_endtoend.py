"""Whole models as tasks: the task-level objective (end-to-end measurement, control loops, the task-level 95% rule)."""
from types import SimpleNamespace

import numpy as np
import pytest

from planforge.endtoend import decide
from planforge.workloads.objective import Objective, ObjectiveError


def test_control_objective_matches_a_hand_calculation():
    goal = Objective.parse("control:chunk_steps=8,control_hz=10")
    assert goal == Objective("control", 8, 10.0)
    ok = goal.control(0.05, 0.6)  # a chunk of 8 actions executes in 0.8 s; computing it takes 0.6 s (p99)
    assert ok["chunk_execute_s"] == pytest.approx(0.8) and ok["effective_period_s"] == pytest.approx(0.8)
    assert ok["effective_hz"] == pytest.approx(10.0) and ok["holds"] and ok["headroom"] == pytest.approx(0.8 / 0.6)
    late = goal.control(1.0, 1.2)  # compute longer than execution: double buffering cannot hide it
    assert late["effective_period_s"] == pytest.approx(1.2) and late["effective_hz"] == pytest.approx(8 / 1.2)
    assert not late["holds"]
    assert Objective.parse(None).control(1.0, 1.0) is None
    for bad, msg in (("control:chunk_steps=0,control_hz=10", "chunk_steps >= 1"), ("speed", "choose 'latency'"),
                     ({"kind": "control", "hz": 3}, "unknown fields"), ("control:chunk_steps", "key=value")):
        with pytest.raises(ObjectiveError, match=msg):
            Objective.parse(bad)


def _tr(key, weight, latency, library):
    return SimpleNamespace(task=SimpleNamespace(key=key, weight=weight), latency=latency,
                           walk=SimpleNamespace(accepted=SimpleNamespace(metric=latency)),
                           best_library=("numpy", library), ratio_vs_library=latency / library)


def test_task_level_95_rule_keeps_a_slow_task_off_the_critical_path_only():
    goal = Objective()
    results = [_tr("big", 10, 1.0, 2.0), _tr("small", 1, 0.2, 0.1)]  # small: 2x slower than numpy, 2% of the time
    d = decide(results, goal, target_holds=True)
    assert d["big"]["decision"] == "tuned" and d["small"]["decision"] == "tuned"
    assert d["small"]["share"] == pytest.approx(0.2 / 10.2) and "off the critical path" in d["small"]["reason"]
    assert decide(results, goal, target_holds=False)["small"]["decision"] == "numpy"
    heavy = [_tr("big", 1, 1.0, 2.0), _tr("small", 1, 0.2, 0.1)]  # now 17% of the time: it must fall back
    d = decide(heavy, goal, target_holds=True)
    assert d["small"]["decision"] == "numpy" and "at least 5%" in d["small"]["reason"]


def test_a_partitioned_model_tunes_per_task_records_the_decisions_and_loads_as_one_plan(tmp_path, profile):
    import planforge
    from planforge.ir.zoo import transformer
    from planforge.search import Budget
    from planforge.spec import load_spec
    from planforge.targets.cpu.target import CpuTarget
    from planforge.tuning import tune
    from planforge.workloads.models import graph_workload

    g = transformer(layers=2, seq=6, width=16, heads=2)
    wl = graph_workload(g, "t2", whole_below=0, target=CpuTarget(profile),
                        objective="control:chunk_steps=4,control_hz=50")
    assert wl.partition is not None and len(wl.tasks) == 3
    assert sorted(t.weight for t in wl.tasks) == [1, 1, 2]
    res = tune(wl, budget=Budget(evals=6), seed=0, out=tmp_path)
    assert res.ok and res.end_to_end is not None
    spec = load_spec(res.spec_path)
    e2e = spec["end_to_end"]
    assert e2e["samples"] >= 100 and e2e["p99_s"] >= e2e["median_s"] > 0 and e2e["library"] == "numpy"
    assert e2e["control"]["chunk_steps"] == 4 and e2e["control"]["chunk_execute_s"] == pytest.approx(0.08)
    assert [s["share"] for s in e2e["shares"]] == sorted((s["share"] for s in e2e["shares"]), reverse=True)
    assert set(e2e["decisions"]) == set(spec["tasks"])
    for key, t in spec["tasks"].items():
        assert t["task_level"] == e2e["decisions"][key] and t["selected"] == t["task_level"]["decision"]
    assert spec["partition"]["parts"][0][0] == spec["partition"]["parts"][2][0]  # layer 2 reuses layer 1's task
    from rich.console import Console

    from planforge.report.summary import print_summary, summary_json

    con = Console(record=True, width=200)
    print_summary(res, con)
    text = con.export_text()
    assert "end to end: 4 parts in 3 tasks" in text and "control loop: a chunk of 4 steps" in text
    assert "planning phases: partition" in text and summary_json(res)["end_to_end"]["samples"] == e2e["samples"]
    plan = planforge.load(res.spec_path, graph=g)
    xs = g.example_inputs(5)
    out, ref = plan(*xs), g.evaluate(*xs)[0]  # a one-output plan returns the array itself
    assert np.abs(out - ref).max() < 1e-3 * (1 + np.abs(ref).max())


def test_the_report_draws_a_space_larger_than_a_float_holds():
    from planforge.report import plots

    from planforge.report.summary import fmt_size

    stages = [{"stage": "space", "count": 7 * 10**400}, {"stage": "capacity", "count": 10**6},
              {"stage": "measured", "count": 64}]
    svg = plots.funnel({"funnel": stages})  # drawn: it has a model stage
    assert svg and "7 x 10^400" in svg
    assert "7 x 10^400" in plots.why_not("funnel", {"funnel": [stages[0], stages[-1]]}, None)  # one line instead
    assert fmt_size(7 * 10**400) == "7.00e+400" and fmt_size(1234) == "1,234"


def test_a_slow_runners_end_to_end_rounds_are_capped_not_its_fast_ones():
    import time as _time

    from planforge import endtoend

    calls = {"slow": 0, "fast": 0}

    def slow():
        calls["slow"] += 1
        _time.sleep(0.05)

    def fast():
        calls["fast"] += 1

    got = endtoend.measure({"plan": fast, "library": slow}, rounds=2)
    mine, lib = got["plan"], got["library"]
    # the slow one: about ROUND_CAP_S a round (at least MIN_ROUND_SAMPLES calls), not min_repeats x 50 ms
    assert endtoend.MIN_ROUND_SAMPLES * 2 <= len(lib) <= 2 * endtoend.ROUND_CAP_S / 0.05 + 2
    assert len(mine) >= 2 * endtoend.E2E_TIMING.min_repeats  # the fast one keeps its full sample


def test_a_part_whose_every_plan_fails_validation_runs_its_library_and_the_model_keeps_its_other_plans(tmp_path,
                                                                                                      profile):
    """One task of a partitioned model finds no valid plan (every candidate rejected): the spec is still written,
    that part runs numpy and says why, the others keep their tuned programs, and the loaded plan is correct."""
    import planforge
    from planforge.ir.zoo import transformer
    from planforge.report.summary import print_summary
    from planforge.search import Budget
    from planforge.spec import load_spec
    from planforge.targets.cpu.target import CpuTarget
    from planforge.tuning import tune
    from planforge.workloads.models import graph_workload
    from rich.console import Console

    g = transformer(layers=2, seq=6, width=16, heads=2)
    wl = graph_workload(g, "t2", whole_below=0, target=CpuTarget(profile))
    bad = max(wl.tasks, key=lambda t: t.weight)  # the repeated layer: both its parts run the library
    bad.validators = [*bad.validators, lambda c: "rejected [by the test]"]
    res = tune(wl, budget=Budget(evals=6), seed=0, out=tmp_path)
    assert res.ok and res.spec_path is not None and res.end_to_end is not None
    spec = load_spec(res.spec_path)  # validates against the schema
    t = spec["tasks"][bad.key]
    assert t["plan"] is None and t["fingerprint"] is None and t["rank"] is None and "program" not in t
    assert t["selected"] == "numpy" and t["fallback"]["to"] == "numpy" and "rejected [by the test]" in t["no_plan"]
    assert t["latency_s"] == t["baselines"]["numpy"] and t["rejected_finalists"]
    assert spec["end_to_end"]["decisions"][bad.key]["decision"] == "numpy"
    others = [v for k, v in spec["tasks"].items() if k != bad.key]
    assert others and all(v["plan"] is not None and "program" in v for v in others)
    assert any(bad.key in n and "runs numpy" in n for n in res.notes)
    con = Console(record=True, width=400)
    print_summary(res, con)
    assert "rejected [by the test]" in con.export_text()  # printed literally, not eaten as markup
    plan = planforge.load(res.spec_path, graph=g)
    xs = g.example_inputs(3)
    out, ref = plan(*xs), g.evaluate(*xs)[0]
    assert np.abs(out - ref).max() < 1e-3 * (1 + np.abs(ref).max())
