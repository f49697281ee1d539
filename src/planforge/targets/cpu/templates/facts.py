"""What a kernel problem kind is, whichever template runs it: its inputs, fp64 reference, tolerance, FLOPs and
library baselines. Each kind's facts sit in the module of its template (``gemm``, ``gemv``, ``rowwise``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Facts:
    """The facts of one problem kind.

    ``inputs(p, rand)``: the named input arrays, drawn with ``rand(*shape)``
    (standard normal, or zeros when only shapes are wanted) and scaled so
    outputs stay O(1); ``output_shape(p)``; ``reference(p, inputs_f64)``: the
    exact answer; ``tolerance(p, inputs)``: per-element absolute tolerance of
    an fp32 result; ``flops(p)``; ``numpy(p, inputs, out)`` and ``torch(p,
    inputs, out)``: the fastest library formulation we know, bound to the
    arrays (the baselines a tuned kernel must beat)."""

    inputs: Callable[[Any, Callable[..., np.ndarray]], dict[str, np.ndarray]]
    output_shape: Callable[[Any], tuple[int, ...]]
    reference: Callable[[Any, dict[str, np.ndarray]], np.ndarray]
    tolerance: Callable[[Any, dict[str, np.ndarray]], np.ndarray]
    flops: Callable[[Any], float]
    numpy: Callable[[Any, dict[str, np.ndarray], np.ndarray], Callable[[], None]]
    torch: Callable[[Any, dict[str, np.ndarray], np.ndarray], Callable[[], None]]
