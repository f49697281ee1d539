"""The HTML report: one self-contained file (plots as inline SVG, inline CSS, no scripts, nothing fetched).

``write_report(folder)`` reads ``folder/run.json`` (written by every tune with an output folder) and writes
``folder/report.html``. It opens with the summary box (``report/verdict.py``): the answer first.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from . import plots
from .run import load_run, with_defaults
from .summary import LOW_SPEARMAN, fmt_bytes, fmt_si, fmt_time, quant_line
from .verdict import BUSY, summarize

REPORT_FILE = "report.html"
TOP_K = 4


def _natural_key(s: str) -> list:
    """``k_T9_2`` before ``k_T10_0``: numbers inside names compare as numbers."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


def _natural(names) -> list[str]:
    return sorted(names, key=_natural_key)


def _knobs(plan: dict[str, Any]) -> str:
    return ", ".join(f"{k}={plan[k]}" for k in _natural(plan))


def _num(v: Any) -> str:
    """Counts as "8.1 M", floats to 3 significant digits."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return fmt_si(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def render(run: dict[str, Any]) -> str:
    """The report's HTML for run data ``run`` (as ``load_run`` returns it)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    run = with_defaults(run)  # run data from an older planforge: unknown fields as None
    targets = run["environment"]["targets"]
    figs: dict[str, dict[str, Any]] = {}
    for key, t in run["tasks"].items():
        profile = (targets.get(key) or {}).get("profile")
        k = max(len(t["ranked"]), 1) if t["ranked"] else TOP_K
        f: dict[str, Any] = {"curve": plots.curve(t), "funnel": plots.funnel(t), "roofline": plots.roofline(t, profile),
                             "proxy": plots.proxy(t, k) if t["proxy"] else None,
                             "importance": plots.importance(t), "parallel": plots.parallel(t),
                             "topk": plots.proxy_topk(t, k) if t["proxy"] else [],
                             "proxy_stats": plots.proxy_stats(t, k) if t["proxy"] else None}
        for kind in ("curve", "funnel", "proxy", "roofline", "importance", "parallel"):
            f[f"{kind}_why"] = plots.why_not(kind, t, profile)
        figs[key] = f
    tmpl = env.get_template("report.html.j2")
    return tmpl.render(run=run, plots=figs, box=summarize(run), breakdown=plots.breakdown(run.get("end_to_end")),
                       ft=fmt_time, fb=fmt_bytes, knobs=_knobs, natural=_natural, num=_num, pct=_pct,
                       low_spearman=LOW_SPEARMAN, busy=BUSY,
                       target=lambda key: targets.get(key) or {"fingerprint": "?"},
                       quant=lambda t: quant_line(t["quant"]) if t["quant"] else None,
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
