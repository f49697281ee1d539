"""Export a tuned plan as a self-contained C library: no Python and no planforge at run time.

``planforge export SPEC --format c -o DIR`` writes into DIR:

- ``plan.h``: ``plan_create()``, ``plan_run(const float *in, float *out)``,
  ``plan_destroy()`` and the sizes (``PLAN_IN_SIZE``, ``PLAN_OUT_SIZE``);
- ``plan.c``: the tuned kernel's C (the same source the Python plan runs, its
  persistent thread pool included) with the weights embedded as exact
  hexadecimal float constants;
- ``libplan.so`` and ``libplan.a``, built with the system compiler and the
  flags the plan was tuned with (``-march=native``; ``PLANFORGE_ISA``'s view);
- ``main.c`` and ``plan_main`` (linked against the archive): loads the plan,
  runs it and times it (``plan_main -n CALLS -r ROUNDS [-i IN.bin] [-o OUT.bin]``:
  raw little-endian fp32 input and output), printing the median per call;
- ``Makefile``: rebuilds all of it (``make``).

The export covers plans whose work is one fused MLP (every batch-1 MLP of the
zoo and of imported models tunes to one); any other plan is refused with the
steps it has, since their C would need a runtime of its own.
"""
from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..targets.cpu.build import BASE_FLAGS, compiler, isa_flags
from ..targets.cpu.plan import Plan
from ..targets.cpu.templates import mlp

_RUNTIME = ("lib1", "lib2", "lib3", "tmpl1", "tmpl2", "tmpl3", "fused_mlp")


class CExportError(ValueError):
    """A plan that cannot be exported as C, or a compiler that refused it (the message says which)."""


@dataclass
class CExport:
    """What ``export_c`` wrote: the folder, the files in it, and the plan's shape."""

    folder: Path
    files: list[Path]
    layers: tuple[tuple[int, int, str], ...]
    knobs: dict[str, Any]
    in_size: int
    out_size: int
    commands: list[str] = field(default_factory=list)


def fused_step(plan: Plan) -> tuple[dict, tuple[tuple[int, int, str], ...], list[np.ndarray], list[np.ndarray]]:
    """The one fused MLP step of ``plan`` with its layers and (folded) weights and biases; ``CExportError``
    when the plan computes anything else at run time."""
    if not isinstance(plan, Plan):
        raise CExportError(f"only a compiled CPU plan can be exported as C, not a {type(plan).__name__} (a spec "
                           "that fell back to the numpy baseline, or a partitioned model, has no single kernel)")
    if len(plan.graph.inputs) != 1 or len(plan.output_classes) != 1:
        raise CExportError(f"the C export takes plans of one input and one output; this one has "
                           f"{len(plan.graph.inputs)} and {len(plan.output_classes)}")
    steps = [s for s in plan.program if s["op"] in _RUNTIME and s["cls"] not in plan.constants]
    fused = [s for s in steps if s["op"] == "fused_mlp"]
    other = [s for s in steps if s["op"] != "fused_mlp" and not (s["op"] == "lib1" and s["args"][0] == "reshape")]
    if len(fused) != 1 or other:
        kinds = ", ".join(f"{s['op']}:{s['args'][0]}" if s["args"] else s["op"] for s in steps) or "none"
        raise CExportError(f"the C export covers plans whose work is one fused MLP; this plan runs {kinds}")
    s = fused[0]
    problem = s["problem"]
    layers = tuple((int(k), int(n), str(a)) for k, n, a in problem["layers"])
    by_cls = {x["cls"]: x for x in plan.program}
    cells = Plan._layer_cells(s["inputs"][1], by_cls)
    ws = [np.ascontiguousarray(plan.constants[w], dtype=np.float32) for w, _ in cells]
    bs = [np.ascontiguousarray(plan.constants[b], dtype=np.float32).reshape(-1) for _, b in cells]
    return s, layers, ws, bs


def _floats(name: str, a: np.ndarray) -> str:
    """A C array of ``a``'s values, exact (hexadecimal float literals), eight per line."""
    vals = [float(v).hex() + "f" for v in a.reshape(-1).astype(np.float64)]
    rows = [", ".join(vals[i:i + 8]) for i in range(0, len(vals), 8)]
    return f"static const float {name}[{len(vals)}] __attribute__((aligned(64))) = {{\n    " + \
        ",\n    ".join(rows) + "\n};\n"


def _ints(name: str, ctype: str, a: np.ndarray) -> str:
    """A C array of ``a``'s integer values (quantised weights: bf16 bits, int8 or int4 values), sixteen per line."""
    vals = [str(int(v)) for v in a.reshape(-1)]
    rows = [", ".join(vals[i:i + 16]) for i in range(0, len(vals), 16)]
    return f"static const {ctype} {name}[{len(vals)}] __attribute__((aligned(64))) = {{\n    " + \
        ",\n    ".join(rows) + "\n};\n"


def _weights(i: int, w: np.ndarray, fmt: str, qblock: int) -> tuple[str, bool]:
    """Layer ``i``'s weights in its format as C arrays ``W<i>`` (and ``S<i>``, its scales), and whether it has
    scales: the values the Python plan's threads pack, quantised here exactly as ``planforge.quant`` does."""
    if fmt == "fp32":
        return _floats(f"W{i}", w), False
    from ..quant.pack import quantised

    qw = quantised(w, fmt, qblock if fmt == "int4" else None)
    text = _ints(f"W{i}", "uint16_t" if fmt == "bf16" else "int8_t", qw.q)
    if qw.scales is None:
        return text, False
    return text + _floats(f"S{i}", np.ascontiguousarray(qw.scales, np.float32)), True


_HEADER = """/* {title}
   Generated by planforge export; no Python or planforge is needed to use it.
   One plan per process: plan_create() starts its threads and packs its weights,
   plan_run() computes out = plan(in) (in and out must not overlap), plan_destroy()
   stops the threads and frees everything. Not thread-safe: call from one thread. */
#ifndef PLANFORGE_PLAN_H
#define PLANFORGE_PLAN_H
#ifdef __cplusplus
extern "C" {{
#endif

#define PLAN_IN_SIZE {n_in}    /* floats in  (input shape {in_shape}) */
#define PLAN_OUT_SIZE {n_out}  /* floats out (output shape {out_shape}) */
#define PLAN_THREADS {threads}

int plan_create(void);                            /* 0 when ready, -1 when threads or memory failed */
int plan_run(const float *in, float *out);        /* 0, or -1 before plan_create */
void plan_destroy(void);
const char *plan_info(void);                      /* what was tuned, where, with which knobs */

#ifdef __cplusplus
}}
#endif
#endif
"""

_API = """
#include "plan.h"

static void *plan_handle;

int plan_create(void) {{
    if (plan_handle) return 0;
    static const void *const W[NL] = {{ {ws} }};
    static const float *const S[NL] = {{ {ss} }};
    static const float *const B[NL] = {{ {bs} }};
    plan_handle = pf_mlp_create_q(W, S, B);
    return plan_handle ? 0 : -1;
}}

int plan_run(const float *in, float *out) {{
    if (!plan_handle) return -1;
    pf_mlp_run(plan_handle, in, out);
    return 0;
}}

void plan_destroy(void) {{
    pf_mlp_destroy(plan_handle);
    plan_handle = 0;
}}

const char *plan_info(void) {{ return {info}; }}
"""

_MAIN = r"""/* Load the exported plan, run it and time it: plan_main [-n CALLS] [-r ROUNDS] [-i IN.bin] [-o OUT.bin] */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include "plan.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    long calls = 10000;
    int rounds = 7;
    const char *in_path = NULL, *out_path = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-n")) calls = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "-r")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-i")) in_path = argv[i + 1];
        else if (!strcmp(argv[i], "-o")) out_path = argv[i + 1];
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    if (calls < 1 || rounds < 1) { fprintf(stderr, "-n and -r must be positive\n"); return 2; }
    static float in[PLAN_IN_SIZE], out[PLAN_OUT_SIZE];
    if (in_path) {
        FILE *f = fopen(in_path, "rb");
        if (!f || fread(in, sizeof(float), PLAN_IN_SIZE, f) != PLAN_IN_SIZE) {
            fprintf(stderr, "cannot read %d floats from %s\n", PLAN_IN_SIZE, in_path);
            return 1;
        }
        fclose(f);
    } else {
        for (int i = 0; i < PLAN_IN_SIZE; i++) in[i] = sinf(0.37f * i);
    }
    if (plan_create() != 0) { fprintf(stderr, "plan_create failed\n"); return 1; }
    for (long c = 0; c < calls / 10 + 100; c++) plan_run(in, out);  /* warm: threads spinning, weights in cache */
    double *per = malloc(sizeof(double) * rounds);
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        for (long c = 0; c < calls; c++) plan_run(in, out);
        per[r] = (now() - t0) / calls;
    }
    qsort(per, rounds, sizeof(double), cmp);
    printf("%s\n", plan_info());
    printf("median_ns_per_call %.1f\nmin_ns_per_call %.1f\nmax_ns_per_call %.1f\ncalls %ld rounds %d\n",
           per[rounds / 2] * 1e9, per[0] * 1e9, per[rounds - 1] * 1e9, calls, rounds);
    printf("out[0..%d]:", PLAN_OUT_SIZE < 4 ? PLAN_OUT_SIZE : 4);
    for (int i = 0; i < PLAN_OUT_SIZE && i < 4; i++) printf(" %g", out[i]);
    printf("\n");
    if (out_path) {
        FILE *f = fopen(out_path, "wb");
        if (!f || fwrite(out, sizeof(float), PLAN_OUT_SIZE, f) != PLAN_OUT_SIZE) {
            fprintf(stderr, "cannot write %s\n", out_path);
            return 1;
        }
        fclose(f);
    }
    plan_destroy();
    free(per);
    return 0;
}
"""


def _c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def export_c(plan: Plan, out: str | Path, spec: dict[str, Any] | None = None, cc: str | None = None,
             isa: str | None = None, build: bool = True, timeout: float = 600.0) -> CExport:
    """Write ``plan`` (a compiled CPU ``Plan`` whose work is one fused MLP) to folder ``out`` as a C library.

    Parameters:
        spec: the spec the plan came from (its workload, device and knobs go into ``plan_info()``); default None.
        cc: the compiler (default ``$CC``, else ``cc``).
        isa: the ISA view to compile for (default ``$PLANFORGE_ISA``, else native; see ``build.isa_choice``).
        build: also build ``libplan.so``, ``libplan.a`` and ``plan_main`` (default True); False writes the sources
            and the Makefile only.
        timeout: seconds each compiler run may take (default 600).
    """
    step, layers, ws, bs = fused_step(plan)
    knobs = dict(step["knobs"] or {})
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (in_name, in_shape), = plan.graph.inputs.items()
    out_shape = tuple(next(x["shape"] for x in plan.program if x["cls"] == plan.output_classes[0]))
    n_in, n_out = int(np.prod(in_shape)), int(np.prod(out_shape))
    if n_in != layers[0][0] or n_out != layers[-1][1]:
        raise CExportError(f"the plan's input ({n_in} floats) and output ({n_out}) are not its fused MLP's "
                           f"({layers[0][0]} in, {layers[-1][1]} out)")
    workload = (spec or {}).get("manifest", {}).get("workload", plan.graph.name)
    device = (spec or {}).get("target", {}).get("fingerprint", "unknown device")
    title = f"planforge plan for {workload}: {' -> '.join([str(layers[0][0])] + [f'{n} {a}' for _, n, a in layers])}"
    info = f"{title}; tuned on {device}; knobs " + ", ".join(f"{k}={v}" for k, v in sorted(knobs.items()))
    header = _HEADER.format(title=title, n_in=n_in, n_out=n_out, in_shape=list(in_shape), out_shape=list(out_shape),
                            threads=int(knobs.get("threads", 1)))
    body = ["/* generated by planforge export; see plan.h */", "#define PF_API static",
            mlp.source(layers, knobs), "/* the tuned weights, [K][N] row-major per layer, in each layer's format "
            "(fp32; bf16 bits; int8 or int4 values, with their scales S), and the biases */"]
    fmts, qb = mlp.formats_of(layers, knobs), int(knobs.get("qblock", 32))
    scaled = []
    for i, (w, b, f) in enumerate(zip(ws, bs, fmts)):
        text, has = _weights(i, w, f, qb)
        body.append(text + _floats(f"B{i}", b))
        scaled.append(has)
    body.append(_API.format(ws=", ".join(f"W{i}" for i in range(len(ws))),
                            ss=", ".join(f"S{i}" if h else "NULL" for i, h in enumerate(scaled)),
                            bs=", ".join(f"B{i}" for i in range(len(bs))), info=_c_string(info)))
    files = {"plan.h": header, "plan.c": "\n".join(body), "main.c": _MAIN}
    path, _ = compiler(cc)
    flags = [f for f in BASE_FLAGS if f not in ("-shared", "-fPIC")] + list(isa_flags(isa, cc))
    opt = " ".join(shlex.quote(f) for f in flags)
    files["Makefile"] = (f"# rebuild the exported plan (the flags it was tuned with)\nCC ?= {shlex.quote(path)}\n"
                         f"CFLAGS = {opt} -fPIC -pthread\n\nall: libplan.so libplan.a plan_main\n\n"
                         "plan.o: plan.c plan.h\n\t$(CC) $(CFLAGS) -c plan.c -o plan.o\n\n"
                         "libplan.so: plan.o\n\t$(CC) $(CFLAGS) -shared plan.o -o libplan.so -lm\n\n"
                         "libplan.a: plan.o\n\tar rcs libplan.a plan.o\n\n"
                         "plan_main: main.c libplan.a plan.h\n\t$(CC) $(CFLAGS) main.c libplan.a -o plan_main -lm\n\n"
                         "clean:\n\trm -f plan.o libplan.so libplan.a plan_main\n")
    written = []
    for name, text in files.items():
        p = folder / name
        p.write_text(text)
        written.append(p)
    res = CExport(folder, written, layers, knobs, n_in, n_out)
    if build:
        cmds = [[path, *flags, "-fPIC", "-pthread", "-c", "plan.c", "-o", "plan.o"],
                [path, *flags, "-fPIC", "-pthread", "-shared", "plan.o", "-o", "libplan.so", "-lm"],
                ["ar", "rcs", "libplan.a", "plan.o"],
                [path, *flags, "-pthread", "main.c", "libplan.a", "-o", "plan_main", "-lm"]]
        for cmd in cmds:
            res.commands.append(" ".join(shlex.quote(c) for c in cmd))
            try:
                p = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=timeout)
            except FileNotFoundError as e:
                raise CExportError(f"cannot run {cmd[0]}: {e}") from None
            except subprocess.TimeoutExpired:
                raise CExportError(f"{cmd[0]} took more than {timeout:g} s on {folder}") from None
            if p.returncode != 0:
                log = (p.stderr or p.stdout).strip()
                raise CExportError(f"{' '.join(cmd[:1] + cmd[-3:])} failed in {folder}:\n{log[-2000:]}")
        res.files += [folder / n for n in ("libplan.so", "libplan.a", "plan_main")]
    return res


__all__ = ["CExport", "CExportError", "export_c", "fused_step"]
