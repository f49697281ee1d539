"""Terminal summary of a tuning run (rich), and its JSON form for ``tune --json``."""
from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..costmodel.funnel import pruned_fraction
from ..results import TaskResult, TuneResult

LOW_SPEARMAN = 0.5
_BARS = "▁▂▃▄▅▆▇█"


def fmt_time(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(s) >= scale or unit == "ns":
            v = s / scale
            return f"{v:.3g} {unit}"
    return f"{s} s"


def fmt_count(x: float) -> str:
    if not math.isfinite(x):
        return "never (nothing saved)"
    return f"{x:.3g}"


def fmt_size(n: int | float) -> str:
    """A space size: exact up to 10^12, then ``3.06e+76``, also past what a float holds (``7.00e+400``)."""
    if abs(n) < 10**12:
        return f"{int(n):,}"
    try:
        return f"{float(n):.3g}"
    except OverflowError:
        digits = str(abs(int(n)))
        return f"{digits[0]}.{digits[1:3]}e+{len(digits) - 1}"


def fmt_bytes(n: float | None) -> str:
    """``855,296`` -> "835 KiB"; binary units, three significant digits."""
    if n is None or not math.isfinite(n):
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def fmt_si(n: float | int | None) -> str:
    """A count as a reader says it: 532, "8.1 M", "39.8 M", "3.1 G"; past 10^15 as "3.1 x 10^76"."""
    if n is None:
        return "-"
    if abs(n) < 10_000:
        return f"{n:,}" if isinstance(n, int) else f"{n:.3g}"
    if abs(n) < 10**15:
        for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if abs(n) >= scale:
                return f"{n / scale:.3g} {unit}"
    digits = len(str(abs(int(n)))) - 1
    return f"{int(n) / 10 ** digits:.2g} x 10^{digits}" if digits < 300 else f"{str(abs(int(n)))[0]} x 10^{digits}"


def sparkline(values: list[float]) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi == lo:
        return _BARS[0] * len(values)
    return "".join(_BARS[int((v - lo) / (hi - lo) * (len(_BARS) - 1))] for v in values)


def best_so_far(tr: TaskResult) -> list[float]:
    out, best = [], math.inf
    for t in tr.result.trials:
        if t.n and t.outcome.ok:
            best = min(best, t.outcome.metric)
        if t.n:
            out.append(best)
    return [v for v in out if math.isfinite(v)]


def running_steps(program: list[dict]) -> list[dict]:
    """The steps of a graph plan that run per call: leaves, views (reshape), pairs and anything computed from
    parameters alone (a transposed weight: the plan folds it into a constant at load time) left out."""
    const: set[str] = set()
    out = []
    for s in program:
        op, name = s["op"], (s["args"] or [""])[0]
        if op in ("T.param", "T.param_t") or (op in ("lib1", "lib2", "lib3") and name != "pair" and s["inputs"]
                                              and all(i in const for i in s["inputs"])):
            const.add(s["cls"])
        elif not (op.startswith(("T.", "Layers.")) or (op == "lib1" and name == "reshape") or name == "pair"):
            out.append(s)
    return out


def step_name(s: dict) -> str:
    """``fused_mlp``, ``tmpl:linear``, ``lib:softmax[1]``: what one step runs."""
    if s["op"] == "fused_mlp":
        return "fused_mlp"
    args = s["args"] + [""] * 2
    return f"{s['op'][:-1]}:{args[0]}" + (f"[{args[1]}]" if args[1] else "")


def plan_label(tr: TaskResult, c) -> str:
    """A plan as a reader wants it: the steps that run for graph plans, the knobs otherwise."""
    program = tr.task.backend.program(c)
    if program is None:
        return str(c)
    return " > ".join(step_name(s) for s in running_steps(program)) or "(constants only)"


def _pruned(stages) -> str:
    f = pruned_fraction(stages)
    return f" ({100 * f:.2f}% of the valid space never measured)" if f is not None else ""


def quant_line(q: dict[str, Any]) -> str:
    """A spec's ``quant`` record in one line: the format(s), the measured error and the budget."""
    if "formats" in q:  # a whole-graph plan
        fmts = ", ".join(f"{k} {v}" for k, v in sorted(q["formats"].items())) or "fp32 in every step"
    else:
        fmts = q["format"] + (f":{q['block']}" if q.get("block") else "") + \
            (" with int8 activations" if q.get("activations") == "int8" else "")
    e, b = q["error"], q["budget"]
    bound = "none stated (fp32 only)" if b.get("bound") is None else f"{b['metric']} {b['bound']:g}"
    return f"{fmts}; measured {e['metric']} {e['value']:.3g} on validation inputs; budget {bound}"


def print_summary(res: TuneResult, console: Console | None = None) -> None:
    con = console or Console()
    w = res.workload
    con.print(f"[bold]planforge tune[/] workload [cyan]{w.name}[/] ({w.description}); run {res.run_id}"
              + (" [yellow](resumed)[/]" if res.resumed else ""))
    for note in res.notes:
        con.print(f"[yellow]note:[/] {note}")
    for tr in res.tasks:
        r = tr.result
        con.print(f"\n[bold]task {tr.task.key}[/]: strategy {tr.strategy['name']} (seed {tr.strategy.get('seed')}), "
                  f"{r.evaluations} evaluations, {r.duplicates} duplicate proposals; stopped: {r.stop_reason}")
        counts = ", ".join(f"{k} {v}" for k, v in sorted(r.counts.items()))
        con.print(f"  outcomes: {counts or 'none'}")
        if tr.funnel:
            con.print("  funnel: " + " -> ".join(f"{s['stage']} {fmt_si(s['count'])}" for s in tr.funnel)
                      + _pruned(tr.funnel))
        curve = best_so_far(tr)
        if curve:
            steps = ", ".join(f"#{n}: {fmt_time(m)}" for n, m in r.curve)
            con.print(f"  best so far  {sparkline(curve)}  ({steps})")
        accepted = tr.walk.accepted.rank if tr.walk else None
        rejected = {f.rank: f for f in (tr.walk.rejected if tr.walk else (tr.error.rejected if tr.error else ()))}
        ranked = tr.ranked or r.ranked
        table = Table(title=f"ranked top-{ranked.k}" + (" (re-measured)" if tr.ranked is not r.ranked else ""),
                      title_justify="left")
        for col in ("rank", "latency", "plan", "validation"):
            table.add_column(col)
        for i, e in enumerate(ranked, start=1):
            if i == accepted:
                verdict = "[green]accepted[/]"
            elif i in rejected:
                verdict = "[red]rejected[/]: " + "; ".join(rejected[i].reasons)
            else:
                verdict = "not reached"
            table.add_row(str(i), fmt_time(e.metric), plan_label(tr, e.candidate), verdict)
        con.print(table)
        if tr.walk:
            a = tr.walk.accepted
            walked = ", ".join(f"rank {f.rank} rejected" for f in tr.walk.rejected)
            con.print(f"  finalist walk: {walked + ', ' if walked else ''}rank {a.rank} accepted at "
                      f"[bold green]{fmt_time(a.metric)}[/] ({plan_label(tr, a.candidate)})")
            q = ((res.spec or {}).get("tasks", {}).get(tr.task.key) or {}).get("quant")
            if q:
                con.print(Text(f"  weights: {quant_line(q)}"))
            if tr.task.info:
                i = tr.task.info
                con.print(f"  e-graph: {i.get('eclasses')} e-classes, {i.get('enodes')} e-nodes "
                          f"(saturation {i.get('saturation_s', 0):.3g} s, {i.get('saturation', {}).get('stop', '')}); "
                          f"{fmt_size(i.get('graph_choices', 0))} graph-level plans, genome of {fmt_size(i.get('genome_size', 0))} points; "
                          f"extraction greedy {i.get('greedy_s', 0) * 1e3:.3g} ms, ILP {i.get('ilp_s', 0) * 1e3:.3g} ms "
                          f"({i.get('ilp')}); {i.get('pruned_by_memory', 0)} e-nodes pruned by the memory budget")
        elif tr.error:
            con.print(f"  [red]finalist walk: {escape(str(tr.error))}[/]")
        if tr.baselines:
            libs = ", ".join(f"{n} {fmt_time(o.metric)}" if o.ok else f"{n} failed ({o.category})"
                             for n, o in sorted(tr.baselines.items()))
            con.print(f"  libraries (same inputs, re-measured interleaved with the finalists): {libs}")
            if tr.ratio_vs_library is not None:
                name, lib = tr.best_library
                r = 1 / tr.ratio_vs_library
                con.print(f"  tuned / best library = {tr.ratio_vs_library:.3f}: "
                          + (f"{r:.1f}x faster than {name}" if r >= 1 else f"{1 / r:.1f}x slower than {name}"))
            if tr.fallback:
                con.print(f"  [yellow]fallback to {escape(tr.fallback['to'])}[/]: {escape(tr.fallback['reason'])}")
        if tr.bound:
            b = tr.bound
            ratio = f"; the accepted plan runs at {b['of_bound']:.2f}x its bound" if b.get("of_bound") else ""
            if b.get("of_bound") and b["of_bound"] < 1:  # the ceilings were low; the roofline stage corrected them
                ratio += " (faster than the model's ceilings allow: re-run `planforge probe` on a quiet machine)"
            con.print(f"  roofline: bound {fmt_time(b['bound_s'])}, {b['limiter']}-limited prediction "
                      f"{fmt_time(b['predicted_s'])}{ratio}")
            far = [f"#{r['rank']} {r['of_bound']:.2f}x" for r in b.get("ranked", []) if r.get("of_bound")]
            if far:
                con.print("  ranked plans against their bounds: " + ", ".join(far))
        learned = tr.strategy.get("model", {}).get("heldout") if isinstance(tr.strategy.get("model"), dict) else None
        if learned and learned.get("spearman") is not None:
            rk = next((k for k in learned if k.startswith("top")), None)
            con.print(f"  learned model ({tr.strategy['model']['name']}, {tr.strategy['model']['fits']} fits, "
                      f"warm start {tr.strategy['model']['warm_start']}) on {learned['pairs']} held-out measurements: "
                      f"Spearman {learned['spearman']:.2f}, Kendall {learned['kendall']:.2f}"
                      + (f", {rk.replace('_', ' ')} {learned[rk]:.2f}" if rk and learned.get(rk) is not None else ""))
            if learned["spearman"] < LOW_SPEARMAN:
                con.print(f"  [yellow]warning: the learned model ranks poorly (Spearman {learned['spearman']:.2f} "
                          f"< {LOW_SPEARMAN}); its picks are little better than random here[/]")
        if tr.task.cost_model is not None:
            rho = tr.proxy_spearman
            msg = f"  proxy ({tr.task.cost_model.name}) vs measured: Spearman {rho:.2f}" if rho is not None else \
                f"  proxy ({tr.task.cost_model.name}) vs measured: Spearman n/a (fewer than 3 distinct measurements)"
            con.print(msg)
            if rho is not None and rho < LOW_SPEARMAN:
                con.print(f"  [yellow]warning: the proxy ranks poorly (Spearman {rho:.2f} < {LOW_SPEARMAN});"
                          " do not trust proxy-only selection here[/]")
    e2e = res.end_to_end
    if e2e is not None:
        part = w.partition
        con.print(f"\n[bold]end to end[/]: {len(part.parts)} parts in {len(w.tasks)} tasks ({escape(part.reason)})")
        con.print(f"  whole plan: median [bold green]{fmt_time(e2e.median_s)}[/], p99 {fmt_time(e2e.p99_s)} over "
                  f"{e2e.samples} calls; {e2e.library} {fmt_time(e2e.library_median_s)} (p99 "
                  f"{fmt_time(e2e.library_p99_s)}): {e2e.speedup:.2f}x faster", highlight=False)
        if e2e.peers:  # the runtimes the user would otherwise run the model with, timed in the same rounds
            timed = [f"{k} {fmt_time(v['median_s'])} (plan {e2e.median_s / v['median_s']:.2f}x)"
                     for k, v in e2e.peers.items() if "median_s" in v]
            skipped = [f"{k} ({v['skipped']})" for k, v in e2e.peers.items() if "skipped" in v]
            con.print(Text(f"  against the model's runtimes: {'; '.join(timed) or 'none timed'}; fastest of all: "
                           f"{e2e.fastest[0]} (plan {e2e.ratio_vs_fastest:.2f}x its time)"))
            if skipped:
                con.print(Text(f"  not timed: {'; '.join(skipped)}"))
        if e2e.accuracy is not None:  # quantised parts: the whole output against the workload's budget
            a = e2e.accuracy
            verdict = f"over budget: {a['excess']}" if a["excess"] else "within the budget"
            con.print(Text(f"  whole-model accuracy ({', '.join(a['quantised_tasks'])} quantised): {a['metric']} "
                           f"{a['value']:.3g} against {a['budget']['bound']:g}: {verdict}"),
                      style="red" if a["excess"] else None)
        for sh in e2e.shares:  # Amdahl order: where the time goes
            d = e2e.decisions.get(sh["task"], {})
            note = "" if d.get("decision", "tuned") == "tuned" and "below" not in d.get("reason", "") else \
                f"; {escape(d.get('reason', ''))}"
            con.print(f"  {sh['task']} x{sh['weight']}: {fmt_time(sh['latency_s'])} each, "
                      f"{100 * sh['share']:.1f}% of the time{note}", highlight=False)
        c = e2e.control
        if c is not None:
            verdict = "[green]holds[/]" if c["holds"] else "[red]does not hold[/]"
            con.print(f"  control loop: a chunk of {c['chunk_steps']} steps computes in {fmt_time(c['chunk_compute_s'])} "
                      f"(p99 {fmt_time(c['chunk_compute_p99_s'])}) and executes in {fmt_time(c['chunk_execute_s'])}; "
                      f"effective {c['effective_hz']:.3g} Hz of {c['control_hz']:g} Hz with double buffering: {verdict}",
                      highlight=False)
    if w.phases:
        con.print("  planning phases: " + ", ".join(f"{k.removesuffix('_s')} {v:.3g} s" for k, v in w.phases.items()),
                  highlight=False)
    if res.ok:
        con.print(f"\nbreak-even: {library_break_even(res)}", highlight=False)
    if res.spec_path:
        con.print(f"spec: [bold]{res.spec_path}[/]   records: {res.records_path}")
    if len(res.by_target) > 1:
        con.print(f"\n[bold]{len(res.by_target)} kinds of machine[/] (device fingerprints), each tuned on its own:")
        for target, trs in res.by_target.items():
            plans = ", ".join(f"{tr.task.key} {fmt_time(tr.walk.accepted.metric)} "
                              f"({plan_label(tr, tr.walk.accepted.candidate)})" if tr.walk else
                              f"{tr.task.key}: no valid plan" for tr in trs)
            spec = res.specs.get(target)
            con.print(f"  {target}{' (above)' if target == res.target else ''}: {plans}; "
                      f"{trs[0].result.evaluations} evaluations; spec {spec or 'not written'}", highlight=False)
    if res.report_path:
        con.print(f"report: [bold]{res.report_path}[/] (plots, funnel, roofline, finalist walk; open in a browser)")


def library_break_even(res: TuneResult) -> str:
    """The search's cost against what the plan saves per run over the fastest library (what a user would
    otherwise run): end to end for a workload of several tasks."""
    e2e = res.end_to_end
    if e2e is not None:
        saved, against = e2e.library_median_s - e2e.median_s, e2e.library
    elif all(tr.best_library and tr.walk for tr in res.tasks):
        saved = sum((tr.best_library[1] - tr.walk.accepted.metric) * tr.task.weight for tr in res.tasks)
        against = ", ".join(sorted({tr.best_library[0] for tr in res.tasks}))
    else:  # nothing to compare with (a table): against the first plan the search measured
        return (f"no library was measured; against the first plan measured, search took {res.seconds:.3g} s and "
                f"saves {fmt_time(res.saved_s)} per run: pays back after {fmt_count(res.break_even)} runs")
    if saved <= 0:
        return f"never: {against} is at least as fast, so the plan falls back to it"
    return (f"search took {res.seconds:.3g} s and saves {fmt_time(saved)} per run over {against}: pays back after "
            f"{fmt_si(math.ceil(res.seconds / saved))} runs")


def summary_json(res: TuneResult) -> dict[str, Any]:
    tasks = {}
    for tr in res.tasks:
        r = tr.result
        d: dict[str, Any] = {
            "strategy": tr.strategy, "evaluations": r.evaluations, "duplicates": r.duplicates,
            "stop_reason": r.stop_reason, "counts": dict(r.counts), "curve": [[n, m] for n, m in r.curve],
            "from_records": sum(t.cached for t in r.trials),  # outcomes a resumed run took instead of measuring
            "ranked": [{"rank": i, "latency_s": e.metric, "plan": e.candidate.as_dict()}
                       for i, e in enumerate(r.ranked, start=1)],
            "proxy_spearman": tr.proxy_spearman,
            "funnel": tr.funnel,
        }
        if tr.funnel:
            d["funnel_pruned"] = pruned_fraction(tr.funnel)
        if tr.bound:
            d["bound"] = tr.bound
        if tr.baselines:
            lib = tr.best_library
            d["baselines"] = {n: o.metric for n, o in sorted(tr.baselines.items())}
            d["library_latency_s"] = lib[1] if lib else None
            d["ratio_vs_library"] = tr.ratio_vs_library
            d["fallback"] = tr.fallback
        if tr.walk:
            d["accepted"] = tr.walk.accepted.to_json()
            d["rejected"] = [f.to_json() for f in tr.walk.rejected]
            d["latency_s"] = tr.walk.accepted.metric
        else:
            d["error"] = str(tr.error)
            d["rejected"] = [f.to_json() for f in tr.error.rejected] if tr.error else []
        tasks[tr.task.key] = d
    out: dict[str, Any] = {
        "workload": res.workload.name, "ok": res.ok, "run_id": res.run_id, "resumed": res.resumed,
        "search_seconds": res.seconds, "saved_s_per_run": res.saved_s,
        "break_even_runs": res.break_even if math.isfinite(res.break_even) else None,
        "spec": str(res.spec_path) if res.spec_path else None, "records": str(res.records_path), "tasks": tasks,
        "report": str(res.report_path) if res.report_path else None,
        "target": res.target, "specs": {t: str(p) for t, p in res.specs.items()},
        # each device fingerprint's accepted plan per task (a heterogeneous cluster tunes each kind of machine)
        "by_target": {t: {tr.task.key: {"latency_s": tr.walk.accepted.metric if tr.walk else None,
                                        "plan": tr.walk.accepted.candidate.as_dict() if tr.walk else None,
                                        "evaluations": tr.result.evaluations} for tr in trs}
                      for t, trs in res.by_target.items()},
    }
    if res.end_to_end is not None:
        out["end_to_end"] = res.end_to_end.to_json()
    if res.workload.phases:
        out["phases"] = dict(res.workload.phases)
    if len(tasks) == 1:
        only = next(iter(tasks.values()))
        for k in ("latency_s", "library_latency_s", "ratio_vs_library", "fallback", "funnel"):
            if k in only:
                out[k] = only[k]
    return out
