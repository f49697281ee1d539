"""The tuning driver: workload -> per-task search -> finalists -> spec, with every outcome recorded."""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import __version__
from .costmodel import break_even_runs, spearman
from .costmodel.funnel import Funnel, Screened, pruned_fraction
from .costmodel.learned import history
from .outcome import Outcome
from .search import Budget, NoValidFinalist, Ranked, SearchResult, Trial, Walk, make_strategy, search, walk_finalists
from .search.asyncloop import search_on
from .spec import Records, SCHEMA_VERSION, spec_filename, write_spec
from .workloads import Task, Workload


FALLBACK_WITHIN = 0.95
FINALIST_ROUNDS = 3


@dataclass
class TaskResult:
    task: Task
    result: SearchResult
    walk: Walk | None
    strategy: dict[str, Any]
    proxy_spearman: float | None = None
    error: NoValidFinalist | None = None
    ranked: Ranked | None = None  # after re-measuring the finalists (the search's own when not re-measured)
    baselines: dict[str, Outcome] = field(default_factory=dict)
    funnel: list[dict[str, Any]] = field(default_factory=list)  # L0 stage counts, whole space -> measured
    bound: dict[str, Any] | None = None  # the analytic model's figures for the accepted plan

    @property
    def best_library(self) -> tuple[str, float] | None:
        ok = [(o.metric, name) for name, o in sorted(self.baselines.items()) if o.ok]
        return (min(ok)[1], min(ok)[0]) if ok else None

    @property
    def ratio_vs_library(self) -> float | None:
        lib = self.best_library
        return self.walk.accepted.metric / lib[1] if (lib and self.walk) else None

    @property
    def fallback(self) -> dict[str, str] | None:
        """The 95% rule: a tuned kernel slower than 95% of the best library's speed gives way to the library."""
        lib = self.best_library
        if lib is None or self.walk is None:
            return None
        ratio = self.walk.accepted.metric / lib[1]
        if ratio * FALLBACK_WITHIN <= 1.0:
            return None
        return {"to": lib[0], "reason": f"the tuned kernel reaches {100 / ratio:.0f}% of {lib[0]}'s speed "
                                        f"({self.walk.accepted.metric:.4g} s vs {lib[1]:.4g} s), below the "
                                        f"{100 * FALLBACK_WITHIN:.0f}% rule"}

    @property
    def selected_latency(self) -> float | None:
        """Latency of what the plan runs: the tuned kernel, or the library it fell back to."""
        fb = self.fallback
        if fb:
            return self.baselines[fb["to"]].metric
        return self.walk.accepted.metric if self.walk else None

    @property
    def saved_s(self) -> float:
        """Time saved per execution by the accepted plan over the first plan measured."""
        first = self.result.first_measured
        if first is None or self.walk is None:
            return 0.0
        return (first.outcome.metric - self.selected_latency) * self.task.weight


@dataclass
class TuneResult:
    workload: Workload
    tasks: list[TaskResult]
    spec: dict[str, Any] | None
    spec_path: Path | None
    run_id: str
    resumed: bool
    records_path: Path
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    report_path: Path | None = None  # OUT/report.html, rendered from OUT/run.json
    target: str = ""  # the device fingerprint of ``tasks`` and ``spec``
    # every device fingerprint tuned (a heterogeneous cluster tunes each kind of machine), ``target`` included
    by_target: dict[str, list[TaskResult]] = field(default_factory=dict)
    specs: dict[str, Path] = field(default_factory=dict)  # the spec written per device fingerprint

    @property
    def plan(self):
        """The chosen plan as a callable (``planforge.load`` of the spec); graph workloads only."""
        if self.spec_path is None:
            raise ValueError("this run wrote no spec (no output folder, or no valid finalist): nothing to load")
        from .api import load

        return load(self.spec_path, graph=getattr(self.workload.tasks[0].backend, "graph", None))

    @property
    def saved_s(self) -> float:
        return sum(t.saved_s for t in self.tasks)

    @property
    def break_even(self) -> float:
        return break_even_runs(self.seconds, self.saved_s)

    @property
    def ok(self) -> bool:
        return all(t.walk is not None for t in self.tasks)


def toolchain() -> dict[str, str]:
    import numpy
    import scipy

    return {"planforge": __version__, "python": platform.python_version(), "numpy": numpy.__version__,
            "scipy": scipy.__version__}


def _finalist_json(rank: int, e) -> dict[str, Any]:
    return {"rank": rank, "latency_s": e.metric, "plan": e.candidate.as_dict(),
            "fingerprint": e.candidate.fingerprint, "reasons": []}


def task_spec(tr: TaskResult, budget: Budget) -> dict[str, Any]:
    r, w, t = tr.result, tr.walk, tr.task
    acc = w.accepted
    lib = tr.best_library
    d: dict[str, Any] = {
        "weight": t.weight,
        "plan": acc.candidate.as_dict(),
        "fingerprint": acc.candidate.fingerprint,
        "latency_s": acc.metric,
        "rank": acc.rank,
        "baselines": {name: o.metric for name, o in sorted(tr.baselines.items()) if o.ok},
        "ratio_vs_baseline": tr.ratio_vs_library,
        "fallback": tr.fallback,
        "selected": tr.fallback["to"] if tr.fallback else "tuned",
        "rejected_finalists": [f.to_json() for f in w.rejected],
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
    if acc.peak_bytes is not None:
        d["peak_bytes"] = acc.peak_bytes
    if tr.funnel:
        d["funnel"] = tr.funnel
        d["funnel_pruned"] = pruned_fraction(tr.funnel)  # of the valid space, never measured
    if tr.bound:
        d["bound"] = tr.bound
    genome = getattr(t.backend, "genome", None)
    if genome is not None:  # a whole-graph plan: the program is what `planforge run` executes
        d["program"] = genome.program(acc.candidate.as_dict())
        d["graph"] = {k: v for k, v in t.info.items() if k != "saturation"}
    if lib is not None:
        d["library_latency_s"] = lib[1]
    failed = {n: f"{o.category}: {o.message[:200]}" for n, o in sorted(tr.baselines.items()) if not o.ok}
    if failed:
        d["baseline_failures"] = failed
    if t.cost_model is not None:
        measured = [x for x in r.trials if x.outcome.ok]
        d["proxy"] = {"name": t.cost_model.name, "spearman": tr.proxy_spearman, "pairs": len(measured)}
    return d


def build_spec(workload: Workload, tasks: list[TaskResult], budget: Budget, target: str | None = None) -> dict[str, Any]:
    """The spec of ``tasks`` as tuned on device ``target`` (default: the first task's backend's)."""
    backend = tasks[0].task.backend
    return {
        "schema_version": SCHEMA_VERSION,
        "planforge_version": __version__,
        "manifest": {**workload.manifest.to_json(), "key": workload.manifest.key},
        "target": {"backend": backend.name, "fingerprint": target or backend.fingerprint},
        "toolchain": toolchain(),
        "tasks": {tr.task.key: task_spec(tr, budget) for tr in tasks},
    }


def tune(workload: Workload, strategy: str = "auto", budget: Budget = Budget(evals=64), seed: int = 0,
         keep: int = 4, out: str | os.PathLike | None = None, records: str | os.PathLike | None = None,
         resume: bool = False, strategy_options: dict[str, Any] | None = None,
         on_trial: Callable[[Task, Trial], None] | None = None, command: str = "",
         executor: dict[str, Any] | None = None, funnel: bool = True
         ) -> TuneResult:
    """Tune every task of ``workload``; write ``out/spec.json`` when ``out`` is given.

    Parameters:
        strategy: a name from ``planforge.search.STRATEGIES`` or ``auto``.
        budget: per task: unique evaluations and/or seconds.
        seed: seeds the strategy; the same seed gives the same spec.
        keep: size of the ranked top-k that the finalist walk goes through.
        records: the records database (default ``out/records.db``, or
            ``./planforge-records.db`` without ``out``).
        resume: continue the latest interrupted run with the same workload and
            settings, taking every recorded outcome instead of measuring it.
        on_trial: called with each outcome as it arrives (progress display).
        executor: where measurements run: ``{"kind": "local"|"ray", **options}``
            (see ``planforge.measure.executor``); default None: one local worker.
            Slots of several device fingerprints (a heterogeneous cluster) tune
            each fingerprint on its own, with the whole ``budget`` each: the
            driver's fingerprint (else the one with the most measurements)
            gives ``out/spec.json``, every other one ``out/spec-FINGERPRINT.json``
            (see ``planforge.spec.spec_filename``).
        funnel: run the L0 funnel before the search (default True): a task
            with an analytic model is searched among the capacity survivors'
            predicted top-k only, and a proposal whose roofline bound is
            slower than the best measured is never measured.
    """
    t0 = time.perf_counter()
    out_path = Path(out) if out is not None else None
    rec_path = Path(records) if records is not None else (out_path / "records.db" if out_path else Path("planforge-records.db"))
    config = {"strategy": strategy, "seed": seed, "budget": [budget.evals, budget.seconds], "keep": keep,
              "options": strategy_options or {}, "targets": [t.backend.fingerprint for t in workload.tasks],
              **({} if funnel else {"funnel": False})}
    db = Records(rec_path)
    try:
        run_id, resumed = db.start_run(workload.name, workload.manifest.key, config, command, resume)
        notes = [] if resumed or not resume else ["nothing to resume with these settings: started a new run"]
        per_task: list[dict[str, TaskResult]] = []
        closers = [t.backend.close for t in workload.tasks if hasattr(t.backend, "close")]
        try:
            for task in workload.tasks:
                per_task.append(_tune_task(db, run_id, workload, task, strategy, budget, seed, keep,
                                           strategy_options or {}, on_trial, funnel, executor=executor))
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
        results = [d.get(main) or next(iter(d.values())) for d in per_task]
        by_target: dict[str, list[TaskResult]] = {}
        for d in per_task:
            for where, tr in d.items():
                by_target.setdefault(where, []).append(tr)
        ok = all(r.walk is not None for r in results)
        spec = build_spec(workload, results, budget, main) if ok else None
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
                         time.perf_counter() - t0, notes, target=main, by_target=by_target, specs=specs)
        if out_path is not None:  # run.json holds what the spec leaves out (wall times, trials); the report reads it
            from .report.html import write_report
            from .report.run import write_run

            res.report_path = write_report(write_run(res, out_path, command).parent)
        return res
    finally:
        db.close()


def _tune_task(db: Records, run_id: str, workload: Workload, task: Task, strategy: str, budget: Budget,
               seed: int, keep: int, options: dict[str, Any], on_trial, funnel: bool = True,
               executor: dict[str, Any] | None = None) -> dict[str, TaskResult]:
    """Search ``task``; its result per device fingerprint tuned (one, but for a heterogeneous cluster), the
    main one first."""
    if task.seeds:
        options = {**options, "initial": list(task.seeds)}
    screen = Funnel(task.cost_model if funnel else None, min_k=4 * (budget.evals or 16)).screen(task.space)
    space = screen.space
    driver = task.backend.fingerprint
    strategies: dict[str, Any] = {}

    def strategy_for(target: str):
        # each device fingerprint's search: the same strategy and seed, its own state
        strat = strategies[target] = make_strategy(strategy, space, seed, budget=budget.evals,
                                                   cost_model=task.cost_model, **options)
        if hasattr(strat, "warm_start"):  # learned models start from this template's earlier runs on this device
            strat.warm_start(history(db, target, task.key, space.names, exclude_run=run_id))
        return strat

    def cache_for(target: str):  # a resumed run takes each fingerprint's own outcomes
        return db.outcomes(run_id, task.key, target)

    def record(trial: Trial, target: str | None = None) -> None:
        if not trial.cached:
            db.add(run_id, workload.manifest.key, task.key, target or driver, trial.candidate.fingerprint,
                   trial.candidate.as_dict(), trial.outcome, trial.n)
        if on_trial:
            on_trial(task, trial)

    if executor and (executor.get("kind", "local") != "local" or executor.get("workers", 1) > 1):
        # slots measure in parallel; each outcome is recorded under the fingerprint of the device that measured it
        result = search_on(executor, space, strategy_for, task.backend, budget, keep=keep, cache=cache_for,
                           on_done=record)
        results = result.by_target or {driver: result}
    else:
        strat = strategy_for(driver)
        cache = cache_for(driver)
        done = [o.metric for o in cache.values() if o.ok]
        backend = Screened(task.backend, screen, min(done) if done else None)
        result = search(space, strat, backend, budget, keep=keep, cache=cache, on_trial=record)
        results = {driver: result}
    main = next(w for w, r in results.items() if r is result)
    # (a cluster that had no slot at all made no strategy: describe the one it would have used)
    return {w: _task_result(task, results[w], strategies.get(w) or strategy_for(w), screen, keep, here=w == driver)
            for w in [main, *(w for w in results if w != main)]}


def _task_result(task: Task, result: SearchResult, strat, screen, keep: int, here: bool) -> TaskResult:
    """Finalists, libraries and the walk for one device fingerprint's search. Only times of this machine
    (``here``) are re-measured and compared with its libraries: another kind of machine's ranking stands as
    its search measured it."""
    rho = None
    if task.cost_model is not None:
        measured = [x for x in result.trials if x.outcome.ok]
        rho = spearman(task.cost_model.predict([x.candidate for x in measured]), [x.outcome.metric for x in measured])
    ranked, baselines = result.ranked, {}
    if here and hasattr(task.backend, "remeasure") and len(ranked):
        # re-measure the finalists and the libraries interleaved, then choose on those times
        cands = [e.candidate for e in ranked]
        outs, baselines = task.backend.remeasure(cands, rounds=FINALIST_ROUNDS)
        ranked = Ranked(keep)
        for c, o in zip(cands, outs):
            if o.ok:
                ranked.insert(o.metric, c, o)
    elif here and hasattr(task.backend, "baselines"):
        baselines = task.backend.baselines()
    try:
        walk = walk_finalists(ranked, task.validators, task.peak_bytes)
        err = None
    except NoValidFinalist as e:
        walk, err = None, e
    best = result.ranked.best.metric if len(result.ranked) else None
    bound = None
    if walk is not None and hasattr(task.cost_model, "estimate"):
        bound = task.cost_model.estimate([walk.accepted.candidate]).row(0)
        bound["of_bound"] = walk.accepted.metric / bound["bound_s"] if bound["bound_s"] > 0 else None
        lbs = task.cost_model.lower_bound([e.candidate for e in ranked])
        bound["ranked"] = [{"rank": i, "bound_s": b, "of_bound": e.metric / b if b > 0 else None}
                           for i, (e, b) in enumerate(zip(ranked, lbs), start=1)]
    return TaskResult(task, result, walk, strat.describe(), rho, err, ranked, baselines,
                      screen.stages(result.evaluations, best), bound)


class _Callable(type(os)):
    """``planforge.tune(...)`` is the Python API's tune (``planforge.api.tune``), though ``planforge.tune``
    is also this module: importing a submodule binds its name on the package, so the module is made callable."""

    def __call__(self, *args, **kwargs):
        from .api import tune as api_tune

        return api_tune(*args, **kwargs)


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _Callable
