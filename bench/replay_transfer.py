"""Warm starts between devices, leave one device out, on the families of ../shared/benchmark_hub (issue 20).

A family is one kernel measured on several GPUs (the hub's README lists them:
convolution_milo on A100, A4000 and A6000; convolution on RTX 2080 Ti, RTX 3060
Laptop, RTX 3090 and TITAN RTX; CLBlast GEMM on RTX 3090 and RTX 3060 Laptop;
pnpoly on RTX 3090 and TITAN RTX). Each file is tuned cold, and warm-started
from the *other* files of its family only (never from itself):

- planforge ``auto`` cold and warm (``search.warm.WarmStart``: the sources'
  best configurations first, their rows as the surrogate's decaying prior);
- Optuna TPE cold and warm (the same early configurations given to the study
  with ``enqueue_trial``), as bench/replay_peers.py runs it;
- random sampling without replacement (the baseline).

Scored as the hub's README says: unique evaluations to within 5% of the
optimum (budget + 1 for a run that never gets there), median and p90 over
seeds. A run stops once it is within 5% (nothing after that changes its
score; the curves are therefore not reported here). Kernel Tuner is not
installed in this environment; its cold figures on the five spaces of issue 6
are read from bench/results/replay_peers.json (same scoring, seeds 0..49) and
counted among the cold peers there.

``--choose`` picks the number of early proposals leave one family out: for
each family, the value of ``EARLY_GRID`` with the lowest geometric mean of
warm ``auto``'s median over the *other* families' spaces, with seeds
1000.. (disjoint from the scoring seeds 0..S-1); the held-out family is then
scored with that choice (column ``warm-lofo``).

``--defaults N`` chooses the cold default the same way among ``DEFAULTS`` (or
the labels ``--default-candidates`` names), with seeds 1000..1000+N-1: per
family, the candidate worse than random (p50 or p90) on the fewest of the other
families' spaces, then with the lowest geometric mean of its medians there; the
held-out family is scored with it (``cold-lofo``). ``--choose-first F`` starts
the choosing seeds of both at F instead of 1000 (fresh seeds for a choice that
earlier choosing seeds must not inform). ``--jobs`` runs the runs in
forked worker processes; ``--no-optuna --optuna-from EARLIER.json`` reuses an
earlier run's Optuna figures as a cold peer instead of re-running Optuna.

    .venv/bin/python bench/replay_transfer.py --seeds 20 --choose 5 \\
        --json bench/results/replay_transfer.json --markdown bench/results/replay_transfer.md \\
        --checkpoint /tmp/replay_transfer.jsonl
    .venv/bin/python bench/replay_transfer.py --seeds 20 --defaults 20 --no-optuna --jobs 2 \\
        --optuna-from bench/results/replay_transfer.json --checkpoint /tmp/replay_transfer.jsonl
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import replay_peers  # noqa: E402  (its Optuna peer, with enqueue_trial for the warm start)

from planforge.search.benchmark import replay_run  # noqa: E402
from planforge.search.scoring import TOLERANCE, evals_to_within  # noqa: E402
from planforge.search.warm import EARLY, WarmStart  # noqa: E402
from planforge.targets.replay.replay import Replay, load_replay  # noqa: E402
from planforge.warmstart import recording_source  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HUB = ROOT.parent / "shared" / "benchmark_hub"
EARLY_GRID = (0, 4, 8, 16, 32)
# candidates for the cold default (--defaults): label -> (strategy, settings), spelled out rather than "auto" so
# that a checkpoint's figures keep their meaning when auto's choice changes; the first is auto's choice until
# 2026-12-01 (four arms), the second the one the leave-one-family-out run of that day chose
DEFAULTS = {
    "bandit:thompson+genetic+annealing+hillclimb": ("bandit", {"arms": "thompson+genetic+annealing+hillclimb",
                                                               "c": 0.2}),
    "bandit:thompson+genetic+annealing": ("bandit", {"arms": "thompson+genetic+annealing", "c": 0.2}),
    "bandit:thompson+genetic": ("bandit", {"arms": "thompson+genetic", "c": 0.2}),
    # issue 20, second round (docs/benchmarks.md): bandits whose local-search arms thompson's predictions screened
    # were candidates here (commit 7150133) and lost leave one family out; the code is gone since
    # ... and today's auto with thompson's random start shortened or lengthened (it is told every arm's results)
    "bandit:thompson-init5": ("bandit", {"arms": "thompson+genetic+annealing+hillclimb", "c": 0.2,
                                         "arm_options": {"thompson": {"n_init": 5}}}),
    "bandit:thompson-init20": ("bandit", {"arms": "thompson+genetic+annealing+hillclimb", "c": 0.2,
                                          "arm_options": {"thompson": {"n_init": 20}}}),
    "bandit:c0.1": ("bandit", {"arms": "thompson+genetic+annealing+hillclimb", "c": 0.1}),
    "bandit:c0.4": ("bandit", {"arms": "thompson+genetic+annealing+hillclimb", "c": 0.4}),
    "bandit:thompson-global2": ("bandit", {"arms": "thompson+genetic+annealing+hillclimb", "c": 0.2,
                                           "arm_options": {"thompson": {"global_every": 2}}}),
    "bandit:thompson-global6": ("bandit", {"arms": "thompson+genetic+annealing+hillclimb", "c": 0.2,
                                           "arm_options": {"thompson": {"global_every": 6}}}),
    # issue 20, third round: the global step's period chosen on fresh choosing seeds (--choose-first 2000) among
    # a grid declared before any of them ran (3 is today's auto)
    "bandit:thompson-global4": ("bandit", {"arms": "thompson+genetic+annealing+hillclimb", "c": 0.2,
                                           "arm_options": {"thompson": {"global_every": 4}}}),
    "bandit:thompson-global9": ("bandit", {"arms": "thompson+genetic+annealing+hillclimb", "c": 0.2,
                                           "arm_options": {"thompson": {"global_every": 9}}}),
    # ... and, beside the global step every 6th, how hard thompson's model steers away from failures (a
    # failure told as the slowest measured log-time plus fail_penalty; 1 by default)
    "bandit:thompson-global6-fail0.3": ("bandit", {"arms": "thompson+genetic+annealing+hillclimb", "c": 0.2,
                                                   "arm_options": {"thompson": {"global_every": 6, "fail_penalty": 0.3}}}),
    "bandit:thompson-global6-fail3": ("bandit", {"arms": "thompson+genetic+annealing+hillclimb", "c": 0.2,
                                                 "arm_options": {"thompson": {"global_every": 6, "fail_penalty": 3.0}}}),
    # issue 20, fourth round: the period-6 default whose thompson arm diversifies once `stall` results in a row
    # (any arm's) brought no new best: every proposal from the whole pool, the posterior draws' spread times
    # `stall_explore`, until the best improves; grid declared before the choosing runs
    **{f"bandit:thompson-global6-stall{n}-x{x:g}": (
        "bandit", {"arms": "thompson+genetic+annealing+hillclimb", "c": 0.2,
                   "arm_options": {"thompson": {"global_every": 6, "stall": n, "stall_explore": x}}})
       for n, x in ((20, 10), (30, 10), (60, 10), (30, 3), (30, 30))},
    # ... and, instead, the local searches (hill climbing, annealing) with `jumps` one-knob moves to any value of a
    # random knob beside their one-step neighbours (a knob of methods numbered 0, 1, 2, ... is ordered only by its
    # numbering); grid declared before the choosing runs
    **{f"bandit:thompson-global6-jumps{j}": (
        "bandit", {"arms": "thompson+genetic+annealing+hillclimb", "c": 0.2,
                   "arm_options": {"thompson": {"global_every": 6}, "hillclimb": {"jumps": j},
                                   "annealing": {"jumps": j}}})
       for j in (2, 4, 8)},
    "thompson": ("thompson", {}),
    "thompson:wide": ("thompson", {"radius": 3, "global_every": 2}),
}
PEERS_JSON = ROOT / "bench" / "results" / "replay_peers.json"


def families(hub: Path) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for f in sorted((hub / "cachefiles").glob("*/*.json*")):
        out.setdefault(f.parent.name, []).append(f)
    return {k: v for k, v in out.items() if len(v) > 1}


class Runner:
    """Runs (space, method, seed) once each, kept in a checkpoint file so that an interrupted run resumes."""

    def __init__(self, replays: dict[str, Replay], warm: dict[tuple[str, int], WarmStart], budget: int,
                 checkpoint: Path | None):
        self.replays, self.warm, self.budget, self.checkpoint = replays, warm, budget, checkpoint
        self.done: dict[str, tuple[int, float]] = {}
        if checkpoint and checkpoint.exists():
            for line in checkpoint.read_text().splitlines():
                d = json.loads(line)
                self.done[d["key"]] = (d["evals"], d["cpu_s"])

    def evals(self, label: str, method: str, seed: int, early: int = EARLY) -> int:
        key = self._key(label, method, seed, early)
        if key not in self.done:
            t0 = time.process_time()
            rep = self.replays[label]
            bound = rep.optimum * (1 + TOLERANCE)
            if method in ("auto", "random"):
                values = replay_run(rep, method, seed, self.budget, stop_at=bound).values
            elif method.startswith("default:"):
                name, opts = DEFAULTS[method.split(":", 1)[1]]
                values = replay_run(rep, name, seed, self.budget, options=opts, stop_at=bound).values
            elif method == "warm:auto":
                values = replay_run(rep, "auto", seed, self.budget, warm=self.warm[(label, early)],
                                    stop_at=bound).values
            elif method in ("optuna", "warm:optuna"):
                seeds = self.warm[(label, early)].seeds() if method == "warm:optuna" else []
                enqueue = [tuple(c[n] for n in rep.recording.names) for c in seeds]
                values = replay_peers.run_optuna(label, seed, self.budget, enqueue=enqueue, stop_at=bound)
            else:
                raise ValueError(method)
            n = evals_to_within(values[: self.budget], rep.optimum)
            self._record(key, self.budget + 1 if n is None else n, time.process_time() - t0)
        return self.done[key][0]

    def prefetch(self, jobs: int, todo: list[tuple[str, str, int, int]]) -> None:
        """Run the (label, method, seed, early) runs not done yet in ``jobs`` forked worker processes (the
        replays and warm starts are inherited), so that the sequential passes below only read results."""
        todo = [t for t in dict.fromkeys(todo) if self._key(*t) not in self.done]
        if jobs < 2 or len(todo) < 2:
            return
        import multiprocessing as mp

        global _RUNNER
        _RUNNER = self
        with mp.get_context("fork").Pool(jobs) as pool:
            for t, (n, cpu) in zip(todo, pool.imap(_prefetch_one, todo)):
                self._record(self._key(*t), n, cpu)

    def _key(self, label: str, method: str, seed: int, early: int = EARLY) -> str:
        return f"{label}|{method}|{early}|{seed}|{self.budget}"

    def _record(self, key: str, n: int, cpu: float) -> None:
        self.done[key] = (n, cpu)
        if self.checkpoint:
            with self.checkpoint.open("a") as f:
                f.write(json.dumps({"key": key, "evals": n, "cpu_s": cpu}) + "\n")

    def cpu(self, method: str) -> float:
        return sum(c for k, (_, c) in self.done.items() if k.split("|")[1] == method)


_RUNNER: Runner | None = None  # the parent's runner, inherited by forked prefetch workers


def _prefetch_one(t: tuple[str, str, int, int]) -> tuple[int, float]:
    key = _RUNNER._key(*t)
    _RUNNER.checkpoint = None  # the parent writes the checkpoint
    _RUNNER.evals(*t)
    return _RUNNER.done[key]


def stats(xs: list[int], budget: int) -> dict:
    return {"median": float(np.median(xs)), "p90": float(np.percentile(xs, 90)), "evals": xs,
            "success": sum(x <= budget for x in xs) / len(xs)}


def geo(xs) -> float:
    return float(np.exp(np.mean(np.log(list(xs)))))


def peer_figures(path: Path) -> dict[str, dict[str, float]]:
    """Cold peers' medians and p90 per space from replay_peers.json (Kernel Tuner and Optuna, seeds 0..49)."""
    if not path.exists():
        return {}
    doc = json.loads(path.read_text())
    out = {}
    for label, d in doc.get("spaces", {}).items():
        out[label] = {k: (v["median_evals_to_5pct"], v["p90_evals_to_5pct"]) for k, v in d.items()
                      if isinstance(v, dict) and "median_evals_to_5pct" in v and not k.startswith("planforge:")}
    return out


def optuna_figures(path: Path) -> dict[str, tuple[float, float]]:
    """Optuna TPE's cold median and p90 per space from an earlier run of this script (its --json), for a run
    with --no-optuna; labelled with that run's seeds."""
    doc = json.loads(path.read_text())
    return {lb: (d["optuna"]["median"], d["optuna"]["p90"]) for lb, d in doc["spaces"].items() if "optuna" in d}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hub", type=Path, default=HUB)
    ap.add_argument("--seeds", type=int, default=50, help="scoring seeds 0..S-1 (default 50)")
    ap.add_argument("--choose", type=int, default=0, help="seeds (1000.., see --choose-first) for choosing early, "
                    "leave one family out (default 0: no choice, EARLY only)")
    ap.add_argument("--defaults", type=int, default=0, help="seeds (1000.., see --choose-first) for choosing the cold "
                    "default among DEFAULTS, leave one family out (default 0: none)")
    ap.add_argument("--default-candidates", default="", help="with --defaults: the DEFAULTS labels to choose "
                                                               "among, joined by commas (default: all)")
    ap.add_argument("--choose-first", type=int, default=1000, help="the first choosing seed of --choose and "
                    "--defaults (default 1000; must be at least --seeds, so that no choosing seed scores)")
    ap.add_argument("--budget", type=int, default=1000)
    ap.add_argument("--no-optuna", action="store_true", help="leave out the Optuna peer")
    ap.add_argument("--peer-seeds", type=int, default=None, help="seeds 0..P-1 for the Optuna peer (default: "
                                                                 "--seeds; its runs cost 10-100x planforge's)")
    ap.add_argument("--optuna-skip", default="", help="spaces (labels joined by commas) left out of the Optuna "
                                                        "peer: their cold peers come from replay_peers.json alone")
    ap.add_argument("--optuna-from", type=Path, help="with --no-optuna: take Optuna's cold figures from this "
                                                       "earlier --json of this script, as a cold peer")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes for the runs (default 1)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--checkpoint", type=Path)
    args = ap.parse_args(argv)
    if args.choose_first < args.seeds:
        ap.error(f"--choose-first {args.choose_first}: the choosing seeds would overlap the scoring seeds "
                 f"0..{args.seeds - 1}")
    t0 = time.time()
    fams = families(args.hub)
    replays = {}
    fam_of = {}
    for fam, files in fams.items():
        for f in files:
            r = load_replay(f)
            replays[r.label] = r
            fam_of[r.label] = fam
    replay_peers.REPLAYS.update(replays)
    sources = {label: recording_source(r.recording) for label, r in replays.items()}
    grid = sorted(set(EARLY_GRID) | {EARLY}) if args.choose else [EARLY]
    warm = {}
    for label, r in replays.items():
        others = [sources[o] for o in replays if o != label and fam_of[o] == fam_of[label]]
        for e in grid:
            warm[(label, e)] = WarmStart(r.space, others, early=e)
    run = Runner(replays, warm, args.budget, args.checkpoint)
    labels = list(replays)
    skip = {x for x in args.optuna_skip.split(",") if x}
    if skip - set(labels):
        ap.error(f"--optuna-skip: unknown {', '.join(sorted(skip - set(labels)))}; known: {', '.join(labels)}")

    chosen = {fam: EARLY for fam in fams}
    choice_table = {}
    if args.choose:
        cseeds = range(args.choose_first, args.choose_first + args.choose)
        med = {(lb, e): float(np.median([run.evals(lb, "warm:auto", s, e) for s in cseeds])) for lb in labels
               for e in grid}
        for fam in fams:
            score = {e: geo(med[(lb, e)] for lb in labels if fam_of[lb] != fam) for e in grid}
            chosen[fam] = min(grid, key=lambda e: (score[e], e))
            choice_table[fam] = {"chosen": chosen[fam], "geo_mean_on_other_families": score}
        overall = {e: geo(med[(lb, e)] for lb in labels) for e in grid}
        choice_table["all families"] = {"chosen": min(grid, key=lambda e: (overall[e], e)),
                                        "geo_mean_on_other_families": overall}
        print(f"early chosen leave one family out: {chosen}; on all families: "
              f"{choice_table['all families']['chosen']} ({time.time() - t0:.0f} s)", flush=True)

    chosen_default, default_table = {}, {}
    unknown = [d for d in args.default_candidates.split(",") if d and d not in DEFAULTS]
    if unknown:
        ap.error(f"--default-candidates: unknown {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
    candidates = {d: DEFAULTS[d] for d in args.default_candidates.split(",") if d} or DEFAULTS
    if args.defaults:
        dseeds = range(args.choose_first, args.choose_first + args.defaults)
        run.prefetch(args.jobs, [(lb, m, s, EARLY) for lb in labels for m in ["random", *(f"default:{d}" for d in candidates)]
                                 for s in dseeds])
        med, p90 = {}, {}
        for lb in labels:
            for m in ["random", *(f"default:{d}" for d in candidates)]:
                xs = [run.evals(lb, m, s) for s in dseeds]
                med[(lb, m)], p90[(lb, m)] = float(np.median(xs)), float(np.percentile(xs, 90))

        def rank(d, pool):  # first: spaces where it is worse than random (p50 or p90), then the geometric mean
            m = f"default:{d}"
            worse = sum(med[(lb, m)] > med[(lb, "random")] or p90[(lb, m)] > p90[(lb, "random")] for lb in pool)
            return worse, geo(med[(lb, m)] for lb in pool)

        for fam in [*fams, "all families"]:
            pool = [lb for lb in labels if fam_of[lb] != fam]
            scores = {d: rank(d, pool) for d in candidates}
            chosen_default[fam] = min(candidates, key=lambda d: scores[d])
            default_table[fam] = {"chosen": chosen_default[fam],
                                  "worse_than_random_on, geo_mean": {d: list(v) for d, v in scores.items()}}
        print(f"cold default chosen leave one family out: {chosen_default} ({time.time() - t0:.0f} s)", flush=True)

    seeds = range(args.seeds)
    peer_seeds = range(args.seeds if args.peer_seeds is None else args.peer_seeds)
    methods = ["random", "auto", "warm:auto"] + ([] if args.no_optuna else ["optuna", "warm:optuna"])
    peers = peer_figures(PEERS_JSON)
    earlier = optuna_figures(args.optuna_from) if args.optuna_from else {}
    methods_of = {lb: [m for m in methods if lb not in skip or "optuna" not in m] for lb in labels}
    todo = [(lb, m, s, EARLY) for lb in labels for m in methods_of[lb] for s in (peer_seeds if "optuna" in m else seeds)]
    todo += [(lb, f"default:{chosen_default[fam_of[lb]]}", s, EARLY) for lb in labels for s in seeds if chosen_default]
    todo += [(lb, "warm:auto", s, chosen[fam_of[lb]]) for lb in labels for s in seeds if args.choose]
    run.prefetch(args.jobs, todo)
    rows = {}
    for lb in labels:
        d = {m: stats([run.evals(lb, m, s) for s in (peer_seeds if "optuna" in m else seeds)], args.budget)
             for m in methods_of[lb]}
        if args.choose and chosen[fam_of[lb]] != EARLY:
            d["warm-lofo:auto"] = stats([run.evals(lb, "warm:auto", s, chosen[fam_of[lb]]) for s in seeds], args.budget)
        else:
            d["warm-lofo:auto"] = d["warm:auto"]
        if chosen_default:
            d["cold-lofo"] = stats([run.evals(lb, f"default:{chosen_default[fam_of[lb]]}", s) for s in seeds],
                                   args.budget)
            d["cold-lofo"]["chosen"] = chosen_default[fam_of[lb]]
        cold_peers = {"optuna:tpe (this run)": (d["optuna"]["median"], d["optuna"]["p90"])} if "optuna" in d else {}
        cold_peers.update({k + " (replay_peers.json)": v for k, v in peers.get(lb, {}).items()})
        if lb in earlier:
            cold_peers[f"optuna:tpe ({args.optuna_from.name})"] = earlier[lb]
        best = min(cold_peers.items(), key=lambda kv: kv[1][0]) if cold_peers else None
        d["best_cold_peer"] = {"name": best[0], "median": best[1][0], "p90": best[1][1]} if best else None
        d["sources"] = warm[(lb, EARLY)].describe()["sources"]
        rows[lb] = d
        w, c = d["warm:auto"]["median"], d["auto"]["median"]
        print(f"{lb:30s} cold auto {c:6.1f}  warm auto {w:6.1f}  random {d['random']['median']:6.1f}"
              + ("" if "optuna" not in d else f"  optuna {d['optuna']['median']:6.1f} warm {d['warm:optuna']['median']:6.1f}")
              + (f"  best cold peer {best[1][0]:g} ({best[0]})" if best else ""), flush=True)

    def ratio(lb, key):
        p = rows[lb]["best_cold_peer"]
        return rows[lb][key]["median"] / p["median"] if p else math.nan

    summary = {
        "warm_auto_over_best_cold_peer_median": float(np.nanmedian([ratio(lb, "warm:auto") for lb in labels])),
        "warm_lofo_auto_over_best_cold_peer_median": float(np.nanmedian([ratio(lb, "warm-lofo:auto") for lb in labels])),
        "cold_auto_over_best_cold_peer_median": float(np.nanmedian([ratio(lb, "auto") for lb in labels])),
        "cold_auto_not_worse_than_random_p50": [lb for lb in labels
                                                if rows[lb]["auto"]["median"] > rows[lb]["random"]["median"]],
        "cold_auto_not_worse_than_random_p90": [lb for lb in labels if rows[lb]["auto"]["p90"] > rows[lb]["random"]["p90"]],
        "warm_auto_over_cold_auto_median": float(np.median([rows[lb]["warm:auto"]["median"] / rows[lb]["auto"]["median"]
                                                            for lb in labels])),
    }
    if chosen_default:
        summary["cold_lofo_over_best_cold_peer_median"] = float(np.nanmedian([ratio(lb, "cold-lofo") for lb in labels]))
        summary["cold_lofo_worse_than_random"] = {
            "p50": [lb for lb in labels if rows[lb]["cold-lofo"]["median"] > rows[lb]["random"]["median"]],
            "p90": [lb for lb in labels if rows[lb]["cold-lofo"]["p90"] > rows[lb]["random"]["p90"]]}
    summary["cold_auto_worse_than_random"] = {"p50": summary.pop("cold_auto_not_worse_than_random_p50"),
                                              "p90": summary.pop("cold_auto_not_worse_than_random_p90")}
    cpu = {m: round(run.cpu(m), 1) for m in methods}
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "budget": args.budget, "seeds": args.seeds,
           "peer_seeds": len(peer_seeds), "optuna_skip": sorted(skip),
           "choose_seeds": args.choose, "early_default": EARLY, "early_grid": grid, "early_choice": choice_table,
           "defaults": {k: list(v) for k, v in DEFAULTS.items()}, "default_choice": default_table,
           "choose_default_seeds": args.defaults, "choose_first_seed": args.choose_first, "tolerance": TOLERANCE, "wall_s": round(time.time() - t0), "cpu_s": cpu, "summary": summary,
           "spaces": rows, "command": " ".join(sys.argv)}
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=float))
    if args.markdown:
        args.markdown.write_text(markdown(out))
    return 0


def markdown(out: dict) -> str:
    lines = ["| space | sources | random p50/p90 | cold auto p50/p90 | warm auto p50/p90 | warm auto (early chosen LOFO) "
             "| optuna cold | optuna warm | best cold peer | warm auto / best cold peer |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for lb, d in out["spaces"].items():
        p = d["best_cold_peer"]
        f = lambda k: f"{d[k]['median']:g} / {d[k]['p90']:.0f}" if k in d else "-"  # noqa: E731
        srcs = ", ".join(s.split("/")[-1] for s in d["sources"])
        lines.append(f"| {lb} | {srcs} | {f('random')} | {f('auto')} | {f('warm:auto')} | {f('warm-lofo:auto')} | "
                     f"{f('optuna')} | {f('warm:optuna')} | {p['name'] + ' ' + format(p['median'], 'g') if p else '-'} | "
                     f"{d['warm:auto']['median'] / p['median']:.2f} |" if p else "-")
    s = out["summary"]
    lines += ["", f"Median over spaces, warm auto / best cold peer: **{s['warm_auto_over_best_cold_peer_median']:.2f}** "
              f"(early chosen leave one family out: {s['warm_lofo_auto_over_best_cold_peer_median']:.2f}); "
              f"cold auto / best cold peer: {s['cold_auto_over_best_cold_peer_median']:.2f}; warm / cold auto: "
              f"{s['warm_auto_over_cold_auto_median']:.2f}; cold auto worse than random at p50 on "
              f"{s['cold_auto_worse_than_random']['p50'] or 'no space'}, at p90 on "
              f"{s['cold_auto_worse_than_random']['p90'] or 'no space'}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
