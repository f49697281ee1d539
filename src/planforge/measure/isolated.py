"""Measuring one job in an isolated worker process, and what it gave as an Outcome."""
from __future__ import annotations

from ..outcome import Outcome

LOG_LIMIT = 4000


def measure_isolated(worker, fn, job: dict, timeout) -> Outcome:
    """Run a measurement job (``fn(job)`` returning ``{"status", "times" | "message"}``)
    in an isolated ``worker`` under the adaptive ``timeout``, and say what it gave.

    A worker that dies of SIGKILL is given one more try in a fresh worker: a
    candidate does not SIGKILL itself, someone did (the OOM killer, an
    operator), so only a second loss is blamed on the candidate."""
    r = worker.run(fn, (job,), timeout=timeout())
    if r.status == "crashed" and "SIGKILL" in r.message:
        first = r.message
        r = worker.run(fn, (job,), timeout=timeout())
        if r.status == "crashed" and "SIGKILL" in r.message:
            return Outcome.invalid("runtime", f"measurement worker lost twice: {first}; then {r.message}")
    if r.status == "ok":
        v = r.value
        if v["status"] == "ok":
            timeout.observe(r.wall_s)
            # other processes' share of the worker's CPUs while it timed (None: unknown; absent: not a CPU runner)
            return Outcome.measured(v["times"], **({"other_load": v["other_load"]} if "other_load" in v else {}))
        return Outcome.invalid(v["status"], v["message"])
    if r.status == "timeout":
        return Outcome.invalid("timeout", r.message)
    return Outcome.invalid("runtime", r.message[:LOG_LIMIT])
