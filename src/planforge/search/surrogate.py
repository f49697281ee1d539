"""Thompson sampling on a Bayesian linear surrogate with pairwise interactions.

Tuning spaces are mostly explained by what each knob does on its own and by
how pairs of knobs interact (a tile size with a block size, a vector width
with a work-group size). The surrogate models log-time as

    log t = b + sum_i w_i[v_i] + sum_{i<j} w_ij[v_i, v_j] + noise,

one weight per value of each knob and per pair of values of each pair of
knobs (one-hot features, so nothing about the values' order or scale is
assumed), with a Gaussian prior on the weights: Bayesian ridge regression,
solved in closed form with numpy/scipy. Interaction weights get a stronger
prior than main effects, so the model starts additive and lets the data buy
interactions.

After ``n_init`` random points, every proposal is the unproposed candidate
with the lowest predicted log-time under a weight vector drawn from the
posterior (Thompson sampling: exploration in proportion to the model's own
uncertainty). The posterior is refitted when enough new results arrived
(each ``refit`` fraction of what is known, so refits are frequent early and
sparse late); between refits, proposals take the next-best candidates of
the same draw. A failed measurement is modelled as slower than anything
measured, so the model learns to avoid the regions that fail.

Candidates are every valid point of a space small enough to enumerate (up to
``pool`` points), or else a fresh uniform sample of ``pool`` valid points at
each refit plus the neighbours of the incumbent.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import linalg

from ..space import Candidate, Space, SpaceError
from .strategies import STRATEGIES, Result, Strategy


class Thompson(Strategy):
    """Thompson sampling on a Bayesian linear model of log-time.

    Parameters:
        n_init: uniformly random proposals before the model is used (default 16).
        prior: prior precision of a main-effect weight (default 1.0);
            interaction weights get ``prior * interaction_prior`` (default 4).
        interactions: model pairs of knobs (default True).
        refit: refit after this fraction of the known results is new (default
            0.05, and at least one result).
        pool: candidates scored per draw (default 50,000): the whole valid
            space when it is no larger, else a uniform sample of this many.
        fail_penalty: log-time told for a failure, above the slowest measured
            (default 1.0, i.e. e times slower).
        exploration: scales the spread of the posterior draws (default 1.0:
            plain Thompson sampling; 0: always the posterior mean).
        max_features: the largest model (default 1000 weights); a knob with
            many values is binned into fewer levels, down to 4, and past that
            interactions are dropped.
    """

    name = "thompson"

    def __init__(self, space: Space, seed: int = 0, n_init: int = 16, prior: float = 1.0,
                 interaction_prior: float = 4.0, interactions: bool = True, refit: float = 0.05,
                 pool: int = 50_000, fail_penalty: float = 1.0, exploration: float = 1.0,
                 max_features: int = 1000, **kw):
        kw.setdefault("max_duplicates", 1_000_000)  # the model never re-proposes; exhaustion stops it
        super().__init__(space, seed, **kw)
        self.n_init, self.prior, self.interaction_prior = n_init, prior, interaction_prior
        self.interactions, self.refit, self.pool, self.fail_penalty = interactions, refit, pool, fail_penalty
        self.exploration = exploration
        self.np_rng = np.random.default_rng(seed)
        self._radix = [len(k.values) for k in space.knobs]
        self._live = [i for i, r in enumerate(self._radix) if r > 1]
        # A knob with many values is binned (neighbouring values share a level) and, if the model
        # is still too large, interactions are dropped: the posterior needs a dense F x F solve.
        levels = 64
        while True:
            self._levels = [min(r, levels) for r in self._radix]
            f = self._layout(interactions)
            if f <= max_features or levels <= 4:
                break
            levels //= 2
        if f > max_features and interactions:
            self.interactions = interactions = False
            f = self._layout(False)
        if f > max_features:
            raise ValueError(f"thompson: {f} features even without interactions (limit {max_features}); "
                             "the space has too many knobs for this model")
        self.n_features = f
        self._precision = np.full(f, prior * interaction_prior)
        self._precision[: self._n_main] = prior
        self._A = np.zeros((f, f))  # X^T X
        self._rows: list[np.ndarray] = []  # feature columns of each observation
        self._y: list[float | None] = []  # log-time, None for a failure
        self._seen_at_fit = 0
        self._order: list[int] = []  # candidate positions, best first, of the current draw
        self._cursor = 0
        self._enumerable = False
        try:
            if space.size <= 50 * pool:
                valid = space.valid_ints()
                if len(valid) <= pool:
                    self._pool_ints = np.array(valid, dtype=np.int64)
                    self._enumerable = True
        except SpaceError:
            pass
        if self._enumerable:
            self._pool_cols = self._cols_of_ints(self._pool_ints)
        self._proposed_ints: set[int] = set()
        self._observed: set[str] = set()
        self._best_ints: list[int] = []  # the point of each observation, in order
        self.refits = 0

    # -- features --------------------------------------------------------------
    def _layout(self, interactions: bool) -> int:
        """Place the one-hot blocks (per knob, then per pair of knobs); returns the feature count."""
        self._offset: dict[tuple[int, ...], int] = {}
        f = 0
        for i in self._live:
            self._offset[(i,)] = f
            f += self._levels[i]
        self._n_main = f
        if interactions:
            for a, i in enumerate(self._live):
                for j in self._live[a + 1:]:
                    self._offset[(i, j)] = f
                    f += self._levels[i] * self._levels[j]
        return f

    def _digits(self, ints: np.ndarray) -> np.ndarray:
        """Value index of every knob for each mixed-radix integer (rows: points)."""
        out = np.zeros((len(ints), len(self._radix)), dtype=np.int64)
        n = ints.copy()
        for k in range(len(self._radix) - 1, -1, -1):
            n, out[:, k] = np.divmod(n, self._radix[k])
        return out

    def _cols_of_digits(self, d: np.ndarray) -> np.ndarray:
        lv = np.array(self._levels)
        d = d * lv // np.array(self._radix)  # value index -> level (the identity unless binned)
        cols = [self._offset[(i,)] + d[:, i] for i in self._live]
        if self.interactions:
            for a, i in enumerate(self._live):
                for j in self._live[a + 1:]:
                    cols.append(self._offset[(i, j)] + d[:, i] * lv[j] + d[:, j])
        if not cols:
            return np.zeros((len(d), 0), dtype=np.int64)
        return np.stack(cols, axis=1)

    def _cols_of_ints(self, ints: np.ndarray) -> np.ndarray:
        return self._cols_of_digits(self._digits(ints))

    # -- the model -----------------------------------------------------------------
    def _targets(self) -> np.ndarray:
        ok = [y for y in self._y if y is not None]
        worst = max(ok) if ok else 0.0
        y = np.array([worst + self.fail_penalty if v is None else v for v in self._y])
        return y - y.mean()

    def _draw(self) -> np.ndarray:
        """Weights drawn from the posterior (Bayesian ridge, noise variance estimated)."""
        y = self._targets()
        b = np.zeros(self.n_features)
        for cols, v in zip(self._rows, y):
            b[cols] += v
        P = self._A + np.diag(self._precision)
        L = linalg.cholesky(P, lower=True)
        mean = linalg.cho_solve((L, True), b)
        resid = float(y @ y - b @ mean)
        sigma = math.sqrt(max(resid, 1e-6) / max(len(y), 1))
        z = self.np_rng.standard_normal(self.n_features)
        return mean + self.exploration * sigma * linalg.solve_triangular(L.T, z, lower=False)

    def _refresh(self) -> None:
        """Draw new weights and rank the candidates by their predicted log-time."""
        w = self._draw()
        self.refits += 1
        self._seen_at_fit = len(self._y)
        if self._enumerable:
            ints, cols = self._pool_ints, self._pool_cols
        else:
            ints = self._sample_pool(min(self.pool, 4096))
            self._pool_ints, cols = ints, self._cols_of_ints(ints)
        pred = w[cols].sum(axis=1) if cols.shape[1] else np.zeros(len(ints))
        self._order = list(np.argsort(pred, kind="stable"))
        self._cursor = 0

    def _sample_pool(self, m: int) -> np.ndarray:
        """Up to ``m`` distinct valid points drawn uniformly (by rejection), plus the incumbent's neighbours."""
        digits = np.column_stack([self.np_rng.integers(0, r, size=4 * m) for r in self._radix])
        out: list[int] = []
        for row in digits:
            idx = tuple(int(x) for x in row)
            if self.space.is_valid_index(idx):
                out.append(self.space.to_int(idx))
                if len(out) >= m:
                    break
        ok = [(y, i) for i, y in enumerate(self._y) if y is not None]
        if ok:
            best = self._best_ints[min(ok)[1]]
            out.extend(self.space.to_int(c.index) for c in self.space.neighbours(
                self.space.candidate(self.space.from_int(best))))
        if not out:  # restrictions reject nearly everything: fall back to the space's own sampler
            out = [self.space.to_int(self.space.sample(self.rng).index) for _ in range(64)]
        return np.unique(np.array(out, dtype=np.int64))

    def _stale(self) -> bool:
        new = len(self._y) - self._seen_at_fit
        return new >= max(1, math.ceil(self.refit * len(self._y)))

    def _propose(self) -> Candidate | None:
        if len(self._rows) < self.n_init and len(self.proposed) < self.n_init:
            return self.space.sample(self.rng)
        if not self._order or self._stale():
            self._refresh()
        while self._cursor < len(self._order):
            n = int(self._pool_ints[self._order[self._cursor]])
            self._cursor += 1
            if n not in self._proposed_ints:
                return self.space.candidate(self.space.from_int(n))
        if self._enumerable:
            self._stop("space exhausted")
            return None
        return self.space.sample(self.rng)

    def ask(self, n: int = 1) -> list[Candidate]:
        out = self._fill(n, self._propose)
        for c in out:
            self._proposed_ints.add(self.space.to_int(c.index))
        return out

    def _observe(self, c: Candidate, o) -> None:
        if o.status == "rejected" or c.fingerprint in self._observed:
            return
        self._observed.add(c.fingerprint)
        cols = self._cols_of_ints(np.array([self.space.to_int(c.index)], dtype=np.int64))[0]
        self._A[np.ix_(cols, cols)] += 1.0
        self._rows.append(cols)
        self._best_ints.append(self.space.to_int(c.index))
        self._y.append(math.log(o.metric) if o.ok and o.metric > 0 else None)
        self._proposed_ints.add(self.space.to_int(c.index))

    def describe(self) -> dict:
        return {**super().describe(), "n_init": self.n_init, "prior": self.prior,
                "interaction_prior": self.interaction_prior, "interactions": self.interactions,
                "refit": self.refit, "features": self.n_features}


STRATEGIES[Thompson.name] = Thompson
