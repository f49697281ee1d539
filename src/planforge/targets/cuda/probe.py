"""The GPU's profile: the driver's facts plus short microbenchmarks, cached like the CPU's profile.

``probe()`` reads what the driver reports (SM count, shared memory per block
and per SM, registers, L2, clocks) through torch and Triton, then measures:
HBM bandwidth (a device-to-device copy of eight times the L2, bytes read and
written), L2 bandwidth (a copy a quarter of the L2's size, repeated hot),
peak FLOP/s per dtype (large ``torch.matmul``s: fp32 with TF32 off is the
SIMT rate, the others the tensor cores'), and the launch overhead (an empty
Triton kernel launched back to back). Quick mode shrinks the sizes and
repeats (about a second in all). The profile is cached as JSON under
``$PLANFORGE_CACHE`` (default ``~/.cache/planforge``) ``/profiles/``.
"""
from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from typing import Callable

from .devices import DTYPES, DeviceError, GpuProfile

# resident blocks per SM by compute capability (the CUDA programming guide's table); newer parts: the last
MAX_BLOCKS = {(7, 0): 32, (7, 5): 16, (8, 0): 32, (8, 6): 16, (8, 7): 16, (8, 9): 24, (9, 0): 32}


def cache_dir() -> Path:
    """``$PLANFORGE_CACHE`` or ``~/.cache/planforge``."""
    return Path(os.environ.get("PLANFORGE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "planforge"))


def no_gpu_reason() -> str | None:
    """Why there is no usable GPU here (None when there is one)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install 'planforge[gpu]' on a machine with a CUDA GPU)"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device on this machine"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed (pip install 'planforge[gpu]')"
    return None


def driver_facts(index: int = 0) -> dict:
    """What the driver reports of GPU ``index`` (needs a GPU)."""
    import torch

    pr = torch.cuda.get_device_properties(index)
    cap = (int(pr.major), int(pr.minor))
    facts = {"name": pr.name, "capability": cap, "sms": int(pr.multi_processor_count),
             "memory_bytes": int(pr.total_memory), "l2_bytes": int(getattr(pr, "L2_cache_size", 0)),
             "max_threads_per_sm": int(getattr(pr, "max_threads_per_multi_processor", 2048)),
             "regs_per_sm": int(getattr(pr, "regs_per_multiprocessor", 65536)),
             "smem_per_block": int(getattr(pr, "shared_memory_per_block_optin", 0)),
             "smem_per_sm": int(getattr(pr, "shared_memory_per_multiprocessor", 0)),
             "max_blocks_per_sm": MAX_BLOCKS.get(cap, MAX_BLOCKS[max(MAX_BLOCKS)]), "clock_hz": 0.0}
    try:  # Triton's driver utilities report the clock and the opt-in shared memory on every version we know
        import triton

        tp = triton.runtime.driver.active.utils.get_device_properties(index)
        facts["clock_hz"] = float(tp.get("sm_clock_rate", 0)) * 1e3
        facts["smem_per_block"] = facts["smem_per_block"] or int(tp.get("max_shared_mem", 0))
    except Exception:  # noqa: BLE001 - a missing fact is filled below, never fatal
        pass
    if not facts["smem_per_sm"]:
        facts["smem_per_sm"] = facts["smem_per_block"] + 1024  # the driver reserves 1 KiB per block
    return facts


def _event_time(fn, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` event-timed runs after one warm-up."""
    import torch

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e) * 1e-3)
    return sorted(out)[len(out) // 2]


def measure(quick: bool = False, progress: Callable[[str], None] | None = None, index: int = 0) -> GpuProfile:
    """Probe GPU ``index`` (see the module doc); ``DeviceError`` when there is none."""
    why = no_gpu_reason()
    if why:
        raise DeviceError(f"cannot probe a GPU: {why}")
    import torch

    from .jit.common import empty as _empty

    say = progress or (lambda m: None)
    t_start = time.perf_counter()
    f = driver_facts(index)
    dev = f"cuda:{index}"
    reps = 5 if quick else 20
    say("HBM bandwidth")
    n = max(8 * f["l2_bytes"], 256 << 20) // 4 if not quick else max(4 * f["l2_bytes"], 64 << 20) // 4
    a = torch.empty(n, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    hbm = 2 * 4 * n / _event_time(lambda: b.copy_(a), reps)
    del a, b
    say("L2 bandwidth")
    m = max(f["l2_bytes"] // 4 // 4, 1 << 16)
    a = torch.empty(m, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    inner = 20

    def l2_copy():
        for _ in range(inner):
            b.copy_(a)
    l2 = 2 * 4 * m * inner / _event_time(l2_copy, reps)
    del a, b
    flops = {}
    size = 2048 if quick else 8192
    for dt in DTYPES:
        say(f"peak {dt}")
        tdt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dt]
        torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
        s = size // 2 if dt == "fp32" else size  # the SIMT rate is a tenth of the tensor cores': keep it short
        x = torch.randn(s, s, device=dev, dtype=tdt)
        y = torch.randn(s, s, device=dev, dtype=tdt)
        flops[dt] = 2.0 * s**3 / _event_time(lambda: x @ y, max(3, reps // 2))
        del x, y
    torch.backends.cuda.matmul.allow_tf32 = False
    say("launch overhead")

    z = torch.empty(1, device=dev)
    _empty[(1,)](z, 1)
    torch.cuda.synchronize()
    k = 200 if quick else 2000
    t0 = time.perf_counter()
    for _ in range(k):
        _empty[(1,)](z, 1)
    torch.cuda.synchronize()
    launch = (time.perf_counter() - t0) / k
    notes = []
    if not f["clock_hz"]:
        notes.append("the driver reported no SM clock: the shared-memory bandwidth assumes 1.5 GHz")
        f["clock_hz"] = 1.5e9
    return GpuProfile(f["name"], tuple(f["capability"]), f["sms"], f["clock_hz"], f["smem_per_block"],
                      f["smem_per_sm"], f["regs_per_sm"], f["max_threads_per_sm"], f["max_blocks_per_sm"],
                      f["l2_bytes"], f["memory_bytes"], hbm, l2, flops, launch, source="measured",
                      measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      quick=quick, notes=tuple(notes + [f"probe took {time.perf_counter() - t_start:.1f} s"]))


def profile_path(fingerprint: str) -> Path:
    return cache_dir() / "profiles" / f"{fingerprint}.json"


def get_profile(force: bool = False, quick: bool = False, progress: Callable[[str], None] | None = None,
                index: int = 0) -> GpuProfile:
    """GPU ``index``'s profile: cached (a quick one only when ``quick``), or measured and cached."""
    why = no_gpu_reason()
    if why:
        raise DeviceError(f"no GPU to profile: {why}")
    f = driver_facts(index)
    fp = GpuProfile(f["name"], tuple(f["capability"]), f["sms"], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, {}, 0).fingerprint
    path = profile_path(fp)
    if not force and path.exists():
        try:
            cached = GpuProfile.from_dict(json.loads(path.read_text()))
            if cached.fingerprint == fp and (quick or not cached.quick):
                return cached
        except (ValueError, KeyError, TypeError):
            pass  # corrupt or from another version: measured again below
    prof = measure(quick, progress, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.to_json())
    return prof


__all__ = ["cache_dir", "driver_facts", "get_profile", "measure", "no_gpu_reason"]
