"""Scoring searches on spaces whose optimum is known (replayed recordings).

A run is the metric of each unique evaluation in order (None for a failed
measurement). Its score on a space is the number of unique evaluations it
needed to get within ``tolerance`` (5%) of the optimum; a run that never got
there counts as the budget plus one, so a summary over seeds is the median
and 90th percentile of that number, the fraction of runs that got there and
the mean best-so-far curve (best metric / optimum after each evaluation).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

TOLERANCE = 0.05


def evals_to_within(values: Sequence[float | None], optimum: float, tolerance: float = TOLERANCE) -> int | None:
    """1-based number of the first evaluation within ``tolerance`` of ``optimum``; None if none is."""
    bound = optimum * (1 + tolerance)
    for i, v in enumerate(values, start=1):
        if v is not None and v <= bound:
            return i
    return None


def best_so_far(values: Sequence[float | None], length: int) -> np.ndarray:
    """Best metric after each of ``length`` evaluations (NaN before the first
    valid one). A run that ended earlier keeps its last best to the end: it
    found nothing better, whether it stopped on its own or hit the optimum."""
    out = np.full(length, np.nan)
    best = math.inf
    for i, v in enumerate(values[:length]):
        if v is not None and v < best:
            best = v
        if best < math.inf:
            out[i] = best
    if len(values) < length and best < math.inf:
        out[len(values):] = best
    return out


@dataclass
class Score:
    """One strategy on one space, over several runs (seeds).

    ``evals``: evaluations to within tolerance per run (budget + 1 for a run
    that never got there); ``curve``: mean of best-so-far / optimum after each
    evaluation, over the runs that had a valid measurement by then."""

    budget: int
    evals: list[int]
    curve: np.ndarray
    tolerance: float = TOLERANCE

    @property
    def runs(self) -> int:
        return len(self.evals)

    @property
    def median(self) -> float:
        return float(np.median(self.evals))

    @property
    def p90(self) -> float:
        return float(np.percentile(self.evals, 90))

    @property
    def success_rate(self) -> float:
        return sum(e <= self.budget for e in self.evals) / len(self.evals)

    def curve_at(self, n: int) -> float:
        """Mean best-so-far / optimum after ``n`` evaluations (NaN if no run had a valid one)."""
        return float(self.curve[min(n, self.budget) - 1])

    def to_json(self, full_curve: bool = True) -> dict:
        d = {"median_evals_to_5pct" if self.tolerance == TOLERANCE else "median_evals": self.median,
             "p90_evals_to_5pct" if self.tolerance == TOLERANCE else "p90_evals": self.p90,
             "success_rate": self.success_rate, "runs": self.runs, "evals": list(self.evals)}
        if full_curve:
            d["mean_best_so_far"] = [None if math.isnan(x) else round(float(x), 6) for x in self.curve]
        return d


def score(runs: Sequence[Sequence[float | None]], optimum: float, budget: int,
          tolerance: float = TOLERANCE) -> Score:
    """Score runs (each the metric of its unique evaluations, in order) against a known optimum."""
    if not runs:
        raise ValueError("nothing to score: no runs")
    evals = []
    for values in runs:
        n = evals_to_within(values[:budget], optimum, tolerance)
        evals.append(budget + 1 if n is None else n)
    curves = np.vstack([best_so_far(v, budget) for v in runs]) / optimum
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before any valid measurement
        curve = np.nanmean(curves, axis=0)
    return Score(budget, evals, curve, tolerance)


def ratio(a: float, b: float) -> float:
    """``a / b``, inf when ``b`` is 0."""
    return a / b if b else math.inf
