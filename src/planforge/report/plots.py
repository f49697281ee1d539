"""The report's plots, as inline SVG (``report/svg.py``): every point has a hover title naming its plan.

Each function takes one task's run data (see ``report/run.py``) and returns the ``<svg>`` text, or None
with nothing worth drawing; ``why_not`` says why, in one line. Latencies are drawn in ns/us/ms, counts as
"8.1 M". Each plot's ``<desc>`` states what it shows (its alt text).
"""
from __future__ import annotations

import math
from typing import Any

from .summary import fmt_si, fmt_time
from .svg import BLUE, GREEN, GREY, ORANGE, PURPLE, RED, Axis, Chart

MODEL_STAGES = ("capacity", "roofline", "top-k")  # the funnel's stages that need a cost model
LEVELS = ("L1", "L2", "L3", "DRAM")
CACHE_OF = {"L1": "L1d", "L2": "L2", "L3": "L3"}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _measured(task: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in task["trials"] if t["n"] and t["status"] == "measured" and t["latency_s"]]


def _verdict(task: dict[str, Any], rank: int | None) -> str:
    rejected = {r["rank"]: r["reasons"] for r in task["rejected"]}
    if rank is None:
        return "not in the measured top-k"
    if rank == task.get("accepted_rank"):
        return "accepted"
    if rank in rejected:
        return "rejected: " + "; ".join(rejected[rank])
    return "in the top-k, not reached by the walk"


def _trial_title(t: dict[str, Any]) -> str:
    bits = [f"{t['repeats']} repeats" if t.get("repeats") else "", f"spread {_pct(t.get('spread'))}"
            if t.get("spread") is not None else "", f"others' load {_pct(t.get('other_load'))}"
            if t.get("other_load") is not None else ""]
    return f"#{t['n']} {t['label']}: {fmt_time(t['latency_s'])} search median ({', '.join(b for b in bits if b)})"


def curve(task: dict[str, Any]) -> str | None:
    """Every measurement and the best-so-far line against the evaluation number; the finalists' re-measured
    medians as diamonds (green accepted, red rejected, purple not reached), slow results measured twice as
    hollow circles at their first time, failed evaluations as crosses along the top."""
    evals = [t for t in task["trials"] if t["n"]]
    ok = _measured(task)
    if not ok:
        return None
    first_n = {}
    for t in ok:
        first_n.setdefault(t["fingerprint"], t["n"])
    finals = [r for r in task["ranked"] if r["fingerprint"] in first_n]
    again = "re-measured" if task.get("remeasured") else "search time"  # another device's ranking stands as searched
    twice = [t for t in ok if t.get("recheck") and t["recheck"]["first"].get("median_s")]
    other = {t["n"]: t["recheck"]["first" if t["recheck"]["kept"] == "second" else "second"] for t in twice}
    ys = [t["latency_s"] for t in ok] + [r["latency_s"] for r in finals] + \
        [o["median_s"] for o in other.values() if o.get("median_s")]
    y = Axis.over(ys, log=True, pad=0.12, fmt=fmt_time, label="latency (log scale)")
    x = Axis.over([t["n"] for t in evals] + [0.5], fmt=lambda v: f"{v:g}", label="evaluation")
    best = min(ok, key=lambda t: t["latency_s"])
    acc = task.get("accepted")
    desc = (f"{len(ok)} measured plans over {len(evals)} evaluations; the best search time is "
            f"{fmt_time(best['latency_s'])} at evaluation {best['n']}"
            + (f"; the chosen plan re-measured at {fmt_time(acc['latency_s'])}" if acc else "; no plan was chosen"))
    c = Chart(x, y, "Best so far", desc)
    for t in ok:
        c.point(t["n"], t["latency_s"], _trial_title(t), BLUE, r=3, opacity=0.45)
    for t in twice:
        o = other[t["n"]]
        if o.get("median_s"):
            c.point(t["n"], o["median_s"], f"#{t['n']} {t['label']}: measured twice; the other measurement "
                    f"{fmt_time(o['median_s'])} (load {_pct(o.get('other_load'))}), kept {fmt_time(t['latency_s'])}",
                    GREY, r=4.5, hollow=True)
    for t in evals:
        if t["status"] != "measured":
            c.point(t["n"], y.hi / 1.15, f"#{t['n']} {t['label']}: {t['category']}: {t['message'][:120]}", RED,
                    shape="cross", r=3.5)
    steps = [(t["n"], t["latency_s"]) for t in ok]
    xs, bs, b = [], [], math.inf
    for n, v in steps:
        if v < b:
            b = v
            xs.append(n)
            bs.append(b)
    xs.append(evals[-1]["n"])
    bs.append(b)
    c.line(xs, bs, ORANGE, width=2.2, step=True, title=f"best search time so far: {fmt_time(b)}")
    for r in finals:
        v = _verdict(task, r["rank"])
        color = GREEN if v == "accepted" else RED if v.startswith("rejected") else PURPLE
        n = first_n[r["fingerprint"]]
        srch = (r.get("search") or {}).get("latency_s")
        if srch:
            c.line([n, n], [srch, r["latency_s"]], color, width=1, dash="3,2")
        c.point(n, r["latency_s"], f"rank {r['rank']} {r['label']}: {again} {fmt_time(r['latency_s'])}"
                f" ({r.get('repeats') or '?'} repeats, spread {_pct(r.get('spread'))}); search "
                f"{fmt_time(srch)}; {v}", color, shape="diamond", r=4.5, opacity=1)
    c.legend("measured during the search", BLUE)
    c.legend("best search time so far", ORANGE, "line")
    verdicts = [_verdict(task, r["rank"]) for r in finals]
    for start, color, what in (("accepted", GREEN, "accepted"), ("rejected", RED, "rejected"),
                               ("in the top", PURPLE, "not reached")):
        if any(v.startswith(start) for v in verdicts):
            c.legend(f"finalist {again}: {what}", color, "diamond")
    if twice:
        c.legend("slow result measured twice: other time", GREY, "hollow")
    if len(ok) < len(evals):
        c.legend("failed evaluation", RED, "cross")
    return c.svg()


def _float(n) -> float:
    try:
        return min(float(n), 1e300)
    except OverflowError:
        return 1e300


def funnel(task: dict[str, Any]) -> str | None:
    """The L0 funnel's stages as bars of points left (log scale), drawn only when it has model stages."""
    stages = task.get("funnel") or []
    if not any(s["stage"] in MODEL_STAGES for s in stages):
        return None
    counts = [max(_float(s["count"]), 1.0) for s in stages]
    x = Axis(min(counts) / 3, max(counts) * 30, log=True, fmt=fmt_si, label="points left after the stage (log scale)")
    y = Axis(-0.5, len(stages) - 0.5, ticks=[])
    desc = ("The funnel cut " + " to ".join(f"{fmt_si(s['count'])} ({s['stage']})" for s in stages) + " points.")
    c = Chart(x, y, "L0 funnel", desc, height=40 + 30 * len(stages), left=110, bottom=40, top=8)
    for i, (s, n) in enumerate(zip(stages, counts)):
        row = len(stages) - 1 - i
        c.hbar(row, x.lo, n, f"{s['stage']}: {fmt_si(s['count'])} points", GREEN)
        c.text(x.lo, row, s["stage"], anchor="end", dx=-6, dy=4, clip=False)
        c.text(n, row, fmt_si(s["count"]), dx=5, dy=4)
    return c.svg()


def proxy_topk(task: dict[str, Any], k: int) -> list[dict[str, Any]]:
    """The proxy's k best measured candidates (lowest prediction first) and what validation said of each."""
    pts = [t for t in _measured(task) if t.get("proxy") is not None and math.isfinite(t["proxy"])]
    pts.sort(key=lambda t: t["proxy"])
    rank_of = {r["fingerprint"]: r["rank"] for r in task["ranked"]}
    return [{**t, "measured_rank": rank_of.get(t["fingerprint"]), "verdict": _verdict(task, rank_of.get(t["fingerprint"]))}
            for t in pts[:k]]


def proxy_stats(task: dict[str, Any], k: int) -> dict[str, Any]:
    """n, Spearman (scipy.stats) and the top-k hit rate of the proxy against the measurements."""
    from scipy import stats

    from ..costmodel.metrics import top_k_recall

    pts = [t for t in _measured(task) if t.get("proxy") is not None and math.isfinite(t["proxy"])]
    pred, meas = [t["proxy"] for t in pts], [t["latency_s"] for t in pts]
    rho = None
    if len(pts) >= 3 and len(set(pred)) > 1 and len(set(meas)) > 1:
        rho = float(stats.spearmanr(pred, meas).statistic)
    return {"n": len(pts), "spearman": rho, "k": min(k, len(pts)), "hit_rate": top_k_recall(pred, meas, k) if pts else None}


def proxy(task: dict[str, Any], k: int) -> str | None:
    """Proxy prediction against measured latency, log-log, with y = x where the proxy predicts seconds; the
    proxy's top-k ringed in the colour of their validation verdict."""
    pts = [t for t in _measured(task) if t.get("proxy") is not None and math.isfinite(t["proxy"])]
    if len(pts) < 2:
        return None
    seconds = (task.get("proxy") or {}).get("unit") == "s"
    px, my = [t["proxy"] for t in pts], [t["latency_s"] for t in pts]
    logx = min(px) > 0
    if seconds and logx:
        both = px + my
        x = Axis.over(both, log=True, fmt=fmt_time, label=f"{task['proxy']['name']} prediction (log scale)")
        y = Axis.over(both, log=True, fmt=fmt_time, label="measured latency (log scale)")
    else:
        x = Axis.over(px, log=logx, fmt=lambda v: f"{v:.3g}",
                      label=f"{task['proxy']['name']} score ({'log scale' if logx else 'linear'}; not seconds)")
        y = Axis.over(my, log=True, fmt=fmt_time, label="measured latency (log scale)")
    st = proxy_stats(task, k)
    head = (f"n = {st['n']}, Spearman {st['spearman']:.2f}" if st["spearman"] is not None else f"n = {st['n']}") + \
        (f", top-{st['k']} hit rate {_pct(st['hit_rate'])}" if st["hit_rate"] is not None else "")
    desc = (f"{task['proxy']['name']} against the measured latency of {st['n']} plans: {head}. "
            "A perfect proxy puts every point on one rising line.")
    c = Chart(x, y, "Proxy vs measured", desc, height=396, top=30)
    if seconds and logx:
        lo, hi = max(x.lo, y.lo), min(x.hi, y.hi)
        c.line([lo, hi], [lo, hi], GREY, dash="5,3", title="y = x: the prediction is exact")
    for t in pts:
        c.point(t["proxy"], t["latency_s"], f"{t['label']}: predicted {t['proxy']:.4g}"
                f"{' s' if seconds else ''}, measured {fmt_time(t['latency_s'])}", BLUE, r=3, opacity=0.5)
    colors = {"accepted": GREEN, "rejected": RED}
    for i, t in enumerate(proxy_topk(task, k), start=1):
        col = colors.get(t["verdict"].split(":")[0], ORANGE)
        c.point(t["proxy"], t["latency_s"], f"P{i} (proxy's #{i}) {t['label']}: {t['verdict']}", col, r=7, hollow=True,
                opacity=1)
        c.text(t["proxy"], t["latency_s"], f"P{i}", dx=8, dy=-6, size=11, color=col)
    c.text(x.lo, y.hi, head, dy=-10, size=12, clip=False)  # above the plot area, clear of the points
    c.legend("measured plan", BLUE)
    if seconds and logx:
        c.legend("y = x", GREY, "dash")
    verdicts = {t["verdict"].split(":")[0] for t in proxy_topk(task, k)}
    for v, col, name in (("accepted", GREEN, "proxy top-k: accepted"), ("rejected", RED, "proxy top-k: rejected")):
        if v in verdicts:
            c.legend(name, col, "hollow")
    if verdicts - {"accepted", "rejected"}:
        c.legend("proxy top-k: not chosen", ORANGE, "hollow")
    return c.svg()


def fit_level(task: dict[str, Any], profile: dict[str, Any]) -> str:
    """The memory level the task's compulsory bytes fit in (its roofline's roof)."""
    caches = profile.get("caches") or {}
    bw = profile.get("bandwidth") or {}
    need = (task.get("work") or {}).get("bytes") or math.inf
    for level in LEVELS[:-1]:
        c = caches.get(CACHE_OF[level])
        if c and level in bw and need <= c["bytes"] * c.get("instances", 1):
            return level
    return "DRAM" if "DRAM" in bw else next(iter(bw), "DRAM")


def attainable(profile: dict[str, Any], level: str, intensity: float) -> float:
    bw = (profile.get("bandwidth") or {}).get(level, {}).get("read") or math.inf
    return min(float(profile["peak_flops_all"]), bw * intensity)


def roofline_points(task: dict[str, Any], profile: dict[str, Any]) -> list[dict[str, Any]]:
    """Each measured plan at its own intensity: achieved FLOP/s and its share of the attainable."""
    work = task["work"]
    base = work["flops"] / max(work["bytes"], 1.0)
    level = fit_level(task, profile)
    out = []
    for t in _measured(task):
        i = t.get("intensity") or base
        got = work["flops"] / t["latency_s"]
        out.append({"trial": t, "intensity": i, "flops_s": got, "of_attainable": got / attainable(profile, level, i)})
    return out


def roofline(task: dict[str, Any], profile: dict[str, Any] | None) -> str | None:
    """Achieved FLOP/s against each plan's own arithmetic intensity under the measured roofs (peak and each
    memory level's read bandwidth); the chosen plan a star, its % of the attainable in the description."""
    work = task.get("work")
    if not work or not profile or not work.get("flops"):
        return None
    pts = roofline_points(task, profile)
    if not pts:
        return None
    peak = float(profile["peak_flops_all"])
    bws = {lv: (profile.get("bandwidth") or {}).get(lv, {}).get("read") for lv in LEVELS}
    bws = {lv: b for lv, b in bws.items() if b}
    level = fit_level(task, profile)
    xs = [p["intensity"] for p in pts]
    ridge = [peak / b for b in bws.values()]
    x = Axis.over(xs + ridge, log=True, pad=0.25, fmt=lambda v: f"{v:g}", label="arithmetic intensity (FLOP/byte, log scale)")
    y = Axis.over([p["flops_s"] for p in pts] + [peak * 1.6], log=True, pad=0.1, fmt=fmt_si,
                  label="achieved FLOP/s (log scale)")
    busy = profile.get("other_load") is not None and profile["other_load"] > 0.25
    acc = task.get("accepted")
    chosen = next((p for p in pts if acc and p["trial"]["fingerprint"] == acc["fingerprint"]), None)
    if chosen and acc.get("latency_s"):
        got = work["flops"] / acc["latency_s"]
        chosen = {**chosen, "flops_s": got, "of_attainable": got / attainable(profile, level, chosen["intensity"])}
    same = len({round(v, 6) for v in xs}) == 1
    desc = (f"{len(pts)} measured plans' achieved FLOP/s against their arithmetic intensity"
            + (" (all at the task's compulsory-traffic intensity)" if same else "")
            + (f"; the chosen plan reaches {_pct(chosen['of_attainable'])} of the {fmt_si(attainable(profile, level, chosen['intensity']))}FLOP/s "
               f"attainable under the {level} roof" if chosen else "")
            + ("; the roofs were probed on a busy machine and may be low" if busy else ""))
    c = Chart(x, y, "Roofline", desc, height=380)
    grid = [x.lo * (x.hi / x.lo) ** (i / 48) for i in range(49)]
    placed: list[tuple[float, float]] = []
    for lv, b in sorted(bws.items(), key=lambda kv: -kv[1]):  # highest roof first
        c.line(grid, [min(peak, b * v) for v in grid], GREEN if lv == level else GREY, width=2 if lv == level else 1,
               dash="6,3" if busy else None, title=f"{lv} read {b / 1e9:.3g} GB/s" + (" (the task fits here)" if lv == level else ""))
        x0 = max(x.lo, y.lo * 1.3 / b)  # where the roof enters the plot
        if b * x0 >= peak:
            continue  # its slope lies left of the plot: the peak line says it
        px, py = c.px(x0) + 4, c.py(b * x0) - 4
        for qx, qy in placed:  # labels kept 12 px apart
            if abs(qx - px) < 90 and abs(qy - py) < 12:
                py = qy + 12
        placed.append((px, py))
        c.text(x.lo, y.lo, f"{lv} {b / 1e9:.3g} GB/s", dx=px - c.px(x.lo), dy=py - c.py(y.lo), size=11,
               color=GREEN if lv == level else GREY)
    c.line([x.lo, x.hi], [peak, peak], RED, width=1.2, dash="6,3" if busy else None,
           title=f"peak {fmt_si(peak)}FLOP/s on {profile.get('threads')} threads")
    c.text(x.hi, peak, f"peak {fmt_si(peak)}FLOP/s ({profile.get('threads')} threads)", anchor="end", dx=-4, dy=-5,
           size=11, color=RED)
    for p in pts:
        t = p["trial"]
        c.point(p["intensity"], p["flops_s"], f"#{t['n']} {t['label']}: {fmt_si(p['flops_s'])}FLOP/s at "
                f"{p['intensity']:.3g} FLOP/B, {_pct(p['of_attainable'])} of attainable ({level} roof); "
                f"{fmt_time(t['latency_s'])}", BLUE, r=3, opacity=0.5)
    if chosen:
        c.point(chosen["intensity"], chosen["flops_s"], f"chosen plan {acc['label']}: {fmt_si(chosen['flops_s'])}FLOP/s,"
                f" {_pct(chosen['of_attainable'])} of attainable; re-measured {fmt_time(acc['latency_s'])}", GREEN,
                shape="star", r=5)
    c.legend("measured plan", BLUE)
    if chosen:
        c.legend("chosen plan", GREEN, "diamond")
    c.legend(f"{level} roof (the task's bytes fit there)" + (": probed under load" if busy else ""), GREEN,
             "dash" if busy else "line")
    return c.svg()


def importance(task: dict[str, Any]) -> str | None:
    """Each knob's share of a LightGBM fit's gain (log latency on the knobs), largest first."""
    imp = task.get("importance") or {}
    if not imp:
        return None
    names = sorted(imp, key=lambda n: -imp[n])
    labels = task.get("knob_labels") or {}
    x = Axis(0, max(imp.values()) * 1.25, fmt=lambda v: f"{100 * v:.0f}%", label="share of the model's gain")
    y = Axis(-0.5, len(names) - 0.5, ticks=[])
    top = names[0]
    desc = (f"Which knobs the latency depends on: {labels.get(top, top)} explains {_pct(imp[top])} of a gradient-"
            f"boosted fit's gain, then " + ", ".join(f"{labels.get(n, n)} {_pct(imp[n])}" for n in names[1:4]))
    c = Chart(x, y, "Knob importance", desc, height=36 + 26 * len(names), left=250, top=6, bottom=40)
    for i, n in enumerate(names):
        row = len(names) - 1 - i
        c.hbar(row, 0, imp[n], f"{labels.get(n, n)} ({n}): {_pct(imp[n])} of the gain", BLUE)
        c.text(0, row, labels.get(n, n)[:38], anchor="end", dx=-6, dy=4, size=11, clip=False)
        c.text(imp[n], row, _pct(imp[n]), dx=4, dy=4, size=11)
    return c.svg()


def _sort_key(v):
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def parallel(task: dict[str, Any], top: int = 10, axes: int = 6) -> str | None:
    """The best ``top`` plans as lines across their most important knobs (one vertical axis per knob, its
    values in order), the fastest darkest."""
    ok = sorted(_measured(task), key=lambda t: t["latency_s"])
    seen, best = set(), []
    for t in ok:
        if t["fingerprint"] not in seen:
            seen.add(t["fingerprint"])
            best.append(t)
    best = best[:top]
    if len(best) < 2:
        return None
    vary = [k for k in best[0]["plan"] if len({str(t["plan"].get(k)) for t in ok}) > 1]
    imp = task.get("importance") or {}
    knobs = [k for k in sorted(imp, key=lambda n: -imp[n]) if k in vary][:axes] or vary[:axes]
    if not knobs:
        return None
    labels = task.get("knob_labels") or {}
    values = {k: sorted({t["plan"].get(k) for t in ok}, key=_sort_key) for k in knobs}
    x = Axis(-0.3, len(knobs) - 0.7, ticks=[], label="")
    y = Axis(-0.08, 1.08, ticks=[], label="")
    desc = (f"The {len(best)} fastest plans across {len(knobs)} knobs ({', '.join(labels.get(k, k) for k in knobs)}): "
            "each axis runs over that knob's values, low to high; lines that bunch together on an axis show a "
            "setting the fast plans share.")
    c = Chart(x, y, "Top plans, parallel coordinates", desc, height=330, left=24, bottom=64)
    wide = 760 / len(knobs) / 6.2  # characters a label may take under its axis
    for i, k in enumerate(knobs):
        c.line([i, i], [0, 1], GREY, width=1)
        vs = values[k]
        shown = vs if len(vs) <= 6 else [vs[0], *vs[1:-1][:: math.ceil(len(vs) / 5)], vs[-1]]
        for v in dict.fromkeys(shown):
            pos = vs.index(v) / max(len(vs) - 1, 1)
            c.text(i, pos, str(v)[:int(wide) - 2], dx=4, dy=4, size=10, color=GREY)
        name = labels.get(k, k)
        c.text(i, 0, name[:int(wide)], anchor="middle", dy=22 + 14 * (i % 2), size=11, clip=False)
    for r, t in reversed(list(enumerate(best))):
        pos = [values[k].index(t["plan"].get(k)) / max(len(values[k]) - 1, 1) for k in knobs]
        shade = GREEN if r == 0 else BLUE if r < 3 else GREY
        c.line(list(range(len(knobs))), pos, shade, width=2.6 if r == 0 else 1.4,
               title=f"#{r + 1} fastest: {t['label']}, {fmt_time(t['latency_s'])} (evaluation {t['n']})")
    c.legend("fastest plan", GREEN, "line")
    c.legend("2nd and 3rd", BLUE, "line")
    if len(best) > 3:
        c.legend(f"4th to {len(best)}th", GREY, "line")
    return c.svg()


def breakdown(e2e: dict[str, Any] | None) -> str | None:
    """Each task's share of the end-to-end time, largest first (Amdahl order: where tuning pays)."""
    shares = sorted((e2e or {}).get("shares") or [], key=lambda s: -s["share"])
    if len(shares) < 2:
        return None
    x = Axis(0, 1.0, fmt=lambda v: f"{100 * v:.0f}%", label="share of the end-to-end time")
    y = Axis(-0.5, len(shares) - 0.5, ticks=[])
    desc = (f"{shares[0]['task']} takes {_pct(shares[0]['share'])} of the time, then "
            + ", ".join(f"{s['task']} {_pct(s['share'])}" for s in shares[1:4]))
    c = Chart(x, y, "Per-task breakdown", desc, height=36 + 28 * len(shares), left=200, top=6, bottom=40)
    for i, s in enumerate(shares):
        row = len(shares) - 1 - i
        c.hbar(row, 0, s["share"], f"{s['task']} x{s['weight']}: {fmt_time(s['latency_s'])} each, {_pct(s['share'])}",
               ORANGE)
        c.text(0, row, f"{s['task']} x{s['weight']}"[:30], anchor="end", dx=-6, dy=4, size=11, clip=False)
        c.text(s["share"], row, f"{_pct(s['share'])} ({fmt_time(s['latency_s'])} each)", dx=4, dy=4, size=11)
    return c.svg()


def why_not(kind: str, task: dict[str, Any], profile: dict[str, Any] | None) -> str:
    """Why a plot is absent, in the reader's words (one line)."""
    if kind == "funnel":
        st = task.get("funnel") or []
        if st:
            return (f"No model stages for this task (no analytic cost model): the space of {fmt_si(st[0]['count'])} "
                    f"plans went to the measured search as it is, which measured {fmt_si(st[-1]['count'])}.")
        return "This run had no L0 funnel for this task."
    if kind == "proxy":
        return ("This task has no proxy or cost model." if not task.get("proxy")
                else "Fewer than two measured plans have a proxy score.")
    if kind == "roofline":
        if not task.get("work"):
            return "planforge cannot count this task's FLOPs and bytes (a table workload), so there is no roofline."
        if not profile:
            return "There is no device profile for this target, so there are no roofs to draw."
    if kind == "importance":
        return "Fewer than 8 measurements, or no knob varied among them: too few to say which knobs matter."
    if kind == "parallel":
        return "Fewer than two distinct measured plans, or no knob varied among them."
    return "No plan was measured."
