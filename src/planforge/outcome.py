"""Outcome: what measuring (or refusing to measure) a candidate gave.

The categories are T4's: a measurement is ``correct`` (``status="measured"``)
or invalid with one of ``compile``, ``runtime``, ``timeout``, ``correctness``,
``constraints``. A candidate refused before anything ran (a restriction, the
L0 funnel) has ``status="rejected"``; it is counted apart from failures.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

CATEGORIES = ("compile", "runtime", "timeout", "correctness", "constraints")
STATUSES = ("measured", "invalid", "rejected")


@dataclass(frozen=True)
class Outcome:
    """``metric`` is the median of ``times`` (seconds) when measured, else None."""

    status: str
    category: str | None = None
    times: tuple[float, ...] = ()
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown outcome status {self.status!r}")
        if self.status == "measured":
            if not self.times or self.category is not None:
                raise ValueError("a measured outcome needs times and no invalidity category")
        elif self.category not in CATEGORIES:
            raise ValueError(f"outcome {self.status!r} needs a category from {CATEGORIES}, got {self.category!r}")

    @property
    def ok(self) -> bool:
        return self.status == "measured"

    @property
    def metric(self) -> float | None:
        return statistics.median(self.times) if self.ok else None

    @property
    def spread(self) -> float | None:
        """Interquartile range relative to the median (0 for fewer than 4 repeats)."""
        if not self.ok or len(self.times) < 4:
            return 0.0 if self.ok else None
        q = statistics.quantiles(self.times, n=4)
        return (q[2] - q[0]) / self.metric if self.metric else 0.0

    @property
    def invalidity(self) -> str:
        """T4's ``invalidity`` field: ``correct`` or the category."""
        return "correct" if self.ok else self.category  # type: ignore[return-value]

    @classmethod
    def measured(cls, times, **extra) -> "Outcome":
        return cls("measured", None, tuple(float(t) for t in times), extra=extra)

    @classmethod
    def invalid(cls, category: str, message: str = "", **extra) -> "Outcome":
        return cls("invalid", category, (), message, extra=extra)

    @classmethod
    def rejected(cls, message: str, category: str = "constraints") -> "Outcome":
        return cls("rejected", category, (), message)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "category": self.category, "times": list(self.times), "message": self.message}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Outcome":
        return cls(d["status"], d.get("category"), tuple(d.get("times") or ()), d.get("message", ""))
