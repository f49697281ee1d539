"""The op registry: every op's facts agree with each other (shape rule, reference, library step, e-graph attributes)."""
import numpy as np
import pytest

from planforge.ir import GraphError, GraphBuilder, ZOO
from planforge.ir.zoo import transformer
from planforge.ops import LIBRARIES, ONNX, REGISTRY, TORCH, get, ir_ops
from planforge.ops.kernel import chain_steps, gemm_epilogues


def graphs():
    yield from (make() for make in ZOO.values())
    yield transformer(layers=2, seq=4, width=8, heads=2)
    b = GraphBuilder("misc", seed=2)
    x = b.input("x", (3, 8))
    y = b.op("concat", b.op("sigmoid", x), b.op("tanh", x), b.op("silu", x), axis=-1)
    yield b.output(b.op("gelu", y, approximate="none"), b.op("transpose", y))


def test_every_ir_op_has_a_library_step_and_every_internal_op_is_marked():
    for name in ir_ops():
        op = get(name)
        assert op.library, name
        assert not op.internal
    assert {"mul", "normalize", "exp_shifted", "div_rowsum", "pair"} <= {n for n, o in REGISTRY.items() if o.internal}
    with pytest.raises(KeyError, match="known ops: .*softmax"):
        get("conv3d")
    assert TORCH["addmm"].name == ONNX["Gemm"].name == "linear" and ONNX["Swish"].name == "silu"
    assert all(name in LIBRARIES for op in REGISTRY.values() for name in op.library)


@pytest.mark.parametrize("g", list(graphs()), ids=lambda g: g.name)
def test_shape_rule_reference_and_library_step_agree_on_every_node(g):
    rng = np.random.default_rng(0)
    shapes = g.shapes()
    env = {k: rng.standard_normal(s).astype(np.float64) for k, s in g.inputs.items()}
    env.update({k: v.astype(np.float64) for k, v in g.params.items()})
    for node in g.nodes:
        op = REGISTRY[node.op]
        args = [env[i] for i in node.inputs]
        ref = op.reference(args, node.attrs)
        assert ref.shape == shapes[node.output], node.where()
        out = np.empty(ref.shape, np.float32)
        lib = op.library[op.name]
        lib.step([np.ascontiguousarray(a, dtype=np.float32) for a in args], out, node.attrs)()
        np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-4 * (1 + np.abs(ref).max()), err_msg=node.where())
        # the e-graph's attribute string gives back what the op needs
        assert op.egg_attr(op.from_egg(op.egg_attr(node.attrs))) == op.egg_attr(node.attrs), node.where()
        env[node.output] = ref


def test_bad_nodes_are_graph_errors_that_say_where():
    b = GraphBuilder("bad")
    x = b.input("x", (2, 3))
    b.op("matmul", x, x, name="mm")
    with pytest.raises(GraphError, match=r"node 'mm' \(matmul\): shape mismatch"):
        b.output("mm")
    b = GraphBuilder("bad2")
    b.op("relu", b.input("x", (2, 3)), b.input("y", (2, 3)), name="r")
    with pytest.raises(GraphError, match="relu takes 1 inputs, got 2"):
        b.output("r")
    b = GraphBuilder("bad3")
    b.op("reshape", b.input("x", (2, 3)), name="r")  # no target shape
    with pytest.raises(GraphError, match="node 'r' .*reshape"):
        b.output("r")


def test_epilogue_names_follow_the_registry():
    assert gemm_epilogues()[:2] == ("none", "bias")
    assert {"bias_relu", "bias_gelu", "bias_sigmoid", "bias_tanh", "bias_silu"} <= set(gemm_epilogues())
    assert {"bias", "add", "relu", "gelu"} <= set(chain_steps())


@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (2, 1, 4, 4), (1, 4, 3, 2), (1, 5, 2, 3), (1, 16, 2, 3)])
def test_nchw_to_nhwc_step_reads_its_input_buffer_at_each_call(shape):
    """An image's few channels are copied one by one (views of the bound buffers); any count gives the transpose."""
    from planforge.ops.transpose import _step

    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape).astype(np.float32)
    out = np.empty(tuple(shape[p] for p in (0, 2, 3, 1)), np.float32)
    step = _step([a], out, {"perm": (0, 2, 3, 1)})
    for _ in range(2):
        a[...] = rng.standard_normal(shape)
        step()
        assert np.array_equal(out, np.transpose(a, (0, 2, 3, 1)))
    strided = rng.standard_normal((1, 3, 4, 10)).astype(np.float32)[..., ::2]  # not contiguous: the one copy
    out = np.empty((1, 4, 5, 3), np.float32)
    _step([strided], out, {"perm": (0, 2, 3, 1)})()
    assert np.array_equal(out, np.transpose(strided, (0, 2, 3, 1)))
