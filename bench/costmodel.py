"""The learned cost model and model-guided search on recorded spaces and on the CPU GEMM samples.

Two parts:

``rank``: on each recorded space in ``../shared/benchmark_hub/`` (read and
replayed by ``planforge.targets.replay.replay``), shuffle the configurations with a
seed, train the LightGBM lambdarank model (knob values only: these GPU spaces
have no analytic model) on the first 200 and report its Spearman and Kendall
with the measured times, and its top-10 recall, on the rest; over 10 seeds.

``search``: evaluations needed to get within 5% of the best, model-guided
(``model``) against ``genetic`` and ``random``, with a budget of unique
evaluations and several seeds, on the recorded spaces and on the CPU GEMM and
GEMV samples of ``bench/funnel.py`` (replayed from their recorded times; the
CPU samples go through the L0 funnel first, as ``planforge tune`` does: the
model-guided strategy then also gets the analytic model's features). A run
that never gets within 5% counts as the budget plus one.

    nice -n 10 .venv/bin/python bench/costmodel.py rank
    nice -n 10 .venv/bin/python bench/costmodel.py search --budget 200 --seeds 10
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from planforge.targets.table import TableBackend
from planforge.costmodel import kendall, spearman, top_k_recall
from planforge.costmodel.learned import LearnedRanker
from planforge.search import Budget, make_strategy, search

HUB = Path(__file__).resolve().parents[2] / "shared" / "benchmark_hub" / "cachefiles"
RESULTS = Path(__file__).resolve().parent / "results"
WITHIN = 0.05


def recorded():
    """(label, space, backend, optimum, {fingerprint: metric or None}) per recorded file."""
    from planforge.targets.replay.replay import load_replay

    for path in sorted(HUB.glob("*/*.json*")):
        r = load_replay(path)
        metrics = {}
        for cfg, m in r.metrics.items():
            c = r.space.make(dict(zip(r.recording.names, cfg))) if hasattr(r.recording, "names") else None
            if c is not None and r.space.is_valid(c):
                metrics[c.fingerprint] = m
        yield f"{path.parent.name}/{path.name.split('.')[0]}", r.space, r.backend, r.optimum, metrics


def rank(seeds: int, train: int) -> list[dict]:
    out = []
    for label, space, _, _, metrics in recorded():
        cands = [space.candidate(space.from_int(n)) for n in space.valid_ints()]
        rows = {"space": label, "points": len(cands), "spearman": [], "kendall": [], "top10_recall": [], "fit_s": []}
        for seed in range(seeds):
            order = cands[:]
            random.Random(seed).shuffle(order)
            tr, te = order[:train], order[train:]
            model = LearnedRanker(space, seed=seed)
            model.add(tr, [metrics.get(c.fingerprint) for c in tr])
            t0 = time.perf_counter()
            model.fit()
            rows["fit_s"].append(time.perf_counter() - t0)
            ok = [c for c in te if metrics.get(c.fingerprint) is not None]
            pred, meas = model.predict(ok), [metrics[c.fingerprint] for c in ok]
            rows["spearman"].append(spearman(pred, meas))
            rows["kendall"].append(kendall(pred, meas))
            rows["top10_recall"].append(top_k_recall(pred, meas, 10))
        for k in ("spearman", "kendall", "top10_recall", "fit_s"):
            v = rows[k]
            rows[k] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
        print(f"{label:>32}: {len(cands)} points, train {train}: Spearman median {rows['spearman']['median']:.3f} "
              f"(min {rows['spearman']['min']:.3f}), Kendall {rows['kendall']['median']:.3f}, top-10 recall "
              f"{rows['top10_recall']['median']:.2f}, fit {rows['fit_s']['median'] * 1e3:.0f} ms", flush=True)
        out.append(rows)
    return out


def cpu_samples():
    """The CPU samples of bench/funnel.py as (label, funnel-screened space, table backend, optimum, model,
    whole sample, its table backend, the funnel's screen)."""
    from planforge.targets.cpu.probe import get_profile
    from planforge.costmodel.analytic import AnalyticModel
    from planforge.targets.cpu.target import CpuTarget
    from planforge.costmodel.funnel import Funnel, Subspace
    from planforge.targets.cpu.templates import TEMPLATES, Problem, limits

    prof = get_profile()
    for path in sorted(RESULTS.glob("funnel-*.json")):
        data = json.loads(path.read_text())
        if "points" not in data:  # funnel-summary.json
            continue
        p = Problem.from_json(data["problem"])
        full = TEMPLATES[p.op].space(p, limits(prof))
        pts = [(full.make(r["knobs"]), r["metric"]) for r in data["points"] if r["metric"] is not None]
        sample = Subspace(full, [full.to_int(c.index) for c, _ in pts], "not in the measured sample")
        model = AnalyticModel.for_problem(p, sample, CpuTarget(prof))
        screen = Funnel(model, top_k=0.1).screen(sample)
        table = {c.fingerprint: m for c, m in pts}
        yield (f"cpu/{path.stem.split('-', 1)[1]}", screen.space, TableBackend(table),
               min(table.values()), model, sample, TableBackend(table), screen)


def evals_to_within(trials, optimum: float, budget: int) -> int:
    bound = optimum * (1 + WITHIN)
    return next((t.n for t in trials if t.n and t.outcome.ok and t.outcome.metric <= bound), budget + 1)


def one(space, backend, strategy, seed, budget, optimum, cost_model=None, screen=None) -> tuple[int, float]:
    t0 = time.perf_counter()
    strat = make_strategy(strategy, space, seed, budget=budget, cost_model=cost_model)
    res = search(space, strat, backend, Budget(evals=budget), screen=screen)
    return evals_to_within(res.trials, optimum, budget), time.perf_counter() - t0


def search_bench(budget: int, seeds: int, strategies: list[str], which: str) -> list[dict]:
    out = []
    spaces = []
    if which in ("all", "recorded"):
        spaces += [(label, space, backend, opt, None, None) for label, space, backend, opt, _ in recorded()]
    if which in ("all", "cpu"):
        for label, screened, sbackend, opt, model, sample, table, screen in cpu_samples():
            # through the funnel (what `planforge tune` does), and on the whole sample without it
            spaces.append((label + " (funnel)", screened, sbackend, opt, model, screen))
            spaces.append((label + " (no funnel)", sample, table, opt, model, None))
    for label, space, backend, opt, model, screen in spaces:
        row = {"space": label, "points": len(space.valid_ints()), "budget": budget, "seeds": seeds}
        for s in strategies:
            runs = [one(space, backend, s, seed, budget, opt, model if s == "model" else None, screen)
                    for seed in range(seeds)]
            ev = sorted(r[0] for r in runs)
            row[s] = {"median": statistics.median(ev), "p90": float(np.percentile(ev, 90)),
                      "reached": sum(e <= budget for e in ev) / len(ev), "seconds_per_run": statistics.mean(
                          r[1] for r in runs)}
        print(f"{label:>32} ({row['points']} points): " + "; ".join(
            f"{s} median {row[s]['median']:g} p90 {row[s]['p90']:.0f} reached {100 * row[s]['reached']:.0f}%"
            for s in strategies), flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=("rank", "search"))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--train", type=int, default=200, help="rank: measurements trained on (default 200)")
    ap.add_argument("--budget", type=int, default=200, help="search: unique evaluations per run (default 200)")
    ap.add_argument("--strategies", default="model,genetic,random")
    ap.add_argument("--spaces", default="all", choices=("all", "recorded", "cpu"))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.part == "rank":
        if not HUB.exists():
            sys.exit(f"no recorded spaces at {HUB}")
        res = rank(a.seeds, a.train)
    else:
        res = search_bench(a.budget, a.seeds, a.strategies.split(","), a.spaces)
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
