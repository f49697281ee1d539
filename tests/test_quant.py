"""Weight formats: quantise/dequantise round trips within their bounds, packing, the cache, the accuracy budget."""
import numpy as np
import pytest

from planforge.quant import (DEFAULT, FORMATS, INT4_BLOCKS, Accuracy, AccuracyError, QuantError, bytes_per_weight,
                             cosine, dequantise, error_bound, max_rel_err, pack, packed, parse_budget, quantise)
from planforge.quant.formats import from_bf16, to_bf16
from planforge.quant.pack import cache_info
from planforge.search import NoValidFinalist, Ranked, walk_finalists
from planforge.space import Space, categorical
from planforge.validate import AccuracyBudget


def _weights(K=203, N=37, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((K, N)).astype(np.float32)
    W[:, 3] = 0.0  # an all-zero channel: scale 0, must not divide by zero
    W[5, 7] = 40.0  # an outlier: its channel's (block's) step is large
    return W


@pytest.mark.parametrize("fmt,block", [("fp32", None), ("bf16", None), ("int8", None)] +
                         [("int4", b) for b in INT4_BLOCKS])
def test_round_trip_within_the_theoretical_bound(fmt, block):
    W = _weights()
    q = quantise(W, fmt, block)
    err = np.abs(dequantise(q) - W.astype(np.float64))
    bound = error_bound(W, q)
    assert np.all(err <= bound * (1 + 1e-6) + 1e-30)
    if fmt != "fp32":  # the bound is tight: rounding to nearest reaches a good part of half a step
        assert (err[bound > 0] / bound[bound > 0]).max() > 0.9
    assert np.all(dequantise(q)[:, 3] == 0)


def test_bound_is_half_a_step():
    W = _weights()
    q8 = quantise(W, "int8")
    assert np.allclose(error_bound(W, q8)[0], np.abs(W).max(axis=0) / 127 / 2)
    q4 = quantise(W, "int4", 32)
    assert q4.q.min() >= -7 and q4.q.max() <= 7 and q4.scales.shape == (-(-203 // 32), 37)
    assert np.allclose(error_bound(W, quantise(W, "bf16")), np.abs(W) * 2.0 ** -8)


@pytest.mark.parametrize("shift", [0.0, 3.0, -3.0])
def test_dynamic_activations_are_asymmetric_with_zero_exact(shift):
    from planforge.quant import quantise_activations

    rng = np.random.default_rng(1)
    x = (rng.standard_normal(301) + shift).astype(np.float32)
    x[17] = 0.0
    q, s = quantise_activations(x)
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    assert np.isclose(s, (hi - lo) / 255, rtol=1e-6)
    err = np.abs(q.astype(np.float64) * s - x)
    assert err.max() <= s / 2 * (1 + 1e-4) and q[17] == 0  # half a step; zero exact
    assert q.max() - q.min() <= 255 and q.max() - q.min() >= 254  # the range spans the 256 codes
    # a one-sided input (a ReLU's or SwiGLU's output) gets about twice the resolution of a symmetric 127-step scale
    if shift:
        assert s < np.abs(x).max() / 127 * 0.6
    zq, zs = quantise_activations(np.zeros(8, np.float32))
    assert not zq.any() and zs == 1


def test_bf16_rounds_to_nearest_even():
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, 3.0e38], np.float32)
    back = from_bf16(to_bf16(x))
    assert back[0] == 1.0 and back[1] == 1.0  # a tie goes to the even mantissa
    assert back[2] == np.float32(1.0 + 4 * 2 ** -8)
    assert back[3] == -2.5 and np.isfinite(back[4])


def test_bad_formats_and_weights_are_clear_errors():
    W = _weights()
    with pytest.raises(QuantError, match="unknown weight format 'int2'"):
        quantise(W, "int2")
    with pytest.raises(QuantError, match="block size must be one of 32, 64, 128"):
        quantise(W, "int4", 48)
    with pytest.raises(QuantError, match="non-finite"):
        quantise(np.full((4, 4), np.nan, np.float32), "int8")
    with pytest.raises(QuantError, match="2-D"):
        quantise(np.zeros(8, np.float32), "int8")


def test_bytes_per_weight():
    assert [bytes_per_weight(f, 4096, 32) for f in FORMATS] == [4.0, 2.0, 1.0 + 4 / 4096, 0.5 + 4 / 32]


@pytest.mark.parametrize("fmt,block", [("bf16", None), ("int8", None), ("int4", 32), ("int4", 64)])
def test_pack_holds_every_value_in_its_panel(fmt, block):
    W = _weights(K=101, N=21)
    q = quantise(W, fmt, block)
    p = pack(q, 8)
    assert p.panels == 3 and p.w.shape[0] == 3
    if fmt == "int4":  # unpack both nibbles, sign-extend, compare with the values
        b = p.w.astype(np.int16)
        lo, hi = ((b & 0xF) ^ 8) - 8, ((b >> 4) ^ 8) - 8
        rows = np.empty((3, p.k_padded, 8), np.int16)
        rows[:, 0::2], rows[:, 1::2] = lo, hi
        vals = rows.transpose(1, 0, 2).reshape(p.k_padded, 24)
        assert np.array_equal(vals[:101, :21], q.q) and not vals[101:].any() and not vals[:, 21:].any()
        assert p.scales.shape == (3, p.k_padded // block, 8)
    else:
        vals = p.w.transpose(1, 0, 2).reshape(101, 24)
        assert np.array_equal(vals[:, :21], q.q) and not vals[:, 21:].any()


def test_packed_is_cached_by_content():
    W = _weights(K=64, N=16, seed=3)
    a = packed(W, "int8", 8)
    assert packed(W.copy(), "int8", 8) is a  # the same weights in another array: a hit
    assert packed(W, "int8", 8) is a  # (its digest taken once per array)
    assert packed(W, "int8", 16) is not a  # another layout
    W2 = W.copy()
    W2[0, 0] += 1.0
    assert packed(W2, "int8", 8) is not a  # weights changed: packed anew
    assert cache_info()["entries"] >= 3


def test_metrics():
    ref = np.array([1.0, -2.0, 4.0])
    assert max_rel_err(ref + [0, 0, 0.04], ref) == pytest.approx(0.01)
    assert cosine(ref, ref) == pytest.approx(1.0) and cosine(-ref, ref) == pytest.approx(-1.0)
    assert max_rel_err(np.zeros(3), np.zeros(3)) == 0.0


def test_budget_parsing_and_errors():
    assert parse_budget("") == parse_budget(None) and not parse_budget("").stated
    b = parse_budget("max_rel_err:0.01;gemv_4096x4096_none=cosine:0.9999")
    assert b.default == Accuracy("max_rel_err", 0.01) and b.of("gemv_4096x4096_none") == Accuracy("cosine", 0.9999)
    assert b.of("other") == b.default and b.stated
    assert b.to_json()["tasks"]["gemv_4096x4096_none"] == {"metric": "cosine", "bound": 0.9999}
    for text, msg in [("rmse:0.1", "unknown accuracy metric 'rmse'"), ("max_rel_err", "expected METRIC:BOUND"),
                      ("cosine:abc", "is not a number"), ("cosine:2", "out of range"), ("=cosine:0.9", "task name")]:
        with pytest.raises(AccuracyError, match=msg):
            parse_budget(text)


def test_budget_says_by_how_much():
    assert "exceeds the budget 0.01 by 0.02, 3x the bound" in Accuracy("max_rel_err", 0.01).excess(0.03)
    assert Accuracy("max_rel_err", 0.01).excess(0.01) is None
    assert "below the budget 0.999 by 0.009" in Accuracy("cosine", 0.999).excess(0.99)
    assert DEFAULT.excess(1.0) is None and not DEFAULT.allows_quantisation


_SPACE = Space([categorical("vec", (8,)), categorical("jb", (2,)), categorical("wfmt", FORMATS),
                 categorical("qblock", INT4_BLOCKS)])


def _cand(**k):
    return _SPACE.make({"vec": 8, "jb": 2, "wfmt": "fp32", "qblock": 32, **k})


def test_walk_rejects_a_plan_over_budget_and_states_its_error():
    int4, int8, fp32 = _cand(wfmt="int4", qblock=32), _cand(wfmt="int8", qblock=32), _cand(wfmt="fp32", qblock=32)
    errors = {int4.fingerprint: 0.08, int8.fingerprint: 0.004, fp32.fingerprint: 1e-7}
    ref = np.ones(4)
    check = AccuracyBudget(Accuracy("max_rel_err", 0.01), lambda c: (ref * (1 + errors[c.fingerprint]), ref))
    r = Ranked(4)
    for t, c in ((1.0, int4), (2.0, int8), (3.0, fp32)):
        r.insert(t, c)
    walk = walk_finalists(r, [check])
    assert walk.accepted.candidate == int8 and len(walk.rejected) == 1
    why = walk.rejected[0].reasons[0]
    assert why.startswith("accuracy: int4 weights: max_rel_err 0.08 exceeds the budget 0.01 by 0.07, 8x the bound")
    rec = check.record(int8)
    assert rec["format"] == "int8" and rec["error"]["value"] == pytest.approx(0.004)
    assert rec["tiles"] == {"vec": 8, "jb": 2} and rec["block"] is None and rec["budget"] == {"metric": "max_rel_err", "bound": 0.01}


def test_default_budget_rejects_every_quantised_plan_without_running_it():
    ran = []
    check = AccuracyBudget(DEFAULT, lambda c: ran.append(c) or (np.ones(2), np.ones(2)))
    for fmt in ("bf16", "int8", "int4"):
        assert "no accuracy budget was stated" in check(_cand(wfmt=fmt, qblock=32))
    assert check(_cand(wfmt="fp32")) is None and not ran


def test_when_every_finalist_is_over_budget_the_walk_goes_on_to_the_next_measured_plans():
    from types import SimpleNamespace

    from planforge.outcome import Outcome
    from planforge.tuning import _walk_further

    cands = [_cand(wfmt=f, qblock=b) for f, b in (("int4", 32), ("int4", 64), ("int4", 128), ("int8", 32))]
    fp32 = _cand(wfmt="bf16", qblock=32)  # a plan within the budget, measured slower than the four over it
    errors = {c.fingerprint: 0.08 for c in cands} | {fp32.fingerprint: 0.002}
    ref = np.ones(4)
    check = AccuracyBudget(Accuracy("max_rel_err", 0.01), lambda c: (ref * (1 + errors[c.fingerprint]), ref))
    times = [1.0, 1.1, 1.2, 1.3, 5.0]
    trials = [SimpleNamespace(candidate=c, outcome=Outcome("measured", None, (t,))) for c, t in zip([*cands, fp32], times)]
    r = Ranked(2)
    for x in trials[:2]:
        r.insert(x.outcome.metric, x.candidate, x.outcome)
    task = SimpleNamespace(validators=[check], peak_bytes=None, backend=None)
    with pytest.raises(NoValidFinalist) as first:
        walk_finalists(r, [check])
    walk, err = _walk_further(task, SimpleNamespace(trials=trials), r, first.value, 2, here=False)
    assert err is None and walk.accepted.candidate == fp32
    assert walk.accepted.rank == 5 and [f.rank for f in walk.rejected] == [1, 2, 3, 4]
    assert all("exceeds the budget" in f.reasons[0] for f in walk.rejected)
    # nothing valid among the measured plans: the error names every plan walked
    errors[fp32.fingerprint] = 0.5
    task.validators = [AccuracyBudget(Accuracy("max_rel_err", 0.01), check.output)]  # (the check caches errors)
    walk, err = _walk_further(task, SimpleNamespace(trials=trials), r, first.value, 2, here=False)
    assert walk is None and len(err.rejected) == 5
