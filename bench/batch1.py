"""Batch-1 control loops: planforge's tuned MLP plans against the libraries, and against the physical limit.

For each MLP (the zoo's policy MLP 256-256-256-32, and 192-384-384-48 and
512-512-512-64 built the same way), tune it with planforge's own search, then
time in this one process, interleaved round by round on the same input:

- planforge from Python: ``plan(x)`` (``planforge.load``) and ``plan(x, out=y)``;
- the plan exported as C (``planforge.spec.export_c``): ``libplan.so`` through
  ctypes (pointers bound once), and its own C ``plan_main`` (10,000 calls per
  round, run between the Python rounds, the median per call it prints);
- (every runner's calls are timed one by one too: the mean per call of each
  round, whose median over rounds is the headline figure, and the p50 and p99
  of all single calls, which a busy machine's descheduled calls move far less);
- a direct numpy function (matmul, bias and activation into preallocated rows),
  ONNX Runtime (default session, and one intra-op thread), OpenVINO (latency
  hint, fp32 inference) when installed, torch eager and torch.compile under
  inference mode.

It prints every median, every ratio to planforge, planforge over the fastest of
numpy, ONNX Runtime, OpenVINO and torch.compile (the target is 0.3), the call
overhead (the target is under 1 us: ``plan(x)`` over the kernel's own time in
this process, the loaded plan's native entry called from C on the same buffers
by ``kernel_time``, as means over each round's calls and as medians of single
calls; ``plan(x)`` minus the C main's time, which is another process with its
own pool and caches, is printed beside it) and the physical-limit estimate: the weights' bytes over the read
bandwidth, from the probe, of the smallest cache level that holds them across
the threads the plan uses (the exported C plan's target is within 1.5x).

Run (unset OpenBLAS's core-type override so numpy runs its best kernel here):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/batch1.py [--budget 24] [--rounds 7]
        [--mlps policy,192-384-384-48,512-512-512-64] [--no-compile] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import onnx_model, torch_module  # noqa: E402

from planforge.api import load, tune  # noqa: E402
from planforge.ir.zoo import policy_mlp  # noqa: E402
from planforge.spec.export_c import export_c, fused_step  # noqa: E402
from planforge.targets.cpu import CpuTarget  # noqa: E402
from planforge.targets.cpu.templates.mlp import limit_estimate, weight_bytes  # noqa: E402
from planforge.workloads.models import graph_workload  # noqa: E402

MLPS = {"policy": (256, 256, 256, 32), "192-384-384-48": (192, 384, 384, 48), "512-512-512-64": (512, 512, 512, 64)}
PEERS = ("numpy", "onnxruntime", "onnxruntime 1t", "openvino", "torch.compile")


def numpy_function(g):
    """The MLP as a numpy user writes it for a control loop: matmul, bias, ReLU into preallocated rows."""
    layers = []  # the zoo's chain: matmul -> bias -> (relu) per layer
    for n in g.nodes:
        if n.op == "matmul":
            layers.append([g.params[n.inputs[1]], None, False])
        elif n.op == "bias":
            layers[-1][1] = g.params[n.inputs[1]]
        elif n.op == "relu":
            layers[-1][2] = True
    bufs = [np.empty((1, w.shape[1]), np.float32) for w, _, _ in layers]

    def f(x):
        h = x
        for (w, b, relu), buf in zip(layers, bufs):
            np.matmul(h, w, out=buf)
            buf += b
            if relu:
                np.maximum(buf, 0.0, out=buf)
            h = buf
        return h.copy()

    return f


def peers(g, x, compile_torch: bool, tmp: Path):
    """name -> (zero-argument callable, or None, and why not)."""
    out = {"numpy": ((lambda f=numpy_function(g): f(x)), None)}
    try:
        import onnxruntime as ort

        m = onnx_model(g).SerializeToString()
        s = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
        o1 = ort.SessionOptions()
        o1.intra_op_num_threads = 1
        s1 = ort.InferenceSession(m, o1, providers=["CPUExecutionProvider"])
        feed = {next(iter(g.inputs)): x}
        out["onnxruntime"] = ((lambda: s.run(None, feed)), None)
        out["onnxruntime 1t"] = ((lambda: s1.run(None, feed)), None)
    except ImportError as e:
        out["onnxruntime"] = out["onnxruntime 1t"] = (None, f"not installed ({e})")
    try:
        import openvino as ov

        path = tmp / f"{g.name}.onnx"
        path.write_bytes(onnx_model(g).SerializeToString())
        # fp32 like every other runner: on AVX-512 BF16/AMX parts OpenVINO would otherwise infer in bf16
        cm = ov.Core().compile_model(str(path), "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"})
        req = cm.create_infer_request()
        tensor = ov.Tensor(x, shared_memory=True)

        def ov_run():
            req.infer([tensor])
            return req.get_output_tensor(0).data

        out["openvino"] = (ov_run, None)
    except ImportError as e:
        out["openvino"] = (None, f"not installed ({e})")
    try:
        import torch

        mod = torch_module(g)
        tx = torch.from_numpy(x)

        def eager():
            with torch.inference_mode():
                return mod(tx)

        out["torch eager"] = (eager, None)
        if compile_torch:
            try:
                cmod = torch.compile(mod)
                with torch.inference_mode():
                    cmod(tx)

                def compiled():
                    with torch.inference_mode():
                        return cmod(tx)

                out["torch.compile"] = (compiled, None)
            except Exception as e:  # noqa: BLE001 - reported, not hidden
                out["torch.compile"] = (None, f"failed: {type(e).__name__}: {str(e)[:120]}")
        else:
            out["torch.compile"] = (None, "skipped (--no-compile)")
    except ImportError as e:
        out["torch eager"] = out["torch.compile"] = (None, f"not installed ({e})")
    return out


def exported(plan, spec, folder: Path, x: np.ndarray):
    """Export ``plan`` as C into ``folder``; (ctypes runner, its library, the C main's path, the export)."""
    e = export_c(plan.plan, folder, spec=spec)
    lib = ctypes.CDLL(str(folder / "libplan.so"))
    lib.plan_create.restype = ctypes.c_int
    lib.plan_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.plan_run.restype = ctypes.c_int
    lib.plan_destroy.restype = None
    if lib.plan_create() != 0:
        raise RuntimeError("plan_create failed")
    y = np.zeros(e.out_size, np.float32)
    xp, yp, run = x.ctypes.data, y.ctypes.data, lib.plan_run

    def f():
        run(xp, yp)
        return y

    (folder / "in.bin").write_bytes(np.ascontiguousarray(x, np.float32).tobytes())
    return f, lib, folder / "plan_main", e


def c_main(path: Path, calls: int) -> tuple[float, np.ndarray]:
    """Seconds per call (the median over the C main's rounds) and its output."""
    folder = path.parent
    p = subprocess.run([str(path), "-n", str(calls), "-r", "5", "-i", str(folder / "in.bin"), "-o",
                        str(folder / "out.bin")], capture_output=True, text=True, timeout=300, check=True)
    ns = next(float(ln.split()[1]) for ln in p.stdout.splitlines() if ln.startswith("median_ns_per_call"))
    return ns * 1e-9, np.frombuffer((folder / "out.bin").read_bytes(), np.float32)


def sweep(layers, knobs: dict, ws, bs, cores: int, calls: int, rounds: int) -> list[tuple[float, dict]]:
    """The fused kernel alone (its prebound native call) at 1 and all threads x three split patterns, the tuned
    plan's inner-loop knobs kept: (median seconds, knobs), fastest first. Says whether the search found the best."""
    from planforge.targets.cpu.build import build_many, load as load_lib
    from planforge.targets.cpu.templates import mlp

    L = len(layers)
    pats = {"n" * L, "n" * (L - 1) + "k", "k" * L}
    cands = []
    for t in sorted({1, cores}):
        for pat in sorted(pats) if t > 1 else ["n" * L]:
            for pin in (1, 0) if t > 1 else (1,):
                k = {**knobs, "threads": t, "spin_us": mlp.SPIN_US[0], "pin": pin}
                k.update(zip(mlp.split_names(layers), pat))
                cands.append(k)
    built = build_many([(mlp.source(layers, k), False) for k in cands])
    runs = []
    for k, (b, err, _) in zip(cands, built):
        if b is None:
            raise RuntimeError(err)
        x = np.ones(layers[0][0], np.float32)
        y = np.zeros(layers[-1][1], np.float32)
        runs.append((k, mlp.bind(load_lib(b), layers, k, x, ws, bs, y)))
    times = {i: [] for i in range(len(runs))}
    for _ in range(rounds):
        for i, (_, f) in enumerate(runs):
            time.sleep(0.03)  # the previous setting's workers past their spin bound
            f()
            times[i].append(time_calls(f, calls))
    out = sorted((statistics.median(times[i]), k) for i, (k, _) in enumerate(runs))
    for _, f in runs:
        f.pool.close()
    return out


def time_calls(f, n: int) -> float:
    clock = time.perf_counter
    t0 = clock()
    for _ in range(n):
        f()
    return (clock() - t0) / n


def single_calls(f, n: int) -> list[float]:
    """``n`` calls of ``f``, each timed on its own (seconds, the timer's own cost included)."""
    clock = time.perf_counter_ns
    ts = []
    for _ in range(n):
        t0 = clock()
        f()
        ts.append(clock() - t0)
    return [t * 1e-9 for t in ts]


def per_call(f, n: int) -> float:
    """The median of ``n`` single calls of ``f``."""
    return statistics.median(single_calls(f, n))


def call_overhead(plan, fast, x: np.ndarray, y: np.ndarray, calls: int, rounds: int) -> dict[str, float]:
    """Medians over ``rounds`` of single-call medians: ``plan(x)``, ``plan(x, out=y)``, the kernel alone (its native
    entry timed from C, one call at a time) and an empty call (the timer's own cost, taken off the Python ones)."""
    runs = {"plan(x)": lambda: per_call(lambda: plan(x), calls),
            "plan(x, out=y)": lambda: per_call(lambda: plan(x, out=y), calls),
            "kernel": lambda: statistics.median([fast.kernel_time(x, y, 1) for _ in range(calls)]),
            "timer": lambda: per_call(lambda: None, calls)}
    got: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for k, f in runs.items():
            time.sleep(0.03)
            got[k].append(f())
    med = {k: statistics.median(v) for k, v in got.items()}
    return {"plan(x)": med["plan(x)"] - med["timer"], "plan(x, out=y)": med["plan(x, out=y)"] - med["timer"],
            "kernel": med["kernel"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=24, help="plans measured per MLP (default 24)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    ap.add_argument("--calls", type=int, default=2000, help="calls per runner per round (default 2000)")
    ap.add_argument("--c-calls", type=int, default=10000, help="calls per round of the C main (default 10000)")
    ap.add_argument("--mlps", default=",".join(MLPS))
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (it takes a minute per model)")
    ap.add_argument("--sweep", action="store_true", help="also time the fused kernel alone at 1 and all threads x "
                                                        "three split patterns (does the search find the best?)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    target = CpuTarget()
    prof, ceil = target.profile(), target.ceilings()
    print(f"machine: {prof.cpu_model}; ISA {' '.join(prof.isa)}; {prof.physical_cores} cores; caches " +
          ", ".join(f"{n} {c.bytes // 1024} KiB x{c.instances}" for n, c in prof.caches.items()) +
          f"; profile {'quick' if prof.quick else 'full'} ({prof.measured_at}); PLANFORGE_ISA="
          f"{os.environ.get('PLANFORGE_ISA', 'native')}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    report = {}
    tmp = Path(tempfile.mkdtemp(prefix="pf-batch1-"))
    for key in args.mlps.split(","):
        widths = MLPS[key]
        g = policy_mlp(1, widths)
        t0 = time.perf_counter()
        res = tune(graph_workload(g, f"batch1-{key}"), budget=args.budget, out=tmp / key)
        plan = load(res.spec_path, graph=g)
        tuned_s = time.perf_counter() - t0
        (x,) = g.example_inputs(1)
        ref = g.evaluate(x)[0]
        rs = {"planforge plan(x)": (lambda: plan(x), None)}
        y_out = np.zeros_like(ref, dtype=np.float32)
        rs["planforge plan(x, out=y)"] = ((lambda: plan(x, out=y_out)), None)
        try:
            step, layers, _, _ = fused_step(plan.plan)
            knobs = dict(step["knobs"])
            cf, lib, main_path, _e = exported(plan, res.spec, tmp / f"{key}-c", x)
            rs["exported C via ctypes"] = (cf, None)
        except Exception as e:  # noqa: BLE001 - the plan is not one fused MLP: say so
            layers, knobs, main_path, lib = None, {}, None, None
            rs["exported C via ctypes"] = (None, f"not exported: {e}")
        rs.update(peers(g, x, not args.no_compile, tmp))
        for k, (f, _) in rs.items():
            if f:
                y = f()
                y = y[0] if isinstance(y, (list, tuple)) else y
                y = y.detach().numpy() if hasattr(y, "detach") else np.asarray(y)
                err = float(np.abs(y.reshape(ref.shape) - ref).max())
                if err > 1e-3 * (1 + float(np.abs(ref).max())):
                    print(f"  {key}/{k}: max error {err:.3g} vs the fp64 reference", file=sys.stderr)
        times: dict[str, list[float]] = {k: [] for k, (f, _) in rs.items() if f}
        singles: dict[str, list[float]] = {k: [] for k in times}  # every single call, for p50 and p99
        c_times = []
        # the loaded plan's compiled call, whose kernel_time runs its native entry alone from C (None: no lean path)
        fast = type(plan).__dict__.get("__call__")
        fast = fast if hasattr(fast, "kernel_time") else None
        k_times = []
        for _ in range(args.rounds):
            for k, (f, _) in rs.items():
                if f:
                    # every runtime's threads (OpenMP's, ONNX Runtime's, OpenVINO's, planforge's pool) spin a while
                    # after their last call: let them go idle, or the next runner shares its cores with them
                    time.sleep(0.03)
                    f()
                    one = single_calls(f, args.calls)
                    times[k].append(sum(one) / len(one))
                    singles[k].extend(one)
            if fast is not None:
                time.sleep(0.03)
                fast.kernel_time(x, y_out, 10)
                k_times.append(fast.kernel_time(x, y_out, args.calls))
            if main_path is not None:
                time.sleep(0.05)  # the Python plans' workers past their spin bound: asleep, not competing
                t, y = c_main(main_path, args.c_calls)
                c_times.append(t)
                err = float(np.abs(y.reshape(ref.shape) - ref).max())
                if err > 1e-3 * (1 + float(np.abs(ref).max())):
                    print(f"  {key}/C main: max error {err:.3g} vs the fp64 reference", file=sys.stderr)
        med = {k: statistics.median(v) for k, v in times.items()}
        timer = per_call(lambda: None, args.calls)
        pct = {k: (float(np.percentile(v, 50)) - timer, float(np.percentile(v, 99)) - timer) for k, v in singles.items()}
        if k_times:
            med["kernel alone (this process)"] = statistics.median(k_times)
        single = call_overhead(plan, fast, x, y_out, args.calls, args.rounds) if fast is not None else None
        if c_times:
            med["exported C main"] = statistics.median(c_times)
        pf = med["planforge plan(x)"]
        threads = int(knobs.get("threads", 1))
        lay = layers or tuple((k, n, "relu") for k, n in zip(widths[:-1], widths[1:]))
        lim_t, lvl_t = limit_estimate(lay, threads, ceil)
        lim_all, lvl_all = limit_estimate(lay, prof.physical_cores, ceil)
        print(f"\n{key} MLP {'-'.join(map(str, widths))}: {weight_bytes(lay) / 1e6:.2f} MB of weights; tuned in "
              f"{tuned_s:.0f} s; plan knobs {knobs or '(not one fused MLP)'}")
        print(f"  physical limit: {lim_t * 1e6:.2f} us on {threads} thread(s) (weights in {lvl_t}); "
              f"{lim_all * 1e6:.2f} us on all {prof.physical_cores} cores ({lvl_all})")
        p50 = pct["planforge plan(x)"][0]
        print(f"  {'':>26}  mean/call    ratio    | single calls: p50      ratio     p99")
        for k, (f, why) in rs.items():
            if f:
                print(f"  {k:>26}: {med[k] * 1e6:8.2f} us   {pf / med[k]:6.3f}   | {pct[k][0] * 1e6:14.2f} us  "
                      f"{p50 / pct[k][0]:6.3f}  {pct[k][1] * 1e6:8.2f} us")
            else:
                print(f"  {k:>26}: skipped: {why}")
        if "exported C main" in med:
            c = med["exported C main"]
            print(f"  {'exported C main':>26}: {c * 1e6:8.2f} us   planforge / this = {pf / c:.3f}   "
                  f"C main / limit = {c / lim_t:.2f} (target <= 1.5)")
            print(f"  plan(x) - C main (another process) = {(pf - c) * 1e6:.2f} us")
        if k_times:
            k = med["kernel alone (this process)"]
            po = med["planforge plan(x, out=y)"]
            print(f"  {'kernel alone (this process)':>26}: {k * 1e6:8.2f} us   (native entry called from C, same buffers)")
            print(f"  call overhead over the kernel's own time (target < 1 us): means of rounds: plan(x) "
                  f"+{(pf - k) * 1e6:.2f} us, plan(x, out=y) +{(po - k) * 1e6:.2f} us; medians of single calls: "
                  f"plan(x) +{(single['plan(x)'] - single['kernel']) * 1e6:.2f} us, plan(x, out=y) "
                  f"+{(single['plan(x, out=y)'] - single['kernel']) * 1e6:.2f} us (kernel {single['kernel'] * 1e6:.2f} us)")
        else:
            print("  call overhead: the loaded plan has no compiled call path (a step that is not native): not measured")
        have = [p for p in PEERS if p in med]
        if have:
            best = min(have, key=lambda p: med[p])
            print(f"  planforge / fastest peer ({best}, {med[best] * 1e6:.2f} us) = {pf / med[best]:.3f} (target <= 0.3)")
            best50 = min(have, key=lambda p: pct[p][0])
            print(f"  by single-call p50: planforge / fastest peer ({best50}, {pct[best50][0] * 1e6:.2f} us) = "
                  f"{p50 / pct[best50][0]:.3f}")
        swept = []
        if args.sweep and layers:
            _, _, ws, bs = fused_step(plan.plan)
            swept = sweep(layers, knobs, ws, bs, prof.physical_cores, args.calls, args.rounds)
            print("  kernel alone (prebound native call), by threads and split: " + "; ".join(
                f"{k['threads']}t {''.join(k[s] for s in sorted(k) if s.startswith('split'))}"
                f"{'' if k['pin'] or k['threads'] == 1 else ' unpinned'} {t * 1e6:.2f} us"
                for t, k in swept))
        report[key] = {"sweep": [(t, k) for t, k in swept], "widths": widths, "median_s": med, "knobs": knobs,
                       "single_call_s": single, "p50_p99_s": pct, "limit_s": lim_t, "limit_level": lvl_t,
                       "limit_all_cores_s": lim_all, "skipped": {k: why for k, (f, why) in rs.items() if not f}}
        if lib is not None:
            lib.plan_destroy()
        del plan
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
