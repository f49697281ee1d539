"""Task scheduler: measurements to reach within 5% of the final end-to-end latency, gradient vs round-robin.

For each model: build its partitioned workload on the CPU target (timing import, partition, saturation,
extraction), then tune it with each scheduler, seeds 0..S-1, at the same total budget of evaluations. After
each evaluation of a run the end-to-end latency it has reached is estimated from its tasks' best plans so far:
sum over tasks of weight x best latency. For each seed the reference is the better of the two schedulers'
final estimates; a run's figure is the first evaluation at which its estimate is within 5% of it (budget + 1
when never); within 1% is given beside. The driver's end-to-end measurement of the whole chained plan after
the finalists (minutes per run on a shared 2-core machine) is left out unless ``--e2e`` asks for it: it
does not depend on the scheduler but on the plan chosen, which the estimate already ranks.

Every plan is measured once per model and its outcome reused by every later run that proposes it (a memo in
front of each task's backend): the runs see the same time for the same plan (so the schedulers are compared
on common measurements, not on noise), and the bench measures each plan once. Evaluations are counted per
run as the driver counts them, whether the memo answered or the CPU did.

Models: ``transformer-6`` (the zoo's six pre-LN blocks, d=256, sequence 24), ``residual-mlp-50`` (the zoo's
fifty identical residual blocks: one task, nothing to schedule, reported for its dedupe factor and phase
times) and ``resnet-mlp`` (a ResNet-50-shaped residual MLP: stages of 3, 4, 6 and 3 residual blocks at widths
64, 128, 256 and 512 with a projection between stages, batch 8; the deepest model of several tasks that
imports until convolutions existed) and ``resnet18-cnn`` (ResNet-18's stage layout with convolutions, at 32x32
and widths 16-128).

Run (a few minutes on 2 cores):

    nice -n 10 .venv/bin/python bench/scheduler.py [--budget 40] [--seeds 5] [--models transformer-6,...]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from planforge.ir import ZOO, Graph
from planforge.ir.graph import GraphBuilder
from planforge.search import Budget
from planforge.tuning import tune
from planforge.workloads.models import graph_workload

WITHIN = 0.05
SCHEDULERS = ("gradient", "round-robin")


def resnet_mlp(stages=(3, 4, 6, 3), widths=(64, 128, 256, 512), batch: int = 8, seed: int = 0) -> Graph:
    """ResNet-50's stage layout on residual MLP blocks ``x + W2 relu(W1 layernorm(x))``: ``stages[i]`` blocks
    at ``widths[i]``, a linear projection from one stage's width to the next's."""
    b = GraphBuilder(f"resnet-mlp-{'-'.join(map(str, stages))}", seed=seed)
    x = b.input("x", (batch, widths[0]))
    for s, (n, w) in enumerate(zip(stages, widths)):
        if s:
            x = b.linear(x, widths[s - 1], w, f"s{s}.proj")
        for i in range(n):
            p = f"s{s}.b{i}"
            h = b.op("layernorm", x, b.vector(f"{p}.g", w, 0.1, 1.0), b.vector(f"{p}.be", w), eps=1e-5)
            h = b.linear(b.linear(h, w, w, f"{p}.fc1", act="relu"), w, w, f"{p}.fc2")
            x = b.op("add", x, h)
    return b.output(x)


def resnet18_cnn() -> Graph:
    """ResNet-18's layout (a 3x3 stem, max pool, four stages of two basic blocks, each later stage halving the
    size and doubling the width, global average pool, linear head) at 1x3x32x32 and widths 16-128: the deepest
    convolutional model of several tasks that tunes in minutes here."""
    from planforge.ir.zoo import tiny_resnet

    return tiny_resnet(size=32, width=16, blocks=(2, 2, 2, 2))


MODELS = {"transformer-6": ZOO["transformer-6"], "residual-mlp-50": ZOO["residual-mlp-50"], "resnet-mlp": resnet_mlp,
          "resnet18-cnn": resnet18_cnn}


class Memo:
    """A task's backend that measures each plan once: a plan measured before gets its earlier outcome; the
    libraries are measured once. Everything else is the wrapped backend's. ``close`` leaves it open (the
    bench closes it after the last run)."""

    def __init__(self, inner):
        self.inner = inner
        self.outcomes: dict = {}
        self.libraries = None
        self.measure_s = 0.0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def measure(self, candidates):
        todo = [c for c in candidates if c.fingerprint not in self.outcomes]
        if todo:
            t0 = time.perf_counter()
            for c, o in zip(todo, self.inner.measure(todo)):
                self.outcomes[c.fingerprint] = o
            self.measure_s += time.perf_counter() - t0
        return [self.outcomes[c.fingerprint] for c in candidates]

    def baselines(self, libraries=None):
        if self.libraries is None:
            t0 = time.perf_counter()
            self.libraries = self.inner.baselines()
            self.measure_s += time.perf_counter() - t0
        return dict(self.libraries)

    def remeasure(self, candidates, libraries=None, rounds: int = 3):
        """The finalists' memoised outcomes (every finalist was measured in the search) and the libraries."""
        return self.measure(candidates), self.baselines()

    def close(self) -> None:
        pass


def best_at(curve, n: int) -> float | None:
    b = None
    for e, m in curve:
        if e > n:
            break
        b = m
    return b


def e2e_curve(spec: dict) -> list[float]:
    """The estimated end-to-end latency (sum of weight x best so far) after each evaluation of the run, in the
    order the scheduler granted them (inf while some task has no valid plan)."""
    tasks = spec["tasks"]
    if "schedule" in spec:
        order = [k for k, n in spec["schedule"]["grants"] for _ in range(n)]
    else:
        order = [k for k, t in tasks.items() for _ in range(t["search"]["evaluations"])]
    seen: Counter = Counter()
    out = []
    for k in order:
        seen[k] += 1
        bests = [best_at(t["search"]["curve"], seen[j]) for j, t in tasks.items()]
        out.append(math.inf if None in bests else sum(t["weight"] * b for t, b in zip(tasks.values(), bests)))
    return out


def reach(curve: list[float], ref: float) -> int:
    """The first evaluation (1-based) whose estimate is within WITHIN of ``ref``; len + 1 when none."""
    return next((i + 1 for i, v in enumerate(curve) if v <= ref * (1 + WITHIN)), len(curve) + 1)


def bench_model(name: str, budget: int, seeds: int, quiet: bool, e2e: bool = False) -> dict:
    t0 = time.perf_counter()
    graph = MODELS[name]()
    t_import = time.perf_counter() - t0
    wl = graph_workload(graph, name, target="cpu")
    memos = [Memo(t.backend) for t in wl.tasks]
    for t, m in zip(wl.tasks, memos):
        t.backend = m
    part = wl.partition
    if not e2e:  # the driver measures the chained plan end to end only for a workload that names its target
        wl = dataclasses.replace(wl, target=None)
    out = {"model": name, "ops": len(graph.nodes), "parts": len(part.parts) if part else 1,
           "tasks": {t.key: t.weight for t in wl.tasks}, "dedupe": part.dedupe if part else 1.0,
           "phases": {"import_s": t_import, **wl.phases}, "budget": budget, "runs": {}}
    if not quiet:
        print(f"{name}: {out['ops']} ops, {out['parts']} parts in {len(wl.tasks)} tasks (dedupe {out['dedupe']:.1f}x); "
              f"phases " + ", ".join(f"{k} {v:.2f}" for k, v in out["phases"].items()), file=sys.stderr, flush=True)
    schedulers = SCHEDULERS if len(wl.tasks) > 1 else SCHEDULERS[:1]  # one task: nothing to schedule
    with tempfile.TemporaryDirectory() as tmp:
        for sched in schedulers:
            for seed in range(seeds):
                r0 = time.perf_counter()
                res = tune(wl, strategy="auto", budget=Budget(evals=budget), seed=seed, scheduler=sched,
                           records=Path(tmp) / f"{sched}-{seed}.db")
                if res.spec is None:
                    raise SystemExit(f"{name}: {sched} seed {seed} found no valid plan: "
                                     + "; ".join(str(tr.error) for tr in res.tasks if tr.error))
                curve = e2e_curve(res.spec)
                e2e = res.spec.get("end_to_end") or {}
                out["runs"].setdefault(sched, []).append({
                    "seed": seed, "curve": [None if v == math.inf else v for v in curve], "final": curve[-1], "measured_e2e_s": e2e.get("median_s"),
                    "evaluations": res.spec.get("schedule", {}).get("evaluations")
                    or {k: t["search"]["evaluations"] for k, t in res.spec["tasks"].items()},
                    "search_s": sum(tr.result.seconds for tr in res.tasks), "run_s": time.perf_counter() - r0})
                if not quiet:
                    print(f"  {sched} seed {seed}: final {curve[-1] * 1e3:.3f} ms, evaluations "
                          f"{out['runs'][sched][-1]['evaluations']}, {time.perf_counter() - r0:.1f} s",
                          file=sys.stderr, flush=True)
    for m in memos:
        m.inner.close()
    out["measured_plans"] = sum(len(m.outcomes) for m in memos)
    out["measure_s"] = sum(m.measure_s for m in memos)
    runs = out["runs"]
    refs = [min(runs[s][i]["final"] for s in schedulers) for i in range(seeds)]
    summary = {}
    for s in schedulers:
        need = [reach([math.inf if v is None else v for v in r["curve"]], ref) for r, ref in zip(runs[s], refs)]
        need1 = [next((i + 1 for i, v in enumerate(r["curve"]) if v is not None and v <= ref * 1.01),
                      len(r["curve"]) + 1) for r, ref in zip(runs[s], refs)]
        summary[s] = {"to_within_5pct": need, "median": statistics.median(need),
                      "to_within_1pct": need1, "median_1pct": statistics.median(need1),
                      "final_ms": statistics.median(r["final"] for r in runs[s]) * 1e3,
                      "measured_e2e_ms": _median_ms([r["measured_e2e_s"] for r in runs[s]]),
                      "search_s": statistics.median(r["search_s"] for r in runs[s])}
    if len(schedulers) == 2:
        g, rr = summary["gradient"]["median"], summary["round-robin"]["median"]
        summary["ratio"] = g / rr
    out["summary"] = summary
    return out


def _median_ms(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) * 1e3 if xs else None


def table(results: list[dict]) -> str:
    lines = ["| model | ops | parts / tasks (dedupe) | weights | scheduler | evals to 5% (median; per seed) | "
             "within 1% (median) | final estimate | measured e2e | search s |",
             "| --- | ---: | --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in results:
        for s, v in r["summary"].items():
            if s == "ratio":
                continue
            e2e = f"{v['measured_e2e_ms']:.3f} ms" if v["measured_e2e_ms"] is not None else "-"
            lines.append(f"| {r['model']} | {r['ops']} | {r['parts']} / {len(r['tasks'])} ({r['dedupe']:.1f}x) | "
                         f"{', '.join(map(str, r['tasks'].values()))} | {s} | {v['median']:g}; "
                         f"{', '.join(map(str, v['to_within_5pct']))} | {v['median_1pct']:g} | "
                         f"{v['final_ms']:.3f} ms | {e2e} | "
                         f"{v['search_s']:.1f} |")
    lines += ["", "| model | gradient / round-robin (median evals to 5%) | import | partition | saturation | "
                  "extraction | genome | plans measured | measuring s |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        p = r["phases"]
        ratio = f"{r['summary']['ratio']:.2f}" if "ratio" in r["summary"] else "- (one task)"
        lines.append(f"| {r['model']} | {ratio} | {p['import_s']:.2f} s | {p.get('partition_s', 0):.2f} s | "
                     f"{p.get('saturation_s', 0):.2f} s | {p.get('extraction_s', 0):.2f} s | "
                     f"{p.get('genome_s', 0):.2f} s | {r['measured_plans']} | {r['measure_s']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=40, help="total evaluations per run (default 40)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..S-1 per scheduler (default 5)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--out", type=Path, default=Path("bench/results/scheduler.json"), help="raw results (JSON)")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    ap.add_argument("--e2e", action="store_true", help="let the driver measure each run's whole plan end to end")
    a = ap.parse_args(argv)
    names = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in names if m not in MODELS]
    if bad:
        raise SystemExit(f"unknown model {', '.join(bad)}; choose from {', '.join(MODELS)}")
    results = [bench_model(m, a.budget, a.seeds, a.quiet, a.e2e) for m in names]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
