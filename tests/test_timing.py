"""Runners compared side by side: each round one runner further on, a pause before each turn."""
from __future__ import annotations

import time

from planforge.measure.timing import interleaved


def test_rounds_rotate_so_no_runner_always_follows_the_same_one():
    calls: list[str] = []
    runners = {k: (lambda k=k: calls.append(k)) for k in "abc"}
    got = interleaved(runners, 4, lambda name, f: (f(), name)[1], settle_s=0)
    assert calls == list("abc" "bca" "cab" "abc")
    assert got == {k: [k] * 4 for k in "abc"}  # each sample is of its own runner, in its key's list
    follows = {(calls[i], calls[i + 1]) for i in range(len(calls) - 1)}
    assert ("c", "b") in follows and ("a", "c") in follows  # every runner comes after more than one other


def test_each_turn_starts_after_the_pause():
    stamps: list[float] = []
    runners = {k: (lambda: stamps.append(time.perf_counter())) for k in "ab"}
    t0 = time.perf_counter()
    interleaved(runners, 2, lambda name, f: f(), settle_s=0.02)
    assert len(stamps) == 4
    gaps = [b - a for a, b in zip([t0] + stamps, stamps)]
    assert min(gaps) >= 0.019  # nothing runs within the pause before its turn
