"""Choosing the default strategy's settings on the recorded GPU spaces, with seeds the benchmark does not use.

Runs candidate configurations of planforge's strategies (name + settings) on every file of
../shared/benchmark_hub with seeds 1000.. (bench/replay_peers.py scores with seeds 0..49, so the
choice is not made on the runs it is judged by; the spaces are the same, which docs/benchmarks.md
says), and prints per space the median / p90 unique evaluations to within 5% of the optimum, and
the geometric mean of the medians over the spaces.

    .venv/bin/python bench/replay_tune.py --seeds 30
    .venv/bin/python bench/replay_tune.py --seeds 30 --candidates '{"b+th": ["bandit", {"arms": ["thompson", "genetic"]}]}'
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from planforge.targets.replay.replay import load_replay
from planforge.search.benchmark import benchmark

HUB = Path(__file__).resolve().parents[2] / "shared" / "benchmark_hub"
CANDIDATES = {
    "genetic": ["genetic", {}],
    "bandit": ["bandit", {}],
    "bandit+thompson": ["bandit", {"arms": ["thompson", "genetic", "annealing", "hillclimb"]}],
    "bandit+thompson+mcts": ["bandit", {"arms": ["thompson", "genetic", "annealing", "hillclimb", "mcts"]}],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hub", type=Path, default=HUB)
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--budget", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--candidates", default="", help="JSON {label: [strategy, {settings}]} (default: the built-in set)")
    args = ap.parse_args(argv)
    cands = json.loads(args.candidates) if args.candidates else CANDIDATES
    replays = [load_replay(f) for f in sorted((args.hub / "cachefiles").glob("*/*.json*"))]
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    t0 = time.time()
    print(f"{'':24s}" + "".join(f"{r.label.split('/')[-1][:12]:>14s}" for r in replays) + "   geo-mean")
    for label, (strategy, settings) in cands.items():
        res = benchmark(replays, [strategy], seeds, args.budget, jobs=args.jobs, options={strategy: settings})
        scores = [sr.scores[strategy] for sr in res]
        geo = float(np.exp(np.mean(np.log([s.median for s in scores]))))
        print(f"{label:24s}" + "".join(f"{s.median:7.0f}/{s.p90:5.0f} " for s in scores) + f"   {geo:7.0f}",
              flush=True)
    print(f"median/p90 unique evaluations to within 5%, seeds {seeds.start}..{seeds.stop - 1}, budget {args.budget}, "
          f"{time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
