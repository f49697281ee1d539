"""The tuning loop with measurements in flight: for executors with many slots.

``search_async`` is ``search`` (same budget, cache, records and stop rules)
for an executor: whenever slots are free it asks the strategy for exactly that
many candidates, and it tells the strategy each result as it arrives, in
whatever order they finish. A slow slot holds up only its own candidate.

Times are ranked per device fingerprint: each result carries the fingerprint
of the slot that measured it, and only times of one fingerprint share a
ranked list. ``SearchResult.ranked`` is the list of the driver's fingerprint,
else of the one with the most measurements (on a uniform cluster, the only
one); ``by_target`` has
them all, so a heterogeneous cluster yields a ranking per kind of machine.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Callable, Mapping

from ..outcome import Outcome
from ..space import Candidate, Space
from .loop import Budget, SearchResult, Tally, Trial
from .ranked import Ranked
from .strategies import Strategy


def search_async(space: Space, strategy: Strategy, executor, budget: Budget, keep: int = 4,
                 cache: Mapping[str, Outcome] | None = None, on_trial: Callable[[Trial], None] | None = None,
                 max_idle: int = 10_000, target: float | None = None, default_target: str = "",
                 on_done: Callable[[Trial, str], None] | None = None, poll_s: float = 0.5) -> SearchResult:
    """Run ``strategy`` on ``executor`` until the budget is spent or the strategy stops.

    Parameters are those of ``search``, and:
        executor: ``free() / submit(candidates) / poll(timeout) / pending()``
            (see ``planforge.measure.executor``).
        default_target: fingerprint for outcomes that no slot measured
            (rejections, cached outcomes); the driver's backend's.
        on_done: called with each trial and the fingerprint of the device that
            measured it (the driver records it under that fingerprint); when
            None, ``on_trial`` alone is called.
        poll_s: longest wait for a result before checking the time budget (default 0.5 s).
    Once the budget is spent or the strategy stops, the candidates in flight
    are waited for and recorded: nothing measured is thrown away.
    """
    cache = cache or {}
    tally = Tally()
    by_target: dict[str, Ranked] = {}
    measured: Counter = Counter()  # measured outcomes per device fingerprint
    dups = 0
    stop = ""
    exhausted = False

    def settle(c: Candidate, o: Outcome, cached: bool, where: str) -> tuple[Candidate, Outcome]:
        t = tally.settle(c, o, cached)
        if on_done:
            on_done(t, where)
        elif on_trial:
            on_trial(t)
        if o.ok:
            by_target.setdefault(where, Ranked(keep)).insert(o.metric, c, o)
        return c, o

    while True:
        inflight = executor.pending()
        if not stop:
            if budget.evals is not None and tally.evals >= budget.evals:
                stop = f"budget of {budget.evals} evaluations spent"
            elif budget.seconds is not None and time.perf_counter() - tally.t0 >= budget.seconds:
                stop = f"time budget of {budget.seconds:g} s spent"
            elif target is not None and tally.curve and tally.curve[-1][1] <= target:
                stop = "reached the target metric"
            elif tally.idle >= max_idle:
                stop = f"{tally.idle} consecutive proposals gave no new evaluation"
            elif exhausted and not inflight:
                stop = strategy.stop_reason or "strategy has nothing more to propose"
        if stop and not inflight:
            break
        want = 0 if (stop or exhausted) else executor.free()
        if budget.evals is not None:
            want = min(want, budget.evals - tally.evals - inflight)  # never ask for more than the budget can take
        if want > 0:
            cands = strategy.ask(want)
            if not cands:
                exhausted = True
            told: list[tuple[Candidate, Outcome]] = []
            fresh: list[Candidate] = []
            for c in cands:
                if c.fingerprint in tally.seen:
                    dups += 1
                    tally.idle += 1
                    told.append((c, tally.seen[c.fingerprint]))
                elif not space.is_valid(c):
                    told.append(settle(c, Tally.rejection(space, c), False, default_target))
                elif c.fingerprint in cache:
                    told.append(settle(c, cache[c.fingerprint], True, default_target))
                else:
                    fresh.append(c)
            if told:
                strategy.tell(told)
            if fresh:
                executor.submit(fresh)
            if told and not fresh:
                continue  # nothing new in flight: ask again at once
        if executor.pending():
            done = executor.poll(poll_s)
            if done:
                for d in done:
                    if d.outcome.ok:
                        measured[d.target] += 1
                strategy.tell([settle(d.candidate, d.outcome, False, d.target) for d in done])
        elif not (stop or exhausted or want > 0):
            stop = "no measurement slot is left"
    main = default_target if default_target in by_target else max(measured, key=measured.get, default=None)
    ranked = by_target.get(main) or Ranked(keep)
    res = SearchResult(tally.trials, ranked, tally.curve, stop, tally.evals, dups + strategy.total_duplicates,
                       time.perf_counter() - tally.t0, tally.counts)
    res.by_target = by_target  # type: ignore[attr-defined]
    return res


def search_on(executor: dict, space: Space, strategy: Strategy, backend, budget: Budget, keep: int = 4,
              cache: Mapping[str, Outcome] | None = None, on_done: Callable[[Trial, str], None] | None = None,
              **kw) -> SearchResult:
    """``search_async`` on an executor made for ``backend`` from ``executor``
    (``{"kind": "local"|"ray", **options of its constructor}``), closed after."""
    from ..measure.executor import make_executor

    opts = dict(executor)
    ex = make_executor(opts.pop("kind", "local"), backend, **opts)
    try:
        res = search_async(space, strategy, ex, budget, keep=keep, cache=cache, on_done=on_done,
                           default_target=backend.fingerprint, **kw)
    finally:
        ex.close()
    res.executor = {"kind": executor.get("kind", "local"), "slots": ex.slots,  # type: ignore[attr-defined]
                    "startup_s": getattr(ex, "ready_s", 0.0)}
    return res
