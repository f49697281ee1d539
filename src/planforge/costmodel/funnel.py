"""The L0 funnel: restrictions -> capacity -> roofline bound -> cost-model top-k (+ warm) -> measured.

Every stage is counted. ``Funnel.screen(space)`` does the static part once,
before anything is measured: it finds the valid points (restrictions), drops
those whose working set does not fit on chip (capacity), orders the rest by
the analytic model's predicted latency and keeps the top k as the space the
measured search may draw from (a ``Subspace``, so every strategy works on it
unchanged). The dynamic part runs inside the tuning loop: ``Screen.admit`` is
asked about each proposal before it is measured and refuses one whose lower
bound is already slower than the best measured so far (the roofline stage).
``Screen.stages`` reports the counts, from the whole space down to what was
measured; the roofline count is taken against the final incumbent.

A warm start (earlier tunings of the same kernel at another shape or on
another device, ``search.warm.WarmStart``) adds a stage after the top-k: the
configurations the sources rank best that pass capacity are kept beside the
roofline's top-k, since the target's roofline would otherwise cut most of
another shape's best configurations before the search could learn from them.

A task without an analytic model (``Analytic``: ``evaluate``, ``lower_bound``...)
still has a funnel: space -> restrictions -> measured.

The roofline stage runs in the one tuning loop (``planforge.search.loop``):
the loop hands every new proposal to ``Screen.admit`` before any executor
measures it, whichever executor that is (one slot, local workers, Ray).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from ..space import Candidate, Space
from .columns import index_columns, ravel, valid_points

DEFAULT_TOP_K = 0.1


@runtime_checkable
class Analytic(Protocol):
    """An analytic cost model (``costmodel.analytic.AnalyticModel`` is one): a
    ``CostModel`` that also scores whole columns of knob values at once
    (``evaluate``, for the funnel), gives each candidate's ``estimate`` and
    ``lower_bound`` (seconds no run can beat: the roofline stage and the
    spec's bound), and turns an estimate into feature rows (``features_of``,
    for learned models). A task's cost model that is not one (a recorded
    proxy) takes no part in the funnel's capacity, roofline and top-k stages."""

    name: str

    def predict(self, candidates: Sequence[Candidate]) -> list[float]: ...

    def evaluate(self, cols: Mapping[str, np.ndarray]) -> Any: ...

    def estimate(self, candidates: Sequence[Candidate]) -> Any: ...

    def lower_bound(self, candidates: Sequence[Candidate]) -> list[float]: ...

    def features_of(self, e: Any) -> np.ndarray: ...


@runtime_checkable
class Ranking(Protocol):
    """What the warm stage keeps by: points of the screened space (mixed-radix integers), best first
    (``search.warm.WarmStart.order``: the sources' measured points interleaved by rank)."""

    def order(self) -> list[int]: ...


class Subspace(Space):
    """The points ``members`` (mixed-radix integers of ``parent``) of a space, in that order.

    Fingerprints are the parent's (same knobs, same canonical form), so a
    measurement of a point means the same in both. Enumeration follows
    ``members`` (the funnel passes them best predicted first)."""

    def __init__(self, parent: Space, members: Sequence[int], why: str = "outside the funnel's top-k"):
        super().__init__(parent.knobs, parent.describe()["restrictions"], parent.constants, parent.canon)
        self.parent = parent
        self._order = [int(m) for m in members]
        self._members = frozenset(self._order)
        self._valid = list(self._order)
        self._why = why

    def is_valid_index(self, idx: Sequence[int]) -> bool:
        return self.to_int(idx) in self._members

    def enumerate(self):
        for n in self._order:
            yield self.candidate(self.from_int(n))

    def valid_ints(self, limit: int = 5_000_000) -> list[int]:
        return self._valid

    def violations(self, config: Mapping[str, Any]) -> list[str]:
        out = self.parent.violations(config)
        if out:
            return out
        try:
            n = self.to_int(tuple(k.index(config[k.name]) for k in self.knobs))
        except (KeyError, ValueError):
            return ["not a configuration of this space"]
        return [] if n in self._members else [self._why]

    def describe(self) -> dict[str, Any]:
        return {**self.parent.describe(), "subspace": len(self._order)}


@dataclass
class Screen:
    """What the funnel kept of a space, and the counts it needs to report.

    ``space``: the subspace to search (the parent space when nothing was cut).
    ``counts``: stage -> points left after it, for the static stages.
    ``bounds``: lower bound (s) per kept fingerprint; ``fit_bounds``: the lower
    bounds of every point that passed capacity (for the roofline count).
    """

    space: Space
    counts: dict[str, int]
    model: Analytic | None = None
    bounds: dict[str, float] = field(default_factory=dict)
    fit_bounds: np.ndarray | None = None
    kept_bounds: np.ndarray | None = None
    margin: float = 0.0
    pruned: int = 0
    seconds: float = 0.0
    warm: dict[str, int] | None = None  # the warm stage: ranked (considered), in_top_k, added, unfit

    scale: float = 1.0  # what the bounds are multiplied by: below 1 once a measured time beat its own bound

    def bound(self, c: Candidate) -> float | None:
        b = self.bounds.get(c.fingerprint)
        if b is None and self.model is not None:
            b = self.model.lower_bound([c])[0]
            self.bounds[c.fingerprint] = b
        return b

    def observe(self, c: Candidate, metric: float) -> None:
        """A measured time: one below its own lower bound proves the model's ceilings too low (a bandwidth or
        peak the probe measured on a busy machine, a cache the model does not know), so every bound is scaled
        down by the largest such miss, and the roofline stage refuses only what the corrected bounds rule out
        (with uncorrected bounds, a kernel that beats them once gets every later proposal refused)."""
        b = self.bound(c)
        if b and metric > 0 and metric < b * self.scale:
            self.scale = metric / b

    def admit(self, c: Candidate, best: float | None) -> str | None:
        """Why ``c`` must not be measured (its bound is slower than ``best``), or None."""
        if best is None or self.model is None:
            return None
        b = self.bound(c)
        if b is not None and b * self.scale > best * (1.0 + self.margin):
            self.pruned += 1
            scaled = f" (the model's {b:.4g} s scaled by {self.scale:.3g}: a measured time beat its bound)" \
                if self.scale < 1 else ""
            return f"roofline: its lower bound {b * self.scale:.4g} s{scaled} is slower than the best measured {best:.4g} s"
        return None

    def stages(self, measured: int, best: float | None) -> list[dict[str, Any]]:
        """``[{"stage", "count"}, ...]`` from the whole space down to what was measured."""
        out = [{"stage": name, "count": int(n)} for name, n in self.counts.items()]
        if self.model is not None and "capacity" in self.counts:
            lim = math.inf if best is None else best * (1.0 + self.margin) / self.scale
            fit = int(np.sum(self.fit_bounds <= lim)) if self.fit_bounds is not None else self.counts["capacity"]
            kept = int(np.sum(self.kept_bounds <= lim)) if self.kept_bounds is not None else self.counts["top-k"]
            out = [o for o in out if o["stage"] != "top-k"]
            roof = {"stage": "roofline", "count": fit, **({"bound_scale": self.scale} if self.scale < 1 else {})}
            out += [roof, {"stage": "top-k", "count": min(kept, fit)}]
            if self.warm is not None:  # what the search may draw from: the top-k and the warm stage's additions
                out.append({"stage": "warm", "count": min(kept, fit) + self.warm["added"], **self.warm})
        out.append({"stage": "measured", "count": int(measured)})
        return out


def pruned_fraction(stages: Sequence[Mapping[str, Any]], start: str = "restrictions") -> float | None:
    """Fraction of the points left after stage ``start`` that were not measured."""
    by = {s["stage"]: s["count"] for s in stages}
    if start not in by or not by[start]:
        return None
    return 1.0 - by.get("measured", 0) / by[start]


SPREAD_LIMIT = 4096  # the most points of one tie that the farthest-point order spreads (the rest: at random)


def spread_order(predicted: np.ndarray, points: np.ndarray, need: int, seed: int = 0) -> np.ndarray:
    """Positions of ``predicted`` (seconds per point; ``points``: their knob-value indices, a row each), fastest
    first; points predicted exactly equally fast in the order that spreads them over the knob values.

    A roofline predicts the same time for every point of a memory-bound kernel whose tiles all stream at the
    bound (232 of the 528 points of an fp32 GEMV 1x4096x4096 here), so ordering a tie by the space's own order
    would keep (and measure first) a corner of it that varies only the last knobs: one vector width, one
    blocking. Instead each tie that reaches into the first ``need`` positions is ordered by farthest-point
    sampling under Hamming distance (each next point differs from every point before it in as many knobs as
    possible), from a random start, ties broken by a random permutation seeded by ``seed``: the top-k is a
    design over the tie's knob values, and so is the model-guided search's first batch, which follows it."""
    n = len(predicted)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    order = perm[np.argsort(predicted[perm], kind="stable")]  # by time; a tie in random order
    vals = predicted[order]
    starts = np.flatnonzero(np.r_[True, vals[1:] != vals[:-1]])
    ends = np.r_[starts[1:], n]
    for a, b in zip(starts, ends):
        if a >= need:
            break
        if b - a > 2:
            m = min(b - a, SPREAD_LIMIT)
            order[a:a + m] = order[a:a + m][_farthest_first(points[order[a:a + m]])]
    return order


def _farthest_first(x: np.ndarray) -> np.ndarray:
    """Row order of ``x`` (knob-value indices) by greedy farthest-point sampling under Hamming distance, from
    row 0; among equally far rows the first."""
    m = len(x)
    picked = np.zeros(m, dtype=bool)
    out = np.empty(m, dtype=np.int64)
    dist = np.full(m, np.iinfo(np.int64).max)
    cur = 0
    for i in range(m):
        out[i] = cur
        picked[cur] = True
        np.minimum(dist, np.count_nonzero(x != x[cur], axis=1), out=dist)
        dist[picked] = -1
        cur = int(np.argmax(dist))
    return out


@dataclass
class Funnel:
    """The static funnel of one task.

    Parameters:
        model: the task's cost model; an ``Analytic`` one cuts the space
            (capacity, top-k) and screens proposals (roofline); None or any
            other model: only restrictions are counted and nothing is cut.
        top_k: how many capacity survivors the measured search may draw from:
            a fraction (< 1) of them or a count (default 0.1).
        min_k: keep at least this many (default 0; the driver passes four
            times the evaluation budget, so a small space is not cut to less
            than the search could measure).
        margin: the roofline stage refuses a point whose bound exceeds the
            incumbent by more than this fraction (default 0.1: the ceilings are
            measured, the incumbent's time is noisy, and a wrong refusal costs
            more than a wasted measurement).
        limit: the largest cross product scored whole (default 2e7 points).
        warm: a warm start's ranking (``Ranking``; default None: no warm
            stage): its first ``warm_k`` points that pass capacity are kept
            beside the top-k.
        warm_k: how many of the warm ranking's points the warm stage keeps
            (default 32; the driver passes the evaluation budget).
        seed: orders the points the model predicts equally fast (``spread_order``;
            default 0; the driver passes the run's seed).
    """

    model: Any = None  # see ``screen``: only an Analytic model cuts
    top_k: float = DEFAULT_TOP_K
    min_k: int = 0
    margin: float = 0.1
    limit: int = 20_000_000
    warm: Ranking | None = None
    warm_k: int = 32
    seed: int = 0

    def __post_init__(self):
        if self.top_k <= 0 or (self.top_k >= 1 and self.top_k != int(self.top_k)):
            raise ValueError(f"funnel top_k must be a fraction in (0, 1) or a positive count, got {self.top_k}")
        if self.margin < 0:
            raise ValueError(f"funnel margin must be >= 0, got {self.margin}")
        if self.warm_k < 0:
            raise ValueError(f"funnel warm_k must be >= 0, got {self.warm_k}")

    def k_of(self, n: int) -> int:
        k = math.ceil(self.top_k * n) if self.top_k < 1 else int(self.top_k)
        return min(n, max(k, self.min_k, 1)) if n else 0

    def screen(self, space: Space) -> Screen:
        import time

        t0 = time.perf_counter()
        if not isinstance(self.model, Analytic) and space.size > self.limit:
            # nothing to cut without a model, and too many points to count the valid ones
            return Screen(space, {"space": space.size}, seconds=time.perf_counter() - t0)
        idx = valid_points(space, self.limit)
        counts = {"space": space.size, "restrictions": len(idx)}
        if not isinstance(self.model, Analytic) or not len(idx):
            return Screen(space, counts, seconds=time.perf_counter() - t0)
        est = self.model.evaluate(index_columns(space, idx))
        fit = np.flatnonzero(est.fits)
        counts["capacity"] = len(fit)
        k = self.k_of(len(fit))
        order = fit[spread_order(est.predicted_s[fit], idx[fit], k, self.seed)]
        keep = order[:k]
        counts["top-k"] = len(keep)
        added, warm = self._warm_stage(ravel(idx, space), est.fits, keep)
        rows = np.concatenate([keep, added])  # the warm stage's points after the top-k, in its order
        ints = ravel(idx[rows], space)
        sub = Subspace(space, ints.tolist())
        bounds = {sub.candidate(sub.from_int(int(n))).fingerprint: float(b) for n, b in zip(ints, est.bound_s[rows])}
        return Screen(sub, counts, self.model, bounds, est.bound_s[fit].copy(), est.bound_s[keep].copy(),
                      self.margin, seconds=time.perf_counter() - t0, warm=warm)

    def _warm_stage(self, valid: np.ndarray, fits: np.ndarray, keep: np.ndarray
                    ) -> tuple[np.ndarray, dict[str, int] | None]:
        """Rows of ``valid`` (the valid points' integers) that the warm ranking adds to ``keep``:
        its first ``warm_k`` points that are valid and fit, less those the top-k holds already; and the
        stage's report (None without a warm ranking)."""
        if self.warm is None:
            return np.zeros(0, dtype=np.int64), None
        top = set(keep.tolist())
        by = np.argsort(valid, kind="stable")  # a custom space lists its valid points in its own order
        sorted_valid = valid[by]
        added: list[int] = []
        ranked = unfit = in_top = 0
        for n in self.warm.order():
            if ranked >= self.warm_k:
                break
            at = int(np.searchsorted(sorted_valid, n))
            if at >= len(valid) or sorted_valid[at] != n:
                continue  # not a valid point of this space (a source's own value or restriction)
            pos = int(by[at])
            if not fits[pos]:
                unfit += 1
                continue
            ranked += 1
            if pos in top:
                in_top += 1
            else:
                top.add(pos)
                added.append(pos)
        return np.array(added, dtype=np.int64), {"ranked": ranked, "in_top_k": in_top, "added": len(added),
                                                 "unfit": unfit}
