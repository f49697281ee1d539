"""The tuning loop: strategy.ask -> executor (build, measure) -> strategy.tell, within a budget.

There is one loop, ``search_async``: whenever an executor's slots are free it
asks the strategy for exactly that many candidates, so a slow slot holds up
only its own candidate: the others go on measuring. Results are settled
(counted, recorded, ranked and told to the strategy) as they arrive, or,
with ``ordered`` (what the tuning driver asks for), in the order their
candidates were submitted, so that where measurements do not change (a
table, a recording) the trials, the best-so-far curve and the ranking do not
depend on which slot finished first. (A strategy that adapts to each result
still sees batches as wide as the free slots, so its later proposals depend
on the number of slots; one that does not, random or exhaustive, proposes
the same candidates on one slot and on many.) Triage (duplicates, restrictions, an interrupted
run's outcomes, the funnel's roofline screen), the stop rules, the records
callback and the progress all live here, once. ``search`` is the loop over
one slot on the caller's thread (``InlineExecutor``), measuring a backend
itself; ``search_on`` is the loop on an executor made from settings
(``local`` with many workers, ``ray``).

A heterogeneous cluster tunes per device fingerprint: each fingerprint the
executor's slots report gets a search of its own (its own strategy, seeded
alike; its own duplicate set, so a candidate measured on one kind of machine
is still measured on another; its own ranked top-k and its own evaluation
budget), and its candidates go to slots of that fingerprint only, so times of
two kinds of machine never meet. On a uniform cluster that is one search.
"""
from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Union

from ..measure.executor import Executor, InlineExecutor, make_executor
from ..outcome import Outcome
from ..space import Candidate, Space
from .ranked import Ranked
from .recheck import Rechecks
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
    # the search per device fingerprint, this one included
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




class Admission(Protocol):
    """A screen in front of the slots (the funnel's roofline stage, ``costmodel.funnel.Screen``):
    ``admit(candidate, best)`` says why a candidate must not be measured, given
    the best metric measured so far (None: nothing yet), or None to measure it.
    A refused candidate is a ``rejected`` outcome: never measured, not an evaluation.
    ``observe(candidate, metric)`` is told every measured time (a screen whose bounds a
    measurement beats corrects them)."""

    def admit(self, c: Candidate, best: float | None) -> str | None: ...

    def observe(self, c: Candidate, metric: float) -> None: ...


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
    inflight: int = 0  # submitted and not yet settled (arrived ones waiting for an earlier one included)
    # (ordered settling) fingerprints in flight in submission order, and results that finished before an earlier one
    order: deque = field(default_factory=deque)
    arrived: dict = field(default_factory=dict)
    floor: float | None = None  # the best of an interrupted run's outcomes, for the screen before any is settled
    rechecks: Rechecks = field(default_factory=Rechecks)  # times >= 10x the best, held until measured again

    def best(self) -> float | None:
        """The best metric so far (the screen's incumbent)."""
        cur = self.tally.curve[-1][1] if self.tally.curve else None
        return cur if self.floor is None else self.floor if cur is None else min(cur, self.floor)


def search_async(space: Space, strategy: StrategyFor, executor: Executor, budget: Budget, keep: int = 4,
                 cache: CacheFor = None, on_trial: Callable[[Trial], None] | None = None,
                 max_idle: int = 10_000, target: float | None = None, default_target: str = "",
                 on_done: Callable[[Trial, str], None] | None = None, poll_s: float = 0.5,
                 screen: Admission | None = None, ordered: bool = False) -> SearchResult:
    """Run a search per device fingerprint on ``executor`` until each has spent its budget or stopped.

    Parameters:
        space: the space searched; a proposal outside it is a ``rejected``
            outcome naming the restriction it breaks, never measured.
        strategy: the strategy, or ``f(fingerprint) -> Strategy`` making each
            fingerprint's own (needed when the slots report more than one;
            give each the same name, settings and seed, so that a
            fingerprint's search does not depend on the others).
        executor: ``free_by_target() / submit(candidates, target) /
            poll(timeout) / pending()`` (see ``planforge.measure.executor``).
        budget: per device fingerprint: each kind of machine gets
            ``budget.evals`` evaluations of its own; ``budget.seconds`` is the
            wall time of the whole search.
        keep: size of the ranked top-k (default 4).
        cache: outcomes by candidate fingerprint from an interrupted run of
            the same search, or ``f(fingerprint) -> those`` of each device's
            search; a proposal found there is counted but not measured again.
        on_trial: called with every outcome as soon as it exists (the driver
            writes it to the records database there, before going on).
        max_idle: stop after this many consecutive proposals that give no new
            evaluation (duplicates or rejections), a guard against a strategy
            that cannot make progress (default 10000).
        target: stop as soon as a measured metric is at or below it (default
            None: never). Replay benchmarks pass the known optimum, after
            which nothing the search could still find would change its result.
        screen: asked about each new proposal before it is measured, with the
            best metric so far (of an interrupted run's outcomes too); a
            refusal is a ``rejected`` outcome (default None: measure all).
        ordered: settle results in the order their candidates were submitted
            (a result that finished early waits for the earlier ones), so that
            the same measurements give the same trials whichever slot was
            quicker (default False: as they arrive, so the strategy hears of
            each result at once).
        default_target: the driver's device fingerprint: its search is the
            result (else the one with the most measurements).
        on_done: called with each trial and the device fingerprint whose
            search it belongs to (the driver records it under that
            fingerprint); when None, ``on_trial`` alone is called.
        poll_s: longest wait for a result before checking the time budget (default 0.5 s).
    A result 10x slower than the best so far, timed while other processes
    used the measuring CPUs, is held back and measured again a little later
    (``search.recheck``): the faster of the two is settled, both are kept.
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
            known = (cache(where) if callable(cache) else cache) or {}
            s = searches[where] = _Search(where, strat, known, Ranked(keep))
            s.floor = min((o.metric for o in known.values() if o.ok), default=None)
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
            if screen is not None:
                screen.observe(c, o.metric)
        return c, o

    def resubmit(s: _Search, where: str, again: list[Candidate]) -> int:
        """Measure suspiciously slow results again (``search.recheck``); they are in flight already."""
        if again:
            executor.submit(again, target=where)
            if ordered:
                s.order.extend(c.fingerprint for c in again)
        return len(again)

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
            redo = resubmit(s, where, s.rechecks.due(free.get(where, 0), bool(s.stop or s.exhausted)))
            want = 0 if (s.stop or s.exhausted) else free.get(where, 0) - redo
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
                elif screen is not None and (why := screen.admit(c, s.best())):
                    told.append(settle(s, c, Outcome.rejected(why), False))
                else:
                    fresh.append(c)
            if told:
                s.strategy.tell(told)
            if fresh:
                executor.submit(fresh, target=where)
                s.inflight += len(fresh)
                s.rechecks.submitted += len(fresh)
                if ordered:
                    s.order.extend(c.fingerprint for c in fresh)
            elif told:
                again = True  # nothing new in flight: ask again at once
        if again:
            continue
        if executor.pending():
            ready: dict[str, list] = {}
            for d in executor.poll(poll_s):
                if ordered:
                    search_for(d.target).arrived[d.candidate.fingerprint] = d
                else:  # as they arrive
                    ready.setdefault(d.target, []).append(d)
            if ordered:
                # in submission order, whichever slot finished first, so that with measurements that do not
                # change, the trials, the curve and the ranking (ties go after) do not depend on the slots
                for where, s in searches.items():
                    while s.order and s.order[0] in s.arrived:
                        ready.setdefault(where, []).append(s.arrived.pop(s.order.popleft()))
            for where, done in ready.items():
                s = search_for(where)
                now = s.rechecks.sift([(d.candidate, d.outcome) for d in done], s.best())  # holds suspects back
                s.inflight -= len(now)
                if now:
                    s.strategy.tell([settle(s, c, o, False) for c, o in now])
        else:
            for where, s in searches.items():
                if s.rechecks.held:  # nothing else in flight to wait behind: measure the suspects again now
                    resubmit(s, where, s.rechecks.due(len(s.rechecks.held), True))
                elif not (s.stop or s.exhausted or s.inflight):
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


def search(space: Space, strategy: Strategy, backend, budget: Budget, keep: int = 4,
           cache: Mapping[str, Outcome] | None = None, on_trial: Callable[[Trial], None] | None = None,
           batch: int = 1, max_idle: int = 10_000, target: float | None = None,
           screen: Admission | None = None) -> SearchResult:
    """Run ``strategy`` against ``backend`` (a ``planforge.targets.base.Backend``,
    measured on this thread) until the budget is spent or the strategy stops:
    ``search_async`` over one slot (``InlineExecutor``).

    Parameters are those of ``search_async``, and:
        batch: candidates asked for per round, measured in one
            ``backend.measure`` call (default 1).
    """
    return search_async(space, strategy, InlineExecutor(backend, batch), budget, keep=keep, cache=cache,
                        on_trial=on_trial, max_idle=max_idle, target=target,
                        default_target=backend.fingerprint, screen=screen)


def search_on(executor: dict | None, space: Space, strategy: StrategyFor, backend, budget: Budget, keep: int = 4,
              cache: CacheFor = None, on_done: Callable[[Trial, str], None] | None = None,
              **kw) -> SearchResult:
    """``search_async`` on an executor made for ``backend`` from ``executor``
    (``{"kind": "local"|"ray"|"inline", **options of its constructor}``;
    None: ``inline``, one slot measuring ``backend`` on this thread), closed
    after. ``kw`` go to ``search_async`` (``screen``, ``max_idle``...).
    ``result.executor`` says what ran: kind, slots per device fingerprint,
    start-up seconds, and seconds spent building and measuring (summed over
    candidates)."""
    opts = dict(executor or {"kind": "inline"})
    kind = opts.pop("kind", "local")
    ex = make_executor(kind, backend, **opts)
    try:
        res = search_async(space, strategy, ex, budget, keep=keep, cache=cache, on_done=on_done,
                           default_target=backend.fingerprint, **kw)
        slots = ex.slots_by_target()
    finally:
        ex.close()
    res.executor = {"kind": kind, "slots": ex.slots, "targets": slots, "startup_s": ex.ready_s,
                    "build_s": ex.seconds["build"], "measure_s": ex.seconds["measure"]}
    return res
