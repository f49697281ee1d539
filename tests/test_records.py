import os
import sqlite3

import pytest

from planforge.outcome import Outcome
from planforge.search import Budget
from planforge.spec import Records, RecordsError
from planforge.tuning import tune
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


V1_MEASUREMENTS = """CREATE TABLE measurements (
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs(run_id), workload_key TEXT NOT NULL,
    task TEXT NOT NULL, target TEXT NOT NULL, fingerprint TEXT NOT NULL, candidate TEXT NOT NULL,
    status TEXT NOT NULL, category TEXT, metric REAL, times TEXT NOT NULL, message TEXT NOT NULL DEFAULT '',
    evaluation INTEGER NOT NULL, created REAL NOT NULL, UNIQUE (run_id, task, fingerprint))"""


def test_one_candidate_on_two_devices_and_version_1_upgraded(tmp_path):
    p = tmp_path / "r.db"
    db = Records(p)
    run, _ = db.start_run("w", "k" * 16, {})
    o = Outcome.measured([1e-6])
    assert db.add(run, "k" * 16, "t", "dev-a", "fp1", {"a": 1}, o, 1)
    assert db.add(run, "k" * 16, "t", "dev-b", "fp1", {"a": 1}, Outcome.measured([5e-6]), 1)  # another machine
    assert not db.add(run, "k" * 16, "t", "dev-b", "fp1", {"a": 1}, o, 1)
    assert db.outcomes(run, "t", "dev-b")["fp1"].metric == 5e-6 and db.outcomes(run, "t", "dev-a")["fp1"].metric == 1e-6
    db.close()
    # a version 1 database (one row per run, task and candidate) is upgraded in place, its rows kept
    old = tmp_path / "v1.db"
    con = sqlite3.connect(old)
    con.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, workload TEXT NOT NULL, workload_key TEXT NOT NULL, "
                "config_key TEXT NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL, started REAL NOT NULL, "
                "finished REAL, command TEXT)")
    con.execute(V1_MEASUREMENTS)
    con.execute("INSERT INTO runs VALUES ('r1', 'w', 'kk', 'c', '{}', 'interrupted', 0, NULL, '')")
    con.execute("INSERT INTO measurements VALUES (1, 'r1', 'kk', 't', 'dev-a', 'fp1', '{}', 'measured', NULL, 1e-6, "
                "'[1e-06]', '', 1, 0)")
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    with Records(old) as db:
        assert db.db.execute("PRAGMA user_version").fetchone()[0] == 2
        assert [(r.target, r.fingerprint, r.outcome.times) for r in db.records()] == [("dev-a", "fp1", (1e-6,))]
        assert db.add("r1", "kk", "t", "dev-b", "fp1", {}, o, 1)
        assert db.count() == 2



def _v1_database(path):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, workload TEXT NOT NULL, workload_key TEXT NOT NULL, "
                "config_key TEXT NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL, started REAL NOT NULL, "
                "finished REAL, command TEXT)")
    con.execute(V1_MEASUREMENTS)
    con.execute("INSERT INTO runs VALUES ('r1', 'w', 'kk', 'c', '{}', 'done', 0, 1, '')")
    con.execute("INSERT INTO measurements VALUES (1, 'r1', 'kk', 't', 'dev-a', 'fp1', '{}', 'measured', NULL, 1e-6, "
                "'[1e-06]', '', 1, 0)")
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()


def test_a_database_read_for_a_warm_start_or_an_export_is_left_as_it_was(tmp_path):
    """Read-only (warm starts, exports, a merge's inputs): a colleague's version 1 file is read without being
    upgraded or switched to WAL, not one byte of it written; a file that is not there, or holds no tables, is
    refused as such, and writing through a read-only handle is SQLite's refusal, not a change."""
    old = tmp_path / "v1.db"
    _v1_database(old)
    before = old.read_bytes()
    with Records(old, readonly=True) as db:
        assert [(r.target, r.fingerprint, r.outcome.metric) for r in db.records()] == [("dev-a", "fp1", 1e-6)]
        assert db.runs()[0]["status"] == "done"
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            db.start_run("w", "k" * 16, {})
    assert old.read_bytes() == before
    assert sorted(q.name for q in tmp_path.iterdir()) == ["v1.db"]  # no -wal or -shm left beside it
    with pytest.raises(RecordsError, match="no records database at"):
        Records(tmp_path / "missing.db", readonly=True)
    assert not (tmp_path / "missing.db").exists()
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(RecordsError, match=r"not planforge's records \(tables: none\)"):
        Records(empty, readonly=True)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite" * 500)
    with pytest.raises(RecordsError, match="is not a planforge records database"):
        Records(junk, readonly=True)
    # a writable open of the same file upgrades it, as before
    with Records(old) as db:
        assert db.db.execute("PRAGMA user_version").fetchone()[0] == 2


def test_a_records_path_that_cannot_be_written_is_a_records_error(tmp_path):
    """A records path under a file (no folder can be made there) is a RecordsError that says so, not an
    OSError from deep inside, and not 'not a planforge database'."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(RecordsError, match="cannot make the folder"):
        Records(tmp_path / "afile" / "records.db")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes read-only files anyway")
def test_a_read_only_records_file_is_read_but_not_tuned_into(tmp_path):
    p = tmp_path / "ro" / "r.db"
    with Records(p) as db:
        run, _ = db.start_run("w", "k" * 16, {})
        db.add(run, "k" * 16, "t", "dev-a", "fp1", {"a": 1}, Outcome.measured([1e-6]), 1)
    os.chmod(p, 0o444)
    os.chmod(p.parent, 0o555)
    try:
        with pytest.raises(RecordsError, match="for writing") as e:
            Records(p)
        assert "not a planforge" not in str(e.value)
        with Records(p, readonly=True) as db:
            assert db.count() == 1
    finally:
        os.chmod(p.parent, 0o755)
        os.chmod(p, 0o644)


def test_many_openers_of_one_new_database_at_once_all_succeed(tmp_path):
    # CI once saw a second `planforge tune` refuse a database the first was still creating (half its schema
    # made). The schema is now checked and made in one write transaction, and the switch to WAL, which SQLite
    # answers 'locked' without waiting, is retried. Before that, about a quarter of these rounds failed.
    import threading
    for attempt in range(40):
        path = tmp_path / f"shared{attempt}.db"
        errors = []
        start = threading.Barrier(4)

        def open_it():
            start.wait()
            try:
                Records(path).close()
            except RecordsError as e:
                errors.append(str(e))

        threads = [threading.Thread(target=open_it) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [], errors
        with Records(path) as r:
            tables = {t[0] for t in r.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"runs", "measurements"} <= tables
