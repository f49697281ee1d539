"""Fault injection on the Ray executor (one local 2-CPU cluster for the module), and ray == local."""
import os
import signal
import sqlite3
import subprocess
import sys
import time

from planforge.search import Budget
from planforge.tuning import tune
from planforge.workloads import load_workload

from .faultkit import EXPECTED, categories, fault_workload, lost, report, rows, run_with_kills
from .test_local_faults import FAULTS


def test_planted_faults_on_ray(ray_address, tmp_path, profile):
    modes = ["ok", "ok2", "crash", "hang", "oom", "badsyntax", "wrong"]
    wl = fault_workload(modes, profile)
    db = tmp_path / "records.db"
    produced = []
    res = tune(wl, strategy="exhaustive", budget=Budget(evals=len(modes)), records=db,
               executor={"kind": "ray", "address": ray_address},
               on_trial=lambda task, t: produced.append((task.key, t.candidate.fingerprint)))
    got = categories(db)
    missing = lost(db, [(res.run_id, k, fp) for k, fp in produced])
    assert res.ok and res.tasks[0].result.evaluations == len(modes)
    for mode, fault in FAULTS.items():
        report(f"{fault} (ray)", 1, res.ok and got[mode][0] == EXPECTED[mode], missing)
    assert {m: got[m][0] for m in modes} == {m: EXPECTED[m] for m in modes}
    assert "SIGSEGV" in got["crash"][1] and "memory limit" in got["oom"][1]
    assert missing == 0 and len(rows(db)) == len(modes)
    assert {r[7] for r in rows(db)} == {profile.fingerprint}  # each time tagged with its node's device


def _ray_kills(tmp_path, profile, kills):
    from planforge.measure.executor import RayExecutor

    db = tmp_path / f"kill{kills}.db"
    res, killed, produced = run_with_kills(db, profile, kills, RayExecutor, lambda ex: ex.live(),
                                           lambda s: s.get("pid"))
    return res, killed, db, produced


def test_actor_killed_mid_measurement_is_retried_elsewhere(ray_address, tmp_path, profile):
    res, killed, db, produced = _ray_kills(tmp_path, profile, 1)
    got = categories(db)
    missing = lost(db, produced)
    report("ray actor SIGKILL, retried", killed, got["slow"][0] == "correct", missing)
    assert killed == 1 and res.evaluations == 3
    assert {m: c for m, (c, _) in got.items()} == {"ok": "correct", "slow": "correct", "ok2": "correct"}
    assert missing == 0


def test_actor_killed_twice_is_runtime_with_reason(ray_address, tmp_path, profile):
    res, killed, db, produced = _ray_kills(tmp_path, profile, 2)
    got = categories(db)
    missing = lost(db, produced)
    report("ray actor SIGKILL twice", killed, got["slow"][0] == "runtime", missing)
    assert killed == 2 and res.evaluations == 3
    assert got["slow"][0] == "runtime" and "lost 2 times" in got["slow"][1] and "ray-" in got["slow"][1]
    assert got["ok"][0] == got["ok2"][0] == "correct" and missing == 0


def test_driver_killed_mid_run_then_resumed_on_ray(ray_address, tmp_path):
    out = tmp_path / "run"
    db = out / "records.db"
    args = ["tune", "--workload", "drill", "--strategy", "random", "--budget", "20", "--seed", "3",
            "--option", "delay_s=0.3", "--quiet", "--executor", "ray", "--ray-address", ray_address, "--out", str(out)]
    p = subprocess.Popen([sys.executable, "-m", "planforge", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 90
    while time.time() < deadline and p.poll() is None:
        try:
            if db.exists() and len(rows(db)) >= 5:
                break
        except Exception:  # the database is being created
            pass
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.communicate()
    before = rows(db)
    assert 5 <= len(before) < 20, "the driver was not killed mid-run"
    r = subprocess.run([sys.executable, "-m", "planforge", *args, "--resume"], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    after = rows(db)
    kept = sum(1 for x in before if x in after)
    report("driver SIGKILL + resume (ray)", 1, r.returncode == 0 and "(resumed)" in r.stdout, len(before) - kept)
    assert kept == len(before)
    assert len(after) == 20 and len({x[2] for x in after}) == 20 and len({x[0] for x in after}) == 1


def test_heterogeneous_ray_cluster_tunes_per_fingerprint(ray_address, tmp_path):
    """Two actors that are two kinds of machine (tests/two_kinds.py): a spec per kind, the same as locally."""
    from two_kinds import two_kinds_drill

    specs = {}
    for kind in ("local", "ray"):
        ex = {"kind": "ray", "address": ray_address, "slots": 2} if kind == "ray" else {"kind": "local", "workers": 2}
        wl = two_kinds_drill(tmp_path / f"kinds-{kind}", delay_s=0.01)
        res = tune(wl, strategy="random", budget=Budget(evals=8), seed=4, out=tmp_path / kind, executor=ex)
        assert len(res.specs) == 2 and res.target == wl.tasks[0].backend.fingerprint
        specs[kind] = {t: p.read_text() for t, p in res.specs.items()}
        con = sqlite3.connect(res.records_path)
        per = dict(con.execute("SELECT target, COUNT(DISTINCT fingerprint) FROM measurements GROUP BY target"))
        con.close()
        assert sorted(per.values()) == [8, 8]
    assert specs["ray"] == specs["local"]
    report("heterogeneous cluster, spec per fingerprint (ray)", 2, specs["ray"] == specs["local"], 0)


def test_ray_gives_the_same_best_plan_as_local(ray_address, tmp_path):
    best = {}
    for kind in ("local", "ray"):
        wl = load_workload("drill", {"delay_s": 0.01})
        res = tune(wl, strategy="random", budget=Budget(evals=12), seed=5, records=tmp_path / f"{kind}.db",
                   executor={"kind": "ray", "address": ray_address} if kind == "ray" else None)
        tr = res.tasks[0]
        best[kind] = (tr.walk.accepted.candidate.fingerprint, tr.walk.accepted.metric,
                      sorted(t.candidate.fingerprint for t in tr.result.trials))
    assert best["ray"] == best["local"]
