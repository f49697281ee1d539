"""An analytic model corrected per stratum of its space by the measurements that arrive.

A kernel whose weight format is a gene has one roofline per format, and each is
wrong in its own way: it counts the bytes each format streams, not what
unpacking them costs, so it ranks int4 first where the nibble shifts make it
slower than int8, and a single factor over the whole space (the funnel's
``Screen.scale``) cannot fix that. ``PerStratum`` multiplies each prediction by
the median of measured / predicted over the points of its stratum measured so
far (over every stratum's points while its own has none), so that once each
format's first point is measured the search ranks the formats as they ran and
spends the rest of its budget on the tiles of the ones that lead.

Bounds (``lower_bound``), estimates and the learned ranker's features stay the
model's own: only what the strategy ranks by (``predict``) is corrected.
"""
from __future__ import annotations

import statistics
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..space import Candidate


class PerStratum:
    """``base`` (an ``Analytic`` model) with ``predict`` scaled per ``stratum(config)`` by ``observe``'d times.

    Parameters:
        base: the analytic model (predict, evaluate, estimate, lower_bound, features_of).
        stratum: the stratum of a configuration (a dict of knob values), e.g. its weight format."""

    def __init__(self, base: Any, stratum: Callable[[Mapping[str, Any]], str]):
        self.base, self.stratum = base, stratum
        self.name = getattr(base, "name", "analytic")
        self.ratios: dict[str, list[float]] = {}

    def observe(self, c: Candidate, metric: float | None) -> None:
        """A measured time (seconds; None or not positive for a failed run, which says nothing of the model)."""
        if metric is None or not metric > 0:
            return
        (p,) = self.base.predict([c])
        if p > 0 and np.isfinite(p):
            self.ratios.setdefault(self.stratum(c.as_dict()), []).append(metric / p)

    def factors(self) -> dict[str, float]:
        """The correction of each stratum measured so far (median of its measured / predicted)."""
        return {s: statistics.median(r) for s, r in self.ratios.items()}

    def predict(self, candidates: Sequence[Candidate]) -> list[float]:
        preds = self.base.predict(candidates)
        if not self.ratios:
            return list(preds)
        f = self.factors()
        pooled = statistics.median(r for rs in self.ratios.values() for r in rs)
        return [p * f.get(self.stratum(c.as_dict()), pooled) for p, c in zip(preds, candidates)]

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
        if name in ("base", "stratum", "ratios", "name"):
            raise AttributeError(name)
        return getattr(self.base, name)


__all__ = ["PerStratum"]
