"""The GEMM template with quantised weights: B in bf16, int8 per output channel or int4 by blocks of K.

B stays row-major ([K][N] values; int4 two columns to a byte, the even one in the
low nibble), and the GEMM's own B packing (``pack_b``, which every quantised
candidate uses) widens and scales each value as it copies the kc x nc block into
the fp32 panels the micro-kernel reads: the weights stream from memory at their
own size, and the micro-kernel, its tiles and its epilogue are the fp32 GEMM's.

``parts(knobs)`` gives the pieces of ``gemm.source`` that differ (None for fp32,
whose source is left byte for byte as it was).
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ....quant import Packed, packed

_ELEM = {"bf16": "uint16_t", "int8": "int8_t", "int4": "uint8_t"}
_VALUE = {  # column c of row r (absolute), as fp32
    "bf16": "({ uint32_t u = (uint32_t)((const uint16_t *)B->q)[r * B->ld + c] << 16; float f; memcpy(&f, &u, 4); f; })",
    "int8": "(float)((const int8_t *)B->q)[r * B->ld + c] * B->s[c]",
    "int4": "(float)(((c) & 1 ? (int8_t)((const uint8_t *)B->q)[r * B->ld + ((c) >> 1)] >> 4"
            " : (int8_t)(((const uint8_t *)B->q)[r * B->ld + ((c) >> 1)] << 4) >> 4)) * B->s[(r / QB) * B->n + c]",
}


class QGemmArgs(ctypes.Structure):
    _fields_ = [("A", ctypes.c_void_p), ("B", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("C", ctypes.c_void_p),
                ("M", ctypes.c_int), ("N", ctypes.c_int), ("K", ctypes.c_int), ("mc", ctypes.c_int),
                ("kc", ctypes.c_int), ("nc", ctypes.c_int), ("threads", ctypes.c_int), ("par", ctypes.c_int),
                ("scales", ctypes.c_void_p), ("ld", ctypes.c_long)]


def parts(knobs: dict[str, Any]) -> dict[str, str] | None:
    """The quantised pieces of the GEMM source: the B type, its packing, the block's signature and calls."""
    fmt = knobs.get("wfmt", "fp32")
    if fmt == "fp32":
        return None
    pack = r"""
#define QB """ + str(int(knobs.get("qblock", 32))) + r"""
typedef struct { const void *q; const float *s; long ld, n; } qb_t;  /* values, scales, row stride, columns */

/* the kc x nc block of B at (pc, jc), widened and scaled into NR-wide fp32 panels */
static void qpack_b(int kb, int nb, const qb_t *B, int pc, int jc, float *bp) {
    for (int q = 0; q < nb; q += NR)
        for (int k = 0; k < kb; k++) {
            const long r = pc + k;
            const int w = nb - q < NR ? nb - q : NR;
            for (int j = 0; j < w; j++) { const long c = jc + q + j; bp[j] = """ + _VALUE[fmt] + r"""; }
            for (int j = w; j < NR; j++) bp[j] = 0.0f;
            bp += NR;
        }
}
"""
    return {
        "pack_b": pack,
        "block_b": "const qb_t *B",
        "block_j0": ", int j0",
        "pack_call": "qpack_b(kb, nb, B, pc, j0 + jc, bp);",
        "args": "typedef struct { const float *A; const void *B; const float *bias; float *C; "
                "int M, N, K, mc, kc, nc, threads, par; const float *scales; long ld; } gemm_args;",
        "setup": "const qb_t qb = {g->B, g->scales, g->ld, g->N}; const qb_t *B = &qb;\n"
                 "    const float *A = g->A, *bias = g->bias; float *C = g->C;",
        "b_cols": "B",  # the column offset of a slice goes in j0
        "j0": ", n0", "j0_zero": ", 0",
    }


def pack_for(B: np.ndarray, knobs: dict[str, Any]) -> Packed:
    """B [K, N] quantised row-major for these knobs (cached: every GEMM candidate of one format shares it)."""
    return packed(B, knobs["wfmt"], 0, knobs.get("qblock"))


def args(knobs: dict[str, Any], A, B, bias, C) -> tuple[QGemmArgs, Packed]:
    M, K = A.shape
    N = B.shape[1]
    pk = pack_for(B, knobs)
    ld = (N + 1) // 2 if knobs["wfmt"] == "int4" else N
    a = QGemmArgs(A.ctypes.data, pk.w.ctypes.data, bias.ctypes.data if bias is not None else None, C.ctypes.data,
                  M, N, K, knobs["mc"], knobs["kc"], knobs["nc"], knobs["threads"], 0 if knobs["par"] == "n" else 1,
                  pk.scales.ctypes.data if pk.scales is not None else None, ld)
    return a, pk


__all__ = ["QGemmArgs", "args", "pack_for", "parts"]
