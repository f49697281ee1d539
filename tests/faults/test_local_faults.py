"""Fault injection on the local executor: planted faults, a killed measurement worker, two concurrent drivers."""
import os
import sqlite3
import subprocess
import sys

from planforge.measure.executor import LocalExecutor
from planforge.search import Budget
from planforge.tuning import tune

from .faultkit import EXPECTED, categories, fault_workload, lost, report, rows, run_with_kills

FAULTS = {"crash": "segfault", "hang": "hang", "oom": "memory exhausted (rlimit)", "badsyntax": "compile error",
          "wrong": "wrong numbers"}


def test_planted_faults_local_pool(tmp_path, profile, monkeypatch):
    monkeypatch.setenv("PLANFORGE_CORE_LOCKS", str(tmp_path / "locks"))
    modes = ["ok", "ok2", "crash", "hang", "oom", "badsyntax", "wrong"]
    wl = fault_workload(modes, profile)
    db = tmp_path / "records.db"
    produced = []
    res = tune(wl, strategy="exhaustive", budget=Budget(evals=len(modes)), records=db,
               executor={"kind": "local", "workers": 2},
               on_trial=lambda task, t: produced.append((None, task.key, t.candidate.fingerprint)))
    produced = [(res.run_id, k, fp) for _, k, fp in produced]
    got = categories(db)
    missing = lost(db, produced)
    assert res.ok and res.tasks[0].result.evaluations == len(modes)
    for mode, fault in FAULTS.items():
        report(f"{fault} (local pool)", 1, res.ok and got[mode][0] == EXPECTED[mode], missing)
    assert {m: got[m][0] for m in modes} == {m: EXPECTED[m] for m in modes}
    assert "SIGSEGV" in got["crash"][1]
    assert "memory limit" in got["oom"][1]
    assert missing == 0 and len(rows(db)) == len(modes)


def test_compile_failure_never_reaches_a_measuring_slot(tmp_path, profile, monkeypatch):
    from planforge.search import make_strategy

    monkeypatch.setenv("PLANFORGE_CORE_LOCKS", str(tmp_path / "locks"))
    monkeypatch.setenv("PLANFORGE_CACHE", str(tmp_path / "cache"))
    modes = ["sleepy", "badsyntax", "ok"]
    task = fault_workload(modes, profile).tasks[0]
    ex = LocalExecutor(task.backend, workers=2)
    try:
        ex.submit(make_strategy("exhaustive", task.space).ask(3))
        done = []
        while len(done) < 3:
            done += ex.poll(30)
    finally:
        ex.close()
        task.backend.close()
    got = {d.candidate["mode"]: d for d in done}
    assert got["badsyntax"].outcome.category == "compile" and got["badsyntax"].slot == ""
    assert got["badsyntax"].builder.startswith("planforge-build")
    assert all(got[m].outcome.ok and got[m].slot.startswith("local-") for m in ("sleepy", "ok"))
    # the same best plan and the same outcomes as the plain loop, which builds and measures in one step
    best = {}
    for name, executor in (("plain", None), ("pool", {"kind": "local", "workers": 2})):
        db = tmp_path / f"{name}.db"
        res = tune(fault_workload(modes, profile), strategy="exhaustive", budget=Budget(evals=3), seed=1,
                   records=db, executor=executor)
        best[name] = (res.tasks[0].walk.accepted.candidate["mode"], {m: c for m, (c, _) in categories(db).items()})
    assert best["pool"] == best["plain"] and best["pool"][0] == "ok"
    report("compile error kept off the measuring slots", 1, got["badsyntax"].slot == "", 0)


def _kills(tmp_path, profile, kills):
    db = tmp_path / f"kill{kills}.db"
    res, killed, produced = run_with_kills(db, profile, kills, lambda be: LocalExecutor(be, workers=2),
                                           lambda ex: ex.info, lambda s: s["backend"].worker.pid)
    return res, killed, db, produced


def test_measurement_worker_killed_once_is_retried(tmp_path, profile, monkeypatch):
    monkeypatch.setenv("PLANFORGE_CORE_LOCKS", str(tmp_path / "locks"))
    res, killed, db, produced = _kills(tmp_path, profile, 1)
    got = categories(db)
    missing = lost(db, produced)
    report("worker SIGKILL, retried (local)", killed, got["slow"][0] == "correct", missing)
    assert killed == 1 and res.evaluations == 3
    assert {m: c for m, (c, _) in got.items()} == {"ok": "correct", "slow": "correct", "ok2": "correct"}
    assert missing == 0


def test_measurement_worker_killed_twice_is_runtime(tmp_path, profile, monkeypatch):
    monkeypatch.setenv("PLANFORGE_CORE_LOCKS", str(tmp_path / "locks"))
    res, killed, db, produced = _kills(tmp_path, profile, 2)
    got = categories(db)
    missing = lost(db, produced)
    report("worker SIGKILL twice (local)", killed, got["slow"][0] == "runtime", missing)
    assert killed == 2 and res.evaluations == 3
    assert got["slow"][0] == "runtime" and "lost twice" in got["slow"][1] and "SIGKILL" in got["slow"][1]
    assert got["ok"][0] == got["ok2"][0] == "correct" and missing == 0


def test_two_concurrent_tunes_share_one_database(tmp_path):
    db = tmp_path / "shared.db"
    args = ["tune", "--workload", "drill", "--strategy", "random", "--budget", "20", "--option", "delay_s=0.05",
            "--records", str(db), "--quiet", "--executor", "local", "--workers", "2"]
    env = {**os.environ, "PLANFORGE_CORE_LOCKS": str(tmp_path / "locks")}
    procs = [subprocess.Popen([sys.executable, "-m", "planforge", *args, "--seed", str(seed), "--out",
                               str(tmp_path / f"out{seed}")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for seed in (1, 2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    con = sqlite3.connect(db)
    runs = con.execute("SELECT run_id, status FROM runs").fetchall()
    per_run = dict(con.execute("SELECT run_id, COUNT(DISTINCT fingerprint) FROM measurements GROUP BY run_id"))
    con.close()
    got = rows(db)
    missing = 40 - len(got) + sum(n - 1 for n in __import__("collections").Counter((r[0], r[2]) for r in got).values())
    report("two concurrent tune processes", 2, all(s == "done" for _, s in runs), missing)
    assert len(runs) == 2 and all(s == "done" for _, s in runs)
    assert sorted(per_run.values()) == [20, 20] and len(got) == 40 and missing == 0
