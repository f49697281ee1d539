"""Kill -9 of a running `planforge tune`, then --resume: nothing recorded is lost or measured again."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

from conftest import run_cli

ARGS = ["tune", "--workload", "drill", "--strategy", "random", "--budget", "20", "--seed", "3",
        "--option", "delay_s=0.15", "--quiet"]


def rows(db):
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT id, run_id, fingerprint, metric, evaluation, created FROM measurements ORDER BY id").fetchall()
    except sqlite3.OperationalError:  # the run has created the file but not its tables yet
        return []
    finally:
        con.close()


def test_kill9_then_resume_loses_nothing(tmp_path):
    out = tmp_path / "run"
    db = out / "records.db"
    p = subprocess.Popen([sys.executable, "-m", "planforge", *ARGS, "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline:
        if db.exists():
            try:
                if len(rows(db)) >= 5:
                    break
            except sqlite3.OperationalError:
                pass
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL
    before = rows(db)
    assert 5 <= len(before) < 20, "the run was not interrupted mid-way"
    assert not (out / "spec.json").exists()

    resumed = json.loads(run_cli(*ARGS, "--out", out, "--resume", "--json", check=True).stdout)
    after = rows(db)
    assert after[: len(before)] == before  # every record kept, untouched
    assert len(after) == 20 and len({x[2] for x in after}) == 20  # each measurement exactly once
    assert len({x[1] for x in after}) == 1  # same run continued
    assert resumed["resumed"]
    # the resumed run took every recorded outcome from the records instead of measuring it again
    assert resumed["tasks"]["mlp_layer"]["from_records"] == len(before)

    # and the result is the one an uninterrupted run gives
    clean = tmp_path / "clean"
    run_cli(*ARGS, "--out", clean, check=True)
    assert (clean / "spec.json").read_bytes() == (out / "spec.json").read_bytes()


def test_resume_without_an_interrupted_run_starts_fresh(tmp_path):
    r = run_cli("tune", "-w", "drill", "--budget", "5", "--strategy", "random", "--out", tmp_path, "--resume", "--quiet",
                check=True)
    assert "nothing to resume" in r.stdout


def test_ctrl_c_marks_interrupted_and_resumes(tmp_path):
    out = tmp_path / "run"
    db = out / "records.db"
    # slower trials than the other tests': the interrupt must land while the run is still going, also on a
    # loaded CI machine (at 0.15 s a trial one run finished before the signal arrived)
    args = [a if a != "delay_s=0.15" else "delay_s=0.4" for a in ARGS]
    p = subprocess.Popen([sys.executable, "-m", "planforge", *args, "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not (db.exists() and len(rows(db)) >= 3):
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130 and "--resume" in err and "Traceback" not in err
    con = sqlite3.connect(db)
    assert con.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"
    con.close()
    n = len(rows(db))
    run_cli(*args, "--out", out, "--resume", check=True)
    assert len(rows(db)) == 20 and rows(db)[:n] == rows(db)[:n]
