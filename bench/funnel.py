"""The L0 funnel against measurements: how much it prunes, and whether the best survives.

For each shape (GEMM (64, 256, 256) and (256, 1024, 1024); (1, 1024, 1024)
is a GEMV, as ``planforge tune --workload gemm`` maps M = 1), measure a
uniform sample of the valid space once (the whole space where it is small),
then run the funnel on that sample as the driver runs it on a space:

1. capacity: drop points whose tiles do not fit on chip;
2. order the rest by the analytic model's predicted latency and keep the top
   ``--top-k`` fraction (default 0.1) of the sample;
3. walk that list in predicted order, "measuring" each point (a lookup of its
   recorded time) unless its roofline lower bound is already slower than the
   best measured so far (the roofline stage).

Reported per shape: the fraction of the sample never measured, whether the
best the funnel measured is within 5% of the sample's best (recall), the rank
of the sample's best in the predicted order, the analytic model's Spearman
(prediction and bound) with the measurements, and how many measurements fell
below their lower bound (should be none).

Measuring is timing-sensitive: run under the shared lock, e.g.

    flock /tmp/planforge-bench.lock .venv/bin/python bench/funnel.py --measure
    .venv/bin/python bench/funnel.py            # analyse the recorded samples

Samples are written to ``bench/results/funnel-<shape>.json`` (one object per
point: knobs, median seconds or the failure category) and reused.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np

from planforge.targets.cpu.kernel import CpuBackend
from planforge.targets.cpu.probe import get_profile
from planforge.targets.cpu.target import CpuTarget
from planforge.costmodel import kendall, spearman
from planforge.costmodel.analytic import AnalyticModel
from planforge.costmodel.columns import index_columns, valid_points
from planforge.targets.cpu.templates import TEMPLATES, Problem, limits
from planforge.measure import TimingConfig

SHAPES = {"64x256x256": Problem("gemm", (64, 256, 256), "bias_relu"),
          "256x1024x1024": Problem("gemm", (256, 1024, 1024), "bias_relu"),
          "1x1024x1024": Problem("gemv", (1024, 1024), "bias_relu")}
RESULTS = Path(__file__).resolve().parent / "results"
TIMING = TimingConfig(warmup_s=0.005, budget_s=0.05, min_repeats=3, max_repeats=15)
WITHIN = 0.05
SMALL = 1000
MARGIN = 0.1  # the driver's default (costmodel.funnel.Funnel.margin)


def sample_points(space, n: int, seed: int) -> np.ndarray:
    idx = valid_points(space)
    if len(idx) <= max(n, SMALL):  # a small space is measured whole
        return idx
    rng = np.random.default_rng(seed)
    return idx[np.sort(rng.choice(len(idx), size=n, replace=False))]


def result_path(name: str, seed: int) -> Path:
    """Seed 0's sample is ``funnel-<shape>.json``; another seed's, an independent one, ``...-s<seed>.json``."""
    return RESULTS / (f"funnel-{name}.json" if seed == 0 else f"funnel-{name}-s{seed}.json")


def measure(name: str, p: Problem, n: int, seed: int, chunk: int = 16) -> Path:
    prof = get_profile()
    space = TEMPLATES[p.op].space(p, limits(prof))
    path = result_path(name, seed)
    done = json.loads(path.read_text()) if path.exists() else {"points": []}
    have = {json.dumps(r["knobs"], sort_keys=True) for r in done["points"]}
    idx = sample_points(space, n, seed)
    cands = [space.candidate(tuple(int(i) for i in row)) for row in idx]
    todo = [c for c in cands if json.dumps(c.as_dict(), sort_keys=True) not in have]
    be = CpuBackend(p, TEMPLATES[p.op], prof, timing=TIMING)
    t0 = time.time()
    done.update({"problem": p.to_json(), "device": prof.fingerprint, "valid": len(valid_points(space)),
                 "space": space.size, "timing": TIMING.to_json(), "seed": seed})
    try:
        for s in range(0, len(todo), chunk):
            part = todo[s:s + chunk]
            for c, o in zip(part, be.measure(part)):
                done["points"].append({"knobs": c.as_dict(), "metric": o.metric, "status": o.status,
                                       "category": o.category, "spread": o.spread})
            RESULTS.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(done, indent=0, sort_keys=True))
            print(f"{name}: {len(done['points'])}/{len(cands)} measured, {time.time() - t0:.0f} s", file=sys.stderr)
    finally:
        be.close()
    return path


def funnel_on_sample(model, space, points: list[dict], top_k: float) -> dict:
    cands = [space.make(r["knobs"]) for r in points]
    idx = np.array([c.index for c in cands])
    est = model.evaluate(index_columns(space, idx))
    meas = np.array([r["metric"] if r["metric"] is not None else math.inf for r in points])
    ok = np.isfinite(meas)
    one = np.array([r["knobs"]["threads"] == 1 for r in points])
    best = float(meas[ok].min())
    fit = np.flatnonzero(est.fits)
    order = fit[np.lexsort((np.arange(len(fit)), est.predicted_s[fit]))]
    k = max(1, math.ceil(top_k * len(points)))
    measured, pruned, incumbent = [], 0, math.inf
    for i in order[:k]:
        if est.bound_s[i] > incumbent * (1 + MARGIN):
            pruned += 1
            continue
        measured.append(i)
        if meas[i] < incumbent:
            incumbent = meas[i]
    found = float(min(meas[i] for i in measured)) if measured else math.inf
    rank_of_best = int(np.flatnonzero(order == int(np.argmin(meas)))[0]) + 1 if np.argmin(meas) in order else None
    near = [i for i in order if meas[i] <= best * (1 + WITHIN)]
    first_near = int(np.flatnonzero(np.isin(order, near))[0]) + 1 if near else None
    below = int(np.sum(ok & (meas < est.bound_s)))
    return {
        "sample": len(points), "measured_ok": int(ok.sum()), "capacity": len(fit), "top_k": min(k, len(fit)),
        "roofline_pruned": pruned, "measured": len(measured),
        "pruned_fraction": 1 - len(measured) / len(points),
        "best_s": best, "funnel_best_s": found, "funnel_best_ratio": found / best,
        "recall": found <= best * (1 + WITHIN),
        "best_rank_in_prediction": rank_of_best, "first_within_5pct_rank": first_near,
        "best_pruned_by_capacity": bool(not est.fits[int(np.argmin(meas))]),
        "spearman_pred": spearman(est.predicted_s[ok].tolist(), meas[ok].tolist()),
        "kendall_pred": kendall(est.predicted_s[ok].tolist(), meas[ok].tolist()),
        "spearman_bound": spearman(est.bound_s[ok].tolist(), meas[ok].tolist()),
        # one thread only: on a shared 2-core machine a 2-thread plan waits for the other core
        "spearman_pred_1t": spearman(est.predicted_s[ok & one].tolist(), meas[ok & one].tolist()),
        "below_bound": below, "min_measured_over_bound": float(np.min(meas[ok] / est.bound_s[ok])),
    }


def analyse(name: str, top_k: float, seed: int = 0) -> dict:
    path = result_path(name, seed)
    data = json.loads(path.read_text())
    prof = get_profile()
    if data["device"] != prof.fingerprint:
        print(f"warning: {path} was measured on device {data['device']}, this is {prof.fingerprint}", file=sys.stderr)
    p = Problem.from_json(data["problem"])
    space = TEMPLATES[p.op].space(p, limits(prof))
    model = AnalyticModel.for_problem(p, space, CpuTarget(prof))
    r = funnel_on_sample(model, space, data["points"], top_k)
    r.update({"shape": name if seed == 0 else f"{name} (seed {seed})", "valid_space": data["valid"],
              "cross_product": data["space"]})
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measure", action="store_true", help="measure (or extend) the samples first")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names (default: all)")
    ap.add_argument("--sample", type=int, default=400, help="points per GEMM sample (default 400)")
    ap.add_argument("--seed", type=int, default=0, help="sample seed; seeds other than 0 write their own files")
    ap.add_argument("--top-k", type=float, default=0.1, help="fraction of the sample kept (default 0.1)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()
    names = [s for s in a.shapes.split(",") if s]
    if a.measure:
        for name in names:
            measure(name, SHAPES[name], a.sample, a.seed)
    out = [analyse(name, a.top_k, a.seed) for name in names if result_path(name, a.seed).exists()]
    for r in out:
        print(f"{r['shape']:>14}: sample {r['sample']} of {r['valid_space']} valid ({r['measured_ok']} ran); "
              f"capacity {r['capacity']}, top-k {r['top_k']}, roofline pruned {r['roofline_pruned']}, "
              f"measured {r['measured']} -> pruned {100 * r['pruned_fraction']:.1f}%; best {r['best_s'] * 1e6:.1f} us, "
              f"funnel's best {r['funnel_best_ratio']:.3f}x ({'recall' if r['recall'] else 'MISSED'}); "
              f"first within 5% at predicted rank {r['first_within_5pct_rank']}; Spearman pred "
              f"{r['spearman_pred']:.2f} (1 thread {r['spearman_pred_1t']:.2f}) bound {r['spearman_bound']:.2f}; below bound {r['below_bound']} "
              f"(min measured/bound {r['min_measured_over_bound']:.2f})")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
