"""Max pooling as one compiled pass (the ``maxpool2d`` and ``maxpool2d_nhwc`` library steps).

The numpy step copied its input into a padded buffer and took one strided maximum per window tap (nine passes
over the output for ResNet's 3x3 stem pool: 0.43-0.52 ms in a chain against ONNX Runtime's 0.04). This reads
each output's window straight from the input, clipped to the rows and columns that exist (padding is -inf for a
maximum, so clipping is the same; a window wholly in the padding gives -inf as the reference does), and
propagates NaN as ``np.maximum`` does. One source for every geometry (the geometry is the call's arguments),
built once per machine; NHWC runs its inner loop over the channels, NCHW over the output columns. A pool with
at least ``PAR_WORK`` window taps per extra thread splits its output rows (NHWC) or planes (NCHW) over up to
every CPU the process may use, on the process's shared pool (``parfor``): ResNet-18's stem pool (112x112x64 in,
3x3 stride 2) took 0.36 ms on one thread inside a whole call, against ONNX Runtime's 0.10 on two.
"""
from __future__ import annotations

import ctypes
import os
from typing import Callable

import numpy as np

from .common import struct_call
from .parfor import PARFOR_C, built_library

_FIELDS = ("N", "C", "H", "W", "OH", "OW", "KH", "KW", "SH", "SW", "PT", "PL", "DH", "DW", "nhwc", "threads")
PAR_WORK = 1 << 18  # window taps (outputs x taps) per thread below which a pool stays on fewer threads


class PoolArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("y", ctypes.c_void_p)] + [(n, ctypes.c_int) for n in _FIELDS]


SOURCE = PARFOR_C + r"""
#include <math.h>
typedef struct { const float *x; float *y; int N, C, H, W, OH, OW, KH, KW, SH, SW, PT, PL, DH, DW, nhwc, threads; }
    pool_args;

/* the taps of a window that lie inside 0..n-1: first and end (exclusive) tap indices */
static void span(int o, int s, int p, int d, int k, int n, int *k0, int *k1) {
    int start = o * s - p, a = 0, b = k;
    while (a < k && start + a * d < 0) a++;
    while (b > a && start + (b - 1) * d >= n) b--;
    *k0 = a; *k1 = b;
}

#define MAXNAN(m, v) (((v) > (m)) | ((v) != (v)) ? (v) : (m))  /* | , not ||: a select, vectorised */

static void nhwc_rows(const void *ctx, int lo, int hi) {  /* output rows [lo, hi) of N x OH, on any thread */
    const pool_args *a = (const pool_args *)ctx;
    const int C = a->C, H = a->H, W = a->W, OH = a->OH, OW = a->OW;
    int ws0[OW > 0 ? OW : 1], ws1[OW > 0 ? OW : 1];  /* each output column's taps inside the row */
    for (int ow = 0; ow < OW; ow++) span(ow, a->SW, a->PL, a->DW, a->KW, W, &ws0[ow], &ws1[ow]);
    for (int i = lo; i < hi; i++) {
        const int n = i / OH, oh = i % OH;
        {
            const float *x = a->x + (long)n * H * W * C;
            float *y = a->y + (long)n * OH * OW * C;
            {
                int h0, h1; span(oh, a->SH, a->PT, a->DH, a->KH, H, &h0, &h1);
                for (int ow = 0; ow < OW; ow++) {
                    int w0 = ws0[ow], w1 = ws1[ow];
                    float *out = y + ((long)oh * OW + ow) * C;
                    for (int c = 0; c < C; c++) out[c] = -INFINITY;
                    for (int kh = h0; kh < h1; kh++)
                        for (int kw = w0; kw < w1; kw++) {
                            const float *in = x + ((long)(oh * a->SH - a->PT + kh * a->DH) * W
                                                   + ow * a->SW - a->PL + kw * a->DW) * C;
                            for (int c = 0; c < C; c++) out[c] = MAXNAN(out[c], in[c]);
                        }
                }
            }
        }
    }
}

/* separable: the window's rows reduced into one row (vectorised over the columns), then its columns, one tap at
   a time; the maximum as a select (a branch per tap mispredicts on random data). Planes [lo, hi) of N x C */
static void nchw_planes(const void *ctx, int lo, int hi) {
    const pool_args *a = (const pool_args *)ctx;
    const int C = a->C, H = a->H, W = a->W, OH = a->OH, OW = a->OW;
    float t[W > 0 ? W : 1];
    for (int i = lo; i < hi; i++) {
        const int n = i / C, c = i % C;
            {
                const float *x = a->x + ((long)n * C + c) * H * W;
                float *y = a->y + ((long)n * C + c) * OH * OW;
                for (int oh = 0; oh < OH; oh++) {
                    int h0, h1; span(oh, a->SH, a->PT, a->DH, a->KH, H, &h0, &h1);
                    for (int w = 0; w < W; w++) t[w] = -INFINITY;
                    for (int kh = h0; kh < h1; kh++) {
                        const float *row = x + (long)(oh * a->SH - a->PT + kh * a->DH) * W;
                        for (int w = 0; w < W; w++) t[w] = MAXNAN(t[w], row[w]);
                    }
                    float *out = y + (long)oh * OW;
                    for (int ow = 0; ow < OW; ow++) out[ow] = -INFINITY;
                    for (int kw = 0; kw < a->KW; kw++) {  /* one tap over every column it lies in: vectorised */
                        const int off = kw * a->DW - a->PL, sw = a->SW;
                        int o0 = 0, o1 = OW;
                        while (o0 < OW && o0 * sw + off < 0) o0++;
                        while (o1 > o0 && (o1 - 1) * sw + off >= W) o1--;
                        for (int ow = o0; ow < o1; ow++) out[ow] = MAXNAN(out[ow], t[ow * sw + off]);
                    }
                }
            }
    }
}

void pf_maxpool(const pool_args *a) {
    if (a->nhwc) pf_parfor(a->N * a->OH, a->threads, nhwc_rows, a);
    else pf_parfor(a->N * a->C, a->threads, nchw_planes, a);
}
"""

def bind(x: np.ndarray, out: np.ndarray, geom: tuple[int, ...], nhwc: bool) -> Callable[[], None] | None:
    """``out`` = the max pool of ``x`` (fp32, C-contiguous; NCHW, or NHWC when ``nhwc``) with ``geom`` (kh, kw,
    sh, sw, pt, pl, pb, pr, dh, dw) as a no-argument call; None where the arrays are not fp32 C-contiguous or
    no compiler is here (the caller's numpy step stays)."""
    if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in (x, out)):
        return None
    lib = built_library(SOURCE)
    if lib is None:
        return None
    kh, kw, sh, sw, pt, pl, _, _, dh, dw = geom
    if nhwc:
        n, h, w, c = x.shape
        oh, ow = out.shape[1], out.shape[2]
    else:
        n, c, h, w = x.shape
        oh, ow = out.shape[2], out.shape[3]
    threads = max(1, min(len(os.sched_getaffinity(0)), out.size * kh * kw // PAR_WORK))
    args = PoolArgs(x.ctypes.data, out.ctypes.data, n, c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw, int(nhwc),
                    threads)
    return struct_call(lib.pf_maxpool, args, (x, out))
