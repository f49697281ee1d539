"""CPU backend: build candidates from C templates, measure them in an isolated worker.

Builds run in parallel worker processes and are cached by content hash; a
compile error is a ``compile`` outcome with the compiler's message. Each
measurement runs in a long-lived, isolated worker process with an adaptive
timeout: a segfault is a ``runtime`` outcome, a hang a ``timeout``, a write
outside the output buffer a ``runtime``, a wrong answer a ``correctness``.
The library baselines (numpy, torch) run through the same worker and timing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Sequence

from .build import BuildError, artifact, build_many, install
from .templates import Problem, Template, available_libraries
from .job import run_job
from ...measure import AdaptiveTimeout, TimingConfig, Worker
from ...outcome import Outcome
from ...measure.isolated import LOG_LIMIT, measure_isolated
from ...measure.pooled import Pooled
from ...space import Candidate



@dataclass
class CpuBackend:
    """Measures candidates of ``template`` on ``problem`` on this machine.

    Parameters:
        problem: the kernel invocation (op, shapes, epilogue).
        template: the kernel template whose knobs the candidates set.
        profile: the DeviceProfile of this machine (its fingerprint tags every time).
        timing: the timing protocol (default ``TimingConfig()``).
        seed: seeds the inputs (default 0).
        memory_limit: address-space limit of the measurement worker, bytes (default none).
        timeout: adaptive per-measurement timeout (default 10x the fastest, 5..120 s).
        cpus: CPUs the measurement worker is pinned to (default None: not pinned).
        constant_weights: the weight operand is a plan's constant, bound as a plan binds it (a GEMM's B packed
            once, not at every call); default False.
    """

    problem: Problem
    template: Template
    profile: object
    timing: TimingConfig = field(default_factory=TimingConfig)
    seed: int = 0
    memory_limit: int | None = None
    timeout: AdaptiveTimeout = field(default_factory=AdaptiveTimeout)
    name: str = "cpu"
    cpus: tuple[int, ...] | None = None
    constant_weights: bool = False
    pin_cores = True  # measurements run on this node's cores: executors give each slot its own

    def __post_init__(self):
        self.fingerprint = self.profile.fingerprint
        self.worker = Worker(self.memory_limit, cpus=self.cpus)
        self._libs: dict[str, str] = {}  # candidate fingerprint -> built library path
        self.build_seconds = 0.0

    def describe(self) -> dict:
        return {"backend": self.name, "fingerprint": self.fingerprint, "template": self.template.name,
                "problem": self.problem.to_json(), "timing": self.timing.to_json(),
                **({"constant_weights": True} if self.constant_weights else {})}

    @property
    def _template_ref(self) -> str:
        return f"{self.template.registry}:{self.template.name}"

    def _job(self, impl: str, knobs: dict | None = None, lib: str | None = None) -> dict:
        return {"problem": self.problem.to_json(), "seed": self.seed, "impl": impl, "knobs": knobs, "lib": lib,
                "template": self._template_ref, "timing": self.timing.to_json(), "const": self.constant_weights}

    def factory(self):
        """A picklable ``f(cpus) -> CpuBackend`` measuring the same problem and
        template on whichever machine calls it (executors build one per slot)."""
        t = self.timeout
        return partial(_remote_cpu_backend, self.problem.to_json(), self._template_ref,
                       self.profile, self.timing.to_json(), self.seed, self.memory_limit, (t.factor, t.lo, t.hi),
                       constant_weights=self.constant_weights)

    def builder(self) -> "CpuBuild":
        """The executors' build stage: compiles in whichever thread, process or
        node calls it, into that node's build cache, so that a measuring slot
        only measures (``measure_built``)."""
        return CpuBuild(self.problem.to_json(), self._template_ref)

    def _run(self, job: dict) -> Outcome:
        return measure_isolated(self.worker, run_job, job, self.timeout)

    def build(self, candidates: Sequence[Candidate]) -> list[str | Outcome]:
        """Library path per candidate, or the ``compile`` outcome that stopped it."""
        import time

        t0 = time.perf_counter()
        out = build_libraries(self.problem, self.template, candidates)
        for c, b in zip(candidates, out):
            if not isinstance(b, Outcome):
                self._libs[c.fingerprint] = b
        self.build_seconds += time.perf_counter() - t0
        return out

    def measure_built(self, candidate: Candidate, lib: str) -> Outcome:
        """Measure ``candidate`` from its already built library ``lib`` (from ``build`` or ``builder()``)."""
        return self._run(self._job("kernel", candidate.as_dict(), lib))

    def measure(self, candidates: Sequence[Candidate]) -> list[Outcome]:
        built = self.build(candidates)
        return [b if isinstance(b, Outcome) else self.measure_built(c, b) for c, b in zip(candidates, built)]

    def baselines(self, libraries: Sequence[str] | None = None) -> dict[str, Outcome]:
        """Each library implementation of the same op on the same inputs, measured the same way."""
        return {lib: self._run(self._job(lib)) for lib in _names(libraries)}

    def remeasure(self, candidates: Sequence[Candidate], libraries: Sequence[str] | None = None,
                  rounds: int = 3) -> tuple[list[Outcome], dict[str, Outcome]]:
        """Measure finalists and baselines again, interleaved round by round, so
        that a slow phase of a noisy machine hits them all alike. Raw times of
        all rounds are pooled."""
        libs = _names(libraries)
        times = Pooled()  # every round's raw times and the highest load any round saw
        failed: dict[str, Outcome] = {}
        names = [c.fingerprint for c in candidates] + libs
        for _ in range(rounds):
            for c in candidates:
                if c.fingerprint in failed:
                    continue
                lib = self._libs.get(c.fingerprint)
                if lib is None:
                    b = self.build([c])[0]
                    if isinstance(b, Outcome):
                        failed[c.fingerprint] = b
                        continue
                    lib = b
                o = self.measure_built(c, lib)
                if o.ok:
                    times.add(c.fingerprint, o)
                else:
                    failed[c.fingerprint] = o
            for lib in libs:
                if lib in failed:
                    continue
                o = self._run(self._job(lib))
                if o.ok:
                    times.add(lib, o)
                else:
                    failed[lib] = o
        res = {n: failed.get(n) or times.outcome(n) for n in names}
        return [res[c.fingerprint] for c in candidates], {lib: res[lib] for lib in libs}

    def program(self, candidate: Candidate) -> None:
        """None: a kernel's candidate is its knobs, not a program."""
        return None

    def work(self) -> dict[str, float]:
        """The problem's useful FLOPs and compulsory bytes."""
        from .templates import flops, min_bytes

        return {"flops": flops(self.problem), "bytes": min_bytes(self.problem)}

    def device_profile(self) -> dict:
        return self.profile.to_dict()

    def close(self) -> None:
        self.worker.close()


def build_libraries(problem: Problem, template: Template, candidates: Sequence[Candidate]) -> list[str | Outcome]:
    """Compile each candidate's source (through the content-addressed build
    cache); the library path per candidate, or the ``compile`` outcome that
    stopped it."""
    try:
        jobs = [(template.source(problem, k), template.openmp(k)) for k in (c.as_dict() for c in candidates)]
    except (KeyError, ValueError, TypeError) as e:  # a template that cannot render these knobs
        return [Outcome.invalid("compile", f"source generation failed: {e}") for _ in candidates]
    return [Outcome.invalid("compile", f"{err}\n{log[:LOG_LIMIT]}") if built is None else str(built.path)
            for built, err, log in build_many(jobs)]


_DEVICE: list[str] = []


def node_device() -> str:
    """This node's hardware fingerprint (read once per process): code built
    with ``-march=native`` runs only where it matches."""
    if not _DEVICE:
        from .probe import hardware

        _DEVICE.append(hardware().fingerprint)
    return _DEVICE[0]


@dataclass(frozen=True)
class CpuBuild:
    """The build stage of a CpuBackend (a ``planforge.measure.executor.BuildStage``),
    picklable: ``problem`` (its JSON) and ``template`` (``registry:name``) are
    all it carries. Called, it gives a library path per candidate (or the
    ``compile`` outcome); a path travels to another node as the library's
    cache name and bytes."""

    problem: dict
    template: str

    def __call__(self, candidates: Sequence[Candidate]) -> list[str | Outcome]:
        from .job import template as find_template

        return build_libraries(Problem.from_json(self.problem), find_template(self.template), candidates)

    def device(self) -> str:
        return node_device()

    def pack(self, lib: str) -> tuple[str, bytes]:
        return artifact(lib)

    def install(self, packed: tuple[str, bytes]) -> str:
        return str(install(*packed))


def _remote_cpu_backend(problem: dict, template: str, profile, timing: dict, seed: int, memory_limit: int | None,
                        timeout: tuple[float, float, float], cpus: tuple[int, ...] | None = None,
                        constant_weights: bool = False) -> CpuBackend:
    """Rebuild a CpuBackend in an executor slot. On another kind of machine the
    slot's own profile is used, so its times carry its own fingerprint."""
    from .probe import get_profile
    from .job import template as find_template

    if node_device() != profile.fingerprint:
        profile = get_profile(quick=True)
    return CpuBackend(Problem.from_json(problem), find_template(template), profile, TimingConfig(**timing), seed,
                      memory_limit, AdaptiveTimeout(*timeout), cpus=cpus, constant_weights=constant_weights)


__all__ = ["BuildError", "CpuBackend"]


def _names(libraries: Sequence[str] | None) -> list[str]:
    """The libraries to measure: ``None`` all there are, an empty sequence none."""
    return list(available_libraries() if libraries is None else libraries)
