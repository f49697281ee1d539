"""planforge's command line: tune, probe, spec show|validate."""
from __future__ import annotations

import json
import shlex
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="planforge: find the fastest correct plan for a tensor program on this machine, by measuring.")
spec_app = typer.Typer(no_args_is_help=True, help="Read and check tuning specs.")
app.add_typer(spec_app, name="spec")

out_console = Console()
err_console = Console(stderr=True)


def _fail(msg: str, code: int = 2) -> None:
    # the message is printed as it is: text in square brackets (`torch.cat([a, b])`) is not rich markup
    err_console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False)
    raise typer.Exit(code)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _fail(f"{what} {item!r} must look like key=value")
        out[key.strip()] = value.strip()
    return out


def _typed(options: dict[str, str]) -> dict:
    """Strategy options: numbers where they parse as numbers."""
    out = {}
    for k, v in options.items():
        for kind in (int, float):
            try:
                out[k] = kind(v)
                break
            except ValueError:
                continue
        else:
            out[k] = v
    return out


def _executor(kind: str, address: str | None, workers: int | None, cores_per_slot: int) -> dict | None:
    """The executor settings ``tune`` takes (None: the plain one-worker local loop)."""
    from .measure.executor import EXECUTORS

    if kind not in EXECUTORS:
        _fail(f"unknown --executor {kind!r}; choose from {', '.join(EXECUTORS)}")
    if address and kind != "ray":
        _fail("--ray-address needs --executor ray")
    if kind == "local":
        return None if (workers or 1) == 1 else {"kind": "local", "workers": workers, "cores_per_slot": cores_per_slot}
    return {"kind": "ray", "address": address, "slots": workers, "cores_per_slot": cores_per_slot}


WARM_HELP = ("Warm-start from an earlier tuning of the same kernel (the same knob names) on another device or "
             "shape: a records database, a Kernel Tuner cache or a T4 file (repeatable). Its best configurations "
             "are proposed first and the model takes it as a prior. auto does this by itself when the records "
             "hold the task under another device or a nearby shape.")


@app.command()
def tune(
    workload: str = typer.Option("policy-mlp", "--workload", "-w",
                                 help="Built-in workload (policy-mlp, policy-mlp-b64, drill-mlp, transformer-block, "
                                      "drill, gemm, gemv, softmax, layernorm, eltwise) or a model file (.onnx, .pt2). "
                                      "Default: policy-mlp."),
    strategy: str = typer.Option("auto", "--strategy", "-s",
                                 help="Search strategy: auto, exhaustive, random, genetic, annealing, hillclimb, "
                                      "proxy-topk, model. auto is exhaustive when the space fits the budget, else "
                                      "model (model-guided evolution) for kernels with an analytic model, else genetic."),
    budget: int = typer.Option(64, "--budget", "-b", help="Unique evaluations (default 64); for a workload of "
                                                          "several tasks, the total the scheduler spends across them."),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", help="Wall seconds of the search, over all "
                                                                            "tasks (default: none)."),
    scheduler: str = typer.Option("gradient", "--scheduler", help="How a workload of several tasks spends the budget: "
                                                                  "gradient (each grant to the task of the largest "
                                                                  "estimated end-to-end gain, after a warm-up round) "
                                                                  "or round-robin (evenly). Default gradient."),
    seed: int = typer.Option(0, "--seed", help="Seeds the strategy; the same seed gives the same spec."),
    keep: int = typer.Option(4, "--keep", "-k", help="Size of the ranked top-k walked by validation (default 4)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder for spec.json (default planforge-out/WORKLOAD)."),
    records: Optional[Path] = typer.Option(None, "--records", help="Records database (default OUT/records.db)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the interrupted run with the same settings."),
    shape: Optional[str] = typer.Option(None, "--shape", help="Kernel workloads: sizes, e.g. M,N,K for gemm."),
    epilogue: Optional[str] = typer.Option(None, "--epilogue",
                                           help="Kernel workloads: none, bias, bias_relu, bias_gelu (eltwise: a chain)."),
    option: list[str] = typer.Option([], "--option", help="Workload option key=value (repeatable)."),
    strategy_option: list[str] = typer.Option([], "--strategy-option", help="Strategy setting key=value (repeatable); "
                                                                            "`planforge strategies` lists them."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object summarising the run, nothing else."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar; summary only."),
    executor: str = typer.Option("local", "--executor", help="Where measurements run: local (isolated worker "
                                                             "processes on this machine) or ray (a Ray cluster; "
                                                             "pip install 'planforge[ray]'). Default local."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join: auto or HOST:PORT "
                                                                          "(default: start a local one)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Measurement slots (default: 1 for local, one per "
                                                                  "core set of the cluster for ray)."),
    cores_per_slot: int = typer.Option(1, "--cores-per-slot", help="Physical cores each slot claims and pins its "
                                                                   "measurements to (default 1)."),
    no_funnel: bool = typer.Option(False, "--no-funnel", help="Skip the L0 funnel (capacity, roofline bound, "
                                                              "cost-model top-k): search the whole valid space."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Where to tune: cpu, cuda, table or replay "
                                                                      "(default: the workload's own, cpu for "
                                                                      "kernels and models, table for the drill)."),
    warm_start: list[Path] = typer.Option([], "--warm-start", help=WARM_HELP),
    strict: bool = typer.Option(False, "--strict", help="A model file: refuse ops with no rule, listing every one "
                                                        "with where it sits, instead of running them as library "
                                                        "fallback steps."),
    l2: str = typer.Option("off", "--l2", help="L2 proposers after the search: off (default), auto (a task below "
                                               "the 95% rule, or every task when the task-level target is missed, "
                                               "gets --l2-budget evaluations of proposals) or always "
                                               "(every task); a proposal is kept only if it beats the accepted plan "
                                               "re-measured beside it."),
    l2_budget: int = typer.Option(8, "--l2-budget", help="Evaluations of L2 proposals per triggered task (default 8)."),
    l2_proposer: str = typer.Option("playbook", "--l2-proposer",
                                    help="playbook (rules from measurements, and the records; default), llm (an "
                                         "OpenAI-compatible endpoint from PLANFORGE_LLM_BASE_URL/_MODEL/_API_KEY or "
                                         "~/.config/planforge/llm.json; nothing is sent unless configured) or both."),
) -> None:
    """Search a workload's plan space, validate the finalists and write a tuning spec."""
    from .report import print_summary, summary_json
    from .search import Budget
    from .space import RestrictionError, SpaceError
    from .spec import RecordsError, SpecError
    from .targets.cpu.build import CompilerMissing
    from .measure.executor import ExecutorError
    from .api import load_tuned
    from .l2 import L2Settings
    from .tuning import tune as run_tune
    from .workloads import WorkloadError, load_workload

    try:
        opts = _pairs(option, "--option")
        opts.update({k: v for k, v in (("shape", shape), ("epilogue", epilogue)) if v is not None})
        if strict:
            opts["strict"] = "true"
        l2_settings = L2Settings(l2, l2_budget, l2_proposer)
        show = not (as_json or quiet)
        # a model's workload takes seconds to minutes before its first evaluation (import, e-graph, extraction,
        # its first kernels compiled and measured): say so rather than sit silent
        preparing = err_console.status(Text(f"preparing {workload} (a model: imported, its graph rewritten, its first "
                                            "kernels measured)")) if show else nullcontext()
        with preparing:
            wl = load_workload(workload, opts, target)
        b = Budget(evals=budget, seconds=time_budget)
    except (WorkloadError, RestrictionError, SpaceError, ValueError, CompilerMissing) as e:
        _fail(str(e))
    out = out or Path("planforge-out") / workload
    command = "planforge " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("best {task.fields[best]}"), TextColumn("{task.fields[bad]}"),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, disable=not show,
                        transient=True)
    bars: dict[str, int] = {}
    state: dict[str, dict] = {}
    many = len(wl.tasks) > 1

    def on_trial(task, trial) -> None:
        from .report import fmt_time

        if task.key not in bars:
            # several tasks share the budget: a task's bar counts its evaluations against the whole budget
            bars[task.key] = progress.add_task(task.key, total=budget, best="-", bad="")
            state[task.key] = {"best": None, "bad": {}}
        st = state[task.key]
        o = trial.outcome
        if o.ok and (st["best"] is None or o.metric < st["best"]):
            st["best"] = o.metric
        elif not o.ok:
            st["bad"][o.category] = st["bad"].get(o.category, 0) + 1
        bad = " ".join(f"{k}:{v}" for k, v in sorted(st["bad"].items()))
        progress.update(bars[task.key], completed=trial.n or None, best=fmt_time(st["best"]), bad=bad)

    def on_grant(grant, states) -> None:
        # per-task state: its weight, its share of the end-to-end latency so far, what the scheduler made of it
        total = sum(s.share for s in states if s.share is not None) or None
        for s in states:
            if s.key in bars:
                share = f"{100 * s.share / total:.0f}% of e2e" if (total and s.share is not None) else "no plan yet"
                what = f"stopped: {s.stopped}" if s.stopped else f"{s.grants} grants"
                progress.update(bars[s.key], description=f"{s.key} x{s.weight:g} ({share}, {what})")

    try:
        with progress:
            res = run_tune(wl, strategy=strategy, budget=b, seed=seed, keep=keep, out=out, records=records,
                           resume=resume, strategy_options=_typed(_pairs(strategy_option, "--strategy-option")),
                           on_trial=on_trial, command=command,
                           executor=_executor(executor, ray_address, workers, cores_per_slot), funnel=not no_funnel,
                           plan_loader=load_tuned, scheduler=scheduler, on_grant=on_grant if many else None,
                           warm_start=warm_start, l2=l2_settings)
    except ExecutorError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]: every recorded measurement is kept; run the same command with "
                          "--resume to continue")
        raise typer.Exit(130)
    except (RecordsError, SpecError, SpaceError, RestrictionError, ValueError, CompilerMissing) as e:
        _fail(str(e))
    if as_json:
        print(json.dumps(summary_json(res), indent=2, sort_keys=True, default=str))
    else:
        print_summary(res, out_console)
        _print_trust_warnings(res, out_console)
    if not res.ok:
        for tr in res.tasks:
            if tr.error:
                err_console.print(f"[bold red]error:[/] task {tr.task.key}: {escape(str(tr.error))}", highlight=False)
        raise typer.Exit(1)


def _print_trust_warnings(res, console) -> None:
    """The report's trust warnings (a busy probe or measurement, high spread, a finalist far from its search
    time, a rejected fastest plan), read back from the run file the report was rendered from."""
    from .report.run import RunError, load_run, print_warnings
    from .report.verdict import summarize

    if res.report_path is None:
        return
    try:
        print_warnings(summarize(load_run(res.report_path.parent)), console)
    except RunError as e:
        err_console.print(Text(f"warning: the run file could not be read back for its warnings: {e}"))


@spec_app.command("validate")
def spec_validate(file: Path = typer.Argument(..., help="Spec file to check.")) -> None:
    """Check a spec against the schema; exit 1 with the reason when it fails."""
    from .spec import SpecError, load_spec

    try:
        spec = load_spec(file)
    except SpecError as e:
        _fail(str(e), 1)
    out_console.print(f"ok: {file} is a valid planforge spec (schema version {spec['schema_version']}, "
                      f"workload {spec['manifest']['workload']})", highlight=False)


@spec_app.command("show")
def spec_show(file: Path = typer.Argument(..., help="Spec file to show.")) -> None:
    """Print a spec's manifest, target and chosen plan per task."""
    from .report import fmt_time
    from .spec import SpecError, load_spec

    try:
        spec = load_spec(file)
    except SpecError as e:
        _fail(str(e), 1)
    m = spec["manifest"]
    out_console.print(f"[bold]{file}[/]: workload [cyan]{m['workload']}[/] (key {m['key']}), shapes {m['shapes']}, "
                      f"options {m['options']}")
    out_console.print(f"target {spec['target']['backend']} {spec['target']['fingerprint']}; planforge "
                      f"{spec['planforge_version']}; toolchain " + ", ".join(f"{k} {v}" for k, v in spec["toolchain"].items()))
    table = Table()
    for col in ("task", "plan", "latency", "rank", "rejected finalists", "search"):
        table.add_column(col)
    for key, t in spec["tasks"].items():
        plan = ", ".join(f"{k}={v}" for k, v in t["plan"].items()) if t["plan"] is not None else \
            f"{t['selected']} (no valid plan)"
        rej = "; ".join(f"#{f['rank']}: {'; '.join(f['reasons'])}" for f in t["rejected_finalists"]) or "-"
        s = t["search"]
        table.add_row(Text(key), Text(plan), fmt_time(t["latency_s"]), str(t["rank"] or "-"), Text(rej),
                      f"{s['strategy']['name']} seed {s['seed']}, {s['evaluations']} evals: {s['stop_reason']}")
    out_console.print(table)


@app.command()
def probe(
    force: bool = typer.Option(False, "--force", help="Measure again even when this machine's profile is cached."),
    quick: bool = typer.Option(False, "--quick", help="Short runs (about a second): noisier numbers, for tests and "
                                                      "smoke checks. A cached full profile is still used."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile as JSON, nothing else."),
    target: str = typer.Option("cpu", "--target", "-t", help="The target whose device to measure (default cpu)."),
    offline: Optional[str] = typer.Option(None, "--offline", help="With --target cuda: show the published figures "
                                                                 "of a GPU (H100, H200, A100, L4) that the model "
                                                                 "and the funnel plan with; measures nothing."),
) -> None:
    """Measure this machine (peak FLOP/s, bandwidth per memory level, call overhead) and cache the profile."""
    import warnings

    from .targets import TargetError, get_target
    from .targets.target import LEVELS
    from .targets.cpu.probe import ProbeError
    from .targets.cpu.build import BuildError, CompilerMissing, IsaError

    try:
        tgt = get_target(target)
        if offline is not None:
            if target != "cuda":
                _fail(f"--offline names a GPU's published figures: use it with --target cuda, not {target!r}")
            from .targets.cuda import CudaTarget

            tgt = CudaTarget(offline=offline)
    except TargetError as e:
        _fail(str(e))
    status = err_console.status("probing", spinner="dots")
    error, prof = None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if as_json:
                prof = tgt.profile(force=force, quick=quick)
            else:
                with status:
                    prof = tgt.profile(force=force, quick=quick, progress=lambda m: status.update(f"probing: {m}"))
        except (CompilerMissing, ProbeError, IsaError, TargetError) as e:
            error = str(e)
        except BuildError as e:
            error = f"{e}\n{e.log}" if e.log else str(e)
    for w in caught:
        err_console.print(f"[yellow]warning:[/] {w.message}", highlight=False)
    if error:
        _fail(error)
    if prof is None:
        _fail(f"target {tgt.name!r} has no device of its own to probe: " + "; ".join(v for _, v in tgt.facts(None)))
    if as_json:
        print(prof.to_json(), end="")
        return

    facts = Table(show_header=False, title=f"device {tgt.fingerprint}", title_justify="left")
    facts.add_column(style="bold")
    facts.add_column()
    for label, text in tgt.facts(prof):
        facts.add_row(label, text)
    out_console.print(facts)
    ceil = tgt.ceilings()  # the figures the cost model reads, launch overhead included
    if ceil.kind != "cpu":
        return  # a GPU's facts above are its ceilings; the table below is per CPU thread
    bw = Table(title="bandwidth, GB/s", title_justify="left")
    kinds = {"read": "read", "read4": "read, 4 streams", "copy": "copy"}
    for col in ("level", *(f"{label} ({n})" for n in (f"{ceil.threads} threads", "1 thread")
                           for label in kinds.values())):
        bw.add_column(col, justify="right" if col != "level" else "left")
    for level in LEVELS:
        if level in ceil.bw:
            vals = [ceil.bw[level].get(k, (None, None))[1 if a else 0] for a in (True, False) for k in kinds]
            bw.add_row(level, *(f"{v / 1e9:.1f}" if v else "-" for v in vals))
    out_console.print(bw)
    if ceil.threads > 1:
        out_console.print(f"launch overhead: {ceil.launch_s * 1e6:.1f} us per start and join of {ceil.threads} "
                          "threads (what the cost model adds to a parallel kernel)", highlight=False)
    for note in prof.notes:
        err_console.print(f"[yellow]note:[/] {note}", highlight=False)


@app.command("run")
def run_spec(
    spec: Path = typer.Argument(..., help="A spec.json written by `planforge tune` on a model workload."),
    inputs: list[Path] = typer.Option([], "--input", "-i", help="An input as a .npy file (repeat, in order); "
                                                                  "default: seeded random inputs."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random inputs (default 0)."),
    check_device: bool = typer.Option(True, "--check-device/--any-device",
                                      help="Refuse a spec tuned on another machine (default: refuse)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Run a tuned plan, check it against the fp64 reference of the original graph, and time it."""
    import numpy as np

    from .api import load
    from .targets.cpu.graph import tolerance
    from .measure import time_fn
    from .spec import SpecError

    try:
        plan = load(spec, check_device=check_device)
        g = plan.graph
        xs = [np.load(p) for p in inputs] if inputs else g.example_inputs(seed)
        outs = plan(*xs)
    except (SpecError, OSError, ValueError) as e:
        _fail(str(e), 1)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    ref = g.evaluate(*xs)
    err = max(float(np.abs(o - r).max()) for o, r in zip(outs, ref))
    tol = tolerance(g, ref)
    t = float(np.median(time_fn(lambda: plan(*xs))))
    res = {"spec": str(spec), "workload": plan.spec["manifest"]["workload"], "outputs": [list(o.shape) for o in outs],
           "max_abs_error": err, "tolerance": tol, "ok": err <= tol, "latency_s": t,
           "tuned_latency_s": plan.spec["tasks"]["graph"]["latency_s"], "fallback": plan.fallback}
    if as_json:
        print(json.dumps(res, indent=2, sort_keys=True))
    else:
        from .report import fmt_time

        out_console.print(f"{res['workload']}: outputs {res['outputs']}; max |out - fp64 reference| = {err:.3g} "
                          f"(tolerance {tol:.3g}) {'[green]ok[/]' if res['ok'] else '[red]WRONG[/]'}; "
                          f"{fmt_time(t)} per call from Python (tuned plan: {fmt_time(res['tuned_latency_s'])})")
    if not res["ok"]:
        raise typer.Exit(1)


@app.command()
def replay(
    files: list[Path] = typer.Argument(..., help="Recorded spaces: Kernel Tuner cache files or T4 files (gzipped or not)."),
    strategy: str = typer.Option("auto", "--strategy", "-s",
                                 help="Strategies to compare, comma-separated (e.g. auto,bandit,tpe); random sampling "
                                      "without replacement is always added as the baseline."),
    budget: int = typer.Option(1000, "--budget", "-b", help="Unique evaluations per run (default 1000)."),
    seeds: int = typer.Option(50, "--seeds", help="Runs per strategy and space, seeds 0..S-1 (default 50)."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Worker processes (default 1)."),
    t1: Optional[Path] = typer.Option(None, "--t1", help="T1 file of the kernel (parameters, restrictions) for every "
                                                          "FILE; default: found beside each file as the benchmark hub "
                                                          "lays it out."),
    no_t1: bool = typer.Option(False, "--no-t1", help="Read the recordings alone, without T1 files."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Save mean best-so-far curves (a PNG per space) here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with every score, nothing else."),
    warm_start: list[Path] = typer.Option([], "--warm-start", help=WARM_HELP + " Each strategy then runs cold and "
                                                                    "warm (warm:NAME); a FILE is never its own source."),
) -> None:
    """Replay search strategies on recorded spaces and score them.

    For each space and strategy: the median and 90th percentile over seeds of the
    unique evaluations needed to get within 5% of the space's optimum (a run that
    never gets there counts budget + 1), the fraction of runs that got there, and
    the mean best-so-far curve (best / optimum after n evaluations)."""
    from .targets.replay.formats import FormatError
    from .report.summary import sparkline
    from .search import STRATEGIES
    from .search.benchmark import benchmark, results_json

    names = [s.strip() for s in strategy.split(",") if s.strip()]
    unknown = [s for s in names if s != "auto" and s not in STRATEGIES]
    if not names or unknown:
        _fail(f"unknown strategy {', '.join(map(repr, unknown)) or repr(strategy)}; choose from: auto, "
              f"{', '.join(s for s in STRATEGIES if s != 'proxy-topk')}")
    if "proxy-topk" in names:
        _fail("proxy-topk needs a cost model, which a recorded space does not have")
    if budget < 1 or seeds < 1 or jobs < 1:
        _fail(f"--budget, --seeds and --jobs must be at least 1 (got {budget}, {seeds}, {jobs})")
    from .targets.replay.replay import load_replay

    replays = []
    try:
        for f in files:
            replays.append(load_replay(f, False if no_t1 else (t1 if t1 is not None else True)))
    except FormatError as e:
        _fail(str(e))
    warm = {}
    if warm_start:
        from .search.benchmark import WARM
        from .search.warm import WarmError, WarmStart
        from .warmstart import load_sources

        try:
            sources = {p.resolve(): load_sources([p], replays[0].space.names) for p in warm_start}
            for r in replays:  # leave one out: a recording never warm-starts itself
                warm[r.label] = WarmStart(r.space, [s for p, ss in sources.items() if p != r.path.resolve() for s in ss])
        except WarmError as e:
            _fail(str(e))
        names = [*names, *(WARM + n for n in names)]
    if not as_json:
        for r in replays:
            for note in r.recording.notes:
                err_console.print(f"[yellow]note:[/] {r.label}: {note}", highlight=False)
    progress = Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=err_console, disable=as_json, transient=True)
    with progress:
        bar = progress.add_task("runs", total=None)
        results = benchmark(replays, names, range(seeds), budget, jobs=jobs, warm=warm,
                            on_run=lambda done, total: progress.update(bar, completed=done, total=total))
    if plot is not None:
        try:
            _plot_replay(results, budget, plot)
        except ImportError as e:
            _fail(str(e))
    if as_json:
        print(json.dumps(results_json(results, budget, seeds), indent=1, default=str))
        return
    marks = [n for n in (1, 10, 100, 1000, 10_000) if n < budget] + [budget]
    for sr in results:
        r = sr.replay
        table = Table(title=f"{r.label}: {len(r.space.valid_ints())} configurations, optimum "
                            f"{r.optimum * 1e3:.4g} ms; {budget} evaluations x {seeds} seeds", title_justify="left")
        for col in ("strategy", "median", "p90", "success", *(f"best@{n}" for n in marks), "curve"):
            table.add_column(col, justify="left" if col in ("strategy", "curve") else "right")
        for name, sc in sorted(sr.scores.items(), key=lambda kv: (kv[1].median, kv[1].p90)):
            pts = [sc.curve_at(n) for n in sorted({max(1, round(budget ** (i / 15))) for i in range(16)})]
            table.add_row(name, f"{sc.median:g}", f"{sc.p90:g}", f"{sc.success_rate:.0%}",
                          *(f"{sc.curve_at(n):.3f}" for n in marks),
                          sparkline([p for p in pts if p == p]))
        for name, why in sr.errors.items():
            table.add_row(name, "not run", why, *([""] * (len(marks) + 2)))
        out_console.print(table)
    out_console.print(f"median, p90: unique evaluations to within 5% of the optimum (a run that never got there "
                      f"counts {budget + 1}); success: runs that got there; best@n: mean best-so-far / optimum after "
                      "n evaluations", highlight=False)
    if plot is not None:
        out_console.print(f"curves: {plot}", highlight=False)


@app.command("strategies")
def strategies_cmd(
    name: Optional[str] = typer.Argument(None, help="One strategy (default: every one, and auto)."),
    as_json: bool = typer.Option(False, "--json", help="Print the settings as JSON."),
) -> None:
    """List the search strategies and the settings each takes (--strategy-option key=value)."""
    from .search import STRATEGIES
    from .search.registry import settings_of
    from .search.settings import SettingError

    names = [name] if name else ["auto", *STRATEGIES]
    try:
        table = {n: settings_of(n) for n in names}
    except SettingError as e:
        _fail(str(e))
    if as_json:
        print(json.dumps({n: [s.to_json() for s in ss] for n, ss in table.items()}, indent=1))
        return
    for n, ss in table.items():
        doc = (STRATEGIES["bandit"] if n == "auto" else STRATEGIES[n]).__doc__ or ""
        head = "exhaustive if the space fits the budget, model-guided with an analytic model, else this bandit" \
            if n == "auto" else doc.strip().split("\n")[0]
        t = Table(title=f"{n}: {head}", title_justify="left")
        for col in ("setting", "type", "default", "range", "help"):
            t.add_column(col)
        for s in ss:
            t.add_row(s.name, s.kind, repr(s.default), s.range_text(), s.help)
        out_console.print(t)


def _plot_replay(results, budget: int, folder: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'planforge[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    for sr in results:
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=90)
        for name, sc in sr.scores.items():
            ax.plot(np.arange(1, budget + 1), sc.curve, lw=2 if name == "auto" else 1, label=name)
        ax.axhline(1.05, color="grey", lw=0.6, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("unique evaluations")
        ax.set_ylabel("mean best-so-far / optimum")
        ax.set_title(sr.replay.label)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(folder / f"replay_{sr.replay.label.replace('/', '_')}.png")
        plt.close(fig)


records_app = typer.Typer(no_args_is_help=True, help="Work with the records database of measurements.")
app.add_typer(records_app, name="records")


@records_app.command("export")
def records_export(
    db: Path = typer.Argument(..., help="A records database (e.g. OUT/records.db)."),
    fmt: str = typer.Option(..., "--format", "-f", help="t4 or kernel_tuner."),
    out: Path = typer.Option(..., "--out", "-o", help="File to write (gzipped when it ends in .gz)."),
    task: Optional[str] = typer.Option(None, "--task", help="Task to export (needed when the database has several)."),
    target: Optional[str] = typer.Option(None, "--target", help="Target fingerprint (needed when there are several)."),
    run: Optional[str] = typer.Option(None, "--run", help="Only the measurements of this run id."),
) -> None:
    """Export one task's measurements on one target as a T4 file or a Kernel Tuner cache file."""
    from .spec.export import ExportError, export_records

    try:
        e = export_records(db, fmt, out, task=task, target=target, run_id=run)
    except (ExportError, OSError) as err:
        _fail(str(err))
    out_console.print(f"wrote {e.rows} configurations of task {e.task} on {e.target} to {e.path} ({e.format})",
                      highlight=False)


@app.command("export")
def export_plan(
    spec: Path = typer.Argument(..., help="A spec.json written by `planforge tune` on a model workload."),
    fmt: str = typer.Option("c", "--format", "-f", help="c: a C library (plan.h, libplan.so, libplan.a, main.c). "
                                                        "Default: c."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write the library into (created if missing)."),
    check_device: bool = typer.Option(True, "--check-device/--any-device",
                                      help="Refuse a spec tuned on another machine (default: refuse)."),
) -> None:
    """Export a tuned plan as a self-contained C library that runs without Python or planforge."""
    if fmt != "c":
        _fail(f"unknown export format {fmt!r}: `planforge export` writes c; measurements go out as t4 or "
              "kernel_tuner with `planforge records export`")
    from .api import load
    from .spec import SpecError
    from .spec.export_c import CExportError, export_c
    from .targets.cpu.build import CompilerMissing, IsaError

    try:
        plan = load(spec, check_device=check_device)
        e = export_c(plan.plan, out, spec=plan.spec)
    except (SpecError, CExportError, CompilerMissing, IsaError, OSError, ValueError) as err:
        _fail(str(err))
    out_console.print(f"wrote {', '.join(p.name for p in e.files)} to {e.folder}: {e.in_size} floats in, "
                      f"{e.out_size} out, {e.knobs.get('threads', 1)} thread(s); run {e.folder / 'plan_main'} to "
                      "time it", highlight=False, markup=False)


@app.command("report")
def report(
    folder: Path = typer.Argument(..., help="Output folder of a `planforge tune` run (holds run.json)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="HTML file to write (default FOLDER/report.html)."),
    summary: bool = typer.Option(True, "--summary/--no-summary", help="Also print the terminal summary (default on)."),
) -> None:
    """Render a run's HTML report (plots embedded, nothing fetched) and print its summary."""
    from .report.html import write_report
    from .report.run import RunError, load_run, print_run_summary

    try:
        path = write_report(folder, out)
        run = load_run(folder)
    except (RunError, OSError) as e:
        _fail(str(e), 1)
    if summary:
        print_run_summary(run, out_console)
    out_console.print(f"report: [bold]{path}[/]", highlight=False)


@spec_app.command("diff")
def spec_diff(
    a: Path = typer.Argument(..., help="The old spec."),
    b: Path = typer.Argument(..., help="The new spec."),
    as_json: bool = typer.Option(False, "--json", help="Print the changes as a JSON list."),
) -> None:
    """What changed from spec A to spec B (plans, knobs, latencies); exit 0 when equal, 1 when not, 2 on error."""
    from .spec import SpecError, load_spec
    from .spec.diff import diff_specs

    try:
        changes = diff_specs(load_spec(a), load_spec(b))
    except SpecError as e:
        _fail(str(e), 2)
    if as_json:
        print(json.dumps([c.to_json() for c in changes], indent=2, sort_keys=True, default=str))
    elif not changes:
        out_console.print(f"no differences between {a} and {b}", highlight=False)
    else:
        out_console.print(f"--- {a}\n+++ {b}\n{len(changes)} change(s):", highlight=False)
        for c in changes:
            out_console.print("  " + c.describe(), highlight=False, markup=False)
    if changes:
        raise typer.Exit(1)


@records_app.command("merge")
def records_merge(
    inputs: list[Path] = typer.Argument(..., help="Records databases to merge."),
    out: Path = typer.Option(..., "--out", "-o", help="Database to merge into (created if missing)."),
) -> None:
    """Merge records databases from separate runs: every run and measurement once, however often merged."""
    from .spec import RecordsError
    from .spec.records import merge_records

    try:
        added = merge_records(inputs, out)
    except (RecordsError, OSError) as e:
        _fail(str(e))
    out_console.print(f"merged {len(inputs)} database(s) into {out}: {added['runs']} new runs, "
                      f"{added['measurements']} new measurements ({added['total']} in all)", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
