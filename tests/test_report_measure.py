"""Measurements that survive a busy machine: the load during each timing, and slow outliers measured twice."""
import warnings

import pytest

from planforge.measure.load import LoadMeter, busy_total, other_share
from planforge.measure.timing import TimingConfig, timed
from planforge.outcome import Outcome
from planforge.search import Budget
from planforge.search.loop import search
from planforge.search.recheck import Rechecks, merged
from planforge.search.registry import make_strategy
from planforge.space import Knob, Space


def _stat(path, *cpus):
    lines = ["cpu  1 2 3 4 5 6 7 8"] + [f"cpu{i} " + " ".join(map(str, v)) for i, v in enumerate(cpus)]
    path.write_text("\n".join(lines) + "\nintr 1 2\n")
    return path


def test_busy_total_sums_only_the_cpus_asked_for(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(os, "sysconf", lambda name: 100)
    p = _stat(tmp_path / "s", (100, 0, 50, 800, 50, 0, 0, 0), (1000, 0, 0, 0, 0, 0, 0, 0))
    assert busy_total([0], p) == pytest.approx((1.5, 10.0))
    assert busy_total([0, 1], p) == pytest.approx((11.5, 20.0))
    assert busy_total([7], p) is None and busy_total([0], tmp_path / "missing") is None


def test_other_share_subtracts_own_time():
    assert other_share((1.0, 10.0), (3.0, 12.0), 0.5) == pytest.approx(0.75)
    assert other_share((1.0, 10.0), (3.0, 12.0), 5.0) == 0.0  # own time over-counted: clipped, not negative
    assert other_share((1.0, 10.0), (1.0, 10.0), 0.0) is None  # counters did not move
    assert other_share(None, (1.0, 2.0), 0.0) is None


def test_load_meter_sees_another_process_on_its_cpu(tmp_path, monkeypatch):
    """A fake /proc/stat whose CPU went from idle to fully busy while this process used no CPU: load 1."""
    import os

    monkeypatch.setattr(os, "sysconf", lambda name: 100)
    monkeypatch.setattr("planforge.measure.load.own_cpus", lambda: (0,))
    p = _stat(tmp_path / "s", (0, 0, 0, 100, 0, 0, 0, 0))
    with LoadMeter(p) as m:
        _stat(p, (100, 0, 0, 100, 0, 0, 0, 0))
    assert m.share == pytest.approx(1.0, abs=0.02)


def test_timed_returns_times_and_the_load():
    got = timed(lambda: sum(range(100)), TimingConfig(warmup_s=0.001, budget_s=0.02, min_repeats=3))
    assert len(got["times"]) >= 3 and (got["other_load"] is None or 0 <= got["other_load"] <= 1)


class _Busy:
    """Candidate x takes (1 + x) * 10 us; the slow ones are slow only on their first measurement when
    ``transient``, else always; every outcome carries a load figure as the CPU runner's do (or none: a table)."""

    name, fingerprint, pin_cores = "fake", "fp", False

    def __init__(self, slow=(3,), transient=True, clock=True):
        self.calls, self.slow, self.transient, self.clock = {}, set(slow), transient, clock

    def measure(self, cands):
        out = []
        for c in cands:
            x = c.as_dict()["x"]
            n = self.calls[x] = self.calls.get(x, 0) + 1
            t = 1e-3 if x in self.slow and (n == 1 or not self.transient) else 1e-5 * (1 + x)
            out.append(Outcome.measured([t] * 5, **({"other_load": 0.6 if t > 1e-4 else 0.0} if self.clock else {})))
        return out


SPACE = Space([Knob("x", tuple(range(8)), "categorical")])


def _run(backend):
    return search(SPACE, make_strategy("exhaustive", SPACE, 0), backend, Budget(evals=8))


def test_a_slow_outlier_is_measured_again_later_and_both_results_are_kept():
    b = _Busy()
    r = _run(b)
    assert b.calls[3] == 2 and all(b.calls[x] == 1 for x in b.calls if x != 3)
    assert r.evaluations == 8 and [t.n for t in r.trials] == list(range(1, 9))  # the second look is no evaluation
    t3 = next(t for t in r.trials if t.candidate.as_dict()["x"] == 3)
    order = [t.candidate.as_dict()["x"] for t in r.trials]
    assert order.index(3) > 3  # settled later: two other candidates were measured before its second look
    rc = t3.outcome.extra["recheck"]
    assert rc["kept"] == "second" and rc["first"]["median_s"] == pytest.approx(1e-3)
    assert rc["first"]["other_load"] == 0.6 and t3.outcome.metric == pytest.approx(4e-5)


def test_a_really_slow_candidate_stays_slow_and_a_table_is_not_measured_twice():
    b = _Busy(transient=False)
    t3 = next(t for t in _run(b).trials if t.candidate.as_dict()["x"] == 3)
    assert b.calls[3] == 2 and t3.outcome.metric == pytest.approx(1e-3) and t3.outcome.extra["recheck"]["kept"] == "first"
    table = _Busy(clock=False)
    _run(table)
    assert table.calls[3] == 1


def test_merged_keeps_the_first_when_the_second_failed():
    first = Outcome.measured([2e-3] * 4, other_load=0.5)
    m = merged(first, Outcome.invalid("timeout", "no result"))
    assert m.metric == pytest.approx(2e-3) and m.extra["recheck"]["second"]["status"] == "timeout"
    r = Rechecks()
    assert not r.suspect(first, None) and r.suspect(first, 1e-4) and not r.suspect(first, 1e-3)
    quiet = Outcome.measured([2e-3] * 4, other_load=0.02)  # slow on a quiet machine: slow, trusted as it is
    unknown = Outcome.measured([2e-3] * 4, other_load=None)
    assert not r.suspect(quiet, 1e-4) and r.suspect(unknown, 1e-4)


def test_probe_marks_the_figures_another_process_contended(monkeypatch):
    """Every run of each figure "contended" (the probe's own check): the profile lists them, they survive the
    JSON round trip, the report's summary warns about them; a profile stored before the field loads with none."""
    import dataclasses

    from planforge.report.verdict import task_summary
    from planforge.targets.cpu import probe as pr

    # every figure's runs "contended" (no kernel run needed: measure() only reads the verdict); builds cached
    monkeypatch.setattr(pr, "_best_rate", lambda run, effort, n=None: (1e9, n or 1000, False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # this machine's own load, whatever it is now
        p = pr.measure(quick=True)
    assert p.busy_figures and all(" on " in f for f in p.busy_figures)
    assert any(f.startswith("peak") for f in p.busy_figures)
    assert pr.DeviceProfile.from_json(p.to_json()) == p
    old = {k: v for k, v in p.to_dict().items() if k != "busy_figures"}
    assert pr.DeviceProfile.from_dict(old) == dataclasses.replace(p, busy_figures=[])
    task = {"trials": [], "evaluations": 0, "duplicates": 0, "counts": {}, "accepted": None, "error": "none",
            "ranked": [], "baselines": {}}
    s = task_summary("t", task, p.to_dict())
    assert s["plan"].startswith("no plan passed validation")
    assert any(p.busy_figures[0] in w for w in s["warnings"])


@pytest.mark.parametrize("slots", [2, 3])
def test_outliers_are_measured_again_on_a_wider_executor_in_submission_order(slots):
    from planforge.measure.executor import InlineExecutor
    from planforge.search.loop import search_async

    b = _Busy(slow=(3, 6))
    r = search_async(SPACE, make_strategy("exhaustive", SPACE, 0), InlineExecutor(b, slots), Budget(evals=8),
                     ordered=True)
    assert r.evaluations == 8 and sorted(t.n for t in r.trials) == list(range(1, 9))
    assert b.calls[3] == b.calls[6] == 2 and sum(b.calls.values()) == 10
    twice = {t.candidate.as_dict()["x"]: t.outcome for t in r.trials if "recheck" in t.outcome.extra}
    assert set(twice) == {3, 6} and all(o.metric < 1e-4 for o in twice.values())
    assert [e.candidate.as_dict()["x"] for e in r.ranked][:2] == [0, 1]
