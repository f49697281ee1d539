"""A tuned kernel's output on validation inputs, beside the fp64 reference of the unquantised problem.

The finalist walk judges a quantised plan's accuracy by what its compiled kernel
really computes, not by a model of it: the candidate's library (from the build
cache: it was built when it was measured) runs here, in the driver, on inputs
drawn with a seed other than the search's, and the error is taken against the
fp64 answer with the original fp32 weights.
"""
from __future__ import annotations


import numpy as np

from ...quant import variant_knobs
from .build import build
from .templates import Template, make_inputs, output_shape, reference
from .templates.parfor import open_library


def validation_output(problem, template: Template, knobs: dict, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(out, ref)``: ``template`` with ``knobs`` run once on ``problem``'s inputs of ``seed``, and the fp64
    reference on the same inputs."""
    inputs = make_inputs(problem, seed)
    lib = open_library(str(build(template.source(problem, knobs), template.openmp(knobs)).path))
    out = np.zeros(output_shape(problem), np.float32)
    template.bind(lib, problem, knobs, inputs, out)()
    return out, reference(problem, inputs)


def variant_errors(problem, template: Template, variants, seed: int, metric) -> dict[str, float]:
    """Per quantised variant (``planforge.quant.variant``) the error ``metric(out, ref)`` of ``problem``
    computed in fp64 with that variant's weights (and activations), on the inputs of ``seed``: what the variant
    costs before any kernel runs (a kernel adds only fp32 rounding), so that the search never spends
    measurements on one the budget cannot accept."""
    inputs = make_inputs(problem, seed)
    ref = reference(problem, inputs)
    out = {}
    for name in variants:
        eff = template.reference_inputs(problem, variant_knobs(name), inputs)
        out[name] = float(metric(reference(problem, eff[1]()) if eff else ref, ref))
    return out


__all__ = ["validation_output", "variant_errors"]
