"""What a target offers for quantised plans (the CPU target implements it)."""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np


@runtime_checkable
class QuantTarget(Protocol):
    """A target whose templates read weights in formats other than fp32."""

    def quant_variants(self, problem) -> tuple[str, ...]:
        """The variants (``planforge.quant.variant``: fp32, bf16, int8, int8+a8, int4:32...) ``problem``'s
        template runs on this target, fp32 first."""

    def quant_space(self, problem, variants: Sequence[str]) -> Any:
        """``problem``'s knob space with the weight format as a gene among ``variants``."""

    def variant_errors(self, problem, variants: Sequence[str], seed: int, metric) -> dict[str, float]:
        """Per variant the error ``metric(out, ref)`` of the problem computed with that variant's values."""

    def validation_output(self, problem, knobs: dict[str, Any], seed: int) -> tuple[np.ndarray, np.ndarray]:
        """A candidate's output on the inputs of ``seed`` and the fp64 reference of the unquantised problem."""


__all__ = ["QuantTarget"]
