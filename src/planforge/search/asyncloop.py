"""The tuning loop with measurements in flight: for executors with many slots.

``search_async`` is ``search`` (same budget, cache, records and stop rules)
for an executor: whenever slots are free it asks the strategy for exactly that
many candidates, and it tells the strategy each result as it arrives, in
whatever order they finish. A slow slot holds up only its own candidate.

A heterogeneous cluster tunes per device fingerprint: each fingerprint the
executor's slots report gets a search of its own (its own strategy, seeded
alike; its own duplicate set, so a candidate measured on one kind of machine
is still measured on another; its own ranked top-k and its own evaluation
budget), and its candidates go to slots of that fingerprint only, so times of
two kinds of machine never meet. On a uniform cluster that is one search.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping, Union

from ..outcome import Outcome
from ..space import Candidate, Space
from .loop import Budget, SearchResult, Tally, Trial
from .ranked import Ranked
from .strategies import Strategy

StrategyFor = Union[Strategy, Callable[[str], Strategy]]
CacheFor = Union[Mapping[str, Outcome], Callable[[str], Mapping[str, Outcome]], None]


@dataclass
class _Search:
    """One device fingerprint's search."""

    target: str
    strategy: Strategy
    cache: Mapping[str, Outcome]
    ranked: Ranked
    tally: Tally = field(default_factory=Tally)
    dups: int = 0
    stop: str = ""
    exhausted: bool = False
    inflight: int = 0


def search_async(space: Space, strategy: StrategyFor, executor, budget: Budget, keep: int = 4,
                 cache: CacheFor = None, on_trial: Callable[[Trial], None] | None = None,
                 max_idle: int = 10_000, target: float | None = None, default_target: str = "",
                 on_done: Callable[[Trial, str], None] | None = None, poll_s: float = 0.5) -> SearchResult:
    """Run a search per device fingerprint on ``executor`` until each has spent its budget or stopped.

    Parameters are those of ``search``, and:
        strategy: the strategy, or ``f(fingerprint) -> Strategy`` making each
            fingerprint's own (needed when the slots report more than one;
            give each the same name, settings and seed, so that a
            fingerprint's search does not depend on the others).
        executor: ``free_by_target() / submit(candidates, target) /
            poll(timeout) / pending()`` (see ``planforge.measure.executor``).
        cache: outcomes by candidate fingerprint from an interrupted run, or
            ``f(fingerprint) -> those`` of each device's search.
        budget: per device fingerprint: each kind of machine gets
            ``budget.evals`` evaluations of its own; ``budget.seconds`` is the
            wall time of the whole search.
        default_target: the driver's device fingerprint: its search is the
            result (else the one with the most measurements).
        on_done: called with each trial and the device fingerprint whose
            search it belongs to (the driver records it under that
            fingerprint); when None, ``on_trial`` alone is called.
        poll_s: longest wait for a result before checking the time budget (default 0.5 s).
    Once a search has spent its budget or stopped, its candidates in flight
    are waited for and recorded: nothing measured is thrown away. The result
    is the main fingerprint's search; ``by_target`` holds every
    fingerprint's, the main one included.
    """
    t0 = time.perf_counter()
    searches: dict[str, _Search] = {}

    def search_for(where: str) -> _Search:
        s = searches.get(where)
        if s is None:
            if callable(strategy):
                strat = strategy(where)
            elif not searches:
                strat = strategy
            else:
                raise ValueError(f"the executor's slots report several device fingerprints ({next(iter(searches))}, "
                                 f"{where}): give search_async a strategy per fingerprint (a callable), so that "
                                 "each kind of machine is tuned on its own")
            s = searches[where] = _Search(where, strat, (cache(where) if callable(cache) else cache) or {},
                                          Ranked(keep))
            s.tally.t0 = t0
        return s

    def settle(s: _Search, c: Candidate, o: Outcome, cached: bool) -> tuple[Candidate, Outcome]:
        t = s.tally.settle(c, o, cached)
        if on_done:
            on_done(t, s.target)
        elif on_trial:
            on_trial(t)
        if o.ok:
            s.ranked.insert(o.metric, c, o)
        return c, o

    def check(s: _Search) -> None:
        tally = s.tally
        if s.stop:
            return
        if budget.evals is not None and tally.evals >= budget.evals:
            s.stop = f"budget of {budget.evals} evaluations spent"
        elif budget.seconds is not None and time.perf_counter() - t0 >= budget.seconds:
            s.stop = f"time budget of {budget.seconds:g} s spent"
        elif target is not None and tally.curve and tally.curve[-1][1] <= target:
            s.stop = "reached the target metric"
        elif tally.idle >= max_idle:
            s.stop = f"{tally.idle} consecutive proposals gave no new evaluation"
        elif s.exhausted and not s.inflight:
            s.stop = s.strategy.stop_reason or "strategy has nothing more to propose"

    while True:
        free = executor.free_by_target()
        for where in free:  # a kind of machine seen for the first time gets its own search
            search_for(where)
        for s in searches.values():
            check(s)
        if all(s.stop and not s.inflight for s in searches.values()):
            break
        again = False
        for where, s in searches.items():
            want = 0 if (s.stop or s.exhausted) else free.get(where, 0)
            if budget.evals is not None:  # never ask for more than the budget can take
                want = min(want, budget.evals - s.tally.evals - s.inflight)
            if want <= 0:
                continue
            cands = s.strategy.ask(want)
            if not cands:
                s.exhausted = True
            told: list[tuple[Candidate, Outcome]] = []
            fresh: list[Candidate] = []
            for c in cands:
                if c.fingerprint in s.tally.seen:
                    s.dups += 1
                    s.tally.idle += 1
                    told.append((c, s.tally.seen[c.fingerprint]))
                elif not space.is_valid(c):
                    told.append(settle(s, c, Tally.rejection(space, c), False))
                elif c.fingerprint in s.cache:
                    told.append(settle(s, c, s.cache[c.fingerprint], True))
                else:
                    fresh.append(c)
            if told:
                s.strategy.tell(told)
            if fresh:
                executor.submit(fresh, target=where)
                s.inflight += len(fresh)
            elif told:
                again = True  # nothing new in flight: ask again at once
        if again:
            continue
        if executor.pending():
            told_by: dict[str, list[tuple[Candidate, Outcome]]] = {}
            for d in executor.poll(poll_s):
                s = search_for(d.target)
                s.inflight -= 1
                told_by.setdefault(d.target, []).append(settle(s, d.candidate, d.outcome, False))
            for where, told in told_by.items():
                searches[where].strategy.tell(told)
        else:
            for s in searches.values():
                if not (s.stop or s.exhausted or s.inflight):
                    s.stop = "no measurement slot is left"
    seconds = time.perf_counter() - t0
    by_target = {w: SearchResult(s.tally.trials, s.ranked, s.tally.curve, s.stop, s.tally.evals,
                                 s.dups + s.strategy.total_duplicates, seconds, s.tally.counts)
                 for w, s in searches.items()}
    if not by_target:
        return SearchResult([], Ranked(keep), [], "no measurement slot is left", 0, 0, seconds, Counter())
    main = default_target if default_target in by_target else \
        max(sorted(by_target), key=lambda w: by_target[w].counts["measured"])
    res = by_target[main]
    res.by_target = by_target
    return res


def search_on(executor: dict, space: Space, strategy: StrategyFor, backend, budget: Budget, keep: int = 4,
              cache: CacheFor = None, on_done: Callable[[Trial, str], None] | None = None,
              **kw) -> SearchResult:
    """``search_async`` on an executor made for ``backend`` from ``executor``
    (``{"kind": "local"|"ray", **options of its constructor}``), closed after.
    ``result.executor`` says what ran: kind, slots per device fingerprint,
    start-up seconds, and seconds spent building and measuring (summed over
    candidates)."""
    from ..measure.executor import make_executor

    opts = dict(executor)
    ex = make_executor(opts.pop("kind", "local"), backend, **opts)
    try:
        res = search_async(space, strategy, ex, budget, keep=keep, cache=cache, on_done=on_done,
                           default_target=backend.fingerprint, **kw)
        slots = ex.slots_by_target()
    finally:
        ex.close()
    res.executor = {"kind": executor.get("kind", "local"), "slots": ex.slots, "targets": slots,
                    "startup_s": getattr(ex, "ready_s", 0.0), "build_s": ex.seconds["build"],
                    "measure_s": ex.seconds["measure"]}
    return res
