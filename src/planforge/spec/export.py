"""Export measurements to T4 result files and Kernel Tuner cache files.

Other tools can then replay planforge's measurements (Kernel Tuner's
simulation mode, the auto-tuning community's T4 tooling), and planforge's own
replay backend reads them back unchanged. Times are written in milliseconds,
as both formats expect; a measured configuration keeps every raw time, and
the Kernel Tuner ``time`` field is the median of them (the metric planforge
selects on). Failures keep their category: T4 has a field for it; a Kernel
Tuner cache gets Kernel Tuner's nearest error string in ``time`` plus the
exact category in an ``invalidity`` field that Kernel Tuner ignores. Rejected
candidates (outside the space) are written as ``constraints`` (T4) and
``InvalidConfig`` (Kernel Tuner).

``export_records`` is the entry point for a records database; ``to_t4`` and
``to_kernel_tuner`` turn any rows of (configuration, outcome) into documents.
"""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..outcome import Outcome
from .records import Records, RecordsError

FORMATS = ("t4", "kernel_tuner")
T4_SCHEMA_VERSION = "1.0.0"
_KT_ERROR = {"compile": "CompilationFailedConfig", "runtime": "RuntimeFailedConfig",
             "timeout": "RuntimeFailedConfig", "correctness": "RuntimeFailedConfig", "constraints": "InvalidConfig"}
_MS = 1e3


class ExportError(ValueError):
    """Records that cannot be exported as asked (the message says why)."""


@dataclass(frozen=True)
class Row:
    """One configuration and its outcome; ``created`` is a Unix time, if known."""

    config: dict[str, Any]
    outcome: Outcome
    created: float | None = None


def _timestamp(t: float | None) -> str:
    return datetime.fromtimestamp(t if t is not None else 0, tz=timezone.utc).isoformat()


def _category(o: Outcome) -> str:
    return "correct" if o.ok else (o.category or "constraints")


def _names(rows: Sequence[Row]) -> list[str]:
    if not rows:
        raise ExportError("nothing to export: no measurements match")
    names = list(rows[0].config)
    for r in rows:
        if set(r.config) != set(names):
            raise ExportError(f"configurations differ in their parameters ({sorted(names)} vs {sorted(r.config)}); "
                              "export one task at a time")
    return names


def to_t4(rows: Sequence[Row]) -> dict[str, Any]:
    """A T4 results document (schema 1.0.0) of ``rows``."""
    names = _names(rows)
    results = []
    for r in rows:
        o = r.outcome
        ms = [t * _MS for t in o.times]
        value: Any = o.metric * _MS if o.ok else (o.message or _category(o))
        results.append({
            "timestamp": _timestamp(r.created),
            "configuration": {n: r.config[n] for n in names},
            "times": {"runtimes": ms},
            "invalidity": _category(o),
            "correctness": 1 if o.ok else 0,
            "measurements": [{"name": "time", "value": value, "unit": "ms"}],
            "objectives": ["time"],
        })
    return {"schema_version": T4_SCHEMA_VERSION, "metadata": {"timeunit": "milliseconds"}, "results": results}


def _key_text(v: Any) -> str:
    return str(v)


def to_kernel_tuner(rows: Sequence[Row], params: Sequence[tuple[str, Sequence[Any]]] | None = None,
                    device_name: str = "", kernel_name: str = "", problem_size: Any = None) -> dict[str, Any]:
    """A Kernel Tuner cache document of ``rows``.

    Parameters:
        params: (name, values) of every tuning parameter, in order; default the
            names of the first row, each with the values the rows use (sorted).
        device_name, kernel_name: written to the header (Kernel Tuner checks
            them when it resumes a cache, not when it simulates).
        problem_size: written to the header (default ``[1]``: planforge's
            records do not carry one, and Kernel Tuner needs a value).
    """
    names = _names(rows)
    if params is None:
        params = []
        for n in names:
            vals = list(dict.fromkeys(r.config[n] for r in rows))
            try:
                vals.sort()
            except TypeError:
                pass
            params.append((n, vals))
    keys = [n for n, _ in params]
    if set(keys) != set(names):
        raise ExportError(f"parameters {sorted(keys)} do not match the configurations' {sorted(names)}")
    cache: dict[str, Any] = {}
    for r in rows:
        o = r.outcome
        key = ",".join(_key_text(r.config[n]) for n in keys)
        if key in cache:
            raise ExportError(f"configuration {key!r} appears twice")
        ms = [t * _MS for t in o.times]
        rec: dict[str, Any] = {n: r.config[n] for n in keys}
        rec["time"] = o.metric * _MS if o.ok else _KT_ERROR[_category(o)]
        rec["times"] = ms
        if not o.ok:
            rec["invalidity"] = _category(o)
        rec.update({"compile_time": 0, "verification_time": 0, "benchmark_time": sum(ms), "strategy_time": 0,
                    "framework_time": 0, "timestamp": _timestamp(r.created)})
        cache[key] = rec
    return {"device_name": device_name, "kernel_name": kernel_name,
            "problem_size": problem_size if problem_size is not None else [1],
            "tune_params_keys": keys, "tune_params": {n: list(v) for n, v in params}, "objective": "time",
            "cache": cache}


def write_json(doc: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``doc`` to ``path`` (gzipped when the name ends in ``.gz``)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1)
    if p.name.endswith(".gz"):
        with gzip.open(p, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        p.write_text(text)
    return p


@dataclass
class Export:
    """What ``export_records`` wrote."""

    path: Path
    format: str
    task: str
    target: str
    rows: int


def rows_from_records(db: Records, task: str | None = None, target: str | None = None,
                      run_id: str | None = None) -> tuple[list[Row], str, str]:
    """The latest outcome of each candidate of one task on one target.

    ``task`` and ``target`` may be left out when the database (or ``run_id``)
    holds only one; otherwise the error lists the choices. Returns (rows,
    task, target)."""
    where = {k: v for k, v in (("task", task), ("target", target), ("run_id", run_id)) if v is not None}
    recs = list(db.records(**where))
    if not recs:
        raise ExportError(f"no measurements in {db.path} match " + (", ".join(f"{k}={v}" for k, v in where.items())
                                                                   or "(the database is empty)"))
    tasks = sorted({r.task for r in recs})
    targets = sorted({r.target for r in recs})
    if len(tasks) > 1:
        raise ExportError(f"{db.path} holds several tasks ({', '.join(tasks)}); choose one with --task")
    if len(targets) > 1:
        raise ExportError(f"{db.path} holds measurements from several targets ({', '.join(targets)}); times from "
                          "different machines are never mixed: choose one with --target")
    latest: dict[str, Row] = {}
    for r in recs:  # in insertion order: a later measurement of a candidate replaces an earlier one
        latest.pop(r.fingerprint, None)
        latest[r.fingerprint] = Row(r.candidate, r.outcome, r.created)
    return list(latest.values()), tasks[0], targets[0]


def export_records(db_path: str | os.PathLike, fmt: str, out: str | os.PathLike, task: str | None = None,
                   target: str | None = None, run_id: str | None = None, problem_size: Any = None) -> Export:
    """Write the measurements of one task on one target from a records database
    to ``out`` as ``fmt`` (``t4`` or ``kernel_tuner``)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    p = Path(db_path)
    if not p.is_file():
        raise ExportError(f"{p}: no such records database")
    try:
        db = Records(p, readonly=True)
    except RecordsError as e:
        raise ExportError(str(e)) from None
    try:
        rows, task_key, target_key = rows_from_records(db, task, target, run_id)
    finally:
        db.close()
    if fmt == "t4":
        doc = to_t4(rows)
    else:
        doc = to_kernel_tuner(rows, device_name=target_key, kernel_name=task_key, problem_size=problem_size)
    return Export(write_json(doc, out), fmt, task_key, target_key, len(rows))


def rows_from_entries(names: Sequence[str], entries: Iterable[tuple[tuple, Outcome]]) -> list[Row]:
    """Rows of a recording's entries (configuration tuples in ``names`` order)."""
    return [Row(dict(zip(names, cfg)), o) for cfg, o in entries]
