"""Quantised GEMV kernels against their references, the weight format as a gene, and a quantised spec end to end."""
import copy
import ctypes
import platform
import random

import numpy as np
import pytest

from planforge.quant import INT4_BLOCKS, variant_knobs
from planforge.spec import load_spec
from planforge.spec.diff import diff_specs
from planforge.search import Budget
from planforge.targets.cpu.build import build
from planforge.targets.cpu.templates import TEMPLATES, check, make_inputs, output_shape, quant_space, \
    quant_variants, reference, tolerance
from planforge.targets.cpu.templates.problem import Problem
from planforge.tuning import tune
from planforge.workloads import WorkloadError, load_workload

GEMV = TEMPLATES["gemv"]


def _run(p, knobs, inputs):
    lib = ctypes.CDLL(str(build(GEMV.source(p, knobs), GEMV.openmp(knobs)).path))
    out = np.full(output_shape(p), np.nan, np.float32)
    GEMV.bind(lib, p, knobs, inputs, out)()
    return out


def _sampled(space, fmt, n, seed=0):
    """``n`` distinct valid settings of ``space`` in format ``fmt`` (a seeded sample: vec, jb, ksplit, threads vary)."""
    rng, seen, out = random.Random(seed), set(), []
    want = variant_knobs(fmt)
    for _ in range(4000):
        c = space.sample(rng)
        d = c.as_dict()
        if d["wfmt"] == want["wfmt"] and d.get("act", "fp32") == want["act"] and c.fingerprint not in seen:
            seen.add(c.fingerprint)
            out.append(c.as_dict())
        if len(out) == n:
            break
    return out


# N not a multiple of any panel width, K odd and not a multiple of any int4 block
@pytest.mark.parametrize("fmt", ["bf16", "int8", "int8+a8", "int4"])
@pytest.mark.parametrize("dims,epilogue", [((45, 203), "bias_relu"), ((7, 65), "none"), ((130, 33), "bias_gelu")])
def test_every_sampled_setting_matches_its_reference(lim, fmt, dims, epilogue):
    p = Problem("gemv", dims, epilogue)
    if fmt == "int8+a8" and fmt not in quant_variants(p, lim):
        pytest.skip(f"{fmt} needs a u8 x s8 dot product (VNNI), which this ISA view lacks")
    names = ("fp32", fmt) if fmt != "int4" else ("fp32", *(f"int4:{b}" for b in INT4_BLOCKS))
    space = quant_space(p, lim, names)
    inputs = make_inputs(p, 1)
    for knobs in _sampled(space, fmt, 3):
        real = GEMV.reference_inputs(p, knobs, inputs)[1]()
        out = _run(p, knobs, inputs)
        assert check(p, real, out, reference(p, real), tolerance(p, real)) is None, knobs
        # and against the unquantised fp64 answer it is off by the format's error, no more
        err = np.abs(out - reference(p, inputs)).max() / np.abs(reference(p, inputs)).max()
        assert err < {"bf16": 0.02, "int8": 0.05, "int8+a8": 0.1, "int4": 0.5}[fmt]


@pytest.mark.parametrize("block", INT4_BLOCKS)
def test_int4_block_sizes_on_a_k_that_is_no_multiple(lim, block):
    p = Problem("gemv", (19, block + 5), "bias")
    inputs = make_inputs(p, 2)
    knobs = {"vec": min(8, lim.vector_lanes), "jb": 2, "ksplit": 2, "unroll": 2, "threads": 1,
             "w_layout": "packed", "wfmt": "int4", "qblock": block}
    real = GEMV.reference_inputs(p, knobs, inputs)[1]()
    assert check(p, real, _run(p, knobs, inputs), reference(p, real)) is None


def test_a_wrong_dequantisation_is_caught(lim):
    """The check can fail: the int8 kernel's output against the bf16 weights' reference is off."""
    p = Problem("gemv", (40, 64), "none")
    inputs = make_inputs(p, 0)
    knobs = {"vec": min(8, lim.vector_lanes), "jb": 1, "ksplit": 1, "unroll": 1, "threads": 1,
             "w_layout": "packed", "wfmt": "int8", "qblock": 32}
    other = GEMV.reference_inputs(p, {**knobs, "wfmt": "int4"}, inputs)[1]()
    assert "wrong result" in check(p, other, _run(p, knobs, inputs), reference(p, other))


def test_default_budget_leaves_the_space_and_manifest_as_they_were():
    w = load_workload("gemv", {"shape": "45,70"})
    t = w.tasks[0]
    assert "wfmt" not in t.space.names and not t.validators and t.record is None
    assert "accuracy" not in w.manifest.to_json()
    # stated, the format is a gene and the manifest (its key too) carries the budget
    q = load_workload("gemv", {"shape": "45,70", "accuracy": "max_rel_err:0.05"})
    assert {"wfmt", "qblock"} <= set(q.tasks[0].space.names) and q.tasks[0].validators
    assert q.manifest.to_json()["accuracy"] == {"metric": "max_rel_err", "bound": 0.05}
    assert q.manifest.key != w.manifest.key


def test_formats_over_budget_are_not_searched():
    w = load_workload("gemv", {"shape": "45,70", "accuracy": "max_rel_err:0.003"})
    wfmt = next(k for k in w.tasks[0].space.knobs if k.name == "wfmt")
    assert "fp32" in wfmt.values and "int4" not in wfmt.values  # int4's error is far above 0.3%
    w2 = load_workload("gemv", {"shape": "45,70", "accuracy": "max_rel_err:0.003;gemv_45x70_bias_relu=none"})
    wfmt2 = next((k for k in w2.tasks[0].space.knobs if k.name == "wfmt"), None)
    assert wfmt2 is None or wfmt2.values == ("fp32",)  # the task's own override allows no quantisation


def test_bad_budget_is_a_workload_error():
    with pytest.raises(WorkloadError, match="option accuracy='rmse:1'.*unknown accuracy metric"):
        load_workload("gemv", {"shape": "45,70", "accuracy": "rmse:1"})
    from planforge.workloads.kernels import kernel_workload

    with pytest.raises(WorkloadError, match="reads fp32 weights only"):
        kernel_workload(Problem("layernorm", (4, 64)), accuracy="max_rel_err:0.05")


def test_quantised_spec_validates_and_diff_shows_the_format(tmp_path):
    w = load_workload("gemv", {"shape": "96,64", "accuracy": "max_rel_err:0.05"})
    r = tune(w, strategy="random", budget=Budget(evals=4), seed=0, out=tmp_path / "a")
    spec = load_spec(r.spec_path)  # validates against the schema
    t = next(iter(spec["tasks"].values()))
    q = t["quant"]
    assert q["format"] == t["plan"]["wfmt"] and q["budget"] == {"metric": "max_rel_err", "bound": 0.05}
    assert 0 <= q["error"]["value"] <= 0.05 and "wfmt" not in q["tiles"] and q["tiles"]["vec"] == t["plan"]["vec"]
    assert set(q["screen"]["errors"]) >= {"fp32", "bf16", "int8", "int4:32"}
    assert spec["manifest"]["accuracy"]["bound"] == 0.05
    other = copy.deepcopy(spec)
    key = next(iter(spec["tasks"]))
    new = "int4" if q["format"] != "int4" else "bf16"
    other["tasks"][key]["plan"]["wfmt"] = other["tasks"][key]["quant"]["format"] = new
    paths = {c.path for c in diff_specs(spec, other)}
    assert {f"tasks.{key}.plan.wfmt", f"tasks.{key}.quant.format"} <= paths


def test_the_roofline_counts_each_formats_bytes():
    w = load_workload("gemv", {"shape": "512,512", "epilogue": "none", "accuracy": "max_rel_err:0.5"})
    t = w.tasks[0]
    base = {"vec": 8, "jb": 2, "ksplit": 2, "unroll": 2, "w_layout": "packed", "threads": 1, "qblock": 32}
    if "act" in t.space.names:
        base["act"] = "fp32"
    est = t.cost_model.estimate([t.space.make({**base, "wfmt": f}) for f in ("fp32", "bf16", "int8", "int4")])
    moved = [sum(b for lvl, b in est.row(i)["bytes"].items() if lvl != "L1") for i in range(4)]
    weights = 512 * 512
    assert moved[0] - moved[1] == pytest.approx(2 * weights, rel=0.01)  # bf16: 2 bytes a weight fewer
    assert moved[0] - moved[2] == pytest.approx(3 * weights - 4 * 512, rel=0.01)  # int8: 1 byte and a scale a channel
    assert moved[3] < moved[2] and est.bound_s[3] <= est.bound_s[2] <= est.bound_s[1] <= est.bound_s[0]


@pytest.mark.parametrize("dims,epilogue", [((5, 37, 70), "bias_relu"), ((33, 64, 129), "none")])
def test_quantised_gemm_settings_match_their_reference(lim, dims, epilogue):
    """B widened as the GEMM packs it: sampled tile settings in each format on shapes no block divides."""
    p = Problem("gemm", dims, epilogue)
    gemm = TEMPLATES["gemm"]
    qspace = quant_space(p, lim, ("fp32", "bf16", "int8", "int4:32", "int4:64"))
    rng, inputs, done = random.Random(1), make_inputs(p, 1), []
    fmts = [("bf16", 32), ("int8", 32), ("int4", 32), ("int4", 64)]
    while len(done) < len(fmts):
        base = gemm.space(p, lim).sample(rng).as_dict()
        fmt, block = fmts[len(done)]
        c = qspace.make({**base, "pack_b": 1, "wfmt": fmt, "qblock": block})
        if not qspace.is_valid(c):
            continue
        knobs = c.as_dict()
        lib = ctypes.CDLL(str(build(gemm.source(p, knobs), gemm.openmp(knobs)).path))
        out = np.full(output_shape(p), np.nan, np.float32)
        gemm.bind(lib, p, knobs, inputs, out)()
        real = gemm.reference_inputs(p, knobs, inputs)[1]()
        assert check(p, real, out, reference(p, real), tolerance(p, real)) is None, knobs
        done.append(knobs)
    assert "pack_b" in qspace.names and not qspace.is_valid(qspace.make({**done[0], "pack_b": 0}))


def test_a_bad_budget_on_the_command_line_is_one_clear_line(cli, tmp_path):
    for opt, msg in [("accuracy=rmse:1", "unknown accuracy metric 'rmse'"),
                     ("accuracy=max_rel_err:x", "is not a number"),
                     ("accuracy=max_rel_err:0.01;=cosine:0.9", "needs a task name")]:
        r = cli("tune", "--workload", "gemv", "--shape", "64,64", "--option", opt, "--out", tmp_path)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_dynamic_activations_only_where_there_is_an_exact_dot_product(profile):
    import dataclasses

    from planforge.costmodel.analytic import _weight_format
    from planforge.targets.cpu.templates import limits

    g = Problem("gemv", (64, 64))
    sse = limits(dataclasses.replace(profile, isa=["sse4_2", "avx"], vector_lanes_fp32=4))
    assert sse.dot_i8_lanes == () and "int8+a8" not in quant_variants(g, sse)
    assert "act" not in quant_space(g, sse, quant_variants(g, sse)).names
    # AVX2 without VNNI (Zen 3): at 8 lanes through int16 multiply-adds, which the roofline counts dearer
    zen3 = limits(dataclasses.replace(profile, isa=["sse4_2", "avx", "avx2", "fma", "f16c"], vector_lanes_fp32=8))
    assert zen3.dot_i8_lanes == (8,) and not zen3.dot_i8_vnni and "int8+a8" in quant_variants(g, zen3)
    avx512 = limits(dataclasses.replace(profile, isa=["avx2", "avx512f", "avx512vl", "avx512_vnni"],
                                        vector_lanes_fp32=16))
    assert avx512.dot_i8_lanes == (16, 8) and avx512.dot_i8_vnni and "int8+a8" in quant_variants(g, avx512)
    assert "int8+a8" not in quant_variants(Problem("gemm", (4, 64, 64)), avx512)  # the GEMM widens B, A stays fp32
    point = {"wfmt": np.array(["int8"], dtype=object), "qblock": np.array([32]), "act": np.array(["int8"], dtype=object)}
    widen = {name: _weight_format(point, 1, 64, quant_space(g, lim, ("fp32", "int8+a8")).constants)[1][0]
             for name, lim in (("zen3", zen3), ("avx512", avx512))}
    weight_only = _weight_format({**point, "act": np.array(["fp32"], dtype=object)}, 1, 64)[1][0]
    assert widen["avx512"] < 0 < widen["zen3"] < weight_only


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the dot-product paths are x86's")
@pytest.mark.parametrize("dims,epilogue", [((45, 203), "bias_relu"), ((130, 33), "none")])
def test_every_dot_product_path_gives_the_same_bits(profile, dims, epilogue):
    """int8+a8 at 8 lanes compiled three ways (VNNI where this CPU has it; AVX2's int16 multiply-adds, as on Zen 3;
    plain C): the int32 sums are exact, so the outputs agree bit for bit, and with the reference."""
    if "avx2" not in profile.isa:
        pytest.skip("needs AVX2")
    p = Problem("gemv", dims, epilogue)
    knobs = {"vec": 8, "jb": 2, "ksplit": 2, "unroll": 4, "threads": 2, "wfmt": "int8", "act": "int8",
             "qblock": 32, "w_layout": "packed"}
    inputs = make_inputs(p, 1)
    outs = []
    for flags in (("-mno-avx512f",), ("-mno-avx512f", "-mno-avxvnni"), ("-mno-avx512f", "-mno-avxvnni", "-mno-avx2")):
        src = GEMV.source(p, knobs)
        lib = ctypes.CDLL(str(build(src, GEMV.openmp(knobs), extra_flags=flags).path))
        out = np.full(output_shape(p), np.nan, np.float32)
        GEMV.bind(lib, p, knobs, inputs, out)()
        outs.append(out)
    real = GEMV.reference_inputs(p, knobs, inputs)[1]()
    assert check(p, real, outs[1], reference(p, real), tolerance(p, real)) is None
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[1], outs[2])


def test_the_joint_search_measures_each_formats_best_predicted_point_first(tmp_path):
    from planforge.tuning import format_firsts
    from planforge.validate.accuracy import step_format

    w = load_workload("gemv", {"shape": "96,64", "epilogue": "none", "accuracy": "max_rel_err:0.5"})
    r = tune(w, budget=Budget(evals=6), seed=0, out=tmp_path / "j")  # auto: model-guided behind the funnel
    trials = [t for t in r.tasks[0].result.trials if t.outcome.status != "rejected"]
    fmts = [step_format(t.candidate.as_dict()) for t in trials]
    assert len(set(fmts[:2])) == 2, fmts  # the first two measured are two formats, not two tiles of one
    # the model re-plans every quarter of the budget (its tile terms learn from each batch), not every 8
    assert r.tasks[0].strategy["name"] == "model" and r.tasks[0].strategy["batch"] == 2
    f32 = tune(load_workload("gemv", {"shape": "96,64", "epilogue": "none"}), budget=Budget(evals=6), seed=0,
               out=tmp_path / "f")
    assert f32.tasks[0].strategy["batch"] == 8  # no format gene: the strategy's own default
    # the helper: the first point of each format in the space's order, at most the limit
    from planforge.space import Space, categorical

    sp = Space([categorical("vec", (8, 16)), categorical("wfmt", ("fp32", "int8", "int4")),
                categorical("qblock", (32, 64))])
    got = [step_format(c.as_dict()) for c in format_firsts(sp, 10)]
    assert got == ["fp32", "int8", "int4:32", "int4:64"] and len(format_firsts(sp, 2)) == 2
