"""Warm starts from other devices' and shapes' tunings (issue 20), on a small synthetic family of its own.

The family: one kernel (knobs a, b, c) measured on two "devices". Their times
differ in scale (the source is 3x slower) and in where the optimum lies (the
source's best a is 10, the target's 11), as real devices do; a few
configurations fail on the source only, and the source holds a value (a = 17)
that the target space does not have.
"""
import json
import math

import pytest

from planforge.outcome import Outcome
from planforge.search import Budget, make_strategy, search
from planforge.search.warm import EARLY, Source, WarmError, WarmStart, Warmed, kendall_weight
from planforge.space import Space, categorical, int_range, pow2
from planforge.targets.replay.replay import load_replay
from planforge.warmstart import load_sources, recording_source, shape_distance

A, B, C = range(1, 17), (1, 2, 4, 8, 16, 32, 64), ("x", "y", "z", "w")
CT = {"x": 0.0, "y": 0.15, "z": 0.4, "w": 0.9}


def t_ms(a, b, c, best_a=11, scale=1.0):
    return scale * (1.0 + (a - best_a) ** 2 / 20 + (math.log2(b) - 4) ** 2 / 4 + CT[c] + 0.01 * ((a * 7 + b) % 5))


def kt_doc(device, best_a, scale, extra_a=(), failed=()):
    cache = {}
    for a in (*A, *extra_a):
        for b in B:
            for c in C:
                rec = {"a": a, "b": b, "c": c}
                if (a, b, c) in failed:
                    rec.update(time="RuntimeFailedConfig", times=[])
                else:
                    t = t_ms(a, b, c, best_a, scale)
                    rec.update(time=t, times=[t, t, t])
                cache[f"{a},{b},{c}"] = rec
    return {"device_name": device, "kernel_name": "synth", "problem_size": [1], "tune_params_keys": ["a", "b", "c"],
            "tune_params": {"a": [*A, *extra_a], "b": list(B), "c": list(C)}, "objective": "time", "cache": cache}


@pytest.fixture
def family(tmp_path):
    src = tmp_path / "source.json"
    src.write_text(json.dumps(kt_doc("Source GPU", 10, 3.0, extra_a=(17,), failed={(10, 16, "x"), (3, 1, "w")})))
    tgt = tmp_path / "target.json"
    tgt.write_text(json.dumps(kt_doc("Target GPU", 11, 1.0)))
    return load_replay(src, False), load_replay(tgt, False), src, tgt


def evals_to_5pct(rep, strat, budget=200):
    res = search(rep.space, strat, rep.backend, Budget(evals=budget), keep=1, target=rep.optimum * 1.05)
    vals = [t.outcome.metric for t in res.trials if t.n > 0]
    fps = [t.candidate.fingerprint for t in res.trials if t.n > 0]
    assert len(fps) == len(set(fps))  # never measured twice
    return next((i for i, v in enumerate(vals, 1) if v is not None and v <= rep.optimum * 1.05), budget + 1)


def test_warm_start_maps_sources_onto_the_space(family):
    source, target, *_ = family
    ws = WarmStart(target.space, [recording_source(source.recording)])
    [m] = ws.mapped
    assert len(m.ints) == len(A) * len(B) * len(C)  # a = 17 is not a value of the target: dropped
    seeds = ws.seeds()
    assert len(seeds) == EARLY and all(target.space.is_valid(c) for c in seeds)
    best = min((t_ms(a, b, c, 10, 3.0), (a, b, c)) for a in A for b in B for c in C
               if (a, b, c) not in {(10, 16, "x"), (3, 1, "w")})[1]
    assert tuple(seeds[0].as_dict().values()) == best != (10, 16, "x")  # the source's best that did not fail
    # failures rank last; the mean-rank cost model orders the source's best first
    fail = target.space.make({"a": 10, "b": 16, "c": "x"})
    assert ws.predict([fail]) == [1.0] and ws.predict(seeds[:1]) == [0.0]


def test_unusable_sources_are_clear_errors(family):
    _, target, *_ = family
    other = Source("other", [({"p": 1, "q": 2}, 1.0)])
    with pytest.raises(WarmError, match="its knobs .p, q. are not this space's"):
        WarmStart(target.space, [other])
    outside = Source("outside", [({"a": 17, "b": 1, "c": "x"}, 1.0)])
    with pytest.raises(WarmError, match="none of its configurations is a valid point"):
        WarmStart(target.space, [outside])


def test_sources_are_interleaved_by_rank():
    s = Space([int_range("a", 0, 9)])
    one = Source("one", [({"a": a}, float(a)) for a in range(10)])
    two = Source("two", [({"a": a}, float(10 - a)) for a in range(10)])
    assert WarmStart(s, [one, two]).order()[:4] == [0, 9, 1, 8]


def test_warmed_proposes_early_points_first_and_never_twice(family):
    source, target, *_ = family
    ws = WarmStart(target.space, [recording_source(source.recording)], early=5)
    strat = make_strategy("genetic", target.space, 0, warm=ws)
    assert isinstance(strat, Warmed)
    first = strat.ask(5)
    assert [c.fingerprint for c in first] == [c.fingerprint for c in ws.seeds()]
    strat.tell([(c, target.backend.measure([c])[0]) for c in first])
    later = [c.fingerprint for c in strat.ask(20)]
    assert not set(later) & {c.fingerprint for c in first} and len(set(later)) == len(later)
    assert strat.describe()["warm_start"]["early"] == 5


def test_a_cost_model_of_the_target_orders_the_sources_best_before_they_are_proposed():
    """With a screen (a CPU task's analytic model at the target's shape), the early proposals are the ones it
    predicts fastest among SCREEN_POOL times as many of the sources' best; without one, the sources' order."""
    from planforge.search.strategies import RandomSearch
    from planforge.search.warm import SCREEN_POOL, warmed

    s = Space([int_range("a", 0, 39)])
    src = Source("src", [({"a": a}, float(a)) for a in range(40)])  # the source likes small a
    ws = WarmStart(s, [src])

    class Shape:  # this shape likes a near 6
        def predict(self, cands):
            return [abs(c["a"] - 6) for c in cands]

    plain = warmed(RandomSearch(s, 0), ws, 3)
    assert [c["a"] for c in plain.ask(3)] == [0, 1, 2]
    screened = warmed(RandomSearch(s, 0), ws, 3, screen=Shape())
    assert [c["a"] for c in screened.ask(3)] == [6, 5, 7]  # among the source's best 3 * SCREEN_POOL = 12
    far = warmed(RandomSearch(s, 0), ws, 3, screen=type("Far", (), {"predict": lambda self, cs: [-c["a"] for c in cs]})())
    assert [c["a"] for c in far.ask(3)] == [3 * SCREEN_POOL - 1, 3 * SCREEN_POOL - 2, 3 * SCREEN_POOL - 3]
    assert screened.describe()["warm_start"]["early_screened"] and not plain.describe()["warm_start"]["early_screened"]


@pytest.mark.parametrize("name", ["auto", "thompson", "genetic", "tpe"])
def test_warm_needs_fewer_evaluations_than_cold(family, name):
    source, target, *_ = family
    ws = WarmStart(target.space, [recording_source(source.recording)])
    cold = sorted(evals_to_5pct(target, make_strategy(name, target.space, s, budget=200)) for s in range(3))
    warm = sorted(evals_to_5pct(target, make_strategy(name, target.space, s, budget=200, warm=ws)) for s in range(3))
    assert warm[1] <= 3 and 4 * warm[1] <= cold[1], (cold, warm)  # the source's best is next to the target's


def test_thompson_prior_alone_points_at_the_source_best(family):
    """No early proposals: the prior itself makes the model's first choices good ones."""
    source, target, *_ = family
    ws = WarmStart(target.space, [recording_source(source.recording)], early=0)
    strat = make_strategy("thompson", target.space, 0, warm=ws, exploration=0.0)
    assert strat.taken == len(ws.rows()) and strat.inner.n_init == 0
    first = strat.ask(1)[0]
    assert target.backend.measure([first])[0].metric <= 1.3 * target.optimum


def test_thompson_prior_weight_decays_and_follows_agreement():
    s = Space([int_range("a", 0, 19), pow2("b", 1, 8)])
    t = make_strategy("thompson", s, 0, warm_weight=0.1, warm_halflife=10)
    agree = [("agree", {"a": a, "b": b}, 1.0 + a + b) for a in range(20) for b in (1, 2, 4, 8)]
    disagree = [("disagree", {"a": a, "b": b}, 100.0 - a - b) for a in range(20) for b in (1, 2, 4, 8)]
    assert t.warm_start(agree) == 0  # this device's history is not a prior
    assert t.take_prior(agree + disagree) == 160
    assert t._warm_weights() == [pytest.approx(0.1), pytest.approx(0.1)]  # nothing measured: both count
    for a, b in [(0, 1), (5, 2), (9, 4), (13, 8), (19, 1), (3, 8)]:
        c = s.make({"a": a, "b": b})
        t.tell([(c, Outcome.measured([1.0 + a + b]))])
    w_agree, w_dis = t._warm_weights()
    assert w_dis == 0.0 and 0 < w_agree < 0.1 * 10 / 16 + 1e-12  # decayed, and the disagreeing source dropped


def test_kendall_weight_needs_common_points():
    assert kendall_weight({1: 1.0, 2: 2.0}, {1: 1.0, 2: 2.0}) is None
    src = {i: float(i) for i in range(10)}
    assert kendall_weight(src, {i: float(i) for i in range(10)}) == pytest.approx(1.0)
    assert kendall_weight(src, {i: -float(i) for i in range(10)}) == 0.0


def test_tpe_learns_results_it_did_not_propose(family):
    source, target, *_ = family
    ws = WarmStart(target.space, [recording_source(source.recording)], early=4)
    strat = make_strategy("tpe", target.space, 0, warm=ws)
    first = strat.ask(4)
    strat.tell([(c, target.backend.measure([c])[0]) for c in first])
    assert len(strat.inner.study.trials) == 4


def test_load_sources_reads_files_and_refuses_bad_ones(family, tmp_path):
    source, target, src, tgt = family
    [s] = load_sources([src])
    assert s.note == "recorded on Source GPU" and len(s.rows) == len(A) * len(B) * len(C) + len(B) * len(C)
    with pytest.raises(WarmError, match="no such file"):
        load_sources([tmp_path / "nope.json"])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(WarmError, match="bad.json"):
        load_sources([bad])


def test_shape_distance():
    assert shape_distance("gemm_256x1024x1024_bias", "gemm_256x1024x2048_bias") == 1.0
    assert shape_distance("gemm_256x1024x1024", "gemm_128x1024x1024") == 1.0
    assert shape_distance("gemm_256x1024x1024", "gemv_1024x1024") == math.inf


def test_replay_cli_warm_start(cli, family):
    source, target, src, tgt = family
    r = cli("replay", tgt, "--no-t1", "--warm-start", src, "--warm-start", tgt, "--seeds", "3", "--budget", "150",
            "--strategy", "genetic", "--json", check=True)
    spaces = json.loads(r.stdout)["spaces"]
    d = spaces[target.label]
    assert 4 * d["warm:genetic"]["median_evals_to_5pct"] <= d["genetic"]["median_evals_to_5pct"]
    r = cli("replay", tgt, "--no-t1", "--warm-start", tgt.parent / "missing.json", "--seeds", "1")
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


def test_tune_warm_start_from_records_and_auto(cli, tmp_path):
    """A records database as --warm-start, and auto finding the task under another device by itself."""
    from planforge.spec import Records
    from planforge.workloads import load_workload

    task = load_workload("drill", {}).tasks[0]
    db_path = tmp_path / "other.db"
    with Records(db_path) as db:
        run, _ = db.start_run("drill", "k", {})
        for i, c in enumerate(task.space.enumerate()):
            o = task.backend.measure([c])[0]
            db.add(run, "k", task.key, "table:another-device", c.fingerprint, c.as_dict(), o, i + 1)
        db.end_run(run)
    r = cli("tune", "-w", "drill", "--budget", "6", "--strategy", "genetic", "--warm-start", db_path,
            "--out", tmp_path / "a", "--json", check=True)
    strat = json.loads((tmp_path / "a" / "spec.json").read_text())["tasks"][task.key]["search"]["strategy"]
    assert strat["warm_start"]["sources"] == {f"{task.key} on table:another-device": 24}
    r = cli("tune", "-w", "drill", "--budget", "6", "--records", db_path, "--out", tmp_path / "b", check=True)
    assert "warm-started from 24 configurations of 1 earlier tuning" in r.stdout
    r = cli("tune", "-w", "drill", "--budget", "6", "--out", tmp_path / "c", check=True)  # nothing to warm from
    assert "warm-started" not in r.stdout


def test_blocks_beyond_the_target_extent_clip_to_its_largest():
    """Another shape's block that exceeds this shape's extent (mc = 256 where the knob stops at 128) is proposed as
    its twin that fits, deduplicated with what the source measured itself; recorded spaces of other tools are not
    clipped, nor values below a knob's range or of a categorical knob."""
    space = Space([pow2("mc", 8, 128), pow2("nc", 64, 1024), categorical("order", ("ij", "ji"))])
    rows = [({"mc": 256, "nc": 512, "order": "ji"}, 1.0),   # the source's best: mc beyond this space
            ({"mc": 128, "nc": 512, "order": "ji"}, 3.0),   # its twin, measured, slower: one point, best kept
            ({"mc": 256, "nc": 1024, "order": "ij"}, 2.0),
            ({"mc": 4, "nc": 512, "order": "ji"}, 0.5),     # below the range: not a block that exceeds it
            ({"mc": 64, "nc": 512, "order": "kk"}, 0.1),    # a value of no categorical knob: left out
            ({"mc": 64, "nc": 256, "order": "ij"}, 4.0)]
    clipped = WarmStart(space, [Source("other shape", rows, clip=True)], early=3)
    first = [c.as_dict() for c in clipped.seeds()]
    assert first == [{"mc": 128, "nc": 512, "order": "ji"}, {"mc": 128, "nc": 1024, "order": "ij"},
                     {"mc": 64, "nc": 256, "order": "ij"}]
    [m] = clipped.mapped
    assert len(m.ints) == 3 and sorted(x for x in m.metrics) == [1.0, 2.0, 4.0]
    plain = WarmStart(space, [Source("recorded", rows)], early=3)
    assert [c.as_dict() for c in plain.seeds()] == [{"mc": 128, "nc": 512, "order": "ji"},
                                                     {"mc": 64, "nc": 256, "order": "ij"}]
    assert plain.mapped[0].metrics == [3.0, 4.0]


def test_records_sources_clip(tmp_path):
    from planforge.spec.records import Records
    from planforge.warmstart import records_sources

    with Records(tmp_path / "r.db") as db:
        db.add("run", "wl", "gemm_256x64x64_none", "dev", "f0", {"mc": 256, "nc": 64}, Outcome("measured", None, (1.0,)), 1)
        [s] = records_sources(db, ["mc", "nc"])
    assert s.clip
    space = Space([pow2("mc", 8, 128), pow2("nc", 64, 64)])
    assert [c.as_dict() for c in WarmStart(space, [s]).seeds()] == [{"mc": 128, "nc": 64}]


def test_blocks_that_break_the_target_extent_rule_are_lowered_to_fit():
    """The CPU GEMM space keeps every block value and bounds it by a rule of the shape (``mc < 2 * m``): another
    shape's best, mc = 256 at M = 128, is proposed as mc = 128 with its other knobs kept; a configuration that no
    lowering repairs is left out."""
    space = Space([pow2("mc", 8, 512), pow2("kc", 32, 256), categorical("par", ("n", "m"))],
                  restrictions=["mc < 2 * m or mc == 8", "mc * kc <= 16384", "par == 'n' or m >= 64"],
                  constants={"m": 128})
    rows = [({"mc": 256, "kc": 64, "par": "n"}, 1.0),    # mc too large for M = 128: lowered to 128 (kc kept)
            ({"mc": 512, "kc": 256, "par": "n"}, 2.0),   # both broken: mc to 128 (fewest steps), then to 64
            ({"mc": 32, "kc": 32, "par": "m"}, 3.0)]
    ws = WarmStart(space, [Source("other shape", rows, clip=True)], early=3)
    assert [c.as_dict() for c in ws.seeds()] == [{"mc": 128, "kc": 64, "par": "n"}, {"mc": 64, "kc": 256, "par": "n"},
                                                 {"mc": 32, "kc": 32, "par": "m"}]
    assert [c.as_dict() for c in WarmStart(space, [Source("plain", rows)], early=3).seeds()] == [
        {"mc": 32, "kc": 32, "par": "m"}]
    # models take only what the source ran as it is: a twin's time was measured at another block
    assert ws.rows() == [("other shape", {"mc": 32, "kc": 32, "par": "m"}, 3.0)]
    assert list(ws.rows().points["other shape"].values()) == [3.0]
    small = Space(list(space.knobs), restrictions=list(space.restrictions), constants={"m": 16})
    # at M = 16 no block lowering makes par = 'm' valid: that row is left out, the others fit at mc = 16
    assert [c.as_dict() for c in WarmStart(small, [Source("other shape", rows, clip=True)]).seeds()] == [
        {"mc": 16, "kc": 64, "par": "n"}, {"mc": 16, "kc": 256, "par": "n"}]
