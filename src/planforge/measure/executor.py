"""Executors: where measurements run. ``local`` (a pool of isolated workers on
this machine, the default) or ``ray`` (actors on a Ray cluster, ``pip install
'planforge[ray]'``).

Both follow one small protocol: ``submit(candidates)`` hands out work,
``poll(timeout)`` returns whatever has finished since (in any order), and
``free()`` says how many slots are idle, so the tuning loop asks its strategy
for exactly that many candidates and a slow slot never holds the others up.

A slot measures one candidate at a time and owns a backend instance built
from the backend's picklable ``factory()``; on the CPU each slot claims a set
of cores of its node (a lock file per core set, held while the slot lives)
and pins its measurement worker to them, so two measurements never share a
core. A slot that dies mid-measurement (its process killed, its node lost)
costs that candidate one retry on another slot; a second loss records it as
``runtime`` with the reason, and the run goes on.

Every result carries the device fingerprint of the slot that measured it:
times from different fingerprints are never ranked together.
"""
from __future__ import annotations

import fcntl
import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from ..outcome import Outcome
from ..space import Candidate

EXECUTORS = ("local", "ray")
MAX_ATTEMPTS = 2  # a candidate whose slot dies is tried once more elsewhere


class ExecutorError(RuntimeError):
    """An executor that cannot start (Ray missing, no cluster at the address, a backend that cannot be copied)."""


@dataclass(frozen=True)
class Done:
    """One finished candidate: its outcome, the device fingerprint of the slot
    that measured it (``target``), the slot's name, seconds from submit to
    result, and how many slots it took (2 after a lost slot)."""

    candidate: Candidate
    outcome: Outcome
    target: str
    slot: str
    wall_s: float
    attempts: int = 1


class Executor(Protocol):
    slots: int

    def free(self) -> int: ...

    def submit(self, candidates: Sequence[Candidate]) -> None: ...

    def poll(self, timeout: float | None = None) -> list[Done]: ...

    def pending(self) -> int: ...

    def close(self) -> None: ...


# -- core sets ---------------------------------------------------------------------
def core_sets(per_slot: int = 1) -> list[tuple[int, ...]]:
    """This process's allowed CPUs grouped into physical cores (hyperthread
    siblings together), then into sets of ``per_slot`` physical cores."""
    allowed = sorted(os.sched_getaffinity(0))
    seen: set[int] = set()
    cores: list[tuple[int, ...]] = []
    for cpu in allowed:
        if cpu in seen:
            continue
        sib = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            group = tuple(c for c in _cpu_list(sib.read_text()) if c in allowed)
        except OSError:
            group = (cpu,)
        group = group or (cpu,)
        seen.update(group)
        cores.append(group)
    per_slot = max(1, per_slot)
    return [tuple(c for core in cores[i:i + per_slot] for c in core)
            for i in range(0, len(cores) - per_slot + 1, per_slot)]


def _cpu_list(text: str) -> list[int]:
    out: list[int] = []
    for part in text.strip().split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


class CoreClaim:
    """Holds one core set of this node for a slot's lifetime (an flock per set,
    released when the slot's process ends, however it ends). ``cpus`` is None
    when every set is taken: the slot then runs unpinned. The locks live in
    ``lock_dir`` (default ``$PLANFORGE_CORE_LOCKS`` or ``/tmp/planforge-cores``),
    shared by every planforge process of the node."""

    def __init__(self, per_slot: int = 1, lock_dir: str | os.PathLike | None = None):
        d = Path(lock_dir or os.environ.get("PLANFORGE_CORE_LOCKS") or Path(tempfile.gettempdir()) / "planforge-cores")
        d.mkdir(parents=True, exist_ok=True)
        self.cpus: tuple[int, ...] | None = None
        self._fd: int | None = None
        for cpus in core_sets(per_slot):
            fd = os.open(d / f"cores-{'-'.join(map(str, cpus))}.lock", os.O_CREAT | os.O_RDWR, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.cpus, self._fd = cpus, fd
            break

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def backend_factory(backend) -> Callable[[tuple[int, ...] | None], Any]:
    """A picklable ``f(cpus) -> backend`` that builds an equivalent backend
    (pinned to ``cpus``) in another thread, process or node."""
    make = getattr(backend, "factory", None)
    if make is None:
        raise ExecutorError(f"backend {getattr(backend, 'name', backend)!r} has no factory(): it can only be "
                            "measured by the local executor with one worker")
    return make()


def _lost(reason: str, attempts: int) -> Outcome:
    return Outcome.invalid("runtime", f"measurement worker lost {attempts} times: {reason}")


# -- local -------------------------------------------------------------------------
class LocalExecutor:
    """``workers`` slots on this machine, each a thread driving its own backend
    instance (for the CPU backend: its own isolated worker process, pinned to
    its own core set when ``pin``). With one worker and no pinning the given
    backend itself is used.

    Parameters:
        backend: the task's backend (copied through its ``factory()`` when
            ``workers > 1`` or ``pin``).
        workers: number of slots (default 1).
        cores_per_slot: physical cores each slot claims (default 1).
        pin: pin each slot's measurement worker to its claimed cores (default
            True when the backend measures on this CPU).
    """

    def __init__(self, backend, workers: int = 1, cores_per_slot: int = 1, pin: bool | None = None):
        if workers < 1:
            raise ExecutorError(f"workers must be at least 1, got {workers}")
        self.slots = workers
        pin = getattr(backend, "name", "") == "cpu" if pin is None else pin
        self._todo: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue()
        self._inflight = 0
        self._threads: list[threading.Thread] = []
        self._owned: list[Any] = []
        self._claims: list[CoreClaim] = []
        self.info: list[dict[str, Any]] = []
        factory = backend_factory(backend) if (workers > 1 or pin) else None
        for i in range(workers):
            cpus = None
            if pin:
                claim = CoreClaim(cores_per_slot)
                self._claims.append(claim)
                cpus = claim.cpus
            be = backend if factory is None else factory(cpus)
            if factory is not None:
                self._owned.append(be)
            name = f"local-{i}"
            self.info.append({"slot": name, "cpus": cpus, "target": be.fingerprint, "backend": be,
                              "busy": None})
            t = threading.Thread(target=self._serve, args=(i, be), name=f"planforge-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, i: int, be) -> None:
        slot = self.info[i]
        while True:
            job = self._todo.get()
            if job is None:
                return
            c, attempts, t0, tried = job
            slot["busy"] = c
            try:
                o = be.measure([c])[0]
            except BaseException as e:  # the backend broke, not the candidate: retry on another slot
                slot["busy"] = None
                reason = f"{slot['slot']}: {type(e).__name__}: {e}"
                if attempts < MAX_ATTEMPTS and self.slots > 1:
                    self._done.put(("retry", (c, attempts + 1, t0, tried | {i})))
                else:
                    self._done.put(("done", Done(c, _lost(reason, attempts), slot["target"], slot["slot"],
                                                 time.perf_counter() - t0, attempts)))
                continue
            slot["busy"] = None
            self._done.put(("done", Done(c, o, slot["target"], slot["slot"], time.perf_counter() - t0, attempts)))

    def free(self) -> int:
        return max(0, self.slots - self._inflight)

    def pending(self) -> int:
        return self._inflight

    def submit(self, candidates: Sequence[Candidate]) -> None:
        for c in candidates:
            self._inflight += 1
            self._todo.put((c, 1, time.perf_counter(), frozenset()))

    def poll(self, timeout: float | None = None) -> list[Done]:
        out: list[Done] = []
        block = True
        while self._inflight:
            try:
                kind, item = self._done.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                break
            block = False
            if kind == "retry":
                self._todo.put(item)
                continue
            self._inflight -= 1
            out.append(item)
        return out

    def close(self) -> None:
        for _ in self._threads:
            self._todo.put(None)
        for t in self._threads:
            t.join(timeout=30)
        for be in self._owned:
            if hasattr(be, "close"):
                be.close()
        for c in self._claims:
            c.release()


# -- Ray -----------------------------------------------------------------------------
class _Slot:
    """Body of the Ray actor (decorated lazily, so that ``ray`` stays optional)."""

    def __init__(self, factory, cores_per_slot: int = 1, pin: bool = True):
        import socket

        self.claim = CoreClaim(cores_per_slot) if pin else None
        self.cpus = self.claim.cpus if self.claim else None
        self.backend = factory(self.cpus)
        self.node = socket.gethostname()

    def describe(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "node": self.node, "cpus": self.cpus, "target": self.backend.fingerprint}

    def measure(self, c: Candidate) -> tuple[Outcome, str]:
        return self.backend.measure([c])[0], self.backend.fingerprint

    def close(self) -> None:
        if hasattr(self.backend, "close"):
            self.backend.close()


def ray_env() -> dict[str, str]:
    """Environment for a Ray that stays on this machine's terms: no usage
    statistics sent, no token auth for a local cluster."""
    return {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


class RayExecutor:
    """One Ray actor per device slot, each owning a backend built from the
    backend's factory on its node.

    Parameters:
        backend: the task's backend (its ``factory()`` is shipped to the actors).
        address: a running cluster (``auto`` or ``HOST:PORT``); None starts a
            local one with this machine's CPUs (default None). A cluster this
            executor started is shut down by ``close``.
        slots: number of actors (default: the cluster's CPUs / cores_per_slot).
        cores_per_slot: CPUs each actor reserves and pins (default 1).
    """

    def __init__(self, backend, address: str | None = None, slots: int | None = None, cores_per_slot: int = 1,
                 pin: bool | None = None):
        try:
            import ray
        except ImportError:
            raise ExecutorError("--executor ray needs Ray: pip install 'planforge[ray]'") from None
        self.ray = ray
        for k, v in ray_env().items():
            os.environ.setdefault(k, v)
        self._started = False
        t0 = time.perf_counter()
        if not ray.is_initialized():
            try:
                if address:
                    ray.init(address=address, log_to_driver=False)
                else:
                    ray.init(num_cpus=len(core_sets(1)) * 1, include_dashboard=False, log_to_driver=False)
                    self._started = True
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ExecutorError(f"cannot reach a Ray cluster at {address or 'a new local instance'}: {e}") from None
        self.startup_s = time.perf_counter() - t0
        self.cores_per_slot = max(1, cores_per_slot)
        self.pin = getattr(backend, "name", "") == "cpu" if pin is None else pin
        self._factory = backend_factory(backend)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.slots = slots or max(1, cpus // self.cores_per_slot)
        self._cls = ray.remote(_Slot).options(num_cpus=self.cores_per_slot, max_restarts=0, max_concurrency=1)
        self._actors: dict[int, Any] = {}   # slot id -> actor handle
        self._idle: list[int] = []
        self._next = 0
        self.info: dict[int, dict[str, Any]] = {}
        self._refs: dict[Any, tuple[int, Candidate, int, float]] = {}  # ref -> slot, candidate, attempt, t0
        self._queue: list[tuple[Candidate, int, float]] = []
        self._ready: list[Done] = []
        for _ in range(self.slots):
            self._spawn()
        ready = {i: self._actors[i].describe.remote() for i in list(self._actors)}
        for i, ref in ready.items():
            try:
                self.info[i].update(ray.get(ref))
            except ray.exceptions.RayError as e:
                raise ExecutorError(f"a Ray slot could not start its backend: {e}") from None
        self.ready_s = time.perf_counter() - t0

    def _spawn(self) -> int:
        i = self._next
        self._next += 1
        self._actors[i] = self._cls.remote(self._factory, self.cores_per_slot, self.pin)
        self.info[i] = {"slot": f"ray-{i}", "busy": None}
        self._idle.append(i)
        return i

    def free(self) -> int:
        return max(0, len(self._idle) - len(self._queue))

    def pending(self) -> int:
        return len(self._refs) + len(self._queue) + len(self._ready)

    def submit(self, candidates: Sequence[Candidate]) -> None:
        now = time.perf_counter()
        self._queue.extend((c, 1, now) for c in candidates)
        self._dispatch()

    def _dispatch(self) -> None:
        while self._queue and self._idle:
            c, attempt, t0 = self._queue.pop(0)
            i = self._idle.pop(0)
            self.info[i]["busy"] = c
            self._refs[self._actors[i].measure.remote(c)] = (i, c, attempt, t0)

    def poll(self, timeout: float | None = None) -> list[Done]:
        ray = self.ray
        if self._refs and not self._ready:
            ray.wait(list(self._refs), num_returns=1, timeout=timeout)
        if self._refs:
            done, _ = ray.wait(list(self._refs), num_returns=len(self._refs), timeout=0)
            for ref in done:
                i, c, attempt, t0 = self._refs.pop(ref)
                self.info[i]["busy"] = None
                try:
                    o, target = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                        ray.exceptions.RayTaskError) as e:
                    self._retire(i)
                    reason = f"{self.info[i]['slot']} on {self.info[i].get('node', '?')}: {type(e).__name__}: " \
                             f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                    if attempt < MAX_ATTEMPTS:
                        self._queue.insert(0, (c, attempt + 1, t0))
                    else:
                        self._ready.append(Done(c, _lost(reason, attempt), self.info[i].get("target", "?"),
                                                self.info[i]["slot"], time.perf_counter() - t0, attempt))
                    continue
                self._idle.append(i)
                self._ready.append(Done(c, o, target, self.info[i]["slot"], time.perf_counter() - t0, attempt))
            self._dispatch()
        if self._queue and not self._actors:  # every slot lost and none could be replaced: the run goes on without
            for c, attempt, t0 in self._queue:
                self._ready.append(Done(c, _lost("no measurement slot left on the cluster", attempt), "?", "none",
                                        time.perf_counter() - t0, attempt))
            self._queue.clear()
        out, self._ready = self._ready, []
        return out

    def _retire(self, i: int) -> None:
        """A slot died: drop it and start a replacement (the candidate goes to whichever slot is idle first)."""
        actor = self._actors.pop(i, None)
        self.info[i]["dead"] = True
        if actor is not None:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
        j = self._spawn()
        try:
            self.info[j].update(self.ray.get(self._actors[j].describe.remote(), timeout=120))
        except Exception as e:  # no room left on the cluster: carry on with fewer slots
            self._actors.pop(j, None)
            self._idle.remove(j)
            self.info[j]["dead"] = True
            self.info[j]["error"] = str(e)
        self.slots = len(self._actors)

    def live(self) -> list[dict[str, Any]]:
        """The live slots: pid, node, cpus, target, and the candidate each is measuring."""
        return [self.info[i] for i in sorted(self._actors)]

    def close(self) -> None:
        ray = self.ray
        closing = [a.close.remote() for a in self._actors.values()]
        try:
            ray.wait(closing, num_returns=len(closing), timeout=10)
        except Exception:
            pass
        for a in self._actors.values():
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self._actors.clear()
        if self._started:
            ray.shutdown()


def make_executor(kind: str, backend, **options: Any):
    """``local`` or ``ray`` executor for ``backend``; ``options`` go to its constructor."""
    if kind == "local":
        return LocalExecutor(backend, **options)
    if kind == "ray":
        return RayExecutor(backend, **options)
    raise ExecutorError(f"unknown executor {kind!r}; choose from {', '.join(EXECUTORS)}")
