"""Search strategies: pull-style ``ask(n)`` / ``tell(results)``, each seeded.

Every strategy owns a ``random.Random(seed)``, remembers the fingerprint of
everything it proposed, and never proposes a fingerprint twice as new work.
``ask`` returns up to ``n`` new candidates; an empty list with ``done`` set
means the strategy has nothing more to offer (``stop_reason`` says why).
Strategies know nothing about kernels or backends: they see a ``Space`` and
the ``Outcome`` of what they asked for.
"""
from __future__ import annotations

import math
import random
from typing import Callable, Iterator, Sequence

from ..outcome import Outcome
from ..space import Candidate, Space
from .ranked import Ranked
from .settings import Setting

Result = tuple[Candidate, Outcome]


class Strategy:
    """Shared bookkeeping: seeded RNG, proposed fingerprints, duplicate counting.

    Parameters:
        space: the plan space to search.
        seed: seeds the strategy's own RNG (default 0).
        max_duplicates: stop after this many consecutive proposals of
            already-proposed candidates (default ``duplicate_limit``: 50,
            more for a strategy that never proposes a duplicate itself).
    """

    name = "strategy"
    # what the strategy can be told (``search.settings``); ``all_settings()`` adds max_duplicates
    settings: tuple[Setting, ...] = ()
    duplicate_limit = 50
    # whether the strategy takes seed candidates to propose first (``initial=``, e.g. a graph's extracted plans);
    # ``make_strategy`` leaves them out for one that does not
    takes_initial = False
    # whether it also takes seeds to propose after a first phase of its own (``later=``); ``make_strategy`` adds
    # them to ``initial`` for one that does not
    takes_later = False

    def __init__(self, space: Space, seed: int = 0, max_duplicates: int | None = None):
        self.space = space
        self.seed = seed
        self.rng = random.Random(seed)
        self.max_duplicates = self.duplicate_limit if max_duplicates is None else max_duplicates
        self.proposed: set[str] = set()
        self.results: dict[str, Outcome] = {}
        self.duplicates = 0  # consecutive
        self.total_duplicates = 0
        self.done = False
        self.stop_reason = ""

    @classmethod
    def all_settings(cls) -> tuple[Setting, ...]:
        """The strategy's declared settings and the one every strategy has."""
        return (*cls.settings, Setting("max_duplicates", "int", cls.duplicate_limit,
                                       "stop after this many consecutive proposals of already-proposed points",
                                       low=1))

    # -- helpers for subclasses -------------------------------------------
    def _stop(self, reason: str) -> None:
        if not self.done:
            self.done, self.stop_reason = True, reason

    def _offer(self, c: Candidate | None, out: list[Candidate]) -> bool:
        """Add ``c`` to ``out`` if it is new; count a duplicate otherwise."""
        if c is None:
            return False
        if c.fingerprint in self.proposed:
            self.duplicates += 1
            self.total_duplicates += 1
            if self.duplicates >= self.max_duplicates:
                self._stop(f"{self.duplicates} consecutive proposals of already-measured candidates")
            return False
        self.duplicates = 0
        self.proposed.add(c.fingerprint)
        out.append(c)
        return True

    def _fill(self, n: int, propose: Callable[[], Candidate | None]) -> list[Candidate]:
        out: list[Candidate] = []
        while len(out) < n and not self.done:
            self._offer(propose(), out)
        return out

    # -- the protocol --------------------------------------------------------
    def ask(self, n: int = 1) -> list[Candidate]:
        raise NotImplementedError

    def tell(self, results: Sequence[Result]) -> None:
        for c, o in results:
            self.proposed.add(c.fingerprint)
            self.results[c.fingerprint] = o
            self._observe(c, o)

    def _observe(self, c: Candidate, o: Outcome) -> None:
        pass

    def warm_start(self, rows) -> int:
        """Take ``(group, config, metric)`` rows of earlier runs on this device
        (``costmodel.learned.history``); returns how many were taken. Only a
        strategy with a learned model has a use for them: the others take none."""
        return 0

    def take_prior(self, rows) -> int:
        """Take ``(group, config, metric)`` rows of other devices' or shapes' tunings (a warm start,
        ``search.warm.WarmStart.rows``) as a prior for a surrogate model; returns how many were taken.
        Apart from ``warm_start`` because a prior steers every proposal, where a ranker's history only
        adds ranked groups: this device's own earlier runs go to ``warm_start`` alone."""
        return 0

    def describe(self) -> dict:
        return {"name": self.name, "seed": self.seed}


class Exhaustive(Strategy):
    """Every valid point, in enumeration order."""

    name = "exhaustive"

    def __init__(self, space: Space, seed: int = 0, **kw):
        super().__init__(space, seed, **kw)
        self._it: Iterator[Candidate] = space.enumerate()

    def ask(self, n: int = 1) -> list[Candidate]:
        out: list[Candidate] = []
        while len(out) < n and not self.done:
            c = next(self._it, None)
            if c is None:
                self._stop("space exhausted")
            else:
                self._offer(c, out)
        return out


class RandomSearch(Strategy):
    """Uniform sampling among valid points, without replacement.

    Spaces small enough to enumerate (``enumerate_limit``, default 2e6 points
    in the cross product) are shuffled once, which is exact and never repeats;
    larger ones are sampled by rejection with the fingerprints remembered."""

    name = "random"
    settings = (Setting("enumerate_limit", "int", 2_000_000,
                        "cross-product size up to which the valid points are shuffled once (exact)", low=0),)
    duplicate_limit = 10_000

    def __init__(self, space: Space, seed: int = 0, enumerate_limit: int = 2_000_000, **kw):
        super().__init__(space, seed, **kw)
        self._order: list[int] | None = None
        if space.size <= enumerate_limit:
            self._order = list(space.valid_ints())
            self.rng.shuffle(self._order)
            self._order.reverse()  # pop() from the end

    def ask(self, n: int = 1) -> list[Candidate]:
        if self._order is None:
            return self._fill(n, lambda: self.space.sample(self.rng))
        out: list[Candidate] = []
        while len(out) < n and not self.done:
            if not self._order:
                self._stop("space exhausted")
                break
            self._offer(self.space.candidate(self.space.from_int(self._order.pop())), out)
        return out


def _not_gene(k) -> bool:
    """A knob that sets a kernel's schedule, not a graph's choice of implementation (``kind`` ``gene``)."""
    return k.kind != "gene"


class Genetic(Strategy):
    """Steady-state genetic search with elitist parents.

    The first ``population`` proposals are random. After that each child is a
    uniform crossover of two parents drawn from the ``parents`` best measured
    candidates, then mutated in one gene with probability ``mutation`` (and
    always when the crossover alone gives an already-measured candidate).
    Duplicates are detected by fingerprint and never proposed; after
    ``max_duplicates`` consecutive duplicates the search stops on its own.
    Stagnation: while fewer than two distinct parents exist (everything failed,
    or a single valid point), random immigrants are proposed instead.

    Seeded (``initial``: e.g. a graph's extracted plans, proposed first), the
    rest of the first ``population`` are the best measured candidate so far
    mutated in one knob that matters to it (one of its kernels' settings
    while new ones remain, then any of its choices), not random points: a
    uniform point of a graph's genome picks every e-class's implementation at
    random and is rarely a good plan, where the seeds already compare the
    extracted ones. ``later`` seeds (the ones a small budget leaves out of
    the first proposals) come after that phase, before any crossover.

    Parameters: population (default 8), parents (default 4), mutation
    (default 0.3), max_duplicates (default 50).
    """

    name = "genetic"
    takes_initial = True
    takes_later = True
    settings = (Setting("population", "int", 8,
                        "proposals before breeding starts (random; one-knob steps from the best seed when seeded)",
                        low=1),
                Setting("parents", "int", 4, "best measured candidates kept as parents", low=2),
                Setting("mutation", "float", 0.3, "chance that a child is mutated in one gene", low=0, high=1))

    def __init__(self, space: Space, seed: int = 0, population: int = 8, parents: int = 4,
                 mutation: float = 0.3, initial: Sequence[Candidate] = (), later: Sequence[Candidate] = (), **kw):
        super().__init__(space, seed, **kw)
        self.population, self.mutation = population, mutation
        self.parents = Ranked(parents)
        self._initial = 0
        self._seeds = list(reversed(initial))  # proposed first (e.g. the extracted plans)
        self._later = list(reversed(later))  # proposed once the first phase is over
        self._seeded = bool(initial)

    def _observe(self, c: Candidate, o: Outcome) -> None:
        if o.ok:
            self.parents.insert(o.metric, c, o)

    def _child(self) -> Candidate | None:
        if self._seeds:
            self._initial += 1
            return self._seeds.pop()
        if self._initial < self.population:
            self._initial += 1
            best = self.parents.best
            if self._seeded and best is not None:
                # a step from the best seed so far, not one taken before: its kernels' settings first (a knob
                # that is not a graph gene), then any of its choices
                for which in (_not_gene, None):
                    for _ in range(8):
                        c = self.space.mutate(best.candidate, self.rng, 1, which=which)
                        if c is not None and c.fingerprint not in self.proposed:
                            return c
            return self.space.sample(self.rng)
        if self._later:
            return self._later.pop()
        if len(self.parents) < 2:
            return self.space.sample(self.rng)
        a, b = self.rng.sample([e.candidate for e in self.parents], 2)
        child = self.space.crossover(a, b, self.rng)
        if self.rng.random() < self.mutation or child.fingerprint in self.proposed:
            child = self.space.mutate(child, self.rng, 1) or child
        return child

    def ask(self, n: int = 1) -> list[Candidate]:
        return self._fill(n, self._child)

    def describe(self) -> dict:
        return {**super().describe(), "population": self.population, "parents": self.parents.k, "mutation": self.mutation}


def with_jumps(space: Space, c: Candidate, rng: random.Random, jumps: int) -> list[Candidate]:
    """``space.neighbours(c)`` (one step along an ordered knob) and ``jumps`` one-knob moves to any other value
    of a random knob (``space.mutate``): a knob whose values are methods numbered 0, 1, 2, ... is ordered only by
    its numbering, and a single step cannot cross a slow value between two fast ones."""
    out = space.neighbours(c)
    seen = {x.fingerprint for x in out} | {c.fingerprint}
    for _ in range(jumps):
        j = space.mutate(c, rng, 1)
        if j is not None and j.fingerprint not in seen:
            seen.add(j.fingerprint)
            out.append(j)
    return out


JUMPS = Setting("jumps", "int", 0, "one-knob moves to any value of a random knob, beside the one-step neighbours",
                low=0)


class Annealing(Strategy):
    """Simulated annealing on log-latency over random neighbours.

    A neighbour of the current point is accepted when faster, or with
    probability ``exp(-(log t_new - log t_cur) / T)``; ``T`` starts at
    ``t0`` (default 0.5, i.e. a 1.65x slower move is accepted with prob 1/e)
    and is multiplied by ``cooling`` (default 0.95) after each measurement.
    A point whose neighbours are all measured restarts the walk at a random
    unmeasured point."""

    name = "annealing"
    settings = (Setting("t0", "float", 0.5, "starting temperature on log-latency", low=1e-9),
                Setting("cooling", "float", 0.95, "temperature factor after each measurement", low=1e-9, high=1),
                JUMPS)

    def __init__(self, space: Space, seed: int = 0, t0: float = 0.5, cooling: float = 0.95, jumps: int = 0, **kw):
        super().__init__(space, seed, **kw)
        self.t0, self.cooling, self.jumps = t0, cooling, jumps
        self.temp = t0
        self.current: tuple[Candidate, float] | None = None

    def _observe(self, c: Candidate, o: Outcome) -> None:
        self.temp *= self.cooling
        if not o.ok:
            return
        if self.current is None:
            self.current = (c, o.metric)
            return
        delta = math.log(o.metric) - math.log(self.current[1]) if o.metric > 0 and self.current[1] > 0 else 0.0
        if delta <= 0 or self.rng.random() < math.exp(-delta / max(self.temp, 1e-9)):
            self.current = (c, o.metric)

    def _propose(self) -> Candidate | None:
        if self.current is None:
            return self.space.sample(self.rng)
        fresh = [c for c in with_jumps(self.space, self.current[0], self.rng, self.jumps)
                 if c.fingerprint not in self.proposed]
        if not fresh:
            self.current = None  # local area exhausted: restart
            return self.space.sample(self.rng)
        return self.rng.choice(fresh)

    def ask(self, n: int = 1) -> list[Candidate]:
        return self._fill(n, self._propose)

    def describe(self) -> dict:
        return {**super().describe(), "t0": self.t0, "cooling": self.cooling}


class HillClimb(Strategy):
    """First-improvement hill climbing with random restarts.

    Measures the unmeasured neighbours of the current point in random order and
    moves as soon as one is faster; at a local optimum (every neighbour
    measured, none faster) it restarts from a random unmeasured point."""

    name = "hillclimb"
    settings = (JUMPS,)

    def __init__(self, space: Space, seed: int = 0, jumps: int = 0, **kw):
        super().__init__(space, seed, **kw)
        self.jumps = jumps
        self.current: tuple[Candidate, float] | None = None
        self._queue: list[Candidate] = []
        self.restarts = 0

    def _observe(self, c: Candidate, o: Outcome) -> None:
        if o.ok and (self.current is None or o.metric < self.current[1]):
            self.current = (c, o.metric)
            self._queue = []

    def _propose(self) -> Candidate | None:
        if self.current is not None and not self._queue:
            self._queue = [c for c in with_jumps(self.space, self.current[0], self.rng, self.jumps)
                           if c.fingerprint not in self.proposed]
            self.rng.shuffle(self._queue)
            if not self._queue:  # local optimum
                self.current = None
                self.restarts += 1
        if self._queue:
            return self._queue.pop()
        return self.space.sample(self.rng)

    def ask(self, n: int = 1) -> list[Candidate]:
        return self._fill(n, self._propose)


class ProxyTopK(Strategy):
    """Measure only the cost model's ``k`` best predictions (ties in enumeration order).

    The drill shows how this fails with a small ``k``: a proxy that cannot see
    a validity rule fills its top-k with plans that validation rejects."""

    name = "proxy-topk"
    settings = (Setting("k", "int", 3, "how many of the cost model's best predictions to measure (auto: the budget)",
                        low=1),)

    def __init__(self, space: Space, seed: int = 0, cost_model=None, k: int = 3, **kw):
        if cost_model is None:
            raise ValueError("proxy-topk needs a cost model; this workload has none")
        super().__init__(space, seed, **kw)
        self.k = k
        cands = list(space.enumerate())
        scores = cost_model.predict(cands)
        order = sorted(range(len(cands)), key=lambda i: scores[i])  # stable: ties keep enumeration order
        self._queue = [cands[i] for i in order[:k]]
        self._queue.reverse()

    def ask(self, n: int = 1) -> list[Candidate]:
        out: list[Candidate] = []
        while len(out) < n and not self.done:
            if not self._queue:
                self._stop(f"measured the cost model's top {self.k}")
                break
            self._offer(self._queue.pop(), out)
        return out

    def describe(self) -> dict:
        return {**super().describe(), "k": self.k}
