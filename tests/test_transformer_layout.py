"""Rotary embedding and grouped-query attention as single steps (issue 13, eighth session): the rope rule and
kernel, the head transpose read in place, repeat_kv folded into the attention. Graphs are written by hand as
Hugging Face's Llama writes them (no model is downloaded); plans are checked against the fp64 reference."""
import numpy as np
import pytest

from planforge.ir.graph import GraphBuilder
from planforge.ops import REGISTRY
from planforge.rewrite.egraph import saturate
from planforge.targets.cpu.templates import TEMPLATES, Problem, ProblemError, limits

from test_cpu_kernels import assert_all_correct
from test_transformer_fusions import RULES, kinds, seed_steps


@pytest.mark.parametrize("dims, layout", [((1, 3, 5, 6), "bhsd"), ((2, 3, 7, 34), "bshd"), ((1, 1, 1, 2), "bshd"),
                                          ((1, 8, 32, 32), "bshd"), ((1, 2, 9, 70), "bhsd")])
def test_rope_template_every_setting_is_correct(profile, dims, layout):
    p = Problem("rope", dims, layout)
    space = TEMPLATES["rope"].space(p, limits(profile))
    assert assert_all_correct(p, profile, space.valid_size(), seed=dims[-1]) >= 1


def test_rope_problem_needs_an_even_width_and_a_layout():
    with pytest.raises(ProblemError, match="even head width"):
        Problem("rope", (1, 2, 3, 5), "bhsd")
    with pytest.raises(ProblemError, match="layout bhsd or bshd"):
        Problem("rope", (1, 2, 3, 4), "nchw")


def rotary_graph(H=3, S=5, D=6, first=None, factor=-1.0, transposed=True, table=None):
    """q = rope(transpose(reshape(x @ w))) written out as Llama does, with cos/sin constants of shape
    ``table`` (default [1, 1, S, D])."""
    h = D // 2
    first = first or (h, D)
    gb = GraphBuilder("rope", seed=4)
    x = gb.input("x", (1, S, 16))
    y = gb.op("reshape", gb.op("matmul", x, gb.weight("w", 16, H * D)), shape=(1, S, H, D))
    if transposed:
        q = gb.op("transpose", y, perm=(0, 2, 1, 3))
    else:
        q = gb.op("reshape", y, shape=(1, H, S, D))
    rng = np.random.default_rng(1)
    table = table or (1, 1, S, D)
    cos = gb.param("cos", rng.standard_normal(table).astype(np.float32))
    sin = gb.param("sin", rng.standard_normal(table).astype(np.float32))
    lo = gb.op("slice", q, axis=3, start=0, stop=h, step=1)
    hi = gb.op("slice", q, axis=3, start=first[0], stop=first[1], step=1)
    rot = gb.op("concat", gb.op("scale", hi, factor=factor), lo, axis=3)
    out = gb.op("add", gb.op("multiply", q, cos), gb.op("multiply", rot, sin))
    return gb.output(gb.op("reshape", out, shape=(1, H * S * D)))


@pytest.mark.parametrize("transposed", [True, False])
def test_rotary_written_out_becomes_one_kernel(transposed):
    g = rotary_graph(transposed=transposed)
    eg = saturate(g, RULES)
    want = ("tmpl3", "rope_heads") if transposed else ("tmpl3", "rope")
    assert want in kinds(eg) and ("lib3", "rope") in kinds(eg)
    used = seed_steps(g, "rope", seed=2)  # each seed plan is checked against the fp64 reference there
    assert want in used
    assert not {k for k in used if k[1] in ("slice", "concat", "scale")}
    # the head transpose is the kernel's read, no copy
    assert not [s for s in activation_transposes(g, "rope") if s["cls"] in {t["inputs"][0] for t in rope_steps(g)}]


def rope_steps(g):
    from planforge.workloads.models import graph_workload

    task = graph_workload(g, "rope").tasks[0]
    return [s for c in task.seeds for s in task.backend.genome.program(c.as_dict())
            if s["args"] and s["args"][0].startswith("rope")]


def activation_transposes(g, name):
    """Transpose steps of the seed plans whose operand is not a parameter (a weight stored transposed is folded)."""
    from planforge.workloads.models import graph_workload

    task = graph_workload(g, name).tasks[0]
    out = []
    for c in task.seeds:
        prog = task.backend.genome.program(c.as_dict())
        by = {s["cls"]: s for s in prog}
        out += [s for s in prog if s["args"] and s["args"][0] == "transpose"
                and not by[s["inputs"][0]]["op"].startswith("T.param")]
    return out


@pytest.mark.parametrize("case", ["same half", "factor", "table per head"])
def test_a_rotation_that_is_not_rotary_embedding_runs_its_library_step(case):
    kw = {"same half": dict(first=(0, 3)), "factor": dict(factor=2.0), "table per head": dict(table=(1, 3, 5, 6))}
    g = rotary_graph(**kw[case])
    eg = saturate(g, RULES)
    assert ("lib3", "rope") in kinds(eg) or ("lib3", "rope_heads") in kinds(eg)
    used = seed_steps(g, "rope", seed=3)  # still correct
    assert not {k for k in used if k[0] == "tmpl3" and k[1].startswith("rope")}


def test_rope_reference_and_library_steps_agree():
    rng = np.random.default_rng(0)
    attrs = REGISTRY["rope"].from_egg("3,3,6,1;-1.0;3,0,3,1;3")
    assert REGISTRY["rope"].egg_attr(attrs) == "3,3,6,1;-1.0;3,0,3,1;3"
    y = rng.standard_normal((2, 5, 3, 6)).astype(np.float32)
    c, s = (rng.standard_normal((1, 1, 5, 6)).astype(np.float32) for _ in range(2))
    x = np.ascontiguousarray(np.transpose(y, (0, 2, 1, 3)))
    want = x * c + np.concatenate([-x[..., 3:], x[..., :3]], -1) * s
    for name, arg in (("rope", x), ("rope_heads", y)):
        op = REGISTRY[name]
        out = np.empty(want.shape, np.float32)
        op.library[name].step([arg, c, s], out, attrs)()
        assert np.abs(out - want).max() < 1e-5
        assert np.abs(op.reference([arg.astype(np.float64), c, s], attrs) - want).max() < 1e-5
        assert op.shape([arg.shape, c.shape, s.shape], attrs) == want.shape
    with pytest.raises(ValueError, match="slice;factor;slice;axis"):
        REGISTRY["rope"].from_egg("3,0,3,1;-1.0")


def gqa_graph(H=6, Hk=2, S=5, D=8, repeat=None):
    """sdpa(q, repeat_kv(k), repeat_kv(v)) as Hugging Face's Llama writes it; ``repeat``: the three shapes of the
    repetition of a [1, Hk, S, D] value (default repeat_kv's)."""
    G = H // Hk
    gb = GraphBuilder("gqa", seed=5)
    x = gb.input("x", (1, S, 16))

    def heads(name, n):
        y = gb.op("reshape", gb.op("matmul", x, gb.weight(name, 16, n * D)), shape=(1, S, n, D))
        return gb.op("transpose", y, perm=(0, 2, 1, 3))

    q, k, v = heads("wq", H), heads("wk", Hk), heads("wv", Hk)
    r1, e, r2 = repeat or ((1, Hk, 1, S, D), (1, Hk, G, S, D), (1, H, S, D))

    def rep(t):
        return gb.op("reshape", gb.op("expand", gb.op("reshape", t, shape=r1), shape=e), shape=r2)

    o = gb.op("sdpa", q, rep(k), rep(v), causal=True, scale=0.3)
    return gb.output(gb.op("reshape", gb.op("transpose", o, perm=(0, 2, 1, 3)), shape=(1, S, H * D)))


def test_repeat_kv_folds_into_grouped_query_attention():
    g = gqa_graph()
    eg = saturate(g, RULES)
    assert ("tmpl3", "sdpa_rep") in kinds(eg)
    used = seed_steps(g, "gqa", seed=4)   # checked against the fp64 reference
    assert ("tmpl3", "sdpa_rep") in used and not {k for k in used if k[1] == "expand"}


def test_a_repetition_that_is_not_repeat_kv_runs_as_written():
    """Each head repeated along a new leading axis instead ([Hk, T, D] -> [1, Hk, T, D] -> [G, Hk, T, D]): the
    heads come out in another order than grouped-query attention reads them; the library step repeats them."""
    H, Hk, S, D = 6, 2, 5, 8
    g = gqa_graph(H, Hk, S, D, repeat=((1, 1, Hk, S, D), (1, H // Hk, Hk, S, D), (1, H, S, D)))
    used = seed_steps(g, "gqa", seed=5)
    assert ("tmpl3", "sdpa_rep") not in used
    op = REGISTRY["sdpa_rep"]
    shapes = ((1, 1, Hk, S, D), (1, 3, Hk, S, D), (1, H, S, D)) * 2
    attrs = {"causal": True, "scale": 0.3, "shapes": shapes}
    assert op.kernel([(1, H, S, D), (1, Hk, S, D), (1, Hk, S, D)], (1, H, S, D), attrs) is None
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, H, S, D), (1, Hk, S, D), (1, Hk, S, D)))
    out = np.empty((1, H, S, D), np.float32)
    op.library["sdpa_rep"].step([q, k, v], out, attrs)()
    want = REGISTRY["sdpa"].reference([q, np.tile(k, (1, 3, 1, 1)), np.tile(v, (1, 3, 1, 1))],
                                      {"causal": True, "scale": 0.3})
    assert np.abs(out - want).max() < 1e-5
    assert np.abs(op.reference([q, k, v], attrs) - want).max() < 1e-5
    assert op.from_egg(op.egg_attr(attrs)) == attrs


@pytest.mark.parametrize("dims, epilogue", [((1, 1, 32, 32, 32, 32), "causal:0.1767766952966369"),
                                            ((2, 3, 9, 17, 37, 19), "full:0.3"), ((1, 4, 8, 40, 64, 64), "causal:0.125")])
def test_attention_template_with_tree_sums_and_vector_exp_is_correct(dims, epilogue, profile):
    """Widths past one vector and not a multiple of it, key blocks with a vector tail, grouped queries: every
    sampled setting within tolerance of the fp64 reference (the worker checks)."""
    assert assert_all_correct(Problem("attention", dims, epilogue), profile, 12, seed=dims[4]) >= 1


def swiglu_graph(width=40, hidden=37, broadcast_up=False):
    gb = GraphBuilder("swiglu", seed=6)
    x = gb.input("x", (1, 7, width))
    gate = gb.op("silu", gb.op("matmul", x, gb.weight("wg", width, hidden)))
    up = gb.vector("u", hidden) if broadcast_up else gb.op("matmul", x, gb.weight("wu", width, hidden))
    return gb.output(gb.op("matmul", gb.op("multiply", up, gate), gb.weight("wd", hidden, width)))


def test_the_gate_of_a_gated_mlp_is_one_elementwise_step():
    g = swiglu_graph()
    assert ("tmpl2", "swiglu") in kinds(saturate(g, RULES))
    used = seed_steps(g, "swiglu", seed=6)   # checked against the fp64 reference
    assert ("tmpl2", "swiglu") in used and not {k for k in used if k[1] in ("silu", "multiply")}


def test_a_broadcast_gate_runs_the_library_step():
    used = seed_steps(swiglu_graph(broadcast_up=True), "swiglu", seed=7)   # still correct
    assert ("tmpl2", "swiglu") not in used
    assert REGISTRY["swiglu"].kernel([(1, 7, 37), (37,)], (1, 7, 37), {}) is None


@pytest.mark.parametrize("dims", [(1, 1), (7, 37), (32, 688)])
def test_swiglu_template_every_setting_is_correct(profile, dims):
    p = Problem("eltwise", dims, "swiglu")
    space = TEMPLATES["eltwise"].space(p, limits(profile))
    assert assert_all_correct(p, profile, space.valid_size(), seed=dims[1]) >= 1


@pytest.mark.parametrize("dims", [(1, 32, 8, 32), (2, 3, 5, 7), (1, 1, 1, 1)])
def test_head_transpose_template_every_setting_is_exact(profile, dims):
    p = Problem("swap12", dims)
    assert assert_all_correct(p, profile, TEMPLATES["swap12"].space(p, limits(profile)).valid_size()) >= 1


def test_head_transposes_are_native_steps():
    """GPT-2's attention as imported: heads split by reshape and transpose, merged back after the attention."""
    assert REGISTRY["transpose"].kernel([(1, 5, 3, 8)], (1, 3, 5, 8), {"perm": (0, 2, 1, 3)}) == \
        Problem("swap12", (1, 5, 3, 8))
    assert REGISTRY["transpose"].kernel([(1, 5, 3, 8)], (1, 8, 3, 5), {"perm": (0, 3, 2, 1)}) is None
    g = gqa_graph(H=3, Hk=3)
    used = seed_steps(g, "gqa", seed=8)   # checked against the fp64 reference
    assert ("tmpl1", "transpose") in used
    assert not [s for s in activation_transposes(g, "gqa") if s["op"] == "lib1"]  # a weight's is folded at load


@pytest.mark.parametrize("dims, start", [((32, 768, 1, 256), "256"), ((3, 7, 5, 2), "5"), ((1, 1, 1, 1), "0")])
def test_slab_template_every_setting_is_exact(profile, dims, start):
    p = Problem("slab", dims, start)
    assert assert_all_correct(p, profile, TEMPLATES["slab"].space(p, limits(profile)).valid_size()) >= 1


def test_slab_problem_checks_its_start():
    for bad in ("x", "-1", "6"):
        with pytest.raises(ProblemError, match="expected a start in 0..5"):
            TEMPLATES["slab"].space(Problem("slab", (3, 7, 5, 2), bad), None)


def test_the_fused_qkv_split_is_native_block_copies():
    """GPT-2's c_attn output split in three along its last axis: each slice a native step, the plan correct."""
    op = REGISTRY["slice"]
    assert op.kernel([(1, 6, 48)], (1, 6, 16), {"axis": 2, "start": 16, "stop": 32, "step": 1}) == \
        Problem("slab", (6, 48, 1, 16), "16")
    assert op.kernel([(1, 6, 48)], (1, 6, 8), {"axis": 2, "start": 0, "stop": 16, "step": 2}) is None
    gb = GraphBuilder("qkv-split", seed=9)
    x = gb.input("x", (1, 6, 16))
    y = gb.op("matmul", x, gb.weight("w", 16, 48))
    parts = [gb.op("slice", y, axis=2, start=16 * i, stop=16 * (i + 1), step=1) for i in range(3)]
    g = gb.output(gb.op("add", gb.op("multiply", parts[0], parts[1]), parts[2]))
    assert ("tmpl1", "slice") in seed_steps(g, "qkv-split", seed=9)   # checked against the fp64 reference
