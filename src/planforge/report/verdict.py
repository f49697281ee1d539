"""The answer first: what a performance engineer asks of a tuning run, answered from its run data.

``summarize(run)`` reads ``run.json`` (see ``report/run.py``) and gives, per task: the chosen plan in words,
its latency with the measurement it comes from (re-measured median, spread, repeats), how it compares with
every library measured ("4.5x faster than numpy"), whether the search converged (last improvement at
evaluation k of n, the duplicate rate, what more budget would likely buy, from the curve), the break-even
against the fastest library, and the trust warnings: load while the device was probed or the candidates
measured, a spread above ``HIGH_SPREAD``, a finalist whose re-measure differs from its search time by more
than ``DRIFT``x, slow results measured twice, a fastest plan that validation rejected. A workload of several
tasks also gets its end-to-end figures and each task's share of the time (Amdahl order).
"""
from __future__ import annotations

import math
from typing import Any

from .summary import fmt_si, fmt_time

BUSY = 0.25  # others' share of the CPUs above which a measurement or the probe counts as taken on a busy machine
HIGH_SPREAD = 0.10  # IQR / median above which differences of that size are noise
DRIFT = 2.0  # a finalist whose re-measure and search time differ by more than this factor is flagged
FEW = 8  # fewer evaluations than this say nothing about convergence


def fmt_knobs(knobs: dict[str, Any], limit: int = 6) -> str:
    items = [f"{k} {v}" for k, v in knobs.items()]
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def plan_words(acc: dict[str, Any]) -> str:
    """``fused_mlp (threads 2, vec 16, ...)``, steps joined by ", then " (fewer settings each when there are many
    steps: the chosen-plan table has them all)."""
    steps = acc.get("steps") or [{"what": acc.get("label", "?"), "knobs": {}}]
    limit = 6 if len(steps) <= 2 else 3
    return ", then ".join(f"{s['what']}" + (f" ({fmt_knobs(s['knobs'], limit)})" if s.get("knobs") else "")
                          for s in steps)


def latency_words(m: dict[str, Any], which: str) -> str:
    """"10.5 us (re-measured median of 120 repeats, spread 3%)"."""
    n = m.get("repeats")
    parts = [f"{which} of {n} repeat{'s' if n != 1 else ''}" if n else which]
    if m.get("spread") is not None:
        parts.append(f"spread {100 * m['spread']:.0f}%")
    return f"{fmt_time(m.get('latency_s'))} ({', '.join(parts)})"


def speed_words(tuned: float, name: str, lib: float) -> str:
    r = lib / tuned
    return f"{r:.1f}x faster than {name}" if r >= 1 else f"{1 / r:.1f}x slower than {name}"


def _best_so_far(trials: list[dict]) -> list[tuple[int, float]]:
    out, best = [], math.inf
    for t in trials:
        if t["n"] and t["status"] == "measured" and t["latency_s"] < best:
            best = t["latency_s"]
            out.append((t["n"], best))
    return out


def convergence(t: dict[str, Any]) -> dict[str, Any]:
    """Last improvement at evaluation k of n, duplicates among the proposals, and what doubling the budget would
    likely buy: the gain of the last doubling (from n/2 to n), which a search's diminishing returns rarely beat."""
    n = t["evaluations"]
    steps = _best_so_far(t["trials"])
    proposals = n + t["duplicates"] + t["counts"].get("rejected", 0)
    d: dict[str, Any] = {"evaluations": n, "duplicates": t["duplicates"], "proposals": proposals,
                         "last_improvement": steps[-1][0] if steps else None}
    if not steps:
        d.update(converged=False, text="no plan was measured", more="")
        return d
    k = steps[-1][0]
    d["text"] = (f"last improvement at evaluation {k} of {n}"
                 + (f"; {t['duplicates']} of {proposals} proposals were duplicates" if proposals else ""))
    if n < FEW:
        d.update(converged=False, more=f"{n} evaluations are too few to tell: more budget would likely help")
        return d
    best_half = min((m for e, m in steps if e <= n // 2), default=None)
    gain = 1 - steps[-1][1] / best_half if best_half else None
    d["converged"] = k <= n // 2
    if d["converged"]:
        d["more"] = (f"nothing better in the last {n - k} evaluations: more budget would likely buy little "
                     "(the curve is flat)")
    elif gain is not None:
        d["more"] = (f"the last doubling (evaluations {n // 2} to {n}) gained {100 * gain:.0f}%: doubling the "
                     f"budget again would likely gain up to about that much")
    else:
        d["more"] = "the curve is too short to extrapolate: more budget would likely help"
    return d


def _load_warnings(t: dict[str, Any], profile: dict[str, Any] | None) -> list[str]:
    out = []
    if profile and profile.get("other_load") is not None and profile["other_load"] > BUSY:
        out.append(f"The device was probed while other processes used {100 * profile['other_load']:.0f}% of "
                   "all CPUs: its peak FLOP/s and bandwidths (the roofline's ceilings) may be low.")
    if profile and profile.get("busy_figures"):
        out.append("Probe figures another process took a CPU from in every run (may be low): "
                   + ", ".join(profile["busy_figures"]) + ".")
    loads = [x["other_load"] for x in t["trials"] if x.get("other_load") is not None and x["n"]]
    busy = [v for v in loads if v > BUSY]
    if busy:
        out.append(f"{len(busy)} of {len(loads)} measurements ran while other processes used more than "
                   f"{100 * BUSY:.0f}% of the measuring CPUs (up to {100 * max(busy):.0f}%): their times may be "
                   "inflated.")
    again = [r.get("other_load") for r in t["ranked"]] + [b.get("other_load") for b in t["baselines"].values()]
    again = [v for v in again if v is not None]
    if again and max(again) > BUSY:
        out.append(f"The finalists and libraries were re-measured while other processes used up to "
                   f"{100 * max(again):.0f}% of the measuring CPUs: the comparison is fair (interleaved), the "
                   "absolute times may be inflated.")
    return out


def _rechecks(t: dict[str, Any]) -> list[str]:
    rc = [x for x in t["trials"] if x.get("recheck")]
    if not rc:
        return []
    faster = [x for x in rc if x["recheck"]["kept"] == "second"]
    eg = ""
    if faster:
        x = max(faster, key=lambda x: x["recheck"]["first"]["median_s"] / x["recheck"]["second"]["median_s"])
        eg = (f" (e.g. evaluation {x['n']}: {fmt_time(x['recheck']['first']['median_s'])}, then "
              f"{fmt_time(x['recheck']['second']['median_s'])})")
    return [f"{len(rc)} results at least 10x slower than the best so far were measured again: {len(faster)} were "
            f"faster the second time, so their first time was disturbed{eg}; both are kept."]


def task_summary(key: str, t: dict[str, Any], profile: dict[str, Any] | None) -> dict[str, Any]:
    """The summary box of one task (see the module docstring); ``profile``: its device profile (or None)."""
    acc = t.get("accepted")
    s: dict[str, Any] = {"key": key, "ok": acc is not None, "warnings": [], "notes": []}
    s["convergence"] = convergence(t)
    s["warnings"] += _load_warnings(t, profile)
    if acc is None:
        s["plan"] = f"no plan passed validation: {t.get('error')}"
        if t.get("fallback"):  # a part of a partitioned model: it runs its library instead
            s["notes"].append(f"the part runs {t['fallback']['to']} instead: the rest of the model keeps its plans")
        return s
    s["plan"] = plan_words(acc)
    which = "re-measured median" if t.get("remeasured") else "search median"
    s["latency"] = latency_words({**acc, "latency_s": acc["latency_s"]}, which)
    libs = {n: b["latency_s"] for n, b in t["baselines"].items() if b.get("latency_s")}
    if libs:
        name = min(libs, key=libs.get)
        s["speed"] = speed_words(acc["latency_s"], name, libs[name])
        s["libraries"] = ", ".join(f"{n} {fmt_time(v)}" for n, v in sorted(libs.items(), key=lambda kv: kv[1]))
        saved = (libs[name] - acc["latency_s"]) * t["weight"]
        s["saved_vs_library_s"] = saved
    failed = [n for n, b in t["baselines"].items() if b.get("failed")]
    if failed:
        s["notes"].append("libraries that failed: " + ", ".join(f"{n} ({t['baselines'][n]['failed']})" for n in failed))
    if t.get("fallback"):
        s["notes"].append(f"the plan falls back to {t['fallback']['to']}: {t['fallback']['reason']}")
    w = s["warnings"]
    if acc.get("spread") is not None and acc["spread"] > HIGH_SPREAD:
        w.append(f"The chosen plan's times spread {100 * acc['spread']:.0f}% (IQR / median over {acc.get('repeats')} "
                 f"repeats), above {100 * HIGH_SPREAD:.0f}%: differences smaller than that are noise.")
    for r in t["ranked"]:
        srch = r.get("search")
        if t.get("remeasured") and srch and srch.get("latency_s") and r["latency_s"]:
            f = r["latency_s"] / srch["latency_s"]
            if f > DRIFT or f < 1 / DRIFT:
                how = f"{f:.3g}x slower" if f > 1 else f"{1 / f:.3g}x faster"
                w.append(f"Rank {r['rank']} ({r['label']}) measured {fmt_time(srch['latency_s'])} during the search "
                         f"and {fmt_time(r['latency_s'])} re-measured ({how}): one of the two was disturbed.")
    w += _rechecks(t)
    rejected = {x["rank"]: x["reasons"] for x in t["rejected"]}
    searched = [x for x in t["trials"] if x["status"] == "measured" and x["n"]]
    if searched:
        fastest = min(searched, key=lambda x: x["latency_s"])
        rank = next((r["rank"] for r in t["ranked"] if r["fingerprint"] == fastest["fingerprint"]), None)
        if rank in rejected:
            s["notes"].append(f"the fastest plan measured ({fmt_time(fastest['latency_s'])}, {fastest['label']}) was "
                              f"rejected by validation: {'; '.join(rejected[rank])}")
        elif fastest["fingerprint"] != acc["fingerprint"] and rank is not None:
            s["notes"].append(f"the search's fastest time ({fmt_time(fastest['latency_s'])}) is rank {rank}'s; "
                              f"re-measured beside the others, rank {acc['rank']} won")
    return s


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The summary box of a whole run: per task (``task_summary``), the end-to-end figures and the break-even."""
    targets = run["environment"]["targets"]
    tasks = {k: task_summary(k, t, (targets.get(k) or {}).get("profile")) for k, t in run["tasks"].items()}
    out: dict[str, Any] = {"tasks": tasks, "end_to_end": None}
    e2e = run.get("end_to_end")
    if e2e:
        out["end_to_end"] = {
            "latency": f"{fmt_time(e2e['median_s'])} median, p99 {fmt_time(e2e['p99_s'])} over {e2e['samples']} calls",
            "speed": speed_words(e2e["median_s"], e2e["library"], e2e["library_median_s"]),
            "shares": e2e.get("shares") or [],
            # the runtimes the model was timed against as its user gave it (ONNX Runtime, OpenVINO, torch)
            "peers": [{"name": k, "time": fmt_time(v["median_s"]), "speed": speed_words(e2e["median_s"], k, v["median_s"]),
                       "settings": v.get("settings", "")} if "median_s" in v else
                      {"name": k, "skipped": v.get("skipped", "not timed")}
                      for k, v in sorted((e2e.get("peers") or {}).items())],
            "fastest": speed_words(e2e["median_s"], e2e["fastest"]["name"], e2e["fastest"]["median_s"])
            if e2e.get("fastest") else None}
        saved = e2e["library_median_s"] - e2e["median_s"]
    else:
        saved = sum(s.get("saved_vs_library_s") or 0.0 for s in tasks.values()) if all(
            "saved_vs_library_s" in s for s in tasks.values()) else None
    secs = run["search_seconds"]
    if saved is None:  # nothing to compare with (a table): against the first plan the search measured
        be = run.get("break_even_runs")
        out["break_even"] = (f"no library was measured; against the first plan measured, the search took {secs:.3g} s "
                             f"and saves {fmt_time(run.get('saved_s_per_run'))} per run: "
                             + (f"it pays back after {fmt_si(math.ceil(be))} runs" if be else "it never pays back"))
    elif saved <= 0:
        out["break_even"] = "never: the fastest library is at least as fast, so the plan falls back to it"
    else:
        out["break_even"] = (f"the search took {secs:.3g} s and saves {fmt_time(saved)} per run over the fastest "
                             f"library: it pays back after {fmt_si(math.ceil(secs / saved))} runs")
    return out
