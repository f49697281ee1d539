"""Raw times of several measurements of one implementation, pooled into one outcome (the finalists' rounds)."""
from __future__ import annotations

from collections import defaultdict

from ..outcome import Outcome


class Pooled:
    """``add(key, outcome)`` per round, then ``outcome(key)``: every round's raw times in one measured outcome,
    with the highest load any round saw (``other_load``; absent when no round recorded one)."""

    def __init__(self):
        self.times: dict[str, list[float]] = defaultdict(list)
        self.loads: dict[str, list[float]] = defaultdict(list)

    def add(self, key: str, o: Outcome) -> None:
        self.times[key].extend(o.times)
        if o.extra.get("other_load") is not None:
            self.loads[key].append(o.extra["other_load"])

    def outcome(self, key: str) -> Outcome:
        load = max(self.loads[key], default=None)
        return Outcome.measured(self.times[key], **({} if load is None else {"other_load": load}))
