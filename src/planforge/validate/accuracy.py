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


__all__ = ["ACT_KNOB", "AccuracyBudget", "BLOCK_KNOB", "FORMAT_KNOB", "format_of"]
