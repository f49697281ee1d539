"""Importing PyTorch modules (torch.export) and ONNX files into the IR: outputs match the framework's own."""
from __future__ import annotations

import numpy as np
import pytest

from planforge.ir import GraphError, ModelError, UnsupportedOp, from_exported, from_onnx, from_torch, load_model

TOL = dict(rtol=1e-4, atol=1e-5)       # fp32 framework vs the fp64 reference


@pytest.fixture(scope="module")
def torch():
    t = pytest.importorskip("torch")
    t.manual_seed(0)
    return t


@pytest.fixture(scope="module")
def onnx():
    return pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def ort():
    return pytest.importorskip("onnxruntime")


def _check_torch(torch, module, *xs):
    g = from_torch(module, xs)
    with torch.no_grad():
        want = module(*xs)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    got = g.evaluate(*(x.numpy() for x in xs))
    assert len(got) == len(want)
    for w, o in zip(want, got):
        np.testing.assert_allclose(o, w.numpy(), **TOL)
    return g


# -- torch ------------------------------------------------------------------------------------------------------------

def test_torch_mlp_matches_and_stores_weights_k_by_n(torch):
    nn = torch.nn
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(approximate="tanh"),
                      nn.Linear(32, 24), nn.GELU())
    g = _check_torch(torch, m, torch.randn(4, 16))
    assert g.inputs == {"input": (4, 16)}
    np.testing.assert_array_equal(g.params["0.weight"], m[0].weight.detach().numpy().T)   # [K, N]
    assert g.params["0.weight"].shape == (16, 32) and g.params["0.weight"].dtype == np.float32
    ops = [n.op for n in g.nodes]
    assert ops == ["matmul", "bias", "relu", "matmul", "bias", "gelu", "matmul", "bias", "gelu"]
    assert [n.attrs["approximate"] for n in g.nodes if n.op == "gelu"] == ["tanh", "none"]
    assert m.training, "from_torch restores the module's training flag"


def _block(torch, seq=6, width=16, heads=2):
    nn = torch.nn

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(width)
            self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
            self.ln2 = nn.LayerNorm([seq, width])          # normalises over two axes: a reshape sandwich

        def forward(self, x):
            h = self.ln(x)
            dh = width // heads
            q = self.q(h).reshape(seq, heads, dh).transpose(0, 1)             # [H, S, D]
            k = self.k(h).reshape(seq, heads, dh).permute(1, 2, 0)            # [H, D, S]
            v = self.v(h).view(seq, heads, dh).transpose(0, 1)
            p = torch.softmax((q @ k) * dh ** -0.5, dim=-1)
            ctx = (p @ v).transpose(0, 1).contiguous().reshape(seq, width)
            x = x + self.o(ctx)                                               # residual
            col = torch.softmax(x, dim=0)                                     # not the last axis
            return self.ln2(x) - 1.0, torch.cat([x, col], dim=-1) / 2.0

    return Attn()


def test_torch_block_with_layernorm_softmax_residual_matches(torch):
    m = _block(torch)
    g = _check_torch(torch, m, torch.randn(6, 16))
    ops = {n.op for n in g.nodes}
    assert {"layernorm", "softmax", "add", "scale", "transpose", "reshape", "concat", "matmul", "bias"} <= ops


@pytest.mark.filterwarnings("ignore::FutureWarning")      # torch's own, from run_decompositions
def test_torch_core_aten_after_decompositions_matches(torch):
    """The same block lowered to core ATen (addmm, permute, _softmax, native_layer_norm, view, clone)."""
    m = _block(torch).eval()
    x = torch.randn(6, 16)
    ep = torch.export.export(m, (x,)).run_decompositions()
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "aten.addmm.default" in targets and "aten.linear.default" not in targets
    g = from_exported(ep)
    with torch.no_grad():
        want = m(x)
    for w, o in zip(want, g.evaluate(x.numpy())):
        np.testing.assert_allclose(o, w.numpy(), **TOL)


def test_torch_batched_linear_and_constants(torch):
    nn = torch.nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 5)
            self.register_buffer("shift", torch.randn(5))
            self.k = torch.tensor(3.0)                          # a lifted constant

        def forward(self, x):                                   # x: [B, S, 8]
            return (self.fc(x) - self.shift) * self.k + 0.5

    g = _check_torch(torch, M(), torch.randn(2, 3, 8))
    assert [n.op for n in g.nodes] == ["matmul", "bias", "bias", "scale", "bias"]


def test_torch_tied_weight_is_transposed_once(torch):
    nn = torch.nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8, bias=False)

        def forward(self, x):
            return self.fc(torch.relu(self.fc(x)))

    g = _check_torch(torch, M(), torch.randn(3, 8))
    assert list(g.params) == ["fc.weight"]


def test_torch_unsupported_op_names_op_and_where(torch):
    nn = torch.nn

    class Wave(nn.Module):
        def forward(self, x):
            return torch.special.bessel_j0(x)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.wave = nn.Linear(4, 4), Wave()

        def forward(self, x):
            return self.wave(self.fc(x))

    with pytest.raises(UnsupportedOp) as e:
        from_torch(M(), (torch.randn(2, 4),), strict=True)
    msg = str(e.value)
    assert e.value.op == "aten.special_bessel_j0.default"
    assert "aten.special_bessel_j0" in msg and "node 'special_bessel_j0'" in msg and "module 'wave'" in msg
    assert "test_import.py" in msg and "torch.special.bessel_j0(x)" in msg
    assert isinstance(e.value, GraphError)


def test_torch_broadcast_add_of_two_computed_tensors_expands(torch):
    class M(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    x, y = torch.randn(3, 4), torch.randn(1, 4)
    g = from_torch(M(), (x, y))
    assert [n.op for n in g.nodes] == ["expand", "add"]
    np.testing.assert_allclose(g.evaluate(x.numpy(), y.numpy())[0], (x + y).numpy(), **TOL)


def test_torch_dynamic_shapes_need_input_shapes(torch, tmp_path):
    nn = torch.nn
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    ep = torch.export.export(m, (torch.randn(2, 8),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    with pytest.raises(ModelError, match=r"input 'input' has dynamic size.*input_shapes=\{'input': \(1, 8\)\}"):
        from_exported(ep)
    x = torch.randn(5, 8)
    g = from_exported(ep, input_shapes={"input": (5, 8)})
    assert g.inputs == {"input": (5, 8)}
    with torch.no_grad():
        np.testing.assert_allclose(g.evaluate(x.numpy())[0], m(x).numpy(), **TOL)
    with pytest.raises(ModelError, match="not inputs"):
        from_exported(ep, input_shapes={"obs": (5, 8)})
    # through a .pt2 file, the way `planforge tune --workload model.pt2` reads it
    path = tmp_path / "mlp.pt2"
    torch.export.save(ep, str(path))
    g2 = load_model(path, input_shapes={"input": (5, 8)})
    assert g2.name == "mlp"
    np.testing.assert_allclose(g2.evaluate(x.numpy())[0], g.evaluate(x.numpy())[0])


def test_torch_unsupported_input_dtype_is_a_clear_error(torch):
    class M(torch.nn.Module):
        def forward(self, x):
            return x * 2

    with pytest.raises(ModelError, match="input 'x' has dtype torch.float16"):
        from_torch(M(), (torch.ones(2, 2, dtype=torch.float16),))


# -- ONNX -------------------------------------------------------------------------------------------------------------

def _save(onnx, tmp_path, nodes, inputs, outputs, inits, opset=20, name="m"):
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def _check_onnx(ort, path, feeds, **kw):
    g = from_onnx(path, **kw)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    got = g.evaluate(*(feeds[n] for n in g.inputs))
    assert len(got) == len(want)
    for w, o in zip(want, got):
        np.testing.assert_allclose(o, w, **TOL)
    return g


def _rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


def test_onnx_mlp_gemm_matmul_add_relu_softmax(onnx, ort, tmp_path):
    from onnx import helper

    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], name="fc1", transB=1),
        helper.make_node("Relu", ["h1"], ["a1"], name="relu1"),
        helper.make_node("MatMul", ["a1", "w2"], ["m2"], name="fc2"),
        helper.make_node("Add", ["m2", "b2"], ["h2"], name="bias2"),
        helper.make_node("Gemm", ["h2", "w3", "b3"], ["h3"], name="fc3", alpha=0.5, beta=2.0),
        helper.make_node("Softmax", ["h3"], ["y"], name="sm", axis=-1),
    ]
    inits = {"w1": _rand(32, 16), "b1": _rand(32), "w2": _rand(32, 24), "b2": _rand(24),
             "w3": _rand(24, 8), "b3": _rand(1, 8)}
    path = _save(onnx, tmp_path, nodes, [("x", [4, 16])], [("y", [4, 8])], inits)
    g = _check_onnx(ort, path, {"x": _rand(4, 16)})
    np.testing.assert_array_equal(g.params["w1"], inits["w1"].T)       # transB: stored [K, N]
    assert [n.op for n in g.nodes] == ["matmul", "bias", "relu", "matmul", "bias", "matmul", "scale", "bias",
                                       "softmax"]
    assert g.name == "m" and g.outputs == ["y"]


def test_onnx_block_layernorm_transpose_reshape_concat_gelu(onnx, ort, tmp_path):
    from onnx import helper

    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], name="ln", epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "wq"], ["q"], name="q"),
        helper.make_node("Reshape", ["q", "heads"], ["qh"], name="split_heads"),        # (0, 2, -1)
        helper.make_node("Transpose", ["qh"], ["qt"], name="qt", perm=[1, 0, 2]),
        helper.make_node("Transpose", ["qh"], ["kt"], name="kt", perm=[1, 2, 0]),
        helper.make_node("MatMul", ["qt", "kt"], ["s"], name="scores"),
        helper.make_node("Mul", ["s", "scale"], ["ss"], name="scale"),
        helper.make_node("Softmax", ["ss"], ["p"], name="sm"),
        helper.make_node("MatMul", ["p", "qt"], ["ctx"], name="ctx"),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], name="ctx_t", perm=[1, 0, 2]),
        helper.make_node("Reshape", ["ctx_t", "flat"], ["merged"], name="merge"),       # (-1, 16)
        helper.make_node("Add", ["x", "merged"], ["res"], name="residual"),
        helper.make_node("Gelu", ["res"], ["act"], name="gelu", approximate="tanh"),
        helper.make_node("Div", ["act", "two"], ["half"], name="half"),
        helper.make_node("Concat", ["half", "res"], ["y"], name="cat", axis=1),
        helper.make_node("Flatten", ["qh"], ["z"], name="flat", axis=1),
    ]
    inits = {"g": _rand(16) + 1, "b": _rand(16), "wq": _rand(16, 16), "heads": np.array([0, 2, -1], np.int64),
             "flat": np.array([-1, 16], np.int64), "scale": np.array(0.25, np.float32),
             "two": np.array([2.0], np.float32)}
    path = _save(onnx, tmp_path, nodes, [("x", [6, 16])], [("y", [6, 32]), ("z", [6, 16])], inits)
    g = _check_onnx(ort, path, {"x": _rand(6, 16)})
    assert {"layernorm", "transpose", "reshape", "concat", "gelu", "scale", "add"} <= {n.op for n in g.nodes}


def test_onnx_old_opset_softmax_flattens_from_axis(onnx, ort, tmp_path):
    from onnx import helper

    nodes = [helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=1)]    # opset 11: over axes 1 and 2 jointly
    path = _save(onnx, tmp_path, nodes, [("x", [2, 3, 4])], [("y", [2, 3, 4])], {}, opset=11)
    _check_onnx(ort, path, {"x": _rand(2, 3, 4)})


def test_onnx_folds_shape_arithmetic(onnx, ort, tmp_path):
    """The exporters' Shape -> Gather -> Concat -> Reshape chains are known at import time."""
    from onnx import helper

    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "zero"], ["n1"], name="unsq"),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ]
    inits = {"zero": np.array(0, np.int64), "minus1": np.array([-1], np.int64)}
    path = _save(onnx, tmp_path, nodes, [("x", [3, 2, 4])], [("y", [3, 8])], inits)
    g = _check_onnx(ort, path, {"x": _rand(3, 2, 4)})
    assert [(n.op, n.attrs) for n in g.nodes] == [("reshape", {"shape": (3, 8)})]
    assert g.params == {}


@pytest.mark.parametrize("half_first", [False, True])
def test_onnx_erf_gelu_pattern_becomes_gelu(onnx, ort, tmp_path, half_first):
    """Exporters before opset 20 write GELU out with Erf; the importer recognises it in either order."""
    from onnx import helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Div", ["h", "sqrt2"], ["hs"], name="div"),
             helper.make_node("Erf", ["hs"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["e1"], name="add1")]
    if half_first:
        nodes += [helper.make_node("Mul", ["h", "half"], ["hh"], name="half"),
                  helper.make_node("Mul", ["hh", "e1"], ["y"], name="gelu")]
    else:
        nodes += [helper.make_node("Mul", ["h", "e1"], ["he"], name="xe"),
                  helper.make_node("Mul", ["he", "half"], ["y"], name="gelu")]
    inits = {"w": _rand(8, 8), "sqrt2": np.array(2 ** 0.5, np.float32), "one": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32)}
    path = _save(onnx, tmp_path, nodes, [("x", [3, 8])], [("y", [3, 8])], inits, opset=17)
    g = _check_onnx(ort, path, {"x": _rand(3, 8)})
    assert [(n.op, n.attrs.get("approximate")) for n in g.nodes] == [("matmul", None), ("gelu", "none")]
    assert list(g.params) == ["w"]


def test_onnx_erf_outside_the_gelu_pattern_is_unsupported(onnx, tmp_path):
    from onnx import helper

    nodes = [helper.make_node("Erf", ["x"], ["y"], name="e")]
    path = _save(onnx, tmp_path, nodes, [("x", [3, 8])], [("y", [3, 8])], {})
    with pytest.raises(UnsupportedOp, match=r"Erf at node #0 'e'.*GELU pattern"):
        from_onnx(path)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")   # torch's TorchScript-based exporter warns of itself
def test_torch_exported_onnx_with_dynamic_batch(torch, onnx, ort, tmp_path):
    """A module through torch's own ONNX exporter: Erf-GELU and Shape/Gather/Concat shape arithmetic."""
    nn = torch.nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.fc, self.act = nn.LayerNorm(8), nn.Linear(8, 12), nn.GELU()

        def forward(self, x):                                       # x: [B, 3, 8]
            return self.act(self.fc(self.ln(x))).reshape(x.shape[0], -1)

    m = M().eval()
    path = tmp_path / "m.onnx"
    torch.onnx.export(m, (torch.randn(2, 3, 8),), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}}, opset_version=17, dynamo=False)
    x = torch.randn(4, 3, 8)
    g = _check_onnx(ort, path, {"x": x.numpy()}, input_shapes={"x": (4, 3, 8)})
    with torch.no_grad():
        np.testing.assert_allclose(g.evaluate(x.numpy())[0], m(x).numpy(), **TOL)
    assert [n.op for n in g.nodes] == ["layernorm", "matmul", "bias", "gelu", "reshape"]


def test_onnx_dynamic_input_needs_input_shapes(onnx, ort, tmp_path):
    from onnx import helper

    nodes = [helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")]
    path = _save(onnx, tmp_path, nodes, [("x", ["batch", 8])], [("y", ["batch", 3])], {"w": _rand(8, 3)})
    with pytest.raises(ModelError, match=r"input 'x' has a dynamic shape \('batch', 8\).*"
                                         r"input_shapes=\{'x': \(1, 8\)\}"):
        from_onnx(path)
    g = _check_onnx(ort, path, {"x": _rand(5, 8)}, input_shapes={"x": (5, 8)})
    assert g.inputs == {"x": (5, 8)}
    with pytest.raises(ModelError, match="does not fit"):
        from_onnx(path, input_shapes={"x": (5, 9)})
    with pytest.raises(ModelError, match="not inputs of the model"):
        from_onnx(path, input_shapes={"obs": (5, 8)})
    assert load_model(path, input_shapes={"x": (2, 8)}).inputs == {"x": (2, 8)}


def test_onnx_unsupported_op_names_op_node_and_index(onnx, tmp_path):
    from onnx import helper

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="act"),
             helper.make_node("Acosh", ["r"], ["y"], name="wave")]
    path = _save(onnx, tmp_path, nodes, [("x", [2, 4])], [("y", [2, 4])], {})
    with pytest.raises(UnsupportedOp, match=r"(?s)unsupported op.*Acosh at node #1 'wave'") as e:
        from_onnx(path, strict=True)
    assert e.value.op == "Acosh"


def test_onnx_multiplying_by_a_tensor_is_elementwise(onnx, tmp_path):
    from onnx import helper

    nodes = [helper.make_node("Mul", ["x", "w"], ["y"], name="gate")]
    w = _rand(4)
    path = _save(onnx, tmp_path, nodes, [("x", [2, 4])], [("y", [2, 4])], {"w": w})
    g = from_onnx(path)
    assert [n.op for n in g.nodes] == ["multiply"]
    x = _rand(2, 4)
    np.testing.assert_allclose(g.evaluate(x)[0], x * w, **TOL)


@pytest.mark.parametrize("file, content, pattern", [
    ("broken.onnx", b"\x08\x07\x12\x04junk\xff\xff\xff not a protobuf", r"cannot read ONNX file '.*broken.onnx'"),
    ("empty.onnx", b"", r"cannot read ONNX file '.*empty.onnx': it holds no ONNX graph"),
    ("missing.onnx", None, r"'.*missing.onnx': no such file"),
    ("model.tflite", b"x", r"unknown model format '.tflite'.*\.onnx.*\.pt2"),
    ("broken.pt2", b"not a zip archive", r"cannot read '.*broken.pt2' as a torch.export archive"),
])
def test_malformed_or_unknown_files_are_clear_errors(tmp_path, file, content, pattern):
    pytest.importorskip("torch" if file.endswith(".pt2") else "onnx")
    path = tmp_path / file
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelError, match=pattern):
        load_model(path)
