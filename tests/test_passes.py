"""The compiled passes of small library steps (``targets/cpu/templates/passes.py``): the global mean, the broadcast
multiply and the axis permutation against numpy, on shapes that fit no block of theirs, and bound by a plan as
native steps (so that a chain's run of compiled steps does not break at them)."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from planforge.targets.cpu.plan import lib_step
from planforge.targets.cpu.templates import passes

RNG = np.random.default_rng(7)


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("shape", [(1, 24, 24, 16), (2, 3, 5, 70), (1, 7, 7, 129), (3, 1, 1, 5), (1, 2, 9, 200)])
def test_the_global_mean_is_numpys_in_either_layout(shape):
    x = _f(*shape)
    y = np.full((shape[0], 1, 1, shape[3]), np.nan, np.float32)
    passes.bind_mean(x, y, nhwc=True)()
    np.testing.assert_allclose(y, x.mean(axis=(1, 2), keepdims=True), rtol=1e-5, atol=1e-6)
    y = np.full((shape[0], shape[1], 1, 1), np.nan, np.float32)
    passes.bind_mean(x, y, nhwc=False)()
    np.testing.assert_allclose(y, x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("full,part,rows", [
    ((1, 6, 6, 240), (1, 1, 1, 240), (1, 36, 240, False)),   # NHWC channel scale
    ((1, 240, 6, 6), (1, 240, 1, 1), (240, 36, 1, True)),    # NCHW channel scale
    ((2, 5, 3, 7), (2, 1, 1, 7), (2, 15, 7, True)),          # per image and channel
    ((2, 5, 3, 7), (7,), (1, 30, 7, False)),
    ((2, 5, 3, 7), (1,), (1, 210, 1, False)),                # a scalar
    ((2, 5, 3, 7), (2, 5, 3, 7), (1, 1, 210, False)),        # the same shape
    ((2, 5, 3, 7), (2, 5, 1, 1), (10, 21, 1, True)),
    ((2, 1, 3, 7), (2, 1, 1, 7), (2, 3, 7, True)),           # size-1 axes do not count
    ((300, 300), (300, 1), (300, 300, 1, True)),             # large enough to split over threads
])
def test_the_broadcast_multiply_is_exact_in_either_operand_order(full, part, rows):
    assert passes.broadcast_rows(full, part) == rows
    x, s = _f(*full), _f(*part)
    want = x * s
    for a, b in ((x, s), (s, x)):
        y = np.full(full, np.nan, np.float32)
        passes.bind_mul(a, b, y)()
        assert np.array_equal(y, want)


def test_a_multiply_the_pass_does_not_fit_stays_numpys_and_is_right():
    x, s = _f(2, 5, 3, 7), _f(2, 1, 3, 1)  # broadcast, kept, broadcast: not rows
    y = np.empty((2, 5, 3, 7), np.float32)
    assert passes.broadcast_rows(y.shape, s.shape) is None
    assert passes.bind_mul(x, s, y) is None
    assert passes.bind_mul(x.astype(np.float64), _f(7), y) is None  # not fp32
    step = lib_step("multiply", "", [x, s], y)
    assert getattr(step, "native", None) is None
    step()
    assert np.array_equal(y, x * s)


@pytest.mark.parametrize("shape", [(1, 3, 9, 11), (2, 5, 3, 7), (1, 16, 5, 4), (4, 17), (9,), (1, 1, 1, 33),
                                   (2, 1, 3, 1), (1, 2, 6, 5)])
def test_every_permutation_is_numpys_transpose(shape):
    x = _f(*shape)
    for perm in itertools.permutations(range(len(shape))):
        y = np.full([shape[p] for p in perm], np.nan, np.float32)
        passes.bind_transpose(x, y, perm)()
        assert np.array_equal(y, np.transpose(x, perm)), perm


def test_the_rgb_interleave_is_written_as_whole_rows_and_split_over_threads():
    """NCHW -> NHWC of a 3-channel image interleaves the three planes row by row (the unrolled pass), the rows
    the outer loop, which a large image splits over the process's CPUs."""
    n, ys, xs = passes.loop_nest((1, 3, 40, 50), (0, 2, 3, 1))
    assert (n[0], n[3], ys[3], xs[2], ys[2]) == (40, 3, 1, 1, 3)
    x = _f(1, 3, 300, 301)
    y = np.empty((1, 300, 301, 3), np.float32)
    passes.bind_transpose(x, y, (0, 2, 3, 1))()
    assert np.array_equal(y, np.transpose(x, (0, 2, 3, 1)))
    # a short last axis that is no interleave of whole input rows: walked in the input's order
    n, ys, xs = passes.loop_nest((2, 3, 5, 7), (3, 1, 2, 0))
    assert xs[3] == 1


@pytest.mark.parametrize("kind,attr,ins,out_shape", [
    ("global_avg_pool_nhwc", "", [(1, 6, 6, 40)], (1, 1, 1, 40)),
    ("adaptive_avg_pool2d", "1,1", [(1, 40, 6, 6)], (1, 40, 1, 1)),
    ("multiply", "", [(1, 6, 6, 40), (1, 1, 1, 40)], (1, 6, 6, 40)),
    ("transpose", "0,2,3,1", [(1, 3, 8, 8)], (1, 8, 8, 3)),
    ("transpose", "0,3,1,2", [(1, 1, 1, 40)], (1, 40, 1, 1)),
])
def test_a_plan_binds_these_library_steps_as_native_passes(kind, attr, ins, out_shape):
    from planforge.ops import LIBRARIES

    xs = [_f(*s) for s in ins]
    y = np.full(out_shape, np.nan, np.float32)
    step = lib_step(kind, attr, xs, y)
    assert getattr(step, "native", None) is not None
    step()
    op, _ = LIBRARIES[kind]
    np.testing.assert_allclose(y, op.reference(xs, op.from_egg(attr)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, idx_shape, axis", [((1000, 256), (1, 32), 0), ((7, 5, 3), (4,), 1),
                                                    ((7, 5, 3), (2, 2), 2), ((9,), (3, 1), 0)])
def test_the_gather_is_numpys_take(shape, idx_shape, axis):
    x = _f(*shape)
    idx = RNG.integers(-shape[axis], shape[axis], idx_shape).astype(np.float32)  # negatives count from the end
    want = np.take(x, idx.astype(np.int64), axis=axis)
    out = np.full(want.shape, np.nan, np.float32)
    step = lib_step("gather", str(axis), [x, idx], out)
    assert not hasattr(step, "native")  # its index check is Python's, after the pass
    step()
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("bad", [1000.0, -1001.0, 2.5, 3e30, float("nan")])
def test_a_gather_index_outside_the_table_is_an_error_naming_it(bad):
    x, idx = _f(1000, 8), np.array([[3.0, bad, 4.0]], np.float32)
    out = np.zeros((1, 3, 8), np.float32)
    run = passes.bind_gather(x, idx, out, 0)
    with pytest.raises(IndexError, match=f"1 of 3 indices outside the table's 1000 entries along axis 0 "
                                         rf"\(the first: {re.escape(f'{bad:g}')}\)"):
        run()
    assert np.isnan(out[0, 1]).all() and np.array_equal(out[0, 0], x[3]) and np.array_equal(out[0, 2], x[4])
    idx[0, 1] = 999
    run()  # the same step with the index fixed: no error left over from the last call
    np.testing.assert_array_equal(out[0, 1], x[999])


def test_a_plan_run_again_reads_its_inputs_still_in_their_slots(profile):
    """``Plan.run`` (a measurement's repeats) runs the steps again on the inputs already in their slots: an index
    input read only by the first step keeps its slot to the end, so a later value never overwrites the token ids
    an embedding lookup reads (one did, and the lookup read garbage indices on the second run)."""
    from planforge.ir.graph import GraphBuilder
    from planforge.targets import get_target
    from planforge.workloads.models import graph_workload

    gb = GraphBuilder("lookup", seed=3)
    ids = gb.input("ids", (1, 6))
    gb.g.input_dtypes["ids"] = "int64"
    h = gb.op("gather", gb.param("table", _f(50, 16)), ids, axis=0)
    g = gb.output(gb.op("relu", gb.op("matmul", gb.op("relu", gb.op("matmul", h, gb.weight("w1", 16, 16))),
                                      gb.weight("w2", 16, 16))))
    task = graph_workload(g, "lookup").tasks[0]
    plan = get_target("cpu").plan(g, task.backend.genome.program(task.seeds[0].as_dict()))
    xs = g.example_inputs(1)
    want = g.evaluate(*xs)[0]
    first = plan(*xs)[0]
    plan.run()
    plan.run()
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(plan.out_views[0], first)
