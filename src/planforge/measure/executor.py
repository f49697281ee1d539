"""Executors: where measurements run. ``local`` (a pool of isolated workers on
this machine, the default) or ``ray`` (actors on a Ray cluster, ``pip install
'planforge[ray]'``).

Both follow one small protocol: ``submit(candidates, target)`` hands out work
for the slots of one device fingerprint, ``poll(timeout)`` returns whatever
has finished since (in any order), and ``free_by_target()`` says, per device
fingerprint, how many more candidates it can take now, so the tuning loop asks
each fingerprint's strategy for exactly that many and a slow slot never holds
the others up. On a uniform cluster there is one fingerprint, and ``target``
may be left out.

A candidate goes through two stages. Builds (compiling, for backends whose
``builder()`` gives a ``BuildStage``) run on a small pool of unpinned build
workers: threads of the driver for ``local``, Ray actors that reserve no CPU
for ``ray``, which ship the built library (the stage's ``pack``) to the
measuring slot's node (its ``install``). A compile failure is a ``compile``
outcome straight from the build stage: it never occupies a measuring slot.
Measuring slots then only measure built candidates. A fingerprint takes
``lookahead`` candidates beyond its slots (default: as many as it has slots
when there is a build stage, none without), so that the next candidates build
while the slots measure.

A slot measures one candidate at a time and owns a backend instance built
from the backend's picklable ``factory()``; for a backend that measures on
cores (``pin_cores``) each slot claims a set of cores of its node (a lock file
per core set, held while the slot lives) and pins its measurement worker to
them, so two measurements never share a core. A slot that dies mid-measurement (its process killed, its node lost)
costs that candidate one retry on another slot of its fingerprint; a second
loss records it as ``runtime`` with the reason, and the run goes on.

Every result carries the device fingerprint of the slot that measured it:
times from different fingerprints are never ranked together.

``inline`` is the executor of one slot on the caller's thread, measuring the
given backend itself: the one-worker tuning loop runs on it.

Backends follow ``planforge.targets.base.Backend``; this module sits below the
targets and knows them only through that protocol and ``BuildStage``.
"""
from __future__ import annotations

import fcntl
import os
import queue
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from ..outcome import Outcome
from ..space import Candidate

EXECUTORS = ("local", "ray")
MAX_ATTEMPTS = 2  # a candidate whose slot dies is tried once more elsewhere


class ExecutorError(RuntimeError):
    """An executor that cannot start (Ray missing, no cluster at the address, a backend that cannot be copied),
    or work for a device fingerprint it has no slot of."""


@dataclass(frozen=True)
class Done:
    """One finished candidate: its outcome, the device fingerprint it was
    submitted for and measured on (``target``), the measuring slot's name
    (empty when no slot was needed: a compile failure), seconds from submit to
    result, how many slots it took (2 after a lost slot), seconds spent
    building it and where the build ran (empty without a build stage)."""

    candidate: Candidate
    outcome: Outcome
    target: str
    slot: str
    wall_s: float
    attempts: int = 1
    build_s: float = 0.0
    builder: str = ""


class Executor(Protocol):
    slots: int
    seconds: dict[str, float]  # "build" and "measure", summed over candidates
    ready_s: float  # seconds from construction until every slot could measure

    def free(self) -> int: ...

    def slots_by_target(self) -> dict[str, int]: ...

    def free_by_target(self) -> dict[str, int]: ...

    def submit(self, candidates: Sequence[Candidate], target: str | None = None) -> None: ...

    def poll(self, timeout: float | None = None) -> list[Done]: ...

    def pending(self) -> int: ...

    def close(self) -> None: ...


class BuildStage(Protocol):
    """A backend's build step, split off from measuring (``Backend.builder()``).

    Picklable: build threads and Ray build actors call it on any node. Calling
    it gives, per candidate, the built library (whatever the backend's
    ``measure_built`` takes: a path, for the CPU) or the ``compile`` Outcome
    that stopped it. ``device()`` names the hardware a library built on this
    node runs on (code built with ``-march=native`` runs only where it
    matches); ``pack(lib)`` makes a built library picklable bytes to ship to
    another node, and ``install(packed)`` puts it into the build cache of the
    node that measures, returning the library there."""

    def __call__(self, candidates: Sequence[Candidate]) -> list[Any]: ...

    def device(self) -> str: ...

    def pack(self, lib: Any) -> Any: ...

    def install(self, packed: Any) -> Any: ...


@dataclass(frozen=True)
class Artifact:
    """What the build stage hands a measuring slot: the built library
    (``lib``, on the node that built it; ``packed`` to install it on another
    node) or the ``compile`` outcome that stopped it (``failed``); ``device``:
    the build stage's ``device()`` on the node that built it; ``seconds`` and
    ``where`` (thread or process) for the record."""

    failed: Outcome | None = None
    lib: Any = None
    packed: Any = None
    device: str = ""
    seconds: float = 0.0
    where: str = ""


def build_stage(builder: BuildStage, c: Candidate, ship: bool = False) -> Artifact:
    """Build ``c`` here with ``builder`` (a backend's ``builder()``); with
    ``ship``, pack the library for another node. An exception from the
    builder is the candidate's ``compile`` outcome: the run goes on."""
    if ship:
        import socket

        where = f"build actor (pid {os.getpid()} on {socket.gethostname()})"
    else:
        where = f"{threading.current_thread().name} (pid {os.getpid()})"
    t0 = time.perf_counter()
    try:
        lib = builder([c])[0]
    except Exception as e:
        lib = Outcome.invalid("compile", f"build failed: {type(e).__name__}: {e}")
    seconds = time.perf_counter() - t0
    if isinstance(lib, Outcome):
        return Artifact(failed=lib, seconds=seconds, where=where)
    if not ship:
        return Artifact(lib=lib, seconds=seconds, where=where)
    return Artifact(lib=lib, packed=builder.pack(lib), device=builder.device(), seconds=seconds, where=where)


# what an executor uses of a backend (``planforge.targets.base.Backend``, which this module cannot import: the
# targets sit above it); checked once at start, so a backend that does not follow the protocol is a clear error
# instead of an AttributeError in a slot thread or a Ray actor
_SLOT_MEMBERS = ("factory", "builder", "measure", "measure_built", "close", "name", "fingerprint", "pin_cores")


def require_backend(backend, members: Sequence[str] = _SLOT_MEMBERS) -> None:
    """Raise ``ExecutorError`` naming what ``backend`` lacks of the Backend protocol (``members``)."""
    missing = [m for m in members if not hasattr(backend, m)]
    if missing:
        shown = ", ".join(f"{m}()" if m not in ("name", "fingerprint", "pin_cores") else m for m in missing)
        raise ExecutorError(f"backend {getattr(backend, 'name', type(backend).__name__)!r} does not follow the "
                            f"Backend protocol (planforge.targets.base.Backend): it has no {shown}")


def _free(slots: Counter, lookahead: int | None, inflight: Counter) -> dict[str, int]:
    """Per device fingerprint: its slots, plus the look-ahead (None: as many again), less what it has in flight."""
    return {t: max(0, n + (n if lookahead is None else lookahead) - inflight[t]) for t, n in slots.items()}


def _most_in_flight(slots: Counter, lookahead: int | None) -> int:
    """How many candidates can be in flight at once: every slot's, and the look-ahead."""
    return sum(_free(slots, lookahead, Counter()).values())


def _target(target: str | None, known) -> str:
    """The fingerprint a submission is for: ``target``, or the only one there is."""
    known = list(known)
    if target is None:
        if len(known) == 1:
            return known[0]
        raise ExecutorError(f"slots of {len(known)} device fingerprints ({', '.join(known) or 'none'}): "
                            "submit(candidates, target=...) must say which")
    if target not in known:
        raise ExecutorError(f"no measurement slot of device {target!r} (slots: {', '.join(known) or 'none'})")
    return target


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


def _lost(reason: str, attempts: int) -> Outcome:
    return Outcome.invalid("runtime", f"measurement worker lost {attempts} times: {reason}")


# -- local -------------------------------------------------------------------------
@dataclass(frozen=True)
class _Job:
    candidate: Candidate
    target: str
    t0: float
    attempts: int = 1
    built: Artifact | None = None  # None: the backend builds and measures in one step


class LocalExecutor:
    """``workers`` slots on this machine, each a thread driving its own backend
    instance (for the CPU backends: its own isolated worker process, pinned to
    its own core set when ``pin``), and a pool of build threads. With one
    worker and no pinning the given backend itself is used.

    Parameters:
        backend: the task's backend (copied through its ``factory()`` when
            ``workers > 1`` or ``pin``).
        workers: number of measuring slots (default 1).
        cores_per_slot: physical cores each slot claims (default 1).
        pin: pin each slot's measurement worker to its claimed cores (default:
            the backend's ``pin_cores``).
        build_workers: build threads, unpinned, each running the compiler as a
            child process (default: as many as candidates can be in flight,
            slots plus look-ahead); unused when the backend has no build step.
        lookahead: candidates each device fingerprint takes beyond its slots,
            building while the slots measure (default: its number of slots
            when the backend has a build step, else 0).
    """

    def __init__(self, backend, workers: int = 1, cores_per_slot: int = 1, pin: bool | None = None,
                 build_workers: int | None = None, lookahead: int | None = None):
        if workers < 1:
            raise ExecutorError(f"workers must be at least 1, got {workers}")
        t0 = time.perf_counter()
        require_backend(backend)
        self.slots = workers
        pin = backend.pin_cores if pin is None else pin
        self._done: queue.Queue = queue.Queue()
        self._queues: dict[str, queue.Queue] = {}  # built candidates waiting for a slot, per device fingerprint
        self._slots_of: Counter = Counter()
        self._inflight: Counter = Counter()  # per device fingerprint: building, waiting and measuring
        self._threads: list[threading.Thread] = []
        self._owned: list[Any] = []
        self._claims: list[CoreClaim] = []
        self.info: list[dict[str, Any]] = []
        factory = backend.factory() if (workers > 1 or pin) else None
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
            self.info.append({"slot": name, "cpus": cpus, "target": be.fingerprint, "backend": be, "busy": None})
            self._slots_of[be.fingerprint] += 1
            q = self._queues.setdefault(be.fingerprint, queue.Queue())
            t = threading.Thread(target=self._serve, args=(i, be, q), name=f"planforge-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        self._build = backend.builder()
        self.lookahead = 0 if self._build is None else lookahead
        self._pool = None if self._build is None else \
            ThreadPoolExecutor(build_workers or _most_in_flight(self._slots_of, lookahead),
                               thread_name_prefix="planforge-build")
        self.seconds = {"build": 0.0, "measure": 0.0}  # summed over candidates
        self._lock = threading.Lock()
        self.ready_s = time.perf_counter() - t0

    def _serve(self, i: int, be, q: queue.Queue) -> None:
        slot = self.info[i]
        while True:
            job = q.get()
            if job is None:
                return
            c = job.candidate
            slot["busy"] = c
            t0 = time.perf_counter()
            try:
                o = be.measure([c])[0] if job.built is None else be.measure_built(c, job.built.lib)
            except BaseException as e:  # the backend broke, not the candidate: retry on another slot
                slot["busy"] = None
                reason = f"{slot['slot']}: {type(e).__name__}: {e}"
                if job.attempts < MAX_ATTEMPTS and self._slots_of[job.target] > 1:
                    q.put(_Job(c, job.target, job.t0, job.attempts + 1, job.built))
                else:
                    self._finish(job, _lost(reason, job.attempts), slot["slot"])
                continue
            slot["busy"] = None
            with self._lock:
                self.seconds["measure"] += time.perf_counter() - t0
            self._finish(job, o, slot["slot"])

    def _finish(self, job: _Job, o: Outcome, slot: str) -> None:
        b = job.built or Artifact()
        self._done.put(Done(job.candidate, o, job.target, slot, time.perf_counter() - job.t0, job.attempts,
                            b.seconds, b.where))

    def _build_one(self, job: _Job) -> None:
        art = build_stage(self._build, job.candidate)
        with self._lock:
            self.seconds["build"] += art.seconds
        job = _Job(job.candidate, job.target, job.t0, job.attempts, art)
        if art.failed is not None:  # a compile failure never reaches a measuring slot
            self._finish(job, art.failed, "")
        else:
            self._queues[job.target].put(job)

    def slots_by_target(self) -> dict[str, int]:
        """Measuring slots per device fingerprint."""
        return dict(self._slots_of)

    def free_by_target(self) -> dict[str, int]:
        """Candidates each device fingerprint can take now (its free slots and look-ahead)."""
        return _free(self._slots_of, self.lookahead, self._inflight)

    def free(self) -> int:
        return sum(self.free_by_target().values())

    def pending(self) -> int:
        return sum(self._inflight.values())

    def submit(self, candidates: Sequence[Candidate], target: str | None = None) -> None:
        """Hand ``candidates`` to the slots of device ``target`` (default: the only one there is)."""
        target = _target(target, self._queues)
        now = time.perf_counter()
        for c in candidates:
            self._inflight[target] += 1
            job = _Job(c, target, now)
            if self._pool is None:
                self._queues[target].put(job)
            else:
                self._pool.submit(self._build_one, job)

    def poll(self, timeout: float | None = None) -> list[Done]:
        out: list[Done] = []
        block = True
        while self.pending():
            try:
                d = self._done.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                break
            block = False
            self._inflight[d.target] -= 1
            out.append(d)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        for q in self._queues.values():  # what was waiting is not measured: nobody is left to read it
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        for info in self.info:
            self._queues[info["target"]].put(None)
        for t in self._threads:
            t.join(timeout=30)
        for be in self._owned:
            be.close()
        for c in self._claims:
            c.release()


# -- inline --------------------------------------------------------------------------
class InlineExecutor:
    """One measuring slot on the caller's thread, measuring ``backend`` itself
    (no copy, no pinning, nothing started): the executor of the one-worker
    tuning loop.

    Parameters:
        backend: the task's backend; the caller keeps it (``close`` leaves it open).
        slots: candidates taken at once (default 1); ``poll`` measures them in
            one ``backend.measure`` call, so a backend that builds builds them
            together.
    A backend that raises while measuring (an interrupt, a broken backend)
    raises here: with one slot there is no other to retry on."""

    def __init__(self, backend, slots: int = 1):
        if slots < 1:
            raise ExecutorError(f"slots must be at least 1, got {slots}")
        require_backend(backend, ("fingerprint", "measure"))
        self.backend, self.slots = backend, slots
        self._todo: list[tuple[Candidate, float]] = []
        self.seconds = {"build": 0.0, "measure": 0.0}
        self.ready_s = 0.0

    def slots_by_target(self) -> dict[str, int]:
        return {self.backend.fingerprint: self.slots}

    def free_by_target(self) -> dict[str, int]:
        return {self.backend.fingerprint: max(0, self.slots - len(self._todo))}

    def free(self) -> int:
        return sum(self.free_by_target().values())

    def pending(self) -> int:
        return len(self._todo)

    def submit(self, candidates: Sequence[Candidate], target: str | None = None) -> None:
        """Take ``candidates`` for the next ``poll`` (``target``: the backend's fingerprint, or None)."""
        _target(target, [self.backend.fingerprint])
        now = time.perf_counter()
        self._todo.extend((c, now) for c in candidates)

    def poll(self, timeout: float | None = None) -> list[Done]:
        """Measure everything submitted, here and now (``timeout`` does not apply: nothing runs elsewhere)."""
        todo, self._todo = self._todo, []
        if not todo:
            return []
        t0 = time.perf_counter()
        outs = self.backend.measure([c for c, _ in todo])
        self.seconds["measure"] += time.perf_counter() - t0
        now = time.perf_counter()
        return [Done(c, o, self.backend.fingerprint, "inline", now - sent) for (c, sent), o in zip(todo, outs)]

    def close(self) -> None:
        self._todo = []  # the backend is the caller's: it stays open


# -- Ray -----------------------------------------------------------------------------
class _Slot:
    """Body of the Ray actor (decorated lazily, so that ``ray`` stays optional)."""

    def __init__(self, factory, cores_per_slot: int = 1, pin: bool = True):
        import socket

        self.claim = CoreClaim(cores_per_slot) if pin else None
        self.cpus = self.claim.cpus if self.claim else None
        self.backend = factory(self.cpus)
        self.build = self.backend.builder()  # this node's own, to rebuild what another kind of machine built
        self.node = socket.gethostname()

    def describe(self) -> dict[str, Any]:
        import ray

        return {"pid": os.getpid(), "node": self.node, "node_id": ray.get_runtime_context().get_node_id(),
                "cpus": self.cpus, "target": self.backend.fingerprint,
                "device": self.build.device() if self.build is not None else ""}

    def measure(self, c: Candidate) -> tuple[Outcome, str]:
        return self.backend.measure([c])[0], self.backend.fingerprint

    def measure_built(self, c: Candidate, built: Artifact) -> tuple[Outcome, str]:
        """Install the library the build stage shipped into this node's build cache, then measure it. A library
        built on another kind of machine (``-march=native`` code may not run here) is built again here instead."""
        if self.build is None:  # (a backend whose copy here lost its build step) measure as it knows how
            return self.backend.measure([c])[0], self.backend.fingerprint
        if built.device != self.build.device():
            lib = self.build([c])[0]
            if isinstance(lib, Outcome):
                return lib, self.backend.fingerprint
        else:
            lib = self.build.install(built.packed)
        return self.backend.measure_built(c, lib), self.backend.fingerprint

    def close(self) -> None:
        self.backend.close()


class _Builder:
    """Body of a Ray build actor: it reserves no CPU and is pinned to none, and lives as long as the executor,
    so no build pays for a worker process's start."""

    def __init__(self, builder: BuildStage):
        self.builder = builder

    def describe(self) -> dict[str, Any]:
        import ray

        self.builder([])  # imports what a build needs, before the first candidate
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "device": self.builder.device()}

    def build(self, c: Candidate) -> Artifact:
        return build_stage(self.builder, c, ship=True)


def ray_env() -> dict[str, str]:
    """Environment for a Ray that stays on this machine's terms: no usage
    statistics sent, no token auth for a local cluster."""
    return {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


class RayExecutor:
    """One Ray actor per device slot, each owning a backend built from the
    backend's factory on its node, and build actors that run anywhere.

    Parameters:
        backend: the task's backend (its ``factory()`` is shipped to the actors,
            its ``builder()``, when it has one, to the build actors).
        address: a running cluster (``auto`` or ``HOST:PORT``); None starts a
            local one with this machine's CPUs (default None). A cluster this
            executor started is shut down by ``close``.
        slots: number of actors (default: the cluster's CPUs / cores_per_slot).
        cores_per_slot: CPUs each actor reserves and pins (default 1).
        pin: pin each actor's measurement worker to the CPUs it claims
            (default: the backend's ``pin_cores``).
        build_workers: build actors, when the backend has a build step
            (default: as many as candidates can be in flight, slots plus
            look-ahead). They reserve no CPU (the slots hold them all), are
            pinned to none, and ship each library to the measuring slot's node.
        lookahead: candidates each device fingerprint takes beyond its slots
            (default: its number of slots when the backend has a build step, else 0).
    A build goes to an idle build actor on the same kind of machine as the
    slots it is for when there is one, else to any; a library built on
    another kind of machine is rebuilt by the measuring slot.
    """

    def __init__(self, backend, address: str | None = None, slots: int | None = None, cores_per_slot: int = 1,
                 pin: bool | None = None, build_workers: int | None = None, lookahead: int | None = None):
        try:
            import ray
        except ImportError:
            raise ExecutorError("--executor ray needs Ray: pip install 'planforge[ray]'") from None
        require_backend(backend)
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
        self.pin = backend.pin_cores if pin is None else pin
        self._factory = backend.factory()
        self._build = backend.builder()
        self.lookahead = 0 if self._build is None else lookahead
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.slots = slots or max(1, cpus // self.cores_per_slot)
        self._cls = ray.remote(_Slot).options(num_cpus=self.cores_per_slot, max_restarts=0, max_concurrency=1)
        self._actors: dict[int, Any] = {}   # slot id -> actor handle
        self._idle: list[int] = []
        self._next = 0
        self.info: dict[int, dict[str, Any]] = {}
        self._builders: dict[int, Any] = {}  # build actor id -> handle
        self._build_idle: list[int] = []
        self.build_info: dict[int, dict[str, Any]] = {}
        self._to_build: list[_Job] = []
        self._building: dict[Any, tuple[int, _Job]] = {}      # build ref -> build actor, job
        self._refs: dict[Any, tuple[int, _Job, float]] = {}  # measurement ref -> slot, job, sent at
        self._queue: list[_Job] = []                  # built (or needing no build), waiting for a slot
        self._ready: list[Done] = []
        self._inflight: Counter = Counter()
        self.seconds = {"build": 0.0, "measure": 0.0}
        for _ in range(self.slots):
            self._spawn()
        if self._build is not None:
            self._builder_cls = ray.remote(_Builder).options(num_cpus=0, max_restarts=0, max_concurrency=1)
            for _ in range(build_workers or _most_in_flight(Counter({"": self.slots}), lookahead)):
                self._spawn_builder()
        ready = [(self.info[i], a.describe.remote()) for i, a in self._actors.items()]
        ready += [(self.build_info[j], b.describe.remote()) for j, b in self._builders.items()]
        for info, ref in ready:
            try:
                info.update(ray.get(ref))
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

    def _spawn_builder(self) -> int:
        j = len(self.build_info)
        self._builders[j] = self._builder_cls.remote(self._build)
        self.build_info[j] = {"builder": f"ray-build-{j}"}
        self._build_idle.append(j)
        return j

    def slots_by_target(self) -> dict[str, int]:
        """Live measuring slots per device fingerprint."""
        return dict(Counter(self.info[i]["target"] for i in self._actors if "target" in self.info[i]))

    def free_by_target(self) -> dict[str, int]:
        """Candidates each device fingerprint can take now (its free slots and look-ahead)."""
        return _free(Counter(self.slots_by_target()), self.lookahead, self._inflight)

    def free(self) -> int:
        return sum(self.free_by_target().values())

    def pending(self) -> int:
        return sum(self._inflight.values())

    def submit(self, candidates: Sequence[Candidate], target: str | None = None) -> None:
        """Hand ``candidates`` to the slots of device ``target`` (default: the only one there is)."""
        target = _target(target, self.slots_by_target())
        now = time.perf_counter()
        for c in candidates:
            self._inflight[target] += 1
            (self._queue if self._build is None else self._to_build).append(_Job(c, target, now))
        self._dispatch()

    def _dispatch(self) -> None:
        for job in list(self._to_build):
            if not self._builders:  # every build actor lost and none could be replaced
                self._to_build.remove(job)
                self._done(job, _lost("no build worker left on the cluster", job.attempts), "")
                continue
            if not self._build_idle:
                break
            # an idle build actor on the kind of machine the job's slots are, else any
            devices = {self.info[i].get("device") for i in self._actors if self.info[i].get("target") == job.target}
            j = next((j for j in self._build_idle if self.build_info[j].get("device") in devices), self._build_idle[0])
            self._build_idle.remove(j)
            self._to_build.remove(job)
            self._building[self._builders[j].build.remote(job.candidate)] = (j, job)
        for job in list(self._queue):
            i = next((i for i in self._idle if self.info[i].get("target") == job.target), None)
            if i is None:
                if job.target not in self.slots_by_target():  # every slot of this kind lost and none could be replaced
                    self._queue.remove(job)
                    self._done(job, _lost(f"no measurement slot of device {job.target} left on the cluster",
                                          job.attempts), "none")
                continue
            self._queue.remove(job)
            self._idle.remove(i)
            self.info[i]["busy"] = job.candidate
            a = self._actors[i]
            ref = a.measure.remote(job.candidate) if job.built is None else \
                a.measure_built.remote(job.candidate, job.built)
            self._refs[ref] = (i, job, time.perf_counter())

    def _done(self, job: _Job, o: Outcome, slot: str) -> None:
        self._inflight[job.target] -= 1
        b = job.built or Artifact()
        self._ready.append(Done(job.candidate, o, job.target, slot, time.perf_counter() - job.t0, job.attempts,
                                b.seconds, b.where))

    def poll(self, timeout: float | None = None) -> list[Done]:
        ray = self.ray
        waiting = [*self._refs, *self._building]
        if waiting and not self._ready:
            ray.wait(waiting, num_returns=1, timeout=timeout)
        if waiting:
            done, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
            for ref in done:
                if ref in self._building:
                    self._built(ref)
                else:
                    self._measured(ref)
        self._dispatch()
        out, self._ready = self._ready, []
        return out

    def _built(self, ref) -> None:
        ray = self.ray
        j, job = self._building.pop(ref)
        try:
            art = ray.get(ref)
        except ray.exceptions.RayError as e:  # the build actor died, not the candidate's fault: once more
            self._retire_builder(j)
            if job.attempts < MAX_ATTEMPTS:
                self._to_build.insert(0, _Job(job.candidate, job.target, job.t0, job.attempts + 1))
            else:
                self._done(job, _lost(f"{self.build_info[j]['builder']}: {type(e).__name__}", job.attempts), "")
            return
        self._build_idle.append(j)
        self.seconds["build"] += art.seconds
        job = _Job(job.candidate, job.target, job.t0, job.attempts, art)
        if art.failed is not None:  # a compile failure never reaches a measuring slot
            self._done(job, art.failed, "")
        else:
            self._queue.append(job)

    def _measured(self, ref) -> None:
        ray = self.ray
        i, job, t0 = self._refs.pop(ref)
        self.info[i]["busy"] = None
        try:
            o, _ = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.RayTaskError) as e:
            self._retire(i)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            reason = f"{self.info[i]['slot']} on {self.info[i].get('node', '?')}: {type(e).__name__}: {first}"
            if job.attempts < MAX_ATTEMPTS:
                self._queue.insert(0, _Job(job.candidate, job.target, job.t0, job.attempts + 1, job.built))
            else:
                self._done(job, _lost(reason, job.attempts), self.info[i]["slot"])
            return
        self.seconds["measure"] += time.perf_counter() - t0
        self._idle.append(i)
        self._done(job, o, self.info[i]["slot"])

    def _retire(self, i: int) -> None:
        """A slot died: drop it and start a replacement (the candidate goes to whichever slot of its kind is
        idle first)."""
        self._replace(self._actors, self.info, self._idle, i, self._spawn)
        self.slots = len(self._actors)

    def _retire_builder(self, j: int) -> None:
        self._replace(self._builders, self.build_info, self._build_idle, j, self._spawn_builder)

    def _replace(self, actors: dict, info: dict, idle: list, i: int, spawn: Callable[[], int]) -> None:
        """Actor ``i`` died: kill what is left of it and start a replacement, or, when the cluster has no room
        left, carry on with fewer."""
        actor = actors.pop(i, None)
        info[i]["dead"] = True
        if actor is not None:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
        j = spawn()
        try:
            info[j].update(self.ray.get(actors[j].describe.remote(), timeout=120))
        except Exception as e:
            actors.pop(j, None)
            idle.remove(j)
            info[j].update(dead=True, error=str(e))

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
        for a in [*self._actors.values(), *self._builders.values()]:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self._actors.clear()
        self._builders.clear()
        if self._started:
            ray.shutdown()


def make_executor(kind: str, backend, **options: Any):
    """``local``, ``ray`` or ``inline`` executor for ``backend``; ``options`` go to its constructor."""
    if kind == "inline":
        return InlineExecutor(backend, **options)
    if kind == "local":
        return LocalExecutor(backend, **options)
    if kind == "ray":
        return RayExecutor(backend, **options)
    raise ExecutorError(f"unknown executor {kind!r}; choose from {', '.join(EXECUTORS)}")
