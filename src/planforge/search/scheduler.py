"""The task scheduler: one budget of evaluations spent across a workload's tasks where end-to-end latency gains most.

A workload of several tasks (the distinct parts of a partitioned model, each
weighted by how often it runs) has one budget for all of them. A warm-up
round gives each task a few evaluations; after that each next grant of
``step`` evaluations goes to the task the scheduler scores highest:

- ``gradient`` (the default), in the spirit of Ansor's task scheduler: the
  task with the largest estimated end-to-end gain per evaluation. A task's
  share of the end-to-end latency is its weight times its best latency so
  far; how fast that share still falls is estimated from the task's
  best-so-far curve (its slope over the last ``window`` evaluations)
  blended with an optimistic term, best / evaluations, which is large for a
  task barely explored and fades as it is explored. A task with no valid
  plan yet comes first: the plan needs every task.
- ``round-robin``: the task with the fewest evaluations, so that the budget
  splits evenly.

A task's search runs in grants (``TaskSearch``): its strategy (one per
device fingerprint), its executor and a cache of its outcomes stay alive
between grants, so a grant goes on where the last one stopped. On one slot a
task granted 4 + 1 + 3 evaluations asks and tells its strategy exactly as one
search of 8 would. A resumed run replays: each task's fresh strategy meets
the interrupted run's outcomes as the loop's cache; the scheduler decides
from outcomes only (never from wall times), so the same grants go to the
same tasks and only what the interrupted run had not measured is measured.
"""
from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Mapping, Protocol, Sequence

from ..measure.executor import Executor
from ..outcome import Outcome
from ..space import Space
from .loop import Admission, Budget, SearchResult, Trial, search_async
from .ranked import Ranked
from .strategies import Strategy

DEFAULT_WARMUP = 2  # evaluations each task gets before the scheduler scores it: a graph task's two extracted seed plans


@dataclass
class TaskState:
    """What the scheduler knows of one task.

    Parameters:
        key: the task's key.
        weight: how often the task runs per workload execution (its end-to-end multiplier).
        evals: evaluations its search has spent (default 0).
        curve: (evaluation, best metric so far) at each improvement (default empty).
        metrics: every valid metric measured, in order (default empty).
        stopped: why its search can take no more (default "": it is open).
        grants: grants it has had (default 0).
    """

    key: str
    weight: float
    evals: int = 0
    curve: list[tuple[int, float]] = field(default_factory=list)
    metrics: list[float] = field(default_factory=list)
    stopped: str = ""
    grants: int = 0

    @property
    def best(self) -> float | None:
        """The best metric measured so far (None: no valid measurement yet)."""
        return self.curve[-1][1] if self.curve else None

    def best_at(self, n: int) -> float | None:
        """The best metric after its first ``n`` evaluations (None: none valid by then)."""
        i = bisect.bisect_right([e for e, _ in self.curve], n)
        return self.curve[i - 1][1] if i else None

    @property
    def share(self) -> float | None:
        """Its part of the end-to-end latency: weight x best (None before a valid measurement)."""
        return None if self.best is None else self.weight * self.best


class Scheduler(Protocol):
    """Chooses which task the next grant goes to: ``scores(states)`` gives one score per task (higher is
    granted first; ties go to the earlier task); only open tasks are considered."""

    name: str

    def scores(self, states: Sequence[TaskState]) -> list[float]: ...

    def describe(self) -> dict: ...


@dataclass
class RoundRobin:
    """Grants go to the open task with the fewest evaluations (the earliest on a tie): the budget splits
    evenly, a task that stops early leaving its share to the others."""

    name: ClassVar[str] = "round-robin"

    def scores(self, states: Sequence[TaskState]) -> list[float]:
        return [-float(s.evals) for s in states]

    def describe(self) -> dict:
        return {"name": self.name}


@dataclass
class Gradient:
    """Grants go to the task with the largest estimated end-to-end gain per evaluation.

    gain = weight x (alpha x slope + (1 - alpha) x hope), both in seconds of task latency per evaluation
    (the weight turns them into seconds of end-to-end latency):

    - slope: how much its best latency fell per evaluation over its last ``window`` evaluations (since its
      first valid one, when that is more recent): what the task is doing now.
    - hope: what one more evaluation is expected to save. Were the task's plans exchangeable draws, the
      next one would beat the best of the n so far with probability 1 / (n + 1), and then by the gap between
      the best and the second best of the n + 1: the expected saving is E[x(2) - x(1)] / (n + 1). It is
      estimated from the task's own measurements, as the mean gap among its ``k`` + 1 best over n (a spacing
      over several order statistics, so that one near-tie does not zero it). A task whose plans measure
      alike has little hope left; one whose best plans are far apart, much. Until it has ``k`` + 1 valid
      measurements it is the optimistic best / n (large for a task barely explored).

    alpha 0.2 and the backward window are Ansor's. Chosen by replaying recorded per-task curves through
    ``schedule`` (a task's strategy proposes the same plans whatever its grants, so the curves of one
    measured run replay any allocation; ``bench/scheduler_replay.py``): on 30 synthetic families of 3-8
    random-search tasks (shares 2-50%, 5 seeds each; ``--synthetic 30``), with the 2-evaluation warm-up, it
    reached within 5% of the reference in 0.84-0.88x round-robin's mean evaluations, where the hindsight
    optimum needs 0.48-0.55x (the earlier hope, best / n times a median-spread factor, with a 4-evaluation
    warm-up: about 0.95x); on the recorded curves of the zoo's transformer-6 and a ResNet-shaped residual
    MLP, see docs/benchmarks.md.

    Parameters:
        alpha: weight of the slope against the hope (default 0.2).
        window: evaluations the slope looks back over (default 8).
        k: order statistics the hope's spacing averages over (default 8).
        patience: a task with no valid measurement comes first until it has had this many evaluations,
            then last (default 16), so that a task whose every plan fails cannot take the whole budget.
    """

    alpha: float = 0.2
    window: int = 8
    k: int = 8
    patience: int = 16
    name: ClassVar[str] = "gradient"

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"gradient scheduler: alpha must be within [0, 1], got {self.alpha}")
        if self.window < 1 or self.patience < 1 or self.k < 1:
            raise ValueError(f"gradient scheduler: window, k and patience must be at least 1, got "
                             f"{self.window}, {self.k} and {self.patience}")

    def gain(self, s: TaskState) -> float:
        """Estimated seconds of end-to-end latency one more evaluation of ``s`` saves."""
        if s.best is None:
            return math.inf if s.evals < self.patience else 0.0
        n = max(1, s.evals)
        start = max(n - self.window, s.curve[0][0])
        slope = (s.best_at(start) - s.best) / max(1, n - start)
        if len(s.metrics) > self.k:
            kth = heapq.nsmallest(self.k + 1, s.metrics)[-1]
            hope = (kth - s.best) / self.k / n
        else:
            hope = s.best / n
        return s.weight * (self.alpha * slope + (1.0 - self.alpha) * hope)

    def scores(self, states: Sequence[TaskState]) -> list[float]:
        return [self.gain(s) for s in states]

    def describe(self) -> dict:
        return {"name": self.name, "alpha": self.alpha, "window": self.window, "k": self.k,
                "patience": self.patience}


SCHEDULERS: dict[str, type] = {"gradient": Gradient, "round-robin": RoundRobin}


def make_scheduler(name: str, **options) -> Scheduler:
    """The scheduler ``name`` (``gradient`` or ``round-robin``) with ``options`` (its dataclass fields)."""
    if name not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {name!r}; choose one of: {', '.join(SCHEDULERS)}")
    cls = SCHEDULERS[name]
    known = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(options) - known)
    if bad:
        raise ValueError(f"scheduler {name!r} has no option {', '.join(map(repr, bad))}; its options: "
                         f"{', '.join(sorted(known)) or 'none'}")
    return cls(**options)


class Grantable(Protocol):
    """A task's search that runs in grants: ``state`` (kept current), ``grant(evals, seconds)`` runs up to
    ``evals`` more evaluations (None: no limit) within ``seconds`` (None: no limit) and returns how many it
    spent; fewer than asked means its search stopped, and ``state.stopped`` says why."""

    state: TaskState

    def grant(self, evals: int | None, seconds: float | None = None) -> int: ...


@dataclass(frozen=True)
class Grant:
    """One decision of the scheduler: ``evals`` asked of task ``task``, ``spent`` taken, and the ``score``
    that chose it (None in the warm-up round)."""

    task: str
    evals: int
    spent: int
    score: float | None = None


def schedule(searches: Sequence[Grantable], scheduler: Scheduler, total: int | None, warmup: int = DEFAULT_WARMUP,
             step: int = 1, seconds: float | None = None,
             on_grant: Callable[[Grant, Sequence[TaskState]], None] | None = None,
             open_limit: int | None = None) -> list[Grant]:
    """Spend ``total`` evaluations across ``searches``; the grants in the order they were made.

    Parameters:
        searches: one per task, in the workload's order.
        scheduler: picks the task of each grant after the warm-up (``Gradient``, ``RoundRobin``).
        total: evaluations over all tasks (None: until ``seconds`` run out or every search stops).
        warmup: evaluations each task gets first, in order (default ``DEFAULT_WARMUP``; less when the budget
            cannot give every task that many: ``total // len(searches)``).
        step: evaluations per grant after the warm-up (default 1: every evaluation is a decision).
        seconds: wall seconds for all grants (default None: no limit).
        on_grant: called after each grant with it and every task's state (progress display).
        open_limit: at most this many searches keep their executors open between grants (default None: all);
            the least recently granted ones beyond it, and every stopped one, are parked (``park()``, where a
            search has one), so that many tasks do not each hold their workers.
    Raises ValueError when ``total`` cannot give each task one evaluation."""
    if not searches:
        return []
    if step < 1 or warmup < 1:
        raise ValueError(f"the scheduler's step and warm-up must be at least 1 evaluation, got {step} and {warmup}")
    if open_limit is not None and open_limit < 1:
        raise ValueError(f"the scheduler keeps at least one executor open, got open_limit {open_limit}")
    if total is not None and total < len(searches):
        raise ValueError(f"a budget of {total} evaluations cannot give each of the {len(searches)} tasks one: "
                         f"give at least {len(searches)}")
    t0 = time.perf_counter()
    grants: list[Grant] = []
    states = [s.state for s in searches]
    spent_all = 0
    recent: list[int] = []  # searches in the order they were last granted, the latest last

    def park(i: int) -> None:
        if hasattr(searches[i], "park"):
            searches[i].park()

    def left() -> int | None:
        return None if total is None else total - spent_all

    def give(i: int, k: int | None, score: float | None) -> bool:
        nonlocal spent_all
        remaining = None if seconds is None else seconds - (time.perf_counter() - t0)
        if remaining is not None and remaining <= 0:
            return False
        st = states[i]
        spent = searches[i].grant(k, remaining)
        st.grants += 1
        spent_all += spent
        if k is not None and spent < k and not st.stopped:
            st.stopped = f"its search took {spent} of the {k} evaluations granted"
        if open_limit is not None:
            if i in recent:
                recent.remove(i)
            recent.append(i)
            if st.stopped:
                park(i)
            for j in recent[:-open_limit]:
                park(j)
        g = Grant(st.key, -1 if k is None else k, spent, score)
        grants.append(g)
        if on_grant:
            on_grant(g, states)
        return True

    warm = warmup if total is None else max(1, min(warmup, total // len(searches)))
    for i in range(len(searches)):
        if not give(i, warm, None):
            return grants
    while left() is None or left() > 0:
        open_ = [i for i, s in enumerate(states) if not s.stopped]
        if not open_:
            break
        scores = scheduler.scores(states)
        best = max(open_, key=lambda i: (scores[i], -i))  # ties go to the earlier task
        k = step if total is None else min(step, left())
        if not give(best, k, scores[best]):
            break
    return grants


def compact(grants: Sequence[Grant]) -> list[list]:
    """The grants as ``[task, evaluations]`` runs, consecutive grants of one task merged (for the spec)."""
    out: list[list] = []
    for g in grants:
        if out and out[-1][0] == g.task:
            out[-1][1] += g.spent
        else:
            out.append([g.task, g.spent])
    return out


class TaskSearch:
    """One task's search, run in grants by the scheduler (``Grantable``).

    Between grants it keeps each device fingerprint's strategy, the executor and a cache of every outcome
    so far, so a grant goes on where the last one stopped: the loop (``search_async``) runs once per grant
    with the grant as its evaluation budget, and the grants' results are joined into one ``SearchResult``
    whose evaluation numbers and wall times run on across grants.

    Parameters:
        key, weight: the task's key and weight (its ``TaskState``).
        space: the space searched (the funnel's subspace).
        strategy_for: ``f(fingerprint) -> Strategy`` making each device fingerprint's strategy, called once
            per fingerprint.
        make_executor: ``f() -> Executor``, called at the first grant; ``close`` closes what it made.
        default_target: the driver's device fingerprint (its search drives the state and is the result).
        keep: size of the ranked top-k (default 4).
        cache_for: ``f(fingerprint) -> outcomes`` of an interrupted run, read once per fingerprint
            (default None: nothing to resume).
        on_done: called with each trial (its evaluation number counted across grants) and its fingerprint.
        screen: the funnel's roofline screen (default None).
        ordered: settle results in submission order (default True: what the driver asks for).
        kind: the executor's kind, for ``result().executor`` (default "inline").
    ``result`` closes the executor (its figures summed over every executor the grants made: ``park`` closes
    one between grants).
    """

    def __init__(self, key: str, weight: float, space: Space, strategy_for: Callable[[str], Strategy],
                 make_executor: Callable[[], Executor], default_target: str, keep: int = 4,
                 cache_for: Callable[[str], Mapping[str, Outcome]] | None = None,
                 on_done: Callable[[Trial, str], None] | None = None, screen: Admission | None = None,
                 ordered: bool = True, kind: str = "inline"):
        self.state = TaskState(key, weight)
        self.space, self.keep, self.screen, self.ordered = space, keep, screen, ordered
        self.default_target, self.kind = default_target, kind
        self._strategy_for, self._make_executor = strategy_for, make_executor
        self._cache_for, self._on_done = cache_for, on_done
        self.strategies: dict[str, Strategy] = {}
        self._cache: dict[str, dict[str, Outcome]] = {}
        self._trials: dict[str, list[Trial]] = {}
        self._counts: dict[str, Counter] = {}
        self._loop_dups: Counter = Counter()
        self._stop: dict[str, str] = {}
        self._targets: list[str] = []  # every device fingerprint searched, in the order the loop met them
        self._seconds = 0.0
        self._executor: Executor | None = None
        self._made: dict | None = None  # the executor's figures, summed over the ones parked so far
        self._t0: float | None = None
        self.grants = 0

    def _strategy(self, where: str) -> Strategy:
        if where not in self.strategies:
            self.strategies[where] = self._strategy_for(where)
        return self.strategies[where]

    def _known(self, where: str) -> dict[str, Outcome]:
        if where not in self._cache:
            self._cache[where] = dict(self._cache_for(where) if self._cache_for else {})
        return self._cache[where]

    def _open(self) -> Executor:
        if self._executor is None:
            self._executor = self._make_executor()
        return self._executor

    def park(self) -> bool:
        """Close the executor between grants (its worker processes, core claims or actors), keeping the
        search's state; the next grant makes a new one. The scheduler parks the tasks it has not granted for
        a while, so that a model of many tasks does not hold one set of workers per task. False when there
        was nothing to close."""
        ex = self._executor
        if ex is None:
            return False
        figures = self._figures(ex)
        if self._made is not None:
            figures = {**figures, "startup_s": figures["startup_s"] + self._made["startup_s"],
                       "build_s": figures["build_s"] + self._made["build_s"],
                       "measure_s": figures["measure_s"] + self._made["measure_s"]}
        self._made = figures
        self._executor = None
        ex.close()
        return True

    def _figures(self, ex: Executor) -> dict:
        return {"kind": self.kind, "slots": ex.slots, "targets": ex.slots_by_target(), "startup_s": ex.ready_s,
                "build_s": ex.seconds["build"], "measure_s": ex.seconds["measure"]}

    def width(self) -> int:
        """Candidates its executor takes at once per device fingerprint (slots and look-ahead; 1 on one slot):
        a grant smaller than this leaves slots idle. Makes the executor if no grant has yet."""
        return max(1, max(self._open().free_by_target().values(), default=1))

    def grant(self, evals: int | None, seconds: float | None = None) -> int:
        """Run up to ``evals`` more evaluations (None: no limit) within ``seconds``; returns how many were spent."""
        if self.state.stopped:
            return 0
        executor = self._open()
        start = time.perf_counter()
        if self._t0 is None:
            self._t0 = start
        shift_s = start - self._t0 if self.grants else 0.0  # the first grant's trials keep the loop's own times
        offsets = {w: len([t for t in ts if t.n]) for w, ts in self._trials.items()}

        def done(trial: Trial, where: str) -> None:
            if trial.n or shift_s:
                trial = dataclasses.replace(trial, n=trial.n + offsets.get(where, 0) if trial.n else 0,
                                            wall_s=trial.wall_s + shift_s)
            # later grants find this outcome (a strategy's re-proposal is answered, the screen knows the best)
            self._known(where)[trial.candidate.fingerprint] = trial.outcome
            self._trials.setdefault(where, []).append(trial)
            if self._on_done:
                self._on_done(trial, where)

        budget = Budget(evals=evals, seconds=seconds) if (evals is not None or seconds is not None) else None
        if budget is None:
            raise ValueError("a grant needs evaluations, seconds or both")
        res = search_async(self.space, self._strategy, executor, budget, keep=self.keep, cache=self._known,
                           on_done=done, screen=self.screen, ordered=self.ordered, default_target=self.default_target)
        self.grants += 1
        self._seconds += res.seconds
        for where, r in (res.by_target or {self.default_target: res}).items():
            if where not in self._targets:
                self._targets.append(where)
            self._counts.setdefault(where, Counter()).update(r.counts)
            self._loop_dups[where] += r.duplicates - self._strategy(where).total_duplicates
            self._stop[where] = r.stop_reason
        main = self._main()
        trials = self._trials.get(main, [])
        st = self.state
        spent = len([t for t in trials if t.n]) - st.evals
        st.evals += spent
        st.curve = _curve(trials)
        st.metrics = [t.outcome.metric for t in trials if t.outcome.ok]
        if evals is not None and spent < evals or evals is None:
            st.stopped = self._stop.get(main, "") or "no measurement slot is left"
        return spent

    def _main(self) -> str:
        if self.default_target in self._targets or not self._targets:
            return self.default_target
        return max(sorted(self._targets), key=lambda w: self._counts[w]["measured"])

    def result(self, open_reason: str | None = None) -> SearchResult:
        """The grants joined: every trial in order, the best-so-far curve, the ranked top-k, the counts. A task
        still open when the budget ran out stops with ``open_reason`` (default None: the last grant's reason,
        which after a single grant is the loop's own)."""
        by_target: dict[str, SearchResult] = {}
        for where in self._targets or [self.default_target]:
            trials = self._trials.get(where, [])
            ranked = Ranked(self.keep)
            for t in trials:
                if t.outcome.ok:
                    ranked.insert(t.outcome.metric, t.candidate, t.outcome)
            strat = self.strategies.get(where)
            stop = self._stop.get(where, "no measurement slot is left")
            if open_reason and not (where == self._main() and self.state.stopped):
                stop = open_reason
            by_target[where] = SearchResult(trials, ranked, _curve(trials), stop, len([t for t in trials if t.n]),
                                            self._loop_dups[where] + (strat.total_duplicates if strat else 0),
                                            self._seconds, self._counts.get(where, Counter()))
        res = by_target[self._main()] if self._main() in by_target else next(iter(by_target.values()))
        res.by_target = by_target
        if self._executor is not None:
            self.park()  # (sums its figures into the parked ones')
        if self._made is not None:
            res.executor = dict(self._made)
        return res

    def close(self) -> None:
        """Close the executor made for the grants (the task's backend is the caller's)."""
        if self._executor is not None:
            ex, self._executor = self._executor, None
            ex.close()


def _curve(trials: Sequence[Trial]) -> list[tuple[int, float]]:
    """(evaluation, best so far) at each improvement, as the loop's tally draws it."""
    out: list[tuple[int, float]] = []
    for t in trials:
        if t.outcome.ok and (not out or t.outcome.metric < out[-1][1]):
            out.append((t.n, t.outcome.metric))
    return out
