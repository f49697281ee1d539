"""The cost of starting a team of threads (an OpenMP fork and join), measured.

The device profile measures one call into a compiled kernel; a kernel that
opens a parallel region pays a fork and a join on top of it. This measures
that with a compiled empty parallel region (best of several repeats, like the
probe), once per machine and thread count, cached beside the device profiles
as ``cache_dir()/costmodel/launch-<fingerprint>.json``.
"""
from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

from .build import BuildError, CompilerMissing, build, cache_dir, load

_SOURCE = r"""
#include <omp.h>
volatile int pf_sink;
/* seconds per empty parallel region of ``threads`` threads, averaged over ``reps`` */
double pf_forkjoin(int threads, long reps) {
    #pragma omp parallel num_threads(threads)
    { if (omp_get_thread_num() == 0) pf_sink = 0; }   /* the team exists before timing */
    double t0 = omp_get_wtime();
    for (long i = 0; i < reps; i++) {
        #pragma omp parallel num_threads(threads)
        { if (omp_get_thread_num() == 0) pf_sink = (int)i; }
    }
    return (omp_get_wtime() - t0) / (double)reps;
}
"""
_memo: dict[tuple[str, int], float] = {}


def _path(fingerprint: str) -> Path:
    return cache_dir() / "costmodel" / f"launch-{fingerprint}.json"


def measure_launch(threads: int, quick: bool = False) -> float:
    """Seconds of one fork and join of ``threads`` threads (0 for one thread or without OpenMP)."""
    if threads <= 1:
        return 0.0
    try:
        lib = load(build(_SOURCE, openmp=True))
    except (BuildError, CompilerMissing):
        return 0.0
    f = lib.pf_forkjoin
    f.argtypes, f.restype = [ctypes.c_int, ctypes.c_long], ctypes.c_double
    reps, rounds = (200, 3) if quick else (2000, 7)
    return max(0.0, min(f(threads, reps) for _ in range(rounds)))


def launch_overhead(fingerprint: str, threads: int, quick: bool = False) -> float:
    """The fork-join cost for ``threads`` threads on the machine ``fingerprint`` (this one),
    measured once and cached per machine; ``quick`` (default False) measures with fewer repeats."""
    if threads <= 1:
        return 0.0
    key = (fingerprint, threads)
    if key in _memo:
        return _memo[key]
    path = _path(fingerprint)
    table: dict[str, float] = {}
    try:
        table = {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        table = {}
    if str(threads) not in table:
        table[str(threads)] = measure_launch(threads, quick=quick)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(table, sort_keys=True))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache only costs a measurement next time
    _memo[key] = table[str(threads)]
    return _memo[key]
