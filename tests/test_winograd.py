"""Winograd F(2x2, 3x3) and F(4x4, 3x3) as forms of the conv template (``algo`` wino2 / wino4,
targets/cpu/templates/winograd.py): the transforms are exact in fp64, sampled settings match the fp64 reference on
shapes that no tile, block or vector divides (every operand form, residuals, padding on some sides only, two images,
a deep layer whose channel blocks are shared out over the threads), the space offers them only where they apply, and
the analytic model bounds them by what they execute rather than by the direct convolution's multiply-adds."""
import random

import numpy as np
import pytest

from planforge.targets.cpu.templates import TEMPLATES, Problem, default_knobs, limits, winograd
from test_conv_kernels import dims
from test_cpu_kernels import assert_candidates_correct


@pytest.mark.parametrize("m", [2, 4])
def test_the_transforms_compute_a_correlation_exactly(m):
    """``A^T [(G g G^T) . (B^T d B)] A`` is the 3x3 cross-correlation of every t x t tile, and ``transform_weights``
    is ``G g G^T`` for every (output, input) channel pair."""
    bt, g_, at = (np.asarray(x, dtype=np.float64) for x in winograd.MATRICES[m])
    t = m + 2
    rng = np.random.default_rng(m)
    for _ in range(5):
        d, g = rng.standard_normal((t, t)), rng.standard_normal((3, 3))
        y = at @ ((g_ @ g @ g_.T) * (bt @ d @ bt.T)) @ at.T
        ref = np.array([[np.sum(d[i:i + 3, j:j + 3] * g) for j in range(m)] for i in range(m)])
        np.testing.assert_allclose(y, ref, rtol=0, atol=1e-12)
    w = rng.standard_normal((5, 3, 3, 3))
    u = winograd.transform_weights(w, m)
    assert u.shape == (t * t, 5, 3) and u.dtype == np.float32
    np.testing.assert_allclose(u[:, 4, 2].reshape(t, t), g_ @ w[4, 2] @ g_.T, rtol=1e-6, atol=1e-6)


def _winograd_points(space, algo, n, seed, **fixed):
    """Up to ``n`` distinct valid settings of ``space`` with ``algo`` (and the ``fixed`` knob values)."""
    rng, out = random.Random(seed), {}
    for _ in range(4000):
        c = space.sample(rng)
        k = c.as_dict()
        if k["algo"] == algo and all(k[x] == v for x, v in fixed.items()):
            out[c.fingerprint] = c
        if len(out) >= n:
            break
    return list(out.values())


CASES = [  # (dims, epilogue, the algos its space offers)
    (dims(1, 3, 11, 13, 7, 3, 1, 1), "nhwc/wb/relu", ("wino2", "wino4")),          # 42 tiles of 2x2, 12 of 4x4
    (dims(2, 19, 9, 10, 37, 3, 1, 1), "nhwc/packed/add_relu", ("wino2", "wino4")),  # residual, two images
    (dims(1, 33, 15, 13, 17, 3, 1, 0), "nhwc/wss/hardswish", ("wino2", "wino4")),   # no padding
    (dims(1, 33, 6, 6, 17, 3, 1, 1), "nhwc/wss/relu", ("wino2",)),                  # 9 tiles of 2x2, 4 of 4x4
    (dims(1, 16, 17, 18, 40, 3, 1, pads=(0, 1, 2, 1)), "nhwc/w/none", ("wino2", "wino4")),
    (dims(1, 24, 15, 13, 21, 3, 1, 1), "nhwc/packed/relu_add", ("wino2", "wino4")),
]


@pytest.mark.parametrize("d, epi, algos", CASES)
def test_sampled_winograd_settings_match_the_reference(d, epi, algos, profile):
    lim = limits(profile)
    p = Problem("conv", d, epi)
    space = TEMPLATES["conv"].space(p, lim)
    assert {k.name: k.values for k in space.knobs}["algo"] == ("direct", *winograd.ALGOS)
    offered = {a for a in winograd.ALGOS if _winograd_points(space, a, 1, 0)}
    assert offered == set(algos)
    cands = [c for a in algos for c in _winograd_points(space, a, 3, seed=len(epi))]
    if lim.physical_cores > 1:  # and on two threads
        cands += _winograd_points(space, algos[-1], 1, seed=7, threads=2)
    assert assert_candidates_correct(p, profile, cands) >= 3 * len(algos)


def test_a_deep_layer_shares_its_channel_blocks_over_the_threads(profile):
    """One block of 16 tiles on two threads: the kernel splits the block's output-channel blocks (five of one
    vector, the last one partial) between the threads, each transforming the block's input itself."""
    lim = limits(profile)
    p = Problem("conv", dims(1, 24, 8, 8, 70, 3, 1, 1), "nhwc/wss/relu")
    space = TEMPLATES["conv"].space(p, lim)
    vec = min(16, max({k.name: k.values for k in space.knobs}["vec"]))
    base = {**default_knobs(p, lim), "algo": "wino2", "tb": 16, "owb": 4, "ob": 1, "vec": vec, "order": 0, "pf": 0,
            "cb": 8, "unroll": 2}
    cands = [space.make({**base, "threads": t}) for t in sorted({1, min(2, lim.physical_cores)})]
    assert assert_candidates_correct(p, profile, cands) == len(cands)


@pytest.mark.parametrize("d, epi", [
    (dims(1, 16, 14, 14, 16, 3, 2, 1), "nhwc/wb/relu"),     # stride 2
    (dims(1, 16, 14, 14, 16, 3, 1, 1), "nchw/wb/relu"),     # NCHW (its layout copies stay the direct template's)
    (dims(1, 16, 14, 14, 16, 3, 1, 2, 2), "nhwc/wb/relu"),  # dilated
    (dims(1, 16, 14, 14, 16, 3, 1, 1, 1, 2), "nhwc/wb/relu"),  # two groups
    (dims(1, 16, 14, 14, 16, 1), "nhwc/wb/relu"),            # 1x1
])
def test_the_space_offers_winograd_only_where_it_applies(d, epi, profile):
    space = TEMPLATES["conv"].space(Problem("conv", d, epi), limits(profile))
    assert "algo" not in space.names and "tb" not in space.names


def test_few_tiles_keep_the_direct_template(profile):
    """ResNet-18's last layers at 96x96 (3x3 maps: 4 tiles of 2x2): the transformed weights would be read by too few
    tiles to pay, so only the direct template's settings are valid."""
    p = Problem("conv", dims(1, 64, 3, 3, 64, 3, 1, 1), "nhwc/wb/relu")
    space = TEMPLATES["conv"].space(p, limits(profile))
    assert "algo" in space.names
    assert all(c.as_dict()["algo"] == "direct" for c in (space.sample(random.Random(i)) for i in range(200)))


def test_the_analytic_model_bounds_winograd_by_what_it_executes():
    """On a ResNet layer (56x56, 64 channels): every Winograd point's prediction is at or above its bound, the bound
    is at most the direct convolution's (the problem's multiply-adds, which a Winograd form does not execute) and at
    least its own GEMMs' at the peak; the model ranks the best Winograd points well ahead of the best direct one."""
    from test_costmodel import Lim, ceilings

    from planforge.costmodel.analytic import AnalyticModel
    from planforge.targets.cpu.templates import flops

    d, epi = dims(1, 64, 56, 56, 64, 3, 1, 1), "nhwc/packed/add_relu"
    p = Problem("conv", d, epi)
    space = TEMPLATES["conv"].space(p, Lim)
    m = AnalyticModel("conv", d, epi, flops(p), ceilings(), space, False, Lim.vector_registers)
    cands = [space.sample(random.Random(i)) for i in range(600)]
    e = m.estimate(cands)
    algo = np.array([c.as_dict()["algo"] for c in cands])
    assert set(algo) == {"direct", "wino2", "wino4"}
    assert np.all(e.predicted_s >= e.bound_s)
    key = [(c.as_dict()["vec"], c.as_dict()["threads"]) for c in cands]
    direct = {}
    for k, a, b in zip(key, algo, e.bound_s):
        if a == "direct":
            direct[k] = min(b, direct.get(k, np.inf))
    for a, t in (("wino2", 4), ("wino4", 6)):
        sel = algo == a
        threads = np.array([k[1] for k in key])[sel]
        gemm = 2.0 * t * t * winograd.tiles({"N": 1, "OH": 56, "OW": 56}, t - 2) * 64 * 64
        assert np.all(e.bound_s[sel] >= gemm / threads / 200e9 * (1 - 1e-9))
        assert all(b < direct[k] for k, b, s in zip(key, e.bound_s, sel) if s and k in direct)
    best = {a: e.predicted_s[(algo == a) & e.fits].min() for a in ("direct", "wino2", "wino4")}
    assert best["wino2"] < 0.8 * best["direct"] and best["wino4"] < best["wino2"]


def test_settings_from_before_the_algo_knob_run_the_direct_template(profile):
    """A spec written before ``algo`` and ``tb`` existed holds conv knobs without them: its steps still compile and
    bind (as the direct template) and compute the reference."""
    import ctypes

    from planforge.targets.cpu.build import build
    from planforge.targets.cpu.templates import make_inputs, output_shape, reference

    lim = limits(profile)
    p = Problem("conv", dims(1, 24, 10, 9, 20, 3, 1, 1), "nhwc/packed/add_relu")
    old = {k: v for k, v in default_knobs(p, lim).items() if k not in ("algo", "tb")}
    assert {"algo", "tb"} <= set(TEMPLATES["conv"].space(p, lim).names) and "algo" not in old
    t = TEMPLATES["conv"]
    src = t.source(p, old)
    assert "in_transform" not in src  # the direct template's C
    lib = ctypes.CDLL(str(build(src, t.openmp(old)).path))
    inp = make_inputs(p, seed=3)
    out = np.zeros(output_shape(p), np.float32)
    t.bind(lib, p, old, inp, out)()
    np.testing.assert_allclose(out, reference(p, inp), rtol=1e-4, atol=1e-4)
