"""The HTML report: one self-contained file (plots as embedded PNG, inline CSS, nothing fetched).

``write_report(folder)`` reads ``folder/run.json`` (written by every tune with
an output folder) and writes ``folder/report.html``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import plots
from .run import load_run
from .summary import LOW_SPEARMAN, fmt_time

REPORT_FILE = "report.html"
TOP_K = 4


def _knobs(plan: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in plan.items())


def _num(v: Any) -> str:
    """Counts with separators up to a trillion, then scientific; floats to 3 significant digits."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        if abs(v) < 10**12:
            return f"{v:,}"
        return f"{v:.3g}" if abs(v) < 10**300 else f"~1e{len(str(abs(v))) - 1}"
    return f"{v:.3g}"


def render(run: dict[str, Any]) -> str:
    """The report's HTML for run data ``run`` (as ``load_run`` returns it)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    targets = run["environment"]["targets"]
    figs: dict[str, dict[str, Any]] = {}
    for key, t in run["tasks"].items():
        profile = (targets.get(key) or {}).get("profile")
        k = max(len(t["ranked"]), 1) if t["ranked"] else TOP_K
        f = {"curve": plots.curve(t), "funnel": plots.funnel(t), "proxy": plots.proxy(t, k) if t["proxy"] else None,
             "roofline": plots.roofline(t, profile), "topk": plots.proxy_topk(t, k) if t["proxy"] else []}
        for kind in ("curve", "funnel", "proxy", "roofline"):
            f[f"{kind}_why"] = plots.why_not(kind, t, profile)
        figs[key] = f
    tmpl = env.get_template("report.html.j2")
    return tmpl.render(run=run, plots=figs, ft=fmt_time, knobs=_knobs, num=_num, low_spearman=LOW_SPEARMAN,
                       target=lambda key: targets.get(key) or {"fingerprint": "?"},
                       rejected=lambda t: {r["rank"]: r["reasons"] for r in t["rejected"]})


def write_report(folder: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Render ``folder/run.json`` to ``out`` (default ``folder/report.html``); RunError without a run."""
    run = load_run(folder)
    base = Path(folder)
    path = Path(out) if out is not None else (base.parent if base.is_file() else base) / REPORT_FILE
    html = render(run)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, path)
    return path
