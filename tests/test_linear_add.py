"""A projection and the residual add after it as one GEMM (``ops/linear_add.py``, the GEMM epilogue ``bias_add``):
the kernel on shapes its blocks do not divide, the op's reference and library step, the rules on the forms the
importers make (GPT-2's reshaped ``Conv1D`` output, a bias-free projection), a rule that matches a batched matmul
(whose 3-D weight no ``gemm_pack`` takes) left unavailable, and tuned plans checked against the fp64 reference."""
import numpy as np
import pytest

from planforge.ir.graph import GraphBuilder
from planforge.ops import REGISTRY
from planforge.ops.kernel import RESIDUAL, gemm_residual
from planforge.rewrite.analysis import analyse
from planforge.rewrite.egraph import saturate
from planforge.targets.cpu.build import build
from planforge.targets.cpu.templates import TEMPLATES, Problem, ProblemError, gemm, limits, make_inputs, reference
from planforge.targets.registry import get_target
from planforge.workloads.models import graph_workload

from test_cpu_kernels import assert_all_correct, assert_candidates_correct, sample_knobs

RULES = ["epilogue", "layout", "algebra"]


@pytest.mark.parametrize("dims", [(2, 1, 1), (7, 13, 5), (33, 70, 129)])
def test_residual_gemm_every_sampled_setting_is_correct(profile, dims):
    assert assert_all_correct(Problem("gemm", dims, RESIDUAL), profile, 10, seed=dims[2]) >= 1


def test_residual_gemm_packed_weights_and_both_splits_are_correct(profile):
    """Each thread copies its block of the residual (a column block, or a row block) before its first K block;
    with K cut into blocks (kc 32 of 200) the later blocks accumulate as before."""
    p = Problem("gemm", (67, 96, 200), RESIDUAL)
    space = TEMPLATES["gemm"].space(p, limits(profile))
    base = TEMPLATES["gemm"].defaults(p, limits(profile))
    cands = [space.nearest_valid({**base, "threads": 2, "par": par, "pack_b": pb, "kc": kc, "mr": 4})
             for par in ("n", "m") for pb in (0, 1) for kc in (32, 256)]
    cands = [c for c in cands if c is not None and c["threads"] == 2]
    assert {c["par"] for c in cands} == {"n", "m"} and {c["kc"] for c in cands} >= {32}
    assert assert_candidates_correct(p, profile, cands) >= 4


def test_residual_gemm_in_place_on_its_residual(profile):
    """The residual may be the output itself (nothing is copied then): C = A @ B + bias + C."""
    p = Problem("gemm", (9, 40, 33), RESIDUAL)
    knobs = dict(TEMPLATES["gemm"].defaults(p, limits(profile)), threads=1)
    lib = __import__("ctypes").CDLL(str(build(TEMPLATES["gemm"].source(p, knobs)).path))
    inp = make_inputs(p, 3)
    want = reference(p, inp)
    c = inp["res"].copy()
    gemm.bind(lib, knobs, inp["A"], inp["B"], inp["bias"], c, res=c)()
    assert np.allclose(c, want, rtol=1e-5, atol=1e-5)


def test_a_gemv_takes_no_residual_and_quantised_formats_are_not_offered():
    from planforge.targets.cpu.templates import quant_variants

    with pytest.raises(ProblemError, match="unknown epilogue 'bias_add' for a gemv"):
        Problem("gemv", (8, 4), RESIDUAL)
    assert gemm_residual(RESIDUAL) == ("bias", True) and gemm_residual("bias_gelu") == ("bias_gelu", False)
    lim = limits(get_target("cpu").profile())
    assert quant_variants(Problem("gemm", (8, 8, 8), RESIDUAL), lim) == ("fp32",)
    # one row: no kernel (the batch-1 layer keeps its add)
    assert REGISTRY["linear_add"].kernel([(1, 1, 8), (9, 4), (1, 1, 4)], (1, 1, 4), {}) is None
    assert REGISTRY["linear_add"].kernel([(1, 5, 8), (9, 4), (1, 5, 4)], (1, 5, 4), {}) == \
        Problem("gemm", (5, 4, 8), RESIDUAL)


def test_reference_library_step_and_pack_agree():
    rng = np.random.default_rng(2)
    x, w, b, r = (rng.standard_normal(s).astype(np.float32) for s in ((1, 5, 8), (8, 6), (6,), (1, 5, 6)))
    pack, op = REGISTRY["gemm_pack"], REGISTRY["linear_add"]
    wb = pack.reference([w, b], {})
    assert wb.shape == pack.shape([w.shape, b.shape], {}) == (9, 6)
    assert np.array_equal(pack.reference([w], {})[8], np.zeros(6, np.float32))
    want = x @ w + b + r
    assert np.allclose(op.reference([x, wb, r], {}), want, atol=1e-5)
    out = np.empty(op.shape([x.shape, wb.shape, r.shape], {}), np.float32)
    op.library["linear_add"].step([x, wb, r], out, {})()
    assert np.allclose(out, want, atol=1e-5)
    with pytest.raises(ValueError, match="packed weight"):
        op.shape([(1, 5, 8), (8, 6), (1, 5, 6)], {})
    with pytest.raises(ValueError, match="elements"):
        op.shape([(1, 5, 8), (9, 6), (1, 4, 6)], {})


def residual_graph(bias=True, reshape=True, first=True):
    """``h + proj(x)``: GPT-2's form reshapes the [5, 16] GEMM output to [1, 5, 16] before the add."""
    gb = GraphBuilder("res", seed=3)
    h = gb.input("h", (1, 5, 16))
    x = gb.op("reshape", gb.op("layernorm", h, gb.vector("g", 16, offset=1.0), gb.vector("b", 16)), shape=(5, 16))
    y = gb.op("matmul", x, gb.weight("w", 16, 16))
    if bias:
        y = gb.op("bias", y, gb.vector("c", 16))
    y = gb.op("reshape", y, shape=(1, 5, 16)) if reshape else y
    hh = h if reshape else gb.op("reshape", h, shape=(5, 16))
    return gb.output(gb.op("add", y, hh) if first else gb.op("add", hh, y))


@pytest.mark.parametrize("bias, reshape, first", [(True, True, True), (False, True, False), (True, False, False)])
def test_the_rules_fuse_a_residual_add_into_the_projection_and_plans_run_correctly(bias, reshape, first):
    g = residual_graph(bias, reshape, first)
    eg = saturate(g, RULES)
    a = analyse(eg, g)
    fused = [n for ns in eg.classes.values() for n in ns if n.impl == "tmpl" and n.args[0] == "linear_add"]
    assert fused and all(n.id not in a.unavailable for n in fused)
    assert a.problem(fused[0]) == Problem("gemm", (5, 16, 16), RESIDUAL)
    task = graph_workload(g, "res", kernel_trials=2).tasks[0]
    xs = g.example_inputs(1)
    ref = g.evaluate(*xs)[0]
    used = set()
    for c in task.seeds:
        prog = task.backend.genome.program(c.as_dict())
        used |= {(s["op"], s["args"][0]) for s in prog if s["args"]}
        got = get_target("cpu").plan(g, prog)(*xs)[0]
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    assert ("tmpl3", "linear_add") in used


def test_a_residual_add_after_a_batched_matmul_is_left_to_other_nodes():
    """``add(matmul(a, B), r)`` with a 3-D B matches the bias-free rule; its ``gemm_pack`` refuses the weight, so
    the fused node is unavailable, the class keeps its shape, and the plan runs the matmul and the add."""
    gb = GraphBuilder("bmm", seed=4)
    a = gb.input("a", (2, 5, 8))
    b = gb.param("B", np.ones((2, 8, 6), np.float32) * 0.1)
    g = gb.output(gb.op("add", gb.op("matmul", a, b), gb.input("r", (2, 5, 6))))
    eg = saturate(g, RULES)
    an = analyse(eg, g)
    fused = [n for ns in eg.classes.values() for n in ns if n.args and n.args[0] in ("linear_add", "gemm_pack")]
    assert fused and all(n.id in an.unavailable for n in fused)
    task = graph_workload(g, "bmm", kernel_trials=2).tasks[0]
    xs = g.example_inputs(2)
    prog = task.backend.genome.program(task.seeds[0].as_dict())
    assert np.allclose(get_target("cpu").plan(g, prog)(*xs)[0], g.evaluate(*xs)[0], atol=1e-5)
