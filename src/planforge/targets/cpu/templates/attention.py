"""Fused attention (flash-style, fp32): ``softmax(q k^T * scale [+ causal]) v`` without materialising the scores.

``Problem("attention", (BH, G, S, T, D, DV), "full:SCALE" | "causal:SCALE")`` (``ops.sdpa.kernel`` makes it
from an ``sdpa`` node): ``BH`` independent key/value
heads (batch x kv heads), each shared by ``G`` query heads of ``S`` rows (grouped-query attention; the ``G * S``
query rows of a kv head are contiguous, as ``[.., H, S, D]`` reshapes to ``[.., Hk, G * S, D]``), ``T`` keys of
width ``D``, values of width ``DV``. Query row ``r`` sits at position ``r % S``; ``causal`` masks keys after it.
The epilogue may go on with a layout (``ops.kernel.AttentionLayout``): ``:tok:HK``, q, k, v and the output
token-major ``[B, S, heads, width]`` as the projections write them, or ``:qkv:HK:W:OQ:OK:OV``, q, k and v column
windows of one ``[B, S, W]`` value (a fused QKV projection's): the kernel reads them in place (``strides``), no
head transpose and no split copied.

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

from ....ops.kernel import ProblemError, attention_layout
from ....space import Space, categorical
from .common import header, struct_call
from .parfor import PARFOR_C
from .facts import Facts


class AttnArgs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("q", "k", "v", "o")] + [("threads", ctypes.c_int)]


def parse(p) -> tuple[bool, float]:
    """(causal, scale) of a problem's epilogue ``full:SCALE`` / ``causal:SCALE`` (and a layout after them)."""
    lay = attention_layout(p)
    if not math.isfinite(lay.scale):
        raise ProblemError(f"attention epilogue {p.epilogue!r}: the scale is not finite")
    return lay.causal, lay.scale


def strides(p) -> dict[str, int]:
    """Per operand (Q, K, V, O), the floats from one batch row (``*B``), one head (``*H``) and one position (``*S``)
    to the next, and where its columns start (``OQ``, ``OK``, ``OV``), for the problem's layout; ``HK``: the kv heads
    per batch row (``BH`` for the head-major layout, whose batch rows are not told apart)."""
    BH, G, S, T, D, DV = p.dims
    lay = attention_layout(p)
    if lay.kind == "heads":
        return {"HK": BH, "QB": 0, "QH": S * D, "QS": D, "KB": 0, "KH": T * D, "KS": D, "VB": 0, "VH": T * DV,
                "VS": DV, "OB": 0, "OH": S * DV, "OS": DV, "OQ": 0, "OK": 0, "OV": 0}
    hk, H = lay.hk, lay.hk * G
    out = {"OB": S * H * DV, "OH": DV, "OS": H * DV}
    if lay.kind == "tokens":
        return {"HK": hk, "QB": S * H * D, "QH": D, "QS": H * D, "KB": T * hk * D, "KH": D, "KS": hk * D,
                "VB": T * hk * DV, "VH": DV, "VS": hk * DV, **out, "OQ": 0, "OK": 0, "OV": 0}
    W, (oq, ok, ov) = lay.width, lay.offsets
    return {"HK": hk, "QB": S * W, "QH": D, "QS": W, "KB": T * W, "KH": D, "KS": W, "VB": T * W, "VH": DV,
            "VS": W, **out, "OQ": oq, "OK": ok, "OV": ov}


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
#if V > 1
/* the lanes of v summed as a tree (halves added, log2(V) dependent adds) rather than one chain of V - 1 adds:
   the chain's latency was most of a score's cost */
typedef float f8 __attribute__((vector_size(32)));
typedef float f4 __attribute__((vector_size(16)));
static inline float hsum(vf v) {
    float t[V];
    memcpy(t, &v, sizeof v);
#if V >= 16
    { f8 a, b; memcpy(&a, t, 32); memcpy(&b, t + 8, 32); a += b; memcpy(t, &a, 32); }
#endif
#if V >= 8
    { f4 a, b; memcpy(&a, t, 16); memcpy(&b, t + 4, 16); a += b; memcpy(t, &a, 16); }
#endif
    return (t[0] + t[2]) + (t[1] + t[3]);
}
#endif

static inline float dot(const float *a, const float *b) {
    int c = 0;
    float s = 0.0f;
#if V > 1
    vf acc = vset(0.0f);
    for (; c + V <= D; c += V) acc += vload(a + c) * vload(b + c);
    s = hsum(acc);
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
        /* the operands' rows where the layout puts them (``strides``): query row i is head hk * G + i / S at
           position i % S; key and value row j at position j */
        const long b = bh / HK, hk = bh % HK;
        const float *k = a->k + b * (long)KB + hk * (long)KH + OK, *v = a->v + b * (long)VB + hk * (long)VH + OV;
#define QROW(i) (a->q + b * (long)QB + (hk * G + (i) / S) * (long)QH + ((i) % S) * (long)QS + OQ)
#define OROW(i) (a->o + b * (long)OB + (hk * G + (i) / S) * (long)OH + ((i) % S) * (long)OS)
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
                const float *qi = QROW(i);
                float mx = m[ii];
                for (int j = j0; j < je; j++) {
                    float x = dot(qi, k + (long)j * KS) * SCALE;
                    s[ii][j - j0] = x;
                    mx = x > mx ? x : mx;
                }
                if (mx > m[ii]) {                          /* the running maximum grew: rescale what is summed */
                    const float corr = m[ii] == -INFINITY ? 0.0f : expf(m[ii] - mx);
                    l[ii] *= corr;
                    scal(acc[ii], corr);
                    m[ii] = mx;
                }
                float sum = 0.0f, *si = s[ii];
                int j = j0;
#if V > 1
                {   /* the block's exponentials V at a time */
                    const vf mv = vset(mx);
                    vf sv = vset(0.0f);
                    for (; j + V <= je; j += V) {
                        const vf pv = vexp(vload(si + (j - j0)) - mv);
                        vstore(si + (j - j0), pv);
                        sv += pv;
                    }
                    sum = hsum(sv);
                }
#endif
                for (; j < je; j++) {
                    si[j - j0] = expf(si[j - j0] - mx);
                    sum += si[j - j0];
                }
                for (j = j0; j < je; j++) axpy(acc[ii], si[j - j0], v + (long)j * VS);
                l[ii] += sum;
            }
        }
        for (long i = r0; i < r1; i++) {
            const float inv = 1.0f / l[i - r0];
            float *o = OROW(i);
            for (int c = 0; c < DV; c++) o[c] = acc[i - r0][c] * inv;
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
            "BK": knobs["bk"], "CAUSAL": int(causal), "SCALE": f"{scale!r}f", **strides(p)}
    return "".join(f"#define {k} {v}\n" for k, v in defs.items()) + header() + PARFOR_C + _KERNEL


def _operand(x, size: int, what: str) -> np.ndarray:
    """``x`` as the kernel reads it: a C-contiguous fp32 array of ``size`` floats, never a copy (a copy made when
    the step is bound would be read at every call, stale)."""
    if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous) or x.size != size:
        raise ValueError(f"attention reads {what} as {size} C-contiguous fp32 values, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
    return x


def bind(lib, p, knobs, inputs: dict, out: np.ndarray):
    """The kernel on ``inputs``: q, k, v (head- or token-major, ``attention_layout``) or, packed, x alone."""
    BH, G, S, T, D, DV = p.dims
    lay = attention_layout(p)
    if lay.kind == "packed":
        x = _operand(inputs["x"], BH // lay.hk * S * lay.width, "the packed q, k, v")
        q = k = v = x
    else:
        q = _operand(inputs["q"], BH * G * S * D, "q")
        k = _operand(inputs["k"], BH * T * D, "k")
        v = _operand(inputs["v"], BH * T * DV, "v")
    _operand(out, BH * G * S * DV, "its output")
    return _call(lib.attention, (q, k, v, out), knobs)


def _call(fn, arrays, knobs):
    """``fn(&{four pointers, threads})`` as a step (the attention and rope kernels take the same struct)."""
    args = AttnArgs(*(a.ctypes.data for a in arrays), int(knobs["threads"]))
    return struct_call(fn, args, keep=arrays)


def plan_inputs(p, ins: list) -> dict:
    if attention_layout(p).kind == "packed":
        return {"x": ins[0]}
    return {"q": ins[0], "k": ins[1], "v": ins[2]}


# -- facts ------------------------------------------------------------------------------------------------------------

def _inputs(p, rand):
    BH, G, S, T, D, DV = p.dims
    lay = attention_layout(p)
    if lay.kind == "packed":
        return {"x": rand(BH // lay.hk, S, lay.width)}
    if lay.kind == "tokens":
        B, hk = BH // lay.hk, lay.hk
        return {"q": rand(B, S, hk * G, D), "k": rand(B, T, hk, D), "v": rand(B, T, hk, DV)}
    return {"q": rand(BH, G * S, D), "k": rand(BH, T, D), "v": rand(BH, T, DV)}


def output_shape(p) -> tuple[int, ...]:
    BH, G, S, T, D, DV = p.dims
    lay = attention_layout(p)
    if lay.kind != "heads":
        return (BH // lay.hk, S, lay.hk * G, DV)
    return (BH, G * S, DV)


def _as_heads(p, inp):
    """q [BH, G, S, D], k [BH, 1, T, D], v [BH, 1, T, DV] (views where the layout allows) of any layout's inputs."""
    BH, G, S, T, D, DV = p.dims
    lay = attention_layout(p)
    if lay.kind == "heads":
        return (inp["q"].reshape(BH, G, S, D), inp["k"].reshape(BH, 1, T, D), inp["v"].reshape(BH, 1, T, DV))
    B, hk = BH // lay.hk, lay.hk
    if lay.kind == "packed":
        x, (oq, ok, ov) = inp["x"], lay.offsets
        q = x[..., oq:oq + hk * G * D].reshape(B, S, hk * G, D)
        k, v = x[..., ok:ok + hk * D].reshape(B, T, hk, D), x[..., ov:ov + hk * DV].reshape(B, T, hk, DV)
    else:
        q, k, v = inp["q"], inp["k"], inp["v"]
    # token-major [B, S, H, D] -> [B, H, S, D] -> [B * HK, G, S, D]
    return (np.swapaxes(q, 1, 2).reshape(BH, G, S, D), np.swapaxes(k, 1, 2).reshape(BH, 1, T, D),
            np.swapaxes(v, 1, 2).reshape(BH, 1, T, DV))


def _to_layout(p, o: np.ndarray) -> np.ndarray:
    """The head-major result ``[BH, G, S, DV]`` in the problem's output layout."""
    BH, G, S, T, D, DV = p.dims
    lay = attention_layout(p)
    if lay.kind == "heads":
        return o.reshape(output_shape(p))
    return np.swapaxes(o.reshape(BH // lay.hk, lay.hk * G, S, DV), 1, 2)


def reference(p, inp) -> np.ndarray:
    from ....ops.sdpa import reference as sdpa

    causal, scale = parse(p)
    return np.ascontiguousarray(_to_layout(p, sdpa(list(_as_heads(p, inp)), {"causal": causal, "scale": scale})))


def tolerance(p, inp) -> np.ndarray:
    """fp32 dot products of length D and an online softmax over T keys: the error grows with D + T, the score
    magnitudes (exp is relative to its argument) and the values."""
    BH, G, S, T, D, DV = p.dims
    _, scale = parse(p)
    q, k, v = _as_heads(p, inp)
    score = scale * np.abs(q).max() * np.abs(k).max() * D
    vmax = np.abs(v).max()
    return np.full(output_shape(p), 8 * 2.0 ** -24 * (D + T) * (1 + score) * max(vmax, 1e-30))


def _flops(p) -> float:
    BH, G, S, T, D, DV = p.dims
    return 2.0 * BH * G * S * T * (D + DV)


def _numpy(p, inp, out):
    """sdpa's numpy step; with a token-major or packed layout, the head transposes (and splits) copied at every
    call, as a user of numpy would have to."""
    from ....ops.sdpa import _step

    causal, scale = parse(p)
    BH, G, S, T, D, DV = p.dims
    attrs = {"causal": causal, "scale": scale}
    if attention_layout(p).kind == "heads":
        return _step(list(_as_heads(p, inp)), out.reshape(BH, G, S, DV), attrs)
    views = _as_heads(p, inp)
    bufs = [np.empty(x.shape, np.float32) for x in views]
    o = np.empty((BH, G, S, DV), np.float32)
    inner = _step(bufs, o, attrs)
    dst = out.reshape(output_shape(p))

    def run():
        for b, x in zip(bufs, views):
            np.copyto(b, x)
        inner()
        np.copyto(dst, _to_layout(p, o))
    return run


def _torch(p, inp, out):
    """torch's sdpa; a token-major or packed layout read through strided views of the same arrays (torch's
    own handling of them, in every call)."""
    import torch
    import torch.nn.functional as F

    causal, scale = parse(p)
    BH, G, S, T, D, DV = p.dims
    lay = attention_layout(p)
    o = torch.from_numpy(out).view(*output_shape(p))
    if lay.kind == "heads":
        q, k, v = (torch.from_numpy(np.ascontiguousarray(x)) for x in _as_heads(p, inp))

        def run():
            with torch.inference_mode():
                o.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
                        .view(*output_shape(p)))
        return run
    B, hk, H = BH // lay.hk, lay.hk, lay.hk * G
    if lay.kind == "packed":
        x, (oq, ok, ov) = torch.from_numpy(inp["x"]), lay.offsets
        qs, ks, vs = (x[..., oq:oq + H * D].view(B, S, H, D), x[..., ok:ok + hk * D].view(B, T, hk, D),
                      x[..., ov:ov + hk * DV].view(B, T, hk, DV))
    else:
        qs, ks, vs = (torch.from_numpy(inp[n]) for n in ("q", "k", "v"))

    def run_tokens():
        with torch.inference_mode():
            r = F.scaled_dot_product_attention(qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2),
                                               is_causal=causal, scale=scale, enable_gqa=True)
            o.copy_(r.transpose(1, 2))
    return run_tokens


FACTS = Facts(inputs=_inputs, output_shape=output_shape, reference=reference, tolerance=tolerance, flops=_flops,
              numpy=_numpy, torch=_torch)


# -- rotary embedding: Problem("rope", (B, H, S, D), "bhsd" | "bshd") ------------------------------------------------
# y[b, h, s] = x[b, h, s] * cos[s] + rotate_half(x[b, h, s]) * sin[s], rotate_half(x) = (-x[D/2:], x[:D/2]); with
# "bshd" the row x[b, h, s] is read from a [B, S, H, D] value (the projection's layout) in place: the head transpose
# is the row's address, not a copy. Rows are claimed in chunks by ``threads``; knobs: vec, threads.

def _rope_layout(p) -> bool:
    """True for the [B, S, H, D] input layout."""
    if p.epilogue not in ("bhsd", "bshd") or p.dims[3] % 2:
        raise ProblemError(f"rope {p.dims} {p.epilogue!r}: expected an even head width and layout bhsd or bshd")
    return p.epilogue == "bshd"


def rope_space(p, lim) -> Space:
    B, H, S, D = p.dims
    _rope_layout(p)
    return Space([categorical("vec", (1,) + tuple(v for v in (4, 8, 16) if v <= lim.vector_lanes)),
                  categorical("threads", tuple(range(1, lim.physical_cores + 1)))],
                 ["vec <= max(1, half)", "threads <= rows"], constants={"half": D // 2, "rows": B * H * S})


def rope_defaults(p, lim) -> dict[str, Any]:
    B, H, S, D = p.dims
    return {"vec": max(v for v in (1, 4, 8, 16) if v <= lim.vector_lanes and v <= max(1, D // 2)), "threads": 1}


_ROPE = r"""
typedef struct { const float *x, *cs, *sn; float *y; int threads; } rope_args;

static void rope_rows(const void *c, int lo, int hi) {
    const rope_args *a = (const rope_args *)c;
    for (int r = lo; r < hi; r++) {
        const long b = r / (H * S), h = (r / S) % H, s = r % S;
        const float *x = a->x + (BSHD ? ((b * S + s) * H + h) * (long)D : (long)r * D);
        const float *cs = a->cs + s * D, *sn = a->sn + s * D;
        float *y = a->y + (long)r * D;
        int c0 = 0;
#if V > 1
        for (; c0 + V <= HALF; c0 += V) {
            vf x1 = vload(x + c0), x2 = vload(x + HALF + c0);
            vstore(y + c0, x1 * vload(cs + c0) - x2 * vload(sn + c0));
            vstore(y + HALF + c0, x2 * vload(cs + HALF + c0) + x1 * vload(sn + HALF + c0));
        }
#endif
        for (; c0 < HALF; c0++) {
            const float x1 = x[c0], x2 = x[HALF + c0];
            y[c0] = x1 * cs[c0] - x2 * sn[c0];
            y[HALF + c0] = x2 * cs[HALF + c0] + x1 * sn[HALF + c0];
        }
    }
}

void rope(const rope_args *a) {
    pf_parfor(B * H * S, a->threads, rope_rows, a);  /* rows claimed in chunks (templates/parfor.py) */
}
"""


def rope_source(p, knobs) -> str:
    B, H, S, D = p.dims
    defs = {"V": knobs["vec"], "B": B, "H": H, "S": S, "D": D, "HALF": D // 2, "BSHD": int(_rope_layout(p))}
    return "".join(f"#define {k} {v}\n" for k, v in defs.items()) + header() + PARFOR_C + _ROPE


def _rope_in_shape(p) -> tuple[int, ...]:
    B, H, S, D = p.dims
    return (B, S, H, D) if _rope_layout(p) else (B, H, S, D)


def rope_bind(lib, p, knobs, inputs: dict, out: np.ndarray):
    B, H, S, D = p.dims
    x = np.ascontiguousarray(inputs["x"], np.float32)
    cs, sn = (np.ascontiguousarray(inputs[k], np.float32) for k in ("cos", "sin"))
    if x.size != B * H * S * D or cs.size != S * D or sn.size != S * D:
        raise ValueError(f"rope {p.dims}: x has {x.size} values, cos {cs.size}, sin {sn.size} (tables are S x D)")
    if not out.flags.c_contiguous or out.size != B * H * S * D:
        raise ValueError("rope writes a C-contiguous [B, H, S, D] output")
    return _call(lib.rope, (x, cs, sn, out), knobs)


def rope_plan_inputs(p, ins: list) -> dict:
    return {"x": ins[0], "cos": ins[1], "sin": ins[2]}


def _rope_inputs(p, rand):
    B, H, S, D = p.dims
    return {"x": rand(*_rope_in_shape(p)), "cos": rand(S, D), "sin": rand(S, D)}


def _rope_heads(p, x):
    return np.transpose(x, (0, 2, 1, 3)) if _rope_layout(p) else x


def _rope_reference(p, inp) -> np.ndarray:
    x = _rope_heads(p, inp["x"])
    h = p.dims[3] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * inp["cos"] + rot * inp["sin"]


def _rope_tolerance(p, inp) -> np.ndarray:
    """Two products and a sum per element, each rounded once in fp32."""
    x = np.abs(_rope_heads(p, inp["x"]))
    bound = x * np.abs(inp["cos"]) + x.max(axis=-1, keepdims=True) * np.abs(inp["sin"])
    return 4 * 2.0 ** -24 * (bound + 1e-30)


def _rope_numpy(p, inp, out):
    x = _rope_heads(p, inp["x"])
    h = p.dims[3] // 2
    cs, sn = inp["cos"], inp["sin"]
    t = np.empty_like(out)

    def run():
        np.multiply(x, cs, out=out)
        np.multiply(x[..., h:], sn[..., :h], out=t[..., :h])
        np.multiply(x[..., :h], sn[..., h:], out=t[..., h:])
        np.subtract(out[..., :h], t[..., :h], out=out[..., :h])
        np.add(out[..., h:], t[..., h:], out=out[..., h:])

    return run


def _rope_torch(p, inp, out):
    import torch

    x = torch.from_numpy(np.ascontiguousarray(inp["x"]))
    x = x.transpose(1, 2) if _rope_layout(p) else x
    cs, sn = torch.from_numpy(inp["cos"]), torch.from_numpy(inp["sin"])
    o = torch.from_numpy(out)
    h = p.dims[3] // 2

    def run():
        with torch.inference_mode():
            torch.add(x * cs, torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sn, out=o)
    return run


ROPE_FACTS = Facts(inputs=_rope_inputs, output_shape=lambda p: tuple(p.dims), reference=_rope_reference,
                   tolerance=_rope_tolerance, flops=lambda p: 3.0 * math.prod(p.dims), numpy=_rope_numpy,
                   torch=_rope_torch)


# -- the head transpose: Problem("swap12", (B, X, Y, D)), y[b, j, i] = x[b, i, j] for rows of D floats -------------
# ``[B, S, H, D] <-> [B, H, S, D]`` around attention, where no neighbour reads it in place: a row copy each, rows
# claimed in chunks by ``threads`` (the knob), so that the step is native and a part of such steps stays in C.

_SWAP = r"""
typedef struct { const float *x, *u1, *u2; float *y; int threads; } swap_args;

static void swap_rows(const void *c, int lo, int hi) {
    const swap_args *a = (const swap_args *)c;
    for (int r = lo; r < hi; r++) {                   /* output row (b, j, i) <- input row (b, i, j) */
        const long b = r / ((long)X * Y), j = (r / X) % Y, i = r % X;
        memcpy(a->y + (long)r * D, a->x + ((b * X + i) * Y + j) * (long)D, sizeof(float) * D);
    }
}

void swap12(const swap_args *a) {
    pf_parfor(B * X * Y, a->threads, swap_rows, a);  /* rows claimed in chunks (templates/parfor.py) */
}
"""


def swap_space(p, lim) -> Space:
    B, X, Y, D = p.dims
    return Space([categorical("threads", tuple(range(1, lim.physical_cores + 1)))], ["threads <= rows"],
                 constants={"rows": B * X * Y})


def swap_source(p, knobs) -> str:
    B, X, Y, D = p.dims
    return "".join(f"#define {k} {v}\n" for k, v in {"V": 1, "B": B, "X": X, "Y": Y, "D": D}.items()) + header() \
        + PARFOR_C + _SWAP


def swap_bind(lib, p, knobs, inputs: dict, out: np.ndarray):
    x = np.ascontiguousarray(inputs["x"], np.float32)
    if x.size != math.prod(p.dims) or not out.flags.c_contiguous or out.size != x.size:
        raise ValueError(f"swap12 {p.dims}: x has {x.size} values, out {out.size} (C-contiguous)")
    return _call(lib.swap12, (x, x, x, out), knobs)


def _swap_ref(p, inp):
    return np.ascontiguousarray(np.transpose(inp["x"], (0, 2, 1, 3)))


def _swap_numpy(p, inp, out):
    x = inp["x"]
    return lambda: np.copyto(out, np.transpose(x, (0, 2, 1, 3)))


def _swap_torch(p, inp, out):
    import torch

    x, o = torch.from_numpy(inp["x"]), torch.from_numpy(out)

    def run():
        with torch.inference_mode():
            o.copy_(x.transpose(1, 2))
    return run


SWAP_FACTS = Facts(inputs=lambda p, rand: {"x": rand(*p.dims)},
                   output_shape=lambda p: (p.dims[0], p.dims[2], p.dims[1], p.dims[3]), reference=_swap_ref,
                   tolerance=lambda p, inp: np.zeros((p.dims[0], p.dims[2], p.dims[1], p.dims[3])),
                   flops=lambda p: 0.0, numpy=_swap_numpy, torch=_swap_torch)


# -- a slice of contiguous blocks: Problem("slab", (O, A, I, N), "START"), y[o, n, i] = x[o, START + n, i] ----------
# GPT-2's fused QKV split (its three slices of [1, S, 3 * W] along the last axis) and any other step-1 slice: O
# blocks of N * I contiguous floats, each a copy; rows claimed in chunks by ``threads``.

_SLAB = r"""
typedef struct { const float *x, *u1, *u2; float *y; int threads; } slab_args;

static void slab_rows(const void *c, int lo, int hi) {
    const slab_args *a = (const slab_args *)c;
    for (int o = lo; o < hi; o++)
        memcpy(a->y + (long)o * N * I, a->x + ((long)o * A + START) * I, sizeof(float) * N * I);
}

void slab(const slab_args *a) {
    pf_parfor(O, a->threads, slab_rows, a);  /* blocks claimed in chunks (templates/parfor.py) */
}
"""


def _slab_start(p) -> int:
    O, A, I, N = p.dims
    try:
        start = int(p.epilogue)
    except ValueError:
        start = -1
    if not 0 <= start <= A - N:
        raise ProblemError(f"slab {p.dims} {p.epilogue!r}: expected a start in 0..{A - N}")
    return start


def slab_space(p, lim) -> Space:
    _slab_start(p)
    return Space([categorical("threads", tuple(range(1, lim.physical_cores + 1)))], ["threads <= rows"],
                 constants={"rows": p.dims[0]})


def slab_source(p, knobs) -> str:
    O, A, I, N = p.dims
    defs = {"V": 1, "O": O, "A": A, "I": I, "N": N, "START": _slab_start(p)}
    return "".join(f"#define {k} {v}\n" for k, v in defs.items()) + header() + PARFOR_C + _SLAB


def slab_bind(lib, p, knobs, inputs: dict, out: np.ndarray):
    O, A, I, N = p.dims
    x = np.ascontiguousarray(inputs["x"], np.float32)
    if x.size != O * A * I or not out.flags.c_contiguous or out.size != O * N * I:
        raise ValueError(f"slab {p.dims}: x has {x.size} values, out {out.size} (C-contiguous)")
    return _call(lib.slab, (x, x, x, out), knobs)


def _slab_view(p, x):
    O, A, I, N = p.dims
    s = _slab_start(p)
    return x.reshape(O, A, I)[:, s:s + N, :]


def _slab_torch(p, inp, out):
    import torch

    v, o = torch.from_numpy(np.ascontiguousarray(inp["x"])), torch.from_numpy(out)
    O, A, I, N = p.dims
    st = _slab_start(p)

    def run():
        with torch.inference_mode():
            o.copy_(v.view(O, A, I)[:, st:st + N, :])
    return run


SLAB_FACTS = Facts(inputs=lambda p, rand: {"x": rand(p.dims[0], p.dims[1], p.dims[2])},
                   output_shape=lambda p: (p.dims[0], p.dims[3], p.dims[2]),
                   reference=lambda p, inp: np.ascontiguousarray(_slab_view(p, inp["x"])),
                   tolerance=lambda p, inp: np.zeros((p.dims[0], p.dims[3], p.dims[2])),
                   flops=lambda p: 0.0,
                   numpy=lambda p, inp, out: (lambda v=_slab_view(p, inp["x"]): np.copyto(out, v)),
                   torch=_slab_torch)
