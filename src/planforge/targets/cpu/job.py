"""What a measurement worker does with one candidate: bind, validate, time.

Runs inside an isolated worker process (see ``planforge.measure.worker``).
The output buffer sits between two guard regions filled with a sentinel; a
kernel that writes past its output is caught there even when it does not
crash.
"""
from __future__ import annotations

import ctypes
import importlib
import os
from typing import Any

import numpy as np

from ...measure.timing import TimingConfig, timed
from .scrub import scrubber
from .templates.parfor import open_library
from .templates.problem import LIBRARIES, Problem, check, make_inputs, output_shape, reference, tolerance

GUARD = 4096  # floats on each side of the output
SENTINEL = np.float32(-1.2345e30)
_prepared: dict[tuple[str, int], tuple[dict, np.ndarray, np.ndarray]] = {}
_libs: dict[str, ctypes.CDLL] = {}
_checked: dict[tuple[str, int, str], tuple[np.ndarray, np.ndarray]] = {}


def prepared(p: Problem, seed: int):
    """Inputs, fp64 reference and tolerance for a problem (cached in this worker)."""
    key = (p.key, seed)
    if key not in _prepared:
        if len(_prepared) > 8:
            _prepared.clear()
        inputs = make_inputs(p, seed)
        _prepared[key] = (inputs, reference(p, inputs), tolerance(p, inputs))
    return _prepared[key]


def checked_against(p: Problem, seed: int, tmpl, knobs: dict, inputs: dict, ref, tol):
    """The reference and tolerance a kernel candidate is checked against: of the inputs it really computes
    with (a quantised candidate's dequantised weights: its accuracy is the finalist walk's to judge), cached."""
    eff = tmpl.reference_inputs(p, knobs, inputs) if tmpl.reference_inputs is not None else None
    if eff is None:
        return ref, tol
    key = (p.key, seed, eff[0])
    if key not in _checked:
        if len(_checked) >= 4:  # a few variants of a few problems (each holds its own weights)
            _checked.clear()
        real = eff[1]()
        _checked[key] = (reference(p, real), tolerance(p, real))
    return _checked[key]


def guarded_output(shape) -> tuple[np.ndarray, np.ndarray]:
    n = int(np.prod(shape))
    raw = np.full(n + 2 * GUARD, SENTINEL, dtype=np.float32)
    return raw, raw[GUARD: GUARD + n].reshape(shape)


def guards_intact(raw: np.ndarray) -> bool:
    return bool(np.all(raw[:GUARD] == SENTINEL) and np.all(raw[-GUARD:] == SENTINEL))


def template(ref: str):
    module, name = ref.split(":")
    return importlib.import_module(module).TEMPLATES[name]


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Measure one implementation. ``job``: problem, seed, impl (``kernel`` or a
    library name), for kernels lib (path), template (``module:name``) and
    knobs; timing (TimingConfig fields); const (a GEMM's B is a plan's constant:
    bound as a plan binds it, packed once when the kernel is bound)."""
    p = Problem.from_json(job["problem"])
    inputs, ref, tol = prepared(p, job.get("seed", 0))
    raw, out = guarded_output(output_shape(p))
    if job["impl"] == "kernel":
        lib = _libs.get(job["lib"])
        if lib is None:
            lib = _libs[job["lib"]] = open_library(job["lib"])
        tmpl = template(job["template"])
        ref, tol = checked_against(p, job.get("seed", 0), tmpl, job["knobs"], inputs, ref, tol)
        fn = tmpl.bind(lib, p, job["knobs"], {**inputs, "B_const": True} if job.get("const") and p.op == "gemm"
                       else inputs, out)
    else:
        fn = LIBRARIES[job["impl"]](p, inputs, out)
    fn()
    if not guards_intact(raw):
        return {"status": "runtime", "message": "out-of-bounds write: the kernel wrote outside its output buffer"}
    reason = check(p, inputs, out, ref, tol)
    if reason:
        return {"status": "correctness", "message": reason}
    cfg = TimingConfig(**job.get("timing", {}))
    flush = None
    if cfg.flush_bytes:  # cold caches: rewrite a buffer bigger than the caches before each sample
        junk = np.zeros(cfg.flush_bytes // 4, np.float32)
        flush = lambda: np.add(junk, 1.0, out=junk)  # noqa: E731
    elif cfg.scrub_bytes:  # weights cold, the activation (the first input, by every op's convention) hot
        flush = scrubber(cfg.scrub_bytes, len(os.sched_getaffinity(0)), list(inputs.values())[:1])

    got = timed(fn, cfg, flush)  # times, and the other processes' share of this worker's CPUs meanwhile
    if not guards_intact(raw):
        return {"status": "runtime", "message": "out-of-bounds write during timing"}
    reason = check(p, inputs, out, ref, tol)  # results must stay right on repeated calls
    if reason:
        return {"status": "correctness", "message": "after repeated calls: " + reason}
    return {"status": "ok", **got}
