"""An analytic model corrected by the measurements that arrive: per stratum of its space, and per knob value.

A kernel whose weight format is a gene has one roofline per format, and each is
wrong in its own way: it counts the bytes each format streams, not what
unpacking them costs, so it ranks int4 first where the nibble shifts make it
slower than int8, and a single factor over the whole space (the funnel's
``Screen.scale``) cannot fix that. Within a format the roofline is wrong about
the tiles as well: a batch-1 GEMV streams the same bytes whatever its tiles, so
the roofline ties them, yet two threads, more K streams or wider blocks run
faster, and they do so in every format alike (which is what "quantise, then
tile" banks on when it reuses the fp32 search's tiles).

``PerStratum`` fits the log of measured / predicted as a stratum term plus one
term per tile knob value, shared by the strata:

    log(measured / predicted) = a[stratum] + sum over tile knobs k of b[k, value]

by least squares with a ridge penalty on the ``b`` (``shrink``: a knob value
seen once moves the prediction by about half what it measured), so that once
each format's first point is measured the search ranks the formats as they ran,
and what the tiles measured in one format moves the ranking of the same tiles
in the others. A stratum not measured yet takes the median of the others'
terms. Without ``tiles`` it is the median of measured / predicted per stratum
(of every point for a stratum not measured yet).

Bounds (``lower_bound``), estimates and the learned ranker's features stay the
model's own: only what the strategy ranks by (``predict``) is corrected.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..space import Candidate


class PerStratum:
    """``base`` (an ``Analytic`` model) with ``predict`` corrected per ``stratum(config)`` and per tile knob value
    by ``observe``'d times.

    Parameters:
        base: the analytic model (predict, evaluate, estimate, lower_bound, features_of).
        stratum: the stratum of a configuration (a dict of knob values), e.g. its weight format.
        tiles: the knobs of a configuration whose values get a shared term (default: none, the stratum alone).
        shrink: the ridge penalty on each knob value's term (default 1: in units of one measurement)."""

    def __init__(self, base: Any, stratum: Callable[[Mapping[str, Any]], str],
                 tiles: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None, shrink: float = 1.0):
        self.base, self.stratum, self.tiles, self.shrink = base, stratum, tiles, shrink
        self.name = getattr(base, "name", "analytic")
        self._rows: list[tuple[str, tuple, float]] = []  # (stratum, tile knob values, log measured / predicted)
        self._fit: tuple[dict[str, float], dict[Any, float], float] | None = None

    def _tile_items(self, d: Mapping[str, Any]) -> tuple:
        return tuple(sorted((k, repr(v)) for k, v in self.tiles(d).items())) if self.tiles else ()

    def observe(self, c: Candidate, metric: float | None) -> None:
        """A measured time (seconds; None or not positive for a failed run, which says nothing of the model)."""
        if metric is None or not metric > 0:
            return
        (p,) = self.base.predict([c])
        if p > 0 and np.isfinite(p):
            d = c.as_dict()
            self._rows.append((self.stratum(d), self._tile_items(d), math.log(metric / p)))
            self._fit = None

    def _fitted(self) -> tuple[dict[str, float], dict[Any, float], float]:
        """(stratum terms, knob value terms, the term of a stratum not measured), fitted on every row."""
        if self._fit is not None:
            return self._fit
        if not self.tiles:  # the stratum alone: the median ratio of each, and of all for one not measured
            by: dict[str, list[float]] = {}
            for s, _, ly in self._rows:
                by.setdefault(s, []).append(math.exp(ly))
            self._fit = ({s: math.log(statistics.median(v)) for s, v in by.items()}, {},
                         math.log(statistics.median(x for v in by.values() for x in v)))
            return self._fit
        strata = sorted({s for s, _, _ in self._rows})
        values = sorted({kv for _, t, _ in self._rows for kv in t})
        si, vi = {s: i for i, s in enumerate(strata)}, {v: i for i, v in enumerate(values)}
        n, ns, nv = len(self._rows), len(strata), len(values)
        # least squares, the last nv rows the ridge penalty on the knob values' terms (the strata's are free)
        A, y = np.zeros((n + nv, ns + nv)), np.zeros(n + nv)
        for r, (s, t, ly) in enumerate(self._rows):
            A[r, si[s]] = 1.0
            A[r, [ns + vi[kv] for kv in t]] = 1.0
            y[r] = ly
        A[n:, ns:] = math.sqrt(self.shrink) * np.eye(nv)
        coef = np.linalg.lstsq(A, y, rcond=None)[0]
        a = {s: float(coef[si[s]]) for s in strata}
        self._fit = (a, {v: float(coef[ns + vi[v]]) for v in values}, statistics.median(a.values()))
        return self._fit

    def factors(self) -> dict[str, float]:
        """The correction of each stratum measured so far (its term, as a factor on the prediction)."""
        if not self._rows:
            return {}
        return {s: math.exp(v) for s, v in self._fitted()[0].items()}

    def tile_factors(self) -> dict[tuple[str, str], float]:
        """The correction of each tile knob value measured so far, as a factor on the prediction."""
        if not self._rows:
            return {}
        return {kv: math.exp(v) for kv, v in self._fitted()[1].items()}

    def predict(self, candidates: Sequence[Candidate]) -> list[float]:
        preds = self.base.predict(candidates)
        if not self._rows:
            return list(preds)
        a, b, other = self._fitted()
        out = []
        for p, c in zip(preds, candidates):
            d = c.as_dict()
            out.append(p * math.exp(a.get(self.stratum(d), other) + sum(b.get(kv, 0.0) for kv in self._tile_items(d))))
        return out

    def evaluate(self, cols: Mapping[str, np.ndarray]) -> Any:
        return self.base.evaluate(cols)

    def estimate(self, candidates: Sequence[Candidate]) -> Any:
        return self.base.estimate(candidates)

    def lower_bound(self, candidates: Sequence[Candidate]) -> list[float]:
        return self.base.lower_bound(candidates)

    def features_of(self, e: Any) -> np.ndarray:
        return self.base.features_of(e)

    def __getattr__(self, name: str) -> Any:
        # everything else the base model offers (its sizes and ``at`` for the learned ranker's shape features)
        if name in ("base", "stratum", "tiles", "shrink", "_rows", "_fit"):
            raise AttributeError(name)
        return getattr(self.base, name)


__all__ = ["PerStratum"]
