"""Isolated worker processes: a candidate that crashes, hangs or eats memory
takes its worker down, not the tuner.

A ``Worker`` is one long-lived child process (a fresh ``python -m
planforge.measure.worker``, not a fork: no state from the tuner leaks in, and
the caller's ``__main__`` is never re-imported) that runs jobs sent over a
pair of pipes. When a job kills it
(a signal) or overruns its timeout (it is killed), the job's result says so
and the next job gets a fresh process.
"""
from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class JobResult:
    """``status``: ``ok`` (``value`` holds the job's return), ``error`` (the job
    raised: ``message``), ``crashed`` (the process died: ``message`` names the
    signal) or ``timeout``."""

    status: str
    value: Any = None
    message: str = ""
    wall_s: float = 0.0


def _serve(jobs: Connection, results: Connection, memory_limit: int | None) -> None:
    if memory_limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    conn = results
    while True:
        try:
            msg = jobs.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, args = msg
        try:
            conn.send(("ok", fn(*args)))
        except MemoryError:
            conn.send(("error", "MemoryError: the candidate exceeded the worker's memory limit"))
        except BaseException as e:  # report, keep serving
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))


def _preload(module: str) -> None:
    """Import ``module`` in the worker (the first thing a fresh worker does)."""
    importlib.import_module(module)


def _signal_name(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


STARTUP_TIMEOUT = 120.0  # seconds a fresh worker may take to start and import a job's module


class Worker:
    """One isolated child process.

    Parameters:
        memory_limit: address-space limit (bytes) set in the child with
            RLIMIT_AS, so a candidate that allocates without bound fails there
            (default None: no limit).
        env: environment variables set in the child before it starts.
        cpus: CPUs the child is pinned to (default None: not pinned), so that
            measurements in parallel workers never share a core.
    """

    def __init__(self, memory_limit: int | None = None, env: dict[str, str] | None = None,
                 cpus: tuple[int, ...] | None = None):
        self.memory_limit = memory_limit
        self.env = env or {}
        self.cpus = tuple(cpus) if cpus else None
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._send: Connection | None = None
        self.restarts = 0

    def _start(self) -> None:
        job_r, job_w = os.pipe()
        res_r, res_w = os.pipe()
        env = {**os.environ, **self.env,
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        cmd = [sys.executable, "-m", "planforge.measure.worker", str(job_r), str(res_w), str(self.memory_limit or 0)]
        try:
            self._proc = subprocess.Popen(cmd, pass_fds=(job_r, res_w), env=env, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(job_r)
            os.close(res_w)
        if self.cpus:
            os.sched_setaffinity(self._proc.pid, self.cpus)  # before any job: OpenMP sizes itself from this
        self._send = Connection(job_w, readable=False)
        self._conn = Connection(res_r, writable=False)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def run(self, fn: Callable, args: tuple = (), timeout: float = 60.0) -> JobResult:
        """Run ``fn(*args)`` in the child (``fn`` must be importable by name).

        ``timeout`` covers the job alone: a fresh child first imports ``fn``'s
        module (numpy and all) under ``STARTUP_TIMEOUT``, so that a slow start
        on a busy machine is not blamed on the job as a timeout."""
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:
                self.restarts += 1
            self._start()
            warm = self._call(_preload, (fn.__module__,), STARTUP_TIMEOUT)
            if warm.status != "ok":
                self._kill()
                return JobResult("crashed", message=f"worker could not start ({warm.status}): {warm.message}",
                                 wall_s=warm.wall_s)
        return self._call(fn, args, timeout)

    def _call(self, fn: Callable, args: tuple, timeout: float) -> JobResult:
        t0 = time.perf_counter()
        try:
            self._send.send((fn, args))
        except (BrokenPipeError, OSError) as e:
            self._kill()
            return JobResult("crashed", message=f"worker unreachable: {e}", wall_s=time.perf_counter() - t0)
        deadline = t0 + timeout
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                self._kill()
                return JobResult("timeout", message=f"no result after {timeout:.3g} s; worker killed",
                                 wall_s=time.perf_counter() - t0)
            try:
                ready = self._conn.poll(min(left, 0.5))
            except (EOFError, OSError):
                ready = True
            if ready:
                try:
                    status, payload = self._conn.recv()
                except (EOFError, OSError):
                    code = self._wait(5)
                    self._kill()
                    return JobResult("crashed", message=f"worker {_signal_name(code)}{self._limit_note()}",
                                     wall_s=time.perf_counter() - t0)
                wall = time.perf_counter() - t0
                if status == "ok":
                    return JobResult("ok", value=payload, wall_s=wall)
                return JobResult("error", message=payload, wall_s=wall)
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._kill()
                return JobResult("crashed", message=f"worker {_signal_name(code)}{self._limit_note()}",
                                 wall_s=time.perf_counter() - t0)

    def _limit_note(self) -> str:
        # a candidate that runs out of address space under RLIMIT_AS usually dies on the failed allocation
        return f" (its memory limit was {self.memory_limit / 2**20:.0f} MiB)" if self.memory_limit else ""

    def _wait(self, timeout: float) -> int | None:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)  # the worker and anything it started
                except (ProcessLookupError, PermissionError):
                    self._proc.kill()
            self._wait(5)
        for c in (self._conn, getattr(self, "_send", None)):
            if c is not None:
                try:
                    c.close()
                except OSError:
                    pass
        self._proc = self._conn = self._send = None

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._send.send(None)
                self._wait(2)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def oversubscription() -> float:
    """How many runnable threads this machine has per CPU right now (the one-minute load average over the CPU
    count; at least 1), or 1 where the load average cannot be read."""
    try:
        return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except (OSError, AttributeError):
        return 1.0


@dataclass
class AdaptiveTimeout:
    """A job's timeout: ``factor`` x the fastest job so far, times the machine's oversubscription (a job on a
    machine with twice as many runnable threads as CPUs gets twice as long: other jobs' load is not the
    kernel's hang), within [lo, hi] seconds.

    Before any job has finished the timeout is ``hi``. ``load``: the oversubscription (default
    ``oversubscription``: the load average per CPU, at least 1)."""

    factor: float = 10.0
    lo: float = 5.0
    hi: float = 120.0
    best: float | None = None
    load: Callable[[], float] = field(default=oversubscription, repr=False, compare=False)

    def __call__(self) -> float:
        if self.best is None:
            return self.hi
        return min(self.hi, max(self.lo, self.factor * self.best * max(1.0, self.load())))

    def observe(self, wall_s: float) -> None:
        self.best = wall_s if self.best is None else min(self.best, wall_s)


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False),
           int(sys.argv[3]) or None)
