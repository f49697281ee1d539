"""GEMM template edges: every partial register tile (rows past the last whole MR, column panels past the last
whole NR, columns past the last whole vector, and their corners) runs the vector edge kernels and is correct."""
import numpy as np
import pytest

from planforge.targets.cpu.build import build, load
from planforge.ops.kernel import Problem
from planforge.targets.cpu.templates import default_knobs, gemm, limits, quant_space


def _vec(profile) -> int:
    return max(v for v in (1, 4, 8, 16) if v <= limits(profile).vector_lanes)


PF = gemm.PF_ROWS


@pytest.mark.parametrize("mr, nv, pack_a, pack_b, const_b, threads, epilogue, pf", [
    (6, 3, 0, 0, False, 1, "bias_erfgelu", 0), (4, 2, 1, 1, False, 1, "bias", 0), (3, 4, 1, 0, False, 1, "none", 0),
    (1, 2, 0, 1, False, 1, "bias_relu", 0),
    # B packed once when bound (a weight): blocks of nc 64 that are no whole number of panels, threads' slices
    (3, 3, 0, 1, True, 1, "bias", 0), (2, 3, 1, 1, True, 2, "bias_relu", 0),
    # B prefetched rows ahead, past the last row of K (45 < 2 * PF): row-major, packed once, packed per call
    (4, 2, 0, 0, False, 1, "bias", PF), (3, 3, 0, 1, True, 2, "bias_relu", PF), (2, 2, 1, 1, False, 1, "none", PF)])
def test_every_partial_tile(profile, mr, nv, pack_a, pack_b, const_b, threads, epilogue, pf):
    V = _vec(profile)
    knobs = dict(vec=V, mr=mr, nv=nv, unroll=2, pack_a=pack_a, pack_b=pack_b, order="ji", mc=16, kc=32, nc=64,
                 threads=threads, par="n", pf=pf)
    lib = load(build(gemm.source(knobs, epilogue), openmp=threads > 1))
    rng = np.random.default_rng(mr * 10 + nv)
    K = 45  # two K blocks: the partial one accumulates onto the first
    # every row remainder 1..mr, and column counts that leave whole vectors, part vectors and a lone column
    for M in range(mr + 1, 2 * mr + 1):
        for N in (nv * V + 1, nv * V - 1 if nv * V > 1 else 1, 2 * V + 3, 3 * nv * V + V // 2 + 1):
            A = rng.standard_normal((M, K)).astype(np.float32)
            B = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
            bias = rng.standard_normal(N).astype(np.float32) if epilogue != "none" else None
            C = np.full((M, N), np.nan, np.float32)
            run = gemm.bind(lib, knobs, A, B, bias, C, const_b=const_b)
            run()
            want = gemm.apply_chain(A.astype(np.float64) @ B, epilogue, bias)
            np.testing.assert_allclose(C, want, rtol=1e-5, atol=1e-5, err_msg=f"M={M} N={N} K={K}")
            if const_b:  # packed at bind: a new A, the same weights
                A[...] = rng.standard_normal((M, K))
                run()
                np.testing.assert_allclose(C, gemm.apply_chain(A.astype(np.float64) @ B, epilogue, bias), rtol=1e-5,
                                           atol=1e-5, err_msg=f"second call M={M} N={N}")


def test_edges_are_vector_code():
    """The partial tiles have vector kernels of their own: a source without them would compute them in the scalar
    tile (an M of 17 at MR 4 spent as long on its last row as on the other 16)."""
    knobs = dict(vec=16, mr=4, nv=3, unroll=1, pack_a=0, pack_b=0, order="ji", mc=16, kc=32, nc=64, threads=1,
                 par="n")
    src = gemm.source(knobs, "bias")
    for r, n in [(1, 3), (2, 3), (3, 3), (4, 1), (4, 2), (1, 1), (1, 2)]:
        assert f"uk_{r}_{n}(" in src


def test_prefetch_is_the_knobs_and_only_the_fp32_kernels(profile):
    """``pf`` writes a prefetch of the row ``PF_ROWS`` ahead into the full-tile micro-kernel (row-major B at its
    row stride, packed B at the panel's), none without it; a quantised B (widened into panels per call) has none
    whatever the knob says, and the quantised spaces keep ``pf`` at 0."""
    knobs = dict(vec=16, mr=4, nv=2, unroll=1, pack_a=0, pack_b=0, order="ji", mc=16, kc=32, nc=64, threads=1,
                 par="n")
    assert "__builtin_prefetch" not in gemm.source({**knobs, "pf": 0}, "bias")
    assert f"b + (long)(k + {PF}) * ldb" in gemm.source({**knobs, "pf": PF}, "bias")
    assert f"b + (long)(k + {PF}) * NR" in gemm.source({**knobs, "pack_b": 1, "pf": PF}, "bias")
    assert "__builtin_prefetch" not in gemm.source({**knobs, "pack_b": 1, "pf": PF, "wfmt": "int8"}, "bias")
    lim = limits(profile)
    qspace = quant_space(Problem("gemm", (32, 256, 256), "bias"), lim, ("fp32", "int8"))
    point = {**default_knobs(Problem("gemm", (32, 256, 256), "bias"), lim), "pack_b": 1, "wfmt": "int8", "qblock": 32}
    assert not any("pf" in v for v in qspace.violations({**point, "pf": 0}))
    assert any("pf" in v for v in qspace.violations({**point, "pf": PF}))


def test_small_gemms_stay_on_one_thread(profile):
    """A GEMM that one thread does in a few microseconds (``PAR_MACS_PER_LANE`` per vector lane) may not take more
    threads; one four times past the threshold may."""
    lim = limits(profile)
    knobs = dict(vec=_vec(profile), mr=4, nv=1, unroll=1, pack_a=0, pack_b=0, order="ji", mc=16, kc=32, nc=64,
                 threads=2, par="n")
    M, N = 16, 64
    small_k = gemm.PAR_MACS_PER_LANE * lim.vector_lanes // (2 * M * N)
    small = gemm.space(M, N, small_k, lim)
    assert any("par_macs" in v for v in small.violations(knobs)), small.violations(knobs)
    assert not any("par_macs" in v for v in small.violations({**knobs, "threads": 1}))
    big = gemm.space(M, N, 8 * small_k, lim)
    assert not any("par_macs" in v for v in big.violations(knobs))


@pytest.mark.parametrize("par, threads, pack_a, const_b", [("n", 2, 1, False), ("m", 2, 0, False), ("m", 3, 1, True),
                                                           ("n", 3, 0, True)])
def test_threads_slices_cover_every_row_and_column(profile, par, threads, pack_a, const_b):
    """Each thread's slice (claimed, not assigned: templates/parfor.py) of M or N, on shapes whose units do not
    divide by the threads, repeated calls: every element written once, right, on every call."""
    V = _vec(profile)
    knobs = dict(vec=V, mr=3, nv=2, unroll=2, pack_a=pack_a, pack_b=1, order="ji", mc=16, kc=32, nc=64,
                 threads=threads, par=par)
    lib = load(build(gemm.source(knobs, "bias")))
    rng = np.random.default_rng(threads)
    for M, N in ((3 * threads * 2 + 1, 2 * V * threads + 3), (7, 5 * V + 1)):
        A = rng.standard_normal((M, 45)).astype(np.float32)
        B = (rng.standard_normal((45, N)) / 7).astype(np.float32)
        bias = rng.standard_normal(N).astype(np.float32)
        C = np.full((M, N), np.nan, np.float32)
        run = gemm.bind(lib, knobs, A, B, bias, C, const_b=const_b)
        for _ in range(20):
            C[...] = np.nan
            run()
            np.testing.assert_allclose(C, A.astype(np.float64) @ B + bias, rtol=1e-5, atol=1e-5,
                                       err_msg=f"M={M} N={N} par={par}")
