"""The report's plots, drawn with matplotlib (Agg, imported on first use) and returned as base64 PNG.

Each function takes one task's run data (see ``report/run.py``) and returns
the PNG as base64 text, or None with nothing to draw; ``why_not`` says why.
"""
from __future__ import annotations

import base64
import io
import math
from typing import Any

from .summary import fmt_size

_DPI = 96
_INVALID = {"compile": "#d62728", "runtime": "#9467bd", "timeout": "#8c564b", "correctness": "#e377c2",
            "constraints": "#7f7f7f"}


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)  # no display here, and no window in a headless CI
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.tight_layout()  # one layout pass; bbox_inches="tight" would draw every figure twice
    fig.savefig(buf, format="png", dpi=_DPI)
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _best_so_far(trials: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys, best = [], [], math.inf
    for t in trials:
        if not t["n"]:
            continue
        if t["status"] == "measured":
            best = min(best, t["latency_s"])
        if math.isfinite(best):
            xs.append(t[key])
            ys.append(best)
    return xs, ys


def curve(task: dict[str, Any]) -> str | None:
    """Best-so-far latency vs evaluation number and vs wall time; every measurement faint, the stop marked."""
    evals = [t for t in task["trials"] if t["n"]]
    ok = [t for t in evals if t["status"] == "measured"]
    if not ok:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    for ax, key, xlabel in ((axes[0], "n", "evaluation"), (axes[1], "wall_s", "wall time (s)")):
        ax.scatter([t[key] for t in ok], [t["latency_s"] for t in ok], s=10, color="#1f77b4", alpha=0.3,
                   label="measured")
        bad = [t for t in evals if t["status"] != "measured"]
        if bad:
            top = max(t["latency_s"] for t in ok)
            for cat in sorted({t["category"] for t in bad}):
                pts = [t for t in bad if t["category"] == cat]
                ax.scatter([t[key] for t in pts], [top] * len(pts), marker="x", s=18,
                           color=_INVALID.get(cat, "k"), label=f"invalid: {cat}")
        xs, ys = _best_so_far(task["trials"], key)
        ax.step(xs, ys, where="post", color="#ff7f0e", lw=2, label="best so far")
        stop_x = evals[-1][key]
        ax.axvline(stop_x, color="k", ls="--", lw=1)
        ax.annotate("stopped", (stop_x, ys[-1]), xytext=(-4, 10), textcoords="offset points", ha="right",
                    fontsize=8)
        ax.set_xlabel(xlabel)
        ax.locator_params(axis="x", nbins=6)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("latency (s)")
    axes[0].legend(fontsize=7, loc="upper right")
    fig.suptitle(f"stopped: {task['stop_reason']}", fontsize=9)
    return _png(fig)


def _plottable(n) -> float:
    """A count as a float for an axis, capped at 1e100 (a log axis over more decades than that is unreadable and
    overflows matplotlib's tick locator; a 12-layer genome exceeds even a float): the label keeps the exact count."""
    try:
        return min(float(n), 1e100)
    except OverflowError:
        return 1e100


def funnel(task: dict[str, Any]) -> str | None:
    """The L0 funnel: points left after each stage, log scale."""
    stages = task.get("funnel") or []
    if not stages:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(stages) + 1))
    names = [s["stage"] for s in stages][::-1]
    counts = [max(_plottable(s["count"]), 0.5) for s in stages][::-1]
    ax.barh(names, counts, color="#2ca02c")
    for i, s in enumerate(stages[::-1]):
        ax.annotate(fmt_size(s["count"]), (counts[i], i), xytext=(4, 0), textcoords="offset points", va="center",
                    fontsize=8)
    if max(counts) / min(counts) > 50:
        ax.set_xscale("log")
        ax.set_xlim(left=min(counts) / 2, right=max(counts) * 20)
        ax.set_xlabel("points left (log scale)")
    else:
        ax.set_xlim(0, max(counts) * 1.15)
        ax.set_xlabel("points left")
    return _png(fig)


def proxy_topk(task: dict[str, Any], k: int) -> list[dict[str, Any]]:
    """The proxy's k best measured candidates (lowest prediction first) and what validation said of each."""
    pts = [t for t in task["trials"] if t["status"] == "measured" and t.get("proxy") is not None]
    pts.sort(key=lambda t: t["proxy"])
    rank_of = {r["fingerprint"]: r["rank"] for r in task["ranked"]}
    rejected = {r["rank"]: r["reasons"] for r in task["rejected"]}
    out = []
    for t in pts[:k]:
        rank = rank_of.get(t["fingerprint"])
        if rank is None:
            verdict = "not in the measured top-k"
        elif rank == task.get("accepted_rank"):
            verdict = "accepted"
        elif rank in rejected:
            verdict = "rejected: " + "; ".join(rejected[rank])
        else:
            verdict = "in the top-k, not reached by the walk"
        out.append({**t, "measured_rank": rank, "verdict": verdict})
    return out


def proxy(task: dict[str, Any], k: int) -> str | None:
    """Proxy prediction vs measured latency, the proxy's top-k highlighted and labelled with their verdicts."""
    pts = [t for t in task["trials"] if t["status"] == "measured" and t.get("proxy") is not None]
    if len(pts) < 2:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.scatter([t["proxy"] for t in pts], [t["latency_s"] for t in pts], s=14, color="#1f77b4", alpha=0.5,
               label="measured candidates")
    top = proxy_topk(task, k)
    colors = {"accepted": "#2ca02c", "rejected": "#d62728"}
    for i, t in enumerate(top, start=1):
        c = colors.get(t["verdict"].split(":")[0], "#ff7f0e")
        ax.scatter([t["proxy"]], [t["latency_s"]], s=70, facecolors="none", edgecolors=c, lw=2)
        ax.annotate(f"P{i}", (t["proxy"], t["latency_s"]), xytext=(5, 4), textcoords="offset points", fontsize=8,
                    color=c)
    rho = (task.get("proxy") or {}).get("spearman")
    ax.set_title(f"{task['proxy']['name']}: Spearman {rho:.2f}" if rho is not None else task["proxy"]["name"],
                 fontsize=10)
    px, my = [t["proxy"] for t in pts], [t["latency_s"] for t in pts]
    if min(px) > 0 and max(px) / min(px) > 20:
        ax.set_xscale("log")
    if max(my) / min(my) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("proxy prediction")
    ax.set_ylabel("measured latency (s)")
    ax.grid(alpha=0.3)
    ax.scatter([], [], s=70, facecolors="none", edgecolors="#ff7f0e", lw=2, label=f"proxy top-{k} (P1..)")
    ax.legend(fontsize=7)
    return _png(fig)


def roofline(task: dict[str, Any], profile: dict[str, Any] | None) -> str | None:
    """Achieved FLOP/s vs arithmetic intensity under the profile's measured ceilings."""
    work = task.get("work")
    if not work or not profile or not work.get("flops"):
        return None
    ok = [t for t in task["trials"] if t["status"] == "measured" and t["latency_s"]]
    if not ok:
        return None
    base_i = work["flops"] / max(work["bytes"], 1.0)
    xs = [t.get("intensity") or base_i for t in ok]
    ys = [work["flops"] / t["latency_s"] for t in ok]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    peak = float(profile["peak_flops_all"])
    lo = min(min(xs), base_i) / 8
    hi = max(max(xs), base_i) * 8
    for level, style in (("L1", ":"), ("L2", "-."), ("L3", "--"), ("DRAM", "-")):
        bw = (profile.get("bandwidth") or {}).get(level, {}).get("read")
        if not bw:
            continue
        hi = max(hi, peak / bw * 4)
        grid = [lo * (hi / lo) ** (i / 60) for i in range(61)]
        ax.plot(grid, [min(peak, bw * x) for x in grid], style, color="k", lw=1,
                label=f"{level} {bw / 1e9:.0f} GB/s")
    ax.axhline(peak, color="#d62728", lw=1, label=f"peak {peak / 1e9:.0f} GFLOP/s ({profile.get('threads')} threads)")
    ax.scatter(xs, ys, s=14, color="#1f77b4", alpha=0.6, label="measured candidates")
    acc = task.get("accepted")
    if acc and acc.get("latency_s"):
        i = next((t.get("intensity") for t in ok if t["fingerprint"] == acc["fingerprint"]), None) or base_i
        ax.scatter([i], [work["flops"] / acc["latency_s"]], marker="*", s=220, color="#2ca02c", edgecolors="k",
                   zorder=5, label="chosen plan")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return _png(fig)


def why_not(kind: str, task: dict[str, Any], profile: dict[str, Any] | None) -> str:
    """Why a plot is absent, in the reader's words."""
    if kind == "funnel":
        return "this run had no L0 funnel for this task"
    if kind == "proxy":
        return ("this task has no proxy or cost model" if not task.get("proxy")
                else "fewer than two measured candidates with a proxy score")
    if kind == "roofline":
        if not task.get("work"):
            return "planforge cannot count this task's FLOPs and bytes (a table workload)"
        if not profile:
            return "no device profile for this target"
    return "no measured candidate"
