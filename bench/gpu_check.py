"""The GPU check's tuning half (bench/gpu_check.sh runs it on the H200): tune each kernel with the funnel on,
against its library baselines in the same process, and write one JSON of results.

For each workload: the funnel screens the template's space with the GPU model; the best-predicted candidates
are compiled in parallel processes first (Triton's on-disk cache then serves the measuring worker); the search
measures at most ``--budget`` candidates or ``--seconds`` seconds; the finalists are re-measured interleaved
with the baselines. Reported per workload: the tuned kernel's median latency and knobs, each baseline's, the
speed ratio against the best library (library time / ours: above 1 is faster), the funnel's stage counts,
the Spearman correlation of the model's predicted order with the measured times, and the tuning seconds.

The policy MLP also runs as a whole-model workload (``policy_mlp_graph_b1_fp32``): the zoo graph planned for the
cuda target (the e-graph's choices between the fused MLP, GEMV templates with epilogues and torch library
steps, each template's knobs), every plan lowered to Triton and torch and measured end to end against torch
eager running the same graph.

Usage: python3 bench/gpu_check.py [--out gpu_check.json] [--budget 64] [--seconds 60] [--only NAME,...]
       python3 bench/gpu_check.py --offline H200 --plan   (no GPU: the funnel's plan with published figures)
       python3 bench/gpu_check.py --interpret --budget 3 --precompile 2   (no GPU: the script end to end, toy sizes)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from planforge.costmodel.funnel import Funnel  # noqa: E402
from planforge.ir import zoo  # noqa: E402
from planforge.search import Budget  # noqa: E402
from planforge.targets.cuda import CudaTarget  # noqa: E402
from planforge.targets.cuda.backend import cuda_timing  # noqa: E402
from planforge.tuning import tune  # noqa: E402
from planforge.workloads.kernels import kernel_workload  # noqa: E402
from planforge.workloads.models import graph_workload  # noqa: E402

POLICY = ((256, 256, "relu"), (256, 256, "relu"), (256, 32, "none"))

# name -> (how to make the problem, target: the ratio the issue asks for, libraries, hot caches)
WORKLOADS = {
    "gemm_4096_bf16": (lambda t: t.gpu_problem("gemm", (4096, 4096, 4096), "none", "bf16"),
                       {"vs": "torch", "min_speed": 0.95}, ["torch"], False),
    "gemm_16x4096x4096_bf16": (lambda t: t.gpu_problem("gemm", (16, 4096, 4096), "none", "bf16"),
                               {"vs": "torch", "min_speed": 1.0}, ["torch"], False),
    # the MLPs last: their torch.compile baselines take the longest
    "attention_b1h16s2048d64_causal_bf16": (
        lambda t: t.gpu_problem("attention", (1, 16, 2048, 64), "none", "bf16", causal=True),
        {"vs": "torch", "min_speed": 0.9}, ["torch"], False),
    # the same policy as a whole model: the graph level's plan (a spec's program) against torch eager; before
    # the MLP kernels, whose torch.compile baselines take the longest
    "policy_mlp_graph_b1_fp32": (lambda t: zoo.policy_mlp(1), {"vs": "torch", "min_speed": 2.0}, ["torch"], True),
    # a batch-1 policy runs hot in a loop: no L2 flush; torch.compile is the fused baseline
    "policy_mlp_b1_fp32": (lambda t: t.mlp_problem(POLICY, "fp32"), {"vs": "torch", "min_speed": 2.0},
                           ["torch", "torch.compile"], True),
    "policy_mlp_b1_bf16": (lambda t: t.mlp_problem(POLICY, "bf16"), {"vs": "torch", "min_speed": 2.0},
                           ["torch", "torch.compile"], True),
}


# --interpret: the same workloads at toy sizes, measured in Triton's interpreter on this CPU (the times mean
# nothing): proves the script end to end before a GPU run that cannot be repeated
SMALL = {
    "gemm_4096_bf16": lambda t: t.gpu_problem("gemm", (40, 48, 64), "none", "bf16"),
    "gemm_16x4096x4096_bf16": lambda t: t.gpu_problem("gemm", (16, 40, 64), "none", "bf16"),
    "policy_mlp_b1_fp32": lambda t: t.mlp_problem(((32, 32, "relu"), (32, 16, "none")), "fp32"),
    "policy_mlp_b1_bf16": lambda t: t.mlp_problem(((32, 32, "relu"), (32, 16, "none")), "bf16"),
    "attention_b1h16s2048d64_causal_bf16": lambda t: t.gpu_problem("attention", (1, 2, 40, 16), "none", "bf16",
                                                                   causal=True),
    "policy_mlp_graph_b1_fp32": lambda t: zoo.policy_mlp(1, widths=(32, 32, 16)),
}
GRAPHS = ("policy_mlp_graph_b1_fp32",)  # whole-model workloads: their make gives a graph
GRAPH_SECONDS = 20.0  # search seconds of a whole-model workload at most (each new plan compiles its templates)


def plan_offline(name: str) -> dict:
    """Without a GPU: each workload's funnel on the published figures (what would be measured first)."""
    t = CudaTarget(offline=name)
    out = {"device": t.profile().to_dict(), "workloads": {}}
    for key, (make, _, _, _) in WORKLOADS.items():
        if key in GRAPHS:
            out["workloads"][key] = plan_graph_offline(make(t), name)
            continue
        p = make(t)
        sp = t.knob_space(p)
        m = t.cost_model(p, sp)
        screen = Funnel(m, top_k=0.1).screen(sp)
        top = list(screen.space.enumerate())[:5]
        est = m.estimate(top)
        out["workloads"][key] = {"problem": p.to_json(), "funnel": screen.counts,
                                 "default": t.default_knobs(p),
                                 "top": [{"knobs": c.as_dict(), **est.row(i)} for i, c in enumerate(top)]}
    return out


def plan_graph_offline(graph, name: str) -> dict:
    """A whole model planned for the published figures of GPU ``name``: the genome over its e-graph (the
    templates' knobs ranked by the GPU model) and the two extracted seed plans, each template step with its
    knobs and the model's predicted seconds. Nothing is measured (the plan backend's worker never starts)."""
    from planforge.targets.cuda.devices import offline

    t = CudaTarget(pinned=offline(name), device="cpu")
    wl = graph_workload(graph, graph.name, target=t)
    (task,) = wl.tasks
    g = task.backend.genome
    seeds = []
    for c in task.seeds:
        steps = _steps(g.program(c.as_dict()), t)
        seeds.append({"steps": steps, "predicted_s": sum(x.get("predicted_s", 0.0) for x in steps)})
    task.backend.close()
    return {"graph": graph.name, "genome": {k: v for k, v in task.info.items() if k != "saturation"},
            "seed_plans": seeds}


def _steps(program: list[dict], t: CudaTarget | None = None) -> list[dict]:
    """A plan's steps in words: each template's problem and knobs (with ``t``, the GPU model's predicted
    seconds too), each library step's kind."""
    out = []
    for s in program:
        if s.get("problem") is not None:
            d = {"template": s["problem"], "knobs": s["knobs"]}
            if t is not None:
                sp = t.knob_space(s["problem"])
                d["predicted_s"] = float(t.cost_model(s["problem"], sp).predict([sp.make(s["knobs"])])[0])
            out.append(d)
        elif s["op"].startswith("lib"):
            out.append({"library": s["args"][0]})
    return out


def check_graph(key: str, budget: int, seconds: float, work: Path, interpret: bool = False) -> dict:
    """A whole-model workload: the graph planned for the cuda target, its plans measured end to end on the
    GPU (hot caches: a policy runs in a loop) against torch eager running the same graph."""
    make, goal, libs, hot = WORKLOADS[key]
    if interpret:
        from planforge.targets.cuda.devices import offline

        make = SMALL[key]
        prof = offline("H200")
        t = CudaTarget(pinned=prof, device="cpu", timing=cuda_timing(prof, cold=not hot))
    else:
        base = CudaTarget()
        t = CudaTarget(timing=cuda_timing(base.profile(), cold=not hot))
    graph = make(t)
    t0 = time.perf_counter()
    wl = graph_workload(graph, key, target=t)
    (task,) = wl.tasks
    res: dict = {"graph": graph.name, "libraries": libs, "hot": hot, "genome": task.info.get("genome_size")}
    tr = tune(wl, budget=Budget(evals=budget, seconds=min(seconds, GRAPH_SECONDS)), out=work / key, seed=0)
    res["tune_seconds"] = time.perf_counter() - t0
    (r,) = tr.tasks
    res.update(_results(r, goal))
    if r.walk is not None:
        prog = task.backend.program(r.walk.accepted.candidate)
        res["tuned"]["steps"] = _steps(prog)
    task.backend.close()
    return res


def _results(r, goal: dict, later: dict | None = None) -> dict:
    """What the check reports of a tuned task ``r`` (a ``TaskResult``): the funnel, the model's correlation,
    the outcomes, the accepted plan, every baseline (``later``: measured after the search) and the goal."""
    res: dict = {"funnel": r.funnel, "spearman_model_vs_measured": r.proxy_spearman,
                 "evaluations": r.result.evaluations, "outcomes": {}}
    for trial in r.result.trials:
        k = trial.outcome.invalidity
        res["outcomes"][k] = res["outcomes"].get(k, 0) + 1
    if r.walk is not None:
        acc = r.walk.accepted
        res["tuned"] = {"latency_s": acc.metric, "knobs": acc.candidate.as_dict(), "rank": acc.rank}
    res["baselines"] = {n: {"latency_s": o.metric, "status": o.invalidity, "message": o.message[:300]}
                        for n, o in {**r.baselines, **(later or {})}.items()}
    if r.bound:
        res["model"] = {k: r.bound.get(k) for k in ("bound_s", "predicted_s", "limiter", "of_bound")}
    lib = res["baselines"].get(goal["vs"], {}).get("latency_s")
    ours = res.get("tuned", {}).get("latency_s")
    res["goal"] = goal
    res["speed_vs_" + goal["vs"]] = lib / ours if (lib and ours) else None
    res["goal_met"] = bool(lib and ours and lib / ours >= goal["min_speed"])
    for b in res["baselines"].values():
        if b["latency_s"] and ours:
            b["speed_of_tuned"] = b["latency_s"] / ours
    return res


def check_one(key: str, budget: int, seconds: float, work: Path, precompile: int, interpret: bool = False) -> dict:
    if key in GRAPHS:
        return check_graph(key, budget, seconds, work, interpret)
    make, goal, libs, hot = WORKLOADS[key]
    if interpret:
        from planforge.targets.cuda.devices import offline

        make, libs = SMALL[key], ["torch"]  # torch.compile on the CPU has nothing to say about a GPU
        base = CudaTarget(pinned=offline("H200"), device="cpu")
        t = CudaTarget(pinned=base.profile(), device="cpu", timing=cuda_timing(base.profile(), cold=not hot))
    else:
        base = CudaTarget()
        t = CudaTarget(timing=cuda_timing(base.profile(), cold=not hot)) if hot else base
    p = make(t)
    t0 = time.perf_counter()
    wl = kernel_workload(p, target=t)
    (task,) = wl.tasks
    # the finalists are re-measured interleaved with the eager library; torch.compile (minutes of autotuning
    # per compile, and each measuring job compiles anew) is measured once, after, on the same inputs
    task.backend.libraries = ("torch",)
    res: dict = {"problem": p.to_json(), "libraries": libs, "hot": hot}
    # compile what the search will most likely measure, in parallel, before it starts
    screen = Funnel(task.cost_model, top_k=0.1).screen(task.space)
    first = list(screen.space.enumerate())[:precompile]
    tc = time.perf_counter()
    failed = task.backend.precompile(first, workers=12)
    res["precompile"] = {"candidates": len(first), "failed": len(failed), "seconds": time.perf_counter() - tc,
                         "failures": dict(list(failed.items())[:3])}
    tr = tune(wl, budget=Budget(evals=budget, seconds=seconds), out=work / key, seed=0)
    res["tune_seconds"] = time.perf_counter() - t0
    (r,) = tr.tasks
    extra = [n for n in libs if n not in r.baselines]
    later = task.backend.baselines(extra) if extra and not interpret else {}
    res.update(_results(r, goal, later))
    task.backend.close()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--work", default="gpu-check-work", help="folder for each workload's spec and records")
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60.0, help="search seconds per kernel (default 60)")
    ap.add_argument("--precompile", type=int, default=64, help="best-predicted candidates compiled ahead (64)")
    ap.add_argument("--only", default="", help="comma-separated workload names (default all)")
    ap.add_argument("--offline", default=None, help="plan for this GPU's published figures; measures nothing")
    ap.add_argument("--plan", action="store_true", help="with --offline: print the funnel's plan")
    ap.add_argument("--interpret", action="store_true", help="toy sizes in Triton's interpreter on this CPU: "
                                                             "checks the script, the times mean nothing")
    a = ap.parse_args()
    if a.offline:
        print(json.dumps(plan_offline(a.offline), indent=2, sort_keys=True, default=str))
        return 0
    names = [n for n in a.only.split(",") if n] or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"error: unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if a.interpret:
        import os

        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined (the precompile processes inherit it)
        from planforge.targets.cuda.devices import offline

        prof = offline("H200")
    else:
        prof = CudaTarget().profile(progress=lambda m: print(f"probe: {m}", flush=True))
    report = {"device": prof.to_dict(), "probe_seconds": time.perf_counter() - t0, "workloads": {}}
    import torch
    import triton

    report["versions"] = {"torch": torch.__version__, "triton": triton.__version__}
    work = Path(a.work)
    for n in names:
        print(f"--- {n}", flush=True)
        try:
            report["workloads"][n] = check_one(n, a.budget, a.seconds, work, a.precompile, a.interpret)
        except Exception as e:  # noqa: BLE001 - one broken workload must not lose the others' figures
            report["workloads"][n] = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(report["workloads"][n], default=str)[:1500], flush=True)
        Path(a.out).write_text(json.dumps(report, indent=2, sort_keys=True, default=str))
    report["seconds"] = time.perf_counter() - t0
    Path(a.out).write_text(json.dumps(report, indent=2, sort_keys=True, default=str))
    ok = all("error" not in w for w in report["workloads"].values())
    print(f"wrote {a.out} in {report['seconds']:.0f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
