"""Attention read where the projections write q, k and v (issue 13, twenty-third session): the token-major and
packed layouts of the attention template, the ``sdpa_tok`` and ``sdpa_qkv`` ops and the layout rules that fold the
head transposes and GPT-2's QKV split into the attention. Graphs are written by hand as GPT-2 writes them (no model
is downloaded); plans are checked against the fp64 reference."""
import numpy as np
import pytest

from planforge.ir.graph import GraphBuilder
from planforge.ops import REGISTRY
from planforge.ops.kernel import AttentionLayout, Problem, ProblemError, attention_layout
from planforge.rewrite.egraph import saturate
from planforge.targets.cpu.templates import TEMPLATES, limits

from test_cpu_kernels import assert_all_correct
from test_transformer_fusions import RULES, kinds, seed_steps
from test_transformer_layout import activation_transposes

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("dims, epilogue", [
    ((4, 1, 32, 32, 64, 64), "causal:0.125:tok:4"),                 # GPT-2's heads, token-major
    ((6, 3, 9, 17, 10, 7), "full:0.3:tok:3"),                       # grouped queries, more keys, odd widths
    ((4, 1, 32, 32, 64, 64), "causal:0.125:qkv:4:768:0:256:512"),   # GPT-2's fused projection, read in place
    ((6, 3, 9, 9, 10, 7), "full:0.3:qkv:2:150:3:100:130"),          # two batch rows, windows anywhere in the row
])
def test_the_attention_template_reads_every_layout(profile, dims, epilogue):
    """Every sampled setting within tolerance of the fp64 reference (the worker checks), in each layout."""
    assert assert_all_correct(Problem("attention", dims, epilogue), profile, 10, seed=dims[4]) >= 1


def test_layouts_are_parsed_and_checked():
    p = Problem("attention", (6, 3, 9, 9, 10, 7), "full:0.3:qkv:2:150:3:100:130")
    assert attention_layout(p) == AttentionLayout(False, 0.3, "packed", 2, 150, (3, 100, 130))
    assert attention_layout(Problem("attention", (4, 1, 8, 8, 16, 16), "causal:0.5")).kind == "heads"
    for bad, why in [("causal:0.5:tok", "expected full:SCALE"), ("causal:0.5:tok:3", "do not divide"),
                     ("causal:0.5:qkv:4:40:0:16:32", "do not fit rows of 40"), ("causal:0.5:nhwc:4", "expected")]:
        with pytest.raises(ProblemError, match=why):
            Problem("attention", (4, 1, 8, 8, 16, 16), bad)
    with pytest.raises(ProblemError, match="T 9 is not S 8"):
        Problem("attention", (4, 1, 8, 9, 16, 16), "full:0.5:qkv:4:256:0:64:128")


def _qkv_attrs(H=4, Hk=4, S=8, D=16, Dv=16, W=None, step=1):
    W = W or H * D + Hk * (D + Dv)
    cuts = [(0, H * D), (H * D, H * D + Hk * D), (H * D + Hk * D, H * D + Hk * (D + Dv))]
    return W, {"causal": True, "scale": 0.25,
               "slices": tuple({"axis": 2, "start": a, "stop": b, "step": step} for a, b in cuts),
               "shapes": ((1, S, H, D), (1, S, Hk, D), (1, S, Hk, Dv))}


def test_the_packed_and_token_major_ops_are_the_expressions_they_fold():
    """``sdpa_qkv(X)`` is sdpa of the heads transposed out of three reshaped slices of X, transposed back; its and
    ``sdpa_tok``'s library steps compute it; their attributes round-trip through the e-graph's strings."""
    W, attrs = _qkv_attrs(H=6, Hk=2, D=8, Dv=5)
    x = RNG.standard_normal((1, 8, W)).astype(np.float32)
    sl = [x[..., a["start"]:a["stop"]].reshape(r) for a, r in zip(attrs["slices"], attrs["shapes"])]
    heads = [np.swapaxes(t, 1, 2) for t in sl]
    want = np.swapaxes(REGISTRY["sdpa"].reference(heads, attrs), 1, 2)
    qkv, tok = REGISTRY["sdpa_qkv"], REGISTRY["sdpa_tok"]
    assert np.abs(qkv.reference([x], attrs) - want).max() < 1e-6
    assert np.abs(tok.reference(sl, attrs) - want).max() < 1e-6
    for op, ins in ((qkv, [x]), (tok, [np.ascontiguousarray(t) for t in sl])):
        out = np.full(want.shape, np.nan, np.float32)
        op.library[op.name].step(ins, out, attrs)()
        assert np.abs(out - want).max() < 1e-5
    assert qkv.from_egg(qkv.egg_attr(attrs)) == attrs
    assert qkv.shape([x.shape], attrs) == want.shape
    assert qkv.kernel([x.shape], want.shape, attrs) == Problem(
        "attention", (2, 3, 8, 8, 8, 5), f"causal:0.25:qkv:2:{W}:0:48:64")


def test_a_split_that_is_no_column_window_runs_the_library_step():
    """A strided slice, or a reshape that does not split the window into heads, has no packed layout: no kernel,
    and the library step computes what was matched."""
    W, attrs = _qkv_attrs()
    strided = {**attrs, "slices": tuple({**a, "step": 2, "stop": a["start"] + 2 * (a["stop"] - a["start"])}
                                        for a in attrs["slices"][:1]) + attrs["slices"][1:]}
    x = RNG.standard_normal((1, 8, W + 64)).astype(np.float32)
    op = REGISTRY["sdpa_qkv"]
    assert op.kernel([x.shape], (1, 8, 4, 16), strided) is None
    out = np.empty((1, 8, 4, 16), np.float32)
    op.library["sdpa_qkv"].step([x], out, strided)()
    assert np.abs(out - op.reference([x], strided)).max() < 1e-5
    merged = {**attrs, "shapes": ((1, 8 * 4, 1, 16),) + attrs["shapes"][1:]}
    assert op.kernel([(1, 8, W)], (1, 32, 1, 16), merged) is None


def gpt2_attention(H=4, S=8, D=16, width=32):
    """GPT-2's attention as imported: one fused projection, split in three, heads transposed out and back."""
    gb = GraphBuilder("gpt2-attn", seed=12)
    x = gb.input("x", (1, S, width))
    qkv = gb.op("reshape", gb.op("matmul", gb.op("reshape", x, shape=(S, width)), gb.weight("w", width, 3 * H * D)),
                shape=(1, S, 3 * H * D))
    parts = [gb.op("transpose", gb.op("reshape", gb.op("slice", qkv, axis=2, start=i * H * D, stop=(i + 1) * H * D,
                                                       step=1), shape=(1, S, H, D)), perm=(0, 2, 1, 3))
             for i in range(3)]
    o = gb.op("sdpa", *parts, causal=True, scale=0.25)
    y = gb.op("reshape", gb.op("transpose", o, perm=(0, 2, 1, 3)), shape=(S, H * D))
    return gb.output(gb.op("matmul", y, gb.weight("wo", H * D, width)))


def test_gpt2_attention_reads_the_fused_projection_in_place():
    """The e-graph holds sdpa_tok and sdpa_qkv beside the imported form; the seed plans run the attention on the
    projection's output itself: no slice and no head transpose is copied."""
    g = gpt2_attention()
    eg = saturate(g, RULES)
    assert {("tmpl1", "sdpa_qkv"), ("tmpl3", "sdpa_tok"), ("tmpl3", "sdpa")} <= kinds(eg)
    used = seed_steps(g, "gpt2-attn", seed=3)   # each seed plan checked against the fp64 reference
    assert ("tmpl1", "sdpa_qkv") in used
    assert not {k for k in used if k[1] in ("slice", "sdpa")}
    assert not activation_transposes(g, "gpt2-attn")  # (a weight's transpose is folded when the plan loads)


def test_separate_projections_fold_the_head_transposes():
    """q, k, v from three projections (BERT's, ViT's without the projection fusion): the attention reads them
    token-major, the transposes before and after it gone from the seeds' plans."""
    gb = GraphBuilder("sep-attn", seed=13)
    x = gb.input("x", (1, 8, 32))
    heads = [gb.op("transpose", gb.op("reshape", gb.op("matmul", x, gb.weight(n, 32, 64)), shape=(1, 8, 4, 16)),
                   perm=(0, 2, 1, 3)) for n in ("wq", "wk", "wv")]
    o = gb.op("sdpa", *heads, causal=False, scale=0.25)
    g = gb.output(gb.op("reshape", gb.op("transpose", o, perm=(0, 2, 1, 3)), shape=(1, 8, 64)))
    assert ("tmpl3", "sdpa_tok") in kinds(saturate(g, RULES))
    used = seed_steps(g, "sep-attn", seed=5)
    assert {("tmpl3", "sdpa_tok"), ("tmpl1", "sdpa_qkv")} & used
    assert not activation_transposes(g, "sep-attn")


def test_the_gpu_template_refuses_a_layout_it_does_not_read():
    from planforge.targets.cuda.problem import from_kernel

    with pytest.raises(ProblemError, match="head-major q, k, v only"):
        from_kernel(Problem("attention", (4, 1, 8, 8, 16, 16), "causal:0.25:tok:4"))
    assert from_kernel(Problem("attention", (4, 1, 8, 8, 16, 16), "causal:0.25")).op == "attention"


def test_every_layout_has_its_space(profile):
    for epi in ("causal:0.125", "causal:0.125:tok:4", "causal:0.125:qkv:4:768:0:256:512"):
        p = Problem("attention", (4, 1, 32, 32, 64, 64), epi)
        assert TEMPLATES["attention"].space(p, limits(profile)).valid_size() > 1
