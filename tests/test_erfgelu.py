"""erfgelu: the exact GELU as a compiled op (planforge/ops/erfgelu.py, one module), reached from the importers'
``gelu(approximate="none")`` by an e-graph rule."""
import math

import numpy as np
import pytest
from scipy.special import erf

from test_activations import eltwise_failures

from planforge.ir import GraphBuilder
from planforge.ops import REGISTRY
from planforge.ops.kernel import activations, chain_steps, gemm_epilogues
from planforge.rewrite import saturate
from planforge.rewrite.analysis import analyse
from planforge.targets.cpu.templates import Problem

X = np.concatenate([np.linspace(-12, 12, 2001), [-100.0, -1e-3, 0.0, 1e-3, 100.0]])


def exact(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def test_reference_and_library_step_are_the_exact_gelu():
    op = REGISTRY["erfgelu"]
    assert "erfgelu" in chain_steps() and "bias_erfgelu" in gemm_epilogues() and activations()["erfgelu"] == "erfgelu"
    np.testing.assert_allclose(op.reference([X], {}), exact(X), rtol=1e-14, atol=1e-300)
    x = X.astype(np.float32)
    out = np.empty_like(x)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        op.library["erfgelu"].step([x], out, {})()
    # A&S 7.1.26 is within 1.5e-7 of erf: the GELU within |x| 1e-7 of the exact one, plus fp32 rounding
    err = np.abs(out.astype(np.float64) - exact(x.astype(np.float64)))
    assert (err <= 1e-7 * np.abs(x) + 4e-7 * (1 + np.abs(x))).all(), err.max()
    assert out[X == 0.0][0] == 0.0 and np.isfinite(out).all()
    # in place, as an epilogue step runs it: the same numbers
    y = x.copy()
    op.library["erfgelu"].step([y], y, {})()
    np.testing.assert_array_equal(y, out)


@pytest.mark.parametrize("epilogue", ["erfgelu", "bias_erfgelu_add"])
def test_elementwise_template_computes_it_at_sampled_settings(epilogue, profile):
    """Every vector width the machine offers (1, 4, 8, 16 lanes) and a chain: checked by the worker against the
    fp64 reference."""
    bad, cands = eltwise_failures(Problem("eltwise", (5, 133), epilogue), profile)
    assert len({c["vec"] for c in cands}) >= 2
    assert not bad, bad


def test_the_importers_exact_gelu_gets_a_template_and_a_fused_linear_through_the_rule():
    b = GraphBuilder("erf", seed=1)
    h = b.op("gelu", b.linear(b.input("x", (4, 24)), 24, 16, "l0"), approximate="none")
    g = b.output(h)
    eg = saturate(g, ["epilogue", "layout", "algebra"])
    a = analyse(eg, g)
    fused = [n for ns in eg.classes.values() for n in ns if n.impl == "tmpl" and n.args[:2] == ("linear", "erfgelu")]
    elt = [n for ns in eg.classes.values() for n in ns if n.impl == "tmpl" and n.args[0] == "erfgelu"]
    assert fused and elt and all(n.id not in a.unavailable for n in fused + elt)
    assert all(a.problem(n) == Problem("eltwise", (4, 16), "erfgelu") for n in elt)
    # the tanh form is another function: no rule makes it erfgelu
    b2 = GraphBuilder("tanh", seed=1)
    g2 = b2.output(b2.op("gelu", b2.linear(b2.input("x", (4, 24)), 24, 16, "l0"), approximate="tanh"))
    eg2 = saturate(g2, ["epilogue", "layout", "algebra"])
    assert not [n for ns in eg2.classes.values() for n in ns if n.args and n.args[0] == "erfgelu"]
