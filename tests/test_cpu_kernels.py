"""CPU templates: correct at every sampled knob setting on odd shapes; faults become outcomes."""
import ctypes
import random

import numpy as np
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
    space = TEMPLATES[problem.op].space(problem, limits(profile))
    return assert_candidates_correct(problem, profile, sample_knobs(space, n, seed))


def assert_candidates_correct(problem, profile, cands):
    """Each candidate built, run and checked against the reference by the measuring backend."""
    be = CpuBackend(problem, TEMPLATES[problem.op], profile, timing=ONCE)
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


def test_gemm_with_constant_weights_is_measured_with_b_packed_once(profile):
    """A plan's GEMM packs a constant B when bound; measured as the plan runs it (the packing done once, not timed),
    a packing setting on odd shapes is still checked against the reference, after repeated calls too."""
    p = Problem("gemm", (37, 300, 257), "bias_relu")
    space = TEMPLATES["gemm"].space(p, limits(profile))
    c = next(c for c in sample_knobs(space, 200, seed=3) if c["pack_b"] == 1 and c["threads"] == 1)
    outs = {}
    for const in (False, True):
        be = CpuBackend(p, TEMPLATES["gemm"], profile, constant_weights=const,
                        timing=TimingConfig(warmup_s=0.005, budget_s=0.02, min_repeats=5, max_repeats=20))
        try:
            assert be.describe().get("constant_weights", False) == const
            outs[const] = be.measure([c])[0]
        finally:
            be.close()
    assert outs[False].ok and outs[True].ok, (outs[False].message, outs[True].message)


@pytest.mark.parametrize("const", [False, True])
def test_the_measuring_job_binds_a_constant_b_as_a_plan_does(profile, monkeypatch, const):
    from planforge.targets.cpu import job
    from planforge.targets.cpu.templates import gemm

    p = Problem("gemm", (9, 40, 33), "bias")
    knobs = dict(TEMPLATES["gemm"].defaults(p, limits(profile)), pack_b=1, threads=1)
    seen = []
    real = gemm.bind
    monkeypatch.setattr(gemm, "bind", lambda *a: seen.append(a[6]) or real(*a))  # (lib, knobs, A, B, bias, C, const_b, res)
    be = CpuBackend(p, TEMPLATES["gemm"], profile, timing=ONCE, constant_weights=const)
    try:
        got = job.run_job(be._job("kernel", knobs, str(build(TEMPLATES["gemm"].source(p, knobs)).path)))
    finally:
        be.close()
    assert got["status"] == "ok" and seen and all(s is const for s in seen)


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
        Problem("fft", (1, 2))
    with pytest.raises(ProblemError, match="3 positive integer sizes"):
        Problem("gemm", (1, 2))
    with pytest.raises(ProblemError, match="unknown epilogue"):
        Problem("gemm", (1, 2, 3), "bias_swish")
    with pytest.raises(ProblemError, match="steps must be among"):
        Problem("eltwise", (1, 2), "bias_cosh")  # (tanh is a step since ops/tanh.py)


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


# -- PLANFORGE_ISA: the code path ---------------------------------------------------------------------------
ISA_SRC = "int pf_isa(void) {\n#if defined(__AVX512F__)\n  return 512;\n#elif defined(__AVX2__)\n  return 256;\n" \
          "#else\n  return 0;\n#endif\n}\n"


def _native_macros():
    from planforge.targets.cpu.build import _macros, compiler

    return _macros(compiler()[0], ()) or set()


@pytest.mark.skipif(not {"__AVX2__", "__FMA__"} <= _native_macros(), reason="needs a CPU with AVX2 and FMA")
def test_avx2_builds_have_no_avx512_and_a_cache_key_of_their_own(tmp_path, monkeypatch):
    from planforge.targets.cpu.build import isa_flags, load

    monkeypatch.setenv("PLANFORGE_CACHE", str(tmp_path))
    avx512 = "__AVX512F__" in _native_macros()
    native, avx2 = build(ISA_SRC, isa="native"), build(ISA_SRC, isa="avx2")
    assert load(native).pf_isa() == (512 if avx512 else 256)
    assert load(avx2).pf_isa() == 256
    assert native.key != avx2.key and "-mno-avx512f" in isa_flags("avx2") and isa_flags("native") == ()
    # the environment variable is the default, and reaches the parallel builder too
    monkeypatch.setenv("PLANFORGE_ISA", "avx2")
    assert build(ISA_SRC).path == avx2.path
    from planforge.targets.cpu.build import build_many

    assert [b.path for b, _err, _log in build_many([(ISA_SRC, False)], workers=1)] == [avx2.path]
    if avx512:
        assert build(ISA_SRC, isa="avx512").path == native.path  # on an AVX-512 CPU, avx512 is native


@pytest.mark.skipif(not {"__AVX2__", "__FMA__"} <= _native_macros(), reason="needs a CPU with AVX2 and FMA")
def test_avx2_template_with_16_wide_vectors_emits_no_zmm(tmp_path, monkeypatch, profile):
    """A template kernel asked for 16 fp32 lanes under avx2 is split into 256-bit halves: not one
    instruction touches a 512-bit register (an AVX2-only CPU would fault on it)."""
    import shutil
    import subprocess

    if not shutil.which("objdump"):
        pytest.skip("needs objdump")
    monkeypatch.setenv("PLANFORGE_CACHE", str(tmp_path))
    p = Problem("gemv", (64, 48), "bias_relu")
    t = TEMPLATES["gemv"]
    knobs = {"vec": 16, "jb": 2, "ksplit": 2, "unroll": 2, "w_layout": "packed", "threads": 1}
    src, openmp = t.source(p, knobs), t.openmp(knobs)
    for isa, zmm in (("avx2", False), ("native", "__AVX512F__" in _native_macros())):
        lib = build(src, openmp=openmp, isa=isa)
        asm = subprocess.run(["objdump", "-d", str(lib.path)], capture_output=True, text=True, check=True).stdout
        assert ("%zmm" in asm) == zmm, isa


def test_unknown_isa_is_a_clear_error(monkeypatch):
    from planforge.targets.cpu.build import IsaError, build_many, isa_choice

    monkeypatch.setenv("PLANFORGE_ISA", "sse9")
    with pytest.raises(IsaError, match=r"PLANFORGE_ISA='sse9' is not an ISA planforge can force"):
        build("int f(void){return 1;}")
    with pytest.raises(IsaError, match="sse9"):
        build_many([("int f(void){return 1;}", False)])
    with pytest.raises(IsaError, match=r"isa='x' is not"):
        isa_choice("x")
    if "__AVX512F__" not in _native_macros():
        with pytest.raises(IsaError, match="no AVX-512"):
            build("int f(void){return 1;}", isa="avx512")


def _fake_cc(path, native, refuses=(), ignores_off=False):
    """A compiler that predefines ``native`` under -march=native, drops a macro for each -mno-X flag
    (unless ``ignores_off``) and rejects the flags in ``refuses``, as an older compiler rejects newer ones."""
    import sys

    path.write_text(f"""#!{sys.executable}
import sys
args = sys.argv[1:]
if "--version" in args:
    print("fakecc 1.0"); sys.exit(0)
bad = [a for a in args if a in {list(refuses)!r}]
if bad:
    print("fakecc: error: unrecognized command-line option " + bad[0], file=sys.stderr); sys.exit(1)
macros = set({sorted(native)!r})
if not {ignores_off!r}:
    for a in args:
        if a.startswith("-mno-avx512") or a == "-mno-avx10.1":
            macros = {{m for m in macros if not m.startswith(("__AVX512", "__AVX10"))}}
        if a.startswith("-mno-amx"):
            macros = {{m for m in macros if not m.startswith("__AMX")}}
for m in sorted(macros):
    print("#define " + m + " 1")
""")
    path.chmod(0o755)
    return str(path)


def test_isa_flags_with_any_compiler(tmp_path):
    """The flag logic on made-up compilers and CPUs: portable, whatever this machine has."""
    from planforge.targets.cpu.build import IsaError, isa_flags

    zen5 = {"__AVX2__", "__FMA__", "__AVX512F__", "__AVX512BW__", "__AMX_TILE__"}
    old = _fake_cc(tmp_path / "oldcc", zen5, refuses=("-mno-avx10.1", "-mno-amx-fp16"))
    flags = isa_flags("avx2", old)
    assert "-mno-avx512f" in flags and "-mno-amx-tile" in flags  # what it knows is kept ...
    assert "-mno-avx10.1" not in flags and "-mno-amx-fp16" not in flags  # ... what it refuses is dropped
    assert isa_flags("avx512", old) == () and isa_flags("native", old) == ()
    zen3 = _fake_cc(tmp_path / "zen3cc", {"__AVX2__", "__FMA__"})
    assert "-mno-avx512f" in isa_flags("avx2", zen3)
    with pytest.raises(IsaError, match="PLANFORGE_ISA=avx512, but this CPU has no AVX-512"):
        isa_flags("avx512", zen3)
    sse = _fake_cc(tmp_path / "ssecc", {"__SSE2__"})
    with pytest.raises(IsaError, match="PLANFORGE_ISA=avx2, but this CPU has no AVX2 and FMA"):
        isa_flags("avx2", sse)
    stubborn = _fake_cc(tmp_path / "stubborncc", zen5, ignores_off=True)
    with pytest.raises(IsaError, match=r"cannot turn AVX-512 off.*still defines __AMX_TILE__, __AVX512BW__"):
        isa_flags("avx2", stubborn)


def test_rowwise_steps_are_native_so_a_chain_of_them_is_one_c_call(profile):
    """A softmax step bound to its buffers can be called from C (``run.native``), so a plan whose steps are all
    compiled (GEMMs, row-wise ops) runs as one chain; the chain's result is the step's own."""
    from planforge.targets.cpu import fastcall
    from planforge.targets.cpu.templates import rowwise

    if fastcall.unavailable() is not None:
        pytest.skip(fastcall.unavailable())
    p = Problem("softmax", (5, 37), "none")
    knobs = {"vec": min(8, limits(profile).vector_lanes), "unroll": 2, "threads": 2}
    lib = ctypes.CDLL(str(build(TEMPLATES["softmax"].source(p, knobs)).path))
    x = np.random.default_rng(0).standard_normal((5, 37)).astype(np.float32)
    y = np.empty_like(x)
    run = rowwise.bind(lib, knobs, x, y)
    assert run.native is not None
    run()
    want = y.copy()
    y[...] = np.nan
    fn, handle, owner = fastcall.chain([run.native, run.native], x, y, (run,))
    f = fastcall.bound(fn, handle, x.shape, y.shape, lambda *a, **k: None, owner)
    np.testing.assert_array_equal(f(x), want)
