"""Memory validation: a plan's peak bytes against a budget."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..space import Candidate


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n} B"


@dataclass(frozen=True)
class MemoryBudget:
    """Rejects a plan whose ``peak_bytes(candidate)`` exceeds ``budget_bytes``."""

    budget_bytes: int
    peak_bytes: Callable[[Candidate], int]

    def __call__(self, c: Candidate) -> str | None:
        peak = self.peak_bytes(c)
        if peak > self.budget_bytes:
            return f"memory: peak {fmt_bytes(peak)} exceeds the budget of {fmt_bytes(self.budget_bytes)}"
        return None
