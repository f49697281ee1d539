"""Graph backend: measure whole plans (a genome's extracted program) on the CPU.

Each candidate's template steps are built (in parallel, content-hash cached),
then the plan is loaded and timed end to end in the isolated worker, after its
output is checked against the fp64 reference of the original graph. The
library baseline is the same graph run op by op with numpy.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from ...ir import Graph
from ...ir.graph import apply_op
from ...ops import REGISTRY
from .build import artifact, build_many, install
from .templates import TEMPLATES
from ...measure import AdaptiveTimeout, TimingConfig, Worker
from ...measure.timing import timed
from ...outcome import Outcome
from ...measure.isolated import LOG_LIMIT, measure_isolated
from ...measure.pooled import Pooled
from ...space import Candidate
from .plan import Plan
from .scrub import scrubber

U32 = 2.0**-24
_prepared: dict[str, Any] = {}


def template_source(problem, knobs: dict) -> tuple[str, bool]:
    t = TEMPLATES[problem.op]
    return t.source(problem, knobs), t.openmp(knobs)


def tolerance(graph: Graph, ref: list[np.ndarray]) -> float:
    """Absolute tolerance for fp32 plans: 8 u times the summed reduction lengths of the
    graph's matmuls (its error grows with them), scaled by the output's magnitude."""
    shapes = graph.shapes()
    terms = [(REGISTRY[n.op].tolerance_terms, n) for n in graph.nodes if REGISTRY[n.op].tolerance_terms]
    ktot = sum(f([shapes[i] for i in n.inputs]) for f, n in terms) or 1
    scale = 1.0 + max(float(np.abs(r).max()) for r in ref)
    return 8.0 * ktot * U32 * scale


def numpy_forward(graph: Graph) -> callable:
    """The graph op by op in numpy fp32: how a numpy user runs it (the library baseline)."""
    params = {k: v.astype(np.float32) for k, v in graph.params.items()}
    nodes = [(n.op, n.inputs, n.attrs, n.output) for n in graph.nodes]
    names = list(graph.inputs)
    outs = graph.outputs

    def run(*xs):
        env = dict(params)
        env.update(zip(names, xs))
        for op, ins, attrs, out in nodes:
            env[out] = apply_op(op, [env[i] for i in ins], attrs)
        return [env[o] for o in outs]

    return run


def _prepared_graph(job: dict) -> tuple[Graph, list[np.ndarray], list[np.ndarray], float]:
    key = job["graph_key"]
    if key not in _prepared:
        _prepared.clear()
        g: Graph = job["graph"]
        xs = g.example_inputs(job.get("seed", 0))
        ref = g.evaluate(*xs)
        _prepared[key] = (g, xs, ref, tolerance(g, ref))
    return _prepared[key]


def quantised_error(program, outs: list[np.ndarray], ref: list[np.ndarray], accuracy: dict | None) -> str | None:
    """Why a plan whose steps read quantised weights is over its accuracy budget (``accuracy``: the task's
    ``Accuracy.to_json()``, or None: the default, which allows no quantisation), or None: judged on the whole
    output against the fp64 reference, the worst output counting."""
    from ...quant import Accuracy
    from ...validate.accuracy import plan_verdict, program_formats

    budget = Accuracy.from_json(accuracy) if accuracy else Accuracy()
    return plan_verdict(budget, program_formats(program),
                        lambda: budget.worst(budget.measure(o, r) for o, r in zip(outs, ref)))


def run_plan_job(job: dict) -> dict:
    """In the worker: load the plan, check it against the reference (a quantised plan: against its accuracy
    budget), time it."""
    g, xs, ref, tol = _prepared_graph(job)
    cfg = TimingConfig(**job.get("timing", {}))
    if job["impl"] == "numpy":
        fwd = numpy_forward(g)
        out = fwd(*xs)
        fn = lambda: fwd(*xs)  # noqa: E731
    else:
        plan = Plan(g, job["program"], job["libs"], job["problems"])
        out = plan(*xs)
        for v, x in zip(plan.input_views, xs):
            if v is not None:
                np.copyto(v, x)
        fn = plan.run
    for o in out:
        if not np.all(np.isfinite(o)):
            return {"status": "correctness", "message": "non-finite output"}
    if job["impl"] != "numpy" and job.get("quantised"):
        why = quantised_error(job["program"], out, ref, job.get("accuracy"))
        if why:
            return {"status": "correctness", "message": why}
        return {"status": "ok", **timed(fn, cfg, _scrub(cfg, plan.input_views, xs))}
    for o, r in zip(out, ref):
        err = float(np.abs(o.astype(np.float64) - r).max())
        if err > tol:
            return {"status": "correctness", "message": f"max |out - ref| = {err:.3g} exceeds the tolerance {tol:.3g}"}
    views = plan.input_views if job["impl"] != "numpy" else ()
    # times, and the other processes' share of the worker's CPUs
    return {"status": "ok", **timed(fn, cfg, _scrub(cfg, views, xs))}


def _scrub(cfg: TimingConfig, views, xs) -> Callable[[], None] | None:
    """Before each sample, with ``cfg.scrub_bytes``: the weights out of the caches, the part's inputs (where the
    plan reads them: its input views, else the arrays) in them (``scrub.scrubber``); None: hot."""
    if not cfg.scrub_bytes:
        return None
    warm = [v if v is not None else x for v, x in zip(list(views) or [None] * len(xs), xs)]
    return scrubber(cfg.scrub_bytes, len(os.sched_getaffinity(0)), warm)


@dataclass
class GraphBackend:
    """Measures plans of ``genome`` for ``graph`` on this machine (fingerprint from ``profile``).

    Parameters:
        graph: the model graph; its fp64 evaluation is the reference every plan is checked against.
        genome: the plan space over the graph's saturated e-graph.
        profile: the DeviceProfile of this machine (its fingerprint tags every time).
        timing: the timing protocol (default ``TimingConfig()``).
        seed: seeds the inputs (default 0).
        memory_limit: address-space limit of the measurement worker, bytes (default none).
        timeout: adaptive per-measurement timeout (default 10x the fastest, 5..120 s).
        cpus: CPUs the measurement worker is pinned to (default None: not pinned).
        accuracy: the accuracy budget a plan with quantised weights is judged by instead of the fp32
            tolerance (``Accuracy.to_json()``; default None: the default budget, no quantisation).
    """

    graph: Graph
    genome: Any
    profile: Any
    timing: TimingConfig = field(default_factory=TimingConfig)
    seed: int = 0
    memory_limit: int | None = None
    timeout: AdaptiveTimeout = field(default_factory=AdaptiveTimeout)
    name: str = "cpu"
    cpus: tuple[int, ...] | None = None
    accuracy: dict | None = None  # the task's accuracy budget (``Accuracy.to_json()``); None: no quantisation
    pin_cores = True  # plans run on this node's cores: executors give each slot its own

    def __post_init__(self):
        self.fingerprint = self.profile.fingerprint
        self.worker = Worker(self.memory_limit, cpus=self.cpus)
        self.graph_key = f"{self.graph.name}:{id(self.graph)}"
        self._built: dict[str, tuple[dict, dict, list]] = {}
        self.build_seconds = 0.0

    def describe(self) -> dict:
        return {"backend": self.name, "fingerprint": self.fingerprint, "graph": self.graph.name,
                "genome": self.genome.describe()}

    def _build(self, candidates: Sequence[Candidate]) -> list[tuple[dict, dict, list] | Outcome]:
        t0 = time.perf_counter()
        per, jobs = [], []
        for c in candidates:
            cfg = c.as_dict()
            program = self.genome.program(cfg)
            steps = {s["cls"]: s for s in program}
            items = []
            for nid, problem, knobs in self.genome.template_steps(cfg):
                from ...space.genome import short

                cls = short(self.genome.eg.node(nid).eclass)
                src, omp = template_source(problem, knobs)
                items.append((cls, problem, len(jobs)))
                jobs.append((src, omp))
            per.append((program, steps, items))
        built = build_many(jobs) if jobs else []
        out: list[tuple[dict, dict, list] | Outcome] = []
        for program, steps, items in per:
            libs, problems, err = {}, {}, None
            for cls, problem, j in items:
                b, e, log = built[j]
                if b is None:
                    err = Outcome.invalid("compile", f"step {cls}: {e}\n{log[:LOG_LIMIT]}")
                    break
                libs[cls] = str(b.path)
                problems[cls] = problem
            out.append(err or (program, libs, problems))
        self.build_seconds += time.perf_counter() - t0
        return out

    def _job(self, impl: str, program=None, libs=None, problems=None) -> dict:
        from ...validate.accuracy import program_formats

        return {"impl": impl, "graph": self.graph, "graph_key": self.graph_key, "seed": self.seed,
                "program": program, "libs": libs, "problems": problems, "timing": self.timing.to_json(),
                "quantised": bool(program_formats(program)), "accuracy": self.accuracy}

    def _run(self, job: dict) -> Outcome:
        return measure_isolated(self.worker, run_plan_job, job, self.timeout)

    def factory(self):
        """A picklable ``f(cpus) -> GraphBackend`` measuring plans of the same
        genome on the same graph wherever it is called (executors make one per
        slot; the genome travels whole, so every copy's fingerprints agree)."""
        t = self.timeout
        return partial(_remote_graph_backend, self.graph, self.genome, self.profile, self.timing.to_json(),
                       self.seed, self.memory_limit, (t.factor, t.lo, t.hi), accuracy=self.accuracy)

    def builder(self) -> "GraphBuild":
        """The executors' build stage: builds a plan's template steps in
        whichever thread, process or node calls it, into that node's build
        cache, so that a measuring slot only measures (``measure_built``)."""
        return GraphBuild(self.factory())

    def measure_built(self, candidate: Candidate, lib: tuple[dict, dict, list]) -> Outcome:
        """Measure ``candidate`` from its built parts ``lib`` (program, libraries, problems; see ``plan_parts``)."""
        self._built[candidate.fingerprint] = lib
        return self._run(self._job("plan", *lib))

    def measure(self, candidates: Sequence[Candidate]) -> list[Outcome]:
        outs = []
        for c, b in zip(candidates, self._build(candidates)):
            if isinstance(b, Outcome):
                outs.append(b)
                continue
            self._built[c.fingerprint] = b
            outs.append(self._run(self._job("plan", *b)))
        return outs

    def baselines(self, libraries: Sequence[str] | None = None) -> dict[str, Outcome]:
        """The graph op by op in numpy (the only library a whole graph has; ``libraries`` is not consulted)."""
        return {"numpy": self._run(self._job("numpy"))}

    def remeasure(self, candidates: Sequence[Candidate], libraries: Sequence[str] | None = None,
                  rounds: int = 3) -> tuple[list[Outcome], dict[str, Outcome]]:
        """Plans and the numpy baseline again, interleaved round by round; raw times of all rounds pooled."""
        times = Pooled()  # every round's raw times and the highest load any round saw
        failed: dict[str, Outcome] = {}
        libs = ["numpy"] if libraries is None or "numpy" in libraries else []  # () measures the plans only
        keys = [c.fingerprint for c in candidates] + libs
        for _ in range(rounds):
            for c in candidates:
                if c.fingerprint in failed:
                    continue
                b = self._built.get(c.fingerprint) or self._build([c])[0]
                o = b if isinstance(b, Outcome) else self._run(self._job("plan", *b))
                if o.ok:
                    times.add(c.fingerprint, o)
                else:
                    failed[c.fingerprint] = o
            if libs and "numpy" not in failed:
                o = self._run(self._job("numpy"))
                if o.ok:
                    times.add("numpy", o)
                else:
                    failed["numpy"] = o
        res = {k: failed.get(k) or times.outcome(k) for k in keys}
        return [res[c.fingerprint] for c in candidates], {k: res[k] for k in libs}

    def program(self, candidate: Candidate) -> list[dict]:
        """The program the genome extracts for ``candidate``: what the spec records and ``planforge run`` executes."""
        return self.genome.program(candidate.as_dict())

    def work(self) -> dict[str, float]:
        """The graph's FLOPs and the bytes any plan must move (inputs, weights, outputs; fp32)."""
        return graph_work(self.graph)

    def device_profile(self) -> dict:
        return self.profile.to_dict()

    def plan_parts(self, c: Candidate) -> tuple[dict, dict, list] | Outcome:
        """(program, libs, problems) of a candidate, building what it needs."""
        return self._built.get(c.fingerprint) or self._build([c])[0]

    def close(self) -> None:
        self.worker.close()


@dataclass
class GraphBuild:
    """The build stage of a GraphBackend (a ``planforge.measure.executor.BuildStage``):
    ``make`` is the backend's factory, called once per process that builds, so
    that a build thread or a Ray build actor builds plans exactly as the
    backend does. A built plan is its parts (program, library path per step,
    problems); it travels to another node with each library's cache name and
    bytes."""

    make: Any
    _backend: Any = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict:
        return {"make": self.make}  # a copy builds with a backend of its own process

    def __setstate__(self, state: dict) -> None:
        self.make, self._backend = state["make"], None

    def __call__(self, candidates: Sequence[Candidate]) -> list[tuple[dict, dict, list] | Outcome]:
        if self._backend is None:  # (its worker process is started only to measure, never here)
            self._backend = self.make(None)
        return self._backend._build(candidates)

    def device(self) -> str:
        from .kernel import node_device

        return node_device()

    def pack(self, lib: tuple[dict, dict, list]) -> tuple[dict, dict, list]:
        program, libs, problems = lib
        return program, {cls: artifact(path) for cls, path in libs.items()}, problems

    def install(self, packed: tuple[dict, dict, list]) -> tuple[dict, dict, list]:
        program, libs, problems = packed
        return program, {cls: str(install(*art)) for cls, art in libs.items()}, problems


def graph_work(graph: Graph) -> dict[str, float]:
    """FLOPs and the bytes any plan must move (inputs, weights, outputs; fp32) of a whole graph."""
    import math

    shapes = graph.shapes()
    flops = sum(REGISTRY[n.op].flops([shapes[i] for i in n.inputs], shapes[n.output], n.attrs) for n in graph.nodes)
    moved = sum(math.prod(s) for s in graph.inputs.values()) + sum(math.prod(shapes[o]) for o in graph.outputs)
    return {"flops": flops, "bytes": 4.0 * moved + float(graph.param_bytes())}


def _remote_graph_backend(graph: Graph, genome, profile, timing: dict, seed: int, memory_limit: int | None,
                          timeout: tuple[float, float, float], cpus: tuple[int, ...] | None = None,
                          accuracy: dict | None = None) -> GraphBackend:
    """Rebuild a GraphBackend in an executor slot. On another kind of machine the
    slot's own profile is used, so its times carry its own fingerprint."""
    from .kernel import node_device
    from .probe import get_profile

    if node_device() != profile.fingerprint:
        profile = get_profile(quick=True)
    return GraphBackend(graph, genome, profile, TimingConfig(**timing), seed, memory_limit, AdaptiveTimeout(*timeout),
                        cpus=cpus, accuracy=accuracy)
