"""The accuracy budget a manifest states, and the error metrics it is judged by.

A budget is ``METRIC:BOUND``: ``max_rel_err:0.01`` (the largest error of an
output element, relative to the largest magnitude of the fp64 reference, at most
0.01) or ``cosine:0.9999`` (the cosine similarity of the output and the fp64
reference at least 0.9999). A workload's budget may be overridden per task:
``max_rel_err:0.01;TASK=cosine:0.9999``.

The default budget (none stated) allows no quantisation: the weight-format gene
is then not in the plan space at all, and a quantised plan that reached the
finalist walk anyway would be rejected.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .formats import QuantError

METRICS = ("max_rel_err", "cosine")


class AccuracyError(QuantError):
    """An accuracy budget that does not parse, or names an unknown metric."""


def max_rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref| (0 when both are 0)."""
    ref = np.asarray(ref, np.float64)
    err = float(np.max(np.abs(np.asarray(out, np.float64) - ref))) if ref.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    return err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))


def cosine(out: np.ndarray, ref: np.ndarray) -> float:
    a, b = np.asarray(out, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))


_METRIC_FNS = {"max_rel_err": max_rel_err, "cosine": cosine}


@dataclass(frozen=True)
class Accuracy:
    """One budget: ``metric`` (``max_rel_err``, at most ``bound``; ``cosine``, at least ``bound``); ``bound``
    None is the default budget, which allows no quantisation."""

    metric: str = "max_rel_err"
    bound: float | None = None

    def __post_init__(self):
        if self.metric not in METRICS:
            raise AccuracyError(f"unknown accuracy metric {self.metric!r}; known: {', '.join(METRICS)}")
        if self.bound is not None:
            b = self.bound
            if not np.isfinite(b) or (self.metric == "max_rel_err" and b < 0) or \
                    (self.metric == "cosine" and not -1 <= b <= 1):
                raise AccuracyError(f"accuracy bound {b!r} out of range for {self.metric} "
                                    f"({'>= 0' if self.metric == 'max_rel_err' else 'in [-1, 1]'})")

    @property
    def allows_quantisation(self) -> bool:
        return self.bound is not None

    def measure(self, out: np.ndarray, ref: np.ndarray) -> float:
        return _METRIC_FNS[self.metric](out, ref)

    def excess(self, value: float) -> str | None:
        """Why ``value`` of this metric is over budget (saying by how much), or None."""
        if self.bound is None:
            return None
        if self.metric == "max_rel_err":
            if value <= self.bound:
                return None
            times = f", {value / self.bound:.3g}x the bound" if self.bound > 0 else ""
            return f"max_rel_err {value:.3g} exceeds the budget {self.bound:g} by {value - self.bound:.3g}{times}"
        if value >= self.bound:
            return None
        return (f"cosine {value:.6g} is below the budget {self.bound:g} by {self.bound - value:.3g} "
                f"(1 - cosine {1 - value:.3g} against {1 - self.bound:.3g} allowed)")

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "bound": self.bound}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Accuracy":
        return cls(d.get("metric", "max_rel_err"), d.get("bound"))

    def split(self, n: int) -> "Accuracy":
        """The budget of each of ``n`` chained parts, so that their errors, which add up to first order along a
        chain, stay within this one for the whole: ``max_rel_err`` B / n; ``cosine`` 1 - (1 - B) / n."""
        if self.bound is None or n <= 1:
            return self
        if self.metric == "max_rel_err":
            return Accuracy(self.metric, self.bound / n)
        return Accuracy(self.metric, 1.0 - (1.0 - self.bound) / n)

    def worst(self, values) -> float:
        """The value that decides among several outputs' (the largest error, the smallest cosine)."""
        values = list(values)
        return max(values) if self.metric == "max_rel_err" else min(values)

    def __str__(self) -> str:
        return "none stated: fp32 weights only" if self.bound is None else f"{self.metric}:{self.bound:g}"


DEFAULT = Accuracy()


def parse_one(text: str) -> Accuracy:
    text = text.strip()
    if not text or text in ("none", "default", "fp32"):
        return DEFAULT
    metric, sep, bound = text.partition(":")
    if not sep:
        raise AccuracyError(f"accuracy budget {text!r}: expected METRIC:BOUND, e.g. max_rel_err:0.01 or "
                            f"cosine:0.9999 (metrics: {', '.join(METRICS)})")
    try:
        value = float(bound)
    except ValueError:
        raise AccuracyError(f"accuracy budget {text!r}: the bound {bound!r} is not a number") from None
    return Accuracy(metric.strip(), value)


@dataclass(frozen=True)
class Budgets:
    """A workload's budget and its per-task overrides."""

    default: Accuracy = DEFAULT
    tasks: dict[str, Accuracy] = field(default_factory=dict)

    def of(self, task: str) -> Accuracy:
        return self.tasks.get(task, self.default)

    @property
    def stated(self) -> bool:
        return self.default.allows_quantisation or any(a.allows_quantisation for a in self.tasks.values())

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = self.default.to_json()
        if self.tasks:
            d["tasks"] = {k: v.to_json() for k, v in sorted(self.tasks.items())}
        return d


def parse_budget(text: str | None) -> Budgets:
    """``METRIC:BOUND[;TASK=METRIC:BOUND...]`` (empty or None: the default budget). ``AccuracyError`` on bad input."""
    if text is None or not str(text).strip():
        return Budgets()
    default, tasks = DEFAULT, {}
    for part in str(text).split(";"):
        if not part.strip():
            continue
        key, eq, rest = part.partition("=")
        if eq:
            if not key.strip():
                raise AccuracyError(f"accuracy budget {part!r}: a task override needs a task name before '='")
            tasks[key.strip()] = parse_one(rest)
        else:
            default = parse_one(part)
    return Budgets(default, tasks)


__all__ = ["Accuracy", "AccuracyError", "Budgets", "DEFAULT", "METRICS", "cosine", "max_rel_err", "parse_budget",
           "parse_one"]
