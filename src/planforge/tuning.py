"""The tuning driver: workload -> per-task search -> finalists -> spec, with every outcome recorded.

Each task is searched by the one tuning loop (``planforge.search.loop``) on
the executor asked for (one slot on this thread by default), behind the
funnel's roofline screen; the finalists are re-measured beside the
libraries, walked through the validators, and the spec, run.json and the
report are written. ``planforge.tune`` (the API) calls ``tune`` here.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from . import __version__
from .costmodel import spearman
from .costmodel.calibrated import PerStratum
from .costmodel.funnel import Analytic, Funnel, pruned_fraction
from .costmodel.learned import history
from .l2 import L2Settings, task_phase, trigger as l2_trigger
from .report.html import write_report
from .report.run import write_run
from .results import FALLBACK_WITHIN, PlanLoader, TaskResult, TuneResult, library_instead, toolchain
from .measure.executor import make_executor
from .search import Budget, NoValidFinalist, Ranked, SearchResult, Trial, Walk, make_strategy, walk_finalists
from .search.scheduler import DEFAULT_WARMUP, Grant, TaskSearch, TaskState, compact, make_scheduler, schedule
from .search.strategies import Strategy
from .search.warm import WarmError, WarmStart, warm_note
from .spec import Records, SCHEMA_VERSION, spec_filename, write_spec
from .warmstart import auto_warm, load_sources
from .validate.accuracy import ACT_KNOB, BLOCK_KNOB, FORMAT_KNOB, step_format
from .workloads import Task, Workload

FINALIST_ROUNDS = 3
SEEDS_FIRST = 2  # seed candidates a task measures first at any budget (``_task_search``)
OPEN_EXECUTORS = 4  # tasks of a scheduled workload whose executors stay open between their grants (the latest granted)

__all__ = ["FALLBACK_WITHIN", "FINALIST_ROUNDS", "TaskResult", "TuneResult", "build_spec", "task_spec",
           "toolchain", "tune"]


def _finalist_json(rank: int, e) -> dict[str, Any]:
    return {"rank": rank, "latency_s": e.metric, "plan": e.candidate.as_dict(),
            "fingerprint": e.candidate.fingerprint, "reasons": []}


def task_spec(tr: TaskResult, budget: Budget) -> dict[str, Any]:
    r, w, t = tr.result, tr.walk, tr.task
    acc = w.accepted if w is not None else None  # None: a part that runs its library (``library_only``)
    lib = tr.best_library
    d: dict[str, Any] = {
        "weight": t.weight,
        "plan": acc.candidate.as_dict() if acc else None,
        "fingerprint": acc.candidate.fingerprint if acc else None,
        "latency_s": tr.latency,
        "rank": acc.rank if acc else None,
        "baselines": {name: o.metric for name, o in sorted(tr.baselines.items()) if o.ok},
        "ratio_vs_baseline": tr.ratio_vs_library,
        "fallback": tr.fallback,
        "selected": tr.fallback["to"] if tr.fallback else "tuned",
        "rejected_finalists": [f.to_json() for f in (w.rejected if w else tr.error.rejected if tr.error else ())],
        "ranked": [_finalist_json(i, e) for i, e in enumerate(tr.ranked or r.ranked, start=1)],
        "search": {
            "strategy": tr.strategy,
            "seed": tr.strategy.get("seed", 0),
            "budget": {"evals": budget.evals, "seconds": budget.seconds},
            "evaluations": r.evaluations,
            "duplicates": r.duplicates,
            "stop_reason": r.stop_reason,
            "curve": [[n, m] for n, m in r.curve],
            "counts": dict(sorted(r.counts.items())),
            "space": {"size": t.space.size, "knobs": len(t.space.knobs)},
        },
    }
    if acc is None:
        d["no_plan"] = tr.library_only["reason"]
    else:
        d.update(_accepted_json(tr, acc))
    if tr.funnel:
        d["funnel"] = tr.funnel
        d["funnel_pruned"] = pruned_fraction(tr.funnel)  # of the valid space, never measured
    if tr.bound:
        d["bound"] = tr.bound
    if lib is not None:
        d["library_latency_s"] = lib[1]
    failed = {n: f"{o.category}: {o.message[:200]}" for n, o in sorted(tr.baselines.items()) if not o.ok}
    if failed:
        d["baseline_failures"] = failed
    if t.cost_model is not None:
        measured = [x for x in r.trials if x.outcome.ok]
        d["proxy"] = {"name": t.cost_model.name, "spearman": tr.proxy_spearman, "pairs": len(measured)}
    return d


def _accepted_json(tr: TaskResult, acc) -> dict[str, Any]:
    """What a task's spec says of its accepted plan beyond its knobs: peak memory, the L2 proposer it came from,
    its weight format, and the program a whole-graph plan runs."""
    t, d = tr.task, {}
    if acc.peak_bytes is not None:
        d["peak_bytes"] = acc.peak_bytes
    kept = (tr.l2 or {}).get("kept")
    if kept and kept["fingerprint"] == acc.candidate.fingerprint:  # the plan came from an L2 proposer
        d["l2"] = {"proposer": kept["proposer"], "trigger": tr.l2["trigger"], "latency_s": kept["latency_s"],
                   "incumbent_s": (tr.l2.get("incumbent") or {}).get("latency_s")}
    if t.record is not None:  # a quantised task: the format, its measured error, the tiles and the budget
        d["quant"] = t.record(acc.candidate)
    program = t.backend.program(acc.candidate)
    if program is not None:  # a whole-graph plan: the program is what `planforge run` executes
        d["program"] = program
        d["graph"] = {k: v for k, v in t.info.items() if k != "saturation"}
    return d


def build_spec(workload: Workload, tasks: list[TaskResult], budget: Budget, target: str | None = None,
               e2e=None) -> dict[str, Any]:
    """The spec of ``tasks`` as tuned on device ``target`` (default: the first task's backend's); ``e2e``: the
    whole plan's end-to-end figures (``endtoend.EndToEnd``) of a partitioned model, whose task-level decisions
    then say what each task runs."""
    backend = tasks[0].task.backend
    spec = {
        "schema_version": SCHEMA_VERSION,
        "planforge_version": __version__,
        "manifest": {**workload.manifest.to_json(), "key": workload.manifest.key},
        "target": {"backend": backend.name, "fingerprint": target or backend.fingerprint},
        "toolchain": toolchain(),
        "tasks": {tr.task.key: task_spec(tr, budget) for tr in tasks},
    }
    if workload.partition is not None:
        from .endtoend import partition_json

        spec["partition"] = partition_json(workload)
    if e2e is not None:
        spec["end_to_end"] = e2e.to_json()
        for key, d in e2e.decisions.items():  # the task-level 95% rule overrides the per-task one
            t = spec["tasks"][key]
            t["task_level"] = d
            t["selected"] = d["decision"]
            t["fallback"] = None if d["decision"] == "tuned" else {"to": d["decision"], "reason": d["reason"]}
    return spec


def tune(workload: Workload, strategy: str = "auto", budget: Budget = Budget(evals=64), seed: int = 0,
         keep: int = 4, out: str | os.PathLike | None = None, records: str | os.PathLike | None = None,
         resume: bool = False, strategy_options: dict[str, Any] | None = None,
         on_trial: Callable[[Task, Trial], None] | None = None, command: str = "",
         executor: dict[str, Any] | None = None, funnel: bool = True, plan_loader: PlanLoader | None = None,
         scheduler: str = "gradient", scheduler_options: dict[str, Any] | None = None,
         on_grant: Callable[[Grant, Sequence[TaskState]], None] | None = None,
         warm_start: Sequence[str | os.PathLike] = (), l2: L2Settings | None = None) -> TuneResult:
    """Tune every task of ``workload``; write ``out/spec.json`` when ``out`` is given.

    Parameters:
        strategy: a name from ``planforge.search.STRATEGIES`` or ``auto``.
        budget: unique evaluations and/or seconds: a one-task workload's, or
            the total over a workload of several tasks, which the scheduler
            spends across them.
        scheduler: how a workload of several tasks spends the budget:
            ``gradient`` (default: each grant to the task of the largest
            estimated end-to-end gain per evaluation, after a warm-up round)
            or ``round-robin`` (evenly); see ``planforge.search.scheduler``.
        scheduler_options: ``warmup`` (evaluations per task first, default
            ``DEFAULT_WARMUP``), ``step`` (evaluations per grant, default:
            as many as the executor takes at once, 1 on one slot) and the
            scheduler's own settings (gradient: ``alpha``, ``window``,
            ``patience``); default none.
        on_grant: called after each grant with it and every task's state
            (progress display; workloads of several tasks only).
        seed: seeds the strategy; the same seed gives the same spec.
        keep: size of the ranked top-k that the finalist walk goes through.
        records: the records database (default ``out/records.db``, or
            ``./planforge-records.db`` without ``out``).
        resume: continue the latest interrupted run with the same workload and
            settings, taking every recorded outcome instead of measuring it.
        on_trial: called with each outcome as it arrives (progress display).
        executor: where measurements run: ``{"kind": "local"|"ray", **options}``
            (see ``planforge.measure.executor``); default None: one slot,
            measuring on this thread (as does ``local`` with one worker).
            Slots of several device fingerprints (a heterogeneous cluster) tune
            each fingerprint on its own, with the whole ``budget`` each: the
            driver's fingerprint (else the one with the most measurements)
            gives ``out/spec.json``, every other one ``out/spec-FINGERPRINT.json``
            (see ``planforge.spec.spec_filename``).
        funnel: run the L0 funnel before the search (default True): a task
            with an analytic model is searched among the capacity survivors'
            predicted top-k only, and a proposal whose roofline bound is
            slower than the best measured is never measured (on every
            executor: the screen is the tuning loop's).
        plan_loader: ``f(spec_path, workload) -> callable`` that the result's
            ``plan`` loads the spec with (the API passes ``planforge.load``'s;
            default None: ``plan`` says to load the spec by hand).
        warm_start: records databases, Kernel Tuner caches or T4 files of the
            same kernel (the same knob names) tuned on other devices or shapes
            (``planforge.warmstart``): their best configurations are proposed
            first and a strategy with a model takes them as a prior. Without
            it, ``auto`` warm-starts from the records database by itself when
            it holds the same task under another device fingerprint or a
            nearby shape of it (default: none).
        l2: L2 proposers after each task's search and finalists (``planforge.l2``): ``L2Settings(mode, budget,
            proposer)``; in ``auto`` a task below the 95% rule gets ``budget`` more evaluations of proposals
            (and, when a partitioned model's task-level target is missed, every task; a kept plan re-measures
            the whole plan), ``always`` every task; a proposal is kept only when it beats the accepted plan re-measured beside
            it (default None: off).
    """
    t0 = time.perf_counter()
    out_path = Path(out) if out is not None else None
    rec_path = Path(records) if records is not None else (out_path / "records.db" if out_path else Path("planforge-records.db"))
    config = {"strategy": strategy, "seed": seed, "budget": [budget.evals, budget.seconds], "keep": keep,
              "options": strategy_options or {}, "targets": [t.backend.fingerprint for t in workload.tasks],
              **({} if funnel else {"funnel": False}),
              **({"l2": l2.to_json()} if l2 is not None and l2.mode != "off" else {})}
    if len(workload.tasks) > 1:  # a resumed run must spend the budget the same way
        config["scheduler"] = [scheduler, scheduler_options or {}]
    sources = None
    if warm_start:  # a file that cannot be read or does not fit fails before anything is measured
        sources = load_sources(warm_start, *_knob_names(workload))
        if len(workload.tasks) == 1:
            WarmStart(workload.tasks[0].space, sources)
    db = Records(rec_path)
    try:
        run_id, resumed = db.start_run(workload.name, workload.manifest.key, config, command, resume)
        notes = [] if resumed or not resume else ["nothing to resume with these settings: started a new run"]
        closers = [t.backend.close for t in workload.tasks]
        try:
            per_task, schedule_json = _search_tasks(db, run_id, workload, strategy, budget, seed, keep,
                                                    strategy_options or {}, on_trial, funnel, executor, scheduler,
                                                    scheduler_options or {}, on_grant, sources)
        except KeyboardInterrupt:
            db.end_run(run_id, "interrupted")
            raise
        except BaseException:
            db.end_run(run_id, "failed")
            raise
        finally:
            for close in closers:
                close()
        main = next(iter(per_task[0]))
        if l2 is not None and l2.mode != "off":  # L2 after L1 and the finalists, on this machine's results
            _l2_round(db, run_id, workload, per_task, main, l2, notes)
        if workload.partition is not None:  # a part with no valid plan runs its library; the others keep theirs
            for d in per_task:
                if main in d:
                    d[main] = library_instead(d[main])
        results = [d.get(main) or next(iter(d.values())) for d in per_task]
        notes.extend(f"task {tr.task.key}: {tr.library_only['reason']}" for tr in results if tr.library_only)
        notes.extend(warm_note(tr.task.key, tr.strategy.get("warm_start")) for tr in results
                     if tr.strategy.get("warm_start"))
        by_target: dict[str, list[TaskResult]] = {}
        for d in per_task:
            for where, tr in d.items():
                by_target.setdefault(where, []).append(tr)
        ok = all(r.planned for r in results)
        e2e = None
        if ok and workload.partition is not None and workload.target is not None:
            # the task-level objective: the whole plan, chained from every task's choice, measured end to end
            from .endtoend import end_to_end
            from .workloads.objective import Objective

            objective = Objective.parse(workload.manifest.options.get("objective"))
            e2e, _, peers = end_to_end(workload, results, objective, workload.target, seed)
            if l2 is not None and l2.mode == "auto" and not e2e.holds:
                # the task-level target missed: L2 on the tasks it had not run on; a kept plan changes the chain
                kept = _l2_round(db, run_id, workload, per_task, main, l2, notes, task_level_missed=True)
                results = [d.get(main) or next(iter(d.values())) for d in per_task]
                by_target[main] = [d[main] for d in per_task if main in d]
                if kept:
                    e2e, _, _ = end_to_end(workload, results, objective, workload.target, seed, peers=peers)
        spec = build_spec(workload, results, budget, main, e2e) if ok else None
        if spec is not None and schedule_json is not None:  # how the budget was spent across the tasks
            spec["schedule"] = schedule_json
        specs = {main: write_spec(spec, out_path / spec_filename())} if (spec and out_path) else {}
        for where, trs in by_target.items():  # the other kinds of machine of a heterogeneous cluster
            if where == main:
                continue
            if len(trs) < len(workload.tasks) or any(tr.walk is None for tr in trs):
                notes.append(f"device {where}: no spec, not every task found a valid plan there")
            elif out_path:
                specs[where] = write_spec(build_spec(workload, trs, budget, where), out_path / spec_filename(where))
        db.end_run(run_id, "done" if ok else "failed")
        res = TuneResult(workload, results, spec, specs.get(main), run_id, resumed, rec_path,
                         time.perf_counter() - t0, notes, target=main, by_target=by_target, specs=specs,
                         plan_loader=plan_loader, end_to_end=e2e)
        if out_path is not None:  # run.json holds what the spec leaves out (wall times, trials); the report reads it
            res.report_path = write_report(write_run(res, out_path, command).parent)
        return res
    finally:
        db.close()


def _search_tasks(db: Records, run_id: str, workload: Workload, strategy: str, budget: Budget, seed: int, keep: int,
                  options: dict[str, Any], on_trial, funnel: bool, executor: dict[str, Any] | None, scheduler: str,
                  scheduler_options: dict[str, Any], on_grant, sources=None
                  ) -> tuple[list[dict[str, TaskResult]], dict | None]:
    """Search every task of ``workload``, then give each its finalists: per task its result per device
    fingerprint (the main one first), and how the scheduler spent the budget (None for a single task).

    A single task takes the whole budget in one grant (its search is the loop's, as it always was); several
    share it: ``schedule`` gives each a warm-up round, then grants of ``step`` evaluations by the scheduler."""
    opts = dict(scheduler_options)
    warmup, step = opts.pop("warmup", DEFAULT_WARMUP), opts.pop("step", None)
    sched = make_scheduler(scheduler, **opts)  # a bad name or option fails before anything is measured
    many = len(workload.tasks) > 1
    # what `auto` sizes its choice by (exhaustive when the valid space fits): a task's even share of the budget
    hint = budget.evals if not many or budget.evals is None else max(1, budget.evals // len(workload.tasks))
    made = [_task_search(db, run_id, workload, task, strategy, budget, hint, seed, keep, options, on_trial, funnel,
                         executor, sources) for task in workload.tasks]
    searches = [m[0] for m in made]
    try:
        if not many:
            searches[0].grant(budget.evals, budget.seconds)
            schedule_json = None
            joined = [searches[0].result()]
        else:
            step = step or searches[0].width()  # a grant fills the executor's slots
            # a task's executor holds its workers (processes, core claims, actors) between its grants: only
            # the few tasks granted last keep theirs, so a model of many tasks does not hold a set per task
            inline = not executor or executor.get("kind", "local") == "inline"
            grants = schedule(searches, sched, budget.evals, warmup=warmup, step=step, seconds=budget.seconds,
                              on_grant=on_grant, open_limit=None if inline else OPEN_EXECUTORS)
            spent = sum(g.spent for g in grants)
            joined = [s.result(f"the workload's budget of {budget.evals} evaluations spent, {s.state.evals} "
                               f"of them on this task" if budget.evals is not None else
                               f"the workload's time budget of {budget.seconds:g} s spent") for s in searches]
            schedule_json = {"scheduler": sched.describe(), "budget": {"evals": budget.evals, "seconds": budget.seconds},
                             "warmup": warmup, "step": step, "grants": compact(grants),
                             "evaluations": {s.state.key: s.state.evals for s in searches}, "spent": spent}
    finally:
        for s in searches:
            s.close()
    return [finish(r) for (_, finish), r in zip(made, joined)], schedule_json


def _knob_names(workload: Workload) -> tuple[Sequence[str] | None, str | None]:
    """The knob names and key of a one-kernel workload's task, which a records database is read by."""
    t = workload.tasks[0]
    return (t.space.names, t.key) if len(workload.tasks) == 1 else (None, None)


def _task_search(db: Records, run_id: str, workload: Workload, task: Task, strategy: str, budget: Budget,
                 hint: int | None, seed: int, keep: int, options: dict[str, Any], on_trial, funnel: bool = True,
                 executor: dict[str, Any] | None = None, sources=None
                 ) -> tuple[TaskSearch, Callable[[SearchResult], dict]]:
    """``task``'s search, to be run in grants, and ``finish(result)``: its result per device fingerprint tuned
    (one, but for a heterogeneous cluster), the main one first. ``hint``: the evaluations ``auto`` sizes its
    choice of strategy by."""
    if task.seeds:
        # the seeds come first, but take at most a third of the task's evaluations beyond its lead seeds: at a small
        # budget a graph's five extractions would otherwise be all it measures, none of their knobs tuned; the
        # others wait for the search's first phase to end (``Genetic``'s ``later``)
        k = len(task.seeds) if hint is None else max(task.lead_seeds, SEEDS_FIRST, hint // 3)
        options = {**options, "initial": list(task.seeds[:k]), **({"later": list(task.seeds[k:])} if
                                                                  k < len(task.seeds) else {})}
    driver = task.backend.fingerprint

    def warm_on(space, target: str) -> WarmStart | None:
        # the sources given, or (auto) this task on other devices and nearby shapes in the records
        if sources is not None:
            try:
                return WarmStart(space, sources)
            except WarmError:
                if len(workload.tasks) == 1:
                    raise
                return None  # the sources are another task's
        return auto_warm(db, space, task.key, target, run_id) if strategy == "auto" else None

    # the funnel keeps the sources' best configurations beside its roofline top-k (the warm stage)
    screen = Funnel(task.cost_model if funnel else None, min_k=4 * (budget.evals or 16),
                    warm=warm_on(task.space, driver) if funnel else None,
                    warm_k=budget.evals or 32, seed=seed).screen(task.space)
    space = screen.space
    if not task.seeds and FORMAT_KNOB in space.names:
        # a kernel whose weight format is a gene: the best predicted point of each format is measured first,
        # so that the formats are compared on measurements before the model's ranking (which counts bytes and
        # would spend the first batch on the smallest format) decides where the rest go
        firsts = format_firsts(space, max(2, (budget.evals or 16) // 3))
        if len(firsts) > 1:
            options = {**options, "initial": firsts}
    # the roofline is corrected by the measurements as they arrive: a term per format, so that after the firsts
    # the search ranks the formats as they ran, and a term per tile knob value shared by the formats, so that
    # what the tiles measured in one format ranks the same tiles in the others (one correction per device
    # fingerprint)
    calibrated: dict[str, PerStratum] = {}

    def model_for(target: str):
        if FORMAT_KNOB not in space.names or not isinstance(task.cost_model, Analytic):
            return task.cost_model
        return calibrated.setdefault(target, PerStratum(task.cost_model, step_format, tiles=tile_knobs))

    def strategy_for(target: str) -> Strategy:
        # each device fingerprint's search: the same strategy and seed, its own state, its own warm start
        warm = warm_on(space, target)
        strat = make_strategy(strategy, space, seed, budget=hint, cost_model=model_for(target), warm=warm, **options)
        if FORMAT_KNOB in space.names and strat.name == "model" and "batch" not in options:
            # a joint space's model learns the tiles from measurements of each format (the correction's tile
            # terms need a format measured at two tiles or more): re-plan after a quarter of the budget, not
            # after the default batch of 8, which at a budget of 12 is every point after the firsts
            strat.batch = max(2, (budget.evals or 16) // 4)
        # learned models start from this template's earlier runs on this device (a no-op for the others),
        # less the tasks the warm start hands them already (one query group each, not two)
        given = {lbl.rsplit(" on ", 1)[0] for lbl in (warm.labels if warm else ()) if lbl.endswith(f" on {target}")}
        strat.warm_start([r for r in history(db, target, task.key, space.names, exclude_run=run_id)
                          if r[0].split("@", 1)[0] not in given])
        return strat

    def cache_for(target: str):  # a resumed run takes each fingerprint's own outcomes
        return db.outcomes(run_id, task.key, target)

    def record(trial: Trial, target: str | None = None) -> None:
        model = calibrated.get(target or driver)
        if model is not None and trial.outcome.ok:
            model.observe(trial.candidate, trial.outcome.metric)
        if not trial.cached:
            db.add(run_id, workload.manifest.key, task.key, target or driver, trial.candidate.fingerprint,
                   trial.candidate.as_dict(), trial.outcome, trial.n)
        if on_trial:
            on_trial(task, trial)

    if executor and executor.get("kind", "local") == "local" and executor.get("workers", 1) <= 1:
        executor = None  # one local worker: the slot on this thread, measuring the task's backend itself
    ex_opts = dict(executor or {"kind": "inline"})
    kind = ex_opts.pop("kind", "local")
    # each outcome is recorded under the fingerprint of the device that measured it; the roofline screen
    # sits in front of every slot; results settle in submission order, so that the same seed gives the same
    # spec whichever slot is quicker (and, for a strategy that does not adapt, on one slot or many)
    search = TaskSearch(task.key, task.weight, space, strategy_for, lambda: make_executor(kind, task.backend, **ex_opts),
                        driver, keep=keep, cache_for=cache_for, on_done=record, screen=screen, ordered=True, kind=kind)

    def finish(result: SearchResult) -> dict[str, TaskResult]:
        results = result.by_target or {driver: result}
        main = next(w for w, r in results.items() if r is result)
        # (a cluster that had no slot at all made no strategy: describe the one it would have used)
        return {w: _task_result(task, results[w], search.strategies.get(w) or strategy_for(w), screen, keep,
                                here=w == driver) for w in [main, *(w for w in results if w != main)]}

    return search, finish


def _task_result(task: Task, result: SearchResult, strat: Strategy, screen, keep: int, here: bool) -> TaskResult:
    """Finalists, libraries and the walk for one device fingerprint's search. Only times of this machine
    (``here``) are re-measured and compared with its libraries: another kind of machine's ranking stands as
    its search measured it."""
    rho = None
    if task.cost_model is not None:
        measured = [x for x in result.trials if x.outcome.ok]
        rho = spearman(task.cost_model.predict([x.candidate for x in measured]), [x.outcome.metric for x in measured])
    ranked, baselines = result.ranked, {}
    if here and len(ranked):
        # re-measure the finalists and the libraries interleaved, then choose on those times; the search's starting
        # point goes with them (it drops out again unless it beats one)
        cands = [e.candidate for e in ranked]
        start = _starting_point(task, result)
        if start is not None and all(c.fingerprint != start.fingerprint for c in cands):
            cands.append(start)
        outs, baselines = task.backend.remeasure(cands, rounds=FINALIST_ROUNDS)
        ranked = Ranked(keep)
        for c, o in zip(cands, outs):
            if o.ok:
                ranked.insert(o.metric, c, o)
    elif here:
        baselines = task.backend.baselines()
    try:
        walk = walk_finalists(ranked, task.validators, task.peak_bytes)
        err = None
    except NoValidFinalist as e:
        walk, err = _walk_further(task, result, ranked, e, keep, here)
    best = result.ranked.best.metric if len(result.ranked) else None
    return TaskResult(task, result, walk, strat.describe(), rho, err, ranked, baselines,
                      screen.stages(result.evaluations, best), _bound(task, walk, ranked))


def _starting_point(task: Task, result: SearchResult):
    """The candidate the search started from (the task's first seed, else its first evaluation), when it was
    measured and ran. It is re-measured beside the finalists: on a shared host whose speed steps by up to 2x for
    seconds at a time, a search's early measurements can fall in a slow stretch and the later ones in a fast one,
    and the top-k is then made of the plans measured late rather than the fastest. MobileNetV2 at 96x96: a part's
    seed measured 154 us, then plans whose only change was one GEMM's setting 112 us; alone, interleaved, that
    setting ran 60-85 us against the seed's 41-49."""
    ok = [t for t in result.trials if t.outcome.ok]
    if not ok:
        return None
    if task.seeds:
        first = task.seeds[0].fingerprint
        return next((t.candidate for t in ok if t.candidate.fingerprint == first), None)
    return min(ok, key=lambda t: t.n).candidate


WALK_FURTHER = 3  # batches of the next-best measured plans walked when every finalist fails validation


def _walk_further(task: Task, result: SearchResult, ranked: Ranked, first: NoValidFinalist, keep: int,
                  here: bool) -> tuple[Any, NoValidFinalist | None]:
    """When every finalist fails validation (a quantised top-k all over its accuracy budget, say), the next-best
    plans the search measured, ``keep`` at a time (re-measured on this machine), up to ``WALK_FURTHER`` batches:
    a valid plan that was measured is not lost because faster invalid ones filled the top-k. Returns the walk
    (its ranks counted on from the finalists') or the error of all that were walked."""
    rejected = list(first.rejected)
    seen = {e.candidate.fingerprint for e in ranked} | {f.candidate.fingerprint for f in rejected}
    pool, fps = [], set()
    for x in sorted((x for x in result.trials if x.outcome.ok), key=lambda x: x.outcome.metric):
        if x.candidate.fingerprint not in seen | fps:
            fps.add(x.candidate.fingerprint)
            pool.append(x)
    for i in range(WALK_FURTHER):
        batch = pool[i * keep:(i + 1) * keep]
        if not batch:
            break
        cands = [x.candidate for x in batch]
        outs = task.backend.remeasure(cands, libraries=(), rounds=FINALIST_ROUNDS)[0] if here \
            else [x.outcome for x in batch]
        more = Ranked(keep)
        for c, o in zip(cands, outs):
            if o.ok:
                more.insert(o.metric, c, o)
        offset = len(rejected)
        try:
            w = walk_finalists(more, task.validators, task.peak_bytes)
        except NoValidFinalist as e:
            rejected += [dataclasses.replace(f, rank=f.rank + offset) for f in e.rejected]
            continue
        return Walk(dataclasses.replace(w.accepted, rank=w.accepted.rank + offset),
                    tuple(rejected) + tuple(dataclasses.replace(f, rank=f.rank + offset) for f in w.rejected)), None
    return None, NoValidFinalist(rejected)


def _bound(task: Task, walk, ranked: Ranked) -> dict[str, Any] | None:
    """The analytic model's figures for the accepted plan and the ranked ones (None without a model)."""
    if walk is None or not isinstance(task.cost_model, Analytic):
        return None
    bound = task.cost_model.estimate([walk.accepted.candidate]).row(0)
    bound["of_bound"] = walk.accepted.metric / bound["bound_s"] if bound["bound_s"] > 0 else None
    lbs = task.cost_model.lower_bound([e.candidate for e in ranked])
    bound["ranked"] = [{"rank": i, "bound_s": b, "of_bound": e.metric / b if b > 0 else None}
                       for i, (e, b) in enumerate(zip(ranked, lbs), start=1)]
    return bound


def _l2_round(db: Records, run_id: str, workload: Workload, per_task: list[dict[str, TaskResult]], main: str,
              l2: L2Settings, notes: list[str], task_level_missed: bool = False) -> bool:
    """L2 on each task's result on this machine that has not had it, in place; a note per task it ran on.
    True when a proposal was kept."""
    kept = False
    for d in per_task:
        w = main if main in d else next(iter(d))
        if d[w].l2 is not None:
            continue
        d[w] = _with_l2(db, run_id, workload, d[w], l2, w, task_level_missed)
        if d[w].l2:
            notes.append(_l2_note(d[w]))
            kept |= bool(d[w].l2["kept"])
    return kept


def _l2_note(tr: TaskResult) -> str:
    l2 = tr.l2
    c = l2["counts"]
    kept = l2["kept"]
    inc = (l2.get("incumbent") or {}).get("latency_s")
    what = (f"kept {kept['proposer']}'s plan ({kept['latency_s']:.4g} s"
            + (f" vs {inc:.4g} s, re-measured side by side)" if inc else ")") if kept else "nothing kept")
    return (f"{tr.task.key}: L2 ({l2['trigger']}) measured {l2['measured']} proposals, {what}; {c['refused']} "
            f"refused, {c['duplicate']} duplicates, {c['failed']} failed"
            + "".join(f"; {p['proposer']} {p['status']}: {p['message'][:200]}" for p in l2["proposers"]
                      if p["message"]))


def _with_l2(db: Records, run_id: str, workload: Workload, tr: TaskResult, l2: L2Settings, where: str,
             task_level_missed: bool = False) -> TaskResult:
    """``tr`` after L2 when its trigger fires on this machine's result: every proposal's fate in ``tr.l2``;
    a kept proposal heads the ranked list, re-measured beside the incumbent and the libraries, and the walk
    accepts it (it passed the validators). Its measurements go to the records like the search's."""
    task = tr.task
    why = l2_trigger(l2.mode, tr.fallback, task_level_missed)
    if why is None or tr.walk is None or where != task.backend.fingerprint:
        return tr
    acc = tr.walk.accepted
    first = tr.result.evaluations

    def record(t: Trial) -> None:
        db.add(run_id, workload.manifest.key, task.key, where, t.candidate.fingerprint, t.candidate.as_dict(),
               t.outcome, first + t.n if t.n else 0)

    try:
        res = task_phase(task, tr.result.trials, (acc.candidate, acc.metric), why, l2, tr.bound, tr.baselines, db,
                         where, run_id, record)
    finally:
        task.backend.close()  # the driver closed it after the search; measuring again reopened its worker
    if res.kept is None:
        return dataclasses.replace(tr, l2=res.to_json())
    ranked = Ranked((tr.ranked or tr.result.ranked).k)
    ranked.insert(res.kept[1].metric, *res.kept)
    inc, o_inc = res.incumbent
    if o_inc is not None and o_inc.ok:
        ranked.insert(o_inc.metric, inc, o_inc)
    for e in tr.ranked or tr.result.ranked:
        if e.candidate.fingerprint != inc.fingerprint:
            ranked.insert(e.metric, e.candidate, e.outcome)
    walk = walk_finalists(ranked, task.validators, task.peak_bytes)
    return dataclasses.replace(tr, walk=walk, ranked=ranked, baselines=res.baselines or tr.baselines,
                               bound=_bound(task, walk, ranked), l2=res.to_json())


def tile_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    """A configuration's knobs less its weight format genes (``wfmt``, ``qblock``, ``act``, and per layer)."""
    return {k: v for k, v in knobs.items() if not k.startswith((FORMAT_KNOB, BLOCK_KNOB, ACT_KNOB))}


def format_firsts(space, limit: int) -> list:
    """The first point of each weight format (``step_format``: with its block and activations) in ``space``'s
    order (the funnel's: the best predicted first), at most ``limit``, in that order."""
    out, seen = [], set()
    for c in itertools.islice(space.enumerate(), 100_000):  # a space the funnel did not cut may be large
        f = step_format(c.as_dict())
        if f not in seen:
            seen.add(f)
            out.append(c)
            if len(out) >= limit:
                break
    return out
