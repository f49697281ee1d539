"""``run.json``: what a tuning run did, for the report.

The spec keeps only what is reproducible (same seed, same bytes); wall times,
the full trial list, the command line and the machine's profile vary from run
to run, so they live here, next to ``spec.json``. ``planforge report DIR``
renders ``DIR/run.json`` into ``DIR/report.html``.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
from pathlib import Path
from typing import Any

from ..costmodel.funnel import Analytic
from ..results import toolchain
from .summary import running_steps, step_name

RUN_VERSION = 1
RUN_FILE = "run.json"


class RunError(ValueError):
    """A folder without a readable ``run.json``."""


def _num(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def task_work(task) -> dict[str, Any] | None:
    """The task's useful FLOPs and compulsory bytes, when planforge can count them (None for table tasks)."""
    return task.backend.work()


def _intensities(task, cands) -> list[float | None]:
    """Per-candidate arithmetic intensity from the analytic model (FLOPs per byte from the slowest level)."""
    if not isinstance(task.cost_model, Analytic) or not cands:
        return [None] * len(cands)
    try:
        return [_num(float(v)) for v in task.cost_model.estimate(cands).intensity]
    except Exception:  # a model that cannot estimate these points: the task-level intensity is used
        return [None] * len(cands)


def _measurement(o) -> dict[str, Any]:
    """What a latency is made of: median, spread (IQR / median), repeats, and the load while it was taken."""
    return {"latency_s": o.metric, "spread": _num(o.spread), "repeats": len(o.times),
            "other_load": o.extra.get("other_load")}


def _traffic(program: list[dict] | None) -> float | None:
    """Bytes a graph plan moves: what each step that runs reads and writes (fp32), folded constants read once per
    step that uses them; None for a kernel (its cost model gives its intensity). A fused plan moves fewer."""
    if not program:
        return None
    size = {s["cls"]: 4.0 * math.prod(s["shape"]) for s in program if s.get("shape")}
    return sum(size.get(s["cls"], 0.0) + sum(size.get(i, 0.0) for i in s["inputs"])
               for s in running_steps(program)) or None


def importance(space, cands, metrics, top: int = 8) -> dict[str, float]:
    """Share of a LightGBM regression's gain (log latency on the knobs) per knob, the ``top`` largest, for knobs
    that vary among the measured plans; {} with fewer than 8 measurements (too few to say anything)."""
    import lightgbm as lgb
    import numpy as np

    from ..costmodel.learned import knob_matrix

    if len(cands) < 8:
        return {}
    x = knob_matrix(space, cands)
    vary = [i for i in range(x.shape[1]) if len(set(x[:, i])) > 1]
    if not vary:
        return {}
    params = {"objective": "regression", "num_leaves": 7, "min_data_in_leaf": 2, "min_data_in_bin": 1,
              "verbose": -1, "seed": 0, "deterministic": True, "num_threads": 1}
    model = lgb.train(params, lgb.Dataset(x[:, vary], np.log(metrics), params={"verbose": -1}), num_boost_round=40)
    gain = model.feature_importance("gain")
    total = float(gain.sum())
    if total <= 0:
        return {}
    shares = sorted(((float(g) / total, space.knobs[i].name) for g, i in zip(gain, vary)), reverse=True)[:top]
    return {name: round(v, 4) for v, name in shares if v > 0}


def knob_label(space, name: str, template: str | None) -> str:
    """A knob as the op and parameter it belongs to: ``c_T10`` -> "T10: implementation", ``k_T10_3`` ->
    "T10 fused_mlp#3: setting", a kernel template's ``tile_m`` -> "gemm.tile_m"."""
    if name.startswith("c_"):
        return f"{name[2:]}: which implementation"
    if name.startswith("k_") and name.count("_") == 2:
        cls, idx = name[2:].rsplit("_", 1)
        gene = next((k for k in space.knobs if k.name == f"c_{cls}"), None)
        what = gene.values[int(idx)] if gene is not None and idx.isdigit() and int(idx) < len(gene.values) else idx
        return f"{cls} {what}: setting"
    return f"{template}.{name}" if template else name


def plan_steps(t, c) -> list[dict[str, Any]]:
    """The plan as the steps that run, each with its knobs: a graph plan's kernels and library calls (folded
    constants and views left out), or a kernel's template with its settings."""
    program = t.backend.program(c)
    if program is None:
        return [{"what": t.backend.describe().get("template") or t.key, "knobs": c.as_dict()}]
    return [{"what": step_name(s), "cls": s["cls"], "knobs": s.get("knobs") or {}} for s in running_steps(program)]


def task_run(tr, label) -> dict[str, Any]:
    """One task's run data: trials with wall times, proxy scores, ranked, walk, libraries, funnel."""
    r, t = tr.result, tr.task
    trials = [x for x in r.trials]
    measured = [x for x in trials if x.outcome.ok]
    proxy: dict[str, float] = {}
    if t.cost_model is not None and measured:
        preds = t.cost_model.predict([x.candidate for x in measured])
        proxy = {x.candidate.fingerprint: _num(float(p)) for x, p in zip(measured, preds)}
    inten = dict(zip((x.candidate.fingerprint for x in measured), _intensities(t, [x.candidate for x in measured])))
    work = task_work(t)
    if work and work.get("flops"):  # a graph plan's own traffic, where the cost model gives no intensity
        for x in measured:
            fp = x.candidate.fingerprint
            if inten.get(fp) is None and (b := _traffic(t.backend.program(x.candidate))):
                inten[fp] = work["flops"] / b
    searched = {x.candidate.fingerprint: x.outcome for x in measured}  # the search's own measurement of each plan
    rows = []
    for x in trials:
        o = x.outcome
        fp = x.candidate.fingerprint
        rows.append({"n": x.n, "wall_s": x.wall_s, "fingerprint": fp, "plan": x.candidate.as_dict(),
                     "label": label(tr, x.candidate), "status": o.status, "category": o.category,
                     "latency_s": o.metric, "spread": o.spread, "cached": x.cached,
                     "message": o.message[:300], "proxy": proxy.get(fp), "intensity": inten.get(fp),
                     "repeats": len(o.times), "other_load": o.extra.get("other_load"),
                     "recheck": o.extra.get("recheck")})
    ranked = tr.ranked or r.ranked
    walk = tr.walk
    rejected = list(walk.rejected) if walk else (list(tr.error.rejected) if tr.error else [])
    d: dict[str, Any] = {
        "weight": t.weight,
        "strategy": tr.strategy,
        "stop_reason": r.stop_reason,
        "evaluations": r.evaluations,
        "duplicates": r.duplicates,
        "search_seconds": r.seconds,
        "counts": dict(sorted(r.counts.items())),
        "curve": [[n, m] for n, m in r.curve],
        "space": {"size": t.space.size, "knobs": len(t.space.knobs)},
        "trials": rows,
        "ranked": [{"rank": i, "latency_s": e.metric, "fingerprint": e.candidate.fingerprint,
                    "plan": e.candidate.as_dict(), "label": label(tr, e.candidate),
                    **({k: v for k, v in _measurement(e.outcome).items() if k != "latency_s"} if e.outcome else {}),
                    "search": _measurement(searched[e.candidate.fingerprint])
                    if e.candidate.fingerprint in searched else None}
                   for i, e in enumerate(ranked, start=1)],
        "remeasured": tr.ranked is not None and tr.ranked is not r.ranked,
        "accepted_rank": walk.accepted.rank if walk else None,
        "rejected": [{"rank": f.rank, "reasons": list(f.reasons)} for f in rejected],
        "error": str(tr.error) if tr.error else None,
        "baselines": {n: (_measurement(o) if o.ok else {"failed": o.category, "message": o.message[:300]})
                      for n, o in sorted(tr.baselines.items())},
        "best_library": list(tr.best_library) if tr.best_library else None,
        "ratio_vs_library": tr.ratio_vs_library,
        "fallback": tr.fallback,
        "selected_latency_s": tr.selected_latency,
        "saved_s": tr.saved_s,
        "proxy": ({"name": t.cost_model.name, "spearman": tr.proxy_spearman,
                   "unit": "s" if isinstance(t.cost_model, Analytic) else "score"}
                  if t.cost_model is not None else None),
        "importance": importance(t.space, [x.candidate for x in measured], [x.outcome.metric for x in measured]),
        "knob_labels": {k.name: knob_label(t.space, k.name, t.backend.describe().get("template"))
                        for k in t.space.knobs},
        "funnel": list(tr.funnel),
        "info": {k: v for k, v in t.info.items() if k != "saturation"},
        "work": work,
        "accepted": None,
        "l2": tr.l2,  # the L2 phase: each proposal, who proposed it, its fate and when (None: L2 did not run)
    }
    if walk:
        d["accepted"] = {"rank": walk.accepted.rank, "latency_s": walk.accepted.metric,
                         "fingerprint": walk.accepted.candidate.fingerprint, "plan": walk.accepted.candidate.as_dict(),
                         "label": label(tr, walk.accepted.candidate), "peak_bytes": walk.accepted.peak_bytes,
                         "steps": plan_steps(t, walk.accepted.candidate)}
        acc_entry = next((e for e in ranked if e.candidate.fingerprint == walk.accepted.candidate.fingerprint), None)
        if acc_entry is not None and acc_entry.outcome is not None:
            d["accepted"].update({k: v for k, v in _measurement(acc_entry.outcome).items() if k != "latency_s"})
    return d


def environment(res) -> dict[str, Any]:
    from importlib import metadata

    tools = toolchain()
    for dist in ("torch", "matplotlib", "jinja2"):  # from package metadata: importing torch costs seconds
        try:
            tools.setdefault(dist, metadata.version(dist))
        except metadata.PackageNotFoundError:  # not installed: not part of this run's toolchain
            pass
    targets = {}
    for t in res.workload.tasks:
        b = t.backend
        targets[t.key] = {"backend": b.name, "fingerprint": b.fingerprint, "profile": b.device_profile()}
    return {"toolchain": tools, "platform": platform.platform(), "machine": platform.machine(),
            "targets": targets}


def build_run(res, command: str = "") -> dict[str, Any]:
    """The run data of a ``TuneResult`` as plain JSON values."""
    from .. import __version__
    from .summary import plan_label

    return {
        "run_version": RUN_VERSION,
        "planforge_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "workload": res.workload.name,
        "description": res.workload.description,
        "manifest": {**res.workload.manifest.to_json(), "key": res.workload.manifest.key},
        "run_id": res.run_id,
        "resumed": res.resumed,
        "ok": res.ok,
        "notes": list(res.notes),
        "search_seconds": res.seconds,
        "saved_s_per_run": res.saved_s,
        "break_even_runs": _num(res.break_even),
        "spec": "spec.json" if res.spec_path else None,
        "records": str(res.records_path),
        "environment": environment(res),
        "tasks": {tr.task.key: {**task_run(tr, plan_label),
                                # the weight formats, measured error and accuracy budget (None: none stated)
                                "quant": ((res.spec or {}).get("tasks", {}).get(tr.task.key) or {}).get("quant")}
                  for tr in res.tasks},
        "end_to_end": res.end_to_end.to_json() if res.end_to_end is not None else None,
    }


def write_run(res, out: str | os.PathLike, command: str = "") -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RUN_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(build_run(res, command), indent=1, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def load_run(folder: str | os.PathLike) -> dict[str, Any]:
    """``folder/run.json`` (``folder`` may also name the file); RunError with the reason otherwise."""
    p = Path(folder)
    path = p if p.is_file() else p / RUN_FILE
    if not p.exists():
        raise RunError(f"{p}: no such folder")
    if not path.is_file():
        raise RunError(f"{p} holds no {RUN_FILE}: it is not the output folder of a `planforge tune` run "
                       f"(run `planforge tune --out {p}` first)")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunError(f"{path}: not readable as JSON ({e})") from None
    if not isinstance(data, dict) or "tasks" not in data or "run_version" not in data:
        raise RunError(f"{path}: not a planforge run file (no run_version/tasks)")
    if data["run_version"] > RUN_VERSION:
        raise RunError(f"{path}: run file version {data['run_version']} is newer than this planforge "
                       f"reads ({RUN_VERSION}); upgrade planforge")
    return with_defaults(data)


_MEASUREMENT = {"spread": None, "repeats": None, "other_load": None}


def with_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """A run file written before a field existed reads as if the field were unknown (None, empty)."""
    data.setdefault("end_to_end", None)
    for t in data["tasks"].values():
        t.setdefault("importance", {})
        t.setdefault("l2", None)
        t.setdefault("quant", None)
        t.setdefault("knob_labels", {})
        for x in t.get("trials", []):
            for k in ("repeats", "other_load", "recheck"):
                x.setdefault(k, None)
        for r in t.get("ranked", []):
            for k, v in {**_MEASUREMENT, "search": None}.items():
                r.setdefault(k, v)
        if t.get("accepted"):
            for k, v in {**_MEASUREMENT, "steps": None}.items():
                t["accepted"].setdefault(k, v)
        for b in t.get("baselines", {}).values():
            if "latency_s" in b:
                for k, v in _MEASUREMENT.items():
                    b.setdefault(k, v)
    return data


def print_warnings(box: dict[str, Any], console) -> int:
    """The summary box's trust warnings (``verdict.summarize``), one line each, printed literally; how many."""
    from rich.text import Text

    n = 0
    for key, s in box["tasks"].items():
        for w in s["warnings"]:
            console.print(Text(f"warning ({key}): {w}", style="yellow"))
            n += 1
    return n


def print_run_summary(run: dict[str, Any], console=None) -> None:
    """A short terminal summary of run data (what ``planforge report`` prints next to the HTML): the summary
    box's answers and warnings, printed literally (plan labels hold square brackets)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from .verdict import summarize

    con = console or Console()
    con.print(Text(f"{run['workload']} ({run['description']}); run {run['run_id']}, {run['created']}"
                   + ("" if run["ok"] else " (failed)"), style="bold"))
    box = summarize(run)
    table = Table()
    for col in ("task", "plan", "latency", "against libraries", "search"):
        table.add_column(col)
    for key, s in box["tasks"].items():
        cv = s["convergence"]
        table.add_row(Text(key), Text(s["plan"]), Text(s.get("latency", "-")), Text(s.get("speed", "-")),
                      Text(("converged: " if cv["converged"] else "not converged: ") + cv["text"]))
    con.print(table)
    print_warnings(box, con)
    if box["end_to_end"]:
        con.print(Text(f"end to end: {box['end_to_end']['latency']}: {box['end_to_end']['speed']}"))
    con.print(Text(f"break-even: {box['break_even']}"))
