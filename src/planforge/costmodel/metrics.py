"""How well a cost model ranks, and whether a search paid for itself."""
from __future__ import annotations

import math
from typing import Sequence

from scipy import stats


def _clean(pred: Sequence[float], meas: Sequence[float]) -> tuple[list[float], list[float]]:
    pairs = [(p, m) for p, m in zip(pred, meas) if math.isfinite(p) and math.isfinite(m)]
    return [p for p, _ in pairs], [m for _, m in pairs]


def spearman(pred: Sequence[float], meas: Sequence[float]) -> float | None:
    """Spearman rank correlation (scipy); None with fewer than 3 pairs or no variation."""
    p, m = _clean(pred, meas)
    if len(p) < 3 or len(set(p)) < 2 or len(set(m)) < 2:
        return None
    return float(stats.spearmanr(p, m).statistic)


def kendall(pred: Sequence[float], meas: Sequence[float]) -> float | None:
    """Kendall's tau-b (scipy); None with fewer than 3 pairs or no variation."""
    p, m = _clean(pred, meas)
    if len(p) < 3 or len(set(p)) < 2 or len(set(m)) < 2:
        return None
    return float(stats.kendalltau(p, m).statistic)


def top_k(scores: Sequence[float], k: int) -> list[int]:
    """Indices of the ``k`` lowest scores; ties keep input order."""
    return sorted(range(len(scores)), key=lambda i: scores[i])[:k]


def top_k_recall(pred: Sequence[float], meas: Sequence[float], k: int) -> float:
    """Fraction of the measured top-k that the predicted top-k contains."""
    if not len(meas):
        return 0.0
    k = min(k, len(meas))
    return len(set(top_k(pred, k)) & set(top_k(meas, k))) / k


def break_even_runs(search_seconds: float, saved_seconds_per_run: float) -> float:
    """Executions after which the search time is paid back (inf when nothing was saved)."""
    if saved_seconds_per_run <= 0:
        return math.inf
    return search_seconds / saved_seconds_per_run
