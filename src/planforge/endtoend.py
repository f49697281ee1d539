"""The task-level objective: the whole plan of a partitioned model, measured end to end, and what follows from it.

After every task has its accepted plan, the parts of the model are chained
(each task's plan, rebound to each of its parts' own weights) and timed over
many single calls, interleaved with the library baseline of the whole model
(the graph op by op in numpy): median and p99 of both, and each task's share
of the end-to-end time (weight x its latency), in Amdahl order.

A model imported from ONNX or torch is also timed against the runtimes a user
would run it with (``planforge.peers``: ONNX Runtime, OpenVINO, torch eager,
and torch.compile with the manifest option ``peers=compile``; ``peers=none``
times none), in the same interleaved rounds: their figures, or why one was
not timed, are recorded beside the library's, and the fastest of all is what
the whole plan is compared with (``fastest``, ``ratio_vs_fastest``).

For a chunked control policy (``workloads.objective.Objective``, kind
``control``) the figures also give the chunk's compute, the effective control
frequency with double buffering, and whether the target holds.

The 95% rule at task level: a task whose tuned plan is below 95% of its
library's speed is kept when its share of the end-to-end time is under a
threshold (default 5%) and the task-level target holds (the whole plan beats
the whole library, and the control target where there is one); otherwise
that task runs its library plan. Every decision is recorded with the share
and the reason.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from .measure.timing import TimingConfig, interleaved, time_fn
from .results import FALLBACK_WITHIN, TaskResult
from .workloads.objective import Objective

E2E_TIMING = TimingConfig(warmup_s=0.05, budget_s=0.4, min_repeats=100, max_repeats=3000, min_sample_s=0.0)
ROUND_CAP_S, MIN_ROUND_SAMPLES = 2.0, 10  # a slow runner's round: about this long, with at least this many calls


@dataclass
class EndToEnd:
    """The whole plan, measured: ``median_s``/``p99_s`` of single calls (``samples`` of them) against the library's,
    each task's share (Amdahl order), the control figures, and the task-level decisions."""

    median_s: float
    p99_s: float
    samples: int
    library: str
    library_median_s: float
    library_p99_s: float
    shares: list[dict[str, Any]] = field(default_factory=list)
    control: dict[str, Any] | None = None
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)
    objective: dict[str, Any] = field(default_factory=dict)
    # the original model's runtimes: name -> {"median_s", "p99_s", "settings"}, or {"skipped": why, "settings"}
    peers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # a plan with quantised parts: the whole output's error against the workload's budget (``whole_accuracy``)
    accuracy: dict[str, Any] | None = None

    @property
    def fastest(self) -> tuple[str, float]:
        """The fastest runner beside the plan: the library or a timed peer (name, median seconds)."""
        timed = [(self.library, self.library_median_s)] + [(k, v["median_s"]) for k, v in self.peers.items()
                                                            if "median_s" in v]
        return min(timed, key=lambda kv: kv[1])

    @property
    def ratio_vs_fastest(self) -> float:
        """The plan's median over the fastest runner's (below 1: the plan is faster)."""
        f = self.fastest[1]
        return self.median_s / f if f > 0 else math.inf

    @property
    def speedup(self) -> float:
        return self.library_median_s / self.median_s if self.median_s > 0 else math.inf

    @property
    def holds(self) -> bool:
        """The task-level target: faster than the library, and the control target where there is one."""
        return self.median_s <= self.library_median_s and (self.control is None or bool(self.control["holds"]))

    def to_json(self) -> dict[str, Any]:
        return {"median_s": self.median_s, "p99_s": self.p99_s, "samples": self.samples, "library": self.library,
                "library_median_s": self.library_median_s, "library_p99_s": self.library_p99_s,
                "speedup_vs_library": self.speedup, "holds": self.holds, "shares": self.shares,
                "control": self.control, "objective": self.objective,
                "decisions": {k: self.decisions[k] for k in sorted(self.decisions)},
                "peers": {k: self.peers[k] for k in sorted(self.peers)},
                "fastest": {"name": self.fastest[0], "median_s": self.fastest[1],
                            "ratio": self.ratio_vs_fastest},
                **({"accuracy": self.accuracy} if self.accuracy is not None else {})}


def decide(results: Sequence[TaskResult], objective: Objective, target_holds: bool) -> dict[str, dict[str, Any]]:
    """The task-level 95% rule for each task (see the module's docstring); ``target_holds``: whether the whole
    plan meets the task-level target with every task as tuned."""
    total = sum(tr.latency * tr.task.weight for tr in results) or 1.0
    out = {}
    for tr in results:
        share = tr.latency * tr.task.weight / total
        lib = tr.best_library
        ratio = tr.ratio_vs_library
        slow = ratio is not None and ratio * FALLBACK_WITHIN > 1.0
        if tr.walk is None:  # no valid plan: the part runs its library whatever the rule says
            d = {"decision": tr.library_only["to"], "share": share, "reason": tr.library_only["reason"]}
        elif not slow:
            d = {"decision": "tuned", "share": share, "reason": "within the 95% rule" if lib else "no library"}
        elif share < objective.share_threshold and target_holds:
            d = {"decision": "tuned", "share": share,
                 "reason": f"reaches {100 / ratio:.0f}% of {lib[0]}, below the 95% rule, but takes "
                           f"{100 * share:.1f}% of the end-to-end time (under {100 * objective.share_threshold:.0f}%) "
                           f"and the task-level target holds: kept off the critical path"}
        else:
            why = "the task-level target does not hold" if not target_holds else \
                f"its share {100 * share:.1f}% is at least {100 * objective.share_threshold:.0f}%"
            d = {"decision": lib[0], "share": share,
                 "reason": f"reaches {100 / ratio:.0f}% of {lib[0]}, below the 95% rule, and {why}: "
                           f"the task runs {lib[0]}"}
        out[tr.task.key] = d
    return out


def chain(graph, part, task_of: dict[int, str], programs: dict[str, list[dict] | None], target) -> Any:
    """The whole plan of a partitioned graph: per part (of ``part``, a ``rewrite.partition.Partition``), the
    program of its task (``task_of[part index]``; a program of None: the part's library plan) rebound from the
    task's first part to this part's own weights, built by ``target``, and chained in order
    (``targets.cpu.plan.ChainPlan``)."""
    from .targets.cpu.plan import ChainPlan, SharedArena, rebind

    first: dict[str, Any] = {}
    for p in part.parts:
        first.setdefault(task_of[p.index], p)
    steps = []
    # values earlier parts leave in arrays of their own every call: a later part reads them there in place, so
    # that a part boundary costs no copy (ResNet-18's nine parts copied 0.55 ms of activations a call)
    produced: dict[str, Any] = {}
    # and the values that live within a part share one region across the parts (``SharedArena``)
    arena = SharedArena(SharedArena.bound_of([prog for prog in programs.values() if prog is not None]))
    for p in part.parts:
        key = task_of[p.index]
        prog, rep = programs[key], first[key]
        if prog is not None:
            prog = rebind(prog, {**dict(zip(rep.inputs, p.inputs)), **dict(zip(rep.params, p.params))})
        ins = {g: produced[n] for g, n in zip(p.graph.inputs, p.inputs) if n in produced}  # fed in this order
        built = target.plan(p.graph, prog, inputs=ins or None, shared=arena)
        produced.update(zip(p.outputs, getattr(built, "out_views", ())))
        steps.append((built, p.inputs, p.outputs))
    return ChainPlan(graph, steps)


def task_of(workload) -> dict[int, str]:
    """Part index -> the key of its task, for a partitioned workload."""
    return {i: t.key for t in workload.tasks for i in t.info.get("instances", [])}


def partition_json(workload) -> dict[str, Any]:
    """What a spec records of the cut: why, and each part's task and structure (``load`` checks them)."""
    part = workload.partition
    owner = task_of(workload)
    return {"reason": part.reason, "tasks": len(part.keys), "dedupe": part.dedupe,
            "parts": [[owner[p.index], p.key] for p in part.parts], "phases": workload.phases}


def chain_from_spec(spec: dict[str, Any], graph, target) -> Any:
    """The whole plan a partitioned spec records, rebuilt for ``graph`` (cut again the same way, and checked
    part by part against the spec's structures)."""
    from .rewrite.partition import WHOLE_BELOW, partition

    rec = spec["partition"]

    def differs(part):
        return len(part.parts) != len(rec["parts"]) or any(p.key != k for p, (_, k) in zip(part.parts, rec["parts"]))

    whole_below = spec["manifest"]["options"].get("whole_below", WHOLE_BELOW)
    part = partition(graph, whole_below=whole_below)
    if differs(part):  # a spec tuned before a CNN's cuts carried NHWC tensors
        part = partition(graph, whole_below=whole_below, nhwc_cuts=False)
    if differs(part):
        raise ValueError(f"the graph does not cut into the parts the spec was tuned on ({len(part.parts)} parts "
                         f"here, {len(rec['parts'])} in the spec, or their structures differ)")
    programs = {k: (t["program"] if t.get("selected", "tuned") == "tuned" else None)
                for k, t in spec["tasks"].items()}
    return chain(graph, part, {i: t for i, (t, _) in enumerate(rec["parts"])}, programs, target)


def _percentile(ts: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(ts), q))


def measure(runners: dict[str, Callable[[], Any]], rounds: int = 3,
            cfg: TimingConfig = E2E_TIMING) -> dict[str, list[float]]:
    """Single-call times of each runner (the plan, the library, the model's runtimes), interleaved round by round
    (``measure.timing.interleaved``: each round in a fresh order, a pause before each turn, so that a runtime's
    pool spinning after its calls does not always take the cores of the same runner; raw times pooled),
    each slow one's rounds capped (``_fitted``)."""
    cfgs = {k: _fitted(f, cfg) for k, f in runners.items()}
    got = interleaved(runners, rounds, lambda k, f: time_fn(f, cfgs[k]))
    return {k: [t for ts in v for t in ts] for k, v in got.items()}


def _fitted(fn: Callable[[], Any], cfg: TimingConfig) -> TimingConfig:
    """``cfg`` with fewer repeats for a slow runner, so that one round of it takes about ``ROUND_CAP_S`` at
    most (never fewer than ``MIN_ROUND_SAMPLES``): a model whose library takes 0.3 s a call (on a busy machine)
    would otherwise spend 30 s a round on its ``min_repeats``."""
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    if one * cfg.min_repeats <= ROUND_CAP_S:
        return cfg
    n = max(MIN_ROUND_SAMPLES, int(ROUND_CAP_S / max(one, 1e-9)))
    return replace(cfg, min_repeats=n, max_repeats=n, warmup_s=min(cfg.warmup_s, one))


def _peers(workload, xs, ref, tol) -> list:
    """The original model's runtimes (``planforge.peers``) per the manifest's ``peers`` option: ``auto``
    (default: every installed one but torch.compile), ``compile`` (torch.compile too), ``none``."""
    from .peers import model_peers, peers_option

    mode = peers_option(workload.manifest.options)
    if mode == "none":
        return []

    return model_peers(workload.graph, xs, ref, tol, compile_torch=mode == "compile")


def end_to_end(workload, results: Sequence[TaskResult], objective: Objective, target, seed: int = 0,
               rounds: int = 3, peers: list | None = None) -> tuple[EndToEnd, Any, list]:
    """Decide per task, build the whole plan with those decisions, check it against the fp64 reference, and
    measure it against the whole library and the model's runtimes; returns the figures, the plan and the
    runtimes (``peers``: those of an earlier call on the same workload and seed, so that a second measurement,
    after L2 changed a task's plan, does not export and load the model into every runtime again)."""
    from .targets.cpu.graph import numpy_forward, tolerance
    from .validate.accuracy import program_formats

    g = workload.graph
    est_tuned = sum(tr.latency * tr.task.weight for tr in results)
    est_lib = sum(tr.best_library[1] * tr.task.weight for tr in results if tr.best_library) or math.inf
    control_est = objective.control(est_tuned, est_tuned)
    decisions = decide(results, objective, est_tuned <= est_lib and (control_est is None or control_est["holds"]))
    programs = {tr.task.key: (None if decisions[tr.task.key]["decision"] != "tuned"
                              else tr.task.backend.program(tr.walk.accepted.candidate)) for tr in results}
    plan = chain(g, workload.partition, task_of(workload), programs, target)
    xs = g.example_inputs(seed)
    ref = g.evaluate(*xs)
    out = plan(*xs)
    err = max(float(np.abs(o.astype(np.float64) - r).max()) for o, r in zip(out, ref))
    tol = tolerance(g, ref)
    if workload.validation and any(p and program_formats(p) for p in programs.values()):
        # a quantised plan is judged on the validation draws (the user's example inputs when given), worst counts
        outs, refs = [], []
        for d in workload.validation:
            outs += [o.copy() for o in plan(*d)]
            refs += g.evaluate(*d)
        accuracy = whole_accuracy(workload, programs, outs, refs)
    else:
        accuracy = whole_accuracy(workload, programs, out, ref)
    if accuracy is None and not err <= tol:
        raise ValueError(f"the chained plan of {workload.name} is wrong: max |out - ref| = {err:.3g} exceeds "
                         f"{tol:.3g}; every part passed on its own, so the chaining is at fault")
    fwd = numpy_forward(g)
    run = plan.feed
    peers = _peers(workload, xs, ref[0], tol) if peers is None else peers
    timed = [p for p in peers if p.run is not None]
    more = measure({"plan": lambda: run(*xs), "library": lambda: fwd(*xs), **{p.name: p.run for p in timed}},
                   rounds)
    mine, lib = more.pop("plan"), more.pop("library")
    peer_json = {p.name: ({"median_s": float(np.median(more[p.name])), "p99_s": _percentile(more[p.name], 99),
                           "settings": p.settings} if p.run is not None else {"skipped": p.why, "settings": p.settings})
                 for p in peers}
    med, p99 = float(np.median(mine)), _percentile(mine, 99)
    total = sum(tr.latency * tr.task.weight for tr in results) or 1.0
    shares = sorted(({"task": tr.task.key, "weight": tr.task.weight, "latency_s": tr.latency,
                      "share": tr.latency * tr.task.weight / total,
                      "ratio_vs_library": tr.ratio_vs_library} for tr in results), key=lambda d: -d["share"])
    e2e = EndToEnd(med, p99, len(mine), "numpy", float(np.median(lib)), _percentile(lib, 99), shares,
                   objective.control(med, p99), decisions, objective.to_json(), peer_json, accuracy)
    return e2e, plan, peers


def whole_accuracy(workload, programs: dict[str, list[dict] | None], out, ref) -> dict[str, Any] | None:
    """The whole output's error against the workload's accuracy budget when a task's plan reads quantised
    weights (None otherwise: the plan is then held to the fp32 tolerance): the value, the budget, the quantised
    tasks, and ``excess`` (why it is over, saying by how much; None within it). Each part was within its share
    of the budget; their errors need not add up exactly, which is what this checks."""
    from .quant import Accuracy
    from .validate.accuracy import program_formats

    quantised = sorted(k for k, p in programs.items() if p and program_formats(p))
    if not quantised:
        return None
    stated = (workload.manifest.accuracy or {})
    budget = Accuracy.from_json(stated) if stated.get("bound") is not None else \
        Accuracy.from_json(next(iter(stated.get("tasks", {}).values()), {}))
    value = budget.worst(budget.measure(o, r) for o, r in zip(out, ref))
    return {"metric": budget.metric, "value": value, "budget": budget.to_json(), "quantised_tasks": quantised,
            "excess": budget.excess(value)}


__all__ = ["E2E_TIMING", "EndToEnd", "chain", "chain_from_spec", "decide", "end_to_end", "measure", "partition_json",
           "task_of", "whole_accuracy"]
