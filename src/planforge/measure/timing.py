"""The timing protocol: warm up by time, then repeat batches; keep every raw time."""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, asdict
from typing import Any, Callable, Mapping, TypeVar

from .load import LoadMeter


@dataclass(frozen=True)
class TimingConfig:
    """How one candidate is timed.

    Parameters:
        warmup_s: run the kernel for at least this long before timing (default 0.02 s).
        budget_s: aim for this much timed work per candidate (default 0.25 s).
        min_repeats / max_repeats: bounds on the number of samples (default 5 / 40).
        min_sample_s: a sample times a batch of calls lasting at least this
            long, so the clock's resolution and jitter do not dominate
            microsecond kernels (default 2e-4 s).
        flush_bytes: when > 0, a buffer this large is rewritten before every
            sample (cold caches, batch of one call); default 0 (hot caches,
            which is what a batch-1 inference loop sees).
        scrub_bytes: when > 0 (and ``flush_bytes`` is 0), before every sample
            the target evicts a candidate's weights from the caches and keeps
            its activations in them (a buffer this large read through the
            caches, then the inputs read back; batch of one call): the state a
            step of a model larger than the caches runs in within the model's
            whole call (default 0: hot).
    """

    warmup_s: float = 0.02
    budget_s: float = 0.25
    min_repeats: int = 5
    max_repeats: int = 40
    min_sample_s: float = 2e-4
    flush_bytes: int = 0
    scrub_bytes: int = 0

    def to_json(self) -> dict:
        return asdict(self)


def time_fn(fn: Callable[[], None], cfg: TimingConfig = TimingConfig(), flush: Callable[[], None] | None = None) -> list[float]:
    """Per-call seconds of ``fn``, one value per sample (the mean over its batch)."""
    clock = time.perf_counter
    t0 = clock()
    n = 0
    while True:
        fn()
        n += 1
        if clock() - t0 >= cfg.warmup_s:
            break
    est = max((clock() - t0) / n, 1e-9)
    batch = 1 if flush else max(1, math.ceil(cfg.min_sample_s / est))
    repeats = int(min(cfg.max_repeats, max(cfg.min_repeats, cfg.budget_s / (est * batch))))
    times = []
    for _ in range(repeats):
        if flush:
            flush()
        s = clock()
        for _ in range(batch):
            fn()
        times.append((clock() - s) / batch)
    return times


def timed(fn: Callable[[], None], cfg: TimingConfig = TimingConfig(),
          flush: Callable[[], None] | None = None) -> dict[str, Any]:
    """``time_fn`` and, beside its ``times``, ``other_load``: the share (0..1, None where unknown) of this
    process's CPUs that other processes used meanwhile (see ``planforge.measure.load``). A measurement
    job returns this, so that a slow time taken on a busy machine says so."""
    with LoadMeter() as load:
        times = time_fn(fn, cfg, flush)
    return {"times": times, "other_load": load.share}


SETTLE_S = 0.03  # idle before each turn in ``interleaved``: OpenBLAS (timeout 4) and passive OpenMP are asleep by then
T = TypeVar("T")


def interleaved(runners: Mapping[str, Callable[[], Any]], rounds: int, sample: Callable[[str, Callable[[], Any]], T],
                settle_s: float = SETTLE_S, seed: int = 0) -> dict[str, list[T]]:
    """``sample(name, runner)`` of every runner, round by round, for runners compared side by side in one
    process.

    The first round runs them in the order given, each later one in a fresh order (shuffled, ``seed``), so that
    no runner always follows the same one: a rotated start would not do, since in a cycle each runner's
    predecessor stays the same. Each turn starts after ``settle_s`` seconds idle, so that what the previous runner
    left running (a thread pool spinning after its calls: OpenBLAS's for 0.1 s unless told otherwise) has time
    to stop; ONNX Runtime's spinning pool was measured to outlast 30 ms, which the shuffle (and the median over
    rounds) is for."""
    order = list(runners.items())
    rng = random.Random(seed)
    got: dict[str, list[T]] = {k: [] for k, _ in order}
    for r in range(rounds):
        for k, f in (order if r == 0 else rng.sample(order, len(order))):
            if settle_s > 0:
                time.sleep(settle_s)
            got[k].append(sample(k, f))
    return got
