"""The seeds' phase-ordering example: every fixed order of the convolution rule groups against the e-graph.

The rule groups (``planforge.ops.conv_fused.rule_groups``): ``fold`` (A: the batch norm folded into the
convolution's weights and bias), ``fuse`` (B: a Conv+BN kernel, and the three-in-one Conv+BN+act),
``epilogue`` (C: an activation or a residual add in the convolution's epilogue), ``layout`` (NHWC forms
between transposes that cancel, 1x1 convolutions as GEMMs). A fixed order is a sequential rewriter: each
group runs to saturation with ``subsume`` (a rewrite removes what it matched, so a later group never sees
the form it replaced: fold first leaves nothing for B to fuse, fuse first nothing for A to fold), then the
other ops' rules and the lowering (``planforge.rewrite.phases.fixed_order``). The e-graph applies all groups
together and keeps every form; its search is seeded with each fixed order's extraction as well as its own
greedy and ILP ones (``workloads.models``), while each fixed order starts from its own two only.

Each variant is tuned at the same budget with planforge's own search (the model's e-graph built by the
variant's rewriter; everything else as ``planforge tune`` does it); then the chosen plans are timed in this
one process, interleaved round by round, and the medians printed with each order's ratio to the e-graph's.
Variants that chose the same plan (the same steps with the same knobs) share one timing of it. The e-graph's plan
is also loaded a second time and timed beside the others as a control: two loads of one program differ by what the
timing cannot separate (0-4% on this machine: where their buffers happen to lie, and the host's noise), and a ratio
within that spread is a tie.

Each model ends on a verdict, e-graph against the best fixed order: rounds pair up (every runner is timed once a
round, so a slow stretch of the host falls on one round's samples of all of them), and the per-round log ratio of
the e-graph's plan to the best fixed order's is tested one-sided both ways (``scipy.stats.wilcoxon``); ``slower``
or ``faster`` where that is significant (p < 0.05) and the median ratio lies beyond the control's distance from 1,
``tie`` otherwise (the instrument cannot tell them apart).

Models: Conv3x3-BN-ReLU at 1x32x28x28, a ResNet basic block at 1x32x14x14, a tiny ResNet (3x3 stem, one basic
block per stage, 1x3x32x32) and ResNet-18 at 1x3x96x96 (``planforge.ir.zoo.resnet18``: twenty convolutions, eight
residual adds, eight tasks), which every variant tunes at ``--large-budget`` (24, three evaluations a task) where the
small models take ``--budget``.

Run: ``.venv/bin/python bench/phase_order.py [--budget 6] [--large-budget 24] [--rounds 15]
[--models conv-bn-relu,residual,resnet,resnet18] [--json out.json]``
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

from planforge.api import load, tune
from planforge.ir import GraphBuilder
from planforge.ir.zoo import _basic_block, conv_bn_relu, resnet18, tiny_resnet
from planforge.rewrite import Limits
from planforge.rewrite.phases import ORDERS, fixed_order
from planforge.workloads import models as wl_models


def residual(size: int = 14, width: int = 32):
    b = GraphBuilder(f"residual-{width}x{size}")
    return b.output(_basic_block(b, b.input("x", (1, width, size, size)), width, width, 1, "b"))


CONTROL = "e-graph again"  # the e-graph's plan loaded a second time, timed beside the others

MODELS = {"conv-bn-relu": lambda: conv_bn_relu(size=28, cin=32, cout=32),
          "residual": residual,
          "resnet": lambda: tiny_resnet(size=32, width=16, blocks=(1, 1)),
          "resnet18": lambda: resnet18(96)}   # the whole of ResNet-18, at the smaller size
LARGE = {"resnet18"}  # tuned at --large-budget: eight tasks, which the small models' budget cannot each give one


def sequential(order: tuple[str, ...]):
    """A ``saturate`` that applies the groups of ``order`` one after another, destructively."""
    def saturate(g, names, limits: Limits = Limits()):
        return fixed_order(g, order, names, limits)

    return saturate


def tuned(graph, budget: int, out: Path, order=None):
    """(plan, the plan's steps as text, the plan's steps with their knobs, tuning seconds, the spec's path) of
    ``graph`` tuned with the e-graph or a fixed order."""
    t0 = time.perf_counter()
    if order is None:
        wl = wl_models.graph_workload(graph, graph.name)
    else:  # a fixed order's own e-graph, seeded by its own extractions only (greedy and ILP)
        with mock.patch.object(wl_models, "saturate", sequential(order)), \
                mock.patch.object(wl_models, "_order_choices", lambda *a: {}):
            wl = wl_models.graph_workload(graph, graph.name)
    res = tune(wl, budget=budget, out=out)
    program = [s for t in res.spec["tasks"].values() for s in t.get("program", [])
               if s["op"].startswith(("lib", "tmpl"))]
    steps = sorted({f"{s['op'][:-1]}:{s['args'][0]}" for s in program})
    # the plan up to its e-class names (which differ between e-graphs): its steps with their knobs
    same = sorted(json.dumps([s["op"], s["args"], s.get("knobs")], sort_keys=True) for s in program)
    return res.plan, steps, same, time.perf_counter() - t0, res.spec_path


def interleaved(fns: dict, rounds: int, min_s: float = 0.02) -> dict[str, float]:
    """Median seconds per call of each zero-argument function over ``interleaved_samples``' rounds."""
    return {k: statistics.median(v) for k, v in interleaved_samples(fns, rounds, min_s).items()}


def interleaved_samples(fns: dict, rounds: int, min_s: float = 0.02) -> dict[str, list[float]]:
    """Seconds per call of each zero-argument function, one sample a round, timed round by round (each sample:
    calls for at least ``min_s``), after one warm-up call each; each round after the first in a fresh order and
    each turn after a pause (``planforge.measure.timing.interleaved``: a runtime's pool spinning after its calls, ONNX
    Runtime's, would otherwise always slow the same runner)."""
    from planforge.measure.timing import interleaved as rounds_of

    for f in fns.values():
        f()

    def block(_name, f):
        n, t0 = 0, time.perf_counter()
        while True:
            f()
            n += 1
            if time.perf_counter() - t0 > min_s:
                break
        return (time.perf_counter() - t0) / n

    return rounds_of(fns, rounds, block)


def verdict(egraph: list[float], best: list[float], control: float, alpha: float = 0.05) -> dict:
    """The e-graph's plan against the best fixed order's from their paired per-round samples: the median per-round
    ratio, the one-sided Wilcoxon signed-rank p-values of the log ratios (e-graph slower; e-graph faster), and
    ``slower`` / ``faster`` where one is under ``alpha`` and the median ratio is further from 1 than ``control``
    (the e-graph's plan loaded twice: the ratio of its two timings), else ``tie``."""
    from scipy.stats import wilcoxon

    logs = np.log(np.asarray(egraph) / np.asarray(best))
    ratio = float(np.exp(np.median(logs)))
    if np.allclose(logs, 0.0):  # the same plan timed once (a fixed order that chose the e-graph's plan)
        return {"ratio": 1.0, "p_slower": 1.0, "p_faster": 1.0, "verdict": "tie"}
    p_slower = float(wilcoxon(logs, alternative="greater").pvalue)
    p_faster = float(wilcoxon(logs, alternative="less").pvalue)
    resolution = abs(control - 1.0)
    out = "tie"
    if p_slower < alpha and ratio > 1.0 + resolution:
        out = "slower"
    elif p_faster < alpha and ratio < 1.0 - resolution:
        out = "faster"
    return {"ratio": ratio, "p_slower": p_slower, "p_faster": p_faster, "verdict": out}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=6, help="evaluations per variant of each small model")
    ap.add_argument("--large-budget", type=int, default=24,
                    help="evaluations per variant of ResNet-18 (its eight tasks need one each at least)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    unknown = [n for n in args.models.split(",") if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            report[name] = compare(name, args.large_budget if name in LARGE else args.budget, args.rounds, Path(tmp))
            if args.json:  # after each model, so that a later failure loses nothing measured
                Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def compare(name: str, budget: int, rounds: int, tmp: Path) -> dict:
    """One model: the e-graph and every fixed order tuned at ``budget``, their plans timed interleaved, the verdict.
    A variant whose tuning fails is recorded with its error and left out of the timing (a fixed order that cannot
    produce a plan has lost); without the e-graph's plan there is no verdict."""
    g = MODELS[name]()
    x = g.example_inputs(0)[0]
    (ref,) = g.evaluate(x)
    plans, rows, specs = {}, {}, {}
    print(f"{name}: budget {budget} a variant", flush=True)
    for label, order in [("e-graph", None), *ORDERS.items()]:
        try:
            plan, steps, same, secs, specs[label] = tuned(g, budget, tmp / f"{name}-{label.replace(' ', '-')}", order)
        except Exception as e:  # noqa: BLE001 -- recorded and reported, the other variants go on
            print(f"{name} / {label}: tuning failed: {type(e).__name__}: {e}", flush=True)
            rows[label] = {"error": f"{type(e).__name__}: {e}"}
            continue
        err = float(np.abs(plan(x)[0] - ref).max())
        plans[label] = plan
        rows[label] = {"steps": steps, "tune_s": secs, "max_err": err, "plan": same, "budget": budget}
        print(f"{name} / {label}: tuned in {secs:.0f} s, max |err| {err:.2g}, kernels {', '.join(steps)}", flush=True)
    if "e-graph" not in plans:
        return rows
    ok = [k for k in rows if k in plans]
    # a variant whose tuned plan is another's (the same steps with the same knobs) is that plan: it is timed once, so
    # that two loads of one program timed apart (a few per cent between them, as their buffers happen to lie) do not
    # rank it against itself
    first = {}
    for k in ok:
        first.setdefault(json.dumps(rows[k]["plan"]), k)
    again = load(specs["e-graph"], graph=g)  # the control: the e-graph's plan, loaded a second time
    samples = interleaved_samples({k: (lambda p: (lambda: p(x)))(plans[k] if k != CONTROL else again)
                                   for k in [*dict.fromkeys(first.values()), CONTROL]}, rounds)
    timed = {k: statistics.median(v) for k, v in samples.items()}
    med = {k: timed[first[json.dumps(rows[k]["plan"])]] for k in ok}
    for k in ok:
        rows[k]["median_s"] = med[k]
        rows[k]["vs_egraph"] = med[k] / med["e-graph"]
    print(f"\n{name}: median us   (ratio to the e-graph's plan)")
    for k, r in rows.items():
        if k not in plans:
            print(f"  {k:15s}    failed   ({r['error']})")
            continue
        twin = " (the e-graph's plan)" if k != "e-graph" and r["plan"] == rows["e-graph"]["plan"] else ""
        print(f"  {k:15s} {r['median_s'] * 1e6:9.1f}   {r['vs_egraph']:.2f}x{twin}")
    control = timed[CONTROL] / med["e-graph"]
    print(f"  {CONTROL:15s} {timed[CONTROL] * 1e6:9.1f}   {control:.2f}x (the timing's resolution)")
    fixed = [k for k in ORDERS if k in plans]
    out = {**rows, CONTROL: {"median_s": timed[CONTROL], "vs_egraph": control}}
    if not fixed:
        print("  no fixed order produced a plan\n", flush=True)
        return out
    best_label = min(fixed, key=lambda k: med[k])
    v = verdict(samples[first[json.dumps(rows["e-graph"]["plan"])]],
                samples[first[json.dumps(rows[best_label]["plan"])]], control)
    print(f"  e-graph / best fixed order ({best_label}): {med['e-graph'] / med[best_label]:.2f}; paired rounds: "
          f"median ratio {v['ratio']:.3f}, p(slower) {v['p_slower']:.3g}, p(faster) {v['p_faster']:.3g}: "
          f"{v['verdict']}\n", flush=True)
    return {**out, "verdict": {"best_fixed": best_label, **v}}


if __name__ == "__main__":
    sys.exit(main())
