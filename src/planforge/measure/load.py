"""Other processes' share of the CPUs a measurement runs on, from /proc/stat.

A timing taken while another process holds one of the measuring worker's
CPUs is slow for a reason that has nothing to do with the candidate. The
worker counts, over the timed interval, the busy time of exactly the CPUs it
may run on (its affinity set: its own cores when the executor pins it, all
CPUs otherwise) and subtracts its own CPU time (all its threads); what is
left is the others' share of those CPUs, 0..1. Unknown (None) where
/proc/stat cannot be read (not Linux).
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Iterable

QUIET = 0.10  # others' share of the measuring CPUs under which a timing counts as taken on a quiet machine
_CPU_LINE = re.compile(r"^cpu(\d+)\s+(.*)$", re.M)


def busy_total(cpus: Iterable[int], stat: str | os.PathLike = "/proc/stat") -> tuple[float, float] | None:
    """Seconds the CPUs ``cpus`` have been busy and in total since boot (user + nice + system + irq + softirq +
    steal; total adds idle and iowait); None where ``stat`` cannot be read or lists none of them."""
    try:
        text = Path(stat).read_text()
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    want = set(cpus)
    busy = total = 0
    seen = False
    for m in _CPU_LINE.finditer(text):
        if int(m.group(1)) not in want:
            continue
        v = [int(x) for x in m.group(2).split()[:8]] + [0] * 8
        user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
        b = user + nice + system + irq + softirq + steal
        busy, total, seen = busy + b, total + b + idle + iowait, True
    return (busy / tick, total / tick) if seen and tick > 0 else None


def own_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux: every CPU
        return tuple(range(os.cpu_count() or 1))


class LoadMeter:
    """``with LoadMeter() as m: ...`` then ``m.share``: other processes' share of this process's CPUs meanwhile.

    Parameters:
        stat: the kernel's CPU counters (default ``/proc/stat``; tests pass a file).
    """

    def __init__(self, stat: str | os.PathLike = "/proc/stat"):
        self.stat, self.cpus = stat, own_cpus()
        self.share: float | None = None

    def __enter__(self) -> "LoadMeter":
        self._before, self._own = busy_total(self.cpus, self.stat), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        own = time.process_time() - self._own
        after = busy_total(self.cpus, self.stat)
        self.share = other_share(self._before, after, own)


def other_share(before: tuple[float, float] | None, after: tuple[float, float] | None, own_s: float) -> float | None:
    """Others' share (0..1) between two ``busy_total`` readings, given this process's own CPU seconds meanwhile;
    None when unknown or when the counters did not move (an interval shorter than a clock tick)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    others = (after[0] - before[0]) - own_s
    return round(min(1.0, max(0.0, others / (after[1] - before[1]))), 3)
