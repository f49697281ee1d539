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
    pin_cores = False  # a lookup takes no core worth pinning

    def __post_init__(self):
        self.fingerprint = f"table:{self.label}:{fingerprint_of(sorted(self.table.items()))}"

    def describe(self) -> dict:
        return {"backend": self.name, "fingerprint": self.fingerprint, "entries": len(self.table)}

    def factory(self):
        """A picklable ``f(cpus) -> TableBackend`` (a copy of this one; ``cpus`` is ignored)."""
        return partial(_copy_table, dict(self.table), self.label, self.delay_s)

    def builder(self) -> None:
        """None: a lookup has nothing to build."""
        return None

    def measure(self, candidates: Sequence[Candidate]) -> list[Outcome]:
        out = []
        for c in candidates:
            if self.delay_s:
                time.sleep(self.delay_s)
            t = self.table.get(c.fingerprint)
            out.append(Outcome.measured([t]) if t is not None else Outcome.rejected(f"{c} is not in table {self.label!r}"))
        return out

    def measure_built(self, candidate: Candidate, lib=None) -> Outcome:
        """Without a build stage there is nothing built: the lookup itself."""
        return self.measure([candidate])[0]

    def baselines(self, libraries: Sequence[str] | None = None) -> dict[str, Outcome]:
        """{}: a table has no library to compare with."""
        return {}

    def remeasure(self, candidates: Sequence[Candidate], libraries: Sequence[str] | None = None,
                  rounds: int = 3) -> tuple[list[Outcome], dict[str, Outcome]]:
        """The table's times again: they do not change between rounds, so one lookup stands for every round."""
        return self.measure(candidates), {}

    def program(self, candidate: Candidate) -> None:
        """None: a table's entry is no program."""
        return None

    def work(self) -> None:
        """None: a table holds times, not the work behind them."""
        return None

    def device_profile(self) -> None:
        """None: no device is measured."""
        return None

    def close(self) -> None:
        """Nothing to release."""


def _copy_table(table: dict, label: str, delay_s: float, cpus=None) -> TableBackend:
    return TableBackend(table, label, delay_s)
