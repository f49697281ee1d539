"""The GPU graph backend: whole plans (a genome's extracted program) measured on the GPU.

Each candidate's program goes to ``run_graph_job`` in an isolated worker: the
plan is lowered there (``plan.CudaPlan``: Triton templates with the genome's
knobs, torch library steps) and launched once, which makes Triton compile its
templates; its outputs are checked against the fp64 reference of the original
graph; then it is timed by the GPU protocol (``job._time``: CUDA events, the
L2 flushed before each repeat when the timing asks for cold caches), replayed
as one CUDA graph where it can be captured (checked again after a replay). The
library baseline is ``torch``: the graph op by op in torch eager on the same
device. As for kernels, a CUDA error poisons the worker's context: the
outcome is ``runtime`` and the next candidate gets a fresh worker.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Sequence

import numpy as np

from ...ir import Graph
from ...measure import AdaptiveTimeout, TimingConfig, Worker
from ...outcome import Outcome
from ...space import Candidate
from .backend import default_timeout, interleaved, profile_json, run_isolated
from .devices import GpuProfile
from .job import LOG_LIMIT
from .problem import UNIT

LIBRARIES = ("torch",)
U32 = UNIT["fp32"]


def tolerance(graph: Graph, ref: list[np.ndarray], dtype: str = "fp32") -> float:
    """The absolute tolerance of a plan computing in ``dtype`` (default fp32, the graph IR's one): the CPU
    plans' bound (8 units of roundoff times the summed reduction lengths of the graph's matmuls, scaled by
    the output's magnitude), in units of ``dtype``."""
    from ..cpu.graph import tolerance as fp32_tolerance

    return fp32_tolerance(graph, ref) * UNIT[dtype] / U32


def _wrong(outs, ref: list[np.ndarray], tol: float) -> str | None:
    """Why the device outputs ``outs`` are wrong against the fp64 ``ref``, or None when all are within ``tol``."""
    for o, r in zip(outs, ref):
        o = o.detach().cpu().numpy().astype(np.float64)
        if not np.all(np.isfinite(o)):
            return "non-finite output"
        err = float(np.abs(o - r).max())
        if err > tol:
            return f"max |out - ref| = {err:.3g} exceeds the tolerance {tol:.3g}"
    return None


def run_graph_job(job: dict) -> dict:
    """In the worker: lower the plan (``impl`` ``"plan"``) or the torch baseline (``"torch"``) on
    ``device``, check it against the reference, time it. Returns ``{"status": "ok", "times"}`` or
    ``{"status": category, "message", "poisoned"}``."""
    from ..cpu.graph import _prepared_graph
    from .job import _classify, _time

    device = job.get("device", "cuda")
    try:
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            return {"status": "runtime", "message": "no CUDA device in the measuring worker", "poisoned": False}
        g, xs, ref, _ = _prepared_graph(job)
        tol = tolerance(g, ref)
    except Exception as e:  # noqa: BLE001 - the worker reports, never dies of a setup error
        return {"status": "runtime", "message": f"setup failed: {type(e).__name__}: {e}"[:LOG_LIMIT],
                "poisoned": False}
    try:
        if job["impl"] == "torch":
            from .torchlib import forward

            fwd = forward(g, device)
            tx = [torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(device) for x in xs]
            out = fwd(*tx)

            def fn():
                fwd(*tx)
        else:
            from .plan import CudaPlan

            plan = CudaPlan(g, job["program"], device)
            plan.load(*xs)
            plan.run()
            out = plan.outputs
            fn = plan.run
        if device == "cuda":
            torch.cuda.synchronize()
        why = _wrong(out, ref, tol)
        if why is None and job["impl"] != "torch" and job.get("cuda_graph"):
            # the same plan replayed as one CUDA graph, checked again on an arena full of NaN (a replay that
            # launched nothing would leave it so)
            replay = plan.graphed()
            if replay is not None:
                plan.arena.fill_(float("nan"))
                plan.load(*xs)
                replay()
                torch.cuda.synchronize()
                why = _wrong(out, ref, tol)
                fn = replay
    except Exception as e:  # noqa: BLE001 - a bad plan is an outcome
        cat, poisoned = _classify(e)
        return {"status": cat, "message": f"{type(e).__name__}: {e}"[:LOG_LIMIT], "poisoned": poisoned}
    if why is not None:
        return {"status": "correctness", "message": why, "poisoned": False}
    try:
        times = _time(fn, job.get("timing", {}), device, int(job.get("flush_bytes", 0)))
    except Exception as e:  # noqa: BLE001
        cat, poisoned = _classify(e)
        return {"status": cat, "message": f"{type(e).__name__}: {e}"[:LOG_LIMIT], "poisoned": poisoned}
    return {"status": "ok", "times": times}


@dataclass
class CudaGraphBackend:
    """Measures plans of ``genome`` for ``graph`` on one GPU.

    Parameters:
        graph: the model graph; its fp64 evaluation is the reference every plan is checked against.
        genome: the plan space over the graph's saturated e-graph (knobs from the cuda templates' spaces).
        profile: the GPU's ``GpuProfile`` (its fingerprint tags every time).
        timing: the timing protocol (default: ``backend.cuda_timing(profile, cold=False)``: a model's weights
            stay in L2 from one call to the next, as in a control loop).
        seed: seeds the inputs (default 0).
        device: ``"cuda"`` (default), or ``"cpu"``: Triton's interpreter and the wall clock (tests).
        timeout: the adaptive per-job timeout (default 10x the fastest, 30..300 s).
        cuda_graphs: time each plan replayed as one CUDA graph where it can be captured (default True: how a
            plan runs once loaded, ``CudaPlan.graphed``; one launch instead of one Python call per step); the
            torch-eager baseline is never graphed.
    """

    graph: Graph
    genome: Any
    profile: GpuProfile
    timing: TimingConfig | None = None
    seed: int = 0
    device: str = "cuda"
    timeout: AdaptiveTimeout = field(default_factory=default_timeout)
    cuda_graphs: bool = True
    name: str = "cuda"
    pin_cores = False  # the host thread waits for the GPU

    def __post_init__(self):
        if self.timing is None:
            from .backend import cuda_timing

            self.timing = cuda_timing(self.profile, cold=False)
        self.fingerprint = self.profile.fingerprint
        self.worker = Worker(None, env={"TRITON_INTERPRET": "1"} if self.device == "cpu" else {})
        self.graph_key = f"{self.graph.name}:{id(self.graph)}"
        self.restarts_poisoned = 0

    def describe(self) -> dict:
        return {"backend": self.name, "fingerprint": self.fingerprint, "device": self.device,
                "graph": self.graph.name, "genome": self.genome.describe(), "timing": self.timing.to_json(),
                "cuda_graphs": self.cuda_graphs}

    def _job(self, impl: str, program: list[dict] | None = None) -> dict:
        return {"impl": impl, "graph": self.graph, "graph_key": self.graph_key, "seed": self.seed,
                "program": program, "timing": self.timing.to_json(), "flush_bytes": self.timing.flush_bytes,
                "device": self.device, "cuda_graph": self.cuda_graphs}

    def _run(self, job: dict) -> Outcome:
        return run_isolated(self, run_graph_job, job)

    def factory(self):
        """A picklable ``f(cpus) -> CudaGraphBackend`` measuring plans of the same genome (``cpus`` is ignored)."""
        t = self.timeout
        return partial(_remote, self.graph, self.genome, self.profile.to_dict(), self.timing.to_json(), self.seed,
                       self.device, (t.factor, t.lo, t.hi), self.cuda_graphs)

    def builder(self) -> None:
        """None: Triton compiles a plan's templates at its first launch, in the measuring worker."""
        return None

    def measure(self, candidates: Sequence[Candidate]) -> list[Outcome]:
        return [self._run(self._job("plan", self.program(c))) for c in candidates]

    def measure_built(self, candidate: Candidate, lib=None) -> Outcome:
        return self.measure([candidate])[0]

    def baselines(self, libraries: Sequence[str] | None = None) -> dict[str, Outcome]:
        """The graph op by op in torch eager on the device (``libraries`` is not consulted: a whole graph has
        that one library)."""
        return {"torch": self._run(self._job("torch"))}

    def remeasure(self, candidates: Sequence[Candidate], libraries: Sequence[str] | None = None,
                  rounds: int = 3) -> tuple[list[Outcome], dict[str, Outcome]]:
        """Plans and the torch baseline again, interleaved round by round; raw times of all rounds pooled."""
        libs = ["torch"] if libraries is None or "torch" in libraries else []  # () measures the plans only
        jobs = [(c.fingerprint, self._job("plan", self.program(c))) for c in candidates] + \
            [(n, self._job(n)) for n in libs]
        res = interleaved(self._run, jobs, rounds)
        return [res[c.fingerprint] for c in candidates], {n: res[n] for n in libs}

    def program(self, candidate: Candidate) -> list[dict]:
        """The program the genome extracts for ``candidate``: what the spec records and ``planforge run`` executes."""
        return self.genome.program(candidate.as_dict())

    def work(self) -> dict[str, float]:
        """The graph's FLOPs and the bytes any plan must move (inputs, weights, outputs; fp32)."""
        from ..cpu.graph import graph_work

        return graph_work(self.graph)

    def device_profile(self) -> dict:
        """The GPU profile with the fp32 roofline in the keys the report reads (as the kernel backend's)."""
        return profile_json(self.profile, "fp32")

    def close(self) -> None:
        self.worker.close()


def _remote(graph: Graph, genome, profile: dict, timing: dict, seed: int, device: str, timeout: tuple,
            cuda_graphs: bool = True, cpus=None) -> CudaGraphBackend:
    return CudaGraphBackend(graph, genome, GpuProfile.from_dict(profile), TimingConfig(**timing), seed, device,
                            AdaptiveTimeout(*timeout), cuda_graphs)


__all__ = ["CudaGraphBackend", "LIBRARIES", "run_graph_job", "tolerance"]
