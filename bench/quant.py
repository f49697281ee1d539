"""Quantisation and tiling searched together (issue 17): planforge's weight formats against ONNX Runtime and torch.

Models, all at batch 1:

- ``gemv``: y = x @ W, 1 x 4096 x 4096;
- ``policy``: the zoo's policy MLP, 256-256-256-32 (bias, ReLU);
- ``llama``: a Llama-style MLP block, SwiGLU, width 1024 (hidden 2816): gate and up as one GEMV of 5632
  columns, silu(gate) * up in numpy, then down.

For each model planforge tunes every linear layer as a GEMV task (``planforge.tuning.tune``), three ways:

- ``fp32``: no accuracy budget (the default: no quantisation is offered);
- ``joint``: the accuracy budget stated, so that the weight format (bf16, int8, int8 with dynamic int8
  activations, int4 by blocks of 32/64/128) is a gene beside the tile knobs, searched together;
- ``quantise, then tile``: the fp32 search's tiles with a format swapped in: the joint search's format
  (``qtt same format``: what the tiles alone are worth) and the most compressed format the budget screen
  accepts (``qtt compressed``: a format decided first, then tiled blindly);

and, for the GEMV, each format in a search of its own. With ``--whole`` (the default) each model is also tuned
whole, as a model (its ONNX file imported, ``planforge.workloads.models.graph_workload``): fp32 with no budget;
``model joint``, the budget stated for the model's output, so that every linear template's format (per layer
in a fused MLP) is a gene and each plan is judged on the model's output; and ``model qtt``, the fp32 model
plan's tiles with each step's weights in the most compressed format its screen accepts (formats decided
first, then the tiles of another search: its error is measured, not promised). The whole-model budget is ORT
dynamic int8's error itself, not split. The per-layer accuracy budget is ONNX Runtime's own error
(dynamic int8, ``quantize_dynamic``) on the same inputs, split evenly over the model's layers, so that a
plan the walk accepts is about as accurate as ORT's, or better (unless ``--accuracy`` gives a per-layer one). Then, in this one process,
interleaved round by round on the same input: every planforge plan (compiled kernels, bound once; numpy
glue between layers), ONNX Runtime fp32 and dynamic int8, torch fp32 and dynamic int8
(``torch.ao.quantization.quantize_dynamic``). Each one's error against the fp64 forward pass is printed
beside its median time (``max_rel_err``: max |y - ref| / max |ref|; and the cosine).

Every OpenMP team and numpy's OpenBLAS threads are made to sleep when idle (``OMP_WAIT_POLICY=PASSIVE``,
``OPENBLAS_THREAD_TIMEOUT=4``, unless set), as planforge sets them: spinning threads of one runner (torch's, a
two-thread plan's, numpy's for the fp32 plan) would take the cores the next is timed on. ONNX Runtime keeps
its own spinning thread pool (what a user of it gets); so that its spin, or anything else a runner leaves
running, does not land on the same neighbour every round, each round after the first runs them in a fresh
(seeded) order, and each runner's calls start after a short pause (``planforge.measure.timing.SETTLE_S``).

Run (the machine's other load is printed beside the figures):

    .venv/bin/python bench/quant.py [--models gemv,policy,llama] [--budget 16] [--rounds 9] [--no-torch]
        [--no-per-format] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

# every OpenMP team in this process (the plans' with threads > 1, torch's) sleeps when idle instead of
# spinning: side by side in one process, a spinning team would take the cores the next runner is timed on
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # numpy's BLAS threads too (read when numpy loads)

import numpy as np  # noqa: E402

from planforge.quant import cosine, max_rel_err, parse_budget, variant_knobs  # noqa: E402
from planforge.measure.timing import interleaved as rounds_of  # noqa: E402
from planforge.search import Budget  # noqa: E402
from planforge.targets.cpu.build import build  # noqa: E402
from planforge.targets.cpu.templates import TEMPLATES, Problem  # noqa: E402
from planforge.tuning import tune  # noqa: E402
from planforge.workloads import load_workload  # noqa: E402

# a model: linear layers (K, N, epilogue) and what runs between them ("swiglu": silu(first half) * second half)
MODELS = {
    "gemv": [(4096, 4096, "none")],
    "policy": [(256, 256, "bias_relu"), (256, 256, "bias_relu"), (256, 32, "bias")],
    "llama": [(1024, 2 * 2816, "none"), ("swiglu",), (2816, 1024, "none")],
}
# most compressed first: what "quantise first" picks from the variants the budget accepts
COMPRESSION = ("int4:128", "int4:64", "int4:32", "int8+a8", "int8", "bf16", "fp32")


def layers(model):
    return [x for x in MODELS[model] if len(x) == 3]


def weights(model, seed=0):
    """The model's weights (scaled so that activations stay O(1)) and an input row."""
    rng = np.random.default_rng(seed)
    ws = []
    for K, N, epi in layers(model):
        W = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
        ws.append((W, rng.standard_normal(N).astype(np.float32) * 0.1 if epi != "none" else None))
    return ws, rng.standard_normal(MODELS[model][0][0]).astype(np.float32)


def _act(epi, y):
    return np.maximum(y, 0) if epi.endswith("relu") else y


def forward64(model, ws, x):
    h, it = x.astype(np.float64), iter(ws)
    for step in MODELS[model]:
        if len(step) == 1:
            H = h.shape[0] // 2
            h = h[:H] / (1 + np.exp(-h[:H])) * h[H:]
            continue
        W, b = next(it)
        h = _act(step[2], h @ W.astype(np.float64) + (b if b is not None else 0))
    return h


# -- planforge: tuned GEMV kernels, chained ------------------------------------------------------------------------

def tuned(K, N, epi, accuracy, evals, seed, out, variants=None):
    """The accepted knobs of a GEMV task (``variants``: restrict the format gene to these) and its quant record."""
    opts = {"shape": f"{N},{K}", "epilogue": epi, **({"accuracy": accuracy} if accuracy else {})}
    w = load_workload("gemv", opts)
    if variants is not None:  # the same task, its format gene narrowed (and its roofline model with it)
        from planforge.costmodel.analytic import analytic_model
        from planforge.targets import get_target

        target, p = get_target("cpu"), Problem("gemv", (N, K), epi)
        space = target.quant_space(p, variants)
        w.tasks[0] = dataclasses.replace(w.tasks[0], space=space,
                                         cost_model=analytic_model(p, space, target, cold=target.cold))
    r = tune(w, strategy="auto", budget=Budget(evals=evals), seed=seed, out=out)
    if r.spec is None:  # e.g. every finalist's re-measure timed out on a loaded machine
        raise RuntimeError(f"GEMV {K}x{N} {accuracy or 'fp32'}: no plan: {r.tasks[0].error}")
    t = next(iter(r.spec["tasks"].values()))
    stages = t.get("funnel") or []
    print(f"    {'joint' if accuracy else 'fp32'} search of {K}x{N}: funnel "
          + ", ".join(f"{st['stage']} {st['count']}" + (f" (bounds x{st['bound_scale']:.2f})" if "bound_scale" in st
                                                        else "") for st in stages), flush=True)
    return t["plan"], t.get("quant")


def with_variant(knobs, name):
    """fp32-tuned tiles with a format swapped in (``quantise, then tile``)."""
    k = {**knobs, **variant_knobs(name), "w_layout": "packed"}
    if k["act"] == "int8" and k["vec"] not in (8, 16):
        k["vec"] = 16 if k["vec"] > 8 else 8
    return k


def chain(model, plans, ws, x):
    """The model as planforge kernels (one GEMV each, bound once) and numpy glue: a callable and its output."""
    gemv = TEMPLATES["gemv"]
    steps, h = [], x
    it = iter(zip(layers(model), plans, ws))
    for step in MODELS[model]:
        if len(step) == 1:  # silu(gate) * up, into preallocated rows
            src, H = h, h.shape[0] // 2
            g, t = np.empty(H, np.float32), np.empty(H, np.float32)

            def glue(src=src, g=g, t=t, H=H):
                np.negative(src[:H], out=t)
                np.exp(t, out=t)
                t += 1
                np.divide(src[:H], t, out=g)
                g *= src[H:]

            steps.append(glue)
            h = g
            continue
        (K, N, epi), knobs, (W, b) = next(it)
        p = Problem("gemv", (N, K), epi)
        lib = ctypes.CDLL(str(build(gemv.source(p, knobs), gemv.openmp(knobs)).path))
        y = np.empty(N, np.float32)
        steps.append(gemv.bind(lib, p, knobs, {"x": h, "W": W, **({"bias": b} if b is not None else {})}, y))
        h = y
    if len(steps) == 1:
        return steps[0], h

    def run(steps=tuple(steps)):
        for s in steps:
            s()

    return run, h


# -- the peers -------------------------------------------------------------------------------------------------------

def onnx_model(model, ws):
    from onnx import TensorProto, helper, numpy_helper

    inits, nodes, h, it, n = [], [], "x", iter(ws), 0
    for step in MODELS[model]:
        n += 1
        if len(step) == 1:
            K = layers(model)[0][1] // 2
            for name, start, end in (("g", 0, K), ("u", K, 2 * K)):
                for k, v in (("s", start), ("e", end), ("a", -1)):
                    inits.append(numpy_helper.from_array(np.array([v], np.int64), f"{name}{k}{n}"))
                nodes.append(helper.make_node("Slice", [h, f"{name}s{n}", f"{name}e{n}", f"{name}a{n}"], [f"{name}{n}"]))
            nodes += [helper.make_node("Sigmoid", [f"g{n}"], [f"sg{n}"]), helper.make_node("Mul", [f"g{n}", f"sg{n}"], [f"si{n}"]),
                      helper.make_node("Mul", [f"si{n}", f"u{n}"], [f"h{n}"])]
            h = f"h{n}"
            continue
        W, b = next(it)
        inits.append(numpy_helper.from_array(W, f"W{n}"))
        nodes.append(helper.make_node("MatMul", [h, f"W{n}"], [f"m{n}"]))
        h = f"m{n}"
        if b is not None:
            inits.append(numpy_helper.from_array(b.reshape(1, -1), f"b{n}"))
            nodes.append(helper.make_node("Add", [h, f"b{n}"], [f"a{n}"]))
            h = f"a{n}"
        if step[2].endswith("relu"):
            nodes.append(helper.make_node("Relu", [h], [f"r{n}"]))
            h = f"r{n}"
    nodes.append(helper.make_node("Identity", [h], ["y"]))
    K0, Nl = MODELS[model][0][0], layers(model)[-1][1]
    g = helper.make_graph(nodes, model, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K0])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, Nl])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def ort_runners(model, ws, x, tmp: Path):
    try:
        import onnx
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        return {}, f"onnxruntime: {e}"
    f32, q8 = tmp / f"{model}.onnx", tmp / f"{model}-int8.onnx"
    onnx.save(onnx_model(model, ws), f32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(f32), str(q8), weight_type=QuantType.QInt8)
    out = {}
    for name, path in (("ORT fp32", f32), ("ORT dynamic int8", q8)):
        s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feed = {"x": x.reshape(1, -1)}
        out[name] = (lambda s=s, feed=feed: s.run(None, feed)[0]), None
    return out, None


def torch_runners(model, ws, x):
    try:
        import torch
    except ImportError as e:
        return {}, f"torch: {e}"

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.ModuleList()
            for (K, N, epi), (W, b) in zip(layers(model), ws):
                lin = torch.nn.Linear(K, N, bias=b is not None)
                lin.weight.data = torch.from_numpy(np.ascontiguousarray(W.T))
                if b is not None:
                    lin.bias.data = torch.from_numpy(b)
                self.lin.append(lin)

        def forward(self, h):
            it = iter(zip(layers(model), self.lin))
            for step in MODELS[model]:
                if len(step) == 1:
                    g, u = h.chunk(2, dim=-1)
                    h = torch.nn.functional.silu(g) * u
                    continue
                (_, _, epi), lin = next(it)
                h = lin(h)
                if epi.endswith("relu"):
                    h = torch.relu(h)
            return h

    m = M().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.ao.quantization.quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8)
    xt = torch.from_numpy(x).reshape(1, -1)

    def call(mod):
        def f():
            with torch.inference_mode():
                return mod(xt).numpy()
        return f

    return {"torch fp32": (call(m), None), "torch dynamic int8": (call(q), None)}, None


# -- timing ------------------------------------------------------------------------------------------------------------

def interleaved(runners: dict, rounds: int, min_s: float = 0.02) -> dict[str, float]:
    """Median seconds per call of each runner, over ``rounds`` rounds that visit every runner in turn
    (``planforge.measure.timing.interleaved``: each round in a fresh order, a pause before each turn)."""
    calls = {}
    for name, f in runners.items():
        f()
        t0 = time.perf_counter()
        for _ in range(3):
            f()
        calls[name] = max(1, int(min_s / ((time.perf_counter() - t0) / 3)))

    def block(name, f):
        n = calls[name]
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        return (time.perf_counter() - t0) / n

    return {k: statistics.median(v) for k, v in rounds_of(runners, rounds, block).items()}


def bench(model, args, tmp: Path) -> dict:
    ws, x = weights(model)
    ref = forward64(model, ws, x)
    peers, notes = {}, []
    for made, why in (ort_runners(model, ws, x, tmp), torch_runners(model, ws, x) if args.torch else ({}, None)):
        peers.update(made)
        if why:
            notes.append(why)
    peer_out = {k: np.asarray(f()).ravel() for k, (f, _) in peers.items()}
    peer_err = {k: max_rel_err(v, ref) for k, v in peer_out.items()}
    # the per-layer budget: ORT's whole-model error split evenly over the layers (to first order the layers'
    # relative errors add up), so that the chained plan stays about as accurate as ORT's
    ort = peer_err.get("ORT dynamic int8", 0.02)
    accuracy = args.accuracy or f"max_rel_err:{ort / len(layers(model)):.4g}"
    budget = parse_budget(accuracy).default
    print(f"\n== {model}: layers {[l[:2] for l in layers(model)]}, accuracy budget {budget} "
          f"per layer ({'given' if args.accuracy else 'ORT dynamic int8 error on these inputs / layers'})", flush=True)
    # the kernel-level searches, once per seed: one search of 12-16 evaluations is a draw, and "joint at least
    # as fast as quantise-then-tile" is judged on the medians over the seeds (``kernel_level`` in the output)
    plans: dict[str, list[dict]] = {}
    records = []
    for seed in range(args.seed, args.seed + args.seeds):
        tag = f" s{seed}" if args.seeds > 1 else ""
        for kind in KINDS:
            plans[kind + tag] = []
        for i, (K, N, epi) in enumerate(layers(model)):
            f32, _ = tuned(K, N, epi, "", args.budget, seed, tmp / f"{model}-{i}-fp32{tag.strip()}")
            joint, rec = tuned(K, N, epi, accuracy, args.budget, seed, tmp / f"{model}-{i}-joint{tag.strip()}")
            records.append({**rec, "seed": seed, "layer": i})
            chosen = rec["format"] if rec["format"] != "int4" else f"int4:{rec['block']}"
            if rec.get("activations") == "int8":
                chosen = "int8+a8"
            first = next(v for v in COMPRESSION if v in rec["screen"]["searched"])
            plans["fp32" + tag].append(f32)
            plans["joint" + tag].append(joint)
            plans["qtt same format" + tag].append(with_variant(f32, chosen) if chosen != "fp32" else f32)
            plans["qtt compressed" + tag].append(with_variant(f32, first) if first != "fp32" else f32)
            print(f"  layer {i} ({K}x{N}){tag}: joint chose {chosen} (error {rec['error']['value']:.3g}); screen "
                  + ", ".join(f"{k} {v:.2g}" for k, v in rec["screen"]["errors"].items()), flush=True)
            print(f"    tiles: joint {_tiles(joint)}; fp32 (qtt's) {_tiles(f32)}", flush=True)
    if model == "gemv" and args.per_format:  # each format in a search of its own
        K, N, epi = layers(model)[0]
        for v in ("bf16", "int8", "int8+a8", "int4:32", "int4:64", "int4:128"):
            if v not in records[0]["screen"]["errors"]:
                continue
            k, _ = tuned(K, N, epi, "max_rel_err:1", max(4, args.budget // 2), args.seed, tmp / f"gemv-{v}",
                         variants=(v,))
            plans[f"{v} alone"] = [k]
    runners, outs = {}, {}
    for name, ps in plans.items():
        runners[f"planforge {name}"], outs[f"planforge {name}"] = chain(model, ps, ws, x)
    whole = {}
    if args.whole:
        for name, (f, y, info) in whole_model(model, ws, x, f"max_rel_err:{ort:.4g}", args, tmp).items():
            runners[f"planforge {name}"], outs[f"planforge {name}"], whole[name] = f, y, info
    for k, (f, _) in peers.items():
        runners[k] = f
    med = interleaved(runners, args.rounds)
    rows = []
    for name in runners:
        out = np.asarray(outs[name]).ravel() if name in outs else peer_out[name]  # planforge's: its bound output
        rows.append({"runner": name, "median_s": med[name], "max_rel_err": max_rel_err(out, ref),
                     "cosine": cosine(out, ref)})
    seeds = range(args.seed, args.seed + args.seeds)
    per_seed = {kind: [med[f"planforge {kind}" + (f" s{s}" if args.seeds > 1 else "")] for s in seeds]
                for kind in KINDS}
    kernel_level = {kind: {"median_s": statistics.median(v), "per_seed_s": v} for kind, v in per_seed.items()}
    kernel_level["joint_not_slower"] = {  # seeds where the joint chain is at most each qtt's time
        q: sum(j <= t for j, t in zip(per_seed["joint"], per_seed[q])) for q in KINDS[2:]}
    return {"model": model, "accuracy": budget.to_json(), "rows": rows, "records": records, "notes": notes,
            "plans": {k: v for k, v in plans.items()}, "whole": whole, "kernel_level": kernel_level}


KINDS = ("fp32", "joint", "qtt same format", "qtt compressed")


def _tiles(knobs: dict) -> str:
    """A plan's tile knobs on one line (the format's own knobs left out)."""
    return " ".join(f"{k} {v}" for k, v in knobs.items() if k not in ("wfmt", "qblock", "act"))


COMPRESSED = {"int4:128": ("int4", 128), "int4:64": ("int4", 64), "int4:32": ("int4", 32), "int8": ("int8", 32),
              "bf16": ("bf16", 32)}


def _compressed(program, screens, skip=()):
    """The fp32 program with each quantisable step's weights in the most compressed format its screen accepts
    (weight-only formats, so that a fused MLP can take it too): quantise first, then someone else's tiles.
    ``skip``: earlier choices (step -> format) whose plans failed validation: each step's format is then the
    next one down, one step at a time (the most compressed step first)."""
    skipped = {}
    for ch in skip:  # every rejected choice rules out its most compressed step's format
        if ch:
            cls = min(ch, key=lambda c: COMPRESSION.index(ch[c]))
            skipped.setdefault(cls, set()).add(ch[cls])
    out, chosen = [], {}
    for st in program:
        st = dict(st)
        p = st.get("problem")
        scr = None
        if p is not None and st.get("knobs"):
            from planforge.ops.kernel import problem_from_json

            scr = screens.get(repr(problem_from_json(p)))
        if scr:
            first = next((v for v in COMPRESSION if v in scr["searched"] and v in COMPRESSED
                          and v not in skipped.get(st["cls"], ())), None)
            if first:
                fmt, block = COMPRESSED[first]
                k = dict(st["knobs"])
                if p.get("op") == "mlp":
                    k.update({f"wfmt{i}": fmt for i in range(len(p["layers"]))}, qblock=block)
                else:
                    k.update(wfmt=fmt, qblock=block, **({"act": "fp32"} if "act" in k else {}))
                    k["w_layout" if p.get("op") == "gemv" else "pack_b"] = "packed" if p.get("op") == "gemv" else 1
                st["knobs"] = k
                chosen[st["cls"]] = first
        out.append(st)
    return out, chosen


def whole_model(model, ws, x, accuracy, args, tmp: Path) -> dict:
    """The model tuned whole: fp32, joint under ``accuracy`` (the model's output), and quantise-then-tile;
    name -> (runner, its output buffer's values, facts)."""
    import onnx

    from planforge import load
    from planforge.ir import from_onnx
    from planforge.targets import get_target
    from planforge.workloads.models import graph_workload, validation_draws

    path = tmp / f"{model}-whole.onnx"
    onnx.save(onnx_model(model, ws), path)
    g = from_onnx(str(path))
    xin = x.reshape(1, -1)
    out = {}
    specs = {}
    # the joint plan is judged on the bench's input and draws like it (as a user's example inputs), and the
    # quantise-then-tile plan on the same draws: a format whose plan is over budget there is no plan either
    given = [[xin.astype(np.float32)]]
    wls = {}
    for name, acc in (("model fp32", ""), ("model joint", accuracy)):
        t0 = time.perf_counter()
        wls[name] = wl = graph_workload(g, f"{model}-{name.split()[1]}", accuracy=acc, example_inputs=given)
        r = tune(wl, strategy="auto", budget=Budget(evals=args.model_budget), seed=args.seed,
                 out=tmp / f"{model}-{name.split()[1]}")
        if r.spec is None:
            print(f"  {name}: no plan ({r.tasks[0].error})", flush=True)
            continue
        specs[name] = r.spec
        plan = load(r.spec_path, graph=g)
        y = plan(xin)[0]
        q = r.spec["tasks"]["graph"].get("quant") or {}
        info = {"tuning_s": time.perf_counter() - t0, "formats": q.get("formats", {}),
                "error_in_walk": (q.get("error") or {}).get("value")}
        print(f"  {name}: tuned in {info['tuning_s']:.0f} s; steps "
              + ", ".join(s["op"] for s in r.spec["tasks"]["graph"]["program"] if s.get("knobs"))
              + (f"; formats {info['formats'] or 'fp32 only'}" if acc else ""), flush=True)
        out[name] = (lambda plan=plan: plan(xin), y, info)
    if "model fp32" in specs and "model joint" in specs:
        screens = (specs["model joint"]["tasks"]["graph"].get("quant") or {}).get("screen", {})
        budget = parse_budget(accuracy).default
        draws = validation_draws(g, args.seed, given)
        refs = [g.evaluate(*d) for d in draws]
        rejected = []
        while True:
            prog, chosen = _compressed(specs["model fp32"]["tasks"]["graph"]["program"], screens,
                                       skip=[r for r, _ in rejected])
            plan = get_target("cpu").plan(g, prog)
            err = budget.worst(budget.measure(plan(*d)[0], r[0]) for d, r in zip(draws, refs))
            why = budget.excess(err) if chosen else None
            if not why:
                break
            rejected.append((chosen, why))
        for c, why in rejected:
            print(f"  model qtt: {c} rejected on the validation draws: {why}", flush=True)
        y = plan(xin)[0]
        print(f"  model qtt: the fp32 plan's tiles with {chosen or 'no format the screen accepts'} "
              f"(error {err:.3g} on {len(draws)} validation draws)", flush=True)
        out["model qtt"] = (lambda plan=plan: plan(xin), y, {"formats": chosen, "validation_error": err,
                                                              "rejected": [why for _, why in rejected]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gemv,policy,llama")
    ap.add_argument("--budget", type=int, default=16, help="evaluations per GEMV search")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1, help="kernel-level searches once per seed, seed .. seed+N-1")
    ap.add_argument("--accuracy", default="", help="the budget, e.g. max_rel_err:0.01 (default: ORT int8's error)")
    ap.add_argument("--no-per-format", dest="per_format", action="store_false")
    ap.add_argument("--no-whole", dest="whole", action="store_false", help="skip tuning each model whole")
    ap.add_argument("--model-budget", type=int, default=24, help="evaluations per whole-model search")
    ap.add_argument("--no-torch", dest="torch", action="store_false", help="leave torch out of the process")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    os.environ.setdefault("PLANFORGE_PROBE", "quick")
    results = []
    with tempfile.TemporaryDirectory(prefix="pf-quant-") as tmp:
        for model in args.models.split(","):
            r = bench(model, args, Path(tmp))
            results.append(r)
            f32 = r["kernel_level"]["fp32"]["median_s"]
            ort8 = next((x["median_s"] for x in r["rows"] if x["runner"] == "ORT dynamic int8"), None)
            print(f"  {'runner':34s} {'median':>10s} {'max_rel_err':>12s} {'cosine':>10s} {'fp32/this':>9s} "
                  f"{'ORT int8/this':>13s}")
            for x in r["rows"]:
                print(f"  {x['runner']:34s} {x['median_s'] * 1e6:8.1f}us {x['max_rel_err']:12.3g} "
                      f"{x['cosine']:10.6f} {f32 / x['median_s']:9.2f} "
                      f"{(ort8 / x['median_s']) if ort8 else float('nan'):13.2f}")
            kl = r["kernel_level"]
            print(f"  kernel level, median over {args.seeds} seed(s): "
                  + ", ".join(f"{k} {kl[k]['median_s'] * 1e6:.1f}us" for k in KINDS)
                  + f"; joint at most qtt on {kl['joint_not_slower']['qtt same format']} / "
                    f"{kl['joint_not_slower']['qtt compressed']} of {args.seeds} seeds (same format / compressed)")
            for n in r["notes"]:
                print("  note:", n)
    load = os.getloadavg()
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs (other processes "
          f"share this machine: figures are of a shared machine)")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "load": load, "cpus": os.cpu_count()}, indent=1,
                                              default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
