"""Quantised weights inside model plans: the fused MLP in every format, the weight format as a gene of a graph
task, and the accuracy budget judged on the model's own output (the whole model's, for a partitioned one)."""
import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from planforge.endtoend import whole_accuracy
from planforge.ir.zoo import policy_mlp
from planforge.quant import Accuracy
from planforge.search import Budget
from planforge.spec import load_spec
from planforge.targets.cpu.build import build
from planforge.targets.cpu.templates import mlp
from planforge.tuning import tune
from planforge.validate import PlanAccuracy
from planforge.validate.accuracy import program_formats, step_format
from planforge.workloads import WorkloadError
from planforge.workloads.models import graph_workload

# widths that are no multiple of any panel (jb * vec) and K no multiple of any int4 block
LAYERS = [(70, 45, "relu"), (45, 83, "relu"), (83, 13, "none")]


def _mlp_case(seed=0):
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((k, n)) * 0.2).astype(np.float32) for k, n, _ in LAYERS]
    bs = [rng.standard_normal(n).astype(np.float32) for _, n, _ in LAYERS]
    return rng.standard_normal(LAYERS[0][0]).astype(np.float32), ws, bs


def _forward(x, ws, bs):
    h = x.astype(np.float64)
    for (_, _, a), w, b in zip(LAYERS, ws, bs):
        h = h @ w.astype(np.float64) + b
        h = np.maximum(h, 0) if a == "relu" else h
    return h


@pytest.mark.parametrize("formats,threads,splits,qblock,vec,jb,act", [
    (("int4", "int8", "bf16"), 2, "kkk", 32, 8, 2, "fp32"),
    (("int8", "int4", "int4"), 2, "nkn", 64, 16, 1, "fp32"),
    (("bf16", "fp32", "int4"), 1, "nnn", 128, 4, 2, "fp32"),
    (("int4", "int4", "int4"), 2, "knk", 32, 8, 2, "fp32"),
    (("int8", "int8", "int8"), 2, "nnk", 32, 4, 4, "fp32"),
    # int8 weights with dynamic int8 activations (where there is a u8 x s8 dot product), after a split-K layer too
    (("int8", "int8", "int8"), 2, "nnn", 32, 16, 2, "int8"),
    (("int8", "bf16", "int8"), 2, "nkn", 32, 8, 1, "int8"),
])
def test_quantised_fused_mlp_matches_its_dequantised_reference(profile, formats, threads, splits, qblock, vec, jb,
                                                               act):
    from planforge.targets.cpu.templates import limits

    lim = limits(profile)
    vec = min(vec, max(v for v in (1, 4, 8, 16) if v <= lim.vector_lanes))  # what this machine's ISA view has
    if act == "int8" and vec not in lim.dot_i8_lanes:
        pytest.skip(f"no u8 x s8 dot product at {vec} lanes here")
    threads = min(threads, lim.physical_cores)
    knobs = {"vec": vec, "jb": jb, "ksplit": 2, "unroll": 2, "threads": threads, "spin_us": 1000, "pin": 1,
             "qblock": qblock, "act": act, **{f"split{i}": s for i, s in enumerate(splits)},
             **{f"wfmt{i}": f for i, f in enumerate(formats)}}
    x, ws, bs = _mlp_case()
    lib = ctypes.CDLL(str(build(mlp.source(LAYERS, knobs), False).path))
    y = np.full(LAYERS[-1][1], np.nan, np.float32)
    run = mlp.bind(lib, LAYERS, knobs, x, ws, bs, y)
    run()
    ref = mlp.reference(LAYERS, knobs, x, ws, bs)
    assert np.allclose(ref, _forward(x, mlp.dequantised(LAYERS, knobs, ws), bs)) == (act == "fp32")
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()  # fp32 rounding of the dequantised product only
    exact = _forward(x, ws, bs)
    assert np.abs(y - exact).max() > 1e-5 * np.abs(exact).max()  # and the weights really were quantised
    run.pool.close()


def test_formats_per_layer_and_per_step():
    space = mlp.with_formats(mlp.space(LAYERS, SimpleNamespace(vector_lanes=8, vector_registers=16,
                                                               physical_cores=2)), LAYERS,
                             ("fp32", "int8", "int4:32", "int4:64"))
    names = [k.name for k in space.knobs]
    assert {"wfmt0", "wfmt1", "wfmt2", "qblock"} <= set(names)
    # no int4 layer: one point per kernel (the first block only)
    assert space.violations({**{k.name: k.values[0] for k in space.knobs}, "qblock": 64})
    assert step_format({"wfmt0": "int8", "wfmt1": "fp32", "wfmt2": "int4", "qblock": 64}) == "int8/fp32/int4:64"
    assert step_format({"wfmt": "int8", "act": "int8"}) == "int8+a8" and step_format({"vec": 8}) == "fp32"
    with pytest.raises(ValueError, match="dot product"):
        mlp.with_formats(space, LAYERS, ("int8+a8",))  # no dot-product widths given
    a8 = mlp.with_formats(mlp.space(LAYERS, SimpleNamespace(vector_lanes=16, vector_registers=32, physical_cores=2)),
                          LAYERS, ("fp32", "int8", "int8+a8"), dot_lanes=(16,))
    point = {**{k.name: k.values[0] for k in a8.knobs}, "vec": 16, "jb": 1, "wfmt0": "int8", "act": "int8"}
    assert not a8.violations({**point, "split0": "n"})
    assert a8.violations({**point, "split0": "k"})  # int8 activations: split along N
    assert a8.violations({**point, "vec": 8})  # no dot product at that width
    assert a8.violations({**point, "wfmt0": "fp32"})  # no int8 layer: the same kernel as act fp32
    with pytest.raises(ValueError, match="split along N"):
        mlp.source(LAYERS, {**point, "split0": "k", "threads": 2})


def _small_model():
    return policy_mlp(1, (64, 96, 40, 8))


def test_no_budget_leaves_the_graph_space_and_manifest_as_they_were():
    g = _small_model()
    plain = graph_workload(g, "m")
    stated_fp32 = graph_workload(g, "m", accuracy="")
    assert plain.manifest.key == stated_fp32.manifest.key and plain.manifest.accuracy is None
    t = plain.tasks[0]
    assert not any("wfmt" in k for cs in t.backend.genome.configs.values() for c in cs for k in c)
    assert t.record is None and t.backend.accuracy is None


def _quantised_candidate(task, fmt="int8"):
    """A candidate of ``task`` whose program has a step in ``fmt``: every template node at a setting in it."""
    genome = task.backend.genome
    cfg = dict(task.seeds[0].as_dict())
    for name, nid in genome.knob_of.items():
        idx = [i for i, c in enumerate(genome.configs[nid]) if fmt in step_format(c)]
        if idx:
            cfg[name] = idx[0]
    c = task.space.make(cfg)
    assert program_formats(genome.program(c.as_dict())), "no quantised setting in the genome"
    return c


def test_a_budget_makes_the_format_a_gene_and_screens_formats_over_it():
    w = graph_workload(_small_model(), "m", accuracy="max_rel_err:0.02")
    t = w.tasks[0]
    assert w.manifest.accuracy == {"metric": "max_rel_err", "bound": 0.02}
    fmts = {step_format(c) for cs in t.backend.genome.configs.values() for c in cs}
    assert any("int8" in f for f in fmts) and any("bf16" in f for f in fmts)
    screens = t.record(t.seeds[0])["screen"]
    assert screens and all("int4:32" not in s["searched"] for s in screens.values())  # int4 is ~5% per layer
    assert not any("int4" in f for f in fmts)
    # the lead plan in each searched format is a seed: the search starts from every "quantise first" plan
    labels = t.info["seeds"]
    lead = labels[0]
    assert " in " not in lead and any(lb.startswith(f"{lead} in ") and "int8" in lb for lb in labels) and \
        any(lb.startswith(f"{lead} in ") and "bf16" in lb for lb in labels)
    assert len(t.seeds) == len(labels)
    with pytest.raises(WorkloadError, match="accuracy"):
        graph_workload(_small_model(), "m", accuracy="max_rel_err:lots")


def test_a_plan_over_budget_is_rejected_with_its_error_and_the_default_rejects_it_unrun():
    w = graph_workload(_small_model(), "m", accuracy="max_rel_err:0.08")
    t = w.tasks[0]
    c = _quantised_candidate(t)
    check = next(v for v in t.validators if isinstance(v, PlanAccuracy))
    assert check(c) is None  # int8 within 8% (about 4% on this small model)
    err = check.error(c)
    assert 0 < err <= 0.08
    tight = PlanAccuracy(Accuracy("max_rel_err", err / 10), check.formats, check.output)
    why = tight(c)
    assert why.startswith("accuracy: ") and "exceeds the budget" in why and "10x the bound" in why
    unrun = PlanAccuracy(Accuracy(), check.formats, lambda c: pytest.fail("the default budget must not run it"))
    assert "no accuracy budget was stated" in unrun(c)
    # the measurement judges it too: the same genome measured under a tighter budget is a recorded outcome
    from planforge.targets import get_target

    backend = get_target("cpu").graph_backend(w.graph, t.backend.genome, accuracy=tight.budget.to_json())
    try:
        (o,) = backend.measure([c])
    finally:
        backend.close()
    assert not o.ok and o.category == "correctness" and "exceeds the budget" in o.message


def test_a_quantised_model_tuning_records_formats_error_and_budget(tmp_path):
    w = graph_workload(_small_model(), "m", accuracy="max_rel_err:0.08")
    t = w.tasks[0]
    t.seeds = [_quantised_candidate(t), *t.seeds]  # make sure a quantised plan is measured
    r = tune(w, strategy="random", budget=Budget(evals=3), seed=0, out=tmp_path / "q")
    spec = load_spec(r.spec_path)  # validates against the schema
    q = spec["tasks"]["graph"]["quant"]
    assert q["budget"] == {"metric": "max_rel_err", "bound": 0.08} and 0 <= q["error"]["value"] <= 0.08
    assert q["formats"] == program_formats(spec["tasks"]["graph"]["program"])
    from planforge.report.html import write_report

    html = write_report(tmp_path / "q").read_text()
    assert "Weights: " in html and "budget max_rel_err 0.08" in html
    tried = [program_formats(t.backend.program(x.candidate)) for x in r.tasks[0].result.trials if x.outcome.ok]
    assert any(tried), "the quantised seed was not measured"
    # spec diff names a step whose format changed
    import copy

    from planforge.spec.diff import diff_specs

    other = copy.deepcopy(spec)
    step = next(s for s in other["tasks"]["graph"]["program"] if s["op"] in ("fused_mlp", "tmpl2", "tmpl3"))
    other["tasks"]["graph"]["quant"]["formats"][step["cls"]] = "int8"
    paths = {c.path for c in diff_specs(spec, other)}
    assert f"tasks.graph.quant.formats.{step['cls']}" in paths


def test_the_whole_model_budget_is_split_over_parts_and_judged_on_the_chain():
    assert Accuracy("max_rel_err", 0.01).split(4).bound == pytest.approx(0.0025)
    assert Accuracy("cosine", 0.999).split(2).bound == pytest.approx(0.9995)
    wl = SimpleNamespace(manifest=SimpleNamespace(accuracy={"metric": "max_rel_err", "bound": 0.01}))
    ref = [np.linspace(-1, 1, 11)]
    q = [{"cls": "T1", "knobs": {"wfmt": "int8"}}]
    assert whole_accuracy(wl, {"part0": None, "part1": [{"cls": "T1", "knobs": {"vec": 8}}]}, ref, ref) is None
    ok = whole_accuracy(wl, {"part0": q}, [ref[0] + 0.005], ref)
    assert ok["excess"] is None and ok["quantised_tasks"] == ["part0"]
    bad = whole_accuracy(wl, {"part0": q, "part1": q}, [ref[0] + 0.03], ref)
    assert "exceeds the budget 0.01" in bad["excess"] and bad["value"] == pytest.approx(0.03)


@pytest.mark.parametrize("act", ["fp32", "int8"])
def test_a_quantised_fused_plan_exports_to_c_with_its_formats(tmp_path, act):
    import os
    import shutil
    import subprocess
    import sys

    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("needs a C compiler")
    sys.path.insert(0, os.path.dirname(__file__))
    from test_batch1 import INNER, mlp_program

    from planforge.spec.export_c import export_c
    from planforge.targets.cpu import CpuTarget

    widths = (19, 37, 23, 5)
    knobs = dict(INNER[0], threads=2, spin_us=mlp.SPIN_US[0], pin=1, split0="k", split1="n", split2="k",
                 wfmt0="int4", wfmt1="int8", wfmt2="bf16", qblock=32, act=act)
    lim = CpuTarget().limits()
    knobs["vec"] = min(knobs["vec"], lim.vector_lanes)
    if act == "int8" and knobs["vec"] not in lim.dot_i8_lanes:
        pytest.skip("no u8 x s8 dot product here")
    g = policy_mlp(1, widths)
    plan = CpuTarget().plan(g, mlp_program(widths, knobs))
    (x,) = g.example_inputs(3)
    want = plan(x)[0]
    exact = g.evaluate(x)[0]
    assert np.abs(want - exact).max() > 1e-5 * np.abs(exact).max()  # quantised: not the fp32 answer
    export_c(plan, tmp_path, spec={"manifest": {"workload": "q-mlp"}, "target": {"fingerprint": "here"}})
    assert "int8_t W0[" in (tmp_path / "plan.c").read_text() and "uint16_t W2[" in (tmp_path / "plan.c").read_text()
    (tmp_path / "in.bin").write_bytes(np.ascontiguousarray(x, np.float32).tobytes())
    p = subprocess.run([str(tmp_path / "plan_main"), "-n", "50", "-r", "1", "-i", str(tmp_path / "in.bin"), "-o",
                        str(tmp_path / "out.bin")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.float32).reshape(want.shape)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)  # the C library computes what the Python plan does


def test_validation_draws_start_from_the_users_inputs_and_follow_their_statistics():
    from planforge.workloads.models import VALIDATION_DRAWS, example_arrays, validation_draws

    g = _small_model()
    (name, shape), = g.inputs.items()
    mine = (np.abs(np.random.default_rng(5).standard_normal(shape)) * 3 + 10).astype(np.float32)  # far from N(0, 1)
    draws = validation_draws(g, 0, [[mine]])
    assert len(draws) == VALIDATION_DRAWS and draws[0][0] is not None and np.array_equal(draws[0][0], mine)
    for d in draws[1:]:
        assert d[0].shape == mine.shape and d[0].dtype == np.float32 and not np.array_equal(d[0], mine)
        assert abs(float(d[0].mean()) - float(mine.mean())) < 1.5  # like the user's, not standard normal
    assert validation_draws(g, 0, [[mine]])[1][0].tobytes() == draws[1][0].tobytes()  # seeded
    gen = validation_draws(g, 0)
    assert len(gen) == VALIDATION_DRAWS and abs(float(gen[0][0].mean())) < 1.5  # none given: the graph's own
    ids = np.array([[3, 3, 7, 9]], np.int64)
    like = validation_draws(SimpleNamespace(example_inputs=None), 0, [[ids]])[1][0]
    assert like.dtype == np.int64 and set(like.ravel().tolist()) <= {3, 7, 9}  # integers resampled from theirs
    assert example_arrays(g, [mine]) is not None and example_arrays(g, [mine[:, :2]]) is None
    assert example_arrays(g, [mine, mine]) is None and example_arrays(g, [3]) is None


def test_a_model_part_is_judged_on_what_flows_into_it_on_the_users_inputs():
    # a model cut into parts: the second part's inputs are the first part's outputs on the validation draws
    from planforge.ir.zoo import transformer

    g = transformer(layers=2, seq=6, width=16, heads=2)
    (name, shape), = g.inputs.items()
    mine = np.random.default_rng(3).uniform(0, 4, shape).astype(np.float32)
    w = graph_workload(g, "m", accuracy="max_rel_err:0.08", whole_below=0, example_inputs=[[mine]])
    assert w.partition is not None and len(w.tasks) > 1 and np.array_equal(w.validation[0][0], mine)
    later = w.tasks[-1]
    check = next(v for v in later.validators if isinstance(v, PlanAccuracy))
    assert "flowing into it" in check.judged_on and "example inputs" in check.judged_on
    rep = w.partition.parts[w.partition.keys[later.info["structure"]][0]]
    from planforge.ir.graph import values_of

    want = values_of(g, [mine], rep.inputs)[0].astype(np.float32)
    assert np.allclose(check.draws[0][0], want) and not np.allclose(check.draws[0][0], mine)
    c = _quantised_candidate(later)
    assert 0 <= check.error(c) < 0.08
    assert check.record(c)["inputs"] == check.judged_on


def test_a_torch_modules_quantised_plan_is_judged_on_its_example_inputs(tmp_path):
    torch = pytest.importorskip("torch")
    import planforge

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.rand(1, 48) * 5 + 2  # the user's inputs: nothing like a standard normal
    r = planforge.tune(m, x, budget=3, out=tmp_path / "t", options={"accuracy": "max_rel_err:0.05"})
    q = load_spec(r.spec_path)["tasks"]["graph"]["quant"]
    assert q["inputs"].startswith("the model's example inputs (1) and 3 draws like them")
    check = next(v for v in r.tasks[0].task.validators if isinstance(v, PlanAccuracy))
    assert np.array_equal(check.draws[0][0], x.numpy())
    assert abs(float(check.draws[1][0].mean()) - float(x.mean())) < 1.0


def test_a_model_files_real_inputs_are_loaded_checked_and_recorded(tmp_path):
    from planforge.workloads import load_workload
    from planforge.workloads.models import load_inputs

    g = _small_model()
    (name, shape), = g.inputs.items()
    two = np.random.default_rng(0).uniform(1, 3, (2, *shape))
    np.savez(tmp_path / "two.npz", **{name: two})
    got, digest = load_inputs(str(tmp_path / "two.npz"), g)
    assert len(got) == 2 and got[1][0].dtype == np.float32 and np.allclose(got[1][0], two[1]) and len(digest) == 64
    np.save(tmp_path / "one.npy", two[0])
    assert np.allclose(load_inputs(str(tmp_path / "one.npy"), g)[0][0][0], two[0])
    np.savez(tmp_path / "pos.npz", two[0])  # arr_0
    assert len(load_inputs(str(tmp_path / "pos.npz"), g)[0]) == 1
    bad = [("wrong.npz", {"other": two[0]}, "holds other; the model's inputs are obs"),
           ("shape.npz", {name: two[0, :, :5]}, "has shape (1, 5)")]
    for fname, arrays, msg in bad:
        np.savez(tmp_path / fname, **arrays)
        with pytest.raises(WorkloadError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            load_inputs(str(tmp_path / fname), g)
    (tmp_path / "junk.npz").write_bytes(b"not numpy")
    with pytest.raises(WorkloadError, match="not a .npy or .npz numpy file"):
        load_inputs(str(tmp_path / "junk.npz"), g)
    with pytest.raises(WorkloadError, match="No such file"):
        load_inputs(str(tmp_path / "none.npz"), g)
    # through a model file: the manifest records the file and its hash, the walk judges on its samples first
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w1, w2 = rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal((48, 8)).astype(np.float32)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["obs", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["a"]),
         helper.make_node("MatMul", ["a", "w2"], ["y"])], "m",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [shape[0], 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]),
        opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "m.onnx"))
    w = load_workload(str(tmp_path / "m.onnx"), {"accuracy": "max_rel_err:0.05", "inputs": str(tmp_path / "two.npz")})
    assert w.manifest.options["inputs"] == {"file": str(tmp_path / "two.npz"), "sha256": digest}
    assert len(w.validation) == 4 and np.allclose(w.validation[1][0], two[1])
    check = next(v for v in w.tasks[0].validators if isinstance(v, PlanAccuracy))
    assert check.judged_on.startswith("the model's example inputs (2) and 2 draws like them")
    with pytest.raises(WorkloadError, match="has shape"):
        load_workload(str(tmp_path / "m.onnx"), {"accuracy": "max_rel_err:0.05", "inputs": str(tmp_path / "shape.npz")})
