"""Executors and the asynchronous loop without Ray: back-pressure, out-of-order results, pinning; records merge."""
import json
import os
import sqlite3
import time
from collections import Counter
from functools import partial

import pytest

from conftest import run_cli
from planforge.targets.table.table import TableBackend
from planforge.measure.executor import CoreClaim, ExecutorError, LocalExecutor, core_sets, make_executor
from planforge.outcome import Outcome
from planforge.search import Budget, make_strategy, search
from planforge.search import search_async
from planforge.spec import Records, spec_filename
from planforge.spec.records import merge_records
from planforge.tuning import tune
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
    from planforge.targets.cpu.target import CpuTarget
    from planforge.targets.cpu.templates import Problem

    monkeypatch.setenv("PLANFORGE_CORE_LOCKS", str(tmp_path))
    task = kernel_workload(Problem("gemv", (32, 32), "none"), target=CpuTarget(profile)).tasks[0]
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
    """An executor with a slot on each of two kinds of machine; the slow box measures 10x slower. Checks
    that each submission names its kind and hands results back out of order."""

    slots = 2

    def __init__(self, table):
        self.table, self.out, self.sent = table, [], []

    def free_by_target(self):
        busy = Counter(d.target for d in self.out)
        return {t: 1 - busy[t] for t in ("fast-box", "slow-box")}

    def pending(self):
        return len(self.out)

    def submit(self, cands, target=None):
        from planforge.measure.executor import Done

        assert target in ("fast-box", "slow-box") and len(cands) <= 1
        for c in cands:
            self.sent.append((target, c.fingerprint))
            t = self.table[c.fingerprint] * (10 if target == "slow-box" else 1)
            self.out.append(Done(c, Outcome.measured([t]), target, target, 0.0))

    def poll(self, timeout=None):
        out, self.out = self.out[::-1], []
        return out


def test_each_device_fingerprint_gets_its_own_search():
    task = load_workload("drill").tasks[0]
    ex = TwoMachines(task.backend.table)
    res = search_async(task.space, lambda target: make_strategy("random", task.space, 2), ex, Budget(evals=16),
                       keep=4, default_target="fast-box")
    assert set(res.by_target) == {"fast-box", "slow-box"} and res is res.by_target["fast-box"]
    for target, r in res.by_target.items():  # a whole budget each, no list holds a time from the other machine
        assert r.evaluations == 16 and len(r.ranked) == 4
        for e in r.ranked:
            assert e.metric == task.backend.table[e.candidate.fingerprint] * (1 if target == "fast-box" else 10)
    sent = Counter(ex.sent)
    assert max(sent.values()) == 1  # never the same candidate twice to one kind of machine...
    same = {fp for _, fp in ex.sent if sent[("fast-box", fp)] and sent[("slow-box", fp)]}
    assert len(same) == 16  # ...but each candidate to both: the same seed proposes the same plans on each
    with pytest.raises(ValueError, match="strategy per fingerprint"):
        search_async(task.space, make_strategy("random", task.space, 2), TwoMachines(task.backend.table),
                     Budget(evals=4))


def _two_kinds_tune(tmp_path, name, seed=3, **kw):
    from two_kinds import two_kinds_drill

    wl = two_kinds_drill(tmp_path / f"kinds-{name}", delay_s=0.01)
    return wl, tune(wl, strategy="random", budget=Budget(evals=10), seed=seed, out=tmp_path / name,
                    executor={"kind": "local", "workers": 2}, **kw)


def _check_per_kind(wl, res):
    """Two specs, each ranking its own kind's times only, each kind's records complete."""
    from two_kinds import kind_table

    base = load_workload("drill").tasks[0].backend.table
    kinds = {wl.tasks[0].backend.fingerprint: 0}
    kinds.update({t: 1 for t in res.by_target if t not in kinds})
    assert len(kinds) == 2 and res.target == wl.tasks[0].backend.fingerprint
    assert set(res.specs) == set(kinds) and res.specs[res.target].name == "spec.json"
    con = sqlite3.connect(res.records_path)
    for target, kind in kinds.items():
        table = kind_table(base, kind)
        spec = json.loads(res.specs[target].read_text())
        assert spec["target"]["fingerprint"] == target
        assert res.specs[target].name == spec_filename(None if kind == 0 else target)
        rows = con.execute("SELECT fingerprint, metric FROM measurements WHERE run_id=? AND target=? "
                           "AND status='measured'", (res.run_id, target)).fetchall()
        assert len(rows) == 10 and len({fp for fp, _ in rows}) == 10
        assert all(m == table[fp] for fp, m in rows)
        t = spec["tasks"]["mlp_layer"]
        ranked = [(r["latency_s"], r["fingerprint"]) for r in t["ranked"]]
        assert ranked == sorted((table[fp], fp) for fp, _ in rows)[:4]  # its own times, nothing else
        assert t["latency_s"] == table[t["fingerprint"]] and t["search"]["evaluations"] == 10
    both = con.execute("SELECT COUNT(*) FROM (SELECT fingerprint FROM measurements WHERE run_id=? "
                       "GROUP BY fingerprint HAVING COUNT(DISTINCT target) = 2)", (res.run_id,)).fetchone()[0]
    con.close()
    assert both == 10  # the same candidates, measured once on each kind of machine
    return {t: res.specs[t].read_text() for t in kinds}


def test_heterogeneous_cluster_writes_a_spec_per_fingerprint(tmp_path):
    from planforge.report import print_summary, summary_json
    from rich.console import Console

    wl, res = _two_kinds_tune(tmp_path, "a")
    specs = _check_per_kind(wl, res)
    a, b = (json.loads(x)["tasks"]["mlp_layer"]["fingerprint"] for x in specs.values())
    assert a != b  # the library matmul is slow on kind 1: each kind picked its own best
    import planforge
    from two_kinds import two_kinds_drill

    again = planforge.tune(two_kinds_drill(tmp_path / "kinds-b", delay_s=0.01), budget=10, strategy="random", seed=3,
                           out=tmp_path / "b", executor={"kind": "local", "workers": 2})
    assert {t: p.read_text() for t, p in again.specs.items()} == specs  # the same seed (and the Python API): the same
    con = Console(record=True, width=200)
    print_summary(res, con)
    text = con.export_text()
    assert all(str(p) in text for p in res.specs.values())
    assert summary_json(res)["specs"] == {t: str(p) for t, p in res.specs.items()}


def test_heterogeneous_run_resumes_per_fingerprint(tmp_path):
    seen = []

    def stop_after_8(task, trial):
        seen.append(trial)
        if len(seen) == 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _two_kinds_tune(tmp_path, "run", on_trial=stop_after_8)
    wl, res = _two_kinds_tune(tmp_path, "run", resume=True)
    assert res.resumed
    for target, trs in res.by_target.items():  # each kind took its own records back, none measured twice
        assert sum(t.cached for t in trs[0].result.trials) >= 1
    specs = _check_per_kind(wl, res)
    _, fresh = _two_kinds_tune(tmp_path, "fresh")
    assert {t: p.read_text() for t, p in fresh.specs.items()} == specs  # as if never interrupted


def test_builds_run_outside_the_measuring_slots(tmp_path, monkeypatch, profile):
    from planforge.targets.cpu.target import CpuTarget
    from planforge.targets.cpu.templates import Problem
    from planforge.workloads.kernels import kernel_workload

    monkeypatch.setenv("PLANFORGE_CORE_LOCKS", str(tmp_path))
    monkeypatch.setenv("PLANFORGE_CACHE", str(tmp_path / "cache"))  # every candidate compiled
    task = kernel_workload(Problem("gemm", (8, 16, 16), "bias_relu"), target=CpuTarget(profile)).tasks[0]
    ex = LocalExecutor(task.backend, workers=2)
    try:
        assert ex.free_by_target() == {task.backend.fingerprint: 4}  # two slots, two more building meanwhile
        cands = make_strategy("random", task.space, 0).ask(4)
        ex.submit(cands)
        done = []
        while len(done) < 4:
            done += ex.poll(30)
        slots = [s["backend"] for s in ex.info]
        measured_by = {s.worker.pid for s in slots}
    finally:
        ex.close()
        task.backend.close()
    assert all(d.outcome.ok and d.slot.startswith("local-") and d.build_s > 0 for d in done)
    assert all(d.builder.startswith("planforge-build") and f"pid {os.getpid()}" in d.builder for d in done)
    assert os.getpid() not in measured_by  # the slots' pinned measurement workers...
    assert all(s.build_seconds == 0 and not s._libs for s in slots)  # ...never compiled anything
    assert ex.seconds["build"] > 0 and ex.seconds["measure"] > 0


def test_ray_missing_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ExecutorError, match=r"pip install 'planforge\[ray\]'"):
        make_executor("ray", load_workload("drill").tasks[0].backend)
