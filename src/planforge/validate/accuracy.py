"""The accuracy budget in the finalist walk: a quantised plan's error measured on validation inputs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..quant import Accuracy
from ..space import Candidate

FORMAT_KNOB = "wfmt"
BLOCK_KNOB = "qblock"
ACT_KNOB = "act"


def format_of(c: Candidate) -> str:
    return c.as_dict().get(FORMAT_KNOB, "fp32")


def step_format(knobs: dict[str, Any] | None) -> str:
    """The weight format a plan step's knobs read: ``fp32``; ``bf16``, ``int8``, ``int8+a8`` (dynamic int8
    activations), ``int4:BLOCK``; or, for a fused MLP's per-layer formats, theirs joined by ``/``."""
    if not knobs:
        return "fp32"
    layers = sorted((int(k[len(FORMAT_KNOB):]), v) for k, v in knobs.items()
                    if k.startswith(FORMAT_KNOB) and k[len(FORMAT_KNOB):].isdigit())
    fmts = [v for _, v in layers] if layers else [knobs.get(FORMAT_KNOB, "fp32")]
    block = knobs.get(BLOCK_KNOB)
    named = [f"int4:{block}" if f == "int4" else
             ("int8+a8" if f == "int8" and knobs.get(ACT_KNOB) == "int8" else f) for f in fmts]
    return "fp32" if all(f == "fp32" for f in fmts) else "/".join(named)


def program_formats(program: list[dict[str, Any]] | None) -> dict[str, str]:
    """The quantised steps of a plan's program (a spec's steps): e-class -> ``step_format``; empty: all fp32."""
    out = {}
    for s in program or []:
        f = step_format(s.get("knobs"))
        if f != "fp32":
            out[s["cls"]] = f
    return out


@dataclass
class AccuracyBudget:
    """Rejects a finalist whose weights are quantised beyond ``budget``, saying by how much.

    Parameters:
        budget: the task's accuracy budget (the default allows no quantisation: any format but fp32 is
            rejected without being run).
        output: ``f(candidate) -> (out, ref)``: the plan's output on validation inputs and the fp64 reference
            of the unquantised problem (the target's ``validation_output``).
    fp32 plans pass whatever the budget (their correctness is the measurement's fp32 tolerance check); each
    plan's measured error is kept (``measured``) for the spec."""

    budget: Accuracy
    output: Callable[[Candidate], tuple[np.ndarray, np.ndarray]]
    measured: dict[str, float] = field(default_factory=dict)

    def error(self, c: Candidate) -> float:
        if c.fingerprint not in self.measured:
            self.measured[c.fingerprint] = self.budget.measure(*self.output(c))
        return self.measured[c.fingerprint]

    def __call__(self, c: Candidate) -> str | None:
        fmt = format_of(c)
        if fmt == "fp32":
            return None
        if c.as_dict().get(ACT_KNOB) == "int8" and fmt == "int8":
            fmt = "int8 weights and activations"
        else:
            fmt += " weights"
        if not self.budget.allows_quantisation:
            return (f"accuracy: {fmt}, but no accuracy budget was stated, and the default allows no "
                    f"quantisation (state one, e.g. accuracy=max_rel_err:0.01)")
        why = self.budget.excess(self.error(c))
        return f"accuracy: {fmt}: {why}" if why else None

    def record(self, c: Candidate) -> dict[str, Any]:
        """What the spec records of the chosen plan: its format, its measured error, its tiles and the budget."""
        knobs = c.as_dict()
        fmt = knobs.get(FORMAT_KNOB, "fp32")
        act = knobs.get(ACT_KNOB, "fp32") if fmt == "int8" else "fp32"
        return {"format": fmt, "block": knobs.get(BLOCK_KNOB) if fmt == "int4" else None, "activations": act,
                "error": {"metric": self.budget.metric, "value": self.error(c)},
                "tiles": {k: v for k, v in knobs.items() if k not in (FORMAT_KNOB, BLOCK_KNOB, ACT_KNOB)},
                "budget": self.budget.to_json()}


def plan_verdict(budget: Accuracy, fmts: dict[str, str], error: Callable[[], float]) -> str | None:
    """Why a plan with the quantised steps ``fmts`` (``program_formats``) is over ``budget``, saying by how much
    (``error()``: its measured error, called only when there is a budget to hold it to), or None."""
    if not fmts:
        return None
    names = ", ".join(f"{k} {f}" for k, f in sorted(fmts.items()))
    if not budget.allows_quantisation:
        return (f"accuracy: quantised weights ({names}), but no accuracy budget was stated, and the default "
                f"allows no quantisation (state one, e.g. accuracy=max_rel_err:0.01)")
    why = budget.excess(error())
    return f"accuracy: {names}: {why}" if why else None


@dataclass
class PlanAccuracy:
    """The accuracy budget of a whole-graph plan (a model, or a part of one) in the finalist walk (its outputs on
    several input draws: the worst counts).

    Parameters:
        budget: the task's budget; the default (none stated) rejects any plan with a quantised step unrun.
        formats: ``f(candidate) -> {e-class: format}``: the plan's quantised steps (``program_formats``).
        output: ``f(candidate) -> (outs, refs)``: the plan built here and run on validation inputs (another
            seed than the search's, or the user's example inputs), and the fp64 reference of the unquantised
            graph on them.
        judged_on: what those inputs are, in words (recorded in the spec as ``inputs``).
    A plan with no quantised step passes (the measurement checked it at fp32 tolerance); the error is judged on
    the graph's outputs, the worst counting, so a chain of quantised layers is held to one budget for the whole
    of it, not per layer."""

    budget: Accuracy
    formats: Callable[[Candidate], dict[str, str]]
    output: Callable[[Candidate], tuple[list[np.ndarray], list[np.ndarray]]]
    judged_on: str = ""  # what the validation inputs are, for the spec
    draws: list = field(default_factory=list)  # the validation inputs themselves (for inspection)
    measured: dict[str, float] = field(default_factory=dict)

    def error(self, c: Candidate) -> float:
        if c.fingerprint not in self.measured:
            outs, refs = self.output(c)
            self.measured[c.fingerprint] = self.budget.worst(self.budget.measure(o, r) for o, r in zip(outs, refs))
        return self.measured[c.fingerprint]

    def __call__(self, c: Candidate) -> str | None:
        return plan_verdict(self.budget, self.formats(c), lambda: self.error(c))

    def record(self, c: Candidate) -> dict[str, Any]:
        """What the spec records of the chosen plan: each quantised step's format, the whole output's measured
        error on the validation inputs, and the budget."""
        return {"formats": self.formats(c), "error": {"metric": self.budget.metric, "value": self.error(c)},
                "budget": self.budget.to_json(), "judged_on": "the task's outputs",
                **({"inputs": self.judged_on} if self.judged_on else {})}


__all__ = ["ACT_KNOB", "PlanAccuracy", "AccuracyBudget", "BLOCK_KNOB", "FORMAT_KNOB", "format_of", "plan_verdict", "program_formats", "step_format"]
