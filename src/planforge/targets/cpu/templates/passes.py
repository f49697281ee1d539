"""Small library steps as compiled passes: the global mean, the broadcast multiply and the axis permutation.

A MobileNetV3-small chain at 96x96 had 20 of these as numpy steps (the input's NCHW -> NHWC transpose, nine
squeeze-excitation blocks' global mean and channel multiply, the head's transpose): each a few microseconds of
numpy dispatch on a few hundred to a few thousand floats, and each a step that is not native, so that the chain's
runs of compiled steps (``fastcall.runs``) broke at every one of them and went back through Python. Here each is
one pass of C with its geometry as the call's arguments (one source, built once per machine), bound once as a
``struct_call`` whose ``native`` entry a compiled chain calls directly:

- ``mean``: the mean over the middle axis of ``[N, R, C]`` (NHWC's global average pool: R = H W), summed in
  ``C``-wide rows (vectorised over the channels), or over the last axis of ``[N C, R]`` (NCHW's);
- ``mul``: ``x * s`` where ``s`` broadcasts to ``x`` as ``[A or 1, 1, B]`` over ``x`` seen as ``[A, R, B]`` (a
  channel scale in NHWC: ``[N, H W, C] * [N, 1, C]``; in NCHW: ``[N C, H W] * [N C, 1]``), or both the same
  shape; the product is exact, so either operand order is the same;
- ``permute``: any permutation of up to four axes as four nested loops whose innermost walks the input
  contiguously when the output's last axis is short (NCHW -> NHWC of a 3-channel image: three strided streams of
  stores, not a copy whose inner loop is three floats long), else the output.

A pass of at least ``PAR_WORK`` floats per extra thread splits its outer loop over up to every CPU the process may
use, on the process's shared pool (``parfor``). ``bind_*`` return None where the arrays are not fp32 and
C-contiguous, the shapes do not fit the pass, or no compiler is here: the caller keeps its numpy step.
"""
from __future__ import annotations

import ctypes
import math
import os
from typing import Callable, Sequence

import numpy as np

from .common import struct_call
from .parfor import PARFOR_C, built_library

PAR_WORK = 1 << 16  # floats per thread below which a pass stays on fewer threads
MEAN_BLOCK = 64  # channels per block of the NHWC mean (the unit its parallel loop splits)
SHORT = 16  # an output whose last axis is shorter than this is written in the input's order (``permute``),
INTERLEAVE = 4  # unless it is this short and interleaves rows the input holds whole (unrolled: 2 us, not 8)


class MeanArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("y", ctypes.c_void_p)] + \
        [(n, ctypes.c_int) for n in ("N", "R", "C", "planes", "threads")] + [("inv", ctypes.c_float)]


class MulArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("s", ctypes.c_void_p), ("y", ctypes.c_void_p)] + \
        [(n, ctypes.c_int) for n in ("A", "R", "B", "sa", "threads")]


class GatherArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("idx", ctypes.c_void_p), ("y", ctypes.c_void_p),
                ("outer", ctypes.c_long), ("n", ctypes.c_long), ("count", ctypes.c_long), ("inner", ctypes.c_long),
                ("bad", ctypes.c_long), ("first", ctypes.c_double)]


class PermArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("n", ctypes.c_long * 4),
                ("ys", ctypes.c_long * 4), ("xs", ctypes.c_long * 4), ("threads", ctypes.c_int)]


SOURCE = PARFOR_C + r"""
#include <string.h>
typedef struct { const float *x; float *y; int N, R, C, planes, threads; float inv; } mean_args;
typedef struct { const float *x; const float *s; float *y; int A, R, B, sa, threads; } mul_args;
typedef struct { const float *x; float *y; long n[4], ys[4], xs[4]; int threads; } perm_args;

#define CB @MEAN_BLOCK@  /* channels per block of the NHWC mean: one row of sums held while the rows stream by */

static void mean_rows(const void *ctx, int lo, int hi) {  /* blocks [lo, hi) of N x ceil(C / CB) */
    const mean_args *a = (const mean_args *)ctx;
    const int R = a->R, C = a->C, nb = (C + CB - 1) / CB;
    for (int i = lo; i < hi; i++) {
        const int n = i / nb, c0 = (i % nb) * CB, c1 = c0 + CB < C ? c0 + CB : C;
        const float *x = a->x + (long)n * R * C;
        float acc[CB];
        for (int c = c0; c < c1; c++) acc[c - c0] = 0.0f;
        for (int r = 0; r < R; r++) {
            const float *row = x + (long)r * C;
            for (int c = c0; c < c1; c++) acc[c - c0] += row[c];
        }
        for (int c = c0; c < c1; c++) a->y[(long)n * C + c] = acc[c - c0] * a->inv;
    }
}

static void mean_planes(const void *ctx, int lo, int hi) {  /* planes [lo, hi) of N C, each R floats */
    const mean_args *a = (const mean_args *)ctx;
    const int R = a->R;
    for (int i = lo; i < hi; i++) {
        const float *x = a->x + (long)i * R;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  /* eight partial sums: a vector's worth, then folded */
        int r = 0;
        for (; r + 8 <= R; r += 8)
            for (int k = 0; k < 8; k++) acc[k] += x[r + k];
        float t = 0.0f;
        for (; r < R; r++) t += x[r];
        for (int k = 0; k < 8; k++) t += acc[k];
        a->y[i] = t * a->inv;
    }
}

void pf_mean(const mean_args *a) {
    if (a->planes) pf_parfor(a->N * a->C, a->threads, mean_planes, a);
    else pf_parfor(a->N * ((a->C + CB - 1) / CB), a->threads, mean_rows, a);
}

static void mul_rows(const void *ctx, int lo, int hi) {  /* rows [lo, hi) of A x R, each B floats */
    const mul_args *a = (const mul_args *)ctx;
    const int R = a->R, B = a->B;
    for (int i = lo; i < hi; i++) {
        const float *s = a->s + (long)(a->sa ? i / R : 0) * B;
        const float *x = a->x + (long)i * B;
        float *y = a->y + (long)i * B;
        for (int b = 0; b < B; b++) y[b] = x[b] * s[b];
    }
}

static void mul_scalars(const void *ctx, int lo, int hi) {  /* B == 1: rows [lo, hi) of A, each R floats */
    const mul_args *a = (const mul_args *)ctx;
    const int R = a->R;
    for (int i = lo; i < hi; i++) {
        const float s = a->s[a->sa ? i : 0];
        const float *x = a->x + (long)i * R;
        float *y = a->y + (long)i * R;
        for (int r = 0; r < R; r++) y[r] = x[r] * s;
    }
}

void pf_mul(const mul_args *a) {
    if (a->B == 1) pf_parfor(a->A, a->threads, mul_scalars, a);
    else pf_parfor(a->A * a->R, a->threads, mul_rows, a);
}

/* y[w K + c] = x[c xs + w]: K rows of the input interleaved into one row of the output, K a constant (so that
   the compiler vectorises the interleave with permutes: 2 us for a 96x96 RGB image, 8 with K a variable) */
#define INTERLEAVE(K) static void interleave##K(const float *restrict x, long xs, float *restrict y, long n) { \
    for (long w = 0; w < n; w++) for (int c = 0; c < K; c++) y[w * K + c] = x[c * xs + w]; }
INTERLEAVE(2) INTERLEAVE(3) INTERLEAVE(4)

static void perm_outer(const void *ctx, int lo, int hi) {  /* indices [lo, hi) of the outermost loop */
    const perm_args *a = (const perm_args *)ctx;
    const long *n = a->n, *ys = a->ys, *xs = a->xs;
    const int il = ys[3] == 1 && xs[2] == 1 && ys[2] == n[3] && n[3] >= 2 && n[3] <= 4;
    for (long i0 = lo; i0 < hi; i0++)
        for (long i1 = 0; i1 < n[1]; i1++) {
            if (il) {
                const float *x = a->x + i0 * xs[0] + i1 * xs[1];
                float *y = a->y + i0 * ys[0] + i1 * ys[1];
                if (n[3] == 2) interleave2(x, xs[3], y, n[2]);
                else if (n[3] == 3) interleave3(x, xs[3], y, n[2]);
                else interleave4(x, xs[3], y, n[2]);
                continue;
            }
            for (long i2 = 0; i2 < n[2]; i2++) {
                const float *x = a->x + i0 * xs[0] + i1 * xs[1] + i2 * xs[2];
                float *y = a->y + i0 * ys[0] + i1 * ys[1] + i2 * ys[2];
                if (xs[3] == 1 && ys[3] == 1) memcpy(y, x, (size_t)n[3] * sizeof(float));
                else if (ys[3] == 1) for (long k = 0; k < n[3]; k++) y[k] = x[k * xs[3]];
                else if (xs[3] == 1) for (long k = 0; k < n[3]; k++) y[k * ys[3]] = x[k];
                else for (long k = 0; k < n[3]; k++) y[k * ys[3]] = x[k * xs[3]];
            }
        }
}

void pf_permute(const perm_args *a) { pf_parfor((int)a->n[0], a->threads, perm_outer, a); }

/* y[o, j, :] = x[o, idx[j], :] over [outer, n, inner] (count indices, held exactly in fp32 as the IR carries
   integers; a negative one counts from the end, as numpy's take). An index that is not a whole number in
   [-n, n) writes NaN into its row, and is counted in ``bad`` (the first in ``first``) for the caller to raise. */
typedef struct { const float *x; const float *idx; float *y; long outer, n, count, inner, bad; double first; } gather_args;

void pf_gather(gather_args *a) {
    const long n = a->n, count = a->count, inner = a->inner;
    a->bad = 0;
    for (long j = 0; j < count; j++) {
        const float f = a->idx[j];
        /* in range before the conversion (a NaN or a huge float converted to long is undefined) */
        const int ok = f >= (float)-n && f < (float)n && (float)(long)f == f;
        long i = ok ? (long)f : 0;
        if (!ok && a->bad++ == 0) a->first = f;
        if (i < 0) i += n;
        for (long o = 0; o < a->outer; o++) {
            float *y = a->y + (o * count + j) * inner;
            if (ok) memcpy(y, a->x + (o * n + i) * inner, (size_t)inner * sizeof(float));
            else for (long c = 0; c < inner; c++) y[c] = __builtin_nanf("");
        }
    }
}
""".replace("@MEAN_BLOCK@", str(MEAN_BLOCK))

def _fits(*arrays: np.ndarray) -> bool:
    return all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def _threads(floats: int, outer: int) -> int:
    return max(1, min(len(os.sched_getaffinity(0)), floats // PAR_WORK, outer))


def bind_mean(x: np.ndarray, out: np.ndarray, nhwc: bool) -> Callable[[], None] | None:
    """``out`` = the mean of ``x`` over H and W: ``x`` is ``[N, H, W, C]`` when ``nhwc`` (``out`` N x C floats,
    any shape), else ``[N, C, H, W]``."""
    lib = built_library(SOURCE) if x.ndim == 4 and _fits(x, out) else None
    if lib is None:
        return None
    if nhwc:
        n, h, w, c = x.shape
    else:
        n, c, h, w = x.shape
    if out.size != n * c or h * w == 0:
        return None
    outer = n * c if not nhwc else n * -(-c // MEAN_BLOCK)
    args = MeanArgs(x.ctypes.data, out.ctypes.data, n, h * w, c, int(not nhwc), _threads(x.size, outer),
                    1.0 / (h * w))
    return struct_call(lib.pf_mean, args, (x, out))


def broadcast_rows(full: Sequence[int], part: Sequence[int]) -> tuple[int, int, int, bool] | None:
    """``(A, R, B, per_a)`` when ``part`` broadcasts to ``full`` as ``[A or 1, 1, B]`` over ``full`` seen as
    ``[A, R, B]`` (``per_a``: ``part`` has the A axis), else None. Axes of size 1 in ``full`` do not count;
    equal shapes are ``(1, 1, size, False)``."""
    if len(part) > len(full):
        return None
    part = (1,) * (len(full) - len(part)) + tuple(part)
    kinds = []
    for d, e in zip(full, part):
        if d == 1:
            if e != 1:
                return None
            continue
        if e not in (1, d):
            return None
        kinds.append(("e" if e == d else "1", d))
    # the axes must read: kept, then broadcast, then kept
    i = 0
    while i < len(kinds) and kinds[i][0] == "e":
        i += 1
    j = i
    while j < len(kinds) and kinds[j][0] == "1":
        j += 1
    if any(k == "1" for k, _ in kinds[j:]):
        return None
    a, r, b = (math.prod(d for _, d in kinds[s]) for s in (slice(0, i), slice(i, j), slice(j, None)))
    if r == 1:  # nothing broadcast: one row
        return 1, 1, a * b, False
    return a, r, b, i > 0


def bind_mul(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> Callable[[], None] | None:
    """``out`` = ``x * y`` where one operand has ``out``'s shape and the other broadcasts to it as rows
    (``broadcast_rows``)."""
    if x.shape != out.shape:
        x, y = y, x
    shape = broadcast_rows(out.shape, y.shape) if x.shape == out.shape else None
    lib = built_library(SOURCE) if shape is not None and _fits(x, y, out) else None
    if lib is None or out.size == 0:
        return None
    a, r, b, per_a = shape
    outer = a if b == 1 else a * r
    args = MulArgs(x.ctypes.data, y.ctypes.data, out.ctypes.data, a, r, b, int(per_a), _threads(out.size, outer))
    return struct_call(lib.pf_mul, args, (x, y, out))


def loop_nest(shape: Sequence[int], perm: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """The four loops of ``permute``, outermost first: their trip counts and the output's and input's strides
    (floats) per loop. The output's axes in order (size-1 axes dropped), except that an output whose last axis
    is shorter than ``SHORT`` (and longer than 1) is walked with the input's last axis innermost, unless it is
    the interleave ``permute`` writes as whole output rows (a last axis of ``INTERLEAVE`` floats or fewer after
    an axis the input holds contiguously: NCHW -> NHWC of an RGB image). Loops of one trip go after the
    outermost (the loop a parallel pass splits)."""
    rank = len(shape)
    xstr = [math.prod(shape[k + 1:]) for k in range(rank)]
    oshape = [shape[p] for p in perm]
    ostr = [math.prod(oshape[k + 1:]) for k in range(rank)]
    loops = [(oshape[k], ostr[k], xstr[perm[k]]) for k in range(rank) if oshape[k] > 1] or [(1, 0, 0)]
    last = loops[-1][0]
    interleave = len(loops) >= 2 and last <= INTERLEAVE and loops[-2][2] == 1 and loops[-2][1] == last
    if 1 < last < SHORT and not interleave:
        inner = next((k for k, lp in enumerate(loops) if lp[2] == 1), len(loops) - 1)
        loops.append(loops.pop(inner))
    loops = loops[:1] + [(1, 0, 0)] * (4 - len(loops)) + loops[1:]
    return [n for n, _, _ in loops], [o for _, o, _ in loops], [s for _, _, s in loops]


def bind_transpose(x: np.ndarray, out: np.ndarray, perm: Sequence[int] | None) -> Callable[[], None] | None:
    """``out`` = ``np.transpose(x, perm)`` (``perm`` None: reversed) for up to four axes."""
    perm = tuple(perm) if perm else tuple(reversed(range(x.ndim)))
    fits = 1 <= x.ndim <= 4 and sorted(perm) == list(range(x.ndim)) and _fits(x, out) and out.size == x.size
    lib = built_library(SOURCE) if fits and x.size else None
    if lib is None:
        return None
    n, ys, xs = loop_nest(x.shape, perm)
    args = PermArgs(x.ctypes.data, out.ctypes.data, (ctypes.c_long * 4)(*n), (ctypes.c_long * 4)(*ys),
                    (ctypes.c_long * 4)(*xs), _threads(x.size, n[0]))
    return struct_call(lib.pf_permute, args, (x, out))


class GatherIndexError(IndexError):
    """A gather's index that is not a whole number within its table."""


def bind_gather(x: np.ndarray, idx: np.ndarray, out: np.ndarray, axis: int) -> Callable[[], None] | None:
    """``out`` = ``np.take(x, idx, axis)`` for indices carried in fp32 (an embedding lookup: rows of a table picked
    by token ids), one copy of ``inner`` floats per index. An index outside ``[-n, n)`` or not a whole number
    raises ``GatherIndexError`` after the call (its row holds NaN). Not a native step: the check is Python's,
    after the pass (a plan's embedding lookup is its first step, the hop it costs is one)."""
    axis = axis % max(x.ndim, 1)
    fits = x.ndim >= 1 and _fits(x, idx, out) and out.size == x.size // max(x.shape[axis], 1) * idx.size
    lib = built_library(SOURCE) if fits and out.size else None
    if lib is None:
        return None
    args = GatherArgs(x.ctypes.data, idx.ctypes.data, out.ctypes.data, math.prod(x.shape[:axis]), x.shape[axis],
                      idx.size, math.prod(x.shape[axis + 1:]), 0, 0.0)
    fn = lib.pf_gather
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = None
    ptr = ctypes.addressof(args)
    keep = (x, idx, out, args)

    def run(fn=fn, ptr=ptr, args=args, keep=keep):
        fn(ptr)
        if args.bad:
            raise GatherIndexError(f"{args.bad} of {args.count} indices outside the table's {args.n} entries along "
                                   f"axis {axis} (the first: {args.first:g}); indices must be whole numbers in "
                                   f"[-{args.n}, {args.n})")

    return run
