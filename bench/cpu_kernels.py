"""Tuned GEMM vs numpy vs torch on the embodied shape set, side by side in one run.

For M in {1, 8, 64, 256} and N = K in {256, 512, 1024}, fp32, epilogue
bias+ReLU: tune the kernel (planforge's own search and measurement harness),
then re-measure the tuned kernel and every library interleaved in the same
worker, and print per shape the medians, tuned / best-library ratio, and the
fraction of the device profile's peak FLOP/s (compute-bound shapes) or of the
bandwidth of the memory level the operands fit in (memory-bound shapes).

Run (unset OpenBLAS's core-type override so numpy runs its best kernel here;
install the torch extra to include torch):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/cpu_kernels.py [--budget 48] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from planforge.targets.cpu.probe import get_profile
from planforge.targets.cpu.templates import flops, min_bytes
from planforge.search import Budget
from planforge.tuning import tune
from planforge.workloads import load_workload

SHAPES = [(m, nk, nk) for m in (1, 8, 64, 256) for nk in (256, 512, 1024)]


def bound(problem, prof):
    """(kind, ceiling, roofline seconds): compute-bound against peak, or memory-bound
    against the bandwidth of the smallest level that holds the operands."""
    f, b = flops(problem), min_bytes(problem)
    level = "DRAM"
    for name, cache in (("L2", "L2"), ("L3", "L3")):
        c = prof.caches.get(cache)
        if c and b <= c.bytes * c.instances:
            level = name
            break
    bw = prof.bandwidth[level]["read"]
    t_c, t_m = f / prof.peak_flops_all, b / bw
    return ("compute", prof.peak_flops_all, t_c) if t_c >= t_m else (f"memory ({level})", bw, t_m)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=48, help="tuning evaluations per shape (default 48)")
    ap.add_argument("--shapes", default="", help="subset, e.g. '1x256x256,256x1024x1024'")
    ap.add_argument("--json", default="", help="write the rows here too")
    args = ap.parse_args()
    prof = get_profile()
    shapes = SHAPES if not args.shapes else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    print(f"device {prof.cpu_model} ({prof.fingerprint}); peak {prof.peak_flops_all / 1e9:.0f} GFLOP/s on "
          f"{prof.threads} threads; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    rows = []
    hdr = f"{'M x N x K':>16} {'tuned':>10} {'numpy':>10} {'torch':>10} {'tuned/best':>10} {'bound':>14} {'of ceiling':>10}  plan"
    print(hdr)
    for m, n, k in shapes:
        wl = load_workload("gemm", {"shape": f"{m},{n},{k}", "epilogue": "bias_relu"})
        t0 = time.perf_counter()
        res = tune(wl, strategy="auto", budget=Budget(evals=args.budget), seed=0,
                   out=f"/tmp/planforge-bench/{m}x{n}x{k}")
        tr = res.tasks[0]
        prob = wl.tasks[0].backend.problem
        tuned = tr.walk.accepted.metric
        libs = {name: o.metric for name, o in tr.baselines.items() if o.ok}
        best = min(libs.values())
        kind, ceiling, _ = bound(prob, prof)
        achieved = flops(prob) / tuned if kind == "compute" else min_bytes(prob) / tuned
        row = {"shape": [m, n, k], "tuned_s": tuned, "numpy_s": libs.get("numpy"), "torch_s": libs.get("torch"),
               "ratio_tuned_over_best_library": tuned / best, "bound": kind, "fraction_of_ceiling": achieved / ceiling,
               "gflops": flops(prob) / tuned / 1e9, "plan": tr.walk.accepted.candidate.as_dict(),
               "template": prob.op, "tune_seconds": time.perf_counter() - t0, "evaluations": tr.result.evaluations}
        rows.append(row)
        fmt = lambda s: f"{s * 1e6:9.1f}u" if s else "      n/a"  # noqa: E731
        print(f"{f'{m}x{n}x{k}':>16} {fmt(tuned)} {fmt(libs.get('numpy'))} {fmt(libs.get('torch'))} "
              f"{tuned / best:10.3f} {kind:>14} {achieved / ceiling:10.2%}  {prob.op} {tr.walk.accepted.candidate}",
              flush=True)
    big = [r for r in rows if r["shape"][0] >= 64]
    small = [r for r in rows if r["shape"][0] <= 8]
    print("\ntargets:")
    print(f"  M >= 64 within 95% of the best library (ratio <= 1/0.95 = 1.053): "
          f"{sum(r['ratio_tuned_over_best_library'] <= 1 / 0.95 for r in big)}/{len(big)}")
    print(f"  M <= 8 faster than the best library (ratio < 1): "
          f"{sum(r['ratio_tuned_over_best_library'] < 1 for r in small)}/{len(small)}")
    for r in rows:
        if r["shape"] == [256, 1024, 1024]:
            print(f"  256x1024x1024 at {r['gflops']:.0f} GFLOP/s = {r['fraction_of_ceiling']:.0%} of measured peak "
                  f"(target >= 70%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": prof.fingerprint, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
