"""Numeric validation rules that can be decided from a plan's description."""
from __future__ import annotations

from dataclasses import dataclass

from ..space import Candidate

# unit roundoff u = 2^-(mantissa bits + 1)
UNIT_ROUNDOFF = {"fp64": 2.0**-53, "fp32": 2.0**-24, "tf32": 2.0**-11, "fp16": 2.0**-11, "bf16": 2.0**-8}


def accumulation_bound(dtype: str, k: int) -> float:
    """Worst-case relative error of a length-``k`` dot product accumulated in
    ``dtype``: gamma_k = k u / (1 - k u) (Higham, Accuracy and Stability, 3.1)."""
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"unknown accumulation dtype {dtype!r}; known: {', '.join(UNIT_ROUNDOFF)}")
    ku = k * UNIT_ROUNDOFF[dtype]
    return float("inf") if ku >= 1 else ku / (1 - ku)


@dataclass(frozen=True)
class AccumulationCheck:
    """Rejects a plan whose accumulation dtype cannot meet ``rtol`` over ``k`` terms.

    Parameters: k (the reduction length), rtol (the output's relative
    tolerance), knob (the plan knob naming the accumulation dtype, default
    ``"accumulate"``)."""

    k: int
    rtol: float
    knob: str = "accumulate"

    def __call__(self, c: Candidate) -> str | None:
        dtype = c[self.knob]
        bound = accumulation_bound(dtype, self.k)
        if bound > self.rtol:
            return (f"numerics: {dtype} accumulation over K={self.k} has error bound {bound:.3g} "
                    f"(unit roundoff {UNIT_ROUNDOFF[dtype]:.3g}), above the tolerance {self.rtol:g}")
        return None
