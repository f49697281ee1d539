"""Replay benchmark: planforge's search strategies against Kernel Tuner's and Optuna's,
on the fully brute-forced GPU spaces of ../shared/benchmark_hub (recorded on real GPUs).

Every tool searches the same recorded spaces with the same budget of unique
evaluations and is scored the same way (see ../shared/benchmark_hub/README.md):
evaluations to within 5% of the optimum (a run that never gets there counts
budget + 1), median and 90th percentile over seeds, the fraction of runs that
got there, and the mean best-so-far curve. The optimum and every score use
planforge's replay metric, the median of each configuration's recorded raw
times; Kernel Tuner is given that same objective (a ``median_time`` metric
computed by Kernel Tuner from the cache's ``times``), so every tool optimises
exactly what it is scored on.

- planforge: each strategy through its ordinary tuning loop against the
  replay backend (``planforge.search.benchmark.replay_run``).
- Kernel Tuner: ``tune_kernel(..., simulation_mode=True, cache=FILE)`` on the
  hub's own cache files (the T4 files, which Kernel Tuner cannot read, are
  converted to caches by ``planforge.spec.export.to_kernel_tuner``), with
  ``strategy_options={"max_fevals": budget}``, seeded through ``random`` and
  ``numpy.random``. Its restrictions are the recorded configurations, failed
  ones included: a recorded failure costs an evaluation, as for everyone.
- Optuna on its own: a plain ``TPESampler`` study (ask/tell, every parameter
  categorical), told the recorded time, and ``PRUNED`` for failures and for
  configurations outside the space; repeats are not new evaluations.

Every run stops once it has measured the optimum itself: nothing after that
can change its score or its best-so-far curve, and it saves most of the time.
A peer that cannot be installed or fails to replay is reported with the
reason, never dropped.

Setup (once, from the repository root; Kernel Tuner lives in this environment only):

    python3 -m venv .venv-bench
    .venv-bench/bin/pip install -e '.[optuna,report]' -r bench/requirements-peers.txt

Run (the figures in docs/benchmarks.md come from this command):

    .venv-bench/bin/python bench/replay_peers.py --seeds 50 --budget 1000 --jobs 2 \\
        --json bench/results/replay_peers.json --plot docs/img --markdown bench/results/replay_peers.md \\
        --checkpoint /tmp/replay_peers.jsonl   # an interrupted run resumes from here
"""
from __future__ import annotations

import os

# one BLAS thread per worker process: the pool already uses every core, and Kernel Tuner's
# Gaussian process runs twice as fast without oversubscription
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import math
import random
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planforge.targets.replay.formats import FormatError, read_t1
from planforge.targets.replay.replay import Replay, load_replay
from planforge.search.benchmark import replay_run
from planforge.search.scoring import Score, score
from planforge.spec.export import rows_from_entries, to_kernel_tuner, write_json

ROOT = Path(__file__).resolve().parents[1]
HUB = ROOT.parent / "shared" / "benchmark_hub"
# planforge's own strategies ("model", the learned-ranker evolution for tasks with an analytic cost
# model, can be added with --planforge; it costs as much CPU as all the others together)
PLANFORGE = ["auto", "bandit", "thompson", "genetic", "annealing", "hillclimb", "mcts", "tpe", "random"]
# Kernel Tuner's strategies; more (simulated_annealing, mls, pso, firefly_algorithm, diff_evo, ...) with --kernel-tuner
KERNEL_TUNER = ["genetic_algorithm", "dual_annealing", "greedy_ils", "bayes_opt", "random_sample"]
OPTUNA = ["tpe"]
# Kernel Tuner's genetic algorithm stops after maxiter generations (90 by default), often long
# before the budget; raising the limit lets it spend the same budget as everyone else.
KT_OPTIONS = {"genetic_algorithm": {"maxiter": 100_000}}
COST = {("kernel_tuner", "bayes_opt"): 30, ("optuna", "tpe"): 20, ("planforge", "tpe"): 20, ("planforge", "model"): 20,
        ("planforge", "thompson"): 5}


# -- worker state (filled by the parent before the pool forks) ------------------------------

REPLAYS: dict[str, Replay] = {}
KT_CACHES: dict[str, Path] = {}


def _kt_cache_for(rep: Replay, tmp: Path) -> Path:
    """A Kernel Tuner cache file of ``rep``: the hub's own file, uncompressed, or the T4 file converted."""
    import gzip

    out = tmp / (rep.label.replace("/", "__") + ".json")
    if rep.recording.format == "kernel_tuner":
        raw = rep.path.read_bytes()
        out.write_bytes(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        return out
    rec = rep.recording
    problem = [1]
    if rec.t1 is not None:
        doc = json.loads(Path(rec.t1).read_text())
        problem = doc.get("KernelSpecification", {}).get("ProblemSize", problem)
    kt = to_kernel_tuner(rows_from_entries(rec.names, rec.entries.items()),
                         params=[(p.name, list(p.values)) for p in rec.params],
                         device_name=rep.label.split("/")[-1], kernel_name=rec.path.parent.name,
                         problem_size=problem)
    write_json(kt, out)
    return out


_KT_HEADERS: dict[str, dict] = {}


def _kt_header(label: str) -> dict:
    if label not in _KT_HEADERS:
        doc = json.loads(KT_CACHES[label].read_text())
        keys = doc["tune_params_keys"]
        members = {tuple(r[k] for k in keys) for r in doc["cache"].values() if r.get("time") != "InvalidConfig"}
        _KT_HEADERS[label] = {"keys": keys, "tune_params": {k: doc["tune_params"][k] for k in keys},
                              "kernel_name": doc["kernel_name"], "problem_size": doc["problem_size"],
                              "members": members}
    return _KT_HEADERS[label]


def run_kernel_tuner(label: str, strategy: str, seed: int, budget: int) -> list[float | None]:
    import kernel_tuner
    import kernel_tuner.util as ktu
    from constraint import FunctionConstraint

    rep = REPLAYS[label]
    h = _kt_header(label)
    members = h["members"]
    target_ms = rep.optimum * 1e3 * (1 + 1e-9)
    hit = [False]

    def median_time(p):
        t = p.get("times")
        v = float(np.median(t)) if t else float(p["time"])
        if v <= target_ms:
            hit[0] = True
        return v

    base = ktu.TuningBudget if not hasattr(ktu.TuningBudget, "_planforge") else ktu.TuningBudget.__bases__[0]

    class StopAtOptimum(base):  # Kernel Tuner checks its budget before every evaluation
        _planforge = True

        def is_done(self):
            return hit[0] or super().is_done()

        def raise_exception_if_done(self):
            if hit[0]:
                raise ktu.StopCriterionReached("measured the optimum")
            super().raise_exception_if_done()

    ktu.TuningBudget = StopAtOptimum
    random.seed(seed)
    np.random.seed(seed)
    ps = h["problem_size"]
    ps = (ps,) if isinstance(ps, int) else tuple(ps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _ = kernel_tuner.tune_kernel(
            h["kernel_name"], "", ps, [], h["tune_params"],
            restrictions=[FunctionConstraint(lambda *v: v in members)],
            cache=str(KT_CACHES[label]), simulation_mode=True, strategy=strategy,
            strategy_options={"max_fevals": budget, **KT_OPTIONS.get(strategy, {})},
            metrics={"median_time": median_time}, objective="median_time", objective_higher_is_better=False,
            quiet=True, verbose=False, seed=seed)
    names = rep.recording.names
    seen, values = set(), []
    for r in results:
        if r is None:
            continue
        cfg = tuple(r[n] for n in names)
        if cfg in seen or cfg not in rep.metrics:
            continue
        seen.add(cfg)
        values.append(rep.metrics[cfg])
    return values[:budget]


def run_optuna(label: str, seed: int, budget: int, max_trials_per_eval: int = 4, enqueue=(),
               stop_at: float | None = None) -> list[float | None]:
    """A plain TPE study; ``enqueue``: configurations (value tuples in the recording's order) put first
    into the study with ``enqueue_trial`` (a warm start); ``stop_at``: stop once a time at or below it is
    measured (default: the optimum)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rep = REPLAYS[label]
    rec = rep.recording
    dists = {p.name: optuna.distributions.CategoricalDistribution(list(p.values)) for p in rec.params
             if len(p.values) > 1}
    fixed = {p.name: p.values[0] for p in rec.params if len(p.values) == 1}
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    for cfg in enqueue:
        study.enqueue_trial({n: v for n, v in zip(rec.names, cfg) if n in dists})
    stop_at = rep.optimum if stop_at is None else stop_at
    pruned = optuna.trial.TrialState.PRUNED
    seen, values = set(), []
    for _ in range(max_trials_per_eval * budget):
        if len(values) >= budget:
            break
        trial = study.ask(dists)
        cfg = tuple(trial.params[n] if n in trial.params else fixed[n] for n in rec.names)
        o = rec.entries.get(cfg)
        if o is None or o.category == "constraints":
            study.tell(trial, state=pruned)  # outside the space: nothing measured
            continue
        m = o.metric
        if cfg not in seen:
            seen.add(cfg)
            values.append(m)
        if m is None:
            study.tell(trial, state=pruned)
        else:
            study.tell(trial, m)
            if m <= stop_at:
                break
    return values


def run_job(job: tuple) -> tuple:
    kind, label, strategy, seed, budget = job
    t0 = time.process_time()
    try:
        if kind == "planforge":
            values = replay_run(REPLAYS[label], strategy, seed, budget).values
        elif kind == "kernel_tuner":
            values = run_kernel_tuner(label, strategy, seed, budget)
        else:
            values = run_optuna(label, seed, budget)
        return job, values, time.process_time() - t0, None
    except Exception as e:  # a peer that fails to replay is reported, not dropped
        tb = traceback.format_exc(limit=3).strip().splitlines()
        return job, None, time.process_time() - t0, f"{type(e).__name__}: {e} ({tb[-3] if len(tb) > 2 else ''})"


# -- the report ------------------------------------------------------------------------------


@dataclass
class Cell:
    kind: str
    strategy: str
    score: Score | None
    cpu_s: float
    error: str | None = None

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.strategy}"


def available(kind: str) -> str | None:
    """None when the peer can run here, else why not."""
    try:
        if kind == "kernel_tuner":
            import constraint  # noqa: F401
            import kernel_tuner  # noqa: F401
        elif kind == "optuna":
            import optuna  # noqa: F401
    except ImportError as e:
        return f"{kind} is not installed in this environment ({e}); see bench/requirements-peers.txt"
    return None


def fmt(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else (f"{x:.0f}" if x == int(x) else f"{x:.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hub", type=Path, default=HUB, help="benchmark hub folder (default ../shared/benchmark_hub)")
    ap.add_argument("--budget", type=int, default=1000, help="unique evaluations per run (default 1000)")
    ap.add_argument("--seeds", type=int, default=50, help="runs per strategy and space (default 50)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--planforge", default=",".join(PLANFORGE), help="planforge strategies (comma-separated)")
    ap.add_argument("--kernel-tuner", default=",".join(KERNEL_TUNER), help="Kernel Tuner strategies ('' for none)")
    ap.add_argument("--optuna", default="tpe", help="'tpe' to run Optuna TPE on its own, '' for none")
    ap.add_argument("--spaces", default="", help="only files whose path contains one of these (comma-separated)")
    ap.add_argument("--json", type=Path, help="write every score (and the curves) to this JSON file")
    ap.add_argument("--plot", type=Path, help="save best-so-far curves (PNG per space) in this folder")
    ap.add_argument("--markdown", type=Path, help="write the tables as Markdown to this file (for docs/benchmarks.md)")
    ap.add_argument("--cheap-first", action="store_true", help="run the cheap strategies first (default: the slow)")
    ap.add_argument("--checkpoint", type=Path, help="append every finished run to this JSONL file and skip the runs "
                                                     "it already holds, so an interrupted benchmark resumes")
    args = ap.parse_args(argv)

    files = sorted((args.hub / "cachefiles").glob("*/*.json*"))
    if args.spaces:
        files = [f for f in files if any(s in str(f) for s in args.spaces.split(","))]
    if not files:
        print(f"error: no recorded spaces under {args.hub / 'cachefiles'}", file=sys.stderr)
        return 2
    try:
        replays = [load_replay(f) for f in files]
    except FormatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for r in replays:
        REPLAYS[r.label] = r
    groups = {"planforge": [s for s in args.planforge.split(",") if s],
              "kernel_tuner": [s for s in args.kernel_tuner.split(",") if s],
              "optuna": [s for s in args.optuna.split(",") if s]}
    unavailable = {k: available(k) for k in groups if groups[k]}
    tmp = Path(tempfile.mkdtemp(prefix="planforge-kt-"))
    if groups["kernel_tuner"] and not unavailable.get("kernel_tuner"):
        for r in replays:
            KT_CACHES[r.label] = _kt_cache_for(r, tmp)
    jobs = [(kind, r.label, s, seed, args.budget) for kind, names in groups.items() if not unavailable.get(kind)
            for s in names for r in replays for seed in range(args.seeds)]
    # the slow ones first, so the pool ends together; or the cheap ones first, so that an interrupted run
    # has every cheap comparison (and resumes with the slow ones from its checkpoint)
    jobs.sort(key=lambda j: (1 if args.cheap_first else -1) * COST.get((j[0], j[2]), 1))
    out: list[tuple] = []
    done: set[tuple] = set()
    if args.checkpoint and args.checkpoint.exists():
        wanted = set(jobs)
        for line in args.checkpoint.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut off by an interruption
            job = tuple(rec["job"])
            if job in wanted and job not in done:
                done.add(job)
                out.append((job, rec["values"], rec["cpu_s"], rec["error"]))
        jobs = [j for j in jobs if j not in done]
        print(f"resuming: {len(done)} runs from {args.checkpoint}", file=sys.stderr)
    sink = args.checkpoint.open("a") if args.checkpoint else None

    def keep(res: tuple) -> None:
        out.append(res)
        if sink:
            job, values, secs, err = res
            sink.write(json.dumps({"job": list(job), "values": values, "cpu_s": secs, "error": err}) + "\n")
            sink.flush()

    started = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    print(f"replaying {len(replays)} spaces x {sum(len(v) for k, v in groups.items() if not unavailable.get(k))} "
          f"strategies x {args.seeds} seeds = {len(jobs)} runs, budget {args.budget}, {args.jobs} processes",
          file=sys.stderr)
    if args.jobs > 1 and jobs:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(args.jobs) as pool:
            for i, res in enumerate(pool.imap_unordered(run_job, jobs, chunksize=1), start=1):
                keep(res)
                if i % 100 == 0 or i == len(jobs):
                    print(f"  {i}/{len(jobs)} runs, {time.time() - started:.0f} s", file=sys.stderr)
    else:
        for i, job in enumerate(jobs, start=1):
            keep(run_job(job))
            if i % 100 == 0:
                print(f"  {i}/{len(jobs)} runs, {time.time() - started:.0f} s", file=sys.stderr)
    if sink:
        sink.close()
    wall = time.time() - started

    cells: dict[str, list[Cell]] = {r.label: [] for r in replays}
    runs: dict[tuple, list] = {}
    cpu: dict[tuple, float] = {}
    errors: dict[tuple, str] = {}
    for (kind, label, s, seed, _), values, secs, err in out:
        key = (label, kind, s)
        cpu[key] = cpu.get(key, 0.0) + secs
        if err is not None:
            errors.setdefault(key, err)
        else:
            runs.setdefault(key, []).append((seed, values))
    for r in replays:
        for kind, names in groups.items():
            for s in names:
                key = (r.label, kind, s)
                if unavailable.get(kind):
                    cells[r.label].append(Cell(kind, s, None, 0.0, unavailable[kind]))
                elif key in errors:
                    cells[r.label].append(Cell(kind, s, None, cpu.get(key, 0.0), errors[key]))
                else:
                    vals = [v for _, v in sorted(runs[key], key=lambda x: x[0])]
                    cells[r.label].append(Cell(kind, s, score(vals, r.optimum, args.budget), cpu[key]))
    report = summarise(replays, cells, args.budget)
    print_report(replays, cells, report, args, wall, stamp)
    if args.json:
        write_results(args.json, replays, cells, report, args, wall, stamp)
    if args.plot:
        plot(args.plot, replays, cells, args.budget)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(replays, cells, report, args, wall, stamp))
    return 0


def summarise(replays, cells, budget) -> dict:
    """Per space: the default's score, the best peer, their ratio and the target checks."""
    per = {}
    for r in replays:
        cs = {c.key: c for c in cells[r.label]}
        default = cs.get("planforge:auto")
        rand = cs.get("planforge:random")
        peers = [c for c in cells[r.label] if c.kind != "planforge" and c.score is not None]
        best = min(peers, key=lambda c: (c.score.median, c.score.p90)) if peers else None
        d = {"default": default.score.median if default and default.score else None,
             "default_p90": default.score.p90 if default and default.score else None,
             "random": rand.score.median if rand and rand.score else None,
             "best_peer": best.key if best else None,
             "best_peer_median": best.score.median if best else None}
        d["ratio"] = (d["default"] / d["best_peer_median"]) if d["default"] is not None and best else None
        d["not_worse_than_random"] = (d["default"] <= d["random"]) if None not in (d["default"], d["random"]) else None
        per[r.label] = d
    ratios = [d["ratio"] for d in per.values() if d["ratio"] is not None]
    return {"spaces": per, "median_ratio": float(np.median(ratios)) if ratios else None,
            "target_half_of_best_peer": (float(np.median(ratios)) <= 0.5) if ratios else None,
            "target_never_worse_than_random": all(d["not_worse_than_random"] for d in per.values())
            if all(d["not_worse_than_random"] is not None for d in per.values()) else None}


def print_report(replays, cells, report, args, wall, stamp) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)
    con.print(f"[bold]Replay on recorded GPU spaces[/]: budget {args.budget} unique evaluations, {args.seeds} seeds, "
              f"{args.jobs} processes, {wall:.0f} s wall, {stamp}")
    for r in replays:
        t = Table(title=f"{r.label} ({len(r.space.valid_ints())} configurations, optimum {r.optimum * 1e3:.4g} ms)")
        for col in ("tool", "strategy", "median", "p90", "success", "best@100", f"best@{args.budget}", "cpu s"):
            t.add_column(col, justify="right" if col not in ("tool", "strategy") else "left")
        for c in sorted(cells[r.label], key=lambda c: (c.score is None, c.score.median if c.score else 0,
                                                        c.score.p90 if c.score else 0)):
            if c.score is None:
                t.add_row(c.kind, c.strategy, "not run", "", "", "", "", f"{c.cpu_s:.0f}")
                continue
            sc = c.score
            t.add_row(c.kind, c.strategy, fmt(sc.median), fmt(sc.p90), f"{sc.success_rate:.0%}",
                      f"{sc.curve_at(100):.3f}", f"{sc.curve_at(args.budget):.3f}", f"{c.cpu_s:.0f}")
        con.print(t)
        for c in cells[r.label]:
            if c.error:
                con.print(f"  [yellow]not run[/] {c.kind}:{c.strategy}: {c.error}", highlight=False)
    t = Table(title="planforge default (auto) vs the best peer (median evaluations to within 5%)")
    for col in ("space", "auto", "auto p90", "random", "best peer", "peer median", "ratio", "<= random"):
        t.add_column(col)
    for label, d in report["spaces"].items():
        t.add_row(label, fmt(d["default"]), fmt(d["default_p90"]), fmt(d["random"]), str(d["best_peer"]),
                  fmt(d["best_peer_median"]), "-" if d["ratio"] is None else f"{d['ratio']:.2f}",
                  str(d["not_worse_than_random"]))
    con.print(t)
    mr = report["median_ratio"]
    con.print(f"median ratio over spaces: {'-' if mr is None else f'{mr:.2f}'} (target <= 0.50: "
              f"{report['target_half_of_best_peer']}); never worse than random: "
              f"{report['target_never_worse_than_random']}")


def markdown(replays, cells, report, args, wall, stamp) -> str:
    """The summary table and one table per space, as Markdown."""
    lines = ["| space | configurations | auto median | auto p90 | random median | best peer | peer median | peer p90 "
             "| auto / best peer | auto <= random |", "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    for r in replays:
        d = report["spaces"][r.label]
        peer = next((c for c in cells[r.label] if c.key == d["best_peer"]), None)
        lines.append(f"| {r.label} | {len(r.space.valid_ints())} | {fmt(d['default'])} | {fmt(d['default_p90'])} | "
                     f"{fmt(d['random'])} | {d['best_peer']} | {fmt(d['best_peer_median'])} | "
                     f"{fmt(peer.score.p90) if peer else '-'} | "
                     f"{'-' if d['ratio'] is None else format(d['ratio'], '.2f')} | "
                     f"{'yes' if d['not_worse_than_random'] else 'no'} |")
    mr = report["median_ratio"]
    lines += ["", f"Median over spaces of auto / best peer: **{'-' if mr is None else f'{mr:.2f}'}** (target <= 0.50: "
                  f"{'met' if report['target_half_of_best_peer'] else 'missed'}); auto never needs more evaluations "
                  f"than random sampling (median): {'met' if report['target_never_worse_than_random'] else 'missed'}.",
              ""]
    for r in replays:
        lines += [f"#### {r.label} ({len(r.space.valid_ints())} configurations, optimum {r.optimum * 1e3:.4g} ms)", "",
                  f"| tool | strategy | median | p90 | success | best@10 | best@100 | best@{args.budget} | CPU s |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for c in sorted(cells[r.label], key=lambda c: (c.score is None, c.score.median if c.score else 0,
                                                        c.score.p90 if c.score else 0)):
            if c.score is None:
                lines.append(f"| {c.kind} | {c.strategy} | not run: {c.error} | | | | | | |")
                continue
            sc = c.score
            lines.append(f"| {c.kind} | {c.strategy} | {fmt(sc.median)} | {fmt(sc.p90)} | {sc.success_rate:.0%} | "
                         f"{sc.curve_at(10):.3f} | {sc.curve_at(100):.3f} | {sc.curve_at(args.budget):.3f} | "
                         f"{c.cpu_s:.0f} |")
        lines.append("")
    return "\n".join(lines)


def write_results(path: Path, replays, cells, report, args, wall, stamp) -> None:
    doc = {"date": stamp, "budget": args.budget, "seeds": args.seeds, "jobs": args.jobs, "wall_s": round(wall, 1),
           "command": "python bench/replay_peers.py " + " ".join(sys.argv[1:]), "summary": report,
           "files": {r.label: r.describe() for r in replays}, "spaces": {}}
    for r in replays:
        d = {}
        for c in cells[r.label]:
            d[c.key] = ({"error": c.error} if c.score is None else
                        {**c.score.to_json(full_curve=False), "cpu_s": round(c.cpu_s, 1),
                         "mean_best_so_far": {str(n): round(c.score.curve_at(n), 4)
                                              for n in (10, 20, 50, 100, 200, 500, args.budget)}})
        doc["spaces"][r.label] = d
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str))


def plot(folder: Path, replays, cells, budget) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    for r in replays:
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=90)
        for c in cells[r.label]:
            if c.score is None:
                continue
            style = "-" if c.kind == "planforge" else ("--" if c.kind == "kernel_tuner" else ":")
            width = 2.4 if c.key == "planforge:auto" else 1.0
            ax.plot(np.arange(1, budget + 1), c.score.curve, style, lw=width, label=c.key)
        ax.set_xscale("log")
        ax.set_ylim(0.98, 1.6)
        ax.axhline(1.05, color="grey", lw=0.6)
        ax.set_xlabel("unique evaluations")
        ax.set_ylabel("mean best-so-far / optimum")
        ax.set_title(r.label)
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(folder / f"replay_{r.label.replace('/', '_')}.png")
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
