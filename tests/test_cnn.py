"""Convolutional models (issue 14): the ops through both importers, BN folding, the seeds' phase-ordering example in
the e-graph (rules A, B, C and the three-in-one, each extracted when it is cheapest), NHWC layouts whose transposes
cancel, 1x1 convolutions as GEMMs, residual blocks deduplicated by the partition, and a small CNN tuned end to end."""
import json

import numpy as np
import pytest

from planforge.ir import ZOO, GraphBuilder
from planforge.ops import REGISTRY
from planforge.rewrite import saturate
from planforge.rewrite.analysis import analyse
from planforge.rewrite.extract import greedy, ilp, reachable, usable
from planforge.rewrite.partition import partition

RULES = ["epilogue", "layout", "algebra"]
torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional


def _randomise_bn(m):
    g = torch.Generator().manual_seed(1)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            n = mod.num_features
            mod.running_mean.copy_(0.2 * torch.randn(n, generator=g))
            mod.running_var.copy_(0.5 + torch.rand(n, generator=g))
            mod.weight.data.copy_(1 + 0.2 * torch.randn(n, generator=g))
            mod.bias.data.copy_(0.2 * torch.randn(n, generator=g))
    return m.eval()


class EveryOp(nn.Module):
    """conv2d (bias, stride, asymmetric-free padding, dilation, groups, depthwise), batch norm, relu, relu6,
    hardswish, hardsigmoid, silu, max/avg/adaptive-avg pooling, channel shuffle, flatten, residual add, concat."""

    def __init__(self, shuffle="aten"):
        super().__init__()
        self.shuffle = shuffle  # "aten": channel_shuffle; "view": the reshape-transpose-reshape exporters write
        self.c1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.g2 = nn.Conv2d(8, 6, 3, padding=2, dilation=2, groups=2)
        self.pw = nn.Conv2d(6, 8, 1)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        h = F.relu(self.bn(self.c1(x)))
        h = F.max_pool2d(h, 3, 2, 1)
        d = F.relu6(self.dw(h))
        d = F.hardswish(d) + F.hardsigmoid(d)
        e = F.silu(self.pw(self.g2(d)))
        e = torch.cat([F.avg_pool2d(e, 2, 1, 1), F.avg_pool2d(d, 2, 1, 1)], dim=1)
        n, c, hh, ww = e.shape
        e = F.channel_shuffle(e, 2) if self.shuffle == "aten" else \
            e.reshape(n, 2, c // 2, hh, ww).transpose(1, 2).reshape(n, c, hh, ww)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(e, 1), 1)) + 0.5


@pytest.fixture(scope="module")
def every_op():
    torch.manual_seed(0)
    return _randomise_bn(EveryOp()), torch.randn(1, 3, 15, 13)


def _check_graph(g, m, x):
    (ref,) = g.evaluate(x.numpy())
    want = m(x).detach().double().numpy()
    assert np.abs(ref - want).max() < 1e-4 * (1 + np.abs(want).max())
    return {n.op for n in g.nodes}


def test_torch_export_round_trip_of_every_op(every_op):
    from planforge.ir import from_torch

    m, x = every_op
    ops = _check_graph(from_torch(m, (x,)), m, x)
    assert {"conv2d", "batchnorm", "relu6", "hardswish", "hardsigmoid", "maxpool2d", "avgpool2d",
            "adaptive_avg_pool2d", "channel_shuffle", "concat"} <= ops


def test_onnx_round_trip_of_every_op(every_op, tmp_path):
    pytest.importorskip("onnx")
    from planforge.ir import from_onnx

    m, x = every_op
    m = EveryOp("view").eval()
    m.load_state_dict(every_op[0].state_dict())
    path = tmp_path / "every.onnx"
    torch.onnx.export(m, (x,), str(path), input_names=["x"], opset_version=17, dynamo=False)
    ops = _check_graph(from_onnx(path), m, x)   # (the exporter folds eval-mode batch norms into the convs)
    assert {"conv2d", "hardswish", "hardsigmoid", "maxpool2d", "avgpool2d", "adaptive_avg_pool2d"} <= ops


def test_onnx_batchnorm_same_padding_clip_and_global_pool():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from planforge.ir import from_onnx

    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    bn = [1 + 0.2 * rng.standard_normal(6), 0.1 * rng.standard_normal(6), 0.1 * rng.standard_normal(6),
          0.5 + rng.random(6)]
    inits = [numpy_helper.from_array(w, "w")] + [numpy_helper.from_array(v.astype(np.float32), n)
                                                 for v, n in zip(bn, ("g", "b", "m", "v"))]
    inits += [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], auto_pad="SAME_UPPER"),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"], epsilon=1e-3),
             helper.make_node("Clip", ["n", "lo", "hi"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 1, 1])], inits)
    g = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.op for n in g.nodes] == ["conv2d", "batchnorm", "relu6", "adaptive_avg_pool2d"]
    x = rng.standard_normal((1, 4, 9, 8)).astype(np.float32)
    t = torch.from_numpy
    c = F.conv2d(F.pad(t(x), (0, 1, 1, 1)), t(w), stride=2)   # SAME_UPPER: the odd pad goes right (W), H 1 + 1
    want = F.adaptive_avg_pool2d(F.relu6(F.batch_norm(c, *(t(v.astype(np.float32)) for v in (bn[2], bn[3], bn[0], bn[1])),
                                                      eps=1e-3)), 1)
    (got,) = g.evaluate(x)
    assert np.abs(got - want.numpy()).max() < 1e-5


@pytest.mark.parametrize("name, attrs, shape", [
    ("relu6", {}, (2, 5, 3, 3)), ("hardswish", {}, (2, 5, 3, 3)), ("hardsigmoid", {}, (2, 5, 3, 3)),
    ("hardsigmoid", {"alpha": 0.2, "beta": 0.5}, (2, 5)),
    ("maxpool2d", {"kernel": (3, 3), "stride": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": True}, (1, 3, 8, 9)),
    ("avgpool2d", {"kernel": (2, 3), "stride": (2, 1), "pads": (1, 1, 0, 1), "count_include_pad": False},
     (1, 2, 7, 6)),
    ("adaptive_avg_pool2d", {"out": (2, 3)}, (1, 4, 7, 8)), ("channel_shuffle", {"groups": 3}, (1, 6, 2, 2)),
])
def test_library_steps_match_the_reference(name, attrs, shape):
    op = REGISTRY[name]
    x = np.random.default_rng(0).standard_normal(shape) * 4
    ref = op.reference([x], attrs)
    out = np.empty(op.shape([shape], attrs), np.float32)
    op.library[name].step([x.astype(np.float32)], out, attrs)()
    assert np.abs(out - ref).max() < 1e-5 * (1 + np.abs(ref).max())


def test_pooling_matches_torch_including_ceil_mode():
    x = torch.randn(1, 3, 9, 10)
    at = {"kernel": (3, 3), "stride": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": True, "count_include_pad": True}
    got = REGISTRY["maxpool2d"].reference([x.double().numpy()], at)
    assert np.allclose(got, F.max_pool2d(x, 3, 2, 1, ceil_mode=True).numpy(), atol=1e-6)
    got = REGISTRY["avgpool2d"].reference([x.double().numpy()], at)
    assert np.allclose(got, F.avg_pool2d(x, 3, 2, 1, ceil_mode=True).numpy(), atol=1e-6)


# -- the phase-ordering example ---------------------------------------------------------------------------------------

def _used(eg, choice):
    return {eg.node(choice[c]).args[0] for c in reachable(eg, choice) if eg.node(choice[c]).impl in ("lib", "tmpl")}


@pytest.fixture(scope="module")
def block():
    g = ZOO["conv-bn-relu"]()
    eg = saturate(g, RULES)
    return g, eg, analyse(eg, g)


def test_the_e_graph_holds_a_b_c_and_the_three_in_one(block):
    g, eg, a = block
    tm = {}
    for ns in eg.classes.values():
        for n in ns:
            if n.impl == "tmpl" and n.id not in a.unavailable:
                tm.setdefault(n.args[0], []).append(n)
    kinds_of = lambda cls: {n.args[0] for n in eg.classes[cls]}  # noqa: E731
    # A: the conv over folded weights; C: ReLU fused into that folded conv; B: Conv+BN; and Conv+BN+ReLU
    assert any("bn_fold_w" in kinds_of(n.children[1]) for n in tm["conv2d"])
    assert any("bn_fold_w" in kinds_of(n.children[1]) and n.args[1].endswith(";relu") for n in tm["conv_act"])
    assert any("bn_affine" in kinds_of(n.children[2]) for n in tm["conv_bn"])
    assert any(n.args[1].endswith(";relu") for n in tm["conv_bn_act"])
    assert {"conv2d_nhwc", "conv_act_nhwc", "conv_bn_nhwc", "conv_bn_act_nhwc"} <= set(tm)  # and all in NHWC


@pytest.mark.parametrize("cheap, want", [
    ({"conv2d": 1, "relu": 0.5}, {"conv2d", "bn_fold_w", "bn_fold_b", "relu"}),            # A, ReLU apart
    ({"conv_act": 1}, {"conv_act", "bn_fold_w", "bn_fold_b"}),                             # A then C
    ({"conv_bn": 1, "relu": 0.5}, {"conv_bn", "bn_affine", "relu"}),                       # B
    ({"conv_bn_act": 1}, {"conv_bn_act", "bn_affine"}),                                    # the three-in-one
])
def test_extraction_picks_whichever_form_the_cost_table_makes_cheapest(block, cheap, want):
    g, eg, a = block
    allowed = usable(eg, {c: [n.id for n in ns if n.executable and n.id not in a.unavailable]
                          for c, ns in eg.classes.items()})
    folded = {"bn_fold_w", "bn_fold_b", "bn_affine", "conv_pack", "conv_wt"}   # parameters only: load time

    def cost(n):
        if n.impl == "leaf":
            return 0.0
        if n.args[0] in folded:
            return 0.0
        return float(cheap.get(n.args[0], 10.0)) + (0.01 if n.impl == "lib" else 0.0)

    costs = {nid: cost(eg.node(nid)) for ns in allowed.values() for nid in ns}
    for choice in (greedy(eg, costs, allowed), ilp(eg, costs, allowed)[0]):
        assert _used(eg, choice) == want


def test_bn_folding_is_exact_to_fp32_rounding_and_happens_at_load_time():
    from planforge.ops.batchnorm import scale_shift

    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    st = np.stack([1 + 0.3 * rng.standard_normal(16), rng.standard_normal(16), rng.standard_normal(16),
                   0.1 + rng.random(16)]).astype(np.float32)
    scale, shift = scale_shift(st.astype(np.float64), 1e-5, b.astype(np.float64))
    fw = REGISTRY["bn_fold_w"].reference([w, st], {"eps": 1e-5})
    fb = REGISTRY["bn_fold_b"].reference([b, st], {"eps": 1e-5})
    assert fw.dtype == np.float32 and fb.dtype == np.float32
    # the fp32 rounding of the exact fold, bit for bit
    assert np.array_equal(fw, (w.astype(np.float64) * scale[:, None, None, None]).astype(np.float32))
    assert np.array_equal(fb, shift.astype(np.float32))
    # a plan of the folded form computes the fold once, as a constant, and matches the unfolded reference
    from planforge.targets.cpu.plan import Plan

    g = ZOO["conv-bn-relu"]()
    eg = saturate(g, RULES)
    a = analyse(eg, g)
    allowed = usable(eg, {c: [n.id for n in ns if (n.impl == "leaf" or n.impl == "lib") and n.id not in a.unavailable]
                          for c, ns in eg.classes.items()})
    costs = {nid: (0.0 if eg.node(nid).args and eg.node(nid).args[0] in ("bn_fold_w", "bn_fold_b") else
                   10.0 if eg.node(nid).args and eg.node(nid).args[0] == "batchnorm" else 1.0)
             for ns in allowed.values() for nid in ns}
    choice = greedy(eg, costs, allowed)
    assert {"bn_fold_w", "bn_fold_b", "conv2d"} <= _used(eg, choice) and "batchnorm" not in _used(eg, choice)
    from planforge.space.genome import Genome

    genome = Genome.build(eg, a, allowed, choice, knob_space=lambda p: None, defaults=lambda p: {})
    plan = Plan(g, genome.program({}), {}, {})
    assert len(plan.steps) == 2  # the conv and the ReLU; the folds are constants
    xs = g.example_inputs(1)
    (ref,) = g.evaluate(*xs)
    assert np.abs(plan(*xs)[0] - ref).max() < 1e-4 * (1 + np.abs(ref).max())


def test_nhwc_chains_cancel_their_transposes_and_pointwise_convs_are_gemms():
    g = ZOO["mobile-block"]()
    eg = saturate(g, RULES)
    a = analyse(eg, g)
    nodes = [n for ns in eg.classes.values() for n in ns if n.id not in a.unavailable]
    nhwc = {n.eclass for n in nodes if n.impl == "tmpl" and n.args[0].endswith("_nhwc")}
    # an NHWC convolution reading another NHWC convolution's output directly: the transposes between cancelled
    assert any(n.children[0] in nhwc for n in nodes if n.impl == "tmpl" and n.args[0].endswith("_nhwc"))
    gemms = [a.problem(n) for n in nodes if n.impl == "tmpl" and n.args[0] == "pw_gemm"]
    assert any(p.op == "gemm" and p.dims == (256, 64, 16) and p.epilogue == "bias_relu6" for p in gemms)
    dw = [a.problem(n) for n in nodes if n.impl == "tmpl" and n.args[0].startswith("conv_bn_act")]
    assert any(p is not None and p.op == "dwconv" for p in dw)


def test_the_partition_makes_identical_residual_blocks_one_task():
    g = ZOO["resnet-tiny"](blocks=(3, 2))
    part = partition(g, whole_below=0)
    # (the transposes at the cuts carry the activation in NHWC between the parts)
    blocks = [p for p in part.parts if [n.op for n in p.graph.nodes] == ["transpose", "conv2d", "batchnorm", "relu",
                                                                        "conv2d", "batchnorm", "add", "relu",
                                                                        "transpose"]]
    assert len(blocks) >= 3 and len({p.key for p in blocks[:3]}) == 1
    assert max(len(v) for v in part.keys.values()) >= 3


# -- a small CNN end to end ---------------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + x)


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.blocks = nn.Sequential(Block(8), Block(8))
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def test_a_tiny_resnet_tuned_at_a_tiny_budget_runs_correctly(tmp_path, profile):
    import planforge

    torch.manual_seed(0)
    m = _randomise_bn(TinyResNet())
    x = torch.randn(1, 3, 10, 10)
    res = planforge.tune(m, example_inputs=(x,), budget=2, out=tmp_path / "t")
    want = m(x).detach().numpy()
    (got,) = res.plan(x.numpy())
    assert np.abs(got - want).max() < 1e-4 * (1 + np.abs(want).max())
    plan = res.spec["tasks"]["graph"]["plan"]
    assert any(v.startswith("tmpl") and "conv" in v for v in plan.values())   # a compiled convolution runs
    # the same model through ONNX imports to the same computation
    from planforge.ir import from_onnx

    path = tmp_path / "tiny.onnx"
    torch.onnx.export(m, (x,), str(path), input_names=["x"], opset_version=17, dynamo=False)
    g = from_onnx(path)
    (ref,) = g.evaluate(x.numpy())
    assert np.abs(ref - want).max() < 1e-4 * (1 + np.abs(want).max())
    assert [n.op for n in g.nodes].count("conv2d") == 5


def test_a_fixed_order_loses_what_the_e_graph_keeps():
    """As sequential (subsuming) rewriters: folding first leaves no Conv+BN kernel, fusing first no folded weights;
    the e-graph (all groups together, nothing subsumed) holds both."""
    from egglog import EGraph, ruleset

    from planforge.ops.conv_fused import rule_groups
    from planforge.ops.egg import E, Vars
    from planforge.rewrite.egraph import _read, encode
    from planforge.rewrite.lang import rulesets

    g = ZOO["conv-bn-relu"]()
    groups = {k: ruleset(*rs) for k, rs in rule_groups(E, Vars(), subsume=True).items()}

    def kinds(order):
        eg = EGraph()
        root = encode(g, eg)
        for name in order:
            eg.run(groups[name] * 8)
        eg.run(rulesets()["lowering"] * 1)
        return {n.args[0] for ns in _read(eg, root).classes.values() for n in ns if n.impl == "tmpl"}

    fold_first, fuse_first = kinds(("fold", "fuse", "epilogue")), kinds(("fuse", "fold", "epilogue"))
    assert "conv_act" in fold_first and not {"conv_bn", "conv_bn_act"} & fold_first
    assert "conv_bn_act" in fuse_first and "conv_act" not in fuse_first
    both = {n.args[0] for ns in saturate(g, RULES).classes.values() for n in ns if n.impl == "tmpl"}
    assert {"conv_act", "conv_bn", "conv_bn_act", "conv2d"} <= both


def test_each_fixed_orders_plan_seeds_the_e_graphs_search(tmp_path, profile):
    """What a fixed order keeps is a restriction of the saturated e-graph (``phases.embed`` loses none of its
    kernels), its extraction is one more seed of the search (deduplicated by plan), a graph the groups do not
    match gets only its greedy and ILP seeds, and a budget below the number of seeds measures only the budget."""
    import planforge
    from planforge.rewrite.phases import ORDERS, embed, fixed_order
    from planforge.workloads.models import graph_workload

    g = ZOO["conv-bn-relu"]()
    full = saturate(g, RULES)
    for order in ORDERS.values():
        part = fixed_order(g, order, RULES)
        kept = embed(full, part)
        kinds = {(n.op, n.args[0]) for ns in part.classes.values() for n in ns if n.executable and n.args}
        assert kinds == {(full.node(i).op, full.node(i).args[0]) for i in kept if full.node(i).executable
                         and full.node(i).args}

    task = graph_workload(g, "cbr").tasks[0]
    labels = task.info["seeds"]
    assert len(labels) == len(task.seeds) == len({c.fingerprint for c in task.seeds})
    assert {"fold first", "fuse first"} <= set(labels)
    by = dict(zip(labels, task.seeds))
    steps = {k: {s["args"][0].removesuffix("_nhwc") for s in task.backend.genome.program(c.as_dict()) if s["args"]}
             for k, c in by.items()}  # the kernels of each seed, whatever their layout
    assert "bn_fold_w" in steps["fold first"] and not {"conv_bn", "conv_bn_act"} & steps["fold first"]
    assert "conv_bn_act" in steps["fuse first"] and "bn_fold_w" not in steps["fuse first"]

    assert set(graph_workload(ZOO["policy-mlp"](), "mlp").tasks[0].info["seeds"]) <= {"ilp", "greedy"}

    res = planforge.tune(graph_workload(g, "cbr"), budget=1, out=tmp_path / "t")
    assert res.spec["tasks"]["graph"]["search"]["evaluations"] == 1


def test_seeds_come_cheapest_first_at_their_kernels_prices_and_the_nchw_ilp_does_not_lead(profile):
    """The seeds are ordered by their kernels' prices: each template step at what its kernel's model predicts for
    the setting a seed runs (or, for the kernels measured before the search, what its fastest first setting
    measured), not at its op's roofline (the same for an NCHW convolution and an NHWC one between transposes). At
    28x28x32 the ILP's plan (roofline prices) runs the NCHW convolution, predicted at 2-3x the NHWC plans: it no
    longer leads (it used to, and took one of a budget of six evaluations); fold first's NHWC plan comes before the
    greedy NCHW one. With no kernel measured the ILP's plan leads, as before."""
    from planforge.ir.zoo import conv_bn_relu
    from planforge.rewrite.analysis import estimate
    from planforge.targets import get_target
    from planforge.workloads.models import graph_workload, price

    g = conv_bn_relu(size=28, cin=32, cout=32)
    task = graph_workload(g, "cbr").tasks[0]
    genome = task.backend.genome
    convs = [nid for nid, p in genome.problems.items() if p.op == "conv"]
    assert convs and all(nid in genome.predicted for nid in convs)
    eg, a = genome.eg, genome.analysis
    device = get_target("cpu").ceilings()
    roofline = {nid: estimate(a, eg.node(nid), device) for ns in genome.allowed.values() for nid in ns}
    kernel = {**roofline, **genome.predicted}
    labels = task.info["seeds"]
    assert task.lead_seeds == 1 and labels[0] != "ilp"
    prices = [price(eg, genome.choice(c.as_dict()), kernel) for c in task.seeds]
    assert prices == sorted(prices)
    by_roofline = [price(eg, genome.choice(c.as_dict()), roofline) for c in task.seeds]
    assert by_roofline != sorted(by_roofline)  # the roofline would have put them in another order
    assert "greedy" not in labels or labels.index("fold first") < labels.index("greedy")

    def convolutions(c) -> set[str]:
        return {s["args"][0] for s in genome.program(c.as_dict()) if s["op"].startswith("tmpl")}

    by = dict(zip(labels, task.seeds))
    assert all(k.endswith("_nhwc") for k in convolutions(by[labels[0]]))
    assert "ilp" in by and not any(k.endswith("_nhwc") for k in convolutions(by["ilp"]))  # the NCHW plan
    plain = graph_workload(g, "cbr", kernel_trials=0).tasks[0]
    assert plain.info["seeds"][0] == "ilp" and plain.lead_seeds == 1


def test_a_small_budget_tunes_the_best_seeds_kernels_instead_of_measuring_every_seed(tmp_path, profile):
    """At 6 evaluations the e-graph's search measures its two cheapest seeds (the ILP's first) and then steps from
    the faster one in one kernel setting at a time, rather than spending the budget on its five seed plans."""
    import planforge
    from planforge.workloads.models import graph_workload

    wl = graph_workload(ZOO["conv-bn-relu"](), "cbr")
    seeds = wl.tasks[0].seeds
    assert len(seeds) > 2
    res = planforge.tune(wl, budget=6, out=tmp_path / "t")
    trials = json.loads((tmp_path / "t" / "run.json").read_text())["tasks"]["graph"]["trials"]
    assert [t["fingerprint"] for t in trials[:2]] == [c.fingerprint for c in seeds[:2]]
    assert res.spec["tasks"]["graph"]["search"]["evaluations"] == 6
    best = min(trials[:2], key=lambda t: t["latency_s"])["plan"]
    for t in trials[2:3]:  # the first step: the best seed with one of its kernels' settings changed
        changed = {k for k in best if t["plan"][k] != best[k]}
        assert len(changed) == 1 and next(iter(changed)).startswith("k_"), changed


# -- im2col + GEMM, NHWC pooling ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("C, O, k, s, pads, d, g", [
    (5, 7, 3, 1, (1, 1, 1, 1), 1, 1), (6, 4, 3, 2, (1, 0, 1, 2), 1, 2), (3, 8, 7, 2, (3, 3, 3, 3), 1, 1),
    (4, 6, 3, 1, (2, 2, 2, 2), 2, 1)])
def test_im2col_and_gemm_are_the_convolution(C, O, k, s, pads, d, g):
    from planforge.ops.conv2d import conv_ref

    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, C, 11, 9))
    w, b = rng.standard_normal((O, C // g, k, k)), rng.standard_normal(O)
    at = {"kernel": (k, k), "stride": (s, s), "pads": pads, "dilation": (d, d), "groups": g}
    want = np.maximum(conv_ref(x, w, b, at), 0).transpose(0, 2, 3, 1)
    xn = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    cols_op, wt_op, gemm = REGISTRY["im2col"], REGISTRY["conv_wt_hwc"], REGISTRY["conv_gemm"]
    cols, wt = cols_op.reference([xn], at), wt_op.reference([w], {})
    ga = {**at, "act": "relu"}
    assert gemm.shape([cols.shape, wt.shape, b.shape], ga) == want.shape
    assert np.abs(gemm.reference([cols, wt, b], ga) - want).max() < 1e-12 * (1 + np.abs(want).max())
    # the library steps, in fp32
    c32 = np.empty(cols.shape, np.float32)
    cols_op.library["im2col"].step([xn.astype(np.float32)], c32, at)()
    assert np.abs(c32 - cols).max() < 1e-6
    y = np.empty(want.shape, np.float32)
    gemm.library["conv_gemm"].step([c32, wt.astype(np.float32), b.astype(np.float32)], y, ga)()
    assert np.abs(y - want).max() < 1e-5 * (1 + np.abs(want).max())
    with pytest.raises(ValueError, match="do not fit"):
        gemm.shape([cols.shape, (wt.shape[0] + 1, O), b.shape], ga)


def test_every_nhwc_convolution_is_also_an_im2col_gemm_that_a_plan_runs():
    from planforge.space.genome import Genome
    from planforge.targets.cpu.plan import Plan

    g = ZOO["conv-bn-relu"]()
    eg = saturate(g, RULES)
    a = analyse(eg, g)
    nodes = [n for ns in eg.classes.values() for n in ns if n.id not in a.unavailable]
    gemms = [a.problem(n) for n in nodes if n.impl == "tmpl" and n.args[0] == "conv_gemm"]
    assert any(p.op == "gemm" and p.epilogue == "bias_relu" and p.dims[2] == 9 * g.inputs["x"][1] for p in gemms)
    # a library plan through im2col + GEMM (every other convolution form dear) matches the reference
    allowed = usable(eg, {c: [n.id for n in ns if n.impl in ("leaf", "lib") and n.id not in a.unavailable]
                          for c, ns in eg.classes.items()})
    cheap = {"im2col": 1.0, "conv_gemm": 1.0, "transpose": 1.0, "bn_fold_w": 0.0, "bn_fold_b": 0.0, "conv_wt_hwc": 0.0}
    costs = {nid: (0.0 if not eg.node(nid).args else cheap.get(eg.node(nid).args[0], 50.0))
             for ns in allowed.values() for nid in ns}
    choice = greedy(eg, costs, allowed)
    assert {"im2col", "conv_gemm", "conv_wt_hwc"} <= _used(eg, choice)
    genome = Genome.build(eg, a, allowed, choice, knob_space=lambda p: None, defaults=lambda p: {})
    plan = Plan(g, genome.program({}), {}, {})
    xs = g.example_inputs(1)
    (ref,) = g.evaluate(*xs)
    assert np.abs(plan(*xs)[0] - ref).max() < 1e-4 * (1 + np.abs(ref).max())


@pytest.mark.parametrize("name, attrs, shape", [
    ("maxpool2d", {"kernel": (3, 3), "stride": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": True}, (1, 3, 8, 9)),
    ("avgpool2d", {"kernel": (2, 3), "stride": (2, 1), "pads": (1, 1, 0, 1), "count_include_pad": False},
     (2, 2, 7, 6)),
    ("avgpool2d", {"kernel": (3, 3), "stride": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": True}, (1, 3, 8, 9)),
    ("adaptive_avg_pool2d", {"out": (1, 1)}, (2, 5, 7, 3)),
])
def test_nhwc_pools_are_their_nchw_forms_transposed(name, attrs, shape):
    x = np.random.default_rng(5).standard_normal(shape)
    want = REGISTRY[name].reference([x], attrs).transpose(0, 2, 3, 1)
    op = REGISTRY["global_avg_pool_nhwc" if name.startswith("adaptive") else name + "_nhwc"]
    xn = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    assert np.abs(op.reference([xn], attrs) - want).max() < 1e-12
    out = np.empty(op.shape([xn.shape], attrs), np.float32)
    op.library[op.name].step([xn.astype(np.float32)], out, attrs)()
    assert np.abs(out - want).max() < 1e-5 * (1 + np.abs(want).max())


def test_a_pool_between_nhwc_convolutions_needs_no_transpose():
    g = ZOO["resnet-tiny"]()
    eg = saturate(g, RULES)
    conv_classes = {n.eclass for ns in eg.classes.values() for n in ns if n.impl == "tmpl"
                    and n.args[0].startswith("conv") and n.args[0].endswith("_nhwc")}
    pools = [n for ns in eg.classes.values() for n in ns if n.impl == "lib" and n.args[0] == "maxpool2d_nhwc"]
    assert any(n.children[0] in conv_classes for n in pools)
    pooled = {n.eclass for n in pools}
    assert any(n.children[0] in pooled for ns in eg.classes.values() for n in ns if n.impl == "tmpl"
               and n.args[0].endswith("_nhwc"))  # and the next convolution reads it in NHWC


class _Inverted(nn.Module):
    def __init__(self, cin, cout, s, t=3):
        super().__init__()
        mid, self.res = cin * t, s == 1 and cin == cout

        def cbr(a, b, k, s=1, g=1, act=True):
            return nn.Sequential(nn.Conv2d(a, b, k, s, k // 2, groups=g, bias=False), nn.BatchNorm2d(b),
                                 *([nn.ReLU6()] if act else []))
        expand = [cbr(cin, mid, 1)] if t != 1 else []  # MobileNetV2's first block has no expansion
        self.body = nn.Sequential(*expand, cbr(mid, mid, 3, s, mid), cbr(mid, cout, 1, act=False))

    def forward(self, x):
        return x + self.body(x) if self.res else self.body(x)


def test_blocks_without_a_residual_are_cut_where_blocks_meet():
    """Every op of a block without a residual is a cut point; cut every few ops, MobileNet's identical blocks were
    different parts (its partition put two blocks in most parts, all different); cut before the convolutions that
    start blocks, identical blocks are one task."""
    from planforge.ir import from_torch

    torch.manual_seed(0)
    m = _randomise_bn(nn.Sequential(_Inverted(4, 8, 2), _Inverted(8, 8, 1), _Inverted(8, 8, 1), _Inverted(8, 12, 2),
                                    _Inverted(12, 12, 1), _Inverted(12, 12, 1)))
    g = from_torch(m, (torch.randn(1, 4, 16, 16),))
    part = partition(g, whole_below=0)
    ops = [[n.op for n in p.graph.nodes] for p in part.parts]
    block = ["conv2d", "batchnorm", "relu6"] * 2 + ["conv2d", "batchnorm"]
    t = ["transpose"]  # each cut carries NHWC: a transpose ends a part, its inverse starts the next
    assert ops == [block + t] + [t + block + ["add"] + t] * 2 + [t + block + t] + [t + block + ["add"] + t] + \
        [t + block + ["add"]]
    assert len(part.keys) == 5 and part.dedupe == 1.2
    old = partition(g, whole_below=0, nhwc_cuts=False)
    assert [[n.op for n in p.graph.nodes] for p in old.parts] == [block] + [block + ["add"]] * 2 + [block] + \
        [block + ["add"]] * 2
    assert len(old.keys) == 4 and old.dedupe == 1.5


# -- NHWC across a whole partitioned CNN ----------------------------------------------------------------------------

class _SE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // 2, 1), nn.Conv2d(c // 2, c, 1)

    def forward(self, x):
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))))


class _MobileLike(nn.Module):
    """MobileNetV3's pieces at toy size: a hardswish stem, inverted blocks (1x1, depthwise, squeeze-excite, 1x1,
    residual where the shape allows), a 1x1 head, the global pool, flatten and the classifier."""

    def __init__(self, c=8):
        super().__init__()

        def cba(a, b, k, s=1, g=1, act=nn.Hardswish):
            return [nn.Conv2d(a, b, k, s, k // 2, groups=g, bias=False), nn.BatchNorm2d(b), *([act()] if act else [])]
        self.stem = nn.Sequential(*cba(3, c, 3, 2))
        self.blocks = nn.ModuleList(
            nn.Sequential(*cba(c, 2 * c, 1), *cba(2 * c, 2 * c, 3, 1, 2 * c), _SE(2 * c), *cba(2 * c, c, 1, act=None))
            for _ in range(3))
        self.head = nn.Sequential(*cba(c, 4 * c, 1))
        self.fc = nn.Linear(4 * c, 5)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = x + b(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.head(x), 1), 1))


def _mobile_like():
    from planforge.ir import from_torch

    torch.manual_seed(0)
    m = _randomise_bn(_MobileLike())
    x = torch.randn(1, 3, 16, 16)
    return m, x, from_torch(m, (x,))


def test_the_cuts_of_a_convolutional_chain_carry_nhwc_tensors():
    """Between two parts of a CNN flows the NHWC activation (a transpose ends each part, its inverse starts the
    next), and the parts in order still compute the model."""
    _, _, g = _mobile_like()
    part = partition(g, whole_below=0)
    assert len(part.parts) >= 3
    shapes = part.graph.shapes()
    for p, q in zip(part.parts, part.parts[1:]):
        (v,) = p.outputs
        assert q.inputs == [v] and p.graph.nodes[-1].op == "transpose" and q.graph.nodes[0].op == "transpose"
        assert tuple(p.graph.nodes[-1].attrs["perm"]) == (0, 2, 3, 1)
        n, h, w, c = shapes[v]
        assert c == 8 and h == w  # channels last
    xs = g.example_inputs(2)
    env = dict(zip(part.graph.inputs, xs))
    for p in part.parts:
        env.update(zip(p.outputs, p.graph.evaluate(*[env[i] for i in p.inputs])))
    np.testing.assert_allclose(env[part.graph.outputs[0]], g.evaluate(*xs)[0], rtol=1e-12, atol=1e-12)
    # not a convolutional chain: cut as before, nothing inserted
    from planforge.ir.zoo import transformer

    t = transformer(layers=2, seq=6, width=16, heads=2)
    assert len(partition(t).graph.nodes) == len(t.nodes)


NCHW_FORMS = ("conv2d", "conv_act", "conv_bn", "conv_bn_act", "conv_add", "conv_add_act", "batchnorm",
              "adaptive_avg_pool2d", "maxpool2d", "avgpool2d")


def test_a_partitioned_mobilenet_like_cnn_runs_nhwc_from_its_input_to_its_classifier(tmp_path):
    """Tuned at a tiny budget, every part of the plan reads and writes NHWC: one transpose at the input, after
    the global pool a reshape (its NHWC -> NCHW moves only unit axes), no NCHW convolution, pool or squeeze-excite multiply after the first
    transpose, and the model's output as torch computes it. The stem may run before that transpose: transposing
    its 3-channel input or its output is a tie in the estimates (1.915 vs 1.917 us here), so the probe's noise,
    not the layout rules, picks one."""
    import planforge
    from planforge.workloads.models import graph_workload

    m, x, g = _mobile_like()
    w = graph_workload(g, "mobile-like", whole_below=0)
    assert len(w.tasks) >= 3
    res = planforge.tune(w, budget=3, out=tmp_path / "t")
    kinds = [s["args"][0] for task, _ in res.spec["partition"]["parts"] for s in res.spec["tasks"][task]["program"]
             if s["op"].startswith(("lib", "tmpl"))]
    assert "transpose" in kinds, kinds
    first = kinds.index("transpose")
    assert not [k for k in kinds[first:] if k in NCHW_FORMS], kinds
    assert [k for k in kinds[:first] if k in NCHW_FORMS] in ([], ["conv_act"]), kinds  # at most the stem
    # the transpose after the global pool ([1, 1, 1, C] -> [1, C, 1, 1]) moves only unit axes: a reshape, a view
    last_pool = len(kinds) - 1 - kinds[::-1].index("global_avg_pool_nhwc")
    assert kinds.count("transpose") == 1 and kinds[last_pool + 1] == "reshape", kinds
    want = m(x).detach().numpy()
    (got,) = res.plan(x.numpy())
    assert np.abs(got - want).max() < 1e-4 * (1 + np.abs(want).max())
    # each part reads what the part before it produced in place: the very array, not a copy of it
    chain = res.plan.plan
    for (p, _, _), (q, _, _) in zip(chain.parts, chain.parts[1:]):
        assert q._in[0][1] is p.out_views[0]
    # so the chain is one run of steps; every step is native, the transposes, global means and squeeze-excite
    # multiplies too (compiled passes), so the whole chain is one call of a compiled runner
    assert chain._flat is not None
    steps = [f for p, _, _ in chain.parts for f in p.steps]
    assert [f for f in steps if getattr(f, "native", None) is None] == []
    assert len(chain._calls) == 1
    x2 = torch.randn(1, 3, 16, 16)  # and a second call on other values is right too (nothing stale between parts)
    want2 = m(x2).detach().numpy()
    assert np.abs(res.plan(x2.numpy())[0] - want2).max() < 1e-4 * (1 + np.abs(want2).max())
    assert np.abs(res.plan(x.numpy())[0] - want).max() < 1e-4 * (1 + np.abs(want).max())
    # and a loaded plan's call is that one compiled call with no Python frame before it (``ChainPlan.lean``),
    # anything but the tuned array going the checked Python way
    from planforge.api import PlanMismatch
    from planforge.targets.cpu import fastcall

    if fastcall.unavailable() is None:
        loaded = planforge.load(tmp_path / "t" / "spec.json", graph=g)
        assert type(loaded).__call__.__class__.__name__ == "Bound"
        assert np.abs(loaded(x2.numpy())[0] - want2).max() < 1e-4 * (1 + np.abs(want2).max())
        with pytest.raises(PlanMismatch, match="tuned for"):
            loaded(np.zeros((1, 3, 15, 16), np.float32))


def test_the_zoo_resnet18_has_resnet18s_layers_and_weights():
    """The zoo's ResNet-18 (what ``bench/phase_order.py --models resnet18`` tunes): 20 convolutions, each with its
    batch norm, 8 residual adds, and torchvision's 11,689,512 parameters less its 9,600 batch-norm affine ones
    (a zoo batch norm holds its scale and shift with its statistics); a 7x7 stride-2 stem and a max pool halve the
    input twice, four stages halve it three more times."""
    from collections import Counter

    g = ZOO["resnet18"](64)
    ops = Counter(n.op for n in g.nodes)
    assert (ops["conv2d"], ops["batchnorm"], ops["add"], ops["maxpool2d"]) == (20, 20, 8, 1)
    conv = sum(v.size for k, v in g.params.items() if v.ndim == 4)
    fc = g.params["fc.w"].size + g.params["fc.b"].size
    assert conv + fc == 11_689_512 - 9_600
    shapes = g.shapes()
    assert shapes[g.nodes[0].output] == (1, 64, 32, 32)                     # the stem: stride 2
    pool = next(n for n in g.nodes if n.op == "adaptive_avg_pool2d")
    assert shapes[pool.inputs[0]] == (1, 512, 2, 2)                        # 64 / 32
    (out,) = g.evaluate(*g.example_inputs())
    assert out.shape == (1, 1000) and np.isfinite(out).all()
