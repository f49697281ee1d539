"""Model-guided evolutionary search (after Ansor and MetaSchedule): evolve on predictions, measure the best.

Each round the strategy (1) retrains its learned ranker on everything
measured so far, (2) evolves a large population on the ranker's predictions
(or, before it has enough data, on the analytic model's, or at random), and
(3) hands out a batch: the best predicted points not yet proposed, with each
slot taken instead by a uniformly random unmeasured point with probability
``epsilon`` (epsilon-greedy, so that a wrong model still sees the space). A
space small enough is scored whole instead of evolved.

The ranker's predictions of every batch are kept before the batch is
measured, so ``describe()`` reports its Spearman, Kendall and top-k recall on
points it had not seen (held-out).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..costmodel.funnel import Analytic
from ..costmodel.learned import HeldOut, LearnedRanker
from ..outcome import Outcome
from ..space import Candidate, Space, SpaceError
from .settings import Setting
from .strategies import Strategy


class ModelGuided(Strategy):
    """Evolutionary search on a learned ranker's predictions, epsilon-greedy.

    Parameters:
        cost_model: the task's analytic model, if any: its features go into the
            ranker and its predictions choose the first batch (default None:
            knob values only, first batch random).
        batch: points per round, measured before the next retraining (default 8).
        population: points evolved per round (default 512); generations:
            rounds of selection, crossover and mutation (default 4).
        epsilon: chance that a slot goes to a random unmeasured point (default 0.1).
        exhaustive_limit: a space with at most this many valid points is
            scored whole each round instead of evolved (default 4096).
        min_fit, rounds, leaves: passed to ``LearnedRanker``.
        initial: candidates proposed first, before any model (default none).
    """

    name = "model"
    takes_initial = True
    settings = (Setting("batch", "int", 8, "points per round, measured before the ranker is retrained", low=1),
                Setting("population", "int", 512, "points evolved per round", low=2),
                Setting("generations", "int", 4, "rounds of selection, crossover and mutation", low=0),
                Setting("epsilon", "float", 0.1, "chance that a slot goes to a random unmeasured point", low=0, high=1),
                Setting("exhaustive_limit", "int", 4096, "valid points up to which the space is scored whole",
                        low=0),
                Setting("min_fit", "int", 8, "measurements before the learned ranker is used", low=1),
                Setting("rounds", "int", 100, "LightGBM boosting rounds of the ranker", low=1),
                Setting("leaves", "int", 15, "LightGBM leaves per tree", low=2))
    duplicate_limit = 1000

    def __init__(self, space: Space, seed: int = 0, cost_model=None, batch: int = 8, population: int = 512,
                 generations: int = 4, epsilon: float = 0.1, exhaustive_limit: int = 4096, min_fit: int = 8,
                 rounds: int = 100, leaves: int = 15, initial: Sequence[Candidate] = (), **kw):
        if batch < 1 or population < 2 or generations < 0 or not 0 <= epsilon <= 1:
            raise ValueError(f"model strategy: need batch >= 1, population >= 2, generations >= 0 and "
                             f"0 <= epsilon <= 1 (got {batch}, {population}, {generations}, {epsilon})")
        super().__init__(space, seed, **kw)
        self.analytic = cost_model if isinstance(cost_model, Analytic) else None
        self.prior = cost_model  # any CostModel predicts: its best predicted points are the first batch
        self.batch, self.population, self.generations, self.epsilon = batch, population, generations, epsilon
        self.ranker = LearnedRanker(space, self.analytic, seed=seed, rounds=rounds, leaves=leaves, min_fit=min_fit)
        self.heldout = HeldOut()
        self.warm = 0
        self._queue: list[Candidate] = list(reversed(initial))
        self._pending: dict[str, float] = {}  # fingerprint -> the ranker's prediction before measuring
        self._measured: list[tuple[Candidate, float]] = []
        self._all: list[Candidate] | None = None
        try:  # a space whose valid points are listed already, or cheap to list
            n = len(space.valid_ints()) if space.size <= 2_000_000 or space._valid is not None else None
        except SpaceError:
            n = None
        if n is not None and n <= exhaustive_limit:
            self._all = [space.candidate(space.from_int(i)) for i in space.valid_ints()]

    # -- history -------------------------------------------------------------
    def warm_start(self, rows) -> int:
        """Add ``(group, config, metric)`` rows from earlier runs (see ``costmodel.learned.history``)."""
        n = self.ranker.add_configs(rows)
        self.warm += n
        return n

    def _observe(self, c: Candidate, o: Outcome) -> None:
        m = o.metric if o.ok else None
        p = self._pending.pop(c.fingerprint, None)
        if p is not None:
            self.heldout.add([p], [m])
        self.ranker.add([c], [m])
        if o.ok:
            self._measured.append((c, m))

    # -- scoring ---------------------------------------------------------------
    def _scores(self, cands: Sequence[Candidate]) -> np.ndarray | None:
        """Lower is better; None when there is nothing to score with yet."""
        if not cands:
            return np.zeros(0)
        if self.ranker.ready:
            return np.array(self.ranker.predict(cands))
        if self.prior is not None:
            return np.array(self.prior.predict(cands), dtype=float)
        return None

    def _fresh(self, c: Candidate | None) -> bool:
        return c is not None and c.fingerprint not in self.proposed

    def _evolve(self) -> list[Candidate]:
        """The population after evolution, best predicted first (all points scored, unproposed only)."""
        rng, space = self.rng, self.space
        if self._all is not None:
            pool = [c for c in self._all if self._fresh(c)]
            scores = self._scores(pool)
            if scores is None:
                return []
            order = np.lexsort((np.arange(len(pool)), scores))
            return [pool[i] for i in order]
        elites = [c for c, _ in sorted(self._measured, key=lambda x: x[1])[:16]]
        pop: dict[str, Candidate] = {}
        for c in elites:
            pop[c.fingerprint] = c
            for _ in range(4):
                m = space.mutate(c, rng, 1 + (rng.random() < 0.3))
                if m is not None:
                    pop.setdefault(m.fingerprint, m)
        tries = 0
        while len(pop) < self.population and tries < 4 * self.population:
            tries += 1
            try:
                c = space.sample(rng)
            except SpaceError:
                break
            pop.setdefault(c.fingerprint, c)
        seen: dict[str, tuple[Candidate, float]] = {}
        cur = list(pop.values())
        for gen in range(self.generations + 1):
            scores = self._scores(cur)
            if scores is None:
                return []
            for c, s in zip(cur, scores):
                seen[c.fingerprint] = (c, float(s))
            if gen == self.generations:
                break
            ranked = sorted(seen.values(), key=lambda x: x[1])
            parents = [c for c, _ in ranked[: max(2, self.population // 4)]]
            children: dict[str, Candidate] = {}
            for _ in range(self.population):
                a, b = rng.sample(parents, 2) if len(parents) >= 2 else (parents[0], parents[0])
                child = space.crossover(a, b, rng)
                if rng.random() < 0.5 or child.fingerprint in seen:
                    child = space.mutate(child, rng, 1) or child
                if child.fingerprint not in seen:
                    children[child.fingerprint] = child
            cur = list(children.values())
            if not cur:
                break
        best = sorted(seen.values(), key=lambda x: x[1])
        return [c for c, _ in best if self._fresh(c)]

    def _random_fresh(self) -> Candidate | None:
        if self._all is not None:
            fresh = [c for c in self._all if self._fresh(c)]
            return self.rng.choice(fresh) if fresh else None
        for _ in range(256):
            try:
                c = self.space.sample(self.rng)
            except SpaceError:
                return None
            if self._fresh(c):
                return c
        return None

    def _plan(self) -> None:
        self.ranker.fit()
        ranked = self._evolve()
        out: list[Candidate] = []
        taken: set[str] = set()
        it = iter(ranked)
        while len(out) < self.batch:
            pick = None
            if not ranked or self.rng.random() < self.epsilon:
                pick = self._random_fresh()
            if pick is None or pick.fingerprint in taken:
                pick = next((c for c in it if c.fingerprint not in taken), None)
            if pick is None:
                pick = self._random_fresh()
                if pick is None or pick.fingerprint in taken:
                    break
            taken.add(pick.fingerprint)
            out.append(pick)
        if self.ranker.ready and out:
            for c, p in zip(out, self.ranker.predict(out)):
                self._pending[c.fingerprint] = p
        self._queue = list(reversed(out))

    def ask(self, n: int = 1) -> list[Candidate]:
        out: list[Candidate] = []
        while len(out) < n and not self.done:
            if not self._queue:
                self._plan()
                if not self._queue:
                    self._stop("space exhausted")
                    break
            self._offer(self._queue.pop(), out)
        return out

    def describe(self) -> dict:
        d = {**super().describe(), "batch": self.batch, "population": self.population,
             "generations": self.generations, "epsilon": self.epsilon,
             "model": {"name": self.ranker.name, "fits": self.ranker.fits, "warm_start": self.warm,
                       "features": "knobs + analytic" if self.analytic is not None else "knobs",
                       "heldout": self.heldout.report()}}
        return d

