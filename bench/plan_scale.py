"""Planning at scale (issue 19's target: a 12-layer model planned in under 60 s and 4 GiB on 2 cores).

From a model built from its config (random weights) to a partitioned, deduplicated plan space: the cut, one
e-graph and genome per distinct part. Prints the time of each phase, the dedupe factor and the peak memory.

    .venv/bin/python bench/plan_scale.py
"""
from __future__ import annotations

import resource
import time

from planforge.ir.zoo import residual_mlp, transformer
from planforge.targets.cpu.target import CpuTarget
from planforge.workloads.models import graph_workload

MODELS = {
    "transformer, 12 layers, GPT-2-small shapes (d=768, 12 heads, sequence 128)":
        lambda: transformer(12, seq=128, width=768, heads=12),
    "residual MLP, 50 blocks (ResNet-50's depth; d=256, batch 8)": lambda: residual_mlp(50, width=256, batch=8),
}


def main() -> int:
    target = CpuTarget()
    target.ceilings()  # the device's figures are measured (or read) once, before any clock starts
    worst = 0.0
    for name, make in MODELS.items():
        t0 = time.perf_counter()
        g = make()
        t1 = time.perf_counter()
        w = graph_workload(g, name, target=target)
        t2 = time.perf_counter()
        worst = max(worst, t2 - t1)
        part = w.partition
        print(f"{name}: {len(g.nodes)} ops, {g.param_bytes() / 2**20:.0f} MiB of weights")
        print(f"  import (built from config) {t1 - t0:.2f} s; planned in {t2 - t1:.2f} s: "
              f"{len(part.parts) if part else 1} parts -> {len(w.tasks)} tasks "
              f"(dedupe {part.dedupe if part else 1:.1f}x); "
              + ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in w.phases.items()))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"slowest plan {worst:.1f} s (target 60 s); peak memory {rss:.2f} GiB (target 4 GiB)")
    return 0 if worst < 60 and rss < 4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
