"""Runners compared side by side: each round one runner further on, a pause before each turn."""
from __future__ import annotations

import time

from planforge.measure.timing import interleaved


def test_rounds_shuffle_so_no_runner_always_follows_the_same_one():
    calls: list[str] = []
    runners = {k: (lambda k=k: calls.append(k)) for k in "abcd"}
    got = interleaved(runners, 8, lambda name, f: (f(), name)[1], settle_s=0)
    rounds = [calls[i:i + 4] for i in range(0, len(calls), 4)]
    assert rounds[0] == list("abcd") and all(sorted(r) == list("abcd") for r in rounds)  # every runner once a round
    assert got == {k: [k] * 8 for k in "abcd"}  # each sample is of its own runner, in its key's list
    before = {k: {calls[i - 1] for i in range(1, len(calls)) if calls[i] == k} for k in "abcd"}
    assert all(len(v) >= 2 for v in before.values()), before  # (a rotated start keeps each one's predecessor)
    first = list(calls)
    calls.clear()
    interleaved(runners, 8, lambda name, f: f(), settle_s=0)
    assert calls == first  # seeded: the same orders on every run
    calls.clear()
    interleaved(runners, 8, lambda name, f: f(), settle_s=0, seed=1)
    assert calls != first


def test_each_turn_starts_after_the_pause():
    stamps: list[float] = []
    runners = {k: (lambda: stamps.append(time.perf_counter())) for k in "ab"}
    t0 = time.perf_counter()
    interleaved(runners, 2, lambda name, f: f(), settle_s=0.02)
    assert len(stamps) == 4
    gaps = [b - a for a, b in zip([t0] + stamps, stamps)]
    assert min(gaps) >= 0.019  # nothing runs within the pause before its turn
