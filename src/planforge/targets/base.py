"""The Backend protocol: build and run candidates for one target."""
from __future__ import annotations

from typing import Protocol, Sequence

from ..outcome import Outcome
from ..space import Candidate


class Backend(Protocol):
    """Measures candidates on a target.

    ``fingerprint`` identifies the device (and for a table, its contents):
    times with different fingerprints are never compared. ``measure`` returns
    one Outcome per candidate, in order, and never raises for a bad candidate:
    a crash, a hang or a wrong result is an Outcome.
    """

    name: str
    fingerprint: str

    def describe(self) -> dict: ...

    def measure(self, candidates: Sequence[Candidate]) -> list[Outcome]: ...
