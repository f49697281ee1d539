"""The drill's known answers (see the workload's data and ../shared/drill/README.md)."""
import itertools
import math

import pytest

from planforge.costmodel import break_even_runs, spearman, top_k
from planforge.search import Budget, NoValidFinalist, make_strategy, search, walk_finalists
from planforge.tuning import tune
from planforge.workloads import load_workload
from planforge.workloads.drill import GENES


@pytest.fixture
def drill():
    return load_workload("drill")


def ns(x):
    return round(x * 1e9)


def test_table_covers_every_genome_in_product_order(drill):
    task = drill.tasks[0]
    listed = [c.as_dict() for c in task.space.enumerate()]
    assert listed == [dict(zip(GENES, combo)) for combo in itertools.product(*GENES.values())]


def test_proxy_spearman_over_all_genomes(drill):
    task = drill.tasks[0]
    cands = list(task.space.enumerate())
    meas = [o.metric for o in task.backend.measure(cands)]
    rho = spearman(task.cost_model.predict(cands), meas)
    assert rho == pytest.approx(0.83, abs=0.01)
    assert ns(min(meas)) == 95
    valid = [m for c, m in zip(cands, meas) if all(v(c) is None for v in task.validators)]
    assert ns(min(valid)) == 103


def test_proxy_top3_measures_three_fp16_plans_all_rejected(drill, tmp_path):
    task = drill.tasks[0]
    strat = make_strategy("proxy-topk", task.space, 0, budget=3, cost_model=task.cost_model)
    res = search(task.space, strat, task.backend, Budget(evals=3), keep=3)
    got = [(str(t.candidate), ns(t.outcome.metric)) for t in res.trials]
    assert got == [("tiled_kernel/fused/row/fp16", 147), ("tiled_kernel/fused/col/fp16", 127),
                   ("cublaslt/fused/row/fp16", 95)]
    with pytest.raises(NoValidFinalist) as e:
        walk_finalists(res.ranked, task.validators)
    assert len(e.value.rejected) == 3
    assert all("fp16 accumulation over K=256" in f.reasons[0] for f in e.value.rejected)
    # the same through the driver: no spec, the error names the reasons
    r = tune(drill, strategy="proxy-topk", budget=Budget(evals=3), out=tmp_path)
    assert not r.ok and r.spec is None and "fp16 accumulation" in str(r.tasks[0].error)
    assert not (tmp_path / "spec.json").exists()


def test_genetic_keep4_ranks_and_finalist_walk(drill, tmp_path):
    r = tune(drill, strategy="genetic", budget=Budget(evals=24), seed=0, keep=4, out=tmp_path)
    tr = r.tasks[0]
    assert [ns(e.metric) for e in tr.result.ranked] == [95, 95, 103, 103]
    assert [f.rank for f in tr.walk.rejected] == [1, 2]
    assert all("fp16 accumulation" in f.reasons[0] for f in tr.walk.rejected)
    assert tr.walk.accepted.rank == 3 and ns(tr.walk.accepted.metric) == 103
    assert tr.walk.accepted.candidate["accumulate"] == "fp32"
    # stops on its own before the budget: 50 duplicates in a row
    assert tr.result.evaluations < 24
    assert tr.result.stop_reason == "50 consecutive proposals of already-measured candidates"
    spec = r.spec["tasks"]["mlp_layer"]
    assert spec["rank"] == 3 and [f["rank"] for f in spec["rejected_finalists"]] == [1, 2]


@pytest.mark.parametrize("seed", range(8))
def test_genetic_converges_for_many_seeds(drill, seed):
    task = drill.tasks[0]
    strat = make_strategy("genetic", task.space, seed)
    res = search(task.space, strat, task.backend, Budget(evals=24), keep=4)
    assert [ns(e.metric) for e in res.ranked] == [95, 95, 103, 103]
    assert ns(walk_finalists(res.ranked, task.validators).accepted.metric) == 103


def test_break_even():
    assert break_even_runs(1.9, 30e-9) == pytest.approx(6.33e7, rel=1e-3)
    assert math.isinf(break_even_runs(1.9, 0.0))


def test_exhaustive_finds_best_valid(drill):
    task = drill.tasks[0]
    res = search(task.space, make_strategy("exhaustive", task.space), task.backend, Budget(evals=100), keep=24)
    assert res.evaluations == 24 and res.stop_reason == "space exhausted"
    w = walk_finalists(res.ranked, task.validators, task.peak_bytes)
    assert ns(w.accepted.metric) == 103
    mem = [f for f in w.rejected if any("memory" in r for r in f.reasons)]
    assert not mem  # primitive_loop never ranks above the accepted plan
    prim = next(c for c in task.space.enumerate() if c["matmul"] == "primitive_loop" and c["accumulate"] == "fp32")
    reason = task.validators[1](prim)
    assert reason and "peak 16.4 MiB exceeds the budget of 8 MiB" in reason


def test_top_k_ties_keep_order():
    assert top_k([3, 1, 1, 2], 3) == [1, 2, 3]
