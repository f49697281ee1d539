"""Helpers of the fault-injection suite: a workload of planted faults, and the records checks."""
import json
import os
import signal
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

from planforge.targets.cpu.kernel import CpuBackend
from planforge.targets.cpu.templates import Problem
from planforge.measure import AdaptiveTimeout, TimingConfig
from planforge.search import Budget, make_strategy
from planforge.search import search_async
from planforge.spec import Records
from planforge.workloads import Manifest, Task, Workload

from . import fault_templates

TESTS = Path(__file__).resolve().parents[1]
SUMMARY: list[str] = []
ONCE = TimingConfig(warmup_s=0.0, budget_s=0.0, min_repeats=1, max_repeats=1)
MEMORY_LIMIT = 1 << 30
# what each planted fault must be recorded as
EXPECTED = {"ok": "correct", "ok2": "correct", "slow": "correct", "sleepy": "correct", "crash": "runtime", "hang": "timeout",
            "oom": "runtime", "badsyntax": "compile", "wrong": "correctness"}


def fault_workload(modes, profile, name="faults") -> Workload:
    """One task whose candidates are ``modes`` (in that order for an exhaustive search)."""
    t = fault_templates.template(modes)
    p = Problem("gemv", (64, 32))
    be = CpuBackend(p, t, profile, timing=ONCE, memory_limit=MEMORY_LIMIT,
                    timeout=AdaptiveTimeout(factor=10, lo=5.0, hi=10.0))  # room for a fresh worker on a busy machine
    task = Task(key=name, space=t.space(p, None), backend=be)
    return Workload(Manifest(name, options={"modes": list(modes)}), [task])


def rows(db) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT run_id, task, fingerprint, candidate, status, category, message, target "
                           "FROM measurements ORDER BY id").fetchall()
    finally:
        con.close()


def categories(db, run_id=None) -> dict[str, tuple[str, str]]:
    """mode -> (category or 'correct', message) of each record."""
    out = {}
    for r, _, _, cand, status, cat, msg, _ in rows(db):
        if run_id is None or r == run_id:
            out[json.loads(cand)["mode"]] = ("correct" if status == "measured" else cat, msg)
    return out


def lost(db, produced) -> int:
    """Outcomes the driver produced (run, task, fingerprint) that are not in the database exactly once."""
    have = Counter((r[0], r[1], r[2]) for r in rows(db))
    dup = sum(n - 1 for n in have.values() if n > 1)
    return sum(1 for k in produced if have.get(k, 0) != 1) + dup


def report(fault: str, injected: int, survived: bool, records_lost: int) -> None:
    SUMMARY.append(f"fault {fault:<30} injected={injected} survived={'yes' if survived else 'NO'} "
                   f"records_lost={records_lost}")


def _killer(slots, mode, kills, done, pid_of):
    """Kill with SIGKILL, ``kills`` times, the process measuring the candidate with ``mode`` (0.4 s into it)."""
    n = 0
    while n < kills and not done.is_set():
        for s in slots():
            c, pid = s.get("busy"), pid_of(s)
            if c is not None and c["mode"] == mode and pid:
                time.sleep(0.4)
                if s.get("busy") is c and pid_of(s) == pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        n += 1
                    except ProcessLookupError:
                        pass
                    time.sleep(0.3)
                break
        time.sleep(0.02)
    return n


def run_with_kills(db_path, profile, kills, make_executor, slots, pid_of):
    """Tune ok / slow / ok2 on ``make_executor(backend)`` while a thread kills whatever measures ``slow``,
    ``kills`` times; each outcome is recorded as the driver does. Returns (result, kills done, produced keys)."""
    wl = fault_workload(["ok", "slow", "ok2"], profile)
    task = wl.tasks[0]
    ex = make_executor(task.backend)
    db = Records(db_path)
    run_id, _ = db.start_run("faults", wl.manifest.key, {"kills": kills})
    produced = []

    def record(t, target):
        db.add(run_id, wl.manifest.key, task.key, target, t.candidate.fingerprint, t.candidate.as_dict(), t.outcome, t.n)
        produced.append((run_id, task.key, t.candidate.fingerprint))

    done = threading.Event()
    killed = []
    th = threading.Thread(target=lambda: killed.append(_killer(lambda: slots(ex), "slow", kills, done, pid_of)))
    th.start()
    try:
        res = search_async(task.space, make_strategy("exhaustive", task.space), ex, Budget(evals=3),
                           on_done=record, default_target=task.backend.fingerprint)
    finally:
        done.set()
        th.join()
        ex.close()
        task.backend.close()
        db.close()
    return res, killed[0], produced
