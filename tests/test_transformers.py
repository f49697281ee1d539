"""Transformer models in (issue 13): the ops they are made of, per op through both importers, whole tiny models built
from ``transformers`` configs (random weights, never downloaded), tuned plans that run them, the fallback for ops
with no rule and strict mode that lists them all.

Every op is checked three ways: the imported graph's fp64 reference against torch (or onnxruntime), the op's numpy
library step in fp32 against that reference (through its e-graph attribute string, as a plan binds it), and that the
import needed no fallback step (the op really is mapped)."""
import numpy as np
import pytest

from planforge.ir import UnsupportedOp, from_onnx, from_torch
from planforge.ir.frontend import UnsupportedOps
from planforge.ops import REGISTRY
from planforge.ops.fallback import steps
from planforge.targets.cpu.plan import lib_step

torch = pytest.importorskip("torch")
nn = torch.nn
TOL = dict(rtol=2e-5, atol=2e-5)


def library_eval(g, xs):
    """The graph run node by node by its ops' first library step in fp32 (what a library plan binds)."""
    env = {n: np.asarray(x).astype(np.float32) for n, x in zip(g.inputs, xs)}
    env.update({k: v.astype(np.float32) for k, v in g.params.items()})
    shapes = g.shapes()
    for node in g.nodes:
        op = REGISTRY[node.op]
        out = np.empty(shapes[node.output], np.float32)
        lib_step(next(iter(op.library)), op.egg_attr(node.attrs), [env[i] for i in node.inputs], out)()
        env[node.output] = out
    return [env[o] for o in g.outputs]


def check(module, *args, ops=(), fallbacks=0, tol=TOL):
    """Import ``module`` at ``args``; its reference and its library steps match torch; ``ops`` appear in it."""
    module.eval()
    g = from_torch(module, args)
    with torch.no_grad():
        want = module(*args)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    xs = [a.numpy() for a in args]
    assert len(steps(g)) == fallbacks, steps(g)
    for got, lib, w in zip(g.evaluate(*xs), library_eval(g, xs), want):
        w = w.double().numpy()
        np.testing.assert_allclose(got, w, **tol)
        np.testing.assert_allclose(lib, w, **tol)
    present = {n.op for n in g.nodes}
    assert set(ops) <= present, (ops, present)
    return g


class F(nn.Module):
    """A module from a function of its inputs (and an optional weight ``w``)."""

    def __init__(self, f, w=None):
        super().__init__()
        self.f = f
        if w is not None:
            self.w = nn.Parameter(w)

    def forward(self, *xs):
        return self.f(self, *xs)


def rnd(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


IDS = torch.tensor([[3, 0, 7, 7, 1, 9]])


# -- ops, through torch.export --------------------------------------------------------------------------------------

def test_embedding_of_int64_ids_and_int32_index_select():
    emb = nn.Embedding(10, 8)
    g = check(emb, IDS, ops=["gather"])
    assert g.input_dtypes == {"input": "int64"}
    ex = g.example_inputs(0)[0]
    assert ex.dtype == np.int64 and ex.min() >= 0 and ex.max() < 10       # drawn from the table's rows
    check(F(lambda m, x, i: torch.index_select(x, 1, i)), rnd(3, 5), torch.tensor([4, 0, 4], dtype=torch.int32),
          ops=["gather"])


def test_positions_from_arange_and_position_embedding():
    class Pos(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(10, 8), nn.Embedding(16, 8)

        def forward(self, ids):
            p = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
            return self.tok(ids) + self.pos(p)

    check(Pos(), IDS, ops=["gather", "add"])


@pytest.mark.parametrize("f, ops", [
    (lambda m, x: x[:, 1:4], ["slice"]),
    (lambda m, x: x[..., ::2], ["slice"]),
    (lambda m, x: x.select(1, -1) * 2, ["slice", "reshape"]),
    (lambda m, x: x.narrow(2, 1, 3), ["slice"]),
    (lambda m, x: torch.cat([t * (i + 1) for i, t in enumerate(x.split(2, dim=-1))], -1), ["slice", "concat"]),
    (lambda m, x: torch.cat(x.chunk(3, dim=1)[::-1], 1), ["slice"]),
    (lambda m, x: sum(t * (i + 1) for i, t in enumerate(x.unbind(1))), ["slice", "add"]),
    (lambda m, x: x.split_with_sizes([1, 4, 1], dim=2)[1].contiguous(), ["slice"]),
    (lambda m, x: x.unsqueeze(1).squeeze(1).view(2, -1).flatten(), ["reshape"]),
])
def test_slicing_splitting_and_views(f, ops):
    check(F(f), rnd(2, 3, 6), ops=ops)


def test_expand_and_broadcasting_of_computed_tensors():
    check(F(lambda m, x, y: x.expand(2, 3, 4) * 2), rnd(1, 3, 1), rnd(2, 3, 4), ops=["expand"])
    check(F(lambda m, x, y: x + y.tanh()), rnd(2, 3, 4), rnd(1, 3, 1), ops=["expand", "add"])
    check(F(lambda m, x, y: x * y.tanh() / (y.abs() + 1)), rnd(2, 3, 4), rnd(3, 1), ops=["multiply", "divide"])
    check(F(lambda m, x: x * m.w, w=rnd(4)), rnd(2, 3, 4), ops=["multiply"])      # a non-uniform weight


def test_masks_compare_where_masked_fill_logic_full_like_triu():
    def f(m, x, mask):
        keep = (mask == 1) & ~(x > 2.0) | torch.full_like(x, 0.0).bool()
        causal = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
        y = x.masked_fill(causal, -1.0)
        return torch.where(keep, y, torch.zeros_like(y)) + (x <= 0).float() + torch.logical_xor(x < 0, mask > 0)
    g = check(F(f), rnd(2, 4, 4), torch.tensor([[1, 0, 1, 1]]),
              ops=["eq", "gt", "le", "lt", "logical_not", "logical_and", "where", "logical_xor"])
    assert list(g.input_dtypes.values()) == ["int64"] and list(g.inputs)[1] in g.input_dtypes


def test_bool_and_int_casts_and_dropout_in_eval():
    def f(m, x, mask):
        return nn.functional.dropout(x, 0.5, training=False) * mask.to(torch.float32) + mask.bool().to(x.dtype)
    check(F(f), rnd(2, 3), torch.tensor([[1, 0, 2]], dtype=torch.int32), ops=["ne", "multiply"])
    check(F(lambda m, x, b: x * b.float()), rnd(2, 3), torch.tensor([True, False, True]), ops=["multiply"])


def test_rmsnorm_pow_mean_rsqrt_sqrt_div():
    def rms(m, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return m.w * (x * torch.rsqrt(v + 1e-6)) + x / torch.sqrt(v + 1) + x.sum(dim=(0, 2)).mean()
    check(F(rms, w=rnd(8) + 1), rnd(2, 3, 8), ops=["pow", "mean", "rsqrt", "sqrt", "divide", "sum"])


def test_gelu_tanh_written_out_and_builtin():
    def f(m, x):  # the written-out form imports as one gelu (ops.gelu.fold_written_out)
        out = 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))
        return out + nn.functional.gelu(x, approximate="tanh") + nn.functional.gelu(x)
    g = check(F(f), rnd(3, 8), ops=["gelu"])
    assert not {"pow", "tanh"} & {n.op for n in g.nodes}

    def parts(m, x):  # its pieces alone stay themselves
        return 0.5 * x * (2.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))
    check(F(parts), rnd(3, 8), ops=["pow", "tanh"])


def test_rotary_embedding_cos_sin_cat_neg_halves():
    def rotary(m, q):
        S, D = q.shape[-2], q.shape[-1]
        inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
        ang = torch.outer(torch.arange(S).float(), inv)
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x1, x2 = q[..., : D // 2], q[..., D // 2:]
        return q * cos + torch.cat((-x2, x1), dim=-1) * sin
    check(F(rotary), rnd(1, 2, 5, 8), ops=["slice", "concat", "scale", "multiply"])


@pytest.mark.parametrize("kind", ["none", "causal", "bool", "float", "gqa", "gqa_bool", "runtime_mask"])
def test_scaled_dot_product_attention(kind):
    sdpa = nn.functional.scaled_dot_product_attention
    q, k, v = rnd(1, 4, 6, 8), rnd(1, 4, 6, 8, seed=1), rnd(1, 4, 6, 8, seed=2)
    tri = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    pad = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    pad[..., 4:] = False
    args, ops = (q, k, v), ["sdpa"]
    if kind == "none":
        f = lambda m, q, k, v: sdpa(q, k, v)                          # noqa: E731
    elif kind == "causal":
        f = lambda m, q, k, v: sdpa(q, k, v, is_causal=True, scale=0.3)   # noqa: E731
    elif kind == "bool":                                               # a known causal mask: the causal attribute
        f = lambda m, q, k, v: sdpa(q, k, v, attn_mask=tri)             # noqa: E731
    elif kind == "float":                                              # a padding bias: lowered to its ops
        bias = torch.zeros(1, 1, 6, 6).masked_fill(~pad, -1e9)
        f, ops = (lambda m, q, k, v: sdpa(q, k, v, attn_mask=bias)), ["matmul", "softmax", "add"]
    elif kind == "gqa":
        args = (q, k[:, :2], v[:, :2])
        f = lambda m, q, k, v: sdpa(q, k, v, is_causal=True, enable_gqa=True)   # noqa: E731
    elif kind == "gqa_bool":
        args, ops = (q, k[:, :2], v[:, :2]), ["where", "expand", "softmax"]
        f = lambda m, q, k, v: sdpa(q, k, v, attn_mask=pad & tri, enable_gqa=True)   # noqa: E731
    else:                                                              # a mask computed from a runtime input
        args, ops = (q, k, v, torch.tensor([[1, 1, 1, 0, 0, 1]])), ["eq", "where", "softmax"]
        f = lambda m, q, k, v, am: sdpa(q, k, v, attn_mask=(am[:, None, None, :] == 1))   # noqa: E731
    check(F(f), *args, ops=ops)


def test_batch_matmul_and_noop_metadata_checks():
    check(F(lambda m, a, b: torch.bmm(a, b) + torch.matmul(a, b)), rnd(3, 4, 5), rnd(3, 5, 2), ops=["matmul"])
    check(F(lambda m, x: x.to(torch.float32).contiguous().clone() * 3), rnd(2, 2), ops=["scale"])


# -- ops, through ONNX ----------------------------------------------------------------------------------------------

def onnx_model(nodes, inputs, outputs, inits=(), opset=18):
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    def vi(name, arr_or_shape, elem=None):
        if isinstance(arr_or_shape, np.ndarray):
            return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr_or_shape.dtype),
                                                 arr_or_shape.shape)
        return helper.make_tensor_value_info(name, elem or onnx.TensorProto.FLOAT, arr_or_shape)
    graph = helper.make_graph(nodes, "m", [vi(k, v) for k, v in inputs.items()],
                              [vi(k, list(shp)) for k, shp in outputs.items()],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def check_onnx(nodes, inputs, outputs, inits=(), opset=18, ops=(), fallbacks=0):
    ort = pytest.importorskip("onnxruntime")

    model = onnx_model(nodes, inputs, outputs, inits, opset)
    g = from_onnx(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, inputs)
    xs = list(inputs.values())
    assert len(steps(g)) == fallbacks, steps(g)
    for got, lib, w in zip(g.evaluate(*xs), library_eval(g, xs), want):
        np.testing.assert_allclose(got, w.astype(np.float64), **TOL)
        np.testing.assert_allclose(lib, w.astype(np.float64), **TOL)
    assert set(ops) <= {n.op for n in g.nodes}
    return g


def _r(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("opset", [17, 18])
def test_onnx_gather_slice_split_expand_reduce(opset):
    pytest.importorskip("onnx")
    from onnx import helper

    split = ([helper.make_node("Split", ["x", "sz"], ["a", "b"], axis=2)], {"sz": np.array([2, 4])})
    if opset >= 18:
        split = ([helper.make_node("Split", ["x"], ["a", "b"], axis=2, num_outputs=2)], {})
        split[0].append(helper.make_node("Identity", ["a"], ["a2"]))
    axes = {"axes": np.array([-1])}
    mean = (helper.make_node("ReduceMean", ["p", "axes"], ["mu"], keepdims=1) if opset >= 18
            else helper.make_node("ReduceMean", ["p"], ["mu"], axes=[-1], keepdims=1))
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
             helper.make_node("Slice", ["e", "st", "en", "ax"], ["x"]),
             *split[0],
             helper.make_node("Pow", ["b", "two"], ["p"]),
             mean,
             helper.make_node("Sqrt", ["mu"], ["s"]),
             helper.make_node("Reciprocal", ["s"], ["r"]),
             helper.make_node("Expand", ["r", "shp"], ["y"])]
    inits = {"table": _r(10, 8), "st": np.array([1]), "en": np.array([7]), "ax": np.array([2]),
             "two": np.float32(2.0), "shp": np.array([1, 4, 4]), **split[1], **(axes if opset >= 18 else {})}
    check_onnx(nodes, {"ids": np.array([[1, 2, 9, 0]])}, {"y": (1, 4, 4)}, inits, opset,
               ops=["gather", "slice", "pow", "mean", "sqrt", "reciprocal", "expand"])


def test_onnx_masks_where_cast_and_isnan():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Equal", ["mask", "one"], ["eq"]),
             helper.make_node("Not", ["eq"], ["ne"]),
             helper.make_node("Cast", ["ne"], ["nef"], to=TensorProto.FLOAT),
             helper.make_node("IsNaN", ["x"], ["nan"]),
             helper.make_node("Or", ["eq", "nan"], ["keep"]),
             helper.make_node("Where", ["keep", "x", "ninf"], ["w"]),
             helper.make_node("Softmax", ["w"], ["sm"], axis=-1),
             helper.make_node("Add", ["sm", "nef"], ["y"])]
    check_onnx(nodes, {"x": _r(2, 5), "mask": np.array([[1, 0, 1, 1, 0]])}, {"y": (2, 5)},
               {"one": np.array(1), "ninf": np.float32(-1e9)}, ops=["eq", "logical_not", "where", "isnan"])


def test_onnx_folding_falls_back_to_onnxruntime(monkeypatch):
    """A node onnx's reference evaluator fails on (as BERT's exported mask arithmetic does) folds with onnxruntime."""
    pytest.importorskip("onnx")
    import onnx.reference
    from onnx import helper

    class Broken:
        def __init__(self, *a, **k):
            pass

        def run(self, *a, **k):
            raise ValueError("cannot reshape array of size 1 into shape (1,16)")

    monkeypatch.setattr(onnx.reference, "ReferenceEvaluator", Broken)
    nodes = [helper.make_node("Range", ["z", "n", "one"], ["pos"]), helper.make_node("Cast", ["pos"], ["posf"], to=1),
             helper.make_node("Add", ["x", "posf"], ["y"])]
    model = onnx_model(nodes, {"x": _r(2, 4)}, {"y": (2, 4)}, {"z": np.array(0), "n": np.array(4),
                                                                "one": np.array(1)})
    g = from_onnx(model)
    x = _r(2, 4)
    np.testing.assert_allclose(g.evaluate(x)[0], x + np.arange(4), **TOL)


# -- fallback steps and strict mode ---------------------------------------------------------------------------------

class Wave(nn.Module):
    def forward(self, x):
        return torch.special.bessel_j0(x)


class Inv(nn.Module):
    def forward(self, x):
        return torch.erfinv(x.tanh() * 0.9)


class Odd(nn.Module):
    """Two ops planforge has no rule for, in two submodules."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.wave, self.inv = Wave(), Inv()

    def forward(self, x):
        return self.inv(self.wave(self.fc(x))) + x


def test_strict_lists_every_unsupported_op_with_module_and_line():
    with pytest.raises(UnsupportedOps) as e:
        from_torch(Odd(), (rnd(3, 4),), strict=True)
    msg = str(e.value)
    assert {u.op for u in e.value.ops} == {"aten.special_bessel_j0.default", "aten.erfinv.default"}
    assert "2 unsupported op(s)" in msg and "module 'wave'" in msg and "module 'inv'" in msg
    assert msg.count("test_transformers.py:") == 2 and "torch.special.bessel_j0(x)" in msg and "torch.erfinv(" in msg
    assert isinstance(e.value, UnsupportedOp)


def test_onnx_strict_lists_every_node_and_fallback_runs_it():
    pytest.importorskip("onnx")
    from onnx import helper

    nodes = [helper.make_node("Acosh", ["x"], ["a"], name="first"), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Asinh", ["r"], ["y"], name="second")]
    model = onnx_model(nodes, {"x": _r(2, 3) ** 2 + 1}, {"y": (2, 3)})
    with pytest.raises(UnsupportedOps, match=r"(?s)Acosh at node #0 'first'.*Asinh at node #2 'second'"):
        from_onnx(model, strict=True)
    g = check_onnx(nodes, {"x": _r(2, 3) ** 2 + 1}, {"y": (2, 3)}, fallbacks=2)
    assert [op for op, _ in steps(g)] == ["Acosh", "Asinh"]


def test_unsupported_ops_run_as_fallback_steps_in_a_plan():
    from planforge.targets import get_target

    m = Odd().eval()
    x = rnd(3, 4)
    g = check(m, x, fallbacks=2, tol=dict(rtol=1e-4, atol=1e-5))
    assert [op for op, _ in steps(g)] == ["aten.special_bessel_j0.default", "aten.erfinv.default"]
    plan = get_target("cpu").plan(g, None)            # the library plan: every node a bound library step
    with torch.no_grad():
        np.testing.assert_allclose(plan(x.numpy())[0], m(x).numpy(), rtol=1e-5, atol=1e-6)


# -- whole models from transformers configs ---------------------------------------------------------------------------

def hf():
    return pytest.importorskip("transformers")


def gpt2(layers=2, width=128):
    cfg = hf().GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=96, n_positions=32,
                                  use_cache=False, bos_token_id=0, eos_token_id=0)
    return hf().GPT2Model(cfg)


def llama(layers=2, width=128):
    cfg = hf().LlamaConfig(num_hidden_layers=layers, hidden_size=width, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=2 * width, vocab_size=96,
                                   max_position_embeddings=32, use_cache=False, bos_token_id=0, eos_token_id=0)
    return hf().LlamaModel(cfg)


def bert():
    cfg = hf().BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                  vocab_size=96, max_position_embeddings=32)
    return hf().BertModel(cfg)


def vit():
    cfg = hf().ViTConfig(image_size=64, patch_size=16, num_hidden_layers=2, hidden_size=64,
                                 num_attention_heads=4, intermediate_size=128)
    return hf().ViTModel(cfg)


def _outputs(out):
    return [out[k] for k in out.keys()] if hasattr(out, "keys") else [out]


@pytest.mark.parametrize("make", [gpt2, llama, bert, vit])
def test_transformers_models_import_without_fallbacks(make):
    torch.manual_seed(0)
    m = make().eval()
    x = rnd(1, 3, 64, 64) if make is vit else torch.randint(0, 96, (1, 12))
    g = from_torch(m, (x,))
    assert steps(g) == []
    with torch.no_grad():
        want = _outputs(m(x))
    for got, w in zip(g.evaluate(x.numpy()), want):
        np.testing.assert_allclose(got, w.double().numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("make,opset", [(gpt2, 19), (llama, 20), (bert, 21), (vit, 21)])
def test_transformers_models_through_onnx_at_newer_opsets(make, opset, tmp_path):
    """torch's dynamo exporter at opsets 19-21 (BERT's GELU becomes opset 20's ``Gelu`` node): imported with no
    fallback step, the fp64 interpretation matches torch."""
    pytest.importorskip("onnxscript")
    import contextlib
    import io
    import warnings

    torch.manual_seed(0)
    m = make().eval()
    x = rnd(1, 3, 64, 64) if make is vit else torch.randint(0, 96, (1, 12))
    path = tmp_path / "model.onnx"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (x,), str(path), dynamo=True, opset_version=opset, verbose=False)
    import onnx

    model = onnx.load(str(path))
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == opset
    if make is bert:
        assert any(n.op_type == "Gelu" for n in model.graph.node)
    g = from_onnx(str(path))
    assert steps(g) == []
    with torch.no_grad():
        want = _outputs(m(x))[0]
    np.testing.assert_allclose(g.evaluate(x.numpy())[0], want.double().numpy(), rtol=1e-4, atol=1e-4)


def test_bert_with_attention_mask_and_token_types():
    torch.manual_seed(0)
    m = bert().eval()
    ids, am = torch.randint(0, 96, (1, 10)), torch.tensor([[1] * 7 + [0] * 3])
    tt = torch.tensor([[0] * 5 + [1] * 5])
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, ids, mask, types):
            return self.m(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

    g = from_torch(Masked(), (ids, am, tt))
    assert steps(g) == [] and g.input_dtypes == {"ids": "int64", "mask": "int64", "types": "int64"}
    with torch.no_grad():
        want = m(input_ids=ids, attention_mask=am, token_type_ids=tt).last_hidden_state
    np.testing.assert_allclose(g.evaluate(ids.numpy(), am.numpy(), tt.numpy())[0], want.double().numpy(),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("make", [gpt2, llama])
def test_small_models_tuned_at_a_tiny_budget_run_correctly(make, tmp_path):
    import planforge

    torch.manual_seed(0)
    m = make(layers=1, width=32).eval()
    ids = torch.randint(0, 96, (1, 8))
    res = planforge.tune(m, (ids,), budget=4, out=tmp_path / "out")
    assert res.spec["manifest"]["dtypes"] == {"input_ids": "int64"}
    with torch.no_grad():
        want = _outputs(m(ids))[0]
    got = res.plan(ids)
    got = got[0] if isinstance(got, (tuple, list)) else got
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-4, atol=1e-4)
    other = torch.randint(0, 96, (1, 8))               # the plan is a function of the ids, not of the example
    got = res.plan(other.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(np.asarray(got[0] if isinstance(got, tuple) else got),
                                   _outputs(m(other))[0].numpy(), rtol=1e-4, atol=1e-4)


class Rotated(nn.Module):
    """An unsupported op on a source line with square brackets (rich markup would eat ``[-x2, x1]``)."""

    def forward(self, x):
        x1, x2 = x[..., :2], x[..., 2:]
        return torch.special.bessel_j0(torch.cat([-x2, x1], dim=-1))


def test_cli_strict_lists_every_op_and_prints_brackets_literally(tmp_path, cli):
    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.rot, self.inv = Rotated(), Inv()

        def forward(self, x):
            return self.inv(self.rot(x))

    path = tmp_path / "both.pt2"
    torch.export.save(torch.export.export(Both().eval(), (rnd(2, 4),)), str(path))
    p = cli("tune", "--workload", path, "--strict", "--budget", "2", cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    err = " ".join(p.stderr.split())
    assert "2 unsupported op(s)" in err and "aten.special_bessel_j0" in err and "aten.erfinv" in err
    assert "torch.cat([-x2, x1], dim=-1)" in err
    assert "module 'rot'" in err and "module 'inv'" in err


# -- torch.compile(backend="planforge") -------------------------------------------------------------------------------

def test_torch_compile_backend_gives_the_eager_result():
    import warnings

    import planforge.dynamo  # registers the backend where the entry point is not installed

    torch._dynamo.reset()
    torch.manual_seed(0)
    m = gpt2(layers=1, width=32).eval()
    ids = torch.randint(0, 96, (1, 8))
    fast = torch.compile(m, backend="planforge", dynamic=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", planforge.dynamo.DynamoFallback)     # planforge ran it, not eager torch
        got, want = fast(ids).last_hidden_state, m(ids).last_hidden_state
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


def test_torch_compile_backend_runs_a_refused_graph_eagerly():
    import planforge.dynamo

    torch._dynamo.reset()
    m = Odd().eval()
    x = rnd(3, 4)
    fast = torch.compile(m, backend="planforge", options={"strict": True}, dynamic=False)
    with pytest.warns(planforge.dynamo.DynamoFallback, match="unsupported op"):
        got = fast(x)
    with torch.no_grad():
        np.testing.assert_allclose(got.detach().numpy(), m(x).numpy(), rtol=1e-6)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown"):
        torch.compile(m, backend="planforge", options={"budgett": 1})(x)


# -- the fused attention template -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dims, epilogue", [((2, 1, 7, 7, 16, 16), "causal:0.25"), ((3, 3, 5, 9, 13, 6), "full:0.4"),
                                            ((1, 4, 33, 33, 8, 8), "causal:0.3535533905932738")])
def test_attention_template_is_correct_at_sampled_settings(dims, epilogue, profile):
    """Every sampled knob setting (block sizes past the shapes, odd widths, grouped queries) within tolerance of the
    fp64 reference, which the worker checks."""
    from planforge.measure import TimingConfig
    from planforge.ops.kernel import Problem
    from planforge.targets.cpu.kernel import CpuBackend
    from planforge.targets.cpu.templates import TEMPLATES, limits

    problem = Problem("attention", dims, epilogue)
    t = TEMPLATES["attention"]
    space = t.space(problem, limits(profile))
    every = list(space.enumerate())
    cands = [every[i] for i in np.random.default_rng(0).choice(len(every), min(8, len(every)), replace=False)]
    be = CpuBackend(problem, t, profile, timing=TimingConfig(warmup_s=0.0, budget_s=0.0, min_repeats=1,
                                                             max_repeats=1))
    try:
        outs = be.measure(cands)
    finally:
        be.close()
    bad = [(c.as_dict(), o.category, o.message[:300]) for c, o in zip(cands, outs) if not o.ok]
    assert cands and not bad, bad


def test_sdpa_nodes_have_a_template_problem():
    from planforge.ops.sdpa import kernel

    p = kernel([(1, 8, 32, 32), (1, 2, 32, 32), (1, 2, 32, 16)], (1, 8, 32, 16), {"causal": True, "scale": 0.125})
    assert p.op == "attention" and p.dims == (2, 4, 32, 32, 32, 16) and p.epilogue == "causal:0.125"


def test_tune_strict_refuses_before_tuning():
    import planforge

    with pytest.raises(UnsupportedOps, match="2 unsupported op"):
        planforge.tune(Odd(), (rnd(3, 4),), budget=2, options={"strict": True})


@pytest.mark.parametrize("e", [2.0, 3.0, -2.0, 0.5, 1.5, 4.0])
def test_pow_library_step_matches_the_reference(e):
    x = np.abs(_r(7, 33)) + 0.1 if e != int(e) or e < 0 else _r(7, 33)
    out = np.empty_like(x)
    lib_step("pow", repr(e), [x], out)()
    np.testing.assert_allclose(out, REGISTRY["pow"].reference([x.astype(np.float64)], {"exponent": e}), rtol=1e-6)
