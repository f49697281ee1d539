"""The CUDA kernel backend: each candidate measured in an isolated worker process on the GPU.

A candidate's knobs go to ``job.run_job`` in a long-lived worker process
(``measure.Worker``) with an adaptive timeout. Triton compiles a candidate at
its first launch, in the worker (its own on-disk cache keys the compiled
kernels by source and knobs), so there is no build stage to split off. A
CUDA error poisons the worker's CUDA context: the outcome is ``runtime``
and the worker is replaced before the next candidate, so the search goes on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Sequence

from ...measure import AdaptiveTimeout, TimingConfig, Worker
from ...outcome import Outcome
from ...space import Candidate
from .devices import GpuProfile
from .job import LIBRARIES, LOG_LIMIT, run_job
from .problem import CudaProblem

DEFAULT_LIBRARIES = ("torch",)  # torch.compile's max-autotune takes minutes per shape: asked for by name


def default_timeout() -> AdaptiveTimeout:
    # a fresh worker imports torch and triton, and every candidate compiles at its first launch
    return AdaptiveTimeout(factor=10.0, lo=30.0, hi=300.0)


@dataclass
class CudaBackend:
    """Measures candidates of ``problem``'s Triton template on one GPU.

    Parameters:
        problem: the ``CudaProblem``.
        profile: the GPU's ``GpuProfile`` (its fingerprint tags every time).
        timing: the timing protocol (default: ``TimingConfig(warmup_s=0.025, budget_s=0.1, min_repeats=10,
            max_repeats=200)`` with the L2 flushed, ``flush_bytes`` twice the profile's L2).
        seed: seeds the inputs (default 0).
        device: ``"cuda"`` (default), or ``"cpu"``: Triton's interpreter and the wall clock, for tests
            of everything but the GPU itself.
        timeout: the adaptive per-job timeout (default 10x the fastest, 30..300 s).
        libraries: the baselines measured by default (default ``("torch",)``; ``"torch.compile"`` too
            when named).
    """

    problem: CudaProblem
    profile: GpuProfile
    timing: TimingConfig | None = None
    seed: int = 0
    device: str = "cuda"
    timeout: AdaptiveTimeout = field(default_factory=default_timeout)
    libraries: tuple[str, ...] = DEFAULT_LIBRARIES
    name: str = "cuda"
    pin_cores = False  # the host thread only waits for the GPU: it needs no core of its own

    def __post_init__(self):
        if self.timing is None:
            self.timing = cuda_timing(self.profile)
        self.fingerprint = self.profile.fingerprint
        env = {"TRITON_INTERPRET": "1"} if self.device == "cpu" else {}
        self.worker = Worker(None, env=env)  # no address-space limit: CUDA maps far more than it uses
        self.restarts_poisoned = 0

    def describe(self) -> dict:
        return {"backend": self.name, "fingerprint": self.fingerprint, "device": self.device,
                "problem": self.problem.to_json(), "timing": self.timing.to_json()}

    def _job(self, impl: str, knobs: dict | None = None) -> dict:
        return {"problem": self.problem.to_json(), "impl": impl, "knobs": knobs, "seed": self.seed,
                "timing": self.timing.to_json(), "flush_bytes": self.timing.flush_bytes, "device": self.device}

    def _run(self, job: dict) -> Outcome:
        return run_isolated(self, run_job, job)

    def factory(self):
        """A picklable ``f(cpus) -> CudaBackend`` measuring the same problem (``cpus`` is ignored)."""
        t = self.timeout
        return partial(_remote, self.problem.to_json(), self.profile.to_dict(), self.timing.to_json(), self.seed,
                       self.device, (t.factor, t.lo, t.hi), self.libraries)

    def builder(self) -> None:
        """None: Triton compiles at a candidate's first launch, in the measuring worker."""
        return None

    def measure(self, candidates: Sequence[Candidate]) -> list[Outcome]:
        return [self._run(self._job("triton", c.as_dict())) for c in candidates]

    def measure_built(self, candidate: Candidate, lib=None) -> Outcome:
        return self._run(self._job("triton", candidate.as_dict()))

    def baselines(self, libraries: Sequence[str] | None = None) -> dict[str, Outcome]:
        names = list(self.libraries if libraries is None else libraries)
        bad = [n for n in names if n not in LIBRARIES]
        if bad:
            raise ValueError(f"unknown GPU library baseline(s) {', '.join(bad)}; known: {', '.join(LIBRARIES)}")
        return {n: self._run(self._job(n)) for n in names}

    def remeasure(self, candidates: Sequence[Candidate], libraries: Sequence[str] | None = None,
                  rounds: int = 3) -> tuple[list[Outcome], dict[str, Outcome]]:
        """Finalists and baselines again, interleaved round by round; raw times pooled."""
        libs = list(self.libraries if libraries is None else libraries)
        jobs = [(c.fingerprint, self._job("triton", c.as_dict())) for c in candidates] + \
            [(n, self._job(n)) for n in libs]
        res = interleaved(self._run, jobs, rounds)
        return [res[c.fingerprint] for c in candidates], {n: res[n] for n in libs}

    def precompile(self, candidates: Sequence[Candidate], workers: int = 8) -> dict[str, str]:
        """Compile ``candidates`` in ``workers`` parallel processes (default 8) before they are measured.

        Each process launches a candidate once on the real inputs, which makes Triton compile it for
        exactly the specialisation the measurement will launch and store it in Triton's on-disk cache;
        the measuring worker then loads it instead of compiling it on its own, one at a time. Returns
        the candidates that failed, fingerprint -> message (they fail the same way when measured)."""
        import concurrent.futures as cf
        import multiprocessing as mp

        jobs = {c.fingerprint: {**self._job("triton", c.as_dict()), "check": False, "launch_only": True}
                for c in candidates}
        failed: dict[str, str] = {}
        if not jobs:
            return failed
        ctx = mp.get_context("spawn")  # a forked CUDA context is unusable; each process makes its own
        with cf.ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs))), mp_context=ctx) as pool:
            futs = {pool.submit(run_job, job): fp for fp, job in jobs.items()}
            for f in cf.as_completed(futs):
                try:
                    r = f.result()
                except Exception as e:  # noqa: BLE001 - a lost compile process costs its candidates nothing
                    r = {"status": "runtime", "message": f"{type(e).__name__}: {e}"}
                if r["status"] != "ok":
                    failed[futs[f]] = f"{r['status']}: {r.get('message', '')}"[:LOG_LIMIT]
        return failed

    def program(self, candidate: Candidate) -> None:
        return None

    def work(self) -> dict[str, float]:
        return {"flops": self.problem.flops(), "bytes": self.problem.min_bytes()}

    def device_profile(self) -> dict:
        """The GPU profile, plus the roofline of this problem's dtype in the keys the report's roofline
        plot and device line read (``cpu_model``: the GPU's name, ``peak_flops_all``, ``bandwidth``, ``threads``:
        one per SM)."""
        return profile_json(self.profile, self.problem.dtype)

    def close(self) -> None:
        self.worker.close()


def profile_json(p: GpuProfile, dtype: str) -> dict:
    """The GPU profile with the roofline of ``dtype`` in the keys the report's roofline plot and device line
    read (``cpu_model``: the GPU's name, ``peak_flops_all``, ``bandwidth``, ``threads``: one per SM;
    ``other_load`` None and no ``busy_figures``: the host CPUs' load says nothing of a GPU's figures)."""
    return {**p.to_dict(), "cpu_model": p.name, "peak_flops_all": p.flops[dtype], "threads": p.sms,
            "bandwidth": {"L2": {"read": p.l2_bw}, "DRAM": {"read": p.hbm_bw}}, "other_load": None,
            "busy_figures": []}


def run_isolated(backend, fn, job: dict) -> Outcome:
    """``fn(job)`` in ``backend``'s isolated worker under its adaptive timeout, as an Outcome. A job that says
    ``poisoned`` (a CUDA error: the context is unusable) closes the worker, so the next job gets a fresh one."""
    r = backend.worker.run(fn, (job,), timeout=backend.timeout())
    if r.status == "ok":
        v = r.value
        if v["status"] == "ok":
            backend.timeout.observe(r.wall_s)
            return Outcome.measured(v["times"])
        if v.get("poisoned"):
            backend.worker.close()
            backend.restarts_poisoned += 1
        return Outcome.invalid(v["status"], v["message"])
    if r.status == "timeout":
        return Outcome.invalid("timeout", r.message)
    return Outcome.invalid("runtime", r.message[:LOG_LIMIT])


def interleaved(run, jobs: Sequence[tuple[str, dict]], rounds: int) -> dict[str, Outcome]:
    """Each ``(key, job)`` measured by ``run`` once per round, round by round (a slow phase of the device
    hits them all alike), every round's raw times pooled; a job that fails once keeps its failure."""
    times: dict[str, list[float]] = {}
    failed: dict[str, Outcome] = {}
    for _ in range(rounds):
        for key, job in jobs:
            if key in failed:
                continue
            o = run(job)
            if o.ok:
                times.setdefault(key, []).extend(o.times)
            else:
                failed[key] = o
    return {k: failed.get(k) or Outcome.measured(times[k]) for k, _ in jobs}


def cuda_timing(profile: GpuProfile, cold: bool = True) -> TimingConfig:
    """The GPU timing protocol: short warm-up and budget (GPU kernels are short and steady), at least 10
    repeats, and with ``cold`` (default True) the L2 flushed by zeroing twice its size before each repeat."""
    return TimingConfig(warmup_s=0.025, budget_s=0.1, min_repeats=10, max_repeats=200, min_sample_s=0.0,
                        flush_bytes=2 * profile.l2_bytes if cold else 0)


def _remote(problem: dict, profile: dict, timing: dict, seed: int, device: str, timeout: tuple, libraries: tuple,
            cpus=None) -> CudaBackend:
    return CudaBackend(CudaProblem.from_json(problem), GpuProfile.from_dict(profile), TimingConfig(**timing), seed,
                       device, AdaptiveTimeout(*timeout), tuple(libraries))


__all__ = ["CudaBackend", "cuda_timing", "interleaved", "profile_json", "run_isolated"]
