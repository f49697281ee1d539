"""Hugging Face transformers (issue 13): tiny models from configs, tuned by planforge, against the libraries.

Every model is built from a ``transformers`` config with random weights (seed
0; nothing is downloaded): GPT-2 (2 and 6 layers, width 256, 4 heads), BERT
(2 layers, width 256), a Llama-style model (RMSNorm, SwiGLU, rotary,
grouped-query attention 8/2 heads; 2 layers, width 256) and ViT-tiny (12
layers, width 192, 3 heads) on 64x64 images; the language models run prefill
at sequence 32, batch 1. For each:

1. import through torch.export (fallback steps counted) and check the graph's
   fp64 reference against the model run by torch in fp64;
2. tune with ``planforge.tune`` at ``--budget`` (the tuning time is printed);
   the plan is checked against torch in fp64 too;
3. time, in this one process, interleaved round by round on the same input:
   planforge's plan, torch eager (``inference_mode``), ``torch.compile``
   (inductor; compile time printed), ONNX Runtime (the model exported by
   torch's dynamo exporter at opset 18; all graph optimisations) and OpenVINO
   (from the same ONNX file; LATENCY hint), where installed. Per runner the
   median of the per-round medians is reported, with planforge over the
   fastest of ONNX Runtime, OpenVINO and torch.compile (the target is 0.8).

Threads: torch, ONNX Runtime and OpenVINO get ``--threads`` (default: the
machine's cores); numpy's BLAS (planforge's library steps) runs one thread
unless ``OPENBLAS_NUM_THREADS`` says otherwise: its spinning threads on the
shared machine once made a plan whose search had chosen numpy's linear for
GPT-2-6's MLP (measured 0.8 ms a part while tuning) take 12 ms per such step
in the timing. OpenMP's idle threads sleep
(``OMP_WAIT_POLICY=PASSIVE``, planforge's default, unless the environment sets
it): torch and planforge's kernels share one libgomp here, loaded by
``import torch`` before planforge could set it, so it is set before torch is
imported and torch eager and ``torch.compile`` run under the same policy
(ONNX Runtime and OpenVINO have their own thread pools).

    .venv/bin/python bench/transformers.py [--models gpt2-2,bert-2] [--budget 64] [--rounds 7] [--threads 2]
        [--reuse] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads libgomp (see the docstring)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads OpenBLAS (see the docstring)

import numpy as np  # noqa: E402 - after the thread settings

# this file is named like the package it benchmarks: keep its own folder off the import path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

SEQ = 32


def build(name: str):
    """(model, example inputs) for a bench model name."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    ids = (torch.randint(0, 1000, (1, SEQ)),)
    if name.startswith("gpt2-"):
        cfg = T.GPT2Config(n_layer=int(name.split("-")[1]), n_embd=256, n_head=4, vocab_size=1000, n_positions=64,
                           use_cache=False, bos_token_id=0, eos_token_id=0)
        return T.GPT2Model(cfg).eval(), ids
    if name == "bert-2":
        cfg = T.BertConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                           vocab_size=1000, max_position_embeddings=64)
        return T.BertModel(cfg, add_pooling_layer=False).eval(), ids
    if name == "llama-2":
        cfg = T.LlamaConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                            intermediate_size=688, vocab_size=1000, max_position_embeddings=64, use_cache=False,
                            bos_token_id=0, eos_token_id=0)
        return T.LlamaModel(cfg).eval(), ids
    if name == "vit-tiny":
        cfg = T.ViTConfig(image_size=64, patch_size=16, num_hidden_layers=12, hidden_size=192, num_attention_heads=3,
                          intermediate_size=768)
        return T.ViTModel(cfg, add_pooling_layer=False).eval(), (torch.randn(1, 3, 64, 64),)
    raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")


MODELS = ("gpt2-2", "gpt2-6", "bert-2", "llama-2", "vit-tiny")


class First:
    """The model's first output (``last_hidden_state``) as a plain tensor: what every runner is compared on."""

    def __init__(self, model):
        import torch

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, x):
                return self.m(x)[0]

        self.module = Wrap().eval()


def fp64_reference(model, args):
    import copy

    import torch

    m64 = copy.deepcopy(model).double()
    with torch.no_grad():
        out = m64(*[a.double() if a.is_floating_point() else a for a in args])[0]
    return out.numpy()


def rel_err(got, ref) -> float:
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def runners(module, args, threads: int, tmp: Path, notes: list[str]) -> dict:
    """name -> zero-argument callable returning the output, for every library available here."""
    import torch

    out = {}
    torch.set_num_threads(threads)

    def eager():
        with torch.inference_mode():
            return module(*args)
    out["torch eager"] = eager
    try:
        t0 = time.perf_counter()
        comp = torch.compile(module, dynamic=False)
        with torch.inference_mode():
            comp(*args)
        notes.append(f"torch.compile (inductor) compiled in {time.perf_counter() - t0:.1f} s")

        def compiled():
            with torch.inference_mode():
                return comp(*args)
        out["torch.compile"] = compiled
    except Exception as e:  # inductor needs a C++ compiler; report and go on
        notes.append(f"torch.compile unavailable: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    path = tmp / "model.onnx"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, str(path), dynamo=True, opset_version=18, verbose=False)
    except Exception as e:
        notes.append(f"ONNX export failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        return out
    feeds = None
    try:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
        out["ONNX Runtime"] = lambda: sess.run(None, feeds)[0]
    except ImportError:
        notes.append("ONNX Runtime not installed")
    try:
        import openvino as ov

        core = ov.Core()
        cm = core.compile_model(str(path), "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
                                                   "INFERENCE_PRECISION_HINT": "f32"})
        req = cm.create_infer_request()
        ov_in = [a.numpy() for a in args]
        out["OpenVINO"] = lambda: req.infer(ov_in)[cm.output(0)]
    except ImportError:
        notes.append("OpenVINO not installed")
    return out


def time_all(fns: dict, rounds: int, per_round_s: float) -> dict[str, float]:
    """Median over rounds of each runner's median call time; runners interleaved within every round, each
    round in a fresh order and each turn after a pause (``planforge.measure.timing.interleaved``: ONNX
    Runtime's pool spins after its calls and slowed whichever runner came next)."""
    from planforge.measure.timing import interleaved

    for f in fns.values():
        f()                                    # warm

    def sample(_name, f):
        ts, t_end = [], time.perf_counter() + per_round_s
        while time.perf_counter() < t_end or len(ts) < 3:
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    return {k: statistics.median(v) for k, v in interleaved(fns, rounds, sample).items()}


def bench(name: str, budget: int, rounds: int, per_round_s: float, threads: int, out_dir: Path,
          reuse: bool = False) -> dict:
    import torch

    import planforge
    from planforge.ir import from_torch
    from planforge.ops.fallback import steps

    model, args = build(name)
    module = First(model).module
    ref = fp64_reference(model, args)
    t0 = time.perf_counter()
    graph = from_torch(module, args)
    row = {"model": name, "ops": len(graph.nodes), "fallbacks": len(steps(graph)),
           "import_s": time.perf_counter() - t0,
           "reference_err": rel_err(graph.evaluate(*[a.numpy() for a in args])[0], ref)}
    t0 = time.perf_counter()
    spec_path = out_dir / name / "spec.json"
    if reuse and spec_path.is_file():        # the plan an earlier run tuned, on this graph's own weights
        plan, spec = planforge.load(spec_path, graph=graph), json.loads(spec_path.read_text())
        row["tune_s"] = float("nan")
    else:
        res = planforge.tune(module, args, budget=budget, out=out_dir / name)
        row["tune_s"] = time.perf_counter() - t0
        plan, spec = res.plan, res.spec
    xs = [a.numpy() for a in args]
    row["plan_err"] = rel_err(plan(*xs), ref)
    e2e = spec.get("end_to_end") or {}
    row["tasks"] = len(spec.get("tasks", {}))
    row["decisions"] = {k: v.get("decision") for k, v in (e2e.get("decisions") or {}).items()}
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        fns = {"planforge": lambda: plan(*xs), **runners(module, args, threads, Path(tmp), notes)}
        for k, f in fns.items():
            if k != "planforge":
                got = f()
                row[f"{k} err"] = rel_err(got.detach().numpy() if isinstance(got, torch.Tensor) else got, ref)
        row["medians_s"] = time_all(fns, rounds, per_round_s)
    peers = {k: v for k, v in row["medians_s"].items() if k in ("ONNX Runtime", "OpenVINO", "torch.compile")}
    if peers:
        best = min(peers, key=peers.get)
        row["fastest_peer"] = best
        row["planforge_over_peer"] = row["medians_s"]["planforge"] / peers[best]
    row["notes"] = notes
    return row


def _label(step: dict) -> str:
    """A step's kind for the profile: library or template, the op and its output shape (and a template's threads)."""
    shape = "x".join(map(str, step["shape"]))
    if step["op"].startswith("lib"):
        return f"lib {step['args'][0]} {shape}"
    knobs = step.get("knobs") or {}
    return f"{step['op'][:4]} {' '.join(a for a in step['args'] if a)} {shape} t{knobs.get('threads', '?')}"


def profile(plan, xs, reps: int = 200, cold_reps: int = 3) -> list[tuple[str, float, float, float, int]]:
    """Each step of a loaded plan timed alone with hot caches (median over ``reps`` calls, after one full run on
    ``xs`` fills the arenas), alone with cold caches (median over ``cold_reps`` calls, each after writing 256 MB)
    and inside whole calls (median over ``reps // 4`` calls of the plan, each step timed where it runs: its
    weights then come from wherever the rest of the forward left them), summed per kind:
    ``[(kind, alone hot s, in-chain s, alone cold s, steps)]`` per forward, largest in-chain first."""
    inner = plan.plan
    parts = [p for p, _, _ in inner.parts] if hasattr(inner, "parts") else [inner]
    plan(*xs)
    junk = np.ones(64 * 2**20, np.float32)  # 256 MB: more than the last-level cache
    rows = []  # (kind, alone, [in-chain times], cold)
    for part in parts:
        bound = [s for s in part.program if s["cls"] in part.views and s["op"] != "T.input"
                 and not (s["op"] == "lib1" and s["args"][0] == "reshape" and s["inputs"][0] not in part.constants)]
        assert len(bound) == len(part.steps), (len(bound), len(part.steps))
        for i, (s, f) in enumerate(zip(bound, part.steps)):
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
            cold = []
            for _ in range(cold_reps):
                junk += 1.0
                t0 = time.perf_counter()
                f()
                cold.append(time.perf_counter() - t0)
            chained: list[float] = []
            rows.append((_label(s), statistics.median(ts), chained, statistics.median(cold)))

            def timed(f=f, out=chained):
                t0 = time.perf_counter()
                f()
                out.append(time.perf_counter() - t0)
            part.steps[i] = timed
    for _ in range(max(reps // 4, 5)):
        plan.plan(*xs)
    per: dict[str, list] = {}
    for k, alone, chained, cold in rows:
        e = per.setdefault(k, [0.0, 0.0, 0.0, 0])
        e[0] += alone
        # (a step that runs inside a compiled chain runner is not called through ``part.steps``: no in-chain time)
        e[1] += statistics.median(chained) if chained else float("nan")
        e[2] += cold
        e[3] += 1
    return sorted(((k, a, c, d, n) for k, (a, c, d, n) in per.items()),
                  key=lambda r: -(r[2] if r[2] == r[2] else r[1]))


def fmt(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


def markdown(rows: list[dict]) -> str:
    cols = ["planforge", "torch eager", "torch.compile", "ONNX Runtime", "OpenVINO"]
    lines = ["| model | ops (fallbacks) | tune | plan err | " + " | ".join(cols) + " | planforge / fastest peer |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in cols) + " | --- |"]
    for r in rows:
        m = r["medians_s"]
        ratio = f"{r['planforge_over_peer']:.2f} ({r['fastest_peer']})" if "fastest_peer" in r else "-"
        tune = "reused" if r["tune_s"] != r["tune_s"] else f"{r['tune_s']:.0f} s"
        lines.append(f"| {r['model']} | {r['ops']} ({r['fallbacks']}) | {tune} | {r['plan_err']:.1e} | "
                     + " | ".join(fmt(m[c]) if c in m else "-" for c in cols) + f" | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--per-round", type=float, default=0.3, help="seconds per runner per round")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=Path("planforge-out/bench-transformers"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--reuse", action="store_true", help="time the plan an earlier run wrote under --out (no tuning)")
    ap.add_argument("--profile", action="store_true",
                    help="time each step of the plan an earlier run wrote under --out: alone hot, alone cold and in whole calls, "
                         "summed per kind")
    a = ap.parse_args()
    if a.profile:
        import planforge
        from planforge.ir import from_torch

        for name in a.models.split(","):
            model, args = build(name)
            graph = from_torch(First(model).module, args)
            plan = planforge.load(a.out / name / "spec.json", graph=graph)
            xs = [x.numpy() for x in args]
            whole = time_all({"plan": lambda: plan(*xs)}, 3, 0.3)["plan"]
            rows = profile(plan, xs)
            alone, chained, cold = (sum(r[i] for r in rows) for i in (1, 2, 3))
            print(f"\n{name}: whole call {fmt(whole)}; steps alone sum to {fmt(alone)} hot, {fmt(cold)} cold, in the "
                  f"chain to {fmt(chained)} (load {os.getloadavg()[0]:.1f})\n"
                  "   alone hot  alone cold    in chain  share  steps  kind")
            for k, a1, c1, d1, n in rows:
                print(f"  {fmt(a1):>10}  {fmt(d1):>10}  {fmt(c1):>10}  {100 * c1 / chained:5.1f}%  x{n:<4} {k}")
        return
    rows = []
    for name in a.models.split(","):
        r = bench(name, a.budget, a.rounds, a.per_round, a.threads, a.out, a.reuse)
        rows.append(r)
        print(json.dumps(r, default=str), flush=True)
        if a.json:
            a.json.write_text(json.dumps(rows, indent=2, default=str))
    print(f"\nthreads {a.threads}, budget {a.budget}, {a.rounds} interleaved rounds, load average "
          f"{os.getloadavg()[0]:.1f}\n")
    print(markdown(rows))


if __name__ == "__main__":
    sys.exit(main())
