"""Fused attention (flash-style, fp32): ``softmax(q k^T * scale [+ causal]) v`` without materialising the scores.

``Problem("attention", (BH, G, S, T, D, DV), "full:SCALE" | "causal:SCALE")`` (``ops.sdpa.kernel`` makes it
from an ``sdpa`` node): ``BH`` independent key/value
heads (batch x kv heads), each shared by ``G`` query heads of ``S`` rows (grouped-query attention; the ``G * S``
query rows of a kv head are contiguous, as ``[.., H, S, D]`` reshapes to ``[.., Hk, G * S, D]``), ``T`` keys of
width ``D``, values of width ``DV``. Query row ``r`` sits at position ``r % S``; ``causal`` masks keys after it.

The kernel walks blocks of ``bq`` query rows (a task each, split over ``threads``) and, for each, blocks of ``bk``
keys: the block's scores are computed with ``vec``-wide dot products into a ``bq x bk`` tile, the running row
maximum and sum are updated (online softmax, the accumulator rescaled when the maximum grows), and ``p v`` is
accumulated in a ``bq x DV`` tile; a causal row skips the key blocks past it. Memory traffic is q, k, v read
and o written once per query block, never the ``S x T`` scores. Compile-time knobs: vec, bq, bk; runtime: threads.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from ....ops.kernel import ProblemError
from ....space import Space, categorical
from .common import header, struct_call
from .parfor import PARFOR_C
from .facts import Facts


class AttnArgs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("q", "k", "v", "o")] + [("threads", ctypes.c_int)]


def parse(p) -> tuple[bool, float]:
    """(causal, scale) of a problem's epilogue ``full:SCALE`` / ``causal:SCALE``."""
    kind, _, scale = p.epilogue.partition(":")
    try:
        s = float(scale)
    except ValueError:
        s = float("nan")
    if kind not in ("full", "causal") or not math.isfinite(s):
        raise ProblemError(f"attention epilogue {p.epilogue!r}: expected full:SCALE or causal:SCALE")
    return kind == "causal", s


def _vecs(lim) -> tuple[int, ...]:
    return tuple(v for v in (1, 4, 8, 16) if v <= lim.vector_lanes)


def space(p, lim) -> Space:
    BH, G, S, T, D, DV = p.dims
    consts = {"rows": G * S, "t": T, "dv": DV, "d": D, "tasks_per_bq": BH * G * S, "l1_bytes": lim.caches["L1d"]}
    return Space([categorical("vec", _vecs(lim)), categorical("bq", (1, 2, 4, 8)),
                  categorical("bk", (16, 32, 64, 128, 256)),
                  categorical("threads", tuple(range(1, lim.physical_cores + 1)))],
                 ["bq <= rows", "bk <= max(16, 2 * t)", "vec <= max(4, d)",
                  # the score tile and the accumulator tile of a block stay in L1 with a key block
                  "(bq * bk + bq * dv + bk * d) * 4 <= l1_bytes",
                  "threads * bq <= tasks_per_bq"],
                 constants=consts)


def defaults(p, lim) -> dict[str, Any]:
    BH, G, S, T, D, DV = p.dims
    vec = max(v for v in _vecs(lim) if v <= max(4, D))
    bq = max(b for b in (1, 2, 4, 8) if b <= G * S)
    bk = max(b for b in (16, 32, 64, 128) if b <= max(16, T))
    big = 2.0 * BH * G * S * T * (D + DV) >= 2e7
    return {"vec": vec, "bq": bq, "bk": bk, "threads": min(lim.physical_cores, BH * G * S // bq) if big else 1}


_KERNEL = r"""
static inline float dot(const float *a, const float *b) {
    int c = 0;
    float s = 0.0f;
#if V > 1
    vf acc = vset(0.0f);
    for (; c + V <= D; c += V) acc += vload(a + c) * vload(b + c);
    s = vsum(acc);
#endif
    for (; c < D; c++) s += a[c] * b[c];
    return s;
}

static inline void axpy(float *y, float a, const float *x) {   /* y += a x over DV */
    int c = 0;
#if V > 1
    vf av = vset(a);
    for (; c + V <= DV; c += V) vstore(y + c, vload(y + c) + av * vload(x + c));
#endif
    for (; c < DV; c++) y[c] += a * x[c];
}

static inline void scal(float *y, float a) {
    for (int c = 0; c < DV; c++) y[c] *= a;
}

typedef struct { const float *q, *k, *v; float *o; int threads; } args_t;

/* the (head, query block) tasks [lo, hi) of one call, on any thread */
static void tasks(const void *c, int lo, int hi) {
    const args_t *a = (const args_t *)c;
    const long R = (long)G * S;
    const long NB = (R + BQ - 1) / BQ;
    for (long task = lo; task < hi; task++) {
        const long bh = task / NB, r0 = (task % NB) * BQ;
        const long r1 = r0 + BQ < R ? r0 + BQ : R;
        const float *q = a->q + bh * R * D, *k = a->k + bh * (long)T * D, *v = a->v + bh * (long)T * DV;
        float *o = a->o + bh * R * DV;
        float m[BQ], l[BQ], s[BQ][BK], acc[BQ][DV];
        int lim[BQ];
        for (long i = r0; i < r1; i++) {
            m[i - r0] = -INFINITY;
            l[i - r0] = 0.0f;
            lim[i - r0] = CAUSAL ? (int)(i % S) + 1 : T;   /* keys [0, lim) are visible to row i */
            memset(acc[i - r0], 0, sizeof acc[0]);
        }
        for (int j0 = 0; j0 < T; j0 += BK) {
            const int j1 = j0 + BK < T ? j0 + BK : T;
            for (long i = r0; i < r1; i++) {
                const int ii = (int)(i - r0);
                const int je = j1 < lim[ii] ? j1 : lim[ii];
                if (je <= j0) continue;                    /* a causal row: this block is past it */
                const float *qi = q + i * D;
                float mx = m[ii];
                for (int j = j0; j < je; j++) {
                    float x = dot(qi, k + (long)j * D) * SCALE;
                    s[ii][j - j0] = x;
                    mx = x > mx ? x : mx;
                }
                if (mx > m[ii]) {                          /* the running maximum grew: rescale what is summed */
                    const float corr = m[ii] == -INFINITY ? 0.0f : expf(m[ii] - mx);
                    l[ii] *= corr;
                    scal(acc[ii], corr);
                    m[ii] = mx;
                }
                float sum = 0.0f;
                for (int j = j0; j < je; j++) {
                    const float pj = expf(s[ii][j - j0] - mx);
                    sum += pj;
                    axpy(acc[ii], pj, v + (long)j * DV);
                }
                l[ii] += sum;
            }
        }
        for (long i = r0; i < r1; i++) {
            const float inv = 1.0f / l[i - r0];
            for (int c = 0; c < DV; c++) o[i * DV + c] = acc[i - r0][c] * inv;
        }
    }
}

void attention(const args_t *a) {
    const long NB = ((long)G * S + BQ - 1) / BQ;
    pf_parfor((int)(BH * NB), a->threads, tasks, a);  /* tasks claimed in chunks (templates/parfor.py) */
}
"""


def source(p, knobs) -> str:
    BH, G, S, T, D, DV = p.dims
    causal, scale = parse(p)
    defs = {"V": knobs["vec"], "BH": BH, "G": G, "S": S, "T": T, "D": D, "DV": DV, "BQ": knobs["bq"],
            "BK": knobs["bk"], "CAUSAL": int(causal), "SCALE": f"{scale!r}f"}
    return "".join(f"#define {k} {v}\n" for k, v in defs.items()) + header() + PARFOR_C + _KERNEL


def bind(lib, p, knobs, inputs: dict, out: np.ndarray):
    BH, G, S, T, D, DV = p.dims
    q = np.ascontiguousarray(inputs["q"], np.float32).reshape(BH, G * S, D)
    k = np.ascontiguousarray(inputs["k"], np.float32).reshape(BH, T, D)
    v = np.ascontiguousarray(inputs["v"], np.float32).reshape(BH, T, DV)
    if not out.flags.c_contiguous:
        raise ValueError("attention writes a C-contiguous output")
    args = AttnArgs(q.ctypes.data, k.ctypes.data, v.ctypes.data, out.ctypes.data, int(knobs["threads"]))
    return struct_call(lib.attention, args, keep=(q, k, v, out))


def plan_inputs(p, ins: list) -> dict:
    return {"q": ins[0], "k": ins[1], "v": ins[2]}


# -- facts ------------------------------------------------------------------------------------------------------------

def _inputs(p, rand):
    BH, G, S, T, D, DV = p.dims
    return {"q": rand(BH, G * S, D), "k": rand(BH, T, D), "v": rand(BH, T, DV)}


def output_shape(p) -> tuple[int, ...]:
    BH, G, S, T, D, DV = p.dims
    return (BH, G * S, DV)


def _as_heads(p, inp):
    BH, G, S, T, D, DV = p.dims
    return (inp["q"].reshape(BH, G, S, D), inp["k"].reshape(BH, 1, T, D), inp["v"].reshape(BH, 1, T, DV))


def reference(p, inp) -> np.ndarray:
    from ....ops.sdpa import reference as sdpa

    causal, scale = parse(p)
    return sdpa(list(_as_heads(p, inp)), {"causal": causal, "scale": scale}).reshape(output_shape(p))


def tolerance(p, inp) -> np.ndarray:
    """fp32 dot products of length D and an online softmax over T keys: the error grows with D + T, the score
    magnitudes (exp is relative to its argument) and the values."""
    BH, G, S, T, D, DV = p.dims
    _, scale = parse(p)
    score = scale * np.abs(inp["q"]).max() * np.abs(inp["k"]).max() * D
    vmax = np.abs(inp["v"]).max()
    return np.full(output_shape(p), 8 * 2.0 ** -24 * (D + T) * (1 + score) * max(vmax, 1e-30))


def _flops(p) -> float:
    BH, G, S, T, D, DV = p.dims
    return 2.0 * BH * G * S * T * (D + DV)


def _numpy(p, inp, out):
    from ....ops.sdpa import _step

    causal, scale = parse(p)
    o = out.reshape(p.dims[0], p.dims[1], p.dims[2], p.dims[5])
    return _step(list(_as_heads(p, inp)), o, {"causal": causal, "scale": scale})


def _torch(p, inp, out):
    import torch
    import torch.nn.functional as F

    causal, scale = parse(p)
    q, k, v = (torch.from_numpy(np.ascontiguousarray(x)) for x in _as_heads(p, inp))
    o = torch.from_numpy(out).view(p.dims[0], p.dims[1], p.dims[2], p.dims[5])

    def run():
        with torch.inference_mode():
            o.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True))
    return run


FACTS = Facts(inputs=_inputs, output_shape=output_shape, reference=reference, tolerance=tolerance, flops=_flops,
              numpy=_numpy, torch=_torch)
