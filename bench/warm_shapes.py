"""Warm starts between shapes on this CPU (issue 20, item 4): a kernel tuned at one shape warm-starts another.

Pairs (source -> target): GEMM 256x1024x1024 -> 256x1024x2048 and -> 128x1024x1024; GEMV 1x1024x1024 ->
1x2048x2048. The source is tuned once (``planforge tune``, default strategy); each target is tuned cold (a
fresh records database, so ``auto`` finds nothing to warm from) and warm (``--warm-start`` the source's
records database), with the same budget and seed. Scored by the measured evaluations each needed to get
within 5% of the *cold* run's best (the warm run is judged against the cold one's best; a run that never
got there counts budget + 1). Measurements are real ones on this machine, so they carry its noise: the
load average is recorded with the results.

The same plan's time moves between two runs minutes apart on a shared machine (``same_config_warm_over_cold``),
so ``--remeasure ROUNDS`` also scores each pair against times taken side by side: after both tunings of a pair,
every configuration either run measured is measured again in one process (one worker), the cold run's and the
warm run's configurations interleaved (A B A B), ROUNDS rounds, each configuration's time the median of its
rounds; the cold run's best is then the best re-measured time of what it measured, and each run is scored by
the first evaluation (in the order it measured them) whose configuration's re-measured time is within 5% of it
(``cold_evals_re`` / ``warm_evals_re``; ``median_over_pairs_re``). ``--alternate`` tunes the warm run first on odd
seeds, so that a load that changes over the run does not always favour the run tuned second.

    .venv/bin/python bench/warm_shapes.py --budget 32 --seeds 3 --json bench/results/warm_shapes.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PAIRS = [("gemm", "256,1024,1024", "256,1024,2048"), ("gemm", "256,1024,1024", "128,1024,1024"),
         ("gemv", "1024,1024", "2048,2048")]


def tune(workload: str, shape: str, budget: int, seed: int, out: Path, warm: Path | None = None) -> dict:
    cmd = [sys.executable, "-m", "planforge", "tune", "-w", workload, "--shape", shape, "--budget", str(budget),
           "--seed", str(seed), "--out", str(out), "--quiet"]
    if warm is not None:
        cmd += ["--warm-start", str(warm)]
    t0 = time.time()
    done = out / "stdout.txt"
    if not done.exists():  # a finished tuning is read back (delete the folder to measure it again)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
        done.write_text(p.stdout)
    stdout = done.read_text()
    spec = json.loads((out / "spec.json").read_text())
    [task] = spec["tasks"].values()
    s = task["search"]
    return {"curve": s["curve"], "evaluations": s["evaluations"], "strategy": s["strategy"], "wall_s": time.time() - t0,
            "final_s": task["latency_s"], "warm_note": [ln for ln in stdout.splitlines() if "warm-started" in ln],
            "warm_stage": next((st for st in task.get("funnel") or [] if st["stage"] == "warm"), None)}


def drift(cold_db: Path, warm_db: Path) -> dict | None:
    """Warm time / cold time of every configuration both runs measured: what this machine's run-to-run drift is
    on the same plan, against which "within 5%" is judged (None when the runs share no measured configuration)."""
    from planforge.spec.records import Records

    def times(db: Path) -> dict[str, float]:
        with Records(db) as r:
            return {x.fingerprint: x.outcome.metric for x in r.records(status="measured") if x.outcome.metric}

    cold, warm = times(cold_db), times(warm_db)
    ratios = sorted(warm[f] / cold[f] for f in cold.keys() & warm.keys())
    if not ratios:
        return None
    return {"configs": len(ratios), "min": round(ratios[0], 3), "median": round(ratios[len(ratios) // 2], 3),
            "max": round(ratios[-1], 3)}


def measured_order(db: Path) -> list[tuple[int, str, dict]]:
    """(evaluation, fingerprint, configuration) of every measurement of the run in ``db``, in the order it measured
    them (failures included: they are evaluations too; what the funnel rejected unmeasured, evaluation 0, is not)."""
    from planforge.spec.records import Records

    with Records(db) as r:
        return [(x.evaluation, x.fingerprint, x.candidate) for x in r.records()
                if x.evaluation > 0 and x.outcome.status != "rejected"]


def interleave(a: list, b: list) -> list:
    """a[0] b[0] a[1] b[1] ..., each item once (the first time it comes)."""
    out, seen = [], set()
    for i in range(max(len(a), len(b))):
        for side in (a, b):
            if i < len(side) and side[i] not in seen:
                seen.add(side[i])
                out.append(side[i])
    return out


def remeasure(workload: str, shape: str, seed: int, cold_db: Path, warm_db: Path, rounds: int) -> dict:
    """Every configuration either run measured, measured again in one worker: the cold run's and the warm run's
    interleaved (A B A B), ``rounds`` rounds; a configuration's time is the median of its rounds (a failure in
    any round leaves it without one). Returns the times by fingerprint and the rounds' wall time."""
    import statistics

    from planforge.workloads import kernels

    if rounds < 1:
        raise SystemExit(f"--remeasure takes a number of rounds >= 1, not {rounds}")
    w = kernels.gemm(shape, seed=seed) if workload == "gemm" else kernels.gemv(shape, seed=seed)
    [task] = w.tasks
    cold, warm = measured_order(cold_db), measured_order(warm_db)
    configs = {fp: cfg for _, fp, cfg in cold + warm}
    order = interleave([fp for _, fp, _ in cold], [fp for _, fp, _ in warm])
    cands = {fp: task.space.make(configs[fp]) for fp in order}
    backend = task.backend
    libs, times, failed = {}, {fp: [] for fp in order}, set()
    for fp, b in zip(order, backend.build([cands[fp] for fp in order])):
        if isinstance(b, str):
            libs[fp] = b
        else:
            failed.add(fp)
    t0 = time.time()
    for _ in range(rounds):
        for fp in order:
            if fp in failed:
                continue
            o = backend.measure_built(cands[fp], libs[fp])
            if o.ok:
                times[fp].append(o.metric)
            else:
                failed.add(fp)
    backend.worker.close()
    med = {fp: statistics.median(t) for fp, t in times.items() if t and fp not in failed}
    return {"times": med, "configs": len(order), "failed": len(failed), "wall_s": round(time.time() - t0, 1),
            "cold": cold, "warm": warm}


def evals_to(order: list[tuple[int, str, dict]], times: dict[str, float], bound: float, budget: int) -> int:
    """The first evaluation whose configuration's (re-measured) time is within ``bound``; budget + 1 when none."""
    return next((n for n, fp, _ in order if fp in times and times[fp] <= bound), budget + 1)


def evals_within(curve: list, bound: float, budget: int) -> int:
    return next((n for n, m in curve if m <= bound), budget + 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=3, help="how many seeds (default 3)")
    ap.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/planforge-warm-shapes"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--remeasure", type=int, default=0, metavar="ROUNDS",
                    help="after both tunings of a pair, measure every configuration either run measured again, "
                         "cold and warm interleaved, ROUNDS rounds, and score against those times (default 0: off)")
    ap.add_argument("--alternate", action="store_true", help="tune the warm run first on odd seeds (default: the "
                    "cold run first on every seed)")
    ap.add_argument("--pairs", default="", help="only these pairs, by index into PAIRS (e.g. 1 or 0,2; default all)")
    args = ap.parse_args(argv)
    os.environ.setdefault("PLANFORGE_PROBE", "quick")
    t0 = time.time()
    load0 = os.getloadavg()[0]
    sources: dict[tuple[str, str, int], Path] = {}
    rows = []
    try:
        pairs = [PAIRS[int(i)] for i in args.pairs.split(",")] if args.pairs else PAIRS
    except (ValueError, IndexError):
        raise SystemExit(f"--pairs takes indices 0..{len(PAIRS) - 1} separated by commas, not {args.pairs!r}") from None
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for wl, src, dst in pairs:
            key = (wl, src, seed)
            if key not in sources:
                out = args.work / f"src-{wl}-{src.replace(',', 'x')}-s{seed}"
                tune(wl, src, args.budget, seed, out)
                sources[key] = out / "records.db"
            tag = f"{wl}-{src.replace(',', 'x')}-to-{dst.replace(',', 'x')}-s{seed}"
            # which of the two is tuned first alternates with the seed (--alternate), so that a load that rises or
            # falls over the hour favours neither side over the seeds
            warm_first = args.alternate and seed % 2 == 1
            runs = {}
            for side in (("warm", "cold") if warm_first else ("cold", "warm")):
                runs[side] = tune(wl, dst, args.budget, seed, args.work / f"{side}-{tag}",
                                  warm=sources[key] if side == "warm" else None)
            cold, warm = runs["cold"], runs["warm"]
            best = min(m for _, m in cold["curve"])
            bound = 1.05 * best
            row = {"workload": wl, "source": src, "target": dst, "seed": seed, "cold_best_s": best,
                   "tuned_first": "warm" if warm_first else "cold",
                   "warm_best_s": min(m for _, m in warm["curve"]),
                   "cold_evals": evals_within(cold["curve"], bound, args.budget),
                   "warm_evals": evals_within(warm["curve"], bound, args.budget),
                   "warm_start": warm["strategy"].get("warm_start"), "warm_stage": warm["warm_stage"],
                   "cold_wall_s": round(cold["wall_s"]),
                   "warm_wall_s": round(warm["wall_s"]),
                   "same_config_warm_over_cold": drift(args.work / f"cold-{tag}" / "records.db",
                                                       args.work / f"warm-{tag}" / "records.db")}
            row["warm_over_cold"] = row["warm_evals"] / row["cold_evals"]
            # the same against the cold run's chosen plan as re-measured at its end (less at the mercy of one
            # lucky measurement on a loaded machine)
            final = 1.05 * cold["final_s"]
            row.update(cold_final_s=cold["final_s"], warm_final_s=warm["final_s"],
                       cold_evals_final=evals_within(cold["curve"], final, args.budget),
                       warm_evals_final=evals_within(warm["curve"], final, args.budget),
                       cold_curve=cold["curve"], warm_curve=warm["curve"])
            rows.append(row)
            print(f"{wl} {src} -> {dst} seed {seed}: cold {row['cold_evals']} evals to within 5% of its best "
                  f"({best * 1e6:.1f} us), warm {row['warm_evals']} (best {row['warm_best_s'] * 1e6:.1f} us)",
                  flush=True)
            if args.remeasure:
                la = os.getloadavg()[0]
                re = remeasure(wl, dst, seed, args.work / f"cold-{tag}" / "records.db",
                               args.work / f"warm-{tag}" / "records.db", args.remeasure)
                t = re["times"]
                cold_t = [t[fp] for _, fp, _ in re["cold"] if fp in t]
                warm_t = [t[fp] for _, fp, _ in re["warm"] if fp in t]
                if not cold_t:
                    raise SystemExit(f"{tag}: no configuration of the cold run could be measured again")
                rb = 1.05 * min(cold_t)
                row.update(remeasured={"rounds": args.remeasure, "configs": re["configs"], "failed": re["failed"],
                                       "wall_s": re["wall_s"], "load_average": [round(la, 2), round(os.getloadavg()[0], 2)],
                                       "cold_best_s": min(cold_t), "warm_best_s": min(warm_t) if warm_t else None,
                                       "times": t},
                           cold_evals_re=evals_to(re["cold"], t, rb, args.budget),
                           warm_evals_re=evals_to(re["warm"], t, rb, args.budget))
                row["warm_over_cold_re"] = row["warm_evals_re"] / row["cold_evals_re"]
                print(f"  re-measured side by side ({args.remeasure} rounds, {re['configs']} configurations, "
                      f"{re['wall_s']} s): cold {row['cold_evals_re']} evals to within 5% of its best "
                      f"({min(cold_t) * 1e6:.1f} us), warm {row['warm_evals_re']}"
                      + (f" (best {min(warm_t) * 1e6:.1f} us)" if warm_t else ""), flush=True)
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "budget": args.budget,
           "seeds": list(range(args.first_seed, args.first_seed + args.seeds)),
           "load_average": [round(load0, 2), round(os.getloadavg()[0], 2)], "wall_s": round(time.time() - t0),
           "pairs": rows, "median_warm_over_cold": sorted(r["warm_over_cold"] for r in rows)[len(rows) // 2]}
    out["median_warm_over_cold_final"] = sorted(r["warm_evals_final"] / r["cold_evals_final"] for r in rows)[len(rows) // 2]
    # per pair, the median over seeds of warm / cold evaluations; then the median over the pairs
    per_pair = {}
    for r in rows:
        per_pair.setdefault(f"{r['workload']} {r['source']} -> {r['target']}", []).append(r)
    out["per_pair"] = {k: {"cold_evals": sorted(x["cold_evals"] for x in v), "warm_evals": sorted(x["warm_evals"] for x in v),
                           "median_warm_over_cold": sorted(x["warm_over_cold"] for x in v)[len(v) // 2]}
                       for k, v in per_pair.items()}
    pm = sorted(v["median_warm_over_cold"] for v in out["per_pair"].values())
    out["median_over_pairs"] = pm[len(pm) // 2]
    if args.remeasure:  # the same, scored against the times re-measured side by side
        for k, v in per_pair.items():
            out["per_pair"][k].update(cold_evals_re=sorted(x["cold_evals_re"] for x in v),
                                      warm_evals_re=sorted(x["warm_evals_re"] for x in v),
                                      median_warm_over_cold_re=sorted(x["warm_over_cold_re"] for x in v)[len(v) // 2])
        pm = sorted(v["median_warm_over_cold_re"] for v in out["per_pair"].values())
        out["median_over_pairs_re"] = pm[len(pm) // 2]
    print(json.dumps({k: v for k, v in out.items() if k != "pairs"}, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
