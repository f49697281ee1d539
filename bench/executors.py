"""Executors: candidates measured per minute by the local pool and by Ray, for the same space and budget.

Tunes one CPU kernel space (GEMV by default) with the same strategy, seed and
budget on: the plain loop (one local worker), the local pool (one pinned
worker per core), and Ray (a local cluster, one actor per core). Each
configuration starts from an empty build cache, so every candidate is
compiled and measured. Also measures Ray's start-up cost (cluster and actors),
the per-candidate build and measure times of each configuration, and how many
candidates per second a strategy (ask + tell) and the records database (one
committed insert per outcome) can absorb: the figures docs/scaling.md works from.

Run (timing runs take the shared bench lock):

    flock /tmp/planforge-bench.lock .venv/bin/python bench/executors.py [--budget 24] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from planforge.targets.cpu.probe import get_profile
from planforge.targets.cpu.templates import Problem
from planforge.outcome import Outcome
from planforge.search import Budget, make_strategy, search
from planforge.search import search_on
from planforge.spec import Records
from planforge.workloads.kernels import kernel_workload


def fresh_cache() -> str:
    """An empty build cache for the next configuration (so that every candidate is compiled)."""
    d = os.environ["PLANFORGE_CACHE"]  # the bench's own, set in main(): never the user's
    shutil.rmtree(os.path.join(d, "build"), ignore_errors=True)
    return d


def run(kind: str, problem: Problem, profile, budget: int, seed: int, executor: dict | None) -> dict:
    fresh_cache()
    task = kernel_workload(problem, profile=profile).tasks[0]
    strat = make_strategy("random", task.space, seed)
    t0 = time.perf_counter()
    try:
        if executor is None:
            res = search(task.space, strat, task.backend, Budget(evals=budget))
        else:
            res = search_on(executor, task.space, strat, task.backend, Budget(evals=budget))
    finally:
        task.backend.close()
    wall = time.perf_counter() - t0
    ex = res.executor or {"slots": 1, "startup_s": 0.0}
    search_s = wall - ex["startup_s"]
    out = {"config": kind, "slots": ex["slots"], "evaluations": res.evaluations, "wall_s": wall,
           "startup_s": ex["startup_s"], "per_minute": 60 * res.evaluations / search_s,
           "per_minute_with_startup": 60 * res.evaluations / wall,
           "best_s": res.ranked.best.metric if len(res.ranked) else None,
           "counts": dict(res.counts)}
    n = max(1, res.evaluations)
    if executor is None:
        out["build_s_per_candidate"] = task.backend.build_seconds / n
        out["run_s_per_candidate"] = (wall - task.backend.build_seconds) / n
    else:  # the build stage (unpinned build workers) and the measuring slots, summed over candidates
        out["build_s_per_candidate"] = ex["build_s"] / n
        out["run_s_per_candidate"] = ex["measure_s"] / n
    return out


def strategy_rate(profile, n: int = 2000) -> dict[str, float]:
    """Candidates per second a strategy absorbs (ask(1) + tell), on a large GEMM space, with made-up times."""
    from planforge.targets.cpu.templates import TEMPLATES, limits

    p = Problem("gemm", (256, 1024, 1024), "bias_relu")
    space = TEMPLATES["gemm"].space(p, limits(profile))
    rates = {}
    for name in ("random", "genetic"):
        s = make_strategy(name, space, 0)
        t0 = time.perf_counter()
        done = 0
        while done < n:
            cs = s.ask(1)
            if not cs:
                break
            s.tell([(c, Outcome.measured([1e-3 * (1 + (hash(c.fingerprint) % 1000) / 1000)])) for c in cs])
            done += len(cs)
        rates[name] = done / (time.perf_counter() - t0)
    return rates


def driver_rate(profile, executor: dict | None, n: int = 1000) -> float:
    """Candidates per second the whole driver path absorbs when measuring costs nothing: strategy, loop,
    executor round trip and a committed records insert per outcome (a zero-delay table over a GEMM space)."""
    from planforge.targets.table.table import TableBackend
    from planforge.targets.cpu.templates import TEMPLATES, limits

    p = Problem("gemm", (256, 1024, 1024), "bias_relu")
    space = TEMPLATES["gemm"].space(p, limits(profile))
    it = space.enumerate()
    table = {next(it).fingerprint: 1e-3 for _ in range(n)}
    be = TableBackend(table, label="bench")
    with tempfile.TemporaryDirectory() as d, Records(os.path.join(d, "r.db")) as db:
        run_id, _ = db.start_run("bench", "key", {})

        def record(t, target=be.fingerprint):
            db.add(run_id, "key", "task", target, t.candidate.fingerprint, t.candidate.as_dict(), t.outcome, t.n)

        strat = make_strategy("exhaustive", space, 0)
        t0 = time.perf_counter()
        if executor is None:
            res = search(space, strat, be, Budget(evals=n), on_trial=record)
        else:
            res = search_on(executor, space, strat, be, Budget(evals=n), on_done=record)
        wall = time.perf_counter() - t0 - (res.executor or {}).get("startup_s", 0.0)
    return res.evaluations / wall


def records_rate(n: int = 2000) -> float:
    """Outcomes per second the records database absorbs, each insert committed (as the driver writes them)."""
    with tempfile.TemporaryDirectory() as d, Records(os.path.join(d, "r.db")) as db:
        run_id, _ = db.start_run("bench", "key", {})
        o = Outcome.measured([1e-3] * 20)
        t0 = time.perf_counter()
        for i in range(n):
            db.add(run_id, "key", "task", "target", f"fp{i}", {"tile": i}, o, i + 1)
        return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=24, help="unique evaluations per configuration (default 24)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, configurations interleaved in each (default 3)")
    ap.add_argument("--shape", default="512,512", help="GEMV N,K (default 512,512)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray configuration")
    a = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    profile = get_profile(quick=True)
    # a build cache of the bench's own, emptied before each configuration (Ray's workers inherit it)
    os.environ["PLANFORGE_CACHE"] = tempfile.mkdtemp(prefix="pf-bench-cache-")
    n, k = (int(x) for x in a.shape.split(","))
    problem = Problem("gemv", (n, k), "bias_relu")
    cores = len(os.sched_getaffinity(0))
    configs = [("local, 1 worker (plain loop)", None),
               (f"local pool, {cores} pinned workers", {"kind": "local", "workers": cores})]
    ray_init = None
    if not a.no_ray:
        import ray

        t0 = time.perf_counter()
        ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False,
                 _temp_dir=tempfile.mkdtemp(prefix="pfray-"))
        ray_init = time.perf_counter() - t0
        configs.append((f"ray, {cores} actors (local cluster)", {"kind": "ray"}))
    runs: dict[str, list[dict]] = {name: [] for name, _ in configs}
    try:
        driver = {name: driver_rate(profile, ex) for name, ex in configs}
        for _ in range(a.rounds):  # interleaved, so that a busy phase of the machine hits every configuration
            for name, ex in configs:
                runs[name].append(run(name, problem, profile, a.budget, a.seed, ex))
    finally:
        if ray_init is not None:
            ray.shutdown()
    med = statistics.median
    results = []
    for name, rs in runs.items():
        r = dict(rs[0])
        for key in ("per_minute", "wall_s", "startup_s", "build_s_per_candidate", "run_s_per_candidate"):
            if key in r:
                r[key] = med(x[key] for x in rs)
        r["per_minute_rounds"] = [x["per_minute"] for x in rs]
        r["best_s"] = min(x["best_s"] for x in rs)
        r["per_minute_with_startup"] = 60 * r["evaluations"] / (r["wall_s"] + (ray_init or 0.0) * ("ray" in name))
        if "ray" in name:
            r["cluster_start_s"] = ray_init
        results.append(r)
    rates = {"strategy_per_s": strategy_rate(profile), "records_per_s": records_rate(), "driver_per_s": driver}
    base = results[0]["per_minute"]
    print(f"GEMV {n}x{k} bias_relu, random search seed {a.seed}, {a.budget} evaluations, {cores} cores, "
          f"median of {a.rounds} interleaved rounds; load average before: {os.getloadavg()[0]:.1f}")
    print(f"{'configuration':40s} {'cand/min':>9s} {'ratio':>6s} {'incl. start':>11s} {'start s':>8s} "
          f"{'build s':>8s} {'meas. s':>8s} rounds")
    for r in results:
        start = r["startup_s"] + r.get("cluster_start_s", 0.0)
        print(f"{r['config']:40s} {r['per_minute']:9.1f} {r['per_minute'] / base:6.2f} "
              f"{r['per_minute_with_startup']:11.1f} {start:8.2f} {r['build_s_per_candidate']:8.3f} "
              f"{r['run_s_per_candidate']:8.3f} " + " ".join(f"{x:.0f}" for x in r["per_minute_rounds"]))
    print("build s / meas. s: per candidate; the plain loop builds then measures in one step, the executors "
          "build on unpinned build workers while the slots measure")
    print("strategy ask+tell: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates["strategy_per_s"].items())
          + f"; records inserts (each committed): {rates['records_per_s']:,.0f}/s")
    print("whole driver path at zero measuring cost (strategy, loop, executor round trip, records insert): "
          + ", ".join(f"{k}: {v:,.0f}/s" for k, v in driver.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "rates": rates, "ray_init_s": ray_init, "python": sys.version.split()[0]},
                      f, indent=1)


if __name__ == "__main__":
    main()
