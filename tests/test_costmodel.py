"""Cost models and the L0 funnel: analytic bounds, the funnel's stages, the learned ranker, model-guided search."""
import itertools
import math
import random

import numpy as np
import pytest

from planforge.targets.table import TableBackend
from planforge.costmodel import spearman, top_k_recall
from planforge.costmodel.analytic import AnalyticModel, Ceilings
from planforge.costmodel.columns import index_columns, ravel, shape_columns, valid_points
from planforge.costmodel.funnel import Funnel, Subspace, pruned_fraction, spread_order
from planforge.costmodel.learned import LearnedRanker, grades, task_dims
from planforge.targets.cpu.templates import TEMPLATES, Problem, flops
from planforge.search import Budget, STRATEGIES, make_strategy, search
from planforge.space import Space, categorical, int_range, pow2
from planforge.space import fingerprint_of


# -- a synthetic machine: ceilings the tests choose, so the model's numbers are exact -----------------
def ceilings(**kw) -> Ceilings:
    base = dict(rate_bits={256: 100e9, 512: 200e9}, speedup=2.0, threads=2,
                bw={"L1": {"read": (400e9, 800e9), "copy": (400e9, 800e9)},
                    "L2": {"read": (200e9, 400e9), "copy": (200e9, 400e9)},
                    "L3": {"read": (100e9, 150e9), "copy": (100e9, 150e9)},
                    "DRAM": {"read": (20e9, 30e9), "copy": (20e9, 30e9)}},
                cache={"L1": (48 * 1024, 2, 1), "L2": (1 << 20, 2, 1), "L3": (32 << 20, 1, 2)},
                call_s=3e-7, launch_s=1e-6, fingerprint="synthetic")
    base.update(kw)
    return Ceilings(**base)


class Lim:  # what the templates' spaces read from a profile
    vector_lanes, vector_registers, physical_cores = 16, 32, 2
    caches = {"L1d": 48 * 1024, "L2": 1 << 20, "L3": 32 << 20}


def model_for(op, dims, epilogue="none", cold=False):
    p = Problem(op, dims, epilogue)
    space = TEMPLATES[op].space(p, Lim)
    return AnalyticModel(op, dims, epilogue, flops(p), ceilings(), space, cold, Lim.vector_registers), space


def truth(model, space, spread=0.15):
    """A latency table where the model's assumptions hold: every point takes its predicted time
    times a fixed per-point factor in [1, 1 + spread) (a stable hash of its fingerprint)."""
    cands = list(space.enumerate())
    pred = model.predict(cands)
    table = {}
    for c, p in zip(cands, pred):
        h = int(c.fingerprint[:8], 16) / 16**8
        table[c.fingerprint] = (p if math.isfinite(p) else 10 * max(x for x in pred if math.isfinite(x))) * (1 + spread * h)
    return cands, table


# -- columns ----------------------------------------------------------------------------------------------
def test_valid_points_match_enumeration_with_every_operator():
    s = Space([int_range("a", 0, 9), pow2("b", 1, 64), categorical("c", ("x", "y", "z"))],
              ["a % 3 != 1 or c == 'x'", "max(a, b) // 2 <= 20", "b / a > 0.5", "c in ('x', 'z') or a * b < 30",
               "(a if c == 'y' else -a) <= abs(a - 1) + 1", "not (a == 4 and b == 4)"], constants={"k": 3})
    idx = valid_points(s)
    assert ravel(idx, s).tolist() == s.valid_ints()
    # a / 0 is a violation, as Restriction.__call__ has it
    assert all(row[0] != 0 for row in idx)
    cols = index_columns(s, idx)
    assert set(cols) == {"a", "b", "c"} and len(cols["c"]) == len(idx)


def test_subspace_shares_fingerprints_and_names_what_is_outside():
    s = Space([int_range("a", 0, 9), int_range("b", 0, 9)], ["a + b < 15"])
    members = [s.to_int((3, 4)), s.to_int((1, 1)), s.to_int((9, 5))]
    sub = Subspace(s, members)
    got = list(sub.enumerate())
    assert [c.index for c in got] == [(3, 4), (1, 1), (9, 5)]  # members' order
    assert [c.fingerprint for c in got] == [s.candidate(c.index).fingerprint for c in got]
    assert sub.violations({"a": 2, "b": 2}) == ["outside the funnel's top-k"]
    assert sub.violations({"a": 9, "b": 9}) == ["a + b < 15"]
    assert sub.sample(random.Random(0)).index in {(3, 4), (1, 1), (9, 5)}


# -- the analytic model -------------------------------------------------------------------------------------
@pytest.mark.parametrize("op,dims,epi", [("gemm", (24, 64, 48), "bias_relu"), ("gemv", (256, 128), "bias"),
                                         ("softmax", (8, 100), "none"), ("layernorm", (4, 64), "none"),
                                         ("eltwise", (8, 96), "bias_gelu")])
def test_prediction_never_below_bound_and_bound_above_compute_floor(op, dims, epi):
    m, space = model_for(op, dims, epi)
    cands = list(itertools.islice(space.enumerate(), 3000))
    e = m.estimate(cands)
    assert np.all(e.predicted_s >= e.bound_s) and np.all(e.bound_s > 0)
    # no plan beats all the flops at the widest peak on every thread
    floor = flops(Problem(op, dims, epi)) / (200e9 * 2)
    assert np.all(e.bound_s >= floor * (1 - 1e-9))
    assert m.lower_bound(cands[:5]) == pytest.approx(e.bound_s[:5].tolist())


def test_gemm_bound_counts_threads_vector_width_and_launch():
    m, space = model_for("gemm", (64, 256, 256), "none")
    base = {"mr": 4, "nv": 2, "unroll": 2, "pack_a": 1, "pack_b": 1, "order": "ji", "mc": 64, "kc": 256,
            "nc": 256, "par": "n", "pf": 0}
    one16, two16, one8 = (space.make({**base, "vec": v, "threads": t}) for v, t in ((16, 1), (16, 2), (8, 1)))
    b = dict(zip(("one16", "two16", "one8"), m.lower_bound([one16, two16, one8])))
    f = 2.0 * 64 * 256 * 256
    assert b["one16"] == pytest.approx(f / 200e9, rel=1e-6)  # compute-bound at the 512-bit peak
    assert b["one8"] == pytest.approx(f / 100e9, rel=1e-6)  # 256-bit vectors see the 256-bit peak
    assert b["two16"] == pytest.approx(f / 2 / 200e9 + 1e-6, rel=1e-6)  # half each, plus a fork-join
    assert m.predict([one16])[0] >= b["one16"] + 3e-7  # the prediction pays the call as well


def test_capacity_names_the_check_a_tile_fails():
    m, space = model_for("gemm", (256, 256, 2048), "none")
    ok = space.make({"vec": 16, "mr": 6, "nv": 3, "unroll": 1, "pack_a": 1, "pack_b": 1, "order": "ji",
                     "mc": 64, "kc": 256, "nc": 256, "threads": 1, "par": "n", "pf": 0})
    big_a = space.make({**ok.as_dict(), "mc": 512, "kc": 2048})  # a 4 MiB A block: past a 1 MiB L2
    assert m.capacity([big_a, ok]) == ["A block and B micro-panel exceed L2", None]
    assert m.predict([big_a])[0] == math.inf


def test_micro_panels_past_l1_are_read_from_l2_not_refused():
    # 256 x (6 + 48) floats of micro-panels (55 KB) overflow a 48 KB L1: the B vectors the micro-kernel loads come
    # from L2 (a measured 32x1024x256 GEMM ran fastest so), where at kc 128 (27 KB) they come from L1
    m, space = model_for("gemm", (256, 256, 2048), "none")
    big = space.make({"vec": 16, "mr": 6, "nv": 3, "unroll": 1, "pack_a": 1, "pack_b": 1, "order": "ji",
                      "mc": 64, "kc": 256, "nc": 256, "threads": 1, "par": "n", "pf": 0})
    small = space.make({**big.as_dict(), "kc": 128})
    assert m.capacity([big, small]) == [None, None]
    e = m.estimate([big, small])
    b, s = e.row(0), e.row(1)
    assert math.isfinite(b["predicted_s"])
    loads = 2.0 * 256 * 256 * 2048 / (2 * 6 * 48) * 3 * 16 * 4  # per k step of a tile: 3 vectors of B
    assert b["bytes"]["L2"] - s["bytes"]["L2"] >= 0.9 * loads


def test_memory_bound_gemv_cold_caches_come_from_dram():
    hot, space = model_for("gemv", (1024, 1024), "none")
    cold = AnalyticModel("gemv", (1024, 1024), "none", hot.useful, hot.ceil, space, cold=True)
    c = space.make({"vec": 16, "jb": 2, "ksplit": 2, "unroll": 1, "w_layout": "packed", "threads": 2})
    w = 4.0 * (1024 * 1024 + 1024 + 2 * 1024)
    assert cold.lower_bound([c])[0] == pytest.approx(w / 30e9 + 1e-6, rel=1e-6)  # all of W from DRAM
    assert hot.lower_bound([c])[0] < cold.lower_bound([c])[0]
    assert hot.estimate([c]).row(0)["limiter"] == "L3"


def test_memory_time_is_the_slowest_threads_bytes_at_its_share_of_the_bandwidth():
    m, space = model_for("gemv", (4096, 1024))  # 16 MiB of weights: L3 (100 / 150 GB/s on 1 / 2 threads)
    knobs = {"vec": 16, "jb": 2, "ksplit": 1, "unroll": 1, "w_layout": "packed"}
    one, two = (m.estimate([space.make({**knobs, "threads": t})]) for t in (1, 2))
    for e, team_bw in ((one, 100e9), (two, 150e9)):
        threads = 1 if e is one else 2
        assert e.memory_s["L3"][0] == pytest.approx(e.bytes["L3"][0] * threads / team_bw, rel=1e-9)
    # two threads share 150 GB/s: 1.5x one thread's 100, not 2x the bytes over the whole team's bandwidth
    assert one.memory_s["L3"][0] / two.memory_s["L3"][0] == pytest.approx(1.5, rel=0.01)


def test_gemv_k_split_streams_read_at_the_probes_four_stream_rate():
    """With a "read4" figure, a block's ksplit chunks of K (that many streams per thread) read faster, by the
    measured ratio at four, half of it in log2 at two; without one, ksplit changes no memory time."""
    bw = {lvl: {**kinds, "read4": tuple(1.5 * x for x in kinds["read"])}
          for lvl, kinds in ceilings().bw.items()}
    plain, space = model_for("gemv", (4096, 1024))
    streams = AnalyticModel("gemv", (4096, 1024), "none", plain.useful, ceilings(bw=bw), space, False,
                            plain.vregs)
    knobs = {"vec": 16, "jb": 2, "unroll": 1, "w_layout": "packed", "threads": 2}
    cands = [space.make({**knobs, "ksplit": k}) for k in (1, 2, 4)]
    mem = streams.estimate(cands).memory_s["L3"]
    assert mem[0] / mem[2] == pytest.approx(1.5, rel=1e-9) and mem[0] / mem[1] == pytest.approx(1.25, rel=1e-9)
    assert len(set(np.round(plain.estimate(cands).memory_s["L3"], 15))) == 1
    # the bound takes the fastest kind: the four-stream read
    c = cands[0]
    assert streams.lower_bound([c])[0] < plain.lower_bound([c])[0]


def test_gemv_row_layout_past_a_page_streams_slower_than_packed():
    m, space = model_for("gemv", (2048, 1024))
    knobs = {"vec": 16, "jb": 2, "ksplit": 2, "unroll": 1, "threads": 1}
    row, packed = (space.make({**knobs, "w_layout": w}) for w in ("row", "packed"))
    e = m.estimate([row, packed])
    assert e.row(0)["bytes"]["DRAM"] > 0 and e.row(1)["bytes"]["DRAM"] == 0  # W (8 MiB) sits in L3
    assert e.predicted_s[0] > 2 * e.predicted_s[1] and e.bound_s[0] == e.bound_s[1]  # the bound assumes nothing


def test_model_on_a_profile_needs_its_ceilings(profile):
    p = Problem("softmax", (4, 32))
    from planforge.targets.cpu.templates import limits

    from planforge.targets.cpu.target import CpuTarget

    m = AnalyticModel.for_problem(p, TEMPLATES["softmax"].space(p, limits(profile)), CpuTarget(profile))
    assert m.ceil.fingerprint == profile.fingerprint and max(m.ceil.rate_bits.values()) == pytest.approx(
        profile.peak_flops_1t)
    with pytest.raises(ValueError, match="no analytic model"):
        AnalyticModel("fft", (1,), "none", 1.0, m.ceil, m.space)


# -- the funnel ---------------------------------------------------------------------------------------------
def _tuned(space, strategy, backend, evals, seed=0, cost_model=None):
    return search(space, make_strategy(strategy, space, seed, budget=evals, cost_model=cost_model), backend,
                  Budget(evals=evals), keep=4)


@pytest.mark.parametrize("op,dims", [("gemv", (512, 256)), ("gemm", (8, 32, 16))])
def test_funnel_keeps_the_exhaustive_best_where_the_assumptions_hold(op, dims):
    m, space = model_for(op, dims)
    cands, table = truth(m, space)
    backend = TableBackend(table)
    full = _tuned(space, "exhaustive", backend, len(cands))
    best = full.ranked.best
    # every lower bound is below the table's time
    assert all(b <= table[c.fingerprint] for c, b in zip(cands, m.lower_bound(cands)))
    screen = Funnel(m, top_k=0.1, margin=0.0).screen(space)
    assert screen.counts["restrictions"] == len(cands) and screen.counts["top-k"] <= math.ceil(0.1 * len(cands))
    res = search(screen.space, make_strategy("exhaustive", screen.space, 0, budget=len(cands)), backend,
                 Budget(evals=len(cands)), keep=4, screen=screen)
    assert res.ranked.best.candidate.fingerprint == best.candidate.fingerprint
    assert res.ranked.best.metric == best.metric
    stages = screen.stages(res.evaluations, res.ranked.best.metric)
    names = [s["stage"] for s in stages]
    assert names == ["space", "restrictions", "capacity", "roofline", "top-k", "measured"]
    counts = [s["count"] for s in stages]
    assert counts == sorted(counts, reverse=True) and counts[0] == space.size
    assert res.counts.get("rejected", 0) == screen.pruned  # what the roofline stage refused was never measured
    assert res.evaluations + screen.pruned == screen.counts["top-k"]
    assert pruned_fraction(stages) > 0.89  # top-k keeps a tenth (rounded up); nothing else is measured


def test_roofline_stage_never_refuses_a_point_that_could_win():
    # 1 MiB of weights: the one-thread, narrow-vector points' bounds are slower than the best point's time
    m, space = model_for("gemv", (1024, 256))
    cands, table = truth(m, space, spread=0.0)
    screen = Funnel(m, top_k=1.0 - 1e-9, margin=0.0).screen(space)
    best = min(table.values())
    for c in cands:
        if table[c.fingerprint] <= best * 1.0001:
            assert screen.admit(c, best) is None
    worst = max(cands, key=lambda c: m.lower_bound([c])[0])
    assert "roofline" in screen.admit(worst, best)


class _Order:
    def __init__(self, ints):
        self.ints = list(ints)

    def order(self):
        return self.ints


def test_funnel_warm_stage_keeps_the_sources_best_beside_the_top_k():
    m, space = model_for("gemv", (512, 256))
    cold = Funnel(m, top_k=0.05, margin=0.0).screen(space)
    top = set(cold.space.valid_ints())
    cands = list(space.enumerate())
    pred = m.predict(cands)
    fitting = [c for c, p in zip(cands, pred) if math.isfinite(p)]
    unfit = [c for c, p in zip(cands, pred) if not math.isfinite(p)]
    outside = [space.to_int(c.index) for c in fitting if space.to_int(c.index) not in top][-6:]  # predicted worst
    inside = [n for n in cold.space.valid_ints()][:2]
    order = [space.to_int(unfit[0].index)] if unfit else []
    order += [*outside[:3], inside[0], 10**12, *outside[3:], inside[1]]  # an invalid point is skipped
    screen = Funnel(m, top_k=0.05, margin=0.0, warm=_Order(order), warm_k=6).screen(space)
    kept = screen.space.valid_ints()
    assert kept[:len(top)] == cold.space.valid_ints()  # the top-k first, in its order
    assert kept[len(top):] == outside[:5]  # then the warm ranking's first six that fit, less the one kept already
    assert screen.warm == {"ranked": 6, "in_top_k": 1, "added": 5, "unfit": 1 if unfit else 0}
    stages = screen.stages(0, None)
    assert [s["stage"] for s in stages][-3:] == ["top-k", "warm", "measured"]
    assert stages[-2]["count"] == len(top) + 5 and stages[-2]["added"] == 5
    assert all(screen.bound(screen.space.candidate(screen.space.from_int(n))) > 0 for n in kept)
    assert Funnel(m, top_k=0.05, warm=_Order([]), warm_k=6).screen(space).warm["added"] == 0
    with pytest.raises(ValueError, match="warm_k"):
        Funnel(m, warm_k=-1)


def test_funnel_without_a_model_counts_restrictions_only():
    s = Space([int_range("a", 0, 9)], ["a % 2 == 0"])
    screen = Funnel(None).screen(s)
    assert screen.space is s and screen.stages(3, 1.0) == [
        {"stage": "space", "count": 10}, {"stage": "restrictions", "count": 5}, {"stage": "measured", "count": 3}]
    with pytest.raises(ValueError, match="top_k"):
        Funnel(None, top_k=2.5)


# -- the learned model --------------------------------------------------------------------------------------
def structured():
    """A space whose latency has a known structure: a bowl in a and b plus a per-category cost."""
    s = Space([int_range("a", 0, 15), int_range("b", 0, 15), categorical("c", ("x", "y", "z"))])
    cost = {"x": 0.0, "y": 6.0, "z": 12.0}
    table = {}
    for c in s.enumerate():
        h = int(c.fingerprint[:6], 16) / 16**6
        table[c.fingerprint] = 1e-6 * (1 + (c["a"] - 5) ** 2 + 3 * abs(c["b"] - 10) + cost[c["c"]] + 2 * h)
    return s, table


def test_grades_are_lambdarank_labels():
    g = grades([3.0, None, 1.0, 2.0, 1.0])
    assert g.tolist() == [1, 0, 30, 10, 30] and g.max() <= 30 and g.dtype.kind == "i"
    assert grades([None, None]).tolist() == [0, 0] and grades([5.0]).tolist() == [30]


def test_learned_ranker_beats_random_ranking_and_is_reproducible():
    s, table = structured()
    cands = list(s.enumerate())
    random.Random(1).shuffle(cands)
    train, test = cands[:120], cands[120:]
    meas = [table[c.fingerprint] for c in test]
    models = []
    for _ in range(2):
        r = LearnedRanker(s, seed=3)
        r.add(train, [table[c.fingerprint] for c in train])
        assert r.fit()
        models.append(r.predict(test))
    assert models[0] == models[1]  # same data, same seed: same model
    rho = spearman(models[0], meas)
    shuffles = [[rng.random() for _ in test] for rng in map(random.Random, range(20))]
    chance = [spearman(x, meas) for x in shuffles]
    assert rho > 0.8 and rho > max(chance) + 0.5
    assert top_k_recall(models[0], meas, 10) >= 0.5 > np.mean([top_k_recall(x, meas, 10) for x in shuffles])


def test_learned_ranker_waits_for_data():
    s, table = structured()
    r = LearnedRanker(s, min_fit=8)
    c = list(s.enumerate())[:4]
    r.add(c, [table[x.fingerprint] for x in c])
    assert not r.fit() and not r.ready
    with pytest.raises(RuntimeError, match="not been fitted"):
        r.predict(c)


def test_task_dims_and_shape_columns():
    assert task_dims("gemm_256x1024x2048_bias_relu on 6176") == (256, 1024, 2048)
    assert task_dims("gemv_2048x2048_none@run-1") == (2048, 2048) and task_dims("drill") is None
    s = Space([pow2("t", 4, 64), categorical("flag", [0, 1]), categorical("o", ["a", "b", "c"])])
    c = [s.make({"t": 4, "flag": 1, "o": "a"}), s.make({"t": 64, "flag": 0, "o": "c"})]
    x = shape_columns(s, c, (32, 100))  # sizes, then t's tile counts along each (flag and o are not tiles)
    assert x.tolist() == [[5, math.log2(100), 3, math.log2(25)], [5, math.log2(100), 0, 1]]


def test_learned_ranker_describes_other_shapes_rows_by_their_own_shape():
    """Trained on another shape's times (one query group named by its task key) and 8 of this shape's,
    the ranker orders this shape's points well, where reading those rows as this shape's (a group
    without a shape in its name) does not: the gemv's best block width depends on the shape."""
    ms, ss = model_for("gemv", (512, 256))
    mt, st = model_for("gemv", (1024, 512))
    rng = random.Random(0)
    cs, tabs = truth(ms, ss)
    ct, tabt = truth(mt, st)
    fit_s = [c for c in cs if math.isfinite(ms.predict([c])[0])]
    fit_t = [c for c in ct if math.isfinite(mt.predict([c])[0])]
    sample, test = rng.sample(fit_s, 64), rng.sample(fit_t, 308)
    own, test = test[:8], test[8:]
    meas = [tabt[c.fingerprint] for c in test]
    rho = {}
    for group in ("gemv_512x256_none on another-device", "elsewhere"):
        r = LearnedRanker(st, mt, seed=0)
        assert r.add_configs([(group, c.as_dict(), tabs[c.fingerprint]) for c in sample]) == 64
        assert r.fit() == (group == "elsewhere")  # another shape's rows wait for min_fit of this shape's
        r.add(own, [tabt[c.fingerprint] for c in own])
        assert r.fit()
        rho[group] = spearman(r.predict(test), meas)
    # 0.76 against 0.45 with the roofline's per-thread share of the bandwidth (0.93 against 0.55 before it)
    assert rho["gemv_512x256_none on another-device"] > max(0.7, rho["elsewhere"] + 0.2)
    r = LearnedRanker(st, mt, seed=0)
    src = [st.make(c.as_dict()) for c in sample[:3]]
    at = mt.at((512, 256))
    assert at.dims == ms.dims and at.useful == pytest.approx(ms.useful)
    assert np.array_equal(r.encode(src, (512, 256)), r.encode(src, ms.dims))
    assert not np.array_equal(r.encode(src, (512, 256)), r.encode(src))  # its own shape, not this one


# -- model-guided search ------------------------------------------------------------------------------------
def evals_to_best(space, table, strategy, seed, budget=120, **opts):
    best = min(table.values())
    strat = make_strategy(strategy, space, seed, budget=budget, **opts)
    res = search(space, strat, TableBackend(table), Budget(evals=budget))
    return next((t.n for t in res.trials if t.n and t.outcome.metric <= best * 1.05), budget + 1), res


def test_model_guided_beats_random_on_a_structured_space():
    s, table = structured()
    model = [evals_to_best(s, table, "model", seed, exhaustive_limit=0)[0] for seed in range(4)]
    rand = [evals_to_best(s, table, "random", seed)[0] for seed in range(4)]
    assert np.median(model) < np.median(rand)


def test_model_guided_is_reproducible_and_never_repeats():
    s, table = structured()
    runs = [evals_to_best(s, table, "model", 7, budget=40, batch=5)[1] for _ in range(2)]
    fps = [[t.candidate.fingerprint for t in r.trials] for r in runs]
    assert fps[0] == fps[1] and len(set(fps[0])) == len(fps[0]) == 40
    d = make_strategy("model", s, 0).describe()
    assert d["name"] == "model" and d["model"]["name"] == "lightgbm-lambdarank"


def test_model_guided_exhausts_a_small_space():
    s = Space([int_range("a", 0, 4)])
    table = {c.fingerprint: 1.0 + c["a"] for c in s.enumerate()}
    res = search(s, make_strategy("model", s, 0), TableBackend(table), Budget(evals=50))
    assert res.evaluations == 5 and res.stop_reason == "space exhausted"
    with pytest.raises(ValueError, match="batch"):
        make_strategy("model", s, 0, batch=0)


def test_auto_picks_model_guided_only_with_analytic_features():
    m, space = model_for("gemv", (512, 256))
    assert "model" in STRATEGIES
    assert make_strategy("auto", space, 0, budget=8, cost_model=m).name == "model"
    assert make_strategy("auto", space, 0, budget=10_000, cost_model=m).name == "exhaustive"
    # without analytic features (a proxy table, a recorded space) auto leaves the choice to the others
    assert make_strategy("auto", space, 0, budget=8, cost_model=None).name != "model"


def test_model_guided_with_the_analytic_model_starts_from_its_best():
    m, space = model_for("gemv", (512, 256))
    cands, table = truth(m, space)
    strat = make_strategy("model", space, 0, cost_model=m, batch=4, epsilon=0.0)
    first = strat.ask(4)
    pred = m.predict(cands)
    assert [c.fingerprint for c in first] == [cands[i].fingerprint for i in np.argsort(pred, kind="stable")[:4]]
    # then the two sizes and the tile counts of vec, jb, ksplit and unroll along each
    assert strat.ranker.encode(first).shape[1] == len(space.knobs) + len(m.feature_names()) + 2 + 4 * 2


def test_fingerprints_unchanged_by_columns():
    s = Space([categorical("v", (4, 8)), categorical("o", ("ji", "ij"))])
    c = s.make({"v": 8, "o": "ij"})
    assert c.fingerprint == fingerprint_of({"v": 8, "o": "ij"})


# -- through the driver ---------------------------------------------------------------------------------------
def test_tune_reports_the_funnel_and_the_bound_and_warm_starts(tmp_path):
    from planforge.measure import TimingConfig
    from planforge.report import summary_json
    from planforge.spec import load_spec
    from planforge.tuning import tune
    from planforge.workloads import load_workload

    fast = TimingConfig(warmup_s=0.001, budget_s=0.005, min_repeats=3, max_repeats=5)
    runs = []
    for _ in range(2):
        wl = load_workload("softmax", {"shape": "4,32"})
        wl.tasks[0].backend.timing = fast
        runs.append(tune(wl, budget=Budget(evals=4), out=tmp_path / f"r{len(runs)}", records=tmp_path / "rec.db"))
    first, second = runs
    tr = first.tasks[0]
    # the space's size depends on the machine (vector widths up to its lanes, threads up to its cores):
    # 24 points with 16 lanes and 2 cores, 18 with 8 lanes; the test needs more valid points than evaluations
    valid = tr.task.space.valid_size()
    assert valid > 4
    assert tr.strategy["name"] == "model"  # more points than evaluations, and the task has an analytic model
    names = [s["stage"] for s in tr.funnel]
    assert names[:3] == ["space", "restrictions", "capacity"] and names[-1] == "measured"
    assert tr.funnel[-1]["count"] == tr.result.evaluations == 4
    assert 0 < tr.bound["bound_s"] <= tr.bound["predicted_s"] and tr.bound["of_bound"] > 0
    assert [r["rank"] for r in tr.bound["ranked"]] == list(range(1, len(tr.ranked) + 1))
    assert tr.bound["ranked"][tr.walk.accepted.rank - 1]["of_bound"] == pytest.approx(tr.bound["of_bound"])
    j = summary_json(first)
    assert j["funnel"] == tr.funnel and j["tasks"][tr.task.key]["bound"]["limiter"]
    assert j["tasks"][tr.task.key]["funnel_pruned"] == pruned_fraction(tr.funnel) == 1 - 4 / valid
    spec = load_spec(first.spec_path)
    assert spec["tasks"][tr.task.key]["funnel"] == tr.funnel
    # the second run's ranker starts from the first run's measurements (same template, same device)
    assert second.tasks[0].strategy["model"]["warm_start"] == sum(
        1 for t in tr.result.trials if t.outcome.status != "rejected")
    assert first.tasks[0].strategy["model"]["warm_start"] == 0


def test_without_the_funnel_the_whole_valid_space_is_searched(tmp_path):
    from planforge.measure import TimingConfig
    from planforge.tuning import tune
    from planforge.workloads import load_workload

    res = {}
    for on in (True, False):
        wl = load_workload("softmax", {"shape": "4,32"})
        wl.tasks[0].backend.timing = TimingConfig(warmup_s=0.001, budget_s=0.005, min_repeats=3, max_repeats=5)
        res[on] = tune(wl, budget=Budget(evals=2), out=tmp_path / str(on), funnel=on).tasks[0]
    assert [s["stage"] for s in res[True].funnel] == ["space", "restrictions", "capacity", "roofline", "top-k",
                                                      "measured"]
    # sizes from the space itself: 24 points with 16 lanes and 2 cores, 18 with 8 lanes, more with more cores
    space = res[False].task.space
    assert space.valid_size() > 2  # more than the budget, or the test could not tell a funnel from none
    assert res[False].funnel == [{"stage": "space", "count": space.size},
                                 {"stage": "restrictions", "count": space.valid_size()},
                                 {"stage": "measured", "count": 2}]
    assert res[True].funnel[0] == {"stage": "space", "count": space.size}
    assert res[False].result.counts.get("rejected", 0) == 0


def test_a_tie_of_the_model_is_kept_and_ordered_spread_over_every_knob_value():
    # a roofline predicts one time for every point of a memory-bound kernel: the space's own order would keep
    # (and measure first) the points of its first vector width and blocking only
    space = Space([pow2("vec", 4, 16), pow2("jb", 1, 8), pow2("ksplit", 1, 4), pow2("unroll", 1, 8),
                   categorical("layout", ["row", "packed"])])
    idx = valid_points(space)
    pred = np.full(len(idx), 1e-3)
    pred[7] = 5e-4  # one point predicted faster comes first whatever the spread
    pred[:4] = 2e-3  # and slower ones after the tie
    order = spread_order(pred, idx, need=16, seed=0)
    assert sorted(order.tolist()) == list(range(len(idx)))
    assert order[0] == 7 and set(order[-4:].tolist()) == {0, 1, 2, 3}
    first = idx[order[1:17]]
    for j, k in enumerate(space.knobs):  # the first 16 of the tie hold every value of every knob
        assert set(first[:, j].tolist()) == set(range(len(k.values))), k.name
    # the first two of the tie differ in every knob (farthest-point under Hamming distance)
    assert np.count_nonzero(idx[order[1]] != idx[order[2]]) == len(space.knobs)
    assert order.tolist() == spread_order(pred, idx, need=16, seed=0).tolist()  # the seed fixes it
    assert order.tolist() != spread_order(pred, idx, need=16, seed=1).tolist()
    # the funnel's top-k of such a tie is a design over its knob values, not a corner of the space
    class Flat:
        name = "flat"

        def evaluate(self, cols):
            n = len(next(iter(cols.values())))
            return type("E", (), {"fits": np.ones(n, bool), "predicted_s": np.full(n, 1e-3),
                                  "bound_s": np.full(n, 1e-3)})()

        def predict(self, cands):
            return [1e-3] * len(cands)

        estimate = features_of = predict

        def lower_bound(self, cands):
            return [1e-3] * len(cands)

    kept = [c.as_dict() for c in Funnel(Flat(), top_k=16).screen(space).space.enumerate()]
    assert len(kept) == 16
    for k in space.knobs:
        assert {c[k.name] for c in kept} == set(k.values), k.name


def test_a_measurement_that_beats_its_bound_corrects_the_roofline_stage_instead_of_ending_the_search():
    # the model's ceilings too low (a bandwidth probed on a busy machine): every time is 0.7x its bound
    m, space = model_for("gemv", (512, 256))
    cands, _ = truth(m, space, spread=0.0)
    table = {c.fingerprint: 0.7 * b * (1 + 0.2 * (i % 5)) for i, (c, b) in enumerate(zip(cands, m.lower_bound(cands)))}
    screen = Funnel(m, top_k=1.0 - 1e-9, margin=0.1).screen(space)
    first = min(cands, key=lambda c: table[c.fingerprint])
    best = table[first.fingerprint]
    uncorrected = sum(screen.admit(c, best) is not None for c in cands)
    assert uncorrected > 0.9 * len(cands)  # refused nearly everything: the search would end here
    screen.pruned = 0
    screen.observe(first, best)
    assert screen.scale == pytest.approx(0.7)
    refused = [c for c in cands if screen.admit(c, best) is not None]
    assert len(refused) < uncorrected
    # what is still refused is slower than the best by its corrected bound
    assert all(table[c.fingerprint] > best for c in refused)
    assert all(0.7 * m.lower_bound([c])[0] > best * 1.1 for c in refused)
    assert refused and "scaled by 0.7" in screen.admit(refused[0], best)
    roof = next(s for s in screen.stages(1, best) if s["stage"] == "roofline")
    assert roof["bound_scale"] == pytest.approx(0.7)
    screen.observe(first, 10 * best)  # a slower time never loosens it again
    assert screen.scale == pytest.approx(0.7)
