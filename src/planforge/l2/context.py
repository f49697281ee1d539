"""The task context an L2 proposer sees: plain data, built once per triggered task.

A proposer reads what the search learnt about one task: its problem and shapes,
the space's knobs with their values and restrictions, the device profile, the
roofline verdict of the best plan so far, the ranked top-k with times, the
failures by category and the libraries' times. It is all JSON-able, so the
same object is what the LLM proposer turns into its prompt and what the
playbook's rule conditions are evaluated against (``variables``).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..outcome import Outcome
from ..space import Candidate, Space

TOP_K = 8          # ranked plans a context carries
FAILURES = 6       # failure messages it carries (their categories are all counted)
MESSAGE_CHARS = 160


@dataclass(frozen=True)
class Ranked:
    """One measured plan of the context's top-k: its knobs and median seconds."""

    plan: dict[str, Any]
    latency_s: float


@dataclass
class TaskContext:
    """What a proposer is told about one task.

    Parameters:
        task: the task's key (``gemv_512x512_bias_relu``).
        template: the template or backend kind (``gemm``, ``gemv``, ``table``).
        problem: the problem as JSON (op, dims, epilogue), {} where unknown.
        space: the task's whole space (knobs, values, restrictions, constants).
        device: the device profile as JSON (``DeviceProfile.to_dict``), or None (a table).
        incumbent: the best plan so far (what a proposal must beat), or None before any was measured.
        incumbent_s: its measured median seconds, or None.
        top: the ranked top-k, best first.
        failures: counts per invalid category (and ``rejected``) of the search.
        failure_examples: a few ``category: message`` lines.
        roofline: the analytic model's figures for the incumbent (``bound_s``, ``limiter``,
            ``intensity``, ``of_bound``), or None without one.
        libraries: the library baselines' median seconds.
        measured: fingerprints of every candidate the search measured for this task, and ``screened``: those
            it refused before measuring (the roofline screen, a restriction); proposals are deduplicated
            against both (a refused one is in the records already, under this run).
    """

    task: str
    template: str
    problem: dict[str, Any]
    space: Space
    device: dict[str, Any] | None = None
    incumbent: Candidate | None = None
    incumbent_s: float | None = None
    top: list[Ranked] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    failure_examples: list[str] = field(default_factory=list)
    roofline: dict[str, Any] | None = None
    libraries: dict[str, float] = field(default_factory=dict)
    measured: frozenset[str] = frozenset()
    screened: frozenset[str] = frozenset()

    @property
    def base(self) -> Candidate:
        """The plan a partial proposal is completed from: the incumbent, else the space's first valid point."""
        if self.incumbent is not None:
            return self.incumbent
        first = next(self.space.enumerate(), None)
        if first is None:
            raise ValueError(f"task {self.task}: its space has no valid point, nothing to propose from")
        return first

    def variables(self) -> dict[str, Any]:
        """The names a playbook condition may use: the space's constants (``m``, ``n``, ``k``, ``vregs``,
        cache sizes), the device's cores and lanes, the problem's operand bytes and the roofline verdict.
        Absent facts are absent names (a condition that needs one does not hold)."""
        v: dict[str, Any] = {k: x for k, x in self.space.constants.items() if isinstance(x, (int, float, str, bool))}
        d = self.device or {}
        if d.get("physical_cores"):
            v["cores"] = int(d["physical_cores"])
        if d.get("vector_lanes_fp32"):
            v["lanes"] = int(d["vector_lanes_fp32"])
        for level, key in (("L1d", "l1_bytes"), ("L2", "l2_bytes"), ("L3", "l3_bytes")):
            c = (d.get("caches") or {}).get(level)
            if isinstance(c, Mapping) and c.get("bytes"):
                v.setdefault(key, int(c["bytes"]))
                if level != "L1d":
                    v[f"{key}_all"] = int(c["bytes"]) * int(c.get("instances") or 1)
        dims = self.problem.get("dims") or []
        if self.template == "gemv" and len(dims) == 2:
            v["weight_bytes"] = 4 * dims[0] * dims[1]
        elif self.template == "gemm" and len(dims) == 3:
            v["weight_bytes"] = 4 * dims[1] * dims[2]
        r = self.roofline or {}
        if r.get("limiter"):
            v["memory_bound"] = int(r["limiter"] != "compute")
            v["limiter"] = str(r["limiter"])
        if r.get("of_bound") is not None:
            v["of_bound"] = float(r["of_bound"])
        if self.incumbent_s is not None and self.libraries:
            v["vs_library"] = self.incumbent_s / min(self.libraries.values())
        v["template"] = self.template
        return v

    def to_json(self) -> dict[str, Any]:
        """The context as JSON: what the LLM's prompt states and run.json keeps."""
        d = self.device or {}
        device = {k: d[k] for k in ("cpu_model", "arch", "isa", "vector_lanes_fp32", "physical_cores", "threads",
                                    "peak_flops_all", "call_overhead_s") if k in d}
        if d.get("caches"):
            device["caches"] = {name: {"bytes": c.get("bytes"), "instances": c.get("instances")}
                                for name, c in d["caches"].items() if isinstance(c, Mapping)}
        return {
            "task": self.task, "template": self.template, "problem": self.problem,
            "space": self.space.describe() | {"constants": {k: v for k, v in self.space.constants.items()
                                                             if isinstance(v, (int, float, str, bool))}},
            "device": device or None,
            "incumbent": self.incumbent.as_dict() if self.incumbent is not None else None,
            "incumbent_s": self.incumbent_s,
            "top": [{"plan": r.plan, "latency_s": r.latency_s} for r in self.top],
            "failures": dict(self.failures), "failure_examples": list(self.failure_examples),
            "roofline": self.roofline, "libraries": dict(self.libraries),
        }


def build_context(task: str, space: Space, backend, trials: Sequence[tuple[Candidate, Outcome]],
                  incumbent: tuple[Candidate, float] | None = None, roofline: Mapping[str, Any] | None = None,
                  libraries: Mapping[str, Outcome] | None = None, measured: Sequence[str] = ()) -> TaskContext:
    """The context of ``task`` from its search's ``trials`` (candidate, outcome pairs) on ``backend``.

    ``incumbent``: the plan and seconds to beat (default: the fastest measured trial); ``roofline``: the
    analytic model's row for it; ``libraries``: the baselines' outcomes; ``measured``: fingerprints measured
    besides the trials (the whole task's, default just the trials')."""
    desc = backend.describe()
    problem = desc.get("problem") or {}
    # a kernel's template, a whole graph's plan ("graph": its genes choose e-nodes), else the backend's kind
    template = str(desc.get("template") or problem.get("op") or ("graph" if "graph" in desc else None)
                   or desc.get("backend") or "unknown")
    ok = sorted(((o.metric, c) for c, o in trials if o.ok and o.metric is not None and math.isfinite(o.metric)),
                key=lambda x: x[0])
    top, seen = [], set()
    for t, c in ok:
        if c.fingerprint not in seen and len(top) < TOP_K:
            seen.add(c.fingerprint)
            top.append(Ranked(c.as_dict(), t))
    if incumbent is None and ok:
        incumbent = (ok[0][1], ok[0][0])
    counts = Counter(o.category if o.status == "invalid" else o.status for _, o in trials if not o.ok)
    examples = [f"{o.category or o.status}: {o.message[:MESSAGE_CHARS]}" for _, o in trials if not o.ok][:FAILURES]
    libs = {n: o.metric for n, o in sorted((libraries or {}).items()) if o.ok}
    return TaskContext(task, template, dict(problem), space, backend.device_profile(),
                       incumbent[0] if incumbent else None, incumbent[1] if incumbent else None, top,
                       dict(sorted(counts.items())), examples, dict(roofline) if roofline else None, libs,
                       frozenset([*measured, *(c.fingerprint for c, o in trials if o.status != "rejected")]),
                       frozenset(c.fingerprint for c, o in trials if o.status == "rejected"))
