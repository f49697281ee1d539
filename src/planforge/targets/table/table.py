"""Table backend: a measurement is a lookup in a fixed latency table.

Used for the drill (and any recorded table): deterministic, free, and exactly
known, so the search engine can be checked against known answers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Mapping, Sequence

from ...outcome import Outcome
from ...space import Candidate, fingerprint_of


@dataclass
class TableBackend:
    """Looks each candidate up by fingerprint in ``table`` (fingerprint -> seconds).

    Parameters:
        table: latency in seconds per candidate fingerprint; a candidate missing
            from it is rejected as ``constraints`` (the table's space excludes it).
        label: names the table in the fingerprint (default ``"table"``).
        delay_s: seconds each lookup sleeps, standing in for a device's
            measuring time (default 0; tests use it to interrupt a run).
    """

    table: Mapping[str, float]
    label: str = "table"
    delay_s: float = 0.0
    name: str = "table"
    fingerprint: str = field(init=False)

    def __post_init__(self):
        self.fingerprint = f"table:{self.label}:{fingerprint_of(sorted(self.table.items()))}"

    def describe(self) -> dict:
        return {"backend": self.name, "fingerprint": self.fingerprint, "entries": len(self.table)}

    def factory(self):
        """A picklable ``f(cpus) -> TableBackend`` (a copy of this one; ``cpus`` is ignored)."""
        return partial(_copy_table, dict(self.table), self.label, self.delay_s)

    def measure(self, candidates: Sequence[Candidate]) -> list[Outcome]:
        out = []
        for c in candidates:
            if self.delay_s:
                time.sleep(self.delay_s)
            t = self.table.get(c.fingerprint)
            out.append(Outcome.measured([t]) if t is not None else Outcome.rejected(f"{c} is not in table {self.label!r}"))
        return out


def _copy_table(table: dict, label: str, delay_s: float, cpus=None) -> TableBackend:
    return TableBackend(table, label, delay_s)
