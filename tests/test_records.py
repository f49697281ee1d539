import sqlite3

import pytest

from planforge.outcome import Outcome
from planforge.search import Budget
from planforge.spec import Records, RecordsError
from planforge.tune import tune
from planforge.workloads import load_workload


def test_wal_mode_and_roundtrip(tmp_path):
    db = Records(tmp_path / "r.db")
    assert db.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    run, resumed = db.start_run("w", "k" * 16, {"seed": 0})
    assert not resumed
    o = Outcome.measured([3e-6, 1e-6, 2e-6])
    assert db.add(run, "k" * 16, "t", "dev", "fp1", {"a": 1}, o, 1)
    assert not db.add(run, "k" * 16, "t", "dev", "fp1", {"a": 1}, o, 1)  # once per run
    db.add(run, "k" * 16, "t", "dev", "fp2", {"a": 2}, Outcome.invalid("timeout", "hung"), 2)
    got = db.outcomes(run, "t")
    assert got["fp1"].times == (3e-6, 1e-6, 2e-6) and got["fp1"].metric == 2e-6  # every raw time kept
    assert got["fp2"].category == "timeout" and got["fp2"].message == "hung"
    assert [r.fingerprint for r in db.records(task="t")] == ["fp1", "fp2"]
    db.close()


def test_every_outcome_recorded(tmp_path):
    r = tune(load_workload("drill"), strategy="genetic", budget=Budget(evals=24), out=tmp_path)
    with Records(r.records_path) as db:
        recs = list(db.records(run_id=r.run_id))
        assert len(recs) == r.tasks[0].result.evaluations
        assert sorted(x.evaluation for x in recs) == list(range(1, len(recs) + 1))
        assert db.runs()[-1]["status"] == "done"


def test_not_a_records_database(tmp_path):
    p = tmp_path / "junk.db"
    p.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(RecordsError, match="not a planforge records database"):
        Records(p)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(RecordsError, match="not planforge's records"):
        Records(other)
    with pytest.raises(RecordsError, match="is a directory"):
        Records(tmp_path)


def test_newer_records_version_refused(tmp_path):
    p = tmp_path / "r.db"
    Records(p).close()
    con = sqlite3.connect(p)
    con.execute("PRAGMA user_version = 99")
    con.close()
    with pytest.raises(RecordsError, match="newer planforge"):
        Records(p)
