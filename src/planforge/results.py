"""What a tuning run gives: ``TaskResult`` per task and ``TuneResult`` per run.

Plain result types, apart from the driver (``planforge.tuning``) that makes
them, so that the report and the API read them without importing the
driver, and the driver writes the report without a circle.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from . import __version__
from .costmodel import break_even_runs
from .outcome import Outcome
from .search import NoValidFinalist, Ranked, SearchResult, Walk
from .workloads import Task, Workload

FALLBACK_WITHIN = 0.95


@dataclass
class TaskResult:
    task: Task
    result: SearchResult
    walk: Walk | None
    strategy: dict[str, Any]
    proxy_spearman: float | None = None
    error: NoValidFinalist | None = None
    ranked: Ranked | None = None  # after re-measuring the finalists (the search's own when not re-measured)
    baselines: dict[str, Outcome] = field(default_factory=dict)
    funnel: list[dict[str, Any]] = field(default_factory=list)  # L0 stage counts, whole space -> measured
    bound: dict[str, Any] | None = None  # the analytic model's figures for the accepted plan
    l2: dict[str, Any] | None = None  # the L2 phase (``l2.L2Result.to_json``): each proposal's fate; None: not run
    # a part of a partitioned model that found no valid plan runs its library instead: {"to", "reason"}
    # (``library_instead``); None: the task has a plan, or no library ran either
    library_only: dict[str, str] | None = None

    @property
    def best_library(self) -> tuple[str, float] | None:
        ok = [(o.metric, name) for name, o in sorted(self.baselines.items()) if o.ok]
        return (min(ok)[1], min(ok)[0]) if ok else None

    @property
    def ratio_vs_library(self) -> float | None:
        lib = self.best_library
        return self.walk.accepted.metric / lib[1] if (lib and self.walk) else None

    @property
    def fallback(self) -> dict[str, str] | None:
        """The 95% rule: a tuned kernel slower than 95% of the best library's speed gives way to the library."""
        if self.library_only is not None:
            return self.library_only
        lib = self.best_library
        if lib is None or self.walk is None:
            return None
        ratio = self.walk.accepted.metric / lib[1]
        if ratio * FALLBACK_WITHIN <= 1.0:
            return None
        return {"to": lib[0], "reason": f"the tuned kernel reaches {100 / ratio:.0f}% of {lib[0]}'s speed "
                                        f"({self.walk.accepted.metric:.4g} s vs {lib[1]:.4g} s), below the "
                                        f"{100 * FALLBACK_WITHIN:.0f}% rule"}

    @property
    def planned(self) -> bool:
        """Whether the plan can run this task: a plan passed validation, or its part runs the library instead."""
        return self.walk is not None or self.library_only is not None

    @property
    def latency(self) -> float:
        """The task's time in the whole plan as tuned: its accepted plan's, or its library's when it has none."""
        return self.walk.accepted.metric if self.walk is not None else self.baselines[self.library_only["to"]].metric

    @property
    def selected_latency(self) -> float | None:
        """Latency of what the plan runs: the tuned kernel, or the library it fell back to."""
        fb = self.fallback
        if fb:
            return self.baselines[fb["to"]].metric
        return self.walk.accepted.metric if self.walk else None

    @property
    def saved_s(self) -> float:
        """Time saved per execution by the accepted plan over the first plan measured."""
        first = self.result.first_measured
        if first is None or self.walk is None:
            return 0.0
        return (first.outcome.metric - self.selected_latency) * self.task.weight


# ``f(spec_path, workload) -> the plan as a callable``: given by the caller that can load plans (the API's
# ``planforge.load``), which sits above the driver, so the result does not import it.
PlanLoader = Callable[[Path, Workload], Any]


@dataclass
class TuneResult:
    workload: Workload
    tasks: list[TaskResult]
    spec: dict[str, Any] | None
    spec_path: Path | None
    run_id: str
    resumed: bool
    records_path: Path
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    report_path: Path | None = None  # OUT/report.html, rendered from OUT/run.json
    target: str = ""  # the device fingerprint of ``tasks`` and ``spec``
    # every device fingerprint tuned (a heterogeneous cluster tunes each kind of machine), ``target`` included
    by_target: dict[str, list[TaskResult]] = field(default_factory=dict)
    specs: dict[str, Path] = field(default_factory=dict)  # the spec written per device fingerprint
    plan_loader: PlanLoader | None = None  # what ``plan`` loads the spec with (``tune(plan_loader=...)``)
    end_to_end: Any = None  # the whole plan's figures (``endtoend.EndToEnd``) for a partitioned model, else None

    @property
    def plan(self):
        """The chosen plan as a callable (the spec loaded by ``plan_loader``); graph workloads only."""
        if self.spec_path is None:
            raise ValueError("this run wrote no spec (no output folder, or no valid finalist): nothing to load")
        if self.plan_loader is None:
            raise ValueError(f"this run was given no plan loader: load {self.spec_path} with planforge.load")
        return self.plan_loader(self.spec_path, self.workload)

    @property
    def saved_s(self) -> float:
        return sum(t.saved_s for t in self.tasks)

    @property
    def break_even(self) -> float:
        return break_even_runs(self.seconds, self.saved_s)

    @property
    def ok(self) -> bool:
        return all(t.planned for t in self.tasks)


def library_instead(tr: TaskResult) -> TaskResult:
    """``tr``, a part of a partitioned model whose finalists all failed, running its library instead when one ran
    (the part's op-by-op steps are exact): the rest of the model keeps its tuned plans and the spec says why."""
    lib = tr.best_library
    if tr.walk is not None or lib is None:
        return tr
    rejected = tr.error.rejected if tr.error else ()
    reasons = list(dict.fromkeys(r for f in rejected for r in f.reasons))  # each once, in rank order
    why = (f"all {len(rejected)} finalists rejected: {'; '.join(reasons)}"[:300] if rejected
           else "no plan was measured successfully")
    return replace(tr, library_only={"to": lib[0], "reason": f"no valid plan ({why}): the part runs {lib[0]}"})


def toolchain() -> dict[str, str]:
    """Versions of what a spec's times depend on."""
    import numpy
    import scipy

    return {"planforge": __version__, "python": platform.python_version(), "numpy": numpy.__version__,
            "scipy": scipy.__version__}
