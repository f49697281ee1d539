"""Records: a SQLite database (WAL mode) of every measurement.

One row per outcome, written and committed the moment it exists, so a run
killed at any point (Ctrl-C, kill -9) loses nothing that was recorded; a run
started again with ``resume`` replays its strategy from the seed and takes
every outcome it already has from here instead of measuring it again.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..outcome import Outcome
from ..space import fingerprint_of

USER_VERSION = 2  # 2: a measurement is unique per device fingerprint too (one candidate, two kinds of machine)

_RUNS = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    workload TEXT NOT NULL,
    workload_key TEXT NOT NULL,
    config_key TEXT NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL,          -- running | interrupted | done | failed
    started REAL NOT NULL,
    finished REAL,
    command TEXT
)"""
_MEASUREMENTS = """
CREATE TABLE IF NOT EXISTS {name} (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    workload_key TEXT NOT NULL,
    task TEXT NOT NULL,
    target TEXT NOT NULL,          -- device fingerprint
    fingerprint TEXT NOT NULL,     -- candidate fingerprint
    candidate TEXT NOT NULL,       -- JSON config
    status TEXT NOT NULL,          -- measured | invalid | rejected
    category TEXT,                 -- T4 invalidity category
    metric REAL,                   -- median seconds
    times TEXT NOT NULL,           -- JSON list of every raw time (s)
    message TEXT NOT NULL DEFAULT '',
    evaluation INTEGER NOT NULL,   -- evaluation number in its run (0: rejected)
    created REAL NOT NULL,
    UNIQUE (run_id, task, target, fingerprint)
)"""
_INDEX = "CREATE INDEX IF NOT EXISTS measurements_by_task ON measurements (workload_key, task, target);"


class RecordsError(RuntimeError):
    """A records database that cannot be opened or is not planforge's."""


@dataclass(frozen=True)
class Record:
    run_id: str
    workload_key: str
    task: str
    target: str
    fingerprint: str
    candidate: dict[str, Any]
    outcome: Outcome
    evaluation: int
    created: float


class Records:
    """The records database at ``path`` (created if missing).

    Every write commits at once (autocommit); WAL mode lets readers and a
    second writer proceed while a run is in progress.

    ``readonly``: only read it (warm starts, exports, a merge's inputs): the file must exist, nothing in it is
    created, upgraded or switched to WAL, so a colleague's or a committed database is read as it is, also where
    it cannot be written; a version 1 database is read without its upgrade."""

    def __init__(self, path: str | os.PathLike, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        if self.path.exists() and self.path.is_dir():
            raise RecordsError(f"records path {self.path} is a directory, not a database file")
        if readonly and not self.path.is_file():
            raise RecordsError(f"no records database at {self.path}")
        if not readonly:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise RecordsError(f"cannot make the folder of records database {self.path}: {e}") from None
        self.db = None
        try:
            self._open()
        except sqlite3.DatabaseError as e:
            self._close_quietly()
            raise RecordsError(self._describe(e)) from None
        except BaseException:
            self._close_quietly()
            raise

    def _open(self) -> None:
        if self.readonly:
            uri = f"{self.path.resolve().as_uri()}?mode=ro"
            try:
                self.db = sqlite3.connect(uri, uri=True, timeout=60, isolation_level=None)
                self.db.execute("PRAGMA busy_timeout = 60000")
                self._check(*self._schema())
            except sqlite3.DatabaseError as e:
                # Reading a WAL database needs its -shm file, which cannot be made in a folder this process
                # cannot write: there, read the file as immutable (no -shm, no locks).
                if e.sqlite_errorcode & 0xFF not in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN) or \
                        os.access(self.path.parent, os.W_OK):
                    raise
                self._close_quietly()
                self.db = sqlite3.connect(uri + "&immutable=1", uri=True, timeout=60, isolation_level=None)
                self._check(*self._schema())
            return
        self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        self.db.execute("PRAGMA busy_timeout = 60000")
        mode = self._switch_to_wal()
        if mode.lower() != "wal":
            raise RecordsError(f"{self.path}: could not switch to WAL journal mode (got {mode})")
        self.db.execute("PRAGMA synchronous = NORMAL")
        # Read, check and make the schema in one write transaction: a second process opening a new
        # database at the same moment waits here, then finds every table, never a schema half made.
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self._check_and_create()
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def _describe(self, e: sqlite3.DatabaseError) -> str:
        """What a user reads when SQLite refuses the file: not a database at all, or one this process
        cannot write (read-only, full disk, an I/O error), which is not a reason to call it someone else's."""
        if e.sqlite_errorcode == sqlite3.SQLITE_NOTADB:
            return f"{self.path} is not a planforge records database ({e})"
        if self.readonly:
            return f"cannot read records database {self.path} ({e})"
        return (f"cannot open records database {self.path} for writing ({e}); "
                f"a tuning run writes every measurement there: give it a writable path")

    def _close_quietly(self) -> None:
        if self.db is not None:
            try:
                self.db.close()
            except sqlite3.Error:
                pass
            self.db = None

    def _switch_to_wal(self, patience_s: float = 60.0) -> str:
        """Switch to WAL. On a database another process is creating at the same moment SQLite answers
        'database is locked' at once, without calling the busy handler: wait and retry for up to
        ``patience_s``."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                return self.db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            except sqlite3.OperationalError as e:
                busy = e.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                if not busy or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _schema(self) -> tuple[int, set[str]]:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        return version, {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def _check(self, version: int, tables: set[str]) -> None:
        """Refuse a database of a newer planforge or of another program (read-only: an empty one too)."""
        if version > USER_VERSION:
            raise RecordsError(f"{self.path} was written by a newer planforge (records version {version}; "
                               f"this one reads {USER_VERSION}); upgrade planforge")
        if (tables or self.readonly) and not {"runs", "measurements"} <= tables:
            raise RecordsError(f"{self.path} is an SQLite database but not planforge's records "
                               f"(tables: {', '.join(sorted(tables)) or 'none'})")

    def _check_and_create(self) -> None:
        db = self.db
        version, tables = self._schema()
        self._check(version, tables)
        if version == 1 and "measurements" in tables:
            # Version 1 held one measurement per (run, task, candidate): copy its rows into the version 2
            # table, unique per device fingerprint as well (inside the caller's transaction).
            db.execute(_MEASUREMENTS.format(name="measurements_v2"))
            db.execute("INSERT INTO measurements_v2 SELECT * FROM measurements")
            db.execute("DROP TABLE measurements")
            db.execute("ALTER TABLE measurements_v2 RENAME TO measurements")
        for ddl in (_RUNS, _MEASUREMENTS.format(name="measurements"), _INDEX):
            db.execute(ddl)
        db.execute(f"PRAGMA user_version = {USER_VERSION}")

    def close(self) -> None:
        self._close_quietly()

    def __enter__(self) -> "Records":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- runs ----------------------------------------------------------------
    def start_run(self, workload: str, workload_key: str, config: dict[str, Any], command: str = "",
                  resume: bool = False) -> tuple[str, bool]:
        """Open a run; with ``resume``, reopen the latest unfinished run with the same
        workload and config. Returns (run_id, resumed)."""
        config_json = json.dumps(config, sort_keys=True)
        config_key = fingerprint_of(config)
        if resume:
            row = self.db.execute(
                "SELECT run_id FROM runs WHERE workload_key=? AND config_key=? AND status IN ('running','interrupted') "
                "ORDER BY started DESC LIMIT 1", (workload_key, config_key)).fetchone()
            if row:
                self.db.execute("UPDATE runs SET status='running', finished=NULL WHERE run_id=?", (row[0],))
                return row[0], True
        run_id = uuid.uuid4().hex[:12]
        self.db.execute("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
                        (run_id, workload, workload_key, config_key, config_json, "running", time.time(), None, command))
        return run_id, False

    def end_run(self, run_id: str, status: str = "done") -> None:
        self.db.execute("UPDATE runs SET status=?, finished=? WHERE run_id=?", (status, time.time(), run_id))

    def runs(self) -> list[dict[str, Any]]:
        cur = self.db.execute("SELECT * FROM runs ORDER BY started")
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur]

    # -- measurements ----------------------------------------------------------
    def add(self, run_id: str, workload_key: str, task: str, target: str, fingerprint: str,
            candidate: dict[str, Any], outcome: Outcome, evaluation: int) -> bool:
        """Record one outcome (committed on return). False if the run already had it."""
        cur = self.db.execute(
            "INSERT OR IGNORE INTO measurements (run_id, workload_key, task, target, fingerprint, candidate, status,"
            " category, metric, times, message, evaluation, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (run_id, workload_key, task, target, fingerprint, json.dumps(candidate, sort_keys=True), outcome.status,
             outcome.category, outcome.metric, json.dumps(list(outcome.times)), outcome.message, evaluation,
             time.time()))
        return cur.rowcount == 1

    def outcomes(self, run_id: str, task: str, target: str | None = None) -> dict[str, Outcome]:
        """Outcomes recorded by ``run_id`` for ``task`` (on device ``target``; default: any), by candidate
        fingerprint."""
        where, args = ("AND target=?", (target,)) if target is not None else ("", ())
        rows = self.db.execute("SELECT fingerprint, status, category, times, message FROM measurements "
                               f"WHERE run_id=? AND task=? {where}", (run_id, task, *args))
        return {fp: Outcome(st, cat, tuple(json.loads(times)), msg) for fp, st, cat, times, msg in rows}

    def records(self, **where: Any) -> Iterator[Record]:
        """Every record matching the given column values (e.g. ``task=..., target=...``)."""
        allowed = {"run_id", "workload_key", "task", "target", "fingerprint", "status"}
        bad = set(where) - allowed
        if bad:
            raise ValueError(f"cannot filter records by {sorted(bad)}")
        clause = " AND ".join(f"{k}=?" for k in where) or "1"
        for r in self.db.execute(
                "SELECT run_id, workload_key, task, target, fingerprint, candidate, status, category, times, message,"
                f" evaluation, created FROM measurements WHERE {clause} ORDER BY id", tuple(where.values())):
            yield Record(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]), Outcome(r[6], r[7], tuple(json.loads(r[8])), r[9]),
                         r[10], r[11])

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]


_COLUMNS = ("run_id, workload_key, task, target, fingerprint, candidate, status, category, metric, times, message, "
            "evaluation, created")


def merge_records(inputs: list[str | os.PathLike], out: str | os.PathLike) -> dict[str, int]:
    """Merge the records databases ``inputs`` into ``out`` (created if missing).

    A run and a measurement are identified as in one database (run id; run id,
    task, device and candidate fingerprint), so merging the same database twice, or a
    database with a copy of itself, adds nothing: merging is idempotent. A run
    that one input saw finish and another saw interrupted ends up finished.
    Each input is merged in one transaction. Returns the counts added."""
    missing = [str(p) for p in inputs if not Path(p).is_file()]
    if missing:
        raise RecordsError(f"no records database at {', '.join(missing)}")
    dst = Records(out)
    added = {"runs": 0, "measurements": 0}
    try:
        for p in inputs:
            if Path(p).resolve() == dst.path.resolve():
                continue
            Records(p, readonly=True).close()  # refuses a file that is not planforge's, or from a newer planforge
            db = dst.db
            db.execute("ATTACH DATABASE ? AS src", (str(p),))
            try:
                db.execute("BEGIN IMMEDIATE")
                before = db.execute("SELECT (SELECT COUNT(*) FROM runs), (SELECT COUNT(*) FROM measurements)").fetchone()
                db.execute("INSERT INTO runs SELECT * FROM src.runs WHERE 1 ON CONFLICT(run_id) DO UPDATE SET "
                           "status=excluded.status, finished=excluded.finished WHERE runs.status IN "
                           "('running','interrupted') AND excluded.status NOT IN ('running','interrupted')")
                db.execute(f"INSERT OR IGNORE INTO measurements ({_COLUMNS}) SELECT {_COLUMNS} FROM src.measurements "
                           "ORDER BY id")
                after = db.execute("SELECT (SELECT COUNT(*) FROM runs), (SELECT COUNT(*) FROM measurements)").fetchone()
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            finally:
                db.execute("DETACH DATABASE src")
            added["runs"] += after[0] - before[0]
            added["measurements"] += after[1] - before[1]
        added["total"] = dst.count()
    finally:
        dst.close()
    return added
