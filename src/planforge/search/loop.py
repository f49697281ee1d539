"""The tuning loop: strategy.ask -> backend.measure -> strategy.tell, within a budget."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..outcome import Outcome
from ..space import Candidate, Space
from .ranked import Ranked
from .strategies import Strategy


@dataclass(frozen=True)
class Budget:
    """How much the loop may spend: unique evaluations and/or wall seconds (None: no limit)."""

    evals: int | None = None
    seconds: float | None = None

    def __post_init__(self):
        if self.evals is None and self.seconds is None:
            raise ValueError("a budget needs evaluations, seconds or both")
        if (self.evals is not None and self.evals < 1) or (self.seconds is not None and self.seconds <= 0):
            raise ValueError(f"budget must be positive, got evals={self.evals}, seconds={self.seconds}")


@dataclass(frozen=True)
class Trial:
    """One outcome the loop obtained. ``n`` is the evaluation number (1-based,
    0 for a rejection, which is not an evaluation); ``cached`` marks an outcome
    taken from the records of an interrupted run instead of measured again."""

    n: int
    candidate: Candidate
    outcome: Outcome
    cached: bool
    wall_s: float


@dataclass
class SearchResult:
    trials: list[Trial]
    ranked: Ranked
    curve: list[tuple[int, float]]  # (evaluation, best metric so far), at each improvement
    stop_reason: str
    evaluations: int
    duplicates: int
    seconds: float
    counts: Counter = field(default_factory=Counter)  # "measured", "rejected", and each invalid category
    # the asynchronous loop's search per device fingerprint, this one included (empty for the plain loop)
    by_target: dict[str, "SearchResult"] = field(default_factory=dict)
    executor: dict | None = None  # what ran the measurements (search_on): kind, slots, seconds

    @property
    def first_measured(self) -> Trial | None:
        return next((t for t in self.trials if t.outcome.ok), None)


class Tally:
    """The bookkeeping every tuning loop does per outcome: evaluation numbers
    (rejections are not evaluations), counts by category, the idle streak, the
    best-so-far curve and the trial list, in arrival order."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.seen: dict[str, Outcome] = {}
        self.trials: list[Trial] = []
        self.curve: list[tuple[int, float]] = []
        self.counts: Counter = Counter()
        self.evals = self.idle = 0

    def settle(self, c: Candidate, o: Outcome, cached: bool = False) -> Trial:
        self.seen[c.fingerprint] = o
        if o.status == "rejected":
            n = 0
            self.counts["rejected"] += 1
            self.idle += 1
        else:
            self.evals += 1
            n = self.evals
            self.idle = 0
            self.counts["measured" if o.ok else o.category] += 1
        t = Trial(n, c, o, cached, time.perf_counter() - self.t0)
        self.trials.append(t)
        if o.ok and (not self.curve or o.metric < self.curve[-1][1]):
            self.curve.append((n, o.metric))
        return t

    @staticmethod
    def rejection(space: Space, c: Candidate) -> Outcome:
        return Outcome.rejected(f"violates: {'; '.join(space.violations(c.as_dict()))}")


def search(space: Space, strategy: Strategy, backend, budget: Budget, keep: int = 4,
           cache: Mapping[str, Outcome] | None = None, on_trial: Callable[[Trial], None] | None = None,
           batch: int = 1, max_idle: int = 10_000, target: float | None = None) -> SearchResult:
    """Run ``strategy`` against ``backend`` until the budget is spent or the strategy stops.

    Parameters:
        keep: size of the ranked top-k (default 4).
        cache: outcomes by fingerprint from an interrupted run of the same
            search; a proposal found there is counted but not measured again.
        on_trial: called with every outcome as soon as it exists (the driver
            writes it to the records database there, before going on).
        batch: candidates asked for per round (default 1).
        max_idle: stop after this many consecutive proposals that give no new
            evaluation (duplicates or rejections), a guard against a strategy
            that cannot make progress.
        target: stop as soon as a measured metric is at or below it (default
            None: never). Replay benchmarks pass the known optimum, after
            which nothing the search could still find would change its result.
    """
    cache = cache or {}
    tally = Tally()
    ranked = Ranked(keep)
    dups = 0
    stop = ""

    def settle(c: Candidate, o: Outcome, cached: bool = False) -> tuple[Candidate, Outcome]:
        t = tally.settle(c, o, cached)
        if on_trial:
            on_trial(t)
        if o.ok:
            ranked.insert(o.metric, c, o)
        return c, o

    while not stop:
        elapsed = time.perf_counter() - tally.t0
        if budget.evals is not None and tally.evals >= budget.evals:
            stop = f"budget of {budget.evals} evaluations spent"
            break
        if budget.seconds is not None and elapsed >= budget.seconds:
            stop = f"time budget of {budget.seconds:g} s spent"
            break
        want = batch if budget.evals is None else min(batch, budget.evals - tally.evals)
        cands = strategy.ask(want)
        if not cands:
            stop = strategy.stop_reason or "strategy has nothing more to propose"
            break
        told: list[tuple[Candidate, Outcome]] = []
        fresh: list[Candidate] = []
        for c in cands:
            if c.fingerprint in tally.seen:  # the loop never measures a fingerprint twice
                dups += 1
                tally.idle += 1
                told.append((c, tally.seen[c.fingerprint]))
            elif not space.is_valid(c):
                told.append(settle(c, Tally.rejection(space, c)))
            else:
                fresh.append(c)
        todo = [c for c in fresh if c.fingerprint not in cache]
        measured = dict(zip((c.fingerprint for c in todo), backend.measure(todo))) if todo else {}
        for c in fresh:
            cached = c.fingerprint in cache
            told.append(settle(c, cache[c.fingerprint] if cached else measured[c.fingerprint], cached))
        strategy.tell(told)
        if target is not None and tally.curve and tally.curve[-1][1] <= target:
            stop = "reached the target metric"
        elif tally.idle >= max_idle:
            stop = f"{tally.idle} consecutive proposals gave no new evaluation"
    return SearchResult(tally.trials, ranked, tally.curve, stop, tally.evals, dups + strategy.total_duplicates,
                        time.perf_counter() - tally.t0, tally.counts)
