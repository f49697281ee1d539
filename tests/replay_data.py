"""Small recorded spaces, made in the tests, in the Kernel Tuner cache, T4 and T1 formats.

The space: bx in (16, 32, 64, 128), ty in (1, 2, 3), mode in ("a", "b"), with
the restriction bx * ty <= 256, so (128, 3, *) is absent (excluded). Each
measured configuration has raw times (ms) [0.9 t, t, 1.2 t], so its median is
exactly t; (16, 3, "b") failed at run time and (32, 1, "a") failed to compile.
The optimum is (64, 2, "a") at 1 ms; (128, 2, "a") is within 5% of it.
"""
from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

BX, TY, MODE = (16, 32, 64, 128), (1, 2, 3), ("a", "b")
FAILED = {(16, 3, "b"): "runtime", (32, 1, "a"): "compile"}
KT_ERROR = {"runtime": "RuntimeFailedConfig", "compile": "CompilationFailedConfig"}


def allowed(bx: int, ty: int, mode: str) -> bool:
    return bx * ty <= 256


def time_ms(bx: int, ty: int, mode: str) -> float:
    """Known times: a bowl around (64, 2, 'a')."""
    t = 1.0 + 0.25 * abs({16: -2, 32: -1, 64: 0, 128: 1}[bx]) ** 2 + 0.5 * abs(ty - 2) + (0.0 if mode == "a" else 0.3)
    if (bx, ty, mode) == (128, 2, "a"):
        t = 1.04  # within 5% of the optimum
    return t


def configs() -> list[tuple]:
    return [c for c in itertools.product(BX, TY, MODE) if allowed(*c)]


def measured() -> dict[tuple, float]:
    return {c: time_ms(*c) for c in configs() if c not in FAILED}


def kt_cache(unclosed: bool = False) -> str:
    cache = {}
    for c in configs():
        key = ",".join(map(str, c))
        rec = dict(zip(("bx", "ty", "mode"), c))
        if c in FAILED:
            rec.update(time=KT_ERROR[FAILED[c]], times=[])
        else:
            t = time_ms(*c)
            rec.update(time=(0.9 * t + t + 1.2 * t) / 3, times=[0.9 * t, t, 1.2 * t])
        rec.update(compile_time=1.0, verification_time=0, benchmark_time=3.0, strategy_time=0, framework_time=0.1,
                   timestamp="2024-01-01 00:00:00+00:00")
        cache[key] = rec
    doc = {"device_name": "Synthetic GPU", "kernel_name": "synth", "problem_size": [64, 64],
           "tune_params_keys": ["bx", "ty", "mode"], "tune_params": {"bx": list(BX), "ty": list(TY), "mode": list(MODE)},
           "objective": "time", "cache": cache}
    text = json.dumps(doc)
    if unclosed:  # as Kernel Tuner leaves a cache when a run is cut off
        text = text[: -len("}}")] + ","
    return text


def t4(extra: list[dict] | None = None) -> str:
    results = []
    for c in configs():
        conf = dict(zip(("bx", "ty", "mode"), c))
        if c in FAILED:
            results.append({"configuration": conf, "times": {"compilation": 1.0}, "invalidity": FAILED[c],
                            "correctness": 0, "measurements": [{"name": "time", "value": KT_ERROR[FAILED[c]],
                                                                "unit": ""}]})
        else:
            t = time_ms(*c)
            results.append({"configuration": conf, "times": {"compilation": 1.0, "runtimes": [0.9 * t, t, 1.2 * t]},
                            "invalidity": "correct", "correctness": 1,
                            "measurements": [{"name": "time", "value": t, "unit": "ms"}]})
    results.extend(extra or [])
    return json.dumps({"schema_version": "1.0.0", "metadata": {"timeunit": "miliseconds"}, "results": results})


def t1() -> str:
    return json.dumps({
        "General": {"BenchmarkName": "synth", "OutputFormat": "JSON"},
        "ConfigurationSpace": {
            "TuningParameters": [
                {"Name": "bx", "Type": "int", "Values": "[16 * 2 ** i for i in range(4)]", "Default": 16},
                {"Name": "ty", "Type": "int", "Values": "[1, 2] + [3]", "Default": 1},
                {"Name": "mode", "Type": "string", "Values": ["a", "b"], "Default": "a"},
            ],
            "Conditions": [{"Expression": "bx * ty <= 256", "Parameters": ["bx", "ty"]}],
        },
    })


def write(path: Path, text: str, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def hub(root: Path) -> dict[str, Path]:
    """A benchmark-hub layout: cachefiles/synth/{kt.json.gz, t4.json} and kernels/synth.json."""
    return {
        "kt": write(root / "cachefiles" / "synth" / "kt.json.gz", kt_cache(), gz=True),
        "t4": write(root / "cachefiles" / "synth" / "t4.json", t4()),
        "t1": write(root / "kernels" / "synth.json", t1()),
    }
