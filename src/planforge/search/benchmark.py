"""Replay benchmark: run strategies with many seeds on recorded spaces and score them.

Each run is the ordinary tuning loop (``search``) against a ``ReplayBackend``
with a budget of unique evaluations; it stops early once it has measured the
known optimum, since nothing later could change its score or its best-so-far
curve. Runs are independent, so they spread over worker processes.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..targets.replay.replay import Replay, load_replay
from .loop import Budget, search
from .scoring import Score, score
from .registry import make_strategy
from .warm import WarmStart

BASELINE = "random"


@dataclass
class Run:
    """One replayed search: the metric of each unique evaluation, in order (None: failed)."""

    space: str
    strategy: str
    seed: int
    values: list[float | None]
    stop_reason: str
    seconds: float


def replay_run(replay: Replay, strategy: str, seed: int, budget: int, options: dict[str, Any] | None = None,
               stop_at_optimum: bool = True, warm: WarmStart | None = None, stop_at: float | None = None) -> Run:
    """Run ``strategy`` (a name for ``make_strategy``) with ``seed`` on ``replay``, warm-started from ``warm``
    (other recordings of the kernel mapped onto this space; default None: cold). The run stops once it
    measures ``stop_at`` or better (default: the optimum, unless ``stop_at_optimum`` is False)."""
    t0 = time.perf_counter()
    strat = make_strategy(strategy, replay.space, seed, budget=budget, warm=warm, **(options or {}))
    target = stop_at if stop_at is not None else replay.optimum if stop_at_optimum else None
    res = search(replay.space, strat, replay.backend, Budget(evals=budget), keep=1, target=target)
    values = [t.outcome.metric for t in res.trials if t.n > 0]
    return Run(replay.label, strategy, seed, values, res.stop_reason, time.perf_counter() - t0)


@dataclass
class SpaceResult:
    """Every strategy's score on one space."""

    replay: Replay
    scores: dict[str, Score] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # CPU time of all runs, per strategy
    errors: dict[str, str] = field(default_factory=dict)  # strategies that could not run, and why


# Worker processes find their replays here: loaded by the parent before the pool
# forks, or loaded once per worker where processes are spawned.
_REPLAYS: dict[tuple[str, Any], Replay] = {}
_WARM: dict[str, WarmStart] = {}  # per replay label (forked workers inherit them)
WARM = "warm:"  # a strategy name with this prefix runs warm-started from the replay's warm start


def _job(args: tuple) -> Run | tuple[str, str, str]:
    path, t1, strategy, seed, budget, options = args
    key = (path, t1)
    if key not in _REPLAYS:
        _REPLAYS[key] = load_replay(path, t1)
    replay = _REPLAYS[key]
    name, warm = (strategy[len(WARM):], _WARM[replay.label]) if strategy.startswith(WARM) else (strategy, None)
    try:
        run = replay_run(replay, name, seed, budget, options, warm=warm)
        run.strategy = strategy
        return run
    except ImportError as e:  # a strategy whose optional dependency is missing here
        return (replay.label, strategy, str(e))


def benchmark(replays: Sequence[Replay], strategies: Sequence[str], seeds: Iterable[int], budget: int,
              jobs: int = 1, options: dict[str, dict[str, Any]] | None = None,
              on_run: Callable[[int, int], None] | None = None,
              warm: Mapping[str, WarmStart] | None = None) -> list[SpaceResult]:
    """Score each strategy on each replay over ``seeds``.

    Parameters:
        strategies: names for ``make_strategy``; the random baseline is added
            when missing.
        jobs: worker processes (default 1: run in this process).
        options: per strategy name, settings passed to ``make_strategy``.
        on_run: called with (runs done, runs in all) after each run.
        warm: per replay label, its warm start; a strategy named
            ``warm:NAME`` runs NAME warm-started from it (default None).
    A strategy that cannot run (its optional dependency is missing, a bad
    setting) is reported in ``SpaceResult.errors``, not dropped silently."""
    strategies = list(dict.fromkeys([*strategies, BASELINE] if BASELINE not in strategies else strategies))
    seeds = list(seeds)
    options = options or {}
    for r in replays:
        _REPLAYS[(str(r.path), r.recording.t1 and str(r.recording.t1) or False)] = r
    _WARM.update(warm or {})
    missing = [f"{s} on {r.label}" for s in strategies if s.startswith(WARM) for r in replays if r.label not in _WARM]
    if missing:
        raise ValueError(f"no warm start for {', '.join(missing)}")
    tasks = [(str(r.path), r.recording.t1 and str(r.recording.t1) or False, s, seed, budget,
              options.get(s, options.get(s.removeprefix(WARM))))
             for r in replays for s in strategies for seed in seeds]
    results: list[Run | tuple[str, str, str]] = []
    if jobs > 1 and len(tasks) > 1:
        import multiprocessing as mp

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        with ctx.Pool(min(jobs, os.cpu_count() or 1)) as pool:
            for out in pool.imap_unordered(_job, tasks, chunksize=max(1, len(tasks) // (jobs * 16))):
                results.append(out)
                if on_run:
                    on_run(len(results), len(tasks))
    else:
        for t in tasks:
            results.append(_job(t))
            if on_run:
                on_run(len(results), len(tasks))
    by_label = {r.label: SpaceResult(r) for r in replays}
    runs: dict[tuple[str, str], list[Run]] = {}
    for out in results:
        if isinstance(out, tuple):
            by_label[out[0]].errors[out[1]] = out[2]
        else:
            runs.setdefault((out.space, out.strategy), []).append(out)
    for r in replays:
        sr = by_label[r.label]
        for s in strategies:
            rs = sorted(runs.get((r.label, s), []), key=lambda x: x.seed)
            if rs and s not in sr.errors:
                sr.scores[s] = score([x.values for x in rs], r.optimum, budget)
                sr.seconds[s] = sum(x.seconds for x in rs)
    return [by_label[r.label] for r in replays]


def results_json(results: Sequence[SpaceResult], budget: int, seeds: int, full_curve: bool = True) -> dict:
    """``{budget, seeds, tolerance, spaces: {label: {strategy: {median_evals_to_5pct, ...}}}}``."""
    out: dict[str, Any] = {"budget": budget, "seeds": seeds, "tolerance": 0.05, "baseline": BASELINE, "spaces": {}}
    for sr in results:
        d = {s: sc.to_json(full_curve) for s, sc in sr.scores.items()}
        for s, why in sr.errors.items():
            d[s] = {"error": why}
        out["spaces"][sr.replay.label] = d
    out["files"] = {sr.replay.label: sr.replay.describe() for sr in results}
    return out
