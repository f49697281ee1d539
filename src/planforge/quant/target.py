"""What a target offers for quantised plans (the CPU target implements it)."""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np


@runtime_checkable
class QuantTarget(Protocol):
    """A target whose templates read weights in formats other than fp32."""

    def weight_formats(self, problem) -> tuple[str, ...]:
        """The formats ``problem``'s template reads (fp32 first)."""

    def quant_space(self, problem, formats: Sequence[str], blocks: Sequence[int] | None = None) -> Any:
        """``problem``'s knob space with the weight format as a gene among ``formats`` (int4 blocks among
        ``blocks``)."""

    def format_errors(self, problem, formats: Sequence[str], blocks: Sequence[int], seed: int,
                      metric) -> dict[tuple[str, int], float]:
        """Per (format, int4 block) the error ``metric(out, ref)`` of the problem with weights of that format."""

    def validation_output(self, problem, knobs: dict[str, Any], seed: int) -> tuple[np.ndarray, np.ndarray]:
        """A candidate's output on the inputs of ``seed`` and the fp64 reference of the unquantised problem."""


__all__ = ["QuantTarget"]
