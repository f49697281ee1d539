"""The convolution templates (targets/cpu/templates/conv.py): sampled knob settings of the direct and the depthwise
template are correct against the fp64 reference on shapes that no block divides (odd channels, widths, strides,
padding, dilation, groups, every operand form and epilogue, both layouts); the space follows the machine."""
import random

import numpy as np
import pytest

from planforge.ops.kernel import ProblemError
from planforge.targets.cpu.templates import TEMPLATES, Problem, default_knobs, limits, make_inputs, output_shape, \
    reference
from test_cpu_kernels import assert_all_correct


def dims(N, C, H, W, O, k, s=1, p=0, d=1, g=1, pads=None):
    pt, pl, pb, pr = pads or (p, p, p, p)
    return (N, C, H, W, O, k, k, s, s, pt, pl, pb, pr, d, d, g)


CASES = [
    ("conv", dims(1, 3, 11, 13, 7, 3, 1, 1), "nhwc/wb/relu"),
    ("conv", dims(2, 5, 9, 10, 19, 3, 2, 1), "nchw/wss/relu6"),
    ("conv", dims(1, 6, 7, 9, 10, 3, 1, 2, 2, 2), "nhwc/w/hardswish"),        # dilated, 2 groups of 3 -> 5
    ("conv", dims(1, 33, 5, 7, 17, 1), "nhwc/packed/add_relu"),              # 1x1 with a residual
    ("conv", dims(1, 9, 8, 8, 11, 3, 2, pads=(0, 1, 1, 0)), "nchw/packed/relu_add"),  # asymmetric padding
    ("dwconv", dims(1, 13, 9, 11, 13, 3, 1, 1, 1, 13), "nhwc/wss/relu6"),
    ("dwconv", dims(2, 21, 10, 7, 21, 5, 2, 2, 1, 21), "nchw/wb/silu"),
    ("dwconv", dims(1, 35, 6, 6, 35, 3, 1, 1, 1, 35), "nhwc/packed/add"),
    # channels that channel tiles divide: read in place, edge taps skipped
    ("dwconv", dims(1, 48, 9, 11, 48, 3, 1, 1, 1, 48), "nhwc/wss/relu6"),
    ("dwconv", dims(2, 32, 10, 7, 32, 5, 2, 2, 1, 32), "nhwc/packed/add"),
    ("dwconv", dims(1, 64, 7, 6, 64, 3, 1, 2, 2, 64), "nhwc/wb/hardswish"),  # dilated: 2 interior columns
]


@pytest.mark.parametrize("op, d, epi", CASES)
def test_sampled_settings_match_the_reference(op, d, epi, profile):
    p = Problem(op, d, epi)
    TEMPLATES[op].space(p, limits(profile)).make(default_knobs(p, limits(profile)))  # the first setting is valid
    assert assert_all_correct(p, profile, 4, seed=len(epi)) >= 3


def test_a_wrong_kernel_is_caught(profile):
    """The check can fail: a template whose epilogue forgot the shift is rejected as incorrect."""
    p = Problem("conv", dims(1, 4, 6, 6, 5, 3, 1, 1), "nhwc/wb/none")
    inp = make_inputs(p)
    ref = reference(p, inp)
    inp2 = dict(inp, shift=np.zeros_like(inp["shift"]))
    assert np.abs(reference(p, inp2) - ref).max() > 1e-3


def test_space_follows_the_vector_width_and_caches(profile):
    lim = limits(profile)
    p = Problem("conv", dims(1, 64, 14, 14, 64, 3, 1, 1), "nhwc/wb/relu")
    space = TEMPLATES["conv"].space(p, lim)
    vecs = {k.name: k.values for k in space.knobs}["vec"]
    assert max(vecs) == min(16, lim.vector_lanes) or vecs == (1,)
    for c in [space.sample(random.Random(i)) for i in range(20)]:
        k = c.as_dict()
        assert k["owb"] * k["ob"] + k["ob"] + 1 <= lim.vector_registers


def test_bad_problems_are_clear_errors():
    with pytest.raises(ProblemError, match="groups"):
        Problem("conv", dims(1, 5, 6, 6, 4, 3, g=2), "nhwc/w/none")
    with pytest.raises(ProblemError, match="add"):
        Problem("conv", dims(1, 4, 6, 6, 4, 3), "nhwc/w/add")
    with pytest.raises(ProblemError, match="layout"):
        Problem("conv", dims(1, 4, 6, 6, 4, 3), "nchwc/w/none")


@pytest.mark.parametrize("op, d, epi", [("conv", dims(1, 64, 14, 14, 64, 3, 1, 1), "nhwc/wb/relu"),
                                        ("dwconv", dims(1, 96, 14, 14, 96, 3, 2, 1, 1, 96), "nchw/wss/relu6")])
def test_the_analytic_model_bounds_and_ranks_the_tiles(op, d, epi):
    """The roofline model of the conv templates: prediction >= bound >= the FLOPs at the widest peak on every
    thread; a 1x1 register tile (one FMA chain, a load per FMA) is predicted slower than a 4x2 one."""
    from test_costmodel import Lim, ceilings

    from planforge.costmodel.analytic import AnalyticModel
    from planforge.targets.cpu.templates import flops

    p = Problem(op, d, epi)
    space = TEMPLATES[op].space(p, Lim)
    m = AnalyticModel(op, d, epi, flops(p), ceilings(), space, False, Lim.vector_registers)
    cands = [space.sample(random.Random(i)) for i in range(200)]
    e = m.estimate(cands)
    # the direct template's points execute every multiply-add of the problem (a Winograd form fewer: its own
    # bound is tested in test_winograd.py)
    direct = np.array([c.as_dict().get("algo", "direct") == "direct" for c in cands])
    assert np.all(e.predicted_s >= e.bound_s) and np.all(e.bound_s[direct] >= flops(p) / (200e9 * 2) * (1 - 1e-9))
    base = {"vec": 16, "unroll": 1, "threads": 1,
            **({"cbv": 1} if op == "dwconv" else {"ob": 1, "cb": 64, "order": 0, "pf": 0}),
            **({"algo": "direct", "tb": 8} if "algo" in space.names else {})}
    small, big = space.make({**base, "owb": 1}), space.make({**base, "owb": 4, ("cbv" if op == "dwconv" else "ob"): 2})
    slow, fast = m.predict([small, big])
    assert slow > 1.5 * fast
    if op == "conv":  # the tile of 24 accumulators first: ob 2 x owb 8 (16) ran 1.2-1.5x its time, measured alone
        d24 = dims(1, 64, 24, 24, 64, 3, 1, 1)  # rows both widths divide
        p24 = Problem(op, d24, epi)
        s24 = TEMPLATES[op].space(p24, Lim)
        m24 = AnalyticModel(op, d24, epi, flops(p24), ceilings(), s24, False, Lim.vector_registers)
        wide, narrow = m24.predict([s24.make({**base, "cb": 16, "ob": ob, "owb": owb}) for ob, owb in ((4, 6), (2, 8))])
        assert wide * 1.1 < narrow


@pytest.mark.parametrize("ob, cb, threads", [(1, 8, 1), (3, 8, 2), (2, 1024, 2)])
def test_channel_blocks_outermost_match_the_reference(ob, cb, threads, profile):
    """``order`` 1 (output-channel blocks outermost, each over every row) on channels no block divides, with
    partial sums between input-channel blocks (cb below the channels) and more threads than some layers have
    blocks; the default puts the blocks outermost for a deep layer whose weights outgrow half the L2 (order 2,
    the input-channel blocks outside the rows too, where there are several), rows outermost otherwise. Where
    order 2 is in the space, order 1 is not."""
    from test_cpu_kernels import ONCE

    from planforge.targets.cpu.kernel import CpuBackend

    lim = limits(profile)
    p = Problem("conv", dims(1, 37, 5, 6, 45, 3, 1, 1), "nchw/packed/add_relu")
    space = TEMPLATES["conv"].space(p, lim)
    values = {k.name: k.values for k in space.knobs}
    want = {"vec": max(values["vec"]), "owb": 2, "ob": ob, "cb": cb, "unroll": 2,
            "threads": min(threads, max(values["threads"])), "order": 1, "pf": 1024}  # (one core: one thread)
    c = space.nearest_valid({**want, "threads": 1})
    assert c is not None
    # on one thread (every size of layer has it), order 2 rather than 1 where there are several
    # input-channel blocks; the kernel still runs order 1 on more threads when told to
    one, two = (space.make({**c.as_dict(), "order": o}) for o in (1, 2))
    assert (space.is_valid(one), space.is_valid(two)) == ((False, True) if cb < 37 else (True, False))
    c = space.make({**c.as_dict(), "order": 1, "threads": want["threads"]})
    be = CpuBackend(p, TEMPLATES["conv"], profile, timing=ONCE)
    try:
        (out,) = be.measure([c])
    finally:
        be.close()
    assert out.ok, out.message
    deep = Problem("conv", dims(1, 512, 3, 3, 512, 3, 1, 1), "nhwc/wb/relu")
    shallow = Problem("conv", dims(1, 16, 24, 24, 16, 3, 1, 1), "nhwc/wb/relu")
    assert default_knobs(deep, lim)["order"] == 2 and default_knobs(shallow, lim)["order"] == 0


def _bound(p, profile, seed, threads=1):
    """Problem ``p`` at its first setting, compiled and bound to its own random inputs: (step, out, reference)."""
    import ctypes

    from planforge.targets.cpu.build import build

    t = TEMPLATES[p.op]
    knobs = dict(default_knobs(p, limits(profile)), threads=threads)
    lib = ctypes.CDLL(str(build(t.source(p, knobs), t.openmp(knobs)).path))
    inp = make_inputs(p, seed=seed)
    out = np.zeros(output_shape(p), np.float32)
    return t.bind(lib, p, knobs, inp, out), out, reference(p, inp)


def test_steps_sharing_one_scratch_buffer_stay_correct(profile):
    """Steps of other geometries on one thread share one scratch buffer (``templates.scratch.share``, as a plan's
    steps do): each writes its own zero borders and padded channels on every call, so a buffer left full of NaN
    by anything else changes no result (a 3x3 with padding, an NCHW step with a residual, a depthwise step whose
    channels are padded to the vector width, a 1x1 without padding); a step on two threads keeps its own."""
    from planforge.targets.cpu.templates.scratch import share

    problems = [Problem("conv", dims(1, 5, 9, 10, 7, 3, 1, 1), "nhwc/wb/relu"),
                Problem("conv", dims(1, 9, 8, 8, 11, 3, 2, pads=(0, 1, 1, 0)), "nchw/packed/relu_add"),
                Problem("dwconv", dims(1, 21, 10, 7, 21, 3, 1, 1, 1, 21), "nchw/wb/relu6"),
                Problem("conv", dims(1, 33, 5, 7, 17, 1), "nhwc/w/none")]
    bound = [_bound(p, profile, i) for i, p in enumerate(problems)]
    own = _bound(problems[0], profile, 9, threads=2)  # on two threads a step keeps its own scratch
    buf = share(f for f, _, _ in bound + [own])
    assert buf is not None and buf.size == max(f.scratch.floats for f, _, _ in bound)
    assert own[0].scratch.buffer is not buf and all(f.scratch.buffer is buf for f, _, _ in bound)
    own[0]()
    np.testing.assert_allclose(own[1], own[2], rtol=1e-4, atol=1e-4)
    for _ in range(2):
        for f, out, ref in bound:
            buf[:] = np.nan
            out[...] = np.nan
            f()
            assert np.isfinite(out).all()
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="at least"):
        bound[0][0].scratch.point(np.zeros(1, np.float32))


@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize("at, shape", [
    (dict(kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1)), (1, 5, 11, 13)),     # ResNet's stem pool, odd sizes
    (dict(kernel=(2, 3), stride=(1, 3), pads=(0, 1, 1, 0)), (2, 3, 7, 10)),      # asymmetric padding
    (dict(kernel=(3, 3), stride=(2, 2), dilation=(2, 2), pads=(2, 2, 2, 2)), (1, 17, 9, 9)),
    (dict(kernel=(3, 3), stride=(2, 2), ceil_mode=True), (1, 4, 8, 8)),          # windows past the input
    (dict(kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1)), (2, 37, 59, 61)),    # past PAR_WORK: split over threads
])
def test_compiled_max_pool_matches_the_reference(nhwc, at, shape):
    """The CPU target's plans run the max pool library steps as one compiled pass (templates/maxpool.py): exact
    against the reference on odd geometries in both layouts, NaN propagating as ``np.maximum`` does, and native
    (a lean chain calls it)."""
    from planforge.ops import REGISTRY
    from planforge.ops.pool import max_ref, out_hw
    from planforge.targets.cpu.plan import lib_step

    at = {"dilation": (1, 1), "ceil_mode": False, **at}
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    x[0, 0, 2, 2] = np.nan
    ref = max_ref([x], at)
    oh, ow = out_hw(shape, at)
    kind = "maxpool2d_nhwc" if nhwc else "maxpool2d"
    xin = np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if nhwc else x
    out = np.full((shape[0], oh, ow, shape[1]) if nhwc else (shape[0], shape[1], oh, ow), 7.0, np.float32)
    f = lib_step(kind, REGISTRY[kind].egg_attr(at), [xin], out)
    assert getattr(f, "native", None) is not None
    f()
    got = out.transpose(0, 3, 1, 2) if nhwc else out
    assert np.isnan(ref).any() and (np.isnan(got) == np.isnan(ref)).all()
    np.testing.assert_array_equal(got[~np.isnan(ref)], ref[~np.isnan(ref)])


def test_small_convolutions_get_one_thread_in_the_space_and_the_default(profile):
    """Under ``par_macs`` multiply-adds (per vector lane, a few microseconds of one core) a convolution is one
    thread; most of MobileNetV2's 1x1 and depthwise layers at 96x96 (0.5-3.5 M) and a ResNet 3x3 layer may take every
    core."""
    from planforge.targets.cpu.templates.conv import par_macs

    lim = limits(profile)
    small = Problem("dwconv", dims(1, 64, 6, 6, 64, 3, 1, 1, g=64), "nhwc/wb/relu6")
    mid = Problem("dwconv", dims(1, 144, 24, 24, 144, 3, 1, 1, g=144), "nhwc/wb/relu6")
    big = Problem("conv", dims(1, 64, 24, 24, 64, 3, 1, 1), "nhwc/wb/relu")
    assert 6 * 6 * 64 * 9 < par_macs(lim) <= 24 * 24 * 144 * 9
    cores = set(range(1, lim.physical_cores + 1))
    for p, want in ((small, {1}), (mid, cores), (big, cores)):
        assert {c.as_dict()["threads"] for c in TEMPLATES["conv"].space(p, lim).enumerate()} == want
        assert default_knobs(p, lim)["threads"] == max(want)


def test_rows_go_outermost_only_while_the_weights_fit_half_the_l2(profile):
    """Past half the L2 of packed weights, every row would read them from the L3 again: the space keeps only
    channel blocks outermost (``order`` 1) there, unless there is one row; a layer whose weights fit keeps both.
    (The direct template's settings: a Winograd setting of these 3x3 layers pins ``order`` to 0, its own loops.)"""
    lim = limits(profile)
    l2 = lim.caches["L2"]
    cin = l2 // (4 * 9 * 64) + 1  # 3x3 to 64 output channels: the packed weights alone outgrow the whole L2
    deep = Problem("conv", dims(1, cin, 5, 5, 64, 3, 1, 1), "nhwc/wb/relu")
    one_row = Problem("conv", dims(1, cin, 3, 3, 64, 3, 1, 0), "nhwc/wb/relu")
    shallow = Problem("conv", dims(1, 16, 8, 8, 16, 3, 1, 1), "nhwc/wb/relu")
    draws = ([TEMPLATES["conv"].space(p, lim).sample(random.Random(i)).as_dict() for i in range(120)]
             for p in (deep, one_row, shallow))
    deep_o, one_row_o, shallow_o = ({k["order"] for k in ks if k.get("algo", "direct") == "direct"} for ks in draws)
    assert 0 not in deep_o and deep_o <= {1, 2}
    assert one_row_o == {0, 1} and {0, 1} <= shallow_o  # one row: no plane of rows to keep (order 2) either
    assert default_knobs(deep, lim)["order"] == 2  # and its input-channel blocks outside the rows


def test_packed_buffers_and_scratch_start_on_a_cache_line(profile):
    """numpy's large arrays start 16 bytes past a line; a convolution's packed weights, scale, shift and padded
    scratch must not (a 64-byte vector load or store from there spans two lines), nor any ``aligned_zeros``."""
    from planforge.targets.cpu.build import build
    from planforge.targets.cpu.templates.parfor import open_library
    from planforge.targets.cpu.templates.scratch import aligned_zeros

    for shape, dt in (((1000,), np.float32), ((3, 300001), np.float32), ((7,), np.int8), ((5, 9, 16), np.float64)):
        a = aligned_zeros(shape, dt)
        assert a.ctypes.data % 64 == 0 and a.shape == shape and a.dtype == dt and not a.any()
        assert a.flags.c_contiguous and a.flags.writeable
    p = Problem("conv", dims(1, 64, 20, 20, 96, 3, 1, 1), "nhwc/wb/relu")
    t = TEMPLATES["conv"]
    knobs = default_knobs(p, limits(profile))
    lib = open_library(build(t.source(p, knobs)).path)
    inp = make_inputs(p)
    out = np.zeros(output_shape(p), np.float32)
    run = t.bind(lib, p, knobs, t.canonical(p, inp) if hasattr(t, "canonical") else inp, out)
    a = run.scratch.args
    assert all(getattr(a, f) % 64 == 0 for f in ("w", "scale", "shift", "xp")), [getattr(a, f) % 64 for f in "w"]


def test_a_convolution_without_padding_reads_its_input_in_place(profile):
    """No padded scratch for an NHWC direct convolution with no padding (its padded lines would be the input's
    own) nor for an NHWC depthwise one whose channel tiles divide its channels; a padded direct one, an NCHW one
    and a depthwise one with a channel tail keep theirs."""
    from planforge.targets.cpu.build import build
    from planforge.targets.cpu.templates.parfor import open_library

    lim = limits(profile)
    cases = [(Problem("conv", dims(1, 24, 9, 11, 40, 1, 2), "nhwc/wb/relu"), False),
             (Problem("conv", dims(1, 16, 9, 10, 24, 3), "nhwc/wb/relu"), False),
             (Problem("conv", dims(1, 16, 9, 10, 24, 3, 1, 1), "nhwc/wb/relu"), True),
             (Problem("conv", dims(1, 24, 9, 11, 40, 1), "nchw/wb/relu"), True),
             (Problem("dwconv", dims(1, 20, 8, 8, 20, 3, 1, 1, 1, 20), "nhwc/wb/relu"), True),
             (Problem("dwconv", dims(1, 32, 8, 8, 32, 3, 1, 1, 1, 32), "nchw/wb/relu"), True),
             (Problem("dwconv", dims(1, 32, 8, 8, 32, 3, 1, 1, 1, 32), "nhwc/wb/relu"), False)]
    for p, copies in cases:
        t = TEMPLATES[p.op]
        knobs = {**default_knobs(p, lim), "owb": 3, "vec": min(8, lim.vector_lanes)}
        lib = open_library(build(t.source(p, knobs)).path)
        out = np.zeros(output_shape(p), np.float32)
        inp = make_inputs(p)
        run = t.bind(lib, p, knobs, inp, out)
        assert bool(run.scratch.args.xp) == copies, p
        run()
        want = reference(p, inp)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("d, epi", [
    (dims(1, 48, 12, 12, 48, 3, 2, 1, 1, 48), "nhwc/wb/relu6"),     # stride 2: one left edge column, no right one
    (dims(2, 48, 9, 13, 48, 3, 1, 1, 1, 48), "nhwc/packed/add"),    # a residual: no tile moved back
    (dims(1, 48, 5, 4, 48, 5, 1, 2, 1, 48), "nhwc/wss/silu"),       # no interior column at all
])
def test_depthwise_in_place_tiles_and_edges_match_the_reference(d, epi, profile):
    """Every column tile (``owb``) and channel tile (``cbv`` x ``vec``) that divides the channels, read in place:
    interior tiles moved back onto the one before, edge columns and kernel rows outside the input skipped."""
    from planforge.targets.cpu.templates.conv import _reads_in_place, geometry
    from test_cpu_kernels import assert_candidates_correct

    lim = limits(profile)
    p = Problem("dwconv", d, epi)
    space = TEMPLATES["dwconv"].space(p, lim)
    base = default_knobs(p, lim)
    cands = []
    for owb in (1, 3, 4, 8):
        for vec in sorted({min(8, lim.vector_lanes), lim.vector_lanes}):
            for cbv in (1, 2, 3):
                k = {**base, "owb": owb, "vec": vec, "cbv": cbv, "threads": 1 + (owb % 2)}
                k["threads"] = min(k["threads"], lim.physical_cores)
                # valid on one thread (a layer this small gets one in the space; the kernel takes two all the same)
                if space.is_valid(space.make({**k, "threads": 1})) and _reads_in_place(p, geometry(p), k):
                    cands.append(space.make(k))
    assert len(cands) >= 6
    assert_candidates_correct(p, profile, cands)


@pytest.mark.parametrize("d, epi, knobs", [
    # input-channel blocks outside the rows (order 2), a tail tile of 7 % 3 columns, a residual, two threads
    (dims(1, 37, 9, 7, 45, 3, 1, 1), "nhwc/packed/add_relu", dict(order=2, cb=8, ob=1, owb=3, threads=2)),
    (dims(2, 40, 8, 9, 33, 3, 2, 1), "nchw/wb/relu6", dict(order=2, cb=16, ob=2, owb=4, threads=1)),
    # tail tiles alone: 9 columns at owb 4 (one left), rows outermost
    (dims(1, 19, 9, 9, 20, 3, 1, 1), "nhwc/wb/none", dict(order=0, cb=8, ob=2, owb=4, threads=2)),
    (dims(1, 24, 5, 5, 64, 1), "nhwc/w/relu", dict(order=1, cb=32, ob=2, owb=3, threads=2)),
    # no padding: the input read in place (a strided 1x1; a 3x3 whose 8 columns leave a tail of 2 at owb 3, on one
    # thread rows in order, where a padded step copies each line just before its first row)
    (dims(1, 24, 9, 11, 40, 1, 2), "nhwc/wb/relu", dict(order=0, cb=8, ob=2, owb=4, threads=2)),
    (dims(1, 16, 9, 10, 24, 3, 1, 0), "nhwc/packed/add_relu", dict(order=0, cb=8, ob=2, owb=3, threads=1)),
    (dims(1, 40, 6, 7, 20, 3, 1, 0), "nhwc/wb/relu6", dict(order=2, cb=16, ob=1, owb=4, threads=2)),
])
def test_channel_blocks_outside_the_rows_and_tail_tiles_match_the_reference(d, epi, knobs, profile):
    from planforge.targets.cpu.kernel import CpuBackend
    from test_cpu_kernels import ONCE

    lim = limits(profile)
    p = Problem("conv", d, epi)
    t = TEMPLATES["conv"]
    vec = min(8, lim.vector_lanes) if lim.vector_lanes >= 8 else lim.vector_lanes
    k = {**default_knobs(p, lim), "vec": vec, "unroll": 2, "pf": 0, **knobs}
    k["threads"] = min(k["threads"], lim.physical_cores)
    space = t.space(p, lim)
    # on one thread each setting is in the space (which keeps the smallest of these on one thread; the kernel
    # takes two all the same, and two test the split of the channel blocks)
    assert space.is_valid(space.make({**k, "threads": 1}))
    cand = space.make(k)
    be = CpuBackend(p, t, profile, timing=ONCE)
    try:
        (o,) = be.measure([cand])
    finally:
        be.close()
    assert o.ok, (o.category, o.message[:300])
