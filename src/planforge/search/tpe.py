"""Bayesian optimisation with Optuna's TPE sampler (the optional extra ``optuna``).

Optuna proposes a point of the cross product through its ask/tell interface;
this strategy keeps Optuna's model honest about planforge's space:

- an ordered knob (int, pow2) is an integer distribution over its value
  indices, so the Parzen estimator can use the order; any other knob is
  categorical; a knob with one value is left out;
- a proposal that breaks a restriction is told to Optuna as pruned (worse
  than every measured point) and costs no evaluation;
- a proposal whose fingerprint was already proposed is not measured again:
  Optuna is told its known result, as if measured again (pruned for a
  failure; failed, i.e. ignored, while the first measurement is pending);
- in both cases a random unproposed valid neighbour of the proposed point is
  enqueued into the study and proposed instead, so the search stays where
  the model points without asking it again and again (once TPE has
  converged, nearly every proposal repeats a measured point);
- when the point has no such neighbour ``max_misses`` times in a row, a
  random unproposed valid point is enqueued instead;
- a measured failure is told as pruned, a measurement as its metric.

The strategy stops when every valid point has been proposed.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..space import Candidate, Space, SpaceError
from .settings import Setting
from .strategies import Result, Strategy


def import_optuna():
    """Optuna, or an ImportError that says how to install it."""
    try:
        import optuna
    except ImportError:
        raise ImportError("the tpe strategy needs Optuna: pip install 'planforge[optuna]'") from None
    return optuna


class TPE(Strategy):
    """Tree-structured Parzen estimator (Optuna's ``TPESampler``), seeded.

    Parameters:
        n_startup: random trials before TPE models the results (default 10,
            Optuna's default).
        max_misses: consecutive invalid or repeated proposals without an
            unproposed neighbour after which a random valid point is enqueued
            instead (default 2).
        multivariate: model the knobs jointly (default True).
        sampler_options: extra keyword arguments for ``optuna.samplers.TPESampler``.
    """

    name = "tpe"
    settings = (Setting("n_startup", "int", 10, "random trials before TPE models the results", low=0),
                Setting("max_misses", "int", 2, "repeated proposals without a fresh neighbour before a random point",
                        low=1),
                Setting("multivariate", "bool", True, "model the knobs jointly"),
                Setting("sampler_options", "json", None, "extra keyword arguments for optuna's TPESampler"))
    duplicate_limit = 1_000_000  # repeats are handled here, see max_misses

    def __init__(self, space: Space, seed: int = 0, n_startup: int = 10, max_misses: int = 2,
                 multivariate: bool = True, sampler_options: dict[str, Any] | None = None, **kw):
        super().__init__(space, seed, **kw)
        optuna = import_optuna()
        self._optuna = optuna
        if optuna.logging.get_verbosity() <= optuna.logging.INFO:
            optuna.logging.set_verbosity(optuna.logging.WARNING)  # one INFO line per trial is noise here
        self.n_startup, self.max_misses, self.multivariate = n_startup, max_misses, multivariate
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup, multivariate=multivariate,
                                             **(sampler_options or {}))
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        dist = optuna.distributions
        self._dists = {}
        for k in space.knobs:
            if len(k.values) > 1:
                n = len(k.values)
                self._dists[k.name] = (dist.IntDistribution(0, n - 1) if k.ordered
                                       else dist.CategoricalDistribution(list(range(n))))
        self._pending: dict[str, Any] = {}
        self.misses = 0  # consecutive
        self.invalid = 0
        self.replaced = 0
        self.injected = 0
        try:
            self._valid_count: int | None = len(space.valid_ints())
        except SpaceError:
            self._valid_count = None

    def _state(self, name: str):
        return getattr(self._optuna.trial.TrialState, name)

    def _candidate(self, params: dict[str, int]) -> Candidate:
        return self.space.candidate(tuple(params.get(k.name, 0) for k in self.space.knobs))

    def _random_unproposed(self) -> Candidate | None:
        for _ in range(256):
            c = self.space.sample(self.rng)
            if c.fingerprint not in self.proposed:
                return c
        # nearly everything proposed: scan the valid points in a random order
        try:
            order = list(self.space.valid_ints())
        except SpaceError:
            return None
        self.rng.shuffle(order)
        for n in order:
            c = self.space.candidate(self.space.from_int(n))
            if c.fingerprint not in self.proposed:
                return c
        return None

    def _next(self) -> Candidate | None:
        if self._valid_count is not None and len(self.proposed) >= self._valid_count:
            self._stop("space exhausted")
            return None
        if self.misses >= self.max_misses:
            c = self._random_unproposed()
            if c is None:
                self._stop("space exhausted")
                return None
            self._enqueue(c)
            self.injected += 1
            self.misses = 0
            return c
        trial = self.study.ask(self._dists)
        c = self._candidate(trial.params)
        if not self.space.is_valid(c):
            self.study.tell(trial, state=self._state("PRUNED"))
            self.invalid += 1
        elif c.fingerprint in self.proposed:
            known = self.results.get(c.fingerprint)
            if known is not None and known.ok:  # what re-measuring would say: the model weighs it again
                self.study.tell(trial, known.metric)
            else:
                self.study.tell(trial, state=self._state("PRUNED" if known is not None else "FAIL"))
            self.duplicates += 1
            self.total_duplicates += 1
        else:
            self.misses = 0
            self._pending[c.fingerprint] = trial
            return c
        # Where the model points is measured (or invalid): take an unproposed valid neighbour
        # of that point instead, so the search stays where TPE wants it without asking again.
        fresh = [n for n in self.space.neighbours(c) if n.fingerprint not in self.proposed]
        if not fresh:
            self.misses += 1
            return None
        n = self.rng.choice(fresh)
        self._enqueue(n)
        self.replaced += 1
        return n

    def _add(self, c: Candidate, o) -> None:
        """A finished trial for a result this study did not ask for."""
        optuna = self._optuna
        params = {k: c.index[i] for i, k in enumerate(self.space.names) if k in self._dists}
        if o.ok:
            t = optuna.trial.create_trial(params=params, distributions=self._dists, value=o.metric)
        else:
            t = optuna.trial.create_trial(params=params, distributions=self._dists, state=self._state("PRUNED"))
        self.study.add_trial(t)

    def _enqueue(self, c: Candidate) -> None:
        """Propose ``c`` through the study, so that Optuna records its parameters and result."""
        self.study.enqueue_trial({k: c.index[i] for i, k in enumerate(self.space.names) if k in self._dists})
        self._pending[c.fingerprint] = self.study.ask(self._dists)

    def ask(self, n: int = 1) -> list[Candidate]:
        out: list[Candidate] = []
        while len(out) < n and not self.done:
            c = self._next()
            if c is not None:
                self._offer(c, out)
        return out

    def tell(self, results: Sequence[Result]) -> None:
        for c, o in results:
            trial = self._pending.pop(c.fingerprint, None)
            if trial is None:
                if c.fingerprint not in self.results and o.status != "rejected":
                    self._add(c, o)  # proposed by someone else (a warm start's early point): the model learns it
                continue
            if o.ok:
                self.study.tell(trial, o.metric)
            else:
                self.study.tell(trial, state=self._state("PRUNED"))
        super().tell(results)

    def describe(self) -> dict:
        return {**super().describe(), "n_startup": self.n_startup, "max_misses": self.max_misses,
                "multivariate": self.multivariate, "replaced": self.replaced, "injected": self.injected}
