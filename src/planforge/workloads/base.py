"""Workload, Task and Manifest: what the user asked to tune."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..space import Candidate, Space, fingerprint_of


class WorkloadError(ValueError):
    """An unknown workload, a bad workload option, or a target the workload cannot run on."""


@dataclass(frozen=True)
class Manifest:
    """Identifies a workload exactly: id, concrete shapes, dtypes and options."""

    workload: str
    shapes: dict[str, Any] = field(default_factory=dict)
    dtypes: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, Any] | None = None  # the stated accuracy budget (planforge.quant.Budgets); None: default

    def to_json(self) -> dict[str, Any]:
        d = {"workload": self.workload, "shapes": self.shapes, "dtypes": self.dtypes, "options": self.options}
        if self.accuracy is not None:  # absent by default, so that an unquantised workload keeps its key
            d["accuracy"] = self.accuracy
        return d

    @property
    def key(self) -> str:
        return fingerprint_of(self.to_json())


@dataclass
class Task:
    """One independently tunable piece of a workload.

    Parameters:
        key: the task's name, unique within its workload.
        space: its plan space.
        backend: measures its candidates.
        weight: how often it runs per workload execution (default 1).
        cost_model: a proxy or model (``predict``), if the task has one.
        validators: applied to finalists in rank order.
        peak_bytes: a plan's peak memory, for the report and memory checks.
        seeds: candidates the strategy proposes first (default none), best first by the task's own pricing.
        lead_seeds: how many of ``seeds`` are proposed first at any budget (default 0); the others fill at most
            a third of the task's evaluations before the search's own proposals, and wait for its first phase
            to end otherwise (``tuning._task_search``).
        info: facts about the task's space for the summary and the spec.
        record: ``f(accepted candidate) -> dict``: what the spec records of the plan beyond its knobs (a
            quantised task's format, measured error, tiles and budget); default None.
    """

    key: str
    space: Space
    backend: Any
    weight: int = 1
    cost_model: Any = None
    validators: Sequence[Callable[[Candidate], str | None]] = ()
    peak_bytes: Callable[[Candidate], int] | None = None
    seeds: Sequence[Candidate] = ()        # candidates a strategy should try first (e.g. extracted plans)
    lead_seeds: int = 0                    # how many of them come first whatever the budget
    info: dict[str, Any] = field(default_factory=dict)  # facts for the summary and spec (e-graph size...)
    record: Callable[[Candidate], dict[str, Any]] | None = None


@dataclass
class Workload:
    """What ``load_workload`` builds: the ``manifest``, the ``tasks`` to tune, a one-line
    ``description``, and for a whole-model workload its ``graph`` (its weights: what a tuned plan
    is loaded with; default None: a kernel or table workload), its ``partition`` when it was cut
    into several parts (``rewrite.partition.Partition``; None when it is one task) and the seconds
    of each planning phase (``phases``: partition, saturation, extraction, genome)."""

    manifest: Manifest
    tasks: list[Task]
    description: str = ""
    graph: Any = None
    partition: Any = None
    phases: dict[str, float] = field(default_factory=dict)
    target: Any = None  # the Target its graph tasks were planned for (a graph workload's; else None)
    validation: Any = None  # with an accuracy budget, the model inputs quantised plans are judged on

    @property
    def name(self) -> str:
        return self.manifest.workload
