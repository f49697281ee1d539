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

One-hot weights learn nothing about a value until it is measured. Knobs with
numeric values therefore also get a few dense features shared by all values:
log2 of the value, its power-of-two alignment (trailing zero bits: a block of
128 is aligned where one of 112 is not, which is what warps, vector lanes and
cache lines care about), their squares and pairwise products, each scaled to
[-0.5, 0.5]. They let a trend seen on a few values carry to the others.

After ``n_init`` random points, every proposal is the unproposed candidate
with the lowest predicted log-time under a weight vector drawn from the
posterior (Thompson sampling: exploration in proportion to the model's own
uncertainty). Even a model fitted on a whole recorded space ranks its optimum
tens of places down (the last few percent come from effects no low-order
model holds), so most proposals are local: only candidates within
``radius`` changed knobs of the ``top`` best measured points compete, and
one proposal in ``global_every`` is taken from the whole pool (a trust
region, in the manner of TuRBO). The posterior is refitted when enough new
results arrived (each ``refit`` fraction of what is known, so refits are
frequent early and sparse late). A failed measurement is modelled as slower
than anything measured, so the model learns to avoid the regions that fail.

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
from .settings import Setting
from .strategies import Result, Strategy
from .warm import Rows, kendall_weight, points_of, value_index


class Thompson(Strategy):
    """Thompson sampling on a Bayesian linear model of log-time.

    Parameters:
        n_init: uniformly random proposals before the model is used (default 10).
        prior: prior precision of a main-effect weight (default 1.0);
            interaction weights get ``prior * interaction_prior`` (default 4).
        interactions: model pairs of knobs (default True).
        value_features: dense features of numeric knob values (default True).
        value_prior: prior precision of a dense value feature (default 0.1;
            their squares and products get 3x).
        refit: refit after this fraction of the known results is new (default
            0.05, and at least one result).
        pool: candidates scored per draw (default 50,000): the whole valid
            space when it is no larger, else a uniform sample of this many.
        top, radius: the trust region: candidates at most ``radius`` knobs
            away from one of the ``top`` best measured points (defaults 3 and 2).
        global_every: one proposal in this many is taken from the whole pool,
            the others from the trust region (default 3; 1: always global).
        fail_penalty: log-time told for a failure, above the slowest measured
            (default 1.0, i.e. e times slower).
        exploration: scales the spread of the posterior draws (default 1.0:
            plain Thompson sampling; 0: always the posterior mean).
        max_features: the largest model (default 1000 weights); a knob with
            many values is binned into fewer levels, down to 4, and past that
            interactions are dropped.
    """

    name = "thompson"
    settings = (
        Setting("n_init", "int", 10, "uniformly random proposals before the model is used", low=0),
        Setting("prior", "float", 1.0, "prior precision of a main-effect weight", low=1e-12),
        Setting("interaction_prior", "float", 4.0, "interaction weights get prior times this", low=1e-12),
        Setting("interactions", "bool", True, "model pairs of knobs"),
        Setting("value_features", "bool", True, "dense features of numeric knob values (log2, alignment)"),
        Setting("value_prior", "float", 0.1, "prior precision of a dense value feature", low=1e-12),
        Setting("refit", "float", 0.05, "refit once this fraction of the known results is new", low=0, high=1),
        Setting("pool", "int", 50_000, "candidates scored per draw", low=1),
        Setting("top", "int", 3, "trust region: around this many best measured points", low=1),
        Setting("radius", "int", 2, "trust region: at most this many knobs changed", low=1),
        Setting("global_every", "int", 3, "one proposal in this many from the whole pool", low=1),
        Setting("fail_penalty", "float", 1.0, "log-time told for a failure, above the slowest measured", low=0),
        Setting("exploration", "float", 1.0, "spread of the posterior draws (0: the posterior mean)", low=0),
        Setting("max_features", "int", 1000, "the largest model (weights); more values are binned", low=1),
        Setting("warm_weight", "float", 0.05, "warm start: weight of each source row in the prior at first", low=0),
        Setting("warm_halflife", "float", 30.0, "warm start: target measurements after which that weight halves",
                low=1e-9),
        Setting("warm_init", "int", 0, "warm start: random proposals of its own beside the early ones", low=0),
        Setting("stall", "int", 0, "after this many results without a new best, diversify (0: never)", low=0),
        Setting("stall_explore", "float", 3.0, "while stalled: the posterior draws' spread times this", low=0),
    )
    duplicate_limit = 1_000_000  # the model never re-proposes; exhaustion stops it

    def __init__(self, space: Space, seed: int = 0, n_init: int = 10, prior: float = 1.0,
                 interaction_prior: float = 4.0, interactions: bool = True, value_features: bool = True,
                 value_prior: float = 0.1, refit: float = 0.05, pool: int = 50_000, top: int = 3, radius: int = 2,
                 global_every: int = 3, fail_penalty: float = 1.0, exploration: float = 1.0,
                 max_features: int = 1000, warm_weight: float = 0.05, warm_halflife: float = 30.0,
                 warm_init: int = 0, stall: int = 0, stall_explore: float = 3.0, **kw):
        super().__init__(space, seed, **kw)
        if global_every < 1 or top < 1 or radius < 1:
            raise ValueError(f"thompson: global_every, top and radius must be at least 1 "
                             f"(got {global_every}, {top}, {radius})")
        self.n_init, self.prior, self.interaction_prior = n_init, prior, interaction_prior
        self.interactions, self.refit, self.pool, self.fail_penalty = interactions, refit, pool, fail_penalty
        self.exploration, self.top, self.radius, self.global_every = exploration, top, radius, global_every
        self.warm_weight, self.warm_halflife, self.warm_init = warm_weight, warm_halflife, warm_init
        self.stall, self.stall_explore = stall, stall_explore
        self._best_y = math.inf  # the best log-time observed (every arm's results), and results since it improved
        self._since_best = 0
        self._random = 0  # random proposals made
        self._warm: list[dict] = []  # per warm-start source: its X^T X, X^T y, y^T y, rows, log-times by point
        self.np_rng = np.random.default_rng(seed)
        self._radix = [len(k.values) for k in space.knobs]
        self._live = [i for i, r in enumerate(self._radix) if r > 1]
        self._value_tables = self._value_layout() if value_features else []
        n_dense = len(self._value_tables)
        n_dense = 2 * n_dense + n_dense * (n_dense - 1) // 2
        # A knob with many values is binned (neighbouring values share a level) and, if the model
        # is still too large, interactions are dropped: the posterior needs a dense F x F solve.
        levels = 64
        while True:
            self._levels = [min(r, levels) for r in self._radix]
            f = self._layout(interactions) + n_dense
            if f <= max_features or levels <= 4:
                break
            levels //= 2
        if f > max_features and interactions:
            self.interactions = interactions = False
            f = self._layout(False) + n_dense
        if f > max_features:
            raise ValueError(f"thompson: {f} features even without interactions (limit {max_features}); "
                             "the space has too many knobs for this model")
        self.n_features = f
        self._dense = np.arange(f - n_dense, f)  # positions of the dense features
        self._precision = np.full(f, prior * interaction_prior)
        self._precision[: self._n_main] = prior
        k = len(self._value_tables)
        self._precision[f - n_dense: f - n_dense + k] = value_prior
        self._precision[f - n_dense + k:] = 3 * value_prior
        self._A = np.zeros((f, f))  # X^T X
        self._rows: list[tuple[np.ndarray, np.ndarray]] = []  # one-hot columns and dense values of each observation
        self._y: list[float | None] = []  # log-time, None for a failure
        self._seen_at_fit = 0
        self._pred: np.ndarray | None = None  # predicted log-time of each pool point under the current draw
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
            self._set_pool(self._pool_ints)
        self._proposed_ints: set[int] = set()
        self._observed: set[str] = set()
        self._obs_ints: list[int] = []  # the point of each observation, in order
        self._model_steps = 0
        self.refits = 0

    # -- features --------------------------------------------------------------
    def _layout(self, interactions: bool) -> int:
        """Place the one-hot blocks (per knob, then per pair of knobs); returns their feature count."""
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

    def _value_layout(self) -> list[tuple[int, np.ndarray]]:
        """(knob, value index -> feature) for each dense value feature: log2 of the
        value (the value itself if not all positive) and, for positive integers,
        the trailing zero bits, each scaled to [-0.5, 0.5]; only knobs with more
        than two numeric values (two values are one-hot already)."""
        out = []
        for i in self._live:
            vals = self.space.knobs[i].values
            if len(vals) <= 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
                continue
            v = np.array(vals, dtype=float)
            feats = [np.log2(v) if (v > 0).all() else v]
            if (v > 0).all() and (v == np.round(v)).all():
                align = np.array([float((int(x) & -int(x)).bit_length() - 1) for x in v])
                if len(set(align)) > 2 and not np.allclose(align, feats[0]):  # for powers of two it is log2 again
                    feats.append(align)
            for t in feats:
                out.append((i, (t - t.min()) / (t.max() - t.min()) - 0.5))
        return out

    def _digits(self, ints: np.ndarray) -> np.ndarray:
        """Value index of every knob for each mixed-radix integer (rows: points)."""
        out = np.zeros((len(ints), len(self._radix)), dtype=np.int64)
        n = ints.copy()
        for k in range(len(self._radix) - 1, -1, -1):
            n, out[:, k] = np.divmod(n, self._radix[k])
        return out

    def _features(self, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One-hot column of every block and the dense features, for points given as digits."""
        lv = np.array(self._levels)
        b = d * lv // np.array(self._radix)  # value index -> level (the identity unless binned)
        cols = [self._offset[(i,)] + b[:, i] for i in self._live]
        if self.interactions:
            for a, i in enumerate(self._live):
                for j in self._live[a + 1:]:
                    cols.append(self._offset[(i, j)] + b[:, i] * lv[j] + b[:, j])
        cols_a = np.stack(cols, axis=1) if cols else np.zeros((len(d), 0), dtype=np.int64)
        z = [t[d[:, i]] for i, t in self._value_tables]
        if not z:
            return cols_a, np.zeros((len(d), 0))
        z_a = np.stack(z, axis=1)
        pairs = [z_a[:, p] * z_a[:, q] for p in range(z_a.shape[1]) for q in range(p + 1, z_a.shape[1])]
        return cols_a, np.column_stack([z_a, z_a ** 2, *pairs])

    def _set_pool(self, ints: np.ndarray) -> None:
        self._pool_ints = ints
        self._pool_digits = self._digits(ints)
        self._pool_cols, self._pool_z = self._features(self._pool_digits)

    # -- the model -----------------------------------------------------------------
    def _targets(self) -> np.ndarray:
        ok = [y for y in self._y if y is not None]
        worst = max(ok) if ok else 0.0
        y = np.array([worst + self.fail_penalty if v is None else v for v in self._y])
        return y - y.mean() if len(y) else y

    # -- warm start: other devices' or shapes' measurements as a decaying prior ----------
    def take_prior(self, rows) -> int:
        """Take ``(group, config, metric)`` rows of other tunings of this kernel (other devices or shapes,
        one group each; a ``WarmStart``'s rows): each group's centred log-times become pseudo-observations that enter every
        posterior with weight ``warm_weight * warm_halflife / (warm_halflife + n)`` per row after ``n``
        target measurements, times the group's Kendall tau against what the target measured (clipped at 0,
        once five points are common), so a source that orders this device's times well keeps its say and
        one that does not loses it. The model is used from the first proposal. Returns the rows taken."""
        from scipy import sparse

        if isinstance(rows, Rows) and rows.space is self.space:  # already points of this space
            groups = dict(rows.points)
        else:
            by: dict[str, list] = {}
            for g, cfg, m in rows:
                by.setdefault(g, []).append((cfg, m))
            lookup = value_index(self.space)
            groups = {g: points_of(self.space, r, lookup) for g, r in by.items()}
        taken = 0
        for g, pts in groups.items():
            logs = [math.log(m) if m is not None and m > 0 else None for m in pts.values()]
            ok = [v for v in logs if v is not None]
            if len(ok) < 2:
                continue  # nothing to learn an order from
            fail = max(ok) + self.fail_penalty
            y = np.array([fail if v is None else v for v in logs])
            y -= y.mean()
            ints = np.fromiter(pts, dtype=np.int64, count=len(pts))
            cols, z = self._features(self._digits(ints))
            n, f = len(ints), self.n_features
            X1 = sparse.csr_matrix((np.ones(cols.size), (np.repeat(np.arange(n), cols.shape[1]), cols.ravel())),
                                   shape=(n, f))
            A = (X1.T @ X1).toarray()
            b = X1.T @ y
            if z.shape[1]:
                cross = X1.T @ z
                A[:, self._dense] += cross
                A[self._dense, :] += cross.T
                A[np.ix_(self._dense, self._dense)] += z.T @ z
                b[self._dense] += z.T @ y
            self._warm.append({"label": g, "A": A, "b": b, "yy": float(y @ y), "n": n,
                               "y": dict(zip(ints.tolist(), y.tolist()))})
            taken += n
        if taken:
            self.n_init = self.warm_init
        return taken

    def _warm_weights(self) -> list[float]:
        n = len(self._y)
        decay = self.warm_weight * self.warm_halflife / (self.warm_halflife + n)
        measured = {p: y for p, y in zip(self._obs_ints, self._y) if y is not None}
        out = []
        for src in self._warm:
            q = kendall_weight(src["y"], measured)
            out.append(decay * (1.0 if q is None else q))
        return out

    def _draw(self) -> np.ndarray:
        """Weights drawn from the posterior (Bayesian ridge, noise variance estimated)."""
        y = self._targets()
        b = np.zeros(self.n_features)
        for (cols, z), v in zip(self._rows, y):
            b[cols] += v
            b[self._dense] += z * v
        P = self._A + np.diag(self._precision)
        yy, count = float(y @ y), float(len(y))
        for src, w in zip(self._warm, self._warm_weights() if self._warm else ()):
            if w > 0:
                P = P + w * src["A"]
                b = b + w * src["b"]
                yy += w * src["yy"]
                count += w * src["n"]
        L = linalg.cholesky(P, lower=True)
        mean = linalg.cho_solve((L, True), b)
        resid = yy - float(b @ mean)
        sigma = math.sqrt(max(resid, 1e-6) / max(count, 1))
        z = self.np_rng.standard_normal(self.n_features)
        spread = self.exploration * (self.stall_explore if self._stalled() else 1.0)
        return mean + spread * sigma * linalg.solve_triangular(L.T, z, lower=False)

    def _refresh(self) -> None:
        """Draw new weights and predict every pool point; points already proposed are out."""
        w = self._draw()
        self.refits += 1
        self._seen_at_fit = len(self._y)
        if not self._enumerable:
            self._set_pool(self._sample_pool(min(self.pool, 4096)))
        pred = w[self._pool_cols].sum(axis=1) if self._pool_cols.shape[1] else np.zeros(len(self._pool_ints))
        if self._pool_z.shape[1]:
            pred = pred + self._pool_z @ w[self._dense]
        if self._proposed_ints:
            pred[np.isin(self._pool_ints, np.fromiter(self._proposed_ints, dtype=np.int64))] = np.inf
        self._pred = pred

    def _sample_pool(self, m: int) -> np.ndarray:
        """Up to ``m`` distinct valid points drawn uniformly (by rejection), plus the neighbours of the best."""
        digits = np.column_stack([self.np_rng.integers(0, r, size=4 * m) for r in self._radix])
        out: list[int] = []
        for row in digits:
            idx = tuple(int(x) for x in row)
            if self.space.is_valid_index(idx):
                out.append(self.space.to_int(idx))
                if len(out) >= m:
                    break
        for best in self._best_points():
            out.extend(self.space.to_int(c.index) for c in self.space.neighbours(
                self.space.candidate(self.space.from_int(best))))
        if not out:  # restrictions reject nearly everything: fall back to the space's own sampler
            out = [self.space.to_int(self.space.sample(self.rng).index) for _ in range(64)]
        return np.unique(np.array(out, dtype=np.int64))

    def _best_points(self) -> list[int]:
        ok = sorted((y, i) for i, y in enumerate(self._y) if y is not None)
        return [self._obs_ints[i] for _, i in ok[: self.top]]

    def _stale(self) -> bool:
        new = len(self._y) - self._seen_at_fit
        return new >= max(1, math.ceil(self.refit * len(self._y)))

    def _propose(self) -> Candidate | None:
        if self._random < self.n_init and (self.warm_init or (len(self._rows) < self.n_init
                                                               and len(self.proposed) < self.n_init)):
            self._random += 1
            return self.space.sample(self.rng)
        if self._pred is None or self._stale():
            self._refresh()
        self._model_steps += 1
        scores = [self._pred]
        best = self._best_points()
        if self._model_steps % self.global_every and best and not self._stalled():  # a trust-region step, global once it is used up
            far = np.min([(self._pool_digits != d).sum(axis=1) for d in self._digits(np.array(best))], axis=0)
            scores.insert(0, np.where(far <= self.radius, self._pred, np.inf))
        for pred in scores:
            while True:
                p = int(np.argmin(pred))
                if not np.isfinite(pred[p]):
                    break
                self._pred[p] = pred[p] = np.inf
                n = int(self._pool_ints[p])
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
        n = self.space.to_int(c.index)
        cols, z = self._features(self._digits(np.array([n], dtype=np.int64)))
        cols, z = cols[0], z[0]
        A, dense = self._A, self._dense
        A[np.ix_(cols, cols)] += 1.0
        if len(z):
            A[np.ix_(cols, dense)] += z
            A[np.ix_(dense, cols)] += z[:, None]
            A[np.ix_(dense, dense)] += np.outer(z, z)
        self._rows.append((cols, z))
        self._obs_ints.append(n)
        y = math.log(o.metric) if o.ok and o.metric > 0 else None
        self._y.append(y)
        self._proposed_ints.add(n)
        if y is not None and y < self._best_y:
            self._best_y, self._since_best = y, 0
        else:
            self._since_best += 1

    def _stalled(self) -> bool:
        """Whether ``stall`` results in a row brought no new best (never when ``stall`` is 0)."""
        return bool(self.stall) and self._since_best >= self.stall

    def describe(self) -> dict:
        return {**super().describe(), "n_init": self.n_init, "prior": self.prior,
                "interaction_prior": self.interaction_prior, "interactions": self.interactions,
                "value_features": len(self._value_tables), "refit": self.refit, "features": self.n_features,
                "top": self.top, "radius": self.radius, "global_every": self.global_every,
                **({"warm_sources": [w["label"] for w in self._warm]} if self._warm else {})}
