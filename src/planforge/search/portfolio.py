"""A multi-armed-bandit portfolio of strategies with area-under-curve credit.

The portfolio holds several strategies (arms: genetic, annealing and hill
climbing by default) over the same space and, for every proposal, asks the
arm with the best bandit score. Credit follows OpenTuner's AUC bandit
(after Fialho et al., "Comparison-based adaptive strategy selection with
bandits in differential evolution"): each use of an arm in a sliding window
of the last ``window`` uses is 1 if it produced a new global best, else 0;
an arm's exploitation term is the area under the curve of its own uses,

    AUC(arm) = sum_i i * hit_i / (n (n + 1) / 2),   i = 1..n over its uses, oldest first,

so recent successes weigh more, and its exploration term is
sqrt(2 log2(uses in window) / uses of the arm). The score is AUC + C * exploration;
an arm never used scores infinity.

Every arm is told every result, whichever arm proposed it, so the genetic
arm breeds from what the local searches found and the hill climber moves to
the incumbent. A proposal another arm already made is not measured again:
the arm gets no credit for it and is told the known outcome.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any, Hashable, Mapping, Sequence

from ..space import Candidate, Space
from .evolution import ModelGuided
from .mcts import MCTS
from .settings import Setting, SettingError, check_options
from .strategies import Annealing, Exhaustive, Genetic, HillClimb, RandomSearch, Result, Strategy
from .surrogate import Thompson
from .tpe import TPE

# The strategies a portfolio can run as arms: every strategy but the portfolio itself and proxy-topk (which
# needs a cost model and measures a fixed list). Listed here rather than taken from the registry, which lists
# the portfolio: the registry imports this module, never the other way round.
ARMS: dict[str, type[Strategy]] = {
    s.name: s for s in (Exhaustive, RandomSearch, Genetic, Annealing, HillClimb, ModelGuided, MCTS, Thompson, TPE)
}

DEFAULT_ARMS = ("genetic", "annealing", "hillclimb")


class AUCBandit:
    """OpenTuner's AUC bandit over ``keys``.

    Parameters:
        c: weight of the exploration term (default 0.05, OpenTuner's).
        window: how many recent uses are remembered (default 500, OpenTuner's).
    """

    def __init__(self, keys: Sequence[Hashable], c: float = 0.05, window: int = 500):
        if window < 1:
            raise ValueError(f"bandit window must be at least 1, got {window}")
        self.keys = list(keys)
        self.c, self.window = c, window
        self.history: deque[tuple[Hashable, bool]] = deque()
        self.uses = {k: 0 for k in self.keys}
        self._auc_sum = {k: 0 for k in self.keys}  # sum of positions of this key's hits, positions 1..uses
        self._hits = {k: 0 for k in self.keys}

    def exploitation(self, key: Hashable) -> float:
        """Area under the hit curve of ``key``'s uses in the window, in [0, 1]."""
        n = self.uses[key]
        return self._auc_sum[key] * 2.0 / (n * (n + 1.0)) if n else 0.0

    def exploration(self, key: Hashable) -> float:
        n = self.uses[key]
        if not n:
            return math.inf
        return math.sqrt(2.0 * math.log2(len(self.history)) / n)

    def score(self, key: Hashable) -> float:
        return self.exploitation(key) + self.c * self.exploration(key)

    def order(self, rng) -> list[Hashable]:
        """Keys from best to worst score; ties in random order."""
        keys = list(self.keys)
        rng.shuffle(keys)
        return sorted(keys, key=self.score, reverse=True)  # stable: shuffled order breaks ties

    def credit(self, key: Hashable, hit: bool) -> None:
        """Record one use of ``key``: ``hit`` when it produced a new global best."""
        self.history.append((key, hit))
        self.uses[key] += 1
        if hit:
            self._auc_sum[key] += self.uses[key]
            self._hits[key] += 1
        if len(self.history) > self.window:
            old, old_hit = self.history.popleft()
            # every remaining use of `old` moves one position down
            self._auc_sum[old] -= self._hits[old]
            self.uses[old] -= 1
            if old_hit:
                self._hits[old] -= 1


class Portfolio(Strategy):
    """A bandit over strategies.

    Parameters:
        arms: strategy names (default genetic, annealing, hillclimb).
        c, window: the AUC bandit's settings (defaults 0.05 and 500).
        arm_options: per arm name, settings passed to that strategy.
        catalog: strategy classes by name to take the arms from (default
            ``ARMS``; ``make_strategy`` passes the registry's, so a strategy
            registered there can be an arm). The portfolio itself and
            proxy-topk are never arms.
    """

    name = "bandit"
    settings = (Setting("arms", "str", "+".join(DEFAULT_ARMS), "strategies to run as arms, joined by +"),
                Setting("c", "float", 0.05, "weight of the bandit's exploration term", low=0),
                Setting("window", "int", 500, "recent uses the bandit remembers", low=1),
                Setting("arm_options", "json", None, "per arm name, a mapping of that arm's settings"))

    def __init__(self, space: Space, seed: int = 0, arms: Sequence[str] | str = DEFAULT_ARMS, c: float = 0.05,
                 window: int = 500, arm_options: dict[str, dict[str, Any]] | None = None,
                 catalog: Mapping[str, type[Strategy]] | None = None, **kw):
        super().__init__(space, seed, **kw)
        if isinstance(arms, str):
            arms = [a for a in arms.split("+") if a]
        if not arms:
            raise ValueError("a bandit portfolio needs at least one arm")
        catalog = ARMS if catalog is None else catalog
        unknown = [a for a in arms if a not in catalog or a in (self.name, "proxy-topk")]
        if unknown:
            raise ValueError(f"bandit arms must be search strategies; unknown or unusable: {', '.join(unknown)}")
        if len(set(arms)) != len(arms):
            raise ValueError(f"bandit arms repeat: {list(arms)}")
        arm_options = arm_options or {}
        stray = [a for a in arm_options if a not in arms]
        if stray:
            raise SettingError(f"bandit: arm_options for {', '.join(map(repr, stray))}, which "
                               f"{'is' if len(stray) == 1 else 'are'} not an arm (arms: {', '.join(arms)})")
        self.arms: dict[str, Strategy] = {}
        for a in arms:
            cls = catalog[a]
            opts = check_options(a, cls.all_settings(), dict(arm_options.get(a, {})))
            self.arms[a] = cls(space, self.rng.randrange(2**31), **opts)
        self.bandit = AUCBandit(list(self.arms), c, window)
        self.owner: dict[str, str] = {}
        self.best = math.inf
        self.uses = {a: 0 for a in self.arms}

    def _propose(self) -> Candidate | None:
        for a in self.bandit.order(self.rng):
            arm = self.arms[a]
            if arm.done:
                continue
            got = arm.ask(1)
            if not got:
                continue
            c = got[0]
            self.uses[a] += 1
            if c.fingerprint in self.proposed:
                self.bandit.credit(a, False)  # OpenTuner: no new result, no credit
                known = self.results.get(c.fingerprint)
                if known is not None:
                    arm.tell([(c, known)])
                return c  # _offer counts it as a duplicate
            self.owner[c.fingerprint] = a
            return c
        self._stop("every arm has stopped: " + "; ".join(f"{a}: {s.stop_reason}" for a, s in self.arms.items()))
        return None

    def ask(self, n: int = 1) -> list[Candidate]:
        return self._fill(n, self._propose)

    def tell(self, results: Sequence[Result]) -> None:
        for c, o in results:
            a = self.owner.pop(c.fingerprint, None)
            hit = o.ok and o.metric < self.best
            if o.ok:
                self.best = min(self.best, o.metric)
            if a is not None:
                self.bandit.credit(a, hit)
        super().tell(results)
        for arm in self.arms.values():
            arm.tell(results)

    def warm_start(self, rows) -> int:
        """Every arm takes the rows (those with a model use them); returns the most any arm took."""
        rows = rows if isinstance(rows, list) else list(rows)
        return max((arm.warm_start(rows) for arm in self.arms.values()), default=0)

    def take_prior(self, rows) -> int:
        """Every arm with a surrogate takes the prior; returns the most any arm took."""
        rows = rows if isinstance(rows, list) else list(rows)  # (a WarmStart's rows keep their points)
        return max((arm.take_prior(rows) for arm in self.arms.values()), default=0)

    def describe(self) -> dict:
        return {**super().describe(), "arms": list(self.arms), "c": self.bandit.c, "window": self.bandit.window,
                "uses": dict(self.uses)}
