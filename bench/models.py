"""Zoo models: planforge's tuned plan vs numpy, torch eager, torch.compile and ONNX Runtime, in one run.

For each zoo model: tune it (planforge's own search, measured plans), then
time, side by side and interleaved in this one process, every runner on the
same inputs: the tuned plan called from Python (``planforge.load``), numpy op
by op, torch eager, torch.compile (default mode) and ONNX Runtime (all
threads; graph optimisations on). Prints each one's median latency and its
ratio to planforge, and the e-graph size, saturation and extraction times and
the number of plans in the genome.

Run (unset OpenBLAS's core-type override so numpy runs its best kernel here):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/models.py [--budget 32] [--models policy-mlp,...]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from planforge.api import load
from planforge.targets.cpu.graph import numpy_forward
from planforge.ir import ZOO, Graph
from planforge.measure import TimingConfig, time_fn
from planforge.search import Budget
from planforge.tuning import tune
from planforge.workloads import load_workload


def torch_module(g: Graph):
    """The graph as a torch module (same weights), for eager and torch.compile."""
    import torch
    import torch.nn.functional as F

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for i, (k, v) in enumerate(g.params.items()):
                self.register_buffer(f"p{i}", torch.from_numpy(v.copy()))
            self.names = {k: f"p{i}" for i, k in enumerate(g.params)}

        def forward(self, *xs):
            env = {k: getattr(self, n) for k, n in self.names.items()}
            env.update(zip(g.inputs, xs))
            for n in g.nodes:
                a = [env[i] for i in n.inputs]
                op = n.op
                if op == "matmul":
                    y = torch.matmul(a[0], a[1])
                elif op == "linear":
                    y = torch.matmul(a[0], a[1]) + (a[2] if len(a) == 3 else 0)
                elif op in ("add", "bias"):
                    y = a[0] + a[1]
                elif op == "relu":
                    y = torch.relu(a[0])
                elif op == "gelu":
                    y = F.gelu(a[0], approximate=n.attrs.get("approximate", "tanh"))
                elif op == "softmax":
                    y = torch.softmax(a[0], dim=-1)
                elif op == "layernorm":
                    y = F.layer_norm(a[0], a[0].shape[-1:], a[1], a[2], n.attrs.get("eps", 1e-5))
                elif op == "transpose":
                    y = a[0].permute(*n.attrs["perm"])
                elif op == "reshape":
                    y = a[0].reshape(*n.attrs["shape"])
                elif op == "scale":
                    y = a[0] * n.attrs["factor"]
                elif op == "concat":
                    y = torch.cat(a, dim=n.attrs.get("axis", -1))
                else:
                    raise ValueError(op)
                env[n.output] = y
            return env[g.outputs[0]]

    return M().eval()


def onnx_model(g: Graph):
    """The graph as an ONNX model (opset 20), for ONNX Runtime."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(v, k) for k, v in g.params.items()]
    nodes = []
    shapes = g.shapes()
    for n in g.nodes:
        ins, out = list(n.inputs), n.output
        op = n.op
        if op == "matmul":
            nodes.append(helper.make_node("MatMul", ins, [out]))
        elif op == "linear":
            nodes.append(helper.make_node("MatMul", ins[:2], [out + "_mm"] if len(ins) == 3 else [out]))
            if len(ins) == 3:
                nodes.append(helper.make_node("Add", [out + "_mm", ins[2]], [out]))
        elif op in ("add", "bias"):
            nodes.append(helper.make_node("Add", ins, [out]))
        elif op == "relu":
            nodes.append(helper.make_node("Relu", ins, [out]))
        elif op == "gelu":
            nodes.append(helper.make_node("Gelu", ins, [out], approximate=n.attrs.get("approximate", "tanh")))
        elif op == "softmax":
            nodes.append(helper.make_node("Softmax", ins, [out], axis=-1))
        elif op == "layernorm":
            nodes.append(helper.make_node("LayerNormalization", ins, [out], axis=-1, epsilon=n.attrs.get("eps", 1e-5)))
        elif op == "transpose":
            nodes.append(helper.make_node("Transpose", ins, [out], perm=list(n.attrs["perm"])))
        elif op == "reshape":
            sname = out + "_shape"
            inits.append(numpy_helper.from_array(np.array(n.attrs["shape"], np.int64), sname))
            nodes.append(helper.make_node("Reshape", [ins[0], sname], [out]))
        elif op == "scale":
            fname = out + "_f"
            inits.append(numpy_helper.from_array(np.array(n.attrs["factor"], np.float32), fname))
            nodes.append(helper.make_node("Mul", [ins[0], fname], [out]))
        else:
            raise ValueError(op)
    inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in g.inputs.items()]
    outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(shapes[o])) for o in g.outputs]
    m = helper.make_model(helper.make_graph(nodes, g.name, inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", 20)])
    onnx.checker.check_model(m)
    return m


def runners(name: str, plan, g: Graph, xs):
    """name -> (zero-arg callable, reason it is missing)."""
    out = {"planforge": (lambda: plan(*xs), None)}
    fwd = numpy_forward(g)
    out["numpy"] = (lambda: fwd(*xs), None)
    try:
        import torch

        m = torch_module(g)
        txs = [torch.from_numpy(x) for x in xs]

        def eager():
            with torch.inference_mode():
                return m(*txs)

        out["torch eager"] = (eager, None)
        try:
            cm = torch.compile(m)
            with torch.inference_mode():
                cm(*txs)

            def compiled():
                with torch.inference_mode():
                    return cm(*txs)

            out["torch.compile"] = (compiled, None)
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            out["torch.compile"] = (None, f"torch.compile failed: {type(e).__name__}: {str(e)[:120]}")
    except ImportError as e:
        out["torch eager"] = out["torch.compile"] = (None, f"torch not installed ({e})")
    try:
        import onnxruntime as ort

        sess = ort.InferenceSession(onnx_model(g).SerializeToString(), providers=["CPUExecutionProvider"])
        feed = dict(zip(g.inputs, xs))
        out["onnxruntime"] = (lambda: sess.run(None, feed), None)
    except ImportError as e:
        out["onnxruntime"] = (None, f"onnxruntime not installed ({e})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=32, help="plans measured per model (default 32)")
    ap.add_argument("--models", default="policy-mlp,policy-mlp-b64,drill-mlp,transformer-block",
                    help=f"comma-separated zoo models (known: {', '.join(ZOO)})")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    cfg = TimingConfig(budget_s=0.2)
    report = {}
    for name in args.models.split(","):
        t0 = time.perf_counter()
        res = tune(load_workload(name), strategy="auto", budget=Budget(evals=args.budget), seed=0,
                   out=f"/tmp/planforge-bench-models/{name}")
        tr = res.tasks[0]
        plan = load(res.spec_path)
        g = plan.graph
        xs = g.example_inputs(1)
        ref = g.evaluate(*xs)
        rs = runners(name, plan, g, xs)
        times: dict[str, list[float]] = {k: [] for k, (f, _) in rs.items() if f}
        for k, (f, _) in rs.items():  # correctness of every peer on the same inputs
            if f:
                y = f()
                y = y[0] if isinstance(y, (list, tuple)) else y
                y = y.detach().numpy() if hasattr(y, "detach") else np.asarray(y)
                err = float(np.abs(y.reshape(ref[0].shape) - ref[0]).max())
                if err > 1e-2:
                    print(f"  {name}/{k}: max error {err:.3g} vs the fp64 reference", file=sys.stderr)
        for _ in range(args.rounds):
            for k, (f, _) in rs.items():
                if f:
                    times[k].append(statistics.median(time_fn(f, cfg)))
                    # let this runner's spinning threads (ONNX Runtime's, torch's, a plan's persistent pool)
                    # go idle, or the next runner shares its cores with them
                    time.sleep(0.05)
        med = {k: statistics.median(v) for k, v in times.items()}
        info = tr.task.info
        print(f"\n{name}: {g.name}, {len(g.nodes)} ops, {g.param_bytes() / 1e6:.2f} MB weights; tuned in "
              f"{time.perf_counter() - t0:.0f} s ({tr.result.evaluations} plans measured)")
        print(f"  e-graph {info['eclasses']} classes / {info['enodes']} nodes, saturation {info['saturation_s'] * 1e3:.1f} ms, "
              f"greedy {info['greedy_s'] * 1e3:.2f} ms, ILP {info['ilp_s'] * 1e3:.1f} ms ({info['ilp']}); "
              f"{info['graph_choices']:.3g} graph-level plans, genome {info['genome_size']:.3g} points")
        for k, (f, why) in rs.items():
            if f:
                print(f"  {k:>14}: {med[k] * 1e6:9.1f} us   planforge / this = {med['planforge'] / med[k]:.3f}")
            else:
                print(f"  {k:>14}: skipped: {why}")
        report[name] = {"median_s": med, "skipped": {k: why for k, (f, why) in rs.items() if not f},
                        "plan": [s["op"] + ":" + (s["args"][0] if s["args"] else "") for s in
                                 res.spec["tasks"]["graph"]["program"] if not s["op"].startswith(("T.", "Layers."))],
                        "egraph": {k: v for k, v in info.items() if k != "saturation"}}
    print("\ntargets: policy-mlp planforge/numpy <= 0.3:",
          f"{report['policy-mlp']['median_s']['planforge'] / report['policy-mlp']['median_s']['numpy']:.3f}"
          if "policy-mlp" in report else "n/a",
          "| policy-mlp-b64 planforge/onnxruntime <= 0.7:",
          f"{report['policy-mlp-b64']['median_s']['planforge'] / report['policy-mlp-b64']['median_s']['onnxruntime']:.3f}"
          if "policy-mlp-b64" in report and "onnxruntime" in report["policy-mlp-b64"]["median_s"] else "n/a")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
