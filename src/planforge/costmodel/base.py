"""Cost models: ``predict(candidates) -> scores`` (lower is better, seconds where possible)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from ..space import Candidate


class CostModel(Protocol):
    name: str

    def predict(self, candidates: Sequence[Candidate]) -> list[float]: ...


@dataclass
class TableProxy:
    """A recorded proxy cost per candidate fingerprint (the drill's ``proxy_ns``).

    A candidate missing from the table scores +inf (never preferred)."""

    table: Mapping[str, float]
    name: str = "proxy"

    def predict(self, candidates: Sequence[Candidate]) -> list[float]:
        return [self.table.get(c.fingerprint, float("inf")) for c in candidates]
