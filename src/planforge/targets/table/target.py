"""The table Target: measuring is a lookup in a fixed latency table (the drill)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..target import Lookup
from .table import TableBackend


@dataclass
class TableTarget(Lookup):
    """A fixed latency table: deterministic, free and exactly known, so a search can be checked
    against known answers. It has no device, templates or ceilings (``Lookup`` refuses those);
    ``table_backend`` makes the backend a table workload measures with."""

    name: str = "table"
    pin_cores: bool = False  # a lookup takes no core worth pinning
    does: str = "measures by looking candidates up in a fixed latency table (e.g. the drill)"

    def describe(self) -> dict[str, Any]:
        return {"target": self.name, "measures": self.does}

    def table_backend(self, table: Mapping[str, float], label: str = "table", delay_s: float = 0.0) -> TableBackend:
        """A backend answering from ``table`` (candidate fingerprint -> seconds); ``label`` names the
        table in the fingerprint (default "table"); ``delay_s`` makes each lookup sleep (default 0)."""
        return TableBackend(table, label=label, delay_s=delay_s)


__all__ = ["TableTarget"]
