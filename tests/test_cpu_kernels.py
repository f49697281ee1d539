"""CPU templates: correct at every sampled knob setting on odd shapes; faults become outcomes."""
import random

import pytest

from planforge.targets.cpu.kernel import CpuBackend
from planforge.targets.cpu.build import build
from planforge.targets.cpu.templates import TEMPLATES, Problem, ProblemError, limits
from planforge.measure import AdaptiveTimeout, TimingConfig
from planforge.search import Budget, make_strategy, search

ONCE = TimingConfig(warmup_s=0.0, budget_s=0.0, min_repeats=1, max_repeats=1)


def sample_knobs(space, n, seed=0):
    rng = random.Random(seed)
    seen, out = set(), []
    for _ in range(n * 20):
        c = space.sample(rng)
        if c.fingerprint not in seen:
            seen.add(c.fingerprint)
            out.append(c)
        if len(out) == n:
            break
    return out


def assert_all_correct(problem, profile, n, seed=0):
    lim = limits(profile)
    t = TEMPLATES[problem.op]
    space = t.space(problem, lim)
    cands = sample_knobs(space, n, seed)
    be = CpuBackend(problem, t, profile, timing=ONCE)
    try:
        outs = be.measure(cands)
    finally:
        be.close()
    bad = [(c.as_dict(), o.category, o.message[:300]) for c, o in zip(cands, outs) if not o.ok]
    assert not bad, bad
    return len(cands)


@pytest.mark.parametrize("dims", [(1, 1, 1), (7, 13, 5), (257, 129, 65)])
@pytest.mark.parametrize("epilogue", ["none", "bias", "bias_relu", "bias_gelu"])
def test_gemm_odd_shapes_every_sampled_setting(profile, dims, epilogue):
    n = 12 if dims[0] > 100 else 8
    assert assert_all_correct(Problem("gemm", dims, epilogue), profile, n, seed=hash(dims) % 1000) >= 1


@pytest.mark.parametrize("dims", [(1, 1), (13, 5), (129, 65), (256, 256)])
@pytest.mark.parametrize("epilogue", ["none", "bias_relu", "bias_gelu"])
def test_gemv_odd_shapes(profile, dims, epilogue):
    assert_all_correct(Problem("gemv", dims, epilogue), profile, 8)


@pytest.mark.parametrize("op, dims, epi", [
    ("softmax", (1, 1), "none"), ("softmax", (7, 13), "none"), ("softmax", (3, 1000), "none"),
    ("layernorm", (1, 1), "none"), ("layernorm", (7, 13), "none"), ("layernorm", (5, 257), "none"),
    ("eltwise", (1, 1), "bias_relu"), ("eltwise", (7, 13), "bias_gelu"), ("eltwise", (5, 257), "bias_relu_add"),
    ("eltwise", (3, 33), "add"),
])
def test_rowwise_odd_shapes_all_settings(profile, op, dims, epi):
    p = Problem(op, dims, epi)
    space = TEMPLATES[op].space(p, limits(profile))
    assert_all_correct(p, profile, space.valid_size())


def test_bad_problems_are_clear_errors():
    with pytest.raises(ProblemError, match="unknown op"):
        Problem("conv", (1, 2))
    with pytest.raises(ProblemError, match="3 positive integer sizes"):
        Problem("gemm", (1, 2))
    with pytest.raises(ProblemError, match="unknown epilogue"):
        Problem("gemm", (1, 2, 3), "bias_swish")
    with pytest.raises(ProblemError, match="steps must be among"):
        Problem("eltwise", (1, 2), "bias_tanh")


def test_planted_faults_become_outcomes_and_the_run_completes(profile):
    import faulty_templates

    t = faulty_templates.TEMPLATES["faulty"]
    p = Problem("gemv", (64, 32))
    space = t.space(p, None)
    be = CpuBackend(p, t, profile, timing=ONCE, timeout=AdaptiveTimeout(factor=10, lo=3.0, hi=20.0))
    try:
        res = search(space, make_strategy("exhaustive", space), be, Budget(evals=100))
    finally:
        be.close()
    got = {t_.candidate["mode"]: t_.outcome for t_ in res.trials}
    assert res.evaluations == len(faulty_templates.MODES) and res.stop_reason == "space exhausted"
    assert got["ok"].ok
    assert got["crash"].category == "runtime" and "SIGSEGV" in got["crash"].message
    assert got["abort"].category == "runtime" and "SIGABRT" in got["abort"].message
    assert got["hang"].category == "timeout"
    assert got["wrong"].category == "correctness" and "(3,)" in got["wrong"].message
    assert got["oob"].category == "runtime" and "out-of-bounds" in got["oob"].message
    assert got["badsyntax"].category == "compile" and "error" in got["badsyntax"].message


def test_build_cache_reuses_a_library(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANFORGE_CACHE", str(tmp_path))
    src = "int pf_answer(void) { return 42; }\n"
    first = build(src)
    second = build(src)
    assert not first.cached and second.cached and first.path == second.path
    assert first.path.parent == tmp_path / "build"
    assert build(src + "\n").path != first.path  # content-keyed


def test_corrupt_cached_library_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANFORGE_CACHE", str(tmp_path))
    src = "int pf_answer(void) { return 42; }\n"
    first = build(src)
    first.path.write_bytes(b"not a library")  # a truncated or clobbered cache entry
    again = build(src)
    assert not again.cached and again.path == first.path
    from planforge.targets.cpu.build import load

    assert load(again).pf_answer() == 42


def test_missing_compiler_is_a_clear_error(monkeypatch):
    from planforge.targets.cpu import build as b

    b.compiler.cache_clear()
    monkeypatch.setenv("CC", "no-such-cc-xyz")
    try:
        with pytest.raises(b.CompilerMissing, match="Install one"):
            b.build("int f(void){return 1;}")
    finally:
        b.compiler.cache_clear()
