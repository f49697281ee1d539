"""One measurement on the GPU, run inside an isolated worker process: build, check, time.

``run_job(job)`` is what the worker calls. It builds the inputs on the device,
runs the candidate once (Triton compiles it at that first launch), checks the
result against the fp64 reference with the problem's dtype-aware tolerance,
and times it by Triton's do_bench protocol: warm up by time, then repeat by
time within bounds, each repeat between two CUDA events, the L2 flushed
(a buffer of twice its size zeroed) before each repeat when the timing asks
for cold caches; every raw time is returned.

What can go wrong becomes an outcome category, with the message: a Triton
compile error is ``compile``; running out of shared memory or registers is
``constraints``; a CUDA error (an illegal address...) is ``runtime`` and the
job says ``poisoned``, because such an error leaves the CUDA context unusable
and the backend must start a fresh worker; a wrong result is ``correctness``.

The library baselines run through the same job: ``torch`` (eager: cuBLAS,
FlashAttention/cuDNN through SDPA, the fused norms) and ``torch.compile``
(``mode="max-autotune-no-cudagraphs"``, Inductor's own Triton autotuning).
On a machine without a GPU (the tests), ``device="cpu"`` runs the same job
through Triton's interpreter and times it with the wall clock.
"""
from __future__ import annotations

import time
import traceback
from typing import Callable

LIBRARIES = ("torch", "torch.compile")
LOG_LIMIT = 4000


def _act_torch(name: str, y):
    import torch.nn.functional as F

    if name == "none":
        return y
    return {"relu": F.relu, "gelu": lambda v: F.gelu(v, approximate="tanh"), "sigmoid": F.sigmoid,
            "silu": F.silu, "tanh": lambda v: v.tanh()}[name](y)


def library_fn(name: str, p, t: dict) -> Callable[[], object]:
    """The library formulation of problem ``p`` on tensors ``t``, as a no-argument call returning the output."""
    import torch
    import torch.nn.functional as F

    from .problem import EPS
    from ...ops.kernel import parse_chain

    if p.op == "gemm":
        epi = p.epilogue

        def f():
            y = t["A"] @ t["B"]
            if epi != "none":
                y = y + t["bias"]
                if epi != "bias":
                    y = _act_torch(epi[len("bias_"):], y)
            return y + t["R"] if p.residual else y
    elif p.op == "mlp":
        def f():
            h = t["x"][None, :]
            for i, (_, _, a) in enumerate(p.layers):
                h = _act_torch(a, torch.addmm(t[f"b{i}"], h, t[f"W{i}"]))
            return h[0]
    elif p.op == "attention":
        def f():
            return F.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=p.causal)
    elif p.op == "softmax":
        def f():
            return torch.softmax(t["x"], dim=-1)
    elif p.op == "layernorm":
        cols = p.dims[1]

        def f():
            return F.layer_norm(t["x"], (cols,), t["gamma"], t["beta"], EPS)
    elif p.op == "rmsnorm":
        cols = p.dims[1]

        def f():
            return F.rms_norm(t["x"], (cols,), t["gamma"], EPS)
    elif p.op == "eltwise":
        steps = parse_chain(p.epilogue)

        def f():
            v = t["x"]
            for s in steps:
                v = v + t["bias"] if s == "bias" else v + t["res"] if s == "add" else _act_torch(s, v)
            return v
    else:
        raise ValueError(f"no library formulation of {p.op!r}")
    if name == "torch":
        return f
    if name == "torch.compile":
        return torch.compile(f, mode="max-autotune-no-cudagraphs", dynamic=False)
    raise ValueError(f"unknown library {name!r}; known: {', '.join(LIBRARIES)}")


def _classify(e: BaseException) -> tuple[str, bool]:
    """(outcome category, whether the CUDA context is poisoned) of an exception raised by a launch."""
    name = type(e).__name__
    text = str(e)
    if name == "OutOfResources" or "out of resource" in text.lower():
        return "constraints", False
    if name in ("CompilationError", "CompileTimeAssertionFailure") or "compil" in name.lower():
        return "compile", False
    if "CUDA error" in text or "illegal" in text.lower() or name == "AcceleratorError":
        return "runtime", True
    return "runtime", False


def _time(fn, timing: dict, device: str, flush_bytes: int) -> list[float]:
    """Per-call seconds of ``fn``: CUDA events on a GPU (the L2 flushed before each repeat when
    ``flush_bytes``), the wall clock on the CPU."""
    import torch

    warm, budget = float(timing.get("warmup_s", 0.025)), float(timing.get("budget_s", 0.1))
    lo, hi = int(timing.get("min_repeats", 10)), int(timing.get("max_repeats", 200))
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        est = time.perf_counter() - t0
        out = []
        for _ in range(max(1, min(lo, int(budget / max(est, 1e-9))))):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out
    flush = torch.empty(max(flush_bytes // 4, 1), dtype=torch.int32, device=device) if flush_bytes else None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 0
    while True:
        fn()
        n += 1
        torch.cuda.synchronize()
        if time.perf_counter() - t0 >= warm and n >= 2:
            break
    est = (time.perf_counter() - t0) / n
    reps = int(min(hi, max(lo, budget / max(est, 1e-7))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        if flush is not None:
            flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)]


def run_job(job: dict) -> dict:
    """Measure one candidate or library (see the module doc). ``job``: ``problem`` (its JSON), ``impl``
    (``"triton"`` or a ``LIBRARIES`` name), ``knobs``, ``seed``, ``timing`` (a TimingConfig's JSON),
    ``device`` (``"cuda"``, or ``"cpu"`` under Triton's interpreter), ``check`` (default True).
    Returns ``{"status": "ok", "times": [...]}`` or ``{"status": category, "message", "poisoned"}``."""
    import numpy as np

    from .problem import CudaProblem, check

    p = CudaProblem.from_json(job["problem"])
    device = job.get("device", "cuda")
    try:
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            return {"status": "runtime", "message": "no CUDA device in the measuring worker", "poisoned": False}
        from .jit.run import launcher, output, tensors

        inputs = p.inputs(job.get("seed", 0))
        t = tensors(p, inputs, device)
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = p.dtype == "tf32"
            torch.backends.cudnn.allow_tf32 = p.dtype == "tf32"
    except Exception as e:  # noqa: BLE001 - the worker reports, never dies of a setup error
        return {"status": "runtime", "message": f"setup failed: {type(e).__name__}: {e}"[:LOG_LIMIT],
                "poisoned": False}
    impl = job.get("impl", "triton")
    try:
        if impl == "triton":
            out = output(p, device)
            run = launcher(p, job["knobs"], t, out)
            run()
            result = out

            def fn():
                run()
        else:
            lib = library_fn(impl, p, t)
            result = lib()

            def fn():
                lib()
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        cat, poisoned = _classify(e)
        return {"status": cat, "message": f"{type(e).__name__}: {e}"[:LOG_LIMIT], "poisoned": poisoned}
    if job.get("launch_only"):
        return {"status": "ok", "times": []}  # compiled and launched once: what a precompile asks
    if job.get("check", True):
        got = result.float().cpu().numpy() if hasattr(result, "cpu") else np.asarray(result)
        why = check(p, inputs, got)
        if why:
            return {"status": "correctness", "message": why, "poisoned": False}
    try:
        times = _time(fn, job.get("timing", {}), device, int(job.get("flush_bytes", 0)))
    except Exception as e:  # noqa: BLE001
        cat, poisoned = _classify(e)
        return {"status": cat, "message": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"[:LOG_LIMIT],
                "poisoned": poisoned}
    return {"status": "ok", "times": times}


__all__ = ["LIBRARIES", "library_fn", "run_job"]
