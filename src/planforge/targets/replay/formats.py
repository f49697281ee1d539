"""Readers for recorded tuning spaces: Kernel Tuner cache files, T4 result files and T1 input files.

A *recording* is what a brute-force (or partial) tuning run left behind: every
configuration it tried, with the times it measured or the way it failed. Two
formats are read, gzipped or not (detected from the content, not the name):

- Kernel Tuner cache: a header (``device_name``, ``kernel_name``,
  ``problem_size``, ``tune_params_keys``, ``tune_params``, ``objective``) and
  ``cache``, a map from ``"v1,v2,..."`` to a record with the parameter values,
  ``time`` (ms, or an error string such as ``"RuntimeFailedConfig"``) and
  ``times`` (the raw repeats, ms). An unclosed cache (a run that was cut off,
  ending in ``,``) is read as Kernel Tuner reads it.
- T4 (the auto-tuning community's result format): ``{schema_version,
  metadata{timeunit}, results[]}``; each result has ``configuration``,
  ``times{runtimes[]}``, ``invalidity`` (``correct`` or a failure category)
  and ``measurements``.

A T1 file (``{General, ConfigurationSpace{TuningParameters, Conditions}}``)
describes a kernel's parameters, their values and its restrictions; when one
is given, the space takes its parameter order, value lists and restriction
expressions from it. Value lists written as Python expressions (``"[32 * i
for i in range(1, 32)]"``) are evaluated with the restriction parser, never
with ``eval``.

Every problem with a file is a ``FormatError`` that names the file and what
is wrong with it.
"""
from __future__ import annotations

import ast
import gzip
import json
import math
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...outcome import CATEGORIES, Outcome
from ...space import RestrictionError
from ...space.restrict import compile_expr, parse

Value = Any
Config = tuple  # parameter values in the recording's parameter order

# seconds per unit, for the time units the two formats use (T4 writes "miliseconds")
TIME_UNITS = {
    "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
    "ms": 1e-3, "millisecond": 1e-3, "milliseconds": 1e-3, "milisecond": 1e-3, "miliseconds": 1e-3,
    "us": 1e-6, "microsecond": 1e-6, "microseconds": 1e-6,
    "ns": 1e-9, "nanosecond": 1e-9, "nanoseconds": 1e-9,
}

# Kernel Tuner's error strings -> T4 categories. InvalidConfig marks a configuration
# that broke a restriction or a device limit: it is outside the space, not a failure.
KT_ERRORS = {
    "CompilationFailedConfig": "compile",
    "RuntimeFailedConfig": "runtime",
    "InvalidConfig": "constraints",
    "ErrorConfig": "runtime",
    "TimeoutConfig": "timeout",
}
T4_INVALIDITY = ("correct", *CATEGORIES)


class FormatError(ValueError):
    """A recorded-space or T1 file that cannot be read; the message names the file."""


@dataclass(frozen=True)
class Param:
    """One tuning parameter: its name, its values (in knob order) and its knob kind."""

    name: str
    values: tuple[Value, ...]
    kind: str = "categorical"


@dataclass
class T1:
    """A T1 input file: parameters (with values and kinds) and restriction expressions."""

    path: Path
    name: str
    params: list[Param]
    restrictions: list[str]


@dataclass
class Recording:
    """A recorded space: parameters, and the outcome of every recorded configuration.

    ``entries`` maps a configuration (a tuple of values in ``params`` order) to
    its outcome: measured (times in seconds) or invalid with its category. An
    entry whose category is ``constraints`` is a configuration the recording
    tool found outside the space; it is kept so that nothing is lost, but it is
    not part of the replayed space.
    """

    path: Path
    format: str  # "kernel_tuner" | "t4"
    params: list[Param]
    entries: dict[Config, Outcome]
    meta: dict[str, Any] = field(default_factory=dict)
    restrictions: list[str] = field(default_factory=list)
    t1: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def label(self) -> str:
        """A short name: the folder and the file name without its extensions."""
        stem = self.path.name
        for ext in (".gz", ".json"):
            if stem.endswith(ext):
                stem = stem[: -len(ext)]
        return f"{self.path.parent.name}/{stem}" if self.path.parent.name else stem


# -- reading JSON ------------------------------------------------------------------


def _err(path: Path, what: str) -> FormatError:
    return FormatError(f"{path}: {what}")


def read_json(path: str | os.PathLike) -> Any:
    """The JSON document in ``path``, gunzipped when it is gzip data.

    A Kernel Tuner cache cut off mid-run (trailing ``,``, no closing braces) is
    closed the way Kernel Tuner closes it."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise _err(p, "no such file") from None
    except IsADirectoryError:
        raise _err(p, "is a directory, not a file") from None
    except OSError as e:
        raise _err(p, f"cannot be read ({e.strerror or e})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise _err(p, f"is not a valid gzip file ({e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _err(p, f"is not UTF-8 text (byte {e.start}); expected a JSON file") from None
    if not text.strip():
        raise _err(p, "is empty; expected a JSON document")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        stripped = text.rstrip()
        if '"cache"' in text and (stripped.endswith(",") or not stripped.endswith("}")):
            try:
                return json.loads(stripped.rstrip(",") + "}\n}")
            except json.JSONDecodeError:
                pass
        raise _err(p, f"is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None


def detect_format(doc: Any) -> str | None:
    """``"kernel_tuner"``, ``"t4"``, ``"t1"`` or None for an unknown document."""
    if not isinstance(doc, dict):
        return None
    if "cache" in doc and "tune_params_keys" in doc:
        return "kernel_tuner"
    if "results" in doc and ("schema_version" in doc or "metadata" in doc):
        return "t4"
    if "ConfigurationSpace" in doc:
        return "t1"
    return None


# -- values and parameters ---------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _kind_of(values: list[Value]) -> str:
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        if len(values) > 1 and all(v > 0 and v & (v - 1) == 0 for v in values):
            return "pow2"
        return "int"
    return "categorical"


def infer_param(name: str, values: list[Value]) -> Param:
    """A parameter from its observed values: integers are ordered (sorted, kind
    ``int`` or ``pow2``); anything else keeps its order and is categorical."""
    kind = _kind_of(values)
    vals = sorted(values) if kind != "categorical" else list(values)
    return Param(name, tuple(vals), kind)


def _hashable(path: Path, where: str, v: Any) -> Value:
    if isinstance(v, (str, int, float, bool)):
        return v
    raise _err(path, f"{where}: value {v!r} is not a number, string or boolean")


# -- Kernel Tuner cache ---------------------------------------------------------------


def _kt_time_outcome(path: Path, key: str, rec: dict, unit: float) -> Outcome:
    t = rec.get("time")
    if isinstance(t, str):
        # planforge's own exports keep the exact category beside Kernel Tuner's error string
        cat = rec["invalidity"] if rec.get("invalidity") in CATEGORIES else KT_ERRORS.get(t)
        if cat is None:
            low = t.lower()
            cat = next((c for word, c in (("compil", "compile"), ("runtime", "runtime"), ("timeout", "timeout"),
                                          ("invalid", "constraints"), ("correct", "correctness")) if word in low), None)
        if cat is None:
            raise _err(path, f"cache entry {key!r}: unknown error {t!r} in 'time' "
                             f"(known: {', '.join(KT_ERRORS)})")
        return Outcome.invalid(cat, t)
    if not _is_number(t):
        raise _err(path, f"cache entry {key!r}: 'time' is {t!r}; expected a number (ms) or an error string")
    times = rec.get("times")
    raw = times if isinstance(times, list) and times else [t]
    if not all(_is_number(x) and math.isfinite(x) and x > 0 for x in raw) or not (math.isfinite(t) and t > 0):
        raise _err(path, f"cache entry {key!r}: times must be positive finite numbers, got time={t!r}, "
                         f"times={times!r}")
    return Outcome.measured([x * unit for x in raw])


def read_kernel_tuner(path: Path, doc: dict) -> Recording:
    keys = doc.get("tune_params_keys")
    tp = doc.get("tune_params")
    cache = doc.get("cache")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise _err(path, "'tune_params_keys' must be a non-empty list of parameter names")
    if len(set(keys)) != len(keys):
        raise _err(path, f"'tune_params_keys' repeats a name: {keys}")
    if not isinstance(tp, dict):
        raise _err(path, "'tune_params' must map each parameter to its list of values")
    if set(tp) != set(keys):
        raise _err(path, f"'tune_params' names {sorted(tp)} differ from 'tune_params_keys' {sorted(keys)}")
    if not isinstance(cache, dict):
        raise _err(path, "'cache' must map configuration keys to records")
    declared: dict[str, list] = {}
    for k in keys:
        vals = tp[k]
        if not isinstance(vals, list) or not vals:
            raise _err(path, f"'tune_params' of {k!r} must be a non-empty list of values")
        declared[k] = [_hashable(path, f"'tune_params' of {k!r}", v) for v in vals]
    by_text = {k: {str(v): v for v in declared[k]} for k in keys}
    canon = {k: {json.dumps(v): v for v in declared[k]} for k in keys}
    unit = TIME_UNITS["ms"]
    entries: dict[Config, Outcome] = {}
    for key, rec in cache.items():
        if not isinstance(rec, dict):
            raise _err(path, f"cache entry {key!r} is not a record (an object with the parameter values and 'time')")
        if "time" not in rec:
            raise _err(path, f"cache entry {key!r} has no 'time'")
        parts = key.split(",")
        config = []
        for i, k in enumerate(keys):
            if k in rec:
                v = rec[k]
            elif len(parts) == len(keys) and parts[i] in by_text[k]:
                v = by_text[k][parts[i]]
            else:
                raise _err(path, f"cache entry {key!r} has no value for parameter {k!r}")
            c = json.dumps(v) if isinstance(v, (str, int, float, bool)) else None
            if c not in canon[k] and _is_number(v):  # 1.0 recorded for a declared 1
                c = next((json.dumps(d) for d in declared[k] if _is_number(d) and d == v), c)
            if c not in canon[k]:
                raise _err(path, f"cache entry {key!r}: {k}={v!r} is not among the declared values {declared[k]}")
            config.append(canon[k][c])
        cfg = tuple(config)
        if cfg in entries:
            raise _err(path, f"cache entry {key!r} repeats the configuration of another entry")
        entries[cfg] = _kt_time_outcome(path, key, rec, unit)
    if not entries:
        raise _err(path, "the cache holds no configurations")
    params = [infer_param(k, declared[k]) for k in keys]
    meta = {k: doc.get(k) for k in ("device_name", "kernel_name", "problem_size", "objective") if k in doc}
    return Recording(path, "kernel_tuner", params, entries, meta)


# -- T4 ----------------------------------------------------------------------------


def _t4_runtime_outcome(path: Path, i: int, res: dict, unit: float) -> Outcome:
    inv = res.get("invalidity")
    if inv not in T4_INVALIDITY:
        raise _err(path, f"result {i}: 'invalidity' is {inv!r}; expected one of {', '.join(T4_INVALIDITY)}")
    if inv != "correct":
        msgs = [m.get("value") for m in res.get("measurements") or () if isinstance(m, dict)]
        return Outcome.invalid(inv, next((m for m in msgs if isinstance(m, str)), ""))
    times = res.get("times")
    runtimes = times.get("runtimes") if isinstance(times, dict) else None
    if not runtimes:
        meas = [m.get("value") for m in res.get("measurements") or ()
                if isinstance(m, dict) and m.get("name") in ("time", "runtime")]
        runtimes = [m for m in meas if _is_number(m)][:1]
    if not runtimes:
        raise _err(path, f"result {i} is 'correct' but has no runtimes (times.runtimes) and no time measurement")
    if not isinstance(runtimes, list) or not all(_is_number(x) and math.isfinite(x) and x > 0 for x in runtimes):
        raise _err(path, f"result {i}: runtimes must be a list of positive finite numbers, got {runtimes!r}")
    return Outcome.measured([x * unit for x in runtimes])


def read_t4(path: Path, doc: dict) -> Recording:
    results = doc.get("results")
    if not isinstance(results, list):
        raise _err(path, "'results' must be a list")
    if not results:
        raise _err(path, "'results' is empty: the file records no configuration")
    meta_in = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    unit_name = str(meta_in.get("timeunit", "milliseconds")).lower()
    if unit_name not in TIME_UNITS:
        raise _err(path, f"metadata.timeunit {unit_name!r} is not a known unit ({', '.join(sorted(TIME_UNITS))})")
    unit = TIME_UNITS[unit_name]
    names: list[str] | None = None
    seen: dict[str, list] = {}
    entries: dict[Config, Outcome] = {}
    for i, res in enumerate(results):
        if not isinstance(res, dict) or not isinstance(res.get("configuration"), dict):
            raise _err(path, f"result {i} has no 'configuration' object")
        conf = res["configuration"]
        if names is None:
            names = list(conf)
            if not names:
                raise _err(path, f"result {i} has an empty configuration")
            seen = {n: [] for n in names}
        elif set(conf) != set(names):
            raise _err(path, f"result {i}: configuration parameters {sorted(conf)} differ from the first "
                             f"result's {sorted(names)}")
        cfg = tuple(_hashable(path, f"result {i}, parameter {n!r}", conf[n]) for n in names)
        for n, v in zip(names, cfg):
            if v not in seen[n]:
                seen[n].append(v)
        if cfg in entries:
            raise _err(path, f"result {i} repeats the configuration {dict(zip(names, cfg))}")
        entries[cfg] = _t4_runtime_outcome(path, i, res, unit)
    assert names is not None
    params = [infer_param(n, seen[n]) for n in names]
    meta = {"schema_version": doc.get("schema_version"), "timeunit": unit_name}
    return Recording(path, "t4", params, entries, meta)


# -- T1 ----------------------------------------------------------------------------


def _eval_values(src: str) -> list[Value]:
    """A T1 value list: a list literal or a Python list expression built from
    list literals, ``+``, ``range`` and list comprehensions over a range, each
    element an expression the restriction parser accepts."""
    try:
        tree = ast.parse(src.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"syntax error at column {e.offset}: {e.msg}") from None
    text = src.strip()

    def scalar(node: ast.AST, env: dict[str, Any]) -> Value:
        expr = parse(ast.get_source_segment(text, node) or "", set(env))
        return compile_expr(expr)(env)

    def rng(node: ast.AST) -> range:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
                and 1 <= len(node.args) <= 3 and not node.keywords):
            raise ValueError(f"expected range(...), got {ast.get_source_segment(text, node)!r}")
        args = [scalar(a, {}) for a in node.args]
        if not all(isinstance(a, int) for a in args):
            raise ValueError("range() needs integer arguments")
        r = range(*args)
        if len(r) > 100_000:
            raise ValueError(f"range of {len(r)} values is too long")
        return r

    def values(node: ast.AST) -> list[Value]:
        if isinstance(node, (ast.List, ast.Tuple)):
            return [scalar(e, {}) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return values(node.left) + values(node.right)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "range":
                return list(rng(node))
            if node.func.id == "list" and len(node.args) == 1 and not node.keywords:
                return values(node.args[0])
        if isinstance(node, ast.ListComp) and len(node.generators) == 1:
            g = node.generators[0]
            if not isinstance(g.target, ast.Name) or g.is_async:
                raise ValueError("a comprehension must loop one name over range(...)")
            out = []
            for i in rng(g.iter):
                env = {g.target.id: i}
                if all(scalar(c, env) for c in g.ifs):
                    out.append(scalar(node.elt, env))
            return out
        raise ValueError(f"{ast.get_source_segment(text, node)!r} is not a list of values "
                         "(allowed: list literals, +, range(...), [expr for x in range(...)])")

    return values(tree)


_T1_TYPES = {"int": int, "float": float, "string": str, "str": str, "bool": bool}


def read_t1(path: str | os.PathLike) -> T1:
    """Parameters and restrictions from a T1 input file."""
    p = Path(path)
    doc = read_json(p)
    if detect_format(doc) != "t1":
        raise _err(p, "is not a T1 input file (no 'ConfigurationSpace')")
    cs = doc["ConfigurationSpace"]
    if not isinstance(cs, dict) or not isinstance(cs.get("TuningParameters"), list) or not cs["TuningParameters"]:
        raise _err(p, "'ConfigurationSpace.TuningParameters' must be a non-empty list")
    params: list[Param] = []
    for i, tp in enumerate(cs["TuningParameters"]):
        if not isinstance(tp, dict) or not isinstance(tp.get("Name"), str):
            raise _err(p, f"tuning parameter {i} has no 'Name'")
        name = tp["Name"]
        raw = tp.get("Values")
        try:
            vals = _eval_values(raw) if isinstance(raw, str) else raw
        except (ValueError, RestrictionError) as e:
            raise _err(p, f"parameter {name!r}: cannot read Values {raw!r}: {e}") from None
        if not isinstance(vals, list) or not vals:
            raise _err(p, f"parameter {name!r}: Values must be a non-empty list")
        typ = _T1_TYPES.get(str(tp.get("Type", "")).lower())
        if typ is int and all(_is_number(v) and float(v).is_integer() for v in vals):
            vals = [int(v) for v in vals]
        elif typ is float and all(_is_number(v) for v in vals):
            vals = [float(v) for v in vals]
        vals = [_hashable(p, f"parameter {name!r}", v) for v in vals]
        if len(set(map(json.dumps, vals))) != len(vals):
            raise _err(p, f"parameter {name!r}: Values repeat a value: {vals}")
        params.append(Param(name, tuple(vals), _kind_of(vals)))
    names = {x.name for x in params}
    if len(names) != len(params):
        raise _err(p, "tuning parameter names repeat")
    restrictions = []
    for i, c in enumerate(cs.get("Conditions") or []):
        expr = c.get("Expression") if isinstance(c, dict) else None
        if not isinstance(expr, str):
            raise _err(p, f"condition {i} has no 'Expression' string")
        try:
            parse(expr, names)
        except RestrictionError as e:
            raise _err(p, f"condition {i}: {e}") from None
        restrictions.append(expr.strip())
    general = doc.get("General") if isinstance(doc.get("General"), dict) else {}
    return T1(p, str(general.get("BenchmarkName", p.stem)), params, restrictions)


def find_t1(path: str | os.PathLike) -> Path | None:
    """The T1 file of a recording laid out as the benchmark hub does
    (``HUB/cachefiles/KERNEL/FILE`` beside ``HUB/kernels/KERNEL.json``), or None."""
    p = Path(path).resolve()
    kernel = p.parent.name
    for cand in (p.parent.parent.parent / "kernels" / f"{kernel}.json", p.parent / f"{kernel}.T1.json"):
        if cand.is_file():
            return cand
    return None


def _apply_t1(rec: Recording, t1: T1) -> None:
    """Take parameter order, values and restrictions from ``t1``, checking that
    the recording agrees with it."""
    mine, theirs = set(rec.names), {x.name for x in t1.params}
    if mine != theirs:
        raise _err(rec.path, f"parameters {sorted(mine)} differ from those of the T1 file {t1.path} "
                             f"({sorted(theirs)})")
    pos = [rec.names.index(x.name) for x in t1.params]
    entries: dict[Config, Outcome] = {}
    for cfg, o in rec.entries.items():
        new = tuple(cfg[i] for i in pos)
        for x, v in zip(t1.params, new):
            if v not in x.values:
                raise _err(rec.path, f"configuration {dict(zip(rec.names, cfg))}: {x.name}={v!r} is not among the "
                                     f"values of the T1 file {t1.path} ({list(x.values)})")
        entries[new] = o
    rec.params = list(t1.params)
    rec.entries = entries
    rec.restrictions = list(t1.restrictions)
    rec.t1 = t1.path


def read_recording(path: str | os.PathLike, t1: str | os.PathLike | None | bool = True) -> Recording:
    """Read a Kernel Tuner cache or T4 file.

    Parameters:
        t1: the kernel's T1 file; ``True`` (default) looks for it beside the
            recording as the benchmark hub lays it out (see ``find_t1``);
            ``False`` or ``None`` reads the recording alone.
    """
    p = Path(path)
    doc = read_json(p)
    fmt = detect_format(doc)
    if fmt == "kernel_tuner":
        rec = read_kernel_tuner(p, doc)
    elif fmt == "t4":
        rec = read_t4(p, doc)
    elif fmt == "t1":
        raise _err(p, "is a T1 input file (a kernel's parameters and restrictions), not recorded measurements; "
                      "give it as the T1 file of a Kernel Tuner cache or T4 file")
    else:
        what = f"an object with keys {sorted(doc)[:8]}" if isinstance(doc, dict) else f"a JSON {type(doc).__name__}"
        raise _err(p, f"is neither a Kernel Tuner cache (needs 'tune_params_keys' and 'cache') nor a T4 file "
                      f"(needs 'schema_version' and 'results'); found {what}")
    t1_path = find_t1(p) if t1 is True else (Path(t1) if t1 else None)
    if t1_path is not None:
        _apply_t1(rec, read_t1(t1_path))
    return rec
