"""Ranked top-k of measured candidates, and the finalist walk over it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..outcome import Outcome
from ..space import Candidate


@dataclass(frozen=True)
class Entry:
    metric: float
    candidate: Candidate
    outcome: Outcome | None = None


def rank_insert(entries: list[Entry], new: Entry, k: int) -> int | None:
    """Insert ``new`` before the first entry it strictly beats; ties go after
    (first come, first served); truncate to ``k``. Returns the 0-based
    position it took, or None when it fell off the end."""
    pos = next((i for i, e in enumerate(entries) if new.metric < e.metric), len(entries))
    entries.insert(pos, new)
    del entries[k:]
    return pos if pos < k else None


@dataclass
class Ranked:
    """The ``k`` best measured candidates, lowest metric first."""

    k: int = 4
    entries: list[Entry] = field(default_factory=list)

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"keep must be at least 1, got {self.k}")

    def insert(self, metric: float, candidate: Candidate, outcome: Outcome | None = None) -> int | None:
        return rank_insert(self.entries, Entry(metric, candidate, outcome), self.k)

    @property
    def best(self) -> Entry | None:
        return self.entries[0] if self.entries else None

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)


# A validator looks at a finalist and returns why it must be rejected, or None.
Validator = Callable[[Candidate], "str | None"]


@dataclass(frozen=True)
class Finalist:
    """A ranked candidate under validation. ``rank`` is 1-based."""

    rank: int
    metric: float
    candidate: Candidate
    reasons: tuple[str, ...] = ()
    peak_bytes: int | None = None

    def to_json(self) -> dict:
        d = {"rank": self.rank, "latency_s": self.metric, "plan": self.candidate.as_dict(),
             "fingerprint": self.candidate.fingerprint, "reasons": list(self.reasons)}
        if self.peak_bytes is not None:
            d["peak_bytes"] = self.peak_bytes
        return d


@dataclass(frozen=True)
class Walk:
    accepted: Finalist
    rejected: tuple[Finalist, ...]


class NoValidFinalist(RuntimeError):
    """Every finalist failed validation; ``rejected`` says which and why."""

    def __init__(self, rejected: Sequence[Finalist]):
        self.rejected = tuple(rejected)
        if not rejected:
            msg = "no finalist to validate: nothing was measured successfully"
        else:
            lines = [f"rank {f.rank} ({f.candidate}, {f.metric:.4g} s): {'; '.join(f.reasons)}" for f in rejected]
            msg = f"all {len(rejected)} finalists were rejected:\n  " + "\n  ".join(lines)
        super().__init__(msg)


def walk_finalists(entries: Iterable[Entry], validators: Sequence[Validator],
                   peak_bytes: Callable[[Candidate], int] | None = None) -> Walk:
    """Apply every validator to each finalist in rank order; accept the first
    that passes them all. Later ranks are never validated (lazy finalists)."""
    rejected: list[Finalist] = []
    for rank, e in enumerate(entries, start=1):
        reasons = tuple(r for r in (v(e.candidate) for v in validators) if r)
        f = Finalist(rank, e.metric, e.candidate, reasons, peak_bytes(e.candidate) if peak_bytes else None)
        if not reasons:
            return Walk(f, tuple(rejected))
        rejected.append(f)
    raise NoValidFinalist(rejected)
