"""Task scheduler, replayed: gradient vs round-robin vs the hindsight optimum on recorded per-task curves.

A task's strategy proposes the same plans whatever grants it gets (``search/scheduler.py``: a task granted
4 + 1 + 3 evaluations asks and tells exactly as one search of 8 would), so one measured run per seed that
gives every task ``--per-task`` evaluations records, per task, the metric of its 1st, 2nd, ... evaluation,
and any allocation of a budget up to that length replays from it exactly: the real ``schedule`` function
runs on stand-in searches that read the recorded metrics. That makes many budgets and the hindsight
optimum cheap on the same measurements:

- ``gradient`` and ``round-robin``: what ``planforge tune --scheduler ...`` would have granted;
- ``hindsight``: the fewest evaluations of any allocation whose end-to-end estimate is within 5% of the
  reference, knowing every task's whole curve in advance (a knapsack over the tasks): the bound no
  online scheduler can beat.

The reference per seed and budget is the better of the two schedulers' final end-to-end estimates (sum of
weight x best latency), as in ``bench/scheduler.py``, whose real runs this replays (it measures each plan
once and reuses it, the ``Memo``).

Run (recording takes minutes per seed on 2 cores; ``--load`` replays a saved recording instantly):

    nice -n 10 .venv/bin/python bench/scheduler_replay.py --models transformer-6 --per-task 80 --seeds 5 \\
        --budgets 60,100,150 --save bench/results/scheduler-replay-transformer-6.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from scheduler import MODELS, WITHIN, Memo, reach  # noqa: E402

from planforge.search import Budget  # noqa: E402
from planforge.search.scheduler import Gradient, RoundRobin, TaskState, schedule  # noqa: E402
from planforge.tuning import tune  # noqa: E402
from planforge.workloads.models import graph_workload  # noqa: E402


def record(name: str, per_task: int, seeds: int) -> dict:
    """Each task's metric per evaluation (None: failed), per seed, from round-robin runs of ``per_task``
    evaluations per task (the allocation does not change what a task proposes)."""
    wl = graph_workload(MODELS[name](), name, target="cpu")
    memos = [Memo(t.backend) for t in wl.tasks]
    for t, m in zip(wl.tasks, memos):
        t.backend = m
    wl = dataclasses.replace(wl, target=None)
    out = {"model": name, "tasks": {t.key: t.weight for t in wl.tasks}, "per_task": per_task, "seeds": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(seeds):
            res = tune(wl, strategy="auto", budget=Budget(evals=per_task * len(wl.tasks)), seed=seed,
                       scheduler="round-robin", records=Path(tmp) / f"{seed}.db")
            out["seeds"].append({t.key: [tr_.outcome.metric if tr_.outcome.ok else None
                                         for tr_ in tr.result.trials if tr_.n]
                                 for t, tr in zip(wl.tasks, res.tasks)})
            print(f"{name}: seed {seed} recorded", file=sys.stderr, flush=True)
    for m in memos:
        m.inner.close()
    return out


class Recorded:
    """A task's search that replays its recorded metrics (``Grantable``)."""

    def __init__(self, key: str, weight: float, metrics: list):
        self.state, self.metrics, self.i = TaskState(key, weight), metrics, 0

    def grant(self, evals, seconds=None) -> int:
        take = self.metrics[self.i:self.i + evals]
        self.i += len(take)
        st = self.state
        for m in take:
            st.evals += 1
            if m is not None:
                st.metrics.append(m)
                if st.best is None or m < st.best:
                    st.curve.append((st.evals, m))
        if len(take) < evals:
            st.stopped = "its recording ran out"
        return len(take)


def bests(metrics: list) -> list:
    out, b = [], None
    for m in metrics:
        if m is not None and (b is None or m < b):
            b = m
        out.append(b)
    return out


def replay(tasks: dict, seqs: dict, scheduler, budget: int) -> list[float]:
    """The end-to-end estimate after each evaluation of ``scheduler``'s allocation of ``budget``."""
    searches = [Recorded(k, w, seqs[k]) for k, w in tasks.items()]
    order: list[str] = []
    schedule(searches, scheduler, budget, on_grant=lambda g, states: order.extend([g.task] * g.spent))
    seen = dict.fromkeys(tasks, 0)
    best = dict.fromkeys(tasks)
    curve = []
    for k in order:
        m = seqs[k][seen[k]]
        seen[k] += 1
        if m is not None and (best[k] is None or m < best[k]):
            best[k] = m
        curve.append(math.inf if None in best.values() else sum(tasks[j] * best[j] for j in tasks))
    return curve


def hindsight(tasks: dict, seqs: dict, ref: float, budget: int) -> int:
    """The fewest evaluations of any allocation (each task at least one) within WITHIN of ``ref``, knowing
    every curve: a knapsack over tasks (total evaluations -> least end-to-end estimate)."""
    least = {0: 0.0}
    for k, w in tasks.items():
        b = bests(seqs[k][:budget])
        nxt: dict[int, float] = {}
        for tot, cost in least.items():
            for n, v in enumerate(b, 1):
                if v is not None and tot + n <= budget and cost + w * v < nxt.get(tot + n, math.inf):
                    nxt[tot + n] = cost + w * v
        least = nxt
    return min((t for t, v in least.items() if v <= ref * (1 + WITHIN)), default=budget + 1)


def score(rec: dict, budgets: list[int]) -> list[dict]:
    tasks, rows = rec["tasks"], []
    for budget in budgets:
        need: dict[str, list[int]] = {"gradient": [], "round-robin": [], "hindsight": []}
        for seqs in rec["seeds"]:
            curves = {"gradient": replay(tasks, seqs, Gradient(), budget),
                      "round-robin": replay(tasks, seqs, RoundRobin(), budget)}
            ref = min(c[-1] for c in curves.values())
            for s, c in curves.items():
                need[s].append(reach(c, ref))
            need["hindsight"].append(hindsight(tasks, seqs, ref, budget))
        med = {s: statistics.median(v) for s, v in need.items()}
        rows.append({"model": rec["model"], "budget": budget, "need": need, "median": med,
                     "gradient/rr": med["gradient"] / med["round-robin"],
                     "hindsight/rr": med["hindsight"] / med["round-robin"]})
    return rows


def synthetic(families: int, seeds: int = 5, length: int = 200, seed: int = 1) -> list[dict]:
    """Recordings of random-search tasks: 3-8 tasks per family, weights 1-6, each task's plans iid with
    log-latency |N(0, sigma)| above its best (base e^U(-1, 2), sigma U(0.1, 1.5)) and a failure rate of 0,
    2% or 10%."""
    rng = random.Random(seed)
    out = []
    for f in range(families):
        tasks = {f"t{i}": rng.randint(1, 6) for i in range(rng.randint(3, 8))}
        params = {t: (math.exp(rng.uniform(-1, 2)), rng.uniform(0.1, 1.5), rng.choice([0.0, 0.02, 0.1]))
                  for t in tasks}
        recs = []
        for _ in range(seeds):
            r = random.Random(rng.random())
            recs.append({t: [None if r.random() < fail else base * math.exp(abs(r.gauss(0, sig)))
                             for _ in range(length)] for t, (base, sig, fail) in params.items()})
        out.append({"model": f"synthetic-{f}", "tasks": tasks, "per_task": length, "seeds": recs})
    return out


def synthetic_table(recs: list[dict], per_task: list[int]) -> str:
    """Mean over families of (gradient's mean evaluations to within 5%) / (round-robin's), per budget."""
    lines = ["| budget per task | gradient / round-robin (mean over families) | hindsight / round-robin |",
             "| ---: | ---: | ---: |"]
    for n in per_task:
        g, h = [], []
        for rec in recs:
            r = score(rec, [n * len(rec["tasks"])])[0]["need"]
            rr = statistics.mean(r["round-robin"])
            g.append(statistics.mean(r["gradient"]) / rr)
            h.append(statistics.mean(r["hindsight"]) / rr)
        lines.append(f"| {n} | {statistics.mean(g):.3f} | {statistics.mean(h):.3f} |")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = ["| model | budget | gradient: median (per seed) | round-robin | hindsight optimum | gradient / rr | "
             "hindsight / rr |", "| --- | ---: | --- | --- | --- | ---: | ---: |"]
    for r in rows:
        cell = {s: f"{r['median'][s]:g} ({', '.join(map(str, r['need'][s]))})" for s in r["need"]}
        lines.append(f"| {r['model']} | {r['budget']} | {cell['gradient']} | {cell['round-robin']} | "
                     f"{cell['hindsight']} | {r['gradient/rr']:.2f} | {r['hindsight/rr']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="transformer-6", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--per-task", type=int, default=80, help="evaluations recorded per task and seed (default 80)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..S-1 (default 5)")
    ap.add_argument("--budgets", default="60,100,150", help="total budgets replayed (each at most per-task x tasks)")
    ap.add_argument("--save", type=Path, help="write the recording (JSON, one per model: NAME in the path "
                                                "is replaced by the model)")
    ap.add_argument("--load", type=Path, nargs="*", default=[], help="replay saved recordings instead of measuring")
    ap.add_argument("--synthetic", type=int, default=0, metavar="N",
                    help="replay N synthetic families of random-search tasks instead (budgets 10, 20, 40 per task)")
    a = ap.parse_args(argv)
    if a.synthetic:
        print(synthetic_table(synthetic(a.synthetic), [10, 20, 40]))
        return
    recs = [json.loads(p.read_text()) for p in a.load]
    if not recs:
        names = [m.strip() for m in a.models.split(",") if m.strip()]
        bad = [m for m in names if m not in MODELS]
        if bad:
            raise SystemExit(f"unknown model {', '.join(bad)}; choose from {', '.join(MODELS)}")
        for m in names:
            recs.append(record(m, a.per_task, a.seeds))
            if a.save:
                path = Path(str(a.save).replace("NAME", m))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(recs[-1]))
    budgets = [int(b) for b in a.budgets.split(",")]
    rows = []
    for rec in recs:
        cap = rec["per_task"] * len(rec["tasks"])
        rows += score(rec, [b for b in budgets if len(rec["tasks"]) <= b <= cap])
    print(table(rows))


if __name__ == "__main__":
    main()
