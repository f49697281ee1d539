"""Executors and the asynchronous loop without Ray: back-pressure, out-of-order results, pinning; records merge."""
import os
import sqlite3
import time
from functools import partial

import pytest

from conftest import run_cli
from planforge.backends.table import TableBackend
from planforge.measure.executor import CoreClaim, ExecutorError, LocalExecutor, core_sets, make_executor
from planforge.outcome import Outcome
from planforge.search import Budget, make_strategy, search
from planforge.search.asyncloop import search_async
from planforge.spec import Records
from planforge.spec.records import merge_records
from planforge.tune import tune
from planforge.workloads import load_workload


class SlowFirst(TableBackend):
    """A table whose first-proposed candidate takes ``slow_s`` to measure."""

    slow: str = ""
    slow_s: float = 0.0

    def measure(self, candidates):
        for c in candidates:
            time.sleep(self.slow_s if c.fingerprint == self.slow else self.delay_s)
        return [Outcome.measured([self.table[c.fingerprint]]) for c in candidates]

    def factory(self):
        return partial(_slow_first, dict(self.table), self.slow, self.slow_s, self.delay_s)


def _slow_first(table, slow, slow_s, delay_s, cpus=None):
    be = SlowFirst(table, label="drill", delay_s=delay_s)
    be.slow, be.slow_s = slow, slow_s
    return be


class Counting:
    """Wraps an executor and remembers how many slots were free at each ask."""

    def __init__(self, ex, strategy):
        self.ex, self.strategy, self.asks = ex, strategy, []
        ask = strategy.ask
        strategy.ask = lambda n: (self.asks.append((n, ex.free(), ex.pending())), ask(n))[1]

    def __getattr__(self, name):
        return getattr(self.ex, name)


def test_async_loop_keeps_slots_busy_and_takes_results_in_any_order():
    wl = load_workload("drill")
    task = wl.tasks[0]
    strat = make_strategy("random", task.space, 1)
    first = strat.ask(1)[0]
    strat = make_strategy("random", task.space, 1)
    be = _slow_first(task.backend.table, first.fingerprint, 1.0, 0.05)
    ex = LocalExecutor(be, workers=2, pin=False)
    wrapped = Counting(ex, strat)
    try:
        t0 = time.perf_counter()
        res = search_async(task.space, strat, wrapped, Budget(evals=20))
        took = time.perf_counter() - t0
    finally:
        ex.close()
    order = [t.candidate.fingerprint for t in res.trials]
    assert res.evaluations == 20 and len(set(order)) == 20
    assert order.index(first.fingerprint) > 12  # the slow one finished late; the other slot went on meanwhile
    assert took < 1.5  # not 1 s + 19 x 0.05 s in series: the slow slot held only itself up
    assert all(n <= free for n, free, _ in wrapped.asks)  # never more asked than slots free
    assert all(n + pending <= 2 for n, _, pending in wrapped.asks)


def test_local_pool_gives_the_same_best_as_the_plain_loop(tmp_path):
    got = {}
    for name, ex in (("plain", None), ("pool", {"kind": "local", "workers": 2})):
        res = tune(load_workload("drill"), strategy="random", budget=Budget(evals=14), seed=7,
                   records=tmp_path / f"{name}.db", executor=ex)
        tr = res.tasks[0]
        got[name] = (tr.walk.accepted.candidate.fingerprint, sorted(t.candidate.fingerprint for t in tr.result.trials))
        con = sqlite3.connect(tmp_path / f"{name}.db")
        assert con.execute("SELECT COUNT(*), COUNT(DISTINCT fingerprint) FROM measurements").fetchone() == (14, 14)
        con.close()
    assert got["pool"] == got["plain"]


def test_core_sets_and_claims_never_share_a_core(tmp_path):
    sets = core_sets(1)
    assert sets and len({c for s in sets for c in s}) == sum(len(s) for s in sets)
    claims = [CoreClaim(1, tmp_path) for _ in range(len(sets) + 1)]
    got = [c.cpus for c in claims]
    assert sorted(got[:-1]) == sorted(sets) and got[-1] is None  # one more slot than core sets: unpinned
    claims[0].release()
    assert CoreClaim(1, tmp_path).cpus == got[0]  # released, claimable again
    for c in claims:
        c.release()


def test_cpu_slots_pin_their_workers_to_distinct_cores(tmp_path, monkeypatch, profile):
    from planforge.workloads.kernels import kernel_workload
    from planforge.kernels.cpu import Problem

    monkeypatch.setenv("PLANFORGE_CORE_LOCKS", str(tmp_path))
    task = kernel_workload(Problem("gemv", (32, 32), "none"), profile=profile).tasks[0]
    n = len(core_sets(1))
    ex = LocalExecutor(task.backend, workers=n)
    try:
        cands = make_strategy("random", task.space, 0).ask(n)
        ex.submit(cands)
        done = []
        while len(done) < n:
            done += ex.poll(30)
        assert all(d.outcome.ok for d in done)
        pinned = [tuple(sorted(os.sched_getaffinity(s["backend"].worker.pid))) for s in ex.info]
    finally:
        ex.close()
        task.backend.close()
    assert sorted(pinned) == sorted(core_sets(1))


def test_unknown_executor_and_uncopyable_backend_are_clear_errors():
    class Plain:
        name, fingerprint = "plain", "x"

        def measure(self, cs):
            return []

    with pytest.raises(ExecutorError, match="unknown executor"):
        make_executor("slurm", Plain())
    with pytest.raises(ExecutorError, match="no factory"):
        LocalExecutor(Plain(), workers=2)
    r = run_cli("tune", "--workload", "drill", "--executor", "slurm", "--quiet")
    assert r.returncode == 2 and "unknown --executor" in r.stderr


def _db(path, seed, budget=6):
    tune(load_workload("drill"), strategy="random", budget=Budget(evals=budget), seed=seed, records=path)
    return path


def test_merge_is_idempotent_and_keeps_every_record(tmp_path):
    a, b = _db(tmp_path / "a.db", 1), _db(tmp_path / "b.db", 2)
    c = tmp_path / "c.db"
    first = merge_records([a, b], c)
    assert first == {"runs": 2, "measurements": 12, "total": 12}
    again = merge_records([a, b, c], c)  # everything already there, including c itself
    assert again == {"runs": 0, "measurements": 0, "total": 12}
    with Records(c) as db:
        merged = sorted((r.run_id, r.fingerprint, r.outcome.times) for r in db.records())
    with Records(a) as da, Records(b) as dbb:
        orig = sorted((r.run_id, r.fingerprint, r.outcome.times) for d in (da, dbb) for r in d.records())
    assert merged == orig
    # the CLI does the same, and a second merge adds nothing
    d = tmp_path / "d.db"
    r1 = run_cli("records", "merge", a, b, "-o", d, check=True)
    r2 = run_cli("records", "merge", a, b, "-o", d, check=True)
    assert "12 new measurements" in r1.stdout and "0 new measurements (12 in all)" in r2.stdout


def test_merge_finishes_a_run_seen_interrupted_elsewhere(tmp_path):
    a = _db(tmp_path / "a.db", 1)
    b = tmp_path / "b.db"
    con = sqlite3.connect(a)
    con.execute("UPDATE runs SET status='interrupted'")
    con.commit()
    con.close()
    merge_records([a], b)
    merge_records([_db(tmp_path / "a2.db", 1)], b)  # a different run: added, the first stays interrupted
    with Records(b) as db:
        assert sorted(r["status"] for r in db.runs()) == ["done", "interrupted"]
    import shutil

    shutil.copy(a, tmp_path / "a3.db")
    con = sqlite3.connect(tmp_path / "a3.db")
    con.execute("UPDATE runs SET status='done'")
    con.commit()
    con.close()
    merge_records([tmp_path / "a3.db"], b)
    with Records(b) as db:
        assert sorted(r["status"] for r in db.runs()) == ["done", "done"]


def test_merge_refuses_a_missing_or_foreign_database(tmp_path):
    from planforge.spec import RecordsError

    with pytest.raises(RecordsError, match="no records database"):
        merge_records([tmp_path / "nope.db"], tmp_path / "out.db")
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(RecordsError, match="not planforge"):
        merge_records([other], tmp_path / "out.db")


class TwoMachines:
    """An executor whose two slots sit on different kinds of machine: odd submissions measure 10x slower."""

    slots = 2

    def __init__(self, table):
        self.table, self.out, self.n = table, [], 0

    def free(self):
        return self.slots - len(self.out)

    def pending(self):
        return len(self.out)

    def submit(self, cands):
        from planforge.measure.executor import Done

        for c in cands:
            self.n += 1
            slow = self.n % 2 == 0
            t = self.table[c.fingerprint] * (10 if slow else 1)
            self.out.append(Done(c, Outcome.measured([t]), "slow-box" if slow else "fast-box", "s", 0.0))

    def poll(self, timeout=None):
        out, self.out = self.out[::-1], []  # and out of order
        return out


def test_times_are_ranked_per_device_fingerprint():
    task = load_workload("drill").tasks[0]
    res = search_async(task.space, make_strategy("random", task.space, 2), TwoMachines(task.backend.table),
                       Budget(evals=16), keep=4, default_target="fast-box")
    assert set(res.by_target) == {"fast-box", "slow-box"}
    for target, ranked in res.by_target.items():  # no list holds a time from the other machine
        assert len(ranked) == 4
        for e in ranked:
            assert e.metric == task.backend.table[e.candidate.fingerprint] * (1 if target == "fast-box" else 10)
    assert res.ranked is res.by_target["fast-box"]  # the driver's own kind of machine
    assert res.evaluations == 16


def test_ray_missing_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ExecutorError, match=r"pip install 'planforge\[ray\]'"):
        make_executor("ray", load_workload("drill").tasks[0].backend)
