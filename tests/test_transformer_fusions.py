"""Transformer-block rewrites (issue 13): the RMSNorm template and rule, projection fusion, GEMMs of [batch, seq,
width] activations. Graphs are written by hand (no model is downloaded); plans are checked against the fp64
reference."""
import numpy as np
import pytest

from planforge.ir.graph import GraphBuilder
from planforge.ops import REGISTRY
from planforge.ops.matmul import gemm_problem
from planforge.rewrite.analysis import analyse, estimate
from planforge.rewrite.egraph import saturate
from planforge.targets.cpu.templates import TEMPLATES, Problem, ProblemError, limits
from planforge.targets.registry import get_target
from planforge.workloads.models import graph_workload

from test_cpu_kernels import assert_all_correct

RULES = ["epilogue", "layout", "algebra"]


def kinds(eg, cls=None):
    """(op, kind) of every executable e-node (of one class when ``cls`` is given)."""
    ns = eg.classes[cls] if cls else [n for ns in eg.classes.values() for n in ns]
    return {(n.op, n.args[0]) for n in ns if n.executable and n.args}


def seed_steps(g, name, seed=1):
    """(op, kind) of every step the task's seed plans take; each seed plan is checked against the reference."""
    task = graph_workload(g, name).tasks[0]
    xs = g.example_inputs(seed)
    ref = g.evaluate(*xs)[0]
    used = set()
    for c in task.seeds:
        prog = task.backend.genome.program(c.as_dict())
        used |= {(s["op"], s["args"][0]) for s in prog if s["args"]}
        assert np.abs(get_target("cpu").plan(g, prog)(*xs)[0] - ref).max() <= 1e-5 * np.abs(ref).max()
    return used


@pytest.mark.parametrize("dims", [(1, 1), (7, 13), (5, 257), (3, 64)])
def test_rms_template_every_setting_is_correct(profile, dims):
    p = Problem("rms", dims)
    space = TEMPLATES["rms"].space(p, limits(profile))
    assert assert_all_correct(p, profile, space.valid_size()) >= 1


def test_rms_problem_takes_no_epilogue_and_layernorm_only_its_eps():
    with pytest.raises(ProblemError, match="takes no epilogue"):
        Problem("rms", (4, 8), "bias")
    for bad in ("bias", "eps=x", "eps=0", "eps=-1e-5"):
        with pytest.raises(ProblemError, match="expected none or eps=FLOAT"):
            Problem("layernorm", (4, 8), bad)


@pytest.mark.parametrize("dims", [(7, 13), (5, 257)])
def test_layernorm_template_with_bert_eps_every_setting_is_correct(profile, dims):
    p = Problem("layernorm", dims, "eps=1e-12")
    assert assert_all_correct(p, profile, 12, seed=dims[1]) >= 1


@pytest.mark.parametrize("eps, epilogue", [(1e-5, "none"), (1e-12, "eps=1e-12")])
def test_layernorm_of_any_eps_takes_the_template(eps, epilogue):
    gb = GraphBuilder("ln", seed=3)
    x = gb.input("x", (1, 6, 40))
    g = gb.output(gb.op("layernorm", x, gb.vector("g", 40, offset=1.0), gb.vector("b", 40), eps=eps))
    assert REGISTRY["layernorm"].kernel([(1, 6, 40), (40,), (40,)], (1, 6, 40), {"eps": eps}) == \
        Problem("layernorm", (6, 40), epilogue)
    assert ("tmpl3", "layernorm") in seed_steps(g, "ln", seed=2)


def rmsnorm_graph(rank=3, width=48, eps=1e-6):
    gb = GraphBuilder("rms", seed=1)
    shape = (1, 6, width) if rank == 3 else (6, width)
    x = gb.input("x", shape)
    var = gb.op("mean", gb.op("pow", x, exponent=2.0), axes=(rank - 1,), keepdim=True)
    inv = gb.op("rsqrt", gb.op("bias", var, gb.param("eps", np.array([eps], np.float32))))
    y = gb.op("multiply", x, inv)
    return gb.output(gb.op("matmul", y, gb.weight("w", width, 16)))


@pytest.mark.parametrize("rank", [2, 3])
def test_rmsnorm_written_out_becomes_one_row_wise_kernel(rank):
    g = rmsnorm_graph(rank)
    eg = saturate(g, RULES)
    assert ("tmpl2", "rmsnorm") in kinds(eg) and ("lib2", "rmsnorm") in kinds(eg)
    assert ("tmpl2", "rmsnorm") in seed_steps(g, "rms", seed=3)  # the seeds take the template: 1 step instead of 5


def test_rmsnorm_rule_needs_the_same_input_and_a_square():
    gb = GraphBuilder("not-rms", seed=1)
    x, z = gb.input("x", (6, 8)), gb.input("z", (6, 8))
    var = gb.op("mean", gb.op("pow", x, exponent=3.0), axes=(1,), keepdim=True)
    inv = gb.op("rsqrt", gb.op("bias", var, gb.param("eps", np.array([1e-6], np.float32))))
    cube = gb.op("multiply", x, inv)
    var2 = gb.op("mean", gb.op("pow", x, exponent=2.0), axes=(1,), keepdim=True)
    other = gb.op("multiply", z, gb.op("rsqrt", gb.op("bias", var2, gb.param("eps2", np.array([1e-6], np.float32)))))
    g = gb.output(gb.op("add", cube, other))
    assert not {k for k in kinds(saturate(g, RULES)) if k[1] == "rmsnorm"}


def test_rmsnorm_reference_and_library_step_agree_and_check_eps():
    op = REGISTRY["rmsnorm"]
    rng = np.random.default_rng(0)
    x, e = rng.standard_normal((2, 5, 7)).astype(np.float32), np.array([1e-5], np.float32)
    for ax in (1, 2):
        out = np.empty_like(x)
        op.library["rmsnorm"].step([x, e], out, {"axis": ax})()
        ref = op.reference([x.astype(np.float64), e.astype(np.float64)], {"axis": ax})
        assert np.abs(out - ref).max() < 1e-5
        assert np.allclose(ref, x / np.sqrt((x.astype(np.float64) ** 2).mean(ax, keepdims=True) + 1e-5))
    assert op.kernel([(2, 5, 7), (1,)], (2, 5, 7), {"axis": 1}) is None  # the template reduces the last axis only
    with pytest.raises(ValueError, match="eps must have shape"):
        op.shape([(2, 5, 7), (7,)], {"axis": 2})


def qkv_graph(widths=(48, 16, 16), k=32, bias=True):
    gb = GraphBuilder("qkv", seed=2)
    x = gb.input("x", (1, 5, k))
    outs = []
    for i, n in enumerate(widths):
        y = gb.op("matmul", x, gb.weight(f"w{i}", k, n))
        outs.append(gb.op("bias", y, gb.vector(f"b{i}", n)) if bias else y)
    return gb.output(gb.op("concat", *outs, axis=-1) if len(outs) > 1 else outs[0])


@pytest.mark.parametrize("bias", [True, False])
def test_projections_of_one_input_fuse_into_one_gemm_with_slices(bias):
    g = qkv_graph(bias=bias)
    eg = saturate(g, RULES)
    a = analyse(eg, g)
    fused = [n for ns in eg.classes.values() for n in ns if n.executable and n.args
             and n.args[0] in ("linear", "matmul") and a.shapes.get(n.eclass) == (1, 5, 80)]
    assert fused, "no GEMM over the three weights side by side"
    for want in ((1, 5, 48), (1, 5, 16)):  # each projection's class holds a slice of a fused product
        cls = [c for c, s in a.shapes.items() if s == want and any(
            n.args and n.args[0] in ("take_cols", "drop_cols") for n in eg.classes[c])]
        assert cls, want
    # the concatenated weights are folded when the plan loads: the analysis prices them at nothing
    cats = [n for ns in eg.classes.values() for n in ns if n.executable and n.args and n.args[0] == "concat"
            and n.eclass in a.constant]
    assert cats and all(estimate(a, n, _device()) == 0.0 for n in cats)


def _device():
    return get_target("cpu").ceilings()


def test_the_fused_projection_slices_compute_each_projection():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 5, 8))
    w1, w2, w3 = (rng.standard_normal((8, n)) for n in (6, 3, 2))
    take, drop = REGISTRY["take_cols"], REGISTRY["drop_cols"]
    y = x @ np.concatenate([np.concatenate([w1, w2], -1), w3], -1)
    lead = np.concatenate([w1, w2], -1)[:1]
    assert np.allclose(take.reference([y, lead], {}), x @ np.concatenate([w1, w2], -1))
    assert np.allclose(drop.reference([y, lead], {}), x @ w3)
    assert take.shape([(1, 5, 11), (1, 9)], {}) == (1, 5, 9) and drop.shape([(1, 5, 11), (1, 9)], {}) == (1, 5, 2)
    for yy, ll in ((y.astype(np.float32), lead.astype(np.float32)),):
        for op in (take, drop):
            out = np.empty(op.shape([yy.shape, ll.shape], {}), np.float32)
            op.library[op.name].step([yy, ll], out, {})()
            assert np.allclose(out, op.reference([yy, ll], {}))
    with pytest.raises(ValueError, match="leaves nothing"):
        drop.shape([(1, 5, 9), (1, 9)], {})


def test_a_lone_projection_does_not_fuse_with_itself():
    g = qkv_graph(widths=(24,))
    assert not {k for k in kinds(saturate(g, RULES)) if k[1] in ("take_cols", "drop_cols")}


def test_gemm_template_takes_batched_activations_as_rows():
    assert gemm_problem([(1, 32, 256), (256, 64)], (1, 32, 64), "bias") == Problem("gemm", (32, 64, 256), "bias")
    assert gemm_problem([(2, 3, 1, 8), (8, 4)], (2, 3, 1, 4), "none") == Problem("gemm", (6, 4, 8), "none")
    assert gemm_problem([(1, 1, 8), (8, 4)], (1, 1, 4), "none") == Problem("gemv", (4, 8), "none")
    assert gemm_problem([(2, 3, 8), (2, 8, 4)], (2, 3, 4), "none") is None  # a batched right operand: no GEMM
    assert ("tmpl3", "linear") in seed_steps(qkv_graph(widths=(24,)), "one")


def _gelu_new_module(one: float = 1.0, cube: float = 3.0):
    """GPT-2's ``gelu_new`` as transformers writes it (``NewGELUActivation``) after a linear layer."""
    import math

    torch = pytest.importorskip("torch")

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 24)

        def forward(self, x):
            h = self.fc(x)
            return 0.5 * h * (one + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, cube))))

    torch.manual_seed(0)
    return M().eval(), (torch.randn(1, 5, 16),)


def test_written_out_tanh_gelu_imports_as_one_gelu_and_fuses_into_the_gemm():
    from planforge.ir import from_torch

    m, args = _gelu_new_module()
    g = from_torch(m, args)
    ops = [n.op for n in g.nodes]
    assert "gelu" in ops and not {"tanh", "pow", "scale"} & set(ops), ops
    x = args[0].numpy()
    want = m.double()(args[0].double()).detach().numpy()
    assert np.abs(g.evaluate(x)[0] - want).max() <= 1e-12 * np.abs(want).max()
    eg = saturate(g, RULES)
    assert any(n.op.startswith("tmpl") and n.args[:2] == ("linear", "gelu:tanh") for ns in eg.classes.values()
               for n in ns), "the gelu is no GEMM epilogue"


@pytest.mark.parametrize("one, cube", [(2.0, 3.0), (1.0, 2.0)])
def test_a_near_gelu_stays_written_out(one, cube):
    from planforge.ir import from_torch

    m, args = _gelu_new_module(one, cube)
    g = from_torch(m, args)
    assert "gelu" not in [n.op for n in g.nodes]
    want = m.double()(args[0].double()).detach().numpy()
    # the written-out form's constants are fp32 parameters: 0.044715 is 0.0447149984
    assert np.abs(g.evaluate(args[0].numpy())[0] - want).max() <= 1e-7 * np.abs(want).max()


def test_an_activation_after_a_reshape_fuses_into_the_gemm():
    """GPT-2's Conv1D: GEMM and bias on [32, K], reshaped to [1, 32, N], then the GELU: the GELU is still the GEMM's
    epilogue, and the seed plans compute the model."""
    gb = GraphBuilder("conv1d-gelu", seed=2)
    x = gb.input("x", (32, 16))
    y = gb.op("reshape", gb.op("bias", gb.op("matmul", x, gb.weight("w", 16, 24)), gb.param("b", np.ones(24, np.float32))),
              shape=(1, 32, 24))
    g = gb.output(gb.op("gelu", y, approximate="tanh"))
    eg = saturate(g, RULES)
    assert ("tmpl3", "linear") in kinds(eg) and any(
        n.op == "tmpl3" and n.args[:2] == ("linear", "gelu:tanh") for ns in eg.classes.values() for n in ns)
    seed_steps(g, "conv1d-gelu")
