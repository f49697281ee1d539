"""Convolutional models: planforge's tuned plans against torch eager, torch.compile, ONNX Runtime and OpenVINO.

The architectures are defined here (torchvision's CPU wheels are not on the package index; its CUDA builds fail
with the CPU torch), layer for layer as torchvision builds them: ResNet-18 (basic blocks 2-2-2-2, widths 64-512),
MobileNetV2 (inverted residuals, width 1.0) and MobileNetV3-small (inverted residuals with squeeze-excite,
hardswish), random weights, batch norms with random inference statistics, eval mode. Each at 1x3xSxS for the
sizes asked (224 and 96 by default) is tuned by planforge (``planforge.tune`` on the module: torch.export, the
partition into tasks with identical blocks tuned once, ``--budget`` evaluations), exported to ONNX for ONNX Runtime
and OpenVINO, and timed in this one process, interleaved round by round, medians; every plan is checked against
torch first. Ratios are planforge over the fastest of ONNX Runtime and OpenVINO (the targets: ResNet-18 at 1.0,
MobileNet at 96x96 at 0.8).

Run: ``.venv/bin/python bench/cnn.py [--models resnet18,mobilenet_v2,mobilenet_v3_small] [--sizes 224,96]
[--budget 64] [--rounds 9] [--no-compile] [--json out.json]``
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from phase_order import interleaved  # noqa: E402


def _bn_random(m: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            n = mod.num_features
            mod.running_mean.copy_(0.1 * torch.randn(n, generator=g))
            mod.running_var.copy_(0.5 + torch.rand(n, generator=g))
            mod.weight.data.copy_(1 + 0.1 * torch.randn(n, generator=g))
            mod.bias.data.copy_(0.1 * torch.randn(n, generator=g))
    return m.eval()


def cbr(cin, cout, k, s=1, groups=1, act=nn.ReLU):
    layers = [nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


# -- ResNet-18 -------------------------------------------------------------------------------------------------------

class Basic(nn.Module):
    def __init__(self, cin, cout, s):
        super().__init__()
        self.c1, self.c2 = cbr(cin, cout, 3, s), cbr(cout, cout, 3, act=None)
        self.down = cbr(cin, cout, 1, s, act=None) if s != 1 or cin != cout else None

    def forward(self, x):
        return F.relu(self.c2(self.c1(x)) + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(cbr(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for i, w in enumerate((64, 128, 256, 512)):
            layers += [Basic(cin, w, 1 if i == 0 else 2), Basic(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


# -- MobileNetV2 -----------------------------------------------------------------------------------------------------

class Inverted(nn.Module):
    def __init__(self, cin, cout, s, t, k=3, se=False, act=nn.ReLU6, mid=None):
        super().__init__()
        mid = mid or cin * t
        self.res = s == 1 and cin == cout
        self.exp = cbr(cin, mid, 1, act=act) if mid != cin else None
        self.dw = cbr(mid, mid, k, s, groups=mid, act=act)
        self.se = SqueezeExcite(mid) if se else None
        self.proj = cbr(mid, cout, 1, act=None)

    def forward(self, x):
        h = x if self.exp is None else self.exp(x)
        h = self.dw(h)
        if self.se is not None:
            h = self.se(h)
        h = self.proj(h)
        return x + h if self.res else h


class MobileNetV2(nn.Module):
    CFG = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, classes=1000):
        super().__init__()
        layers, cin = [cbr(3, 32, 3, 2, act=nn.ReLU6)], 32
        for t, c, n, s in self.CFG:
            for i in range(n):
                layers.append(Inverted(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(cbr(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(1280, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# -- MobileNetV3-small -----------------------------------------------------------------------------------------------

class SqueezeExcite(nn.Module):
    def __init__(self, c):
        super().__init__()
        sq = max(8, (c // 4 + 4) // 8 * 8)
        self.fc1, self.fc2 = nn.Conv2d(c, sq, 1), nn.Conv2d(sq, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))


class MobileNetV3Small(nn.Module):
    # kernel, expanded width, out, squeeze-excite, activation, stride (torchvision's table)
    CFG = [(3, 16, 16, True, "RE", 2), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
           (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1), (5, 240, 40, True, "HS", 1),
           (5, 120, 48, True, "HS", 1), (5, 144, 48, True, "HS", 1), (5, 288, 96, True, "HS", 2),
           (5, 576, 96, True, "HS", 1), (5, 576, 96, True, "HS", 1)]

    def __init__(self, classes=1000):
        super().__init__()
        layers, cin = [cbr(3, 16, 3, 2, act=nn.Hardswish)], 16
        for k, mid, c, se, a, s in self.CFG:
            layers.append(Inverted(cin, c, s, 0, k, se, nn.ReLU if a == "RE" else nn.Hardswish, mid))
            cin = c
        layers.append(cbr(cin, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, classes))

    def forward(self, x):
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


MODELS = {"resnet18": ResNet18, "mobilenet_v2": MobileNetV2, "mobilenet_v3_small": MobileNetV3Small}


# -- the runners -----------------------------------------------------------------------------------------------------

class NoPlan(Exception):
    """A model whose tuning wrote no spec."""


def onnx_runtime(m: nn.Module, x: torch.Tensor, onnx_path: Path, threads: int):
    """``m`` exported to ``onnx_path`` (opset 17) and ONNX Runtime's call of it on ``x`` with ``threads`` intra-op
    threads, as a zero-argument function; None when onnxruntime is not installed (the file is written anyway)."""
    torch.onnx.export(m, (x,), str(onnx_path), input_names=["x"], opset_version=17, dynamo=False)
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    xn = x.numpy()
    return lambda: sess.run(None, {"x": xn})


def model_and_input(name: str, size: int) -> tuple[nn.Module, torch.Tensor, np.ndarray]:
    """Model ``name`` with its seeded random weights and batch-norm statistics, its 1x3xSIZExSIZE input, and
    torch's output on it."""
    torch.manual_seed(0)
    m = _bn_random(MODELS[name]())
    x = torch.randn(1, 3, size, size)
    with torch.inference_mode():
        want = m(x).numpy()
    return m, x, want


def runners(name: str, size: int, budget: int, compile_: bool, tmp: Path, keep: str = "",
            spec: str = "") -> tuple[dict, dict]:
    m, x, want = model_and_input(name, size)
    xn = x.numpy()
    fns, info = {}, {}
    # every runtime gets the CPUs this process may use (under taskset, one): their defaults count the machine's
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    info["threads"] = threads

    def eager(v=x):
        with torch.inference_mode():
            return m(v)
    fns["torch eager"] = eager
    if compile_:
        cm = torch.compile(m)
        with torch.inference_mode():
            cm(x)

        def compiled(v=x):
            with torch.inference_mode():
                return cm(v)
        fns["torch.compile"] = compiled
    onnx_path = tmp / f"{name}-{size}.onnx"
    ort_run = onnx_runtime(m, x, onnx_path, threads)
    if ort_run is not None:
        fns["ONNX Runtime"] = ort_run
    else:
        info["onnxruntime"] = "not installed"
    try:
        import openvino as ov

        core = ov.Core()
        net = core.compile_model(str(onnx_path), "CPU", {"PERFORMANCE_HINT": "LATENCY",
                                                         "INFERENCE_PRECISION_HINT": "f32",
                                                         "INFERENCE_NUM_THREADS": threads})
        req = net.create_infer_request()
        fns["OpenVINO"] = lambda: req.infer({0: xn})
    except ImportError:
        info["openvino"] = "not installed"
    from planforge.api import load, tune
    from planforge.ir import from_torch

    if spec:  # a plan tuned before (``--keep``): loaded, not tuned again
        plan = load(Path(spec) / f"pf-{name}-{size}" / "spec.json", graph=from_torch(m, (x,)))
        info["tune_s"], info["tasks"] = float("nan"), len(plan.spec["tasks"])
    else:
        t0 = time.perf_counter()
        res = tune(m, example_inputs=(x,), budget=budget, out=(Path(keep) if keep else tmp) / f"pf-{name}-{size}")
        info["tune_s"] = time.perf_counter() - t0
        if res.spec is None:  # no plan: say which tasks failed and why, and go on with the next model
            errors = [str(t.error) for t in res.tasks if t.error is not None]
            raise NoPlan(f"{name} {size}: tuning wrote no spec; {len(errors)} of {len(res.tasks)} tasks found no "
                         f"valid plan, the first: {errors[0] if errors else 'none'}")
        info["tasks"] = len(res.spec["tasks"])
        plan = res.plan
    (got,) = plan(xn)
    info["max_err"] = float(np.abs(got - want).max())
    info["ref_max"] = float(np.abs(want).max())
    fns["planforge"] = lambda: plan(xn)
    info["plan"] = plan
    return fns, info


def _step_names(plan) -> list[str]:
    """One label per bound step of a ``Plan``, in the order of ``plan.steps`` (the same filter as its binding)."""
    by_cls = {s["cls"]: s for s in plan.program}
    names = []
    for s in plan.program:
        c = s["cls"]
        if c not in plan.views or s["op"] == "T.input" or (s["op"] == "lib1" and s["args"][0] == "reshape"
                                                         and s["inputs"][0] not in plan.constants):
            continue
        kind = s["args"][0] if s["args"] else s["op"]
        shapes = ",".join("x".join(map(str, by_cls[i]["shape"] or ())) for i in s["inputs"] if i in by_cls)
        knobs = s.get("knobs") or {}
        names.append(f"{s['op']} {kind} [{shapes}] -> {'x'.join(map(str, s['shape']))}"
                     + (f" {knobs}" if knobs else ""))
    return names


def profile(plan, xn, reps: int = 15) -> list[tuple[float, str]]:
    """Each step's median time (s) over ``reps`` calls, on the values of one whole call, slowest first."""
    plan(xn)
    plan = getattr(plan, "plan", plan)  # planforge.load's LoadedPlan holds the ChainPlan (or Plan) it runs
    rows = []
    parts = plan.parts if hasattr(plan, "parts") else [(plan, (), ())]
    for k, (p, _, _) in enumerate(parts):
        for name, f in zip(_step_names(p), p.steps):
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
            rows.append((float(np.median(ts)), f"part {k}: {name}"))
    return sorted(rows, reverse=True)


def ort_profile(onnx_path: Path, xn: np.ndarray, threads: int, reps: int = 50) -> list[tuple[float, str]]:
    """ONNX Runtime's own per-node profile of ``reps`` calls (``enable_profiling``): each node's mean time (s)
    and its op type and name, slowest first, to set beside ``profile``'s steps."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.enable_profiling = True
    so.profile_file_prefix = str(onnx_path.with_suffix(""))
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    for _ in range(5):
        sess.run(None, {"x": xn})
    for _ in range(reps):
        sess.run(None, {"x": xn})
    events = json.loads(Path(sess.end_profiling()).read_text())
    warm = sorted(e["ts"] for e in events if e.get("name") == "model_run")[5:6]  # the first timed run's start
    totals: dict[str, float] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if warm and e["ts"] < warm[0]:
            continue
        label = f"{e.get('args', {}).get('op_name', '?')} {e['name'][:-len('_kernel_time')]}"
        totals[label] = totals.get(label, 0.0) + e["dur"] * 1e-6
    return sorted(((t / reps, k) for k, t in totals.items()), reverse=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--sizes", default="224,96")
    ap.add_argument("--budget", type=int, default=64, help="evaluations per model (default 64: planforge tune's own)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--keep", default="", help="write the tuning outputs (spec, report) under this folder")
    ap.add_argument("--spec", default="", help="load the plans a --keep run wrote there instead of tuning")
    ap.add_argument("--profile", action="store_true",
                    help="print each tuned step's median time, slowest first, then ONNX Runtime's per-node profile")
    args = ap.parse_args(argv)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            for size in (int(s) for s in args.sizes.split(",")):
                try:
                    fns, info = runners(name, size, args.budget, not args.no_compile, Path(tmp), args.keep,
                                         args.spec)
                except NoPlan as e:
                    print(f"\n{e}", flush=True)
                    out[f"{name}-{size}"] = {"error": str(e)}
                    continue
                plan = info.pop("plan")
                if args.profile:
                    rows = profile(plan, np.random.default_rng(0).standard_normal((1, 3, size, size), np.float32))
                    print(f"\n{name} {size}: steps, sum {sum(t for t, _ in rows) * 1e3:.2f} ms")
                    for t, label in rows:
                        print(f"  {t * 1e3:8.3f} ms  {label}")
                med = interleaved(fns, args.rounds, 0.05)
                libs = [med[k] for k in ("ONNX Runtime", "OpenVINO") if k in med]
                ratio = med["planforge"] / min(libs) if libs else float("nan")
                print(f"\n{name} 1x3x{size}x{size}: tuned in {info['tune_s']:.0f} s ({info['tasks']} tasks), "
                      f"max |err| {info['max_err']:.2g} (outputs up to {info['ref_max']:.2g})")
                for k, v in med.items():
                    print(f"  {k:14s} {v * 1e3:9.3f} ms   planforge / it = {med['planforge'] / v:.2f}")
                print(f"  planforge / fastest of ONNX Runtime and OpenVINO: {ratio:.2f}", flush=True)
                if args.profile:  # after the timing: a profiling session's threads slowed every runner timed after it
                    try:
                        nodes = ort_profile(Path(tmp) / f"{name}-{size}.onnx", np.random.default_rng(0).standard_normal(
                            (1, 3, size, size), np.float32), info["threads"])
                    except ImportError:
                        nodes = []
                    if nodes:
                        print(f"\n{name} {size}: ONNX Runtime's nodes, sum {sum(t for t, _ in nodes) * 1e3:.2f} ms")
                        for t, label in nodes:
                            print(f"  {t * 1e3:8.3f} ms  {label}")
                out[f"{name}-{size}"] = {"median_s": med, "ratio_vs_fastest_runtime": ratio, **info}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())
