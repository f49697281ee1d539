"""Batch-1 control loops: the fused MLP on its persistent weight-stationary pool, and the lean call path.

Every split, thread count (more threads than cores included) and spin bound gives the fp64 reference's answer
under both ISA views; thousands of calls with sleeps between them (workers asleep past the spin bound) stay
right; a plan's workers stop when it is freed; the plan's hot path reads and writes the caller's arrays in place
when it can and falls back to copying when it cannot."""
from __future__ import annotations

import gc
import itertools
import os
import time

import numpy as np
import pytest

from planforge.ir.zoo import policy_mlp
from planforge.ops.kernel import MlpProblem, epilogue_of_act, problem_from_json
from planforge.targets.cpu.build import IsaError, build, build_many, isa_flags, load
from planforge.targets.cpu.templates import default_knobs, knob_space, mlp
from planforge.targets.cpu.templates.epilogues import apply_chain


def weights(layers, seed=0):
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32) for k, n, _ in layers]
    bs = [rng.standard_normal(n).astype(np.float32) for _, n, _ in layers]
    return ws, bs


def reference(layers, ws, bs, x):
    """fp64 forward pass of ``x`` ([K] or [rows, K])."""
    h = np.asarray(x, np.float64)
    for (_, _, act), w, b in zip(layers, ws, bs):
        h = apply_chain(h @ w.astype(np.float64), epilogue_of_act(act), b.astype(np.float64))
    return h


def close(y, ref):
    tol = 2e-4 * (1.0 + float(np.abs(ref).max()))
    err = float(np.abs(y.astype(np.float64) - ref).max())
    assert err <= tol, f"max |y - ref| = {err:.3g} > {tol:.3g}"


def isa_or_skip(isa):
    try:
        isa_flags(isa)
    except IsaError as e:
        pytest.skip(str(e))


# odd shapes: columns that leave tails, fewer column blocks than threads, K smaller than the threads, one layer
SHAPES = {
    "three": ((19, 37, "relu"), (37, 70, "gelu:tanh"), (70, 5, "none")),
    "one": ((33, 3, "sigmoid"),),
    "thin": ((1, 17, "relu"), (17, 2, "tanh")),
}
INNER = [{"vec": 8, "jb": 2, "ksplit": 2, "unroll": 2}, {"vec": 4, "jb": 1, "ksplit": 4, "unroll": 1},
         {"vec": 1, "jb": 4, "ksplit": 1, "unroll": 4}, {"vec": 16, "jb": 1, "ksplit": 1, "unroll": 2}]


def settings(layers, threads):
    """Every split combination at each thread count, the inner-loop knobs cycled through ``INNER``."""
    out = []
    for i, (t, splits) in enumerate(itertools.product(threads, itertools.product("nk", repeat=len(layers)))):
        k = dict(INNER[i % len(INNER)], threads=t, spin_us=mlp.SPIN_US[i % len(mlp.SPIN_US)], pin=i % 2)
        k.update(zip(mlp.split_names(layers), splits))
        out.append(k)
    return out


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_every_split_and_thread_count_is_correct(isa):
    isa_or_skip(isa)
    cases = []
    for name, layers in SHAPES.items():
        threads = (1, 2, 3) if name == "three" else (1, 2)  # 3 threads on 2 cores: oversubscribed, still right
        cases += [(layers, k) for k in settings(layers, threads)]
    if isa != "native":
        cases = cases[::2]  # the other view: every second setting (each split still at some thread count)
    built = build_many([(mlp.source(layers, k), False) for layers, k in cases], isa=isa)
    rng = np.random.default_rng(1)
    for (layers, knobs), (b, err, log) in zip(cases, built):
        assert b is not None, f"{knobs}: {err}\n{log}"
        ws, bs = weights(layers)
        x = rng.standard_normal(layers[0][0]).astype(np.float32)
        y = np.full(layers[-1][1], np.nan, np.float32)
        run = mlp.bind(load(b), layers, knobs, x, ws, bs, y)
        for _ in range(3):  # several calls: the progress counters carry over between calls
            y[:] = np.nan
            run()
            close(y, reference(layers, ws, bs, x))
        run.pool.close()


def test_thousands_of_calls_with_sleeps_stay_right():
    layers = SHAPES["three"]
    knobs = {"vec": 8, "jb": 1, "ksplit": 2, "unroll": 2, "threads": 2, "split0": "k", "split1": "n", "split2": "k",
             "spin_us": 100}
    lib = load(build(mlp.source(layers, knobs)))
    ws, bs = weights(layers, 3)
    X = np.random.default_rng(2).standard_normal((3000, layers[0][0])).astype(np.float32)
    ref = reference(layers, ws, bs, X)
    x = np.zeros(layers[0][0], np.float32)
    y = np.zeros(layers[-1][1], np.float32)
    run = mlp.bind(lib, layers, knobs, x, ws, bs, y)
    got = np.empty((len(X), layers[-1][1]), np.float32)
    for i, row in enumerate(X):
        if i % 500 == 499:
            time.sleep(0.003)  # past the 100 us spin bound: the worker sleeps, the next call must wake it
        x[:] = row
        run()
        got[i] = y
    close(got, ref)


def _threads() -> set[str]:
    """The ids of this process's threads (the pool's workers are told apart from threads of earlier tests, which may
    end while this one runs: a fresh clone's CI once counted 14 threads after the pools closed, against 15 before)."""
    return set(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_workers_stop_when_the_plan_is_freed():
    layers = SHAPES["three"]
    knobs = dict(INNER[0], threads=3, split0="n", split1="k", split2="n", spin_us=100)
    lib = load(build(mlp.source(layers, knobs)))
    ws, bs = weights(layers)
    gc.collect()
    before = _threads()
    runs = []
    for _ in range(4):
        x, y = np.ones(layers[0][0], np.float32), np.zeros(layers[-1][1], np.float32)
        runs.append(mlp.bind(lib, layers, knobs, x, ws, bs, y))
        runs[-1]()
    workers = _threads() - before
    assert len(workers) == 4 * 2  # two workers each (the caller is thread 0)
    pool = runs[0].pool
    pool.close()
    pool.close()  # twice is harmless
    assert not pool.alive and len(workers & _threads()) == 3 * 2
    del runs, pool
    gc.collect()
    assert not workers & _threads()


def _pinned_to(cpu: int) -> int:
    """Threads of this process whose allowed CPUs are exactly ``cpu``."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                allowed = next(line.split(":", 1)[1].strip() for line in f if line.startswith("Cpus_allowed_list"))
        except (OSError, StopIteration):
            continue
        n += allowed == str(cpu)
    return n


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs to pin to")
def test_a_worker_on_the_callers_cpu_moves_away():
    """Two pools started from opposite CPUs pin their workers to opposite CPUs; a caller that lands on the
    first pool's worker's CPU moves that worker to the other one at its next call, instead of taking turns
    with it through every barrier (each call then took ms, not us)."""
    layers = SHAPES["three"]
    knobs = dict(INNER[0], threads=2, split0="n", split1="k", split2="n", spin_us=1000, pin=1)
    lib = load(build(mlp.source(layers, knobs)))
    ws, bs = weights(layers)
    x, ref = np.ones(layers[0][0], np.float32), reference(layers, ws, bs, np.ones(layers[0][0]))
    mask = os.sched_getaffinity(0)
    a, b = sorted(mask)[:2]
    def start_on(cpu, y):  # a pool started from ``cpu`` (the whole mask allowed): its worker goes elsewhere
        os.sched_setaffinity(0, {cpu})  # this thread only
        os.sched_setaffinity(0, mask)  # still on ``cpu`` right after
        return mlp.bind(lib, layers, knobs, x, ws, bs, y)

    try:
        y1, y2 = np.zeros(layers[-1][1], np.float32), np.zeros(layers[-1][1], np.float32)
        one = start_on(a, y1)
        two = start_on(b, y2)
        if (_pinned_to(a), _pinned_to(b)) != (1, 1):
            pytest.skip("the scheduler moved this thread while a pool started")
        os.sched_setaffinity(0, {b})  # the caller lands on pool 1's worker's CPU
        for _ in range(3):
            one()
        assert (_pinned_to(a), _pinned_to(b)) == (2, 1)  # pool 1's worker moved beside pool 2's; the caller on b
        two()
        close(y1, ref)
        close(y2, ref)
    finally:
        os.sched_setaffinity(0, mask)


def test_space_keeps_one_thread_and_canonical_spin(lim):
    layers = SHAPES["three"]
    sp = knob_space(MlpProblem(layers), lim)
    one = [c for c in sp.enumerate() if c["threads"] == 1]
    assert one and {(c["spin_us"], c["pin"]) for c in one} == {(mlp.SPIN_US[0], 1)}
    if lim.physical_cores > 1:
        many = [c for c in sp.enumerate() if c["threads"] > 1]
        assert {c["spin_us"] for c in many} == set(mlp.SPIN_US) and {c["pin"] for c in many} == {0, 1}
        assert {tuple(c[s] for s in mlp.split_names(layers)) for c in many} == set(itertools.product("nk", repeat=3))
    d = default_knobs(MlpProblem(layers), lim)
    assert sp.is_valid(sp.make(d))


def test_a_shared_mlp_sleeps_at_once(lim):
    """A fused MLP that is one part of a partitioned model is timed apart from the other parts, so nothing in its
    measurements shows a spinning worker taking a core from them: its pool may only sleep at once."""
    layers = SHAPES["three"]
    p = MlpProblem(layers, shared=True)
    assert problem_from_json(p.to_json()) == p and "shared" not in MlpProblem(layers).to_json()
    assert p.key != MlpProblem(layers).key
    sp = knob_space(p, lim)
    assert {c["spin_us"] for c in sp.enumerate()} == {0}
    assert sp.is_valid(sp.make(default_knobs(p, lim)))


def test_partitioned_models_share_their_mlps():
    """The task of a part gets shared fused MLPs; a model that stays one task keeps every spin bound."""
    from planforge.ir.zoo import residual_mlp
    from planforge.workloads.models import graph_workload

    g = residual_mlp(blocks=2, width=16, batch=1)  # a residual add between the blocks: a cut point
    whole, cut = graph_workload(g, "whole"), graph_workload(g, "cut", whole_below=0)
    assert [t.key for t in whole.tasks] == ["graph"] and len(cut.partition.parts) > 1
    assert all(t.key.startswith("part") for t in cut.tasks)
    for shared, task in [(False, whole.tasks[0]), *((True, t) for t in cut.tasks)]:
        genome = task.backend.genome
        mlps = [nid for nid, p in genome.problems.items() if isinstance(p, MlpProblem)]
        assert mlps and all(genome.problems[nid].shared == shared for nid in mlps)
        spins = {k["spin_us"] for nid in mlps for k in genome.configs[nid]}
        assert (spins == {0}) if shared else bool(spins - {0}), (shared, spins)


def test_defaults_split_by_what_each_thread_holds():
    from planforge.targets.cpu.templates import Limits

    small = Limits("x", 8, 16, 2, {"L1d": 48 * 1024, "L2": 2 * 2**20, "L3": 32 * 2**20})
    tiny = ((16, 16, "relu"), (16, 4, "none"))
    assert mlp.defaults(tiny, small)["threads"] == 1  # a few KiB of weights: a barrier costs more than it saves
    big = ((256, 256, "relu"), (256, 256, "relu"), (256, 32, "none"))
    d = mlp.defaults(big, small)
    assert d["threads"] == 2 and d["split0"] == "n" and d["split2"] == "k"  # 32 columns: too few blocks for two


# -- the plan's hot path -------------------------------------------------------------------------------------------

def mlp_program(widths, knobs, acts=None):
    """The program of ``policy_mlp(1, widths)`` as one fused MLP step (what a tuned spec records)."""
    L = len(widths) - 1
    acts = acts or ["relu"] * (L - 1) + ["none"]
    prog = [{"args": ["obs"], "cls": "X", "inputs": [], "knobs": None, "op": "T.input", "problem": None,
             "shape": [1, widths[0]]}]
    prev = None
    for i, (k, n) in enumerate(zip(widths[:-1], widths[1:])):
        prog.append({"args": [f"l{i}.w"], "cls": f"W{i}", "inputs": [], "knobs": None, "op": "T.param",
                     "problem": None, "shape": [k, n]})
        prog.append({"args": [f"l{i}.b"], "cls": f"B{i}", "inputs": [], "knobs": None, "op": "T.param",
                     "problem": None, "shape": [n]})
        ins = [f"W{i}", f"B{i}"] if prev is None else [prev, f"W{i}", f"B{i}"]
        prog.append({"args": [acts[i]], "cls": f"L{i}", "inputs": ins, "knobs": None,
                     "op": "Layers.one" if prev is None else "Layers.then", "problem": None, "shape": None})
        prev = f"L{i}"
    layers = [[k, n, a] for k, n, a in zip(widths[:-1], widths[1:], acts)]
    prog.append({"args": [], "cls": "Y", "inputs": ["X", prev], "knobs": knobs, "op": "fused_mlp",
                 "problem": {"layers": layers, "op": "mlp"}, "shape": [1, widths[-1]]})
    return prog


def mlp_plan(widths=(19, 37, 23, 5), threads=2, splits=None):
    from planforge.targets.cpu import CpuTarget

    g = policy_mlp(1, tuple(widths))
    knobs = dict(INNER[0], threads=threads, spin_us=mlp.SPIN_US[0])
    splits = splits or ["n"] * (len(widths) - 1)
    knobs.update(zip([f"split{i}" for i in range(len(widths) - 1)], splits))
    return g, CpuTarget().plan(g, mlp_program(widths, knobs))


def test_plan_hot_path_in_place_and_out():
    from planforge.targets.cpu import fastcall

    g, plan = mlp_plan(splits=["k", "n", "k"])
    (x,) = g.example_inputs(0)
    ref = g.evaluate(x)[0]
    want = plan(x)[0]
    close(want, ref)
    f = plan.single()
    import sysconfig
    from pathlib import Path

    if (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():  # headers here: the extension must build
        assert fastcall.unavailable() is None, fastcall.unavailable()
    if fastcall.unavailable() is None:
        assert type(f).__name__ == "Bound"  # one compiled call, no Python in between
        # the kernel alone, timed from C on the same buffers (what a call's overhead is measured over)
        out = np.zeros_like(want)
        assert f.kernel_time(x, out, 3) > 0 and np.array_equal(out, want)
        with pytest.raises(TypeError, match="input shape"):
            f.kernel_time(np.zeros(3, np.float32), out, 1)
        with pytest.raises(TypeError, match="writable"):
            f.kernel_time(x, np.zeros(3, np.float32), 1)
        with pytest.raises(ValueError, match="at least 1"):
            f.kernel_time(x, out, 0)
    y = f(x)
    assert y.shape == want.shape and y.dtype == np.float32 and np.array_equal(y, want)
    out = np.zeros_like(want)
    assert f(x, out=out) is out and np.array_equal(out, want)
    assert f(x, out) is out
    # what cannot be read in place goes the copy path, with the same answer
    wide = np.zeros((1, 2 * x.shape[1]), np.float32)
    wide[:, ::2] = x
    assert np.array_equal(f(wide[:, ::2]), want)           # a strided view
    assert np.allclose(f(x.astype(np.float64)), want)     # another dtype
    strided_out = np.zeros((1, 2 * want.shape[1]), np.float32)[:, ::2]
    assert f(x, out=strided_out) is strided_out and np.array_equal(strided_out, want)
    slow = plan.single(lean=False)
    assert np.array_equal(slow(x), want) and slow(x, out=out) is out
    from planforge.targets.cpu.plan import PlanError

    with pytest.raises(PlanError, match="out has shape"):
        slow(x, out=np.zeros(7, np.float32))
    outs = [np.zeros_like(want)]
    assert plan(x, out=outs)[0] is outs[0] and np.array_equal(outs[0], want)


def test_plan_pool_stops_with_the_plan():
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("counts threads through /proc")
    gc.collect()
    before = _threads()
    g, plan = mlp_plan(threads=2)
    f = plan.single()
    (x,) = g.example_inputs(0)
    f(x)
    workers = _threads() - before
    assert len(workers) == 1
    del plan, f
    gc.collect()
    assert not workers & _threads()


def _program_where(g, want):
    """A program of ``g``'s genome whose implementation steps are what ``want(ops)`` accepts (seeded samples)."""
    import random

    from planforge.workloads.models import graph_workload

    t = graph_workload(g, "chain").tasks[0]
    rng = random.Random(0)
    for _ in range(3000):
        prog = t.backend.genome.program(t.space.sample(rng).as_dict())
        ops = [s["op"] for s in prog if s["op"] in ("fused_mlp", "tmpl1", "tmpl2", "tmpl3", "lib1", "lib2", "lib3")
               and not (s["op"] == "lib1" and s["args"][0] == "reshape")]
        if want(ops):
            return prog
    pytest.fail("no such program among the samples")


def test_a_plan_of_several_native_steps_is_one_native_call():
    from planforge.targets.cpu import CpuTarget, fastcall

    if fastcall.unavailable() is not None:
        pytest.skip(fastcall.unavailable())
    g = policy_mlp(1, (19, 37, 23, 5))
    prog = _program_where(g, lambda ops: len(ops) >= 2 and all(o in ("fused_mlp", "tmpl2", "tmpl3") for o in ops))
    plan = CpuTarget().plan(g, prog)
    (x,) = g.example_inputs(1)
    want = plan(x)[0]
    f = plan.single()
    assert type(f).__name__ == "Bound"  # the chain runner: one call from Python for all its steps
    close(f(x), g.evaluate(x)[0])
    assert np.array_equal(f(x), want)
    out = np.full_like(want, np.nan)
    assert f(x, out=out) is out and np.array_equal(out, want)
    assert np.array_equal(f(x.astype(np.float64)), want)  # another dtype: the Python path, the same answer
    assert f.kernel_time(x, out, 3) > 0
    # a library step in between: not native, so no chain (the Python path runs it)
    prog = _program_where(g, lambda ops: "lib2" in ops and any(o in ("fused_mlp", "tmpl2", "tmpl3") for o in ops))
    plan = CpuTarget().plan(g, prog)
    assert any(getattr(f, "native", None) is None for f in plan.steps)  # a numpy step runs at run time
    assert plan.lean() is None and np.allclose(plan.single()(x), g.evaluate(x)[0], rtol=1e-4, atol=1e-5)
