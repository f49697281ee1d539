"""sigmoid, tanh and silu: each added as one op module (planforge/ops/sigmoid.py, tanh.py, silu.py), with nothing
else edited. These tests check that one module is enough: the IR, the reference, the library step, the e-graph,
the compiled elementwise and GEMM epilogues, the runnable plan and both importers all pick the op up."""
import numpy as np
import pytest

from planforge.ir import GraphBuilder
from planforge.ops import REGISTRY
from planforge.ops.kernel import activations, chain_steps, gemm_epilogues
from planforge.rewrite import saturate
from planforge.rewrite.analysis import analyse
from planforge.targets.cpu.plan import Plan, lib_step
from planforge.targets.cpu.kernel import CpuBackend
from planforge.targets.cpu.templates import TEMPLATES, Problem, limits
from planforge.measure import TimingConfig

ACTS = ("sigmoid", "tanh", "silu")
CLOSED = {"sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh, "silu": lambda x: x / (1 + np.exp(-x))}
ONCE = TimingConfig(warmup_s=0.0, budget_s=0.0, min_repeats=1, max_repeats=1)
X = np.array([-100.0, -30.0, -5.0, -1.0, -1e-3, 0.0, 1e-3, 0.5, 2.0, 20.0, 100.0])


@pytest.mark.parametrize("name", ACTS)
def test_registered_everywhere_from_its_module_alone(name):
    op = REGISTRY[name]
    assert name in chain_steps() and f"bias_{name}" in gemm_epilogues() and activations()[name] == name
    with np.errstate(over="ignore"):
        want = CLOSED[name](X)
    np.testing.assert_allclose(op.reference([X], {}), want, rtol=1e-12, atol=1e-300)
    out = np.empty(X.shape, np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no overflow into a warning at -100
        lib_step(name, "", [X.astype(np.float32)], out)()
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-30)
    assert np.isfinite(out).all()


def eltwise_failures(problem, profile, keep=None):
    """The eltwise template run at its one-thread settings (the first ``keep``, default all), each checked by
    the worker against the fp64 reference: (settings, category, message) of those that fail, and the settings."""
    t = TEMPLATES["eltwise"]
    cands = [c for c in t.space(problem, limits(profile)).enumerate() if c["threads"] == 1][:keep]
    be = CpuBackend(problem, t, profile, timing=ONCE)
    try:
        outs = be.measure(cands)
    finally:
        be.close()
    return [(c.as_dict(), o.category, o.message[:200]) for c, o in zip(cands, outs) if not o.ok], cands


@pytest.mark.parametrize("name", ACTS)
def test_elementwise_template_epilogue_is_correct_at_sampled_settings(name, profile):
    """The compiled eltwise kernel applies the op's C snippet; the worker checks it against the fp64 reference."""
    for problem in (Problem("eltwise", (7, 37), name), Problem("eltwise", (5, 130), f"bias_{name}_add")):
        bad, _ = eltwise_failures(problem, profile, keep=6)
        assert not bad, bad


@pytest.mark.parametrize("op, dims, name", [("gemm", (9, 33, 17), "tanh"), ("gemv", (40, 24), "silu"),
                                            ("gemm", (4, 16, 8), "sigmoid"), ("gemm", (9, 33, 17), "erfgelu")])
def test_gemm_and_gemv_fused_epilogues(op, dims, name, profile):
    problem = Problem(op, dims, f"bias_{name}")
    t = TEMPLATES[op]
    space = t.space(problem, limits(profile))
    default = space.make({k.name: t.defaults(problem, limits(profile)).get(k.name, k.values[0]) for k in space.knobs})
    be = CpuBackend(problem, t, profile, timing=ONCE)
    try:
        (o,) = be.measure([default])
    finally:
        be.close()
    assert o.ok, o.message


def _graph(act: str):
    b = GraphBuilder(f"act-{act}", seed=3)
    h = b.input("x", (4, 24))
    h = b.op(act, b.linear(h, 24, 16, "l0"))
    return b.output(b.op(act, b.op("scale", h, factor=3.0)))


@pytest.mark.parametrize("name", ACTS)
def test_e_graph_fuses_it_into_the_linear_epilogue_and_plans_run_it(name):
    g = _graph(name)
    eg = saturate(g, ["epilogue", "layout", "algebra"])
    a = analyse(eg, g)
    fused = [n for ns in eg.classes.values() for n in ns if n.impl == "tmpl" and n.args[:2] == ("linear", name)]
    assert fused and all(n.id not in a.unavailable for n in fused)  # a GEMM template with the fused epilogue
    elt = [n for ns in eg.classes.values() for n in ns if n.impl == "tmpl" and n.args[0] == name]
    assert elt and all(a.problem(n) == Problem("eltwise", (4, 16), name) for n in elt)
    # the library-only program by the graph's own nodes runs and matches the reference
    prog = [{"cls": "x", "op": "T.input", "args": ["x"], "inputs": [], "knobs": None, "problem": None,
             "shape": [4, 24]}]
    prog += [{"cls": nm, "op": "T.param", "args": [nm], "inputs": [], "knobs": None, "problem": None,
              "shape": list(v.shape)} for nm, v in g.params.items()]
    shapes = g.shapes()
    for node in g.nodes:
        op = REGISTRY[node.op]
        prog.append({"cls": node.output, "op": f"lib{len(node.inputs)}", "args": [node.op, op.egg_attr(node.attrs)],
                     "inputs": list(node.inputs), "knobs": None, "problem": None, "shape": list(shapes[node.output])})
    xs = g.example_inputs(1)
    (out,) = Plan(g, prog, {}, {})(*xs)
    (ref,) = g.evaluate(*xs)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_torch_import_maps_them(tmp_path):
    torch = pytest.importorskip("torch")
    from planforge.ir import from_torch

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 6)

        def forward(self, x):
            return torch.tanh(torch.nn.functional.silu(self.fc(x))) + torch.sigmoid(x[:, :6])

    torch.manual_seed(0)
    m = M().eval()
    x = torch.randn(3, 8)
    x6 = x[:, :6].contiguous()

    class N(torch.nn.Module):  # slicing is not an IR op: feed the sliced part as its own input
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x, y):
            return torch.tanh(torch.nn.functional.silu(self.m.fc(x))) + torch.sigmoid(y)

    g = from_torch(N(), (x, x6))
    assert {"silu", "tanh", "sigmoid"} <= {n.op for n in g.nodes}
    (out,) = g.evaluate(x.numpy(), x6.numpy())
    np.testing.assert_allclose(out, N()(x, x6).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_onnx_import_maps_them(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from planforge.ir import UnsupportedOp, from_onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Tanh", ["s"], ["t"]),
             helper.make_node("Swish", ["t"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "acts", [x], [y]), opset_imports=[helper.make_opsetid("", 24)])
    g = from_onnx(model)
    assert [n.op for n in g.nodes] == ["sigmoid", "tanh", "silu"]
    xv = np.linspace(-4, 4, 10).reshape(2, 5).astype(np.float32)
    s = 1 / (1 + np.exp(-xv.astype(np.float64)))
    t = np.tanh(s)
    np.testing.assert_allclose(g.evaluate(xv)[0], t / (1 + np.exp(-t)), rtol=1e-9)
    nodes[2] = helper.make_node("Swish", ["t"], ["y"], alpha=2.0)
    bad = helper.make_model(helper.make_graph(nodes, "acts", [x], [y]), opset_imports=[helper.make_opsetid("", 24)])
    with pytest.raises(UnsupportedOp, match="alpha=2"):
        from_onnx(bad, strict=True)
