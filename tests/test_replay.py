"""Replay backend and the Kernel Tuner / T4 / T1 readers, on small synthetic recordings."""
import gzip
import json
import math

import pytest
import replay_data as data

from planforge.targets.replay.formats import FormatError, read_recording, read_t1
from planforge.targets.replay.replay import load_replay
from planforge.search import STRATEGIES, Budget, make_strategy, search
from planforge.search.benchmark import replay_run


@pytest.fixture
def files(tmp_path):
    return data.hub(tmp_path)


def test_kernel_tuner_cache_replays_exact_known_results(files):
    r = load_replay(files["kt"])
    assert r.recording.format == "kernel_tuner" and r.recording.t1 == files["t1"]
    assert r.space.size == 24 and len(r.space.valid_ints()) == 22  # (128, 3, *) excluded
    assert r.counts() == {"measured": 20, "runtime": 1, "compile": 1}
    assert r.optimum == pytest.approx(1.0e-3)
    cands = {tuple(c.as_dict().values()): c for c in r.space.enumerate()}
    outs = dict(zip(cands, r.backend.measure(list(cands.values()))))
    for cfg, t in data.measured().items():
        o = outs[cfg]
        assert o.ok and o.metric == pytest.approx(t * 1e-3)  # the median of the raw times, in seconds
        assert o.times == pytest.approx((0.9e-3 * t, 1e-3 * t, 1.2e-3 * t))
    assert outs[(16, 3, "b")].category == "runtime" and outs[(32, 1, "a")].category == "compile"
    assert r.backend.lookups == 22


def test_t4_and_kernel_tuner_files_of_one_space_agree(files):
    kt, t4 = load_replay(files["kt"]), load_replay(files["t4"])
    assert t4.recording.format == "t4"
    assert kt.optimum == t4.optimum
    assert kt.metrics == t4.metrics
    assert [c.fingerprint for c in kt.space.enumerate()] == [c.fingerprint for c in t4.space.enumerate()]


def test_gzip_is_detected_by_content_and_unclosed_caches_are_read(tmp_path):
    plain = load_replay(data.write(tmp_path / "a.json", data.kt_cache()), t1=None)
    gz = load_replay(data.write(tmp_path / "b.json", data.kt_cache(), gz=True), t1=None)  # gzip without .gz
    cut = load_replay(data.write(tmp_path / "c.json", data.kt_cache(unclosed=True)), t1=None)
    assert plain.metrics == gz.metrics == cut.metrics


def test_absent_configuration_is_rejected_with_the_restriction_it_breaks(files):
    r = load_replay(files["kt"])
    absent = r.space.make({"bx": 128, "ty": 3, "mode": "a"})
    assert not r.space.is_valid(absent)
    assert r.space.violations(absent.as_dict()) == ["bx * ty <= 256"]
    alone = load_replay(files["kt"], t1=None)  # without the T1 file, membership is the only rule
    assert "not among the configurations recorded" in alone.space.violations(absent.as_dict())[0]
    assert alone.space.knobs[0].kind == "pow2" and alone.space.knobs[2].kind == "categorical"


def test_t1_values_are_evaluated_safely(files):
    t1 = read_t1(files["t1"])
    assert [p.values for p in t1.params] == [(16, 32, 64, 128), (1, 2, 3), ("a", "b")]
    assert t1.restrictions == ["bx * ty <= 256"]
    bad = data.write(files["t1"].parent / "bad.json", data.t1().replace("range(4)", "__import__('os')"))
    with pytest.raises(FormatError, match="bad.json: parameter 'bx': cannot read Values"):
        read_t1(bad)


def test_invalid_configurations_are_never_the_optimum(tmp_path):
    # a configuration that failed its correctness check, with runtimes far below everything else
    wrong = {"configuration": {"bx": 16, "ty": 1, "mode": "b"}, "times": {"runtimes": [1e-4, 1e-4, 1e-4]},
             "invalidity": "correctness", "correctness": 0, "measurements": []}
    t4 = json.loads(data.t4())
    t4["results"] = [x for x in t4["results"] if x["configuration"] != wrong["configuration"]] + [wrong]
    r = load_replay(data.write(tmp_path / "t4.json", json.dumps(t4)), t1=None)
    assert r.optimum == pytest.approx(1.0e-3)
    res = search(r.space, make_strategy("exhaustive", r.space), r.backend, Budget(evals=100), keep=30)
    assert res.evaluations == 22 and res.counts["correctness"] == 1
    assert all(e.outcome.ok for e in res.ranked)
    assert res.ranked.best.candidate.as_dict() == {"bx": 64, "ty": 2, "mode": "a"}
    assert res.ranked.best.metric == pytest.approx(1.0e-3)


@pytest.mark.parametrize("name", sorted(set(STRATEGIES) - {"proxy-topk"}))
def test_strategies_replay_reproducibly_and_never_pay_twice(files, name):
    r = load_replay(files["kt"])
    a = replay_run(r, name, seed=3, budget=15, stop_at_optimum=False)
    b = replay_run(load_replay(files["kt"]), name, seed=3, budget=15, stop_at_optimum=False)
    assert a.values == b.values
    assert 1 <= len(a.values) <= 15
    # never a repeated configuration counted as an evaluation, never an absent one measured
    strat = make_strategy(name, r.space, 3)
    res = search(r.space, strat, r.backend, Budget(evals=15))
    fps = [t.candidate.fingerprint for t in res.trials if t.n > 0]
    assert len(fps) == len(set(fps)) == res.evaluations
    assert all(t.outcome.status != "rejected" for t in res.trials)


@pytest.mark.parametrize("name", ["random", "genetic", "annealing", "hillclimb", "mcts", "bandit", "thompson", "tpe"])
def test_strategies_stop_when_the_space_is_exhausted(files, name):
    r = load_replay(files["kt"])
    res = search(r.space, make_strategy(name, r.space, 0), r.backend, Budget(evals=1000))
    assert res.evaluations <= 22
    if name in ("random", "mcts", "thompson", "tpe"):
        assert res.evaluations == 22 and "exhausted" in res.stop_reason


MALFORMED = [
    (b"{", "is not valid JSON (line 1"),
    (b"\x1f\x8b\x08\x00garbage", "is not a valid gzip file"),
    (b"", "is empty"),
    (b"[1, 2]", "is neither a Kernel Tuner cache"),
    (json.dumps({"schema_version": "1.0.0", "results": []}).encode(), "'results' is empty"),
    (data.kt_cache().replace('"RuntimeFailedConfig"', '"Exploded"').encode(), "unknown error 'Exploded'"),
    (data.kt_cache().replace('"mode": "b"', '"mode": "z"').encode(), "mode='z' is not among the declared values"),
    (data.kt_cache().replace('"tune_params_keys": ["bx", "ty", "mode"]', '"tune_params_keys": []').encode(),
     "'tune_params_keys' must be a non-empty list"),
    (data.t4().replace('"invalidity": "correct"', '"invalidity": "fine"', 1).encode(), "'invalidity' is 'fine'"),
    (data.t4().replace('"miliseconds"', '"fortnights"').encode(), "timeunit 'fortnights' is not a known unit"),
    (json.dumps({"schema_version": "1", "results": [{"configuration": {"a": 1}, "invalidity": "correct",
                                                      "times": {}}]}).encode(), "has no runtimes"),
    (data.t1().encode(), "is a T1 input file"),
]


@pytest.mark.parametrize("content,message", MALFORMED)
def test_malformed_files_give_a_clear_error_naming_the_file(tmp_path, content, message):
    p = tmp_path / "rec.json"
    p.write_bytes(content)
    with pytest.raises(FormatError) as e:
        load_replay(p, t1=None)
    assert str(e.value).startswith(f"{p}: ") and message in str(e.value)


def test_no_successful_measurement_is_an_error(tmp_path):
    doc = json.loads(data.kt_cache())
    for rec in doc["cache"].values():
        rec["time"], rec["times"] = "RuntimeFailedConfig", []
    p = data.write(tmp_path / "dead.json", json.dumps(doc))
    with pytest.raises(FormatError, match="no configuration was measured successfully"):
        load_replay(p, t1=None)


def test_missing_file_and_mismatched_t1(tmp_path, files):
    with pytest.raises(FormatError, match="nope.json: no such file"):
        read_recording(tmp_path / "nope.json")
    other = data.write(tmp_path / "other_t1.json", data.t1().replace('"mode"', '"flavour"'))
    with pytest.raises(FormatError, match="differ from those of the T1 file"):
        load_replay(files["kt"], t1=other)


def test_cli_replay_json_and_table(cli, files, tmp_path):
    r = cli("replay", files["kt"], files["t4"], "--strategy", "exhaustive,genetic", "--budget", "30", "--seeds", "3",
            "--json", check=True)
    d = json.loads(r.stdout)
    assert set(d["spaces"]) == {"synth/kt", "synth/t4"}
    for space in d["spaces"].values():
        assert set(space) == {"exhaustive", "genetic", "random"}  # the random baseline is always there
        for s in space.values():
            assert {"median_evals_to_5pct", "p90_evals_to_5pct", "success_rate"} <= set(s)
    # exhaustive goes in product order: (64, 2, "a") is the 15th valid configuration, for every seed
    ex = d["spaces"]["synth/kt"]["exhaustive"]
    assert ex["median_evals_to_5pct"] == ex["p90_evals_to_5pct"] == 15 and ex["success_rate"] == 1.0
    assert len(ex["mean_best_so_far"]) == 30 and ex["mean_best_so_far"][-1] == 1.0
    r = cli("replay", files["kt"], "--strategy", "bandit", "--budget", "10", "--seeds", "2", "--plot", tmp_path / "p",
            check=True)
    assert "synth/kt" in r.stdout and "bandit" in r.stdout and "random" in r.stdout
    assert (tmp_path / "p" / "replay_synth_kt.png").stat().st_size > 1000


def test_cli_replay_bad_input_is_a_clear_error(cli, tmp_path, files):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(b"{ nope"))
    for args, msg in [((bad,), "bad.json.gz: is not valid JSON"),
                      ((files["kt"], "--strategy", "nope"), "unknown strategy 'nope'"),
                      ((files["kt"], "--budget", "0"), "must be at least 1"),
                      ((tmp_path / "missing.json",), "missing.json: no such file")]:
        r = cli("replay", *args)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_curve_of_a_run_that_stops_at_the_optimum_is_exact(files):
    r = load_replay(files["kt"])
    full = replay_run(r, "genetic", 5, 40, stop_at_optimum=False)
    short = replay_run(r, "genetic", 5, 40)
    assert short.values == full.values[: len(short.values)]
    best = min(v for v in short.values if v is not None)
    assert math.isclose(best, r.optimum) or len(short.values) == len(full.values)
