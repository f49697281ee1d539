"""Outliers measured twice: a time far slower than the best so far is checked again before it is trusted.

On a shared machine a candidate that lost its core to another process for a
while times 10-1000x slower than it runs. The tuning loop holds back such a
result (it is neither ranked nor told to the strategy yet), measures the
candidate again a few submissions later, and settles the faster of the two
(another process only ever adds time), with both kept in the outcome's
``extra["recheck"]``. Only timings of a real clock are checked: an outcome
whose runner recorded the machine's load (``extra["other_load"]``, see
``planforge.measure.load``); a table or a recording answers the same twice.
A slow time taken while the measuring CPUs were quiet (others' share under
``QUIET``) is trusted as it is: on a quiet machine a slow plan is slow.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from ..measure.load import QUIET
from ..outcome import Outcome
from ..space import Candidate

RECHECK_FACTOR = 10.0  # a time this many times the best so far is measured again
RECHECK_AFTER = 2  # ...after this many other submissions, so that a passing burst of load has moved on


def _summary(o: Outcome) -> dict:
    if not o.ok:
        return {"status": o.category, "message": o.message[:200]}
    return {"median_s": o.metric, "spread": o.spread, "repeats": len(o.times), "other_load": o.extra.get("other_load")}


def merged(first: Outcome, second: Outcome) -> Outcome:
    """The trusted outcome of a candidate measured twice: the faster measurement, both described in
    ``extra["recheck"]`` (``first``, ``second``: median, spread, repeats, load; ``kept``)."""
    keep = second if second.ok and second.metric < first.metric else first
    info = {"first": _summary(first), "second": _summary(second), "kept": "second" if keep is second else "first"}
    return Outcome("measured", None, keep.times, extra={**keep.extra, "recheck": info})


@dataclass
class Rechecks:
    """One search's suspects: held back on arrival, resubmitted later, merged when they return.

    Parameters:
        factor: a measured time at least this many times the best so far is a suspect (default ``RECHECK_FACTOR``).
        after: other submissions that go before a suspect's second measurement (default ``RECHECK_AFTER``).
    """

    factor: float = RECHECK_FACTOR
    after: int = RECHECK_AFTER
    held: dict[str, tuple[Candidate, Outcome, int]] = field(default_factory=dict)  # waiting for their turn
    out: dict[str, Outcome] = field(default_factory=dict)  # resubmitted: fingerprint -> first outcome
    submitted: int = 0

    def __len__(self) -> int:
        return len(self.held) + len(self.out)

    def suspect(self, o: Outcome, best: float | None) -> bool:
        """A clock's time ``factor`` x ``best`` or slower, taken while others used the CPUs (or at unknown load)."""
        if not o.ok or best is None or "other_load" not in o.extra or "recheck" in o.extra:
            return False
        load = o.extra["other_load"]
        return o.metric >= self.factor * best and (load is None or load >= QUIET)

    def due(self, slots: int, now: bool) -> list[Candidate]:
        """Suspects to measure again on up to ``slots`` free slots: those whose turn has come, or all
        (``now``: the search is ending, or nothing else is in flight to wait behind)."""
        ready = [fp for fp, (_, _, turn) in self.held.items() if now or turn <= self.submitted][:max(slots, 0)]
        out = []
        for fp in ready:
            c, first, _ = self.held.pop(fp)
            self.out[fp] = first
            out.append(c)
        self.submitted += len(out)
        return out

    def sift(self, arrived: Iterable[tuple[Candidate, Outcome]], best: float | None) -> list[tuple[Candidate, Outcome]]:
        """What to settle of ``arrived`` now: second measurements merged with their first; a new suspect held."""
        now = []
        for c, o in arrived:
            first = self.out.pop(c.fingerprint, None)
            if first is not None:
                now.append((c, merged(first, o)))
            elif self.suspect(o, best):
                self.held[c.fingerprint] = (c, o, self.submitted + self.after)
            else:
                now.append((c, o))
        return now
