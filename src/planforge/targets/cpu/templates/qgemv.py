"""GEMV with quantised weights: y = act(x @ deq(W) + bias), x fp32 [K], W in bf16, int8 or int4.

The weights come packed in panels of ``jb * vec`` columns (``planforge.quant.pack``),
padded to whole panels, so each block of columns streams one contiguous region
and no column needs a scalar tail. Each weight is widened to fp32 in registers
and multiplied in fp32 (weight-only quantisation: x is never rounded):

- bf16: the 16 bits shifted into the top of an fp32;
- int8: sign-extended and converted; the channel's scale multiplies the finished sum once;
- int4: two rows per byte, each nibble sign-extended by a shift pair; the sum of
  each block of ``qblock`` rows is scaled before it joins the channel's total.

The widening is vpmovsxbd/vpmovzxwd then vcvtdq2ps, named as intrinsics for the
vector widths that have them (AVX-512 at 16 lanes, AVX2 at 8, SSE4.1 at 4) and
plain C elsewhere; ``vec`` 1 is scalar C.

Knobs (beside the fp32 GEMV's vec, jb, ksplit, unroll, threads): ``wfmt`` and
``qblock`` (int4's block size along K).
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ....quant import INT4_BLOCKS, Packed, dequantise, packed, quantise_activations, variant, variant_knobs
from ....quant.pack import quantised as quantised_weights
from ....space import Space, categorical
from .common import epi_code, header, struct_call
from .parfor import PARFOR_C


class QGemvArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("w", ctypes.c_void_p), ("scales", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p), ("N", ctypes.c_int), ("K", ctypes.c_int),
                ("threads", ctypes.c_int), ("colsum", ctypes.c_void_p)]


_ELEM = {"bf16": "uint16_t", "int8": "int8_t", "int4": "uint8_t"}

# widening loads: a vector (or one value when V == 1) of fp32 weights from the packed store
LOADS = r"""
#if V > 1
typedef uint32_t vu32 __attribute__((vector_size(V * 4)));
/* widen V int8 (sign) or uint16 (zero) to int32 lanes: GCC 12 scalarises __builtin_convertvector from
   narrow lanes, so the x86 widening moves are named where the vector width has them */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if V == 16 && defined(__AVX512F__)
static inline vi widen_s8(const void *p) { return (vi)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline vi widen_u16(const void *p) { return (vi)_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)); }
#elif V == 8 && defined(__AVX2__)
static inline vi widen_s8(const void *p) { return (vi)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline vi widen_u16(const void *p) { return (vi)_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)); }
#elif V == 4 && defined(__SSE4_1__)
static inline vi widen_s8(const void *p) { int32_t u; memcpy(&u, p, 4); return (vi)_mm_cvtepi8_epi32(_mm_cvtsi32_si128(u)); }
static inline vi widen_u16(const void *p) { return (vi)_mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)p)); }
#else
static inline vi widen_s8(const void *p) { vi t; for (int i = 0; i < V; i++) t[i] = ((const int8_t *)p)[i]; return t; }
static inline vi widen_u16(const void *p) { vi t; for (int i = 0; i < V; i++) t[i] = ((const uint16_t *)p)[i]; return t; }
#endif
static inline vf w_bf16(const uint16_t *p) { return (vf)(widen_u16(p) << 16); }
static inline vf w_int8(const int8_t *p) { return __builtin_convertvector(widen_s8(p), vf); }
static inline void w_int4(const uint8_t *p, vf *lo, vf *hi) {
    vi t = widen_s8(p);
    *lo = __builtin_convertvector((t << 28) >> 28, vf);
    *hi = __builtin_convertvector(t >> 4, vf);
}
#else
static inline vf w_bf16(const uint16_t *p) { uint32_t u = (uint32_t)*p << 16; float f; memcpy(&f, &u, 4); return f; }
static inline vf w_int8(const int8_t *p) { return (float)*p; }
static inline void w_int4(const uint8_t *p, vf *lo, vf *hi) {
    int t = (int8_t)*p;
    *lo = (float)((int32_t)((uint32_t)t << 28) >> 28);
    *hi = (float)(t >> 4);
}
#endif
"""


def _acc_decl(ks: int, jb: int, name: str) -> str:
    return "\n".join("    " + " ".join(f"vf {name}{s}_{v} = vset(0.0f);" for v in range(jb)) for s in range(ks))


def _dense_loop(fmt: str, ks: int, jb: int, unroll: int) -> list[str]:
    """bf16 / int8: rows k of the panel ``wp`` ([K][JBV]) into accumulators a{s}_{v}, set s over its own
    contiguous chunk of K (``ksplit`` streams from memory, as the fp32 GEMV's)."""
    load = "w_bf16" if fmt == "bf16" else "w_int8"
    step = lambda kk, s: f"{{ vf xv = vset(x[{kk}]); " + " ".join(  # noqa: E731
        f"a{s}_{v} = xv * {load}(wp + (long)({kk}) * JBV + {v} * V) + a{s}_{v};" for v in range(jb)) + " }"
    return [_acc_decl(ks, jb, "a"), f"    const int Kc = K / {ks};", f"    #pragma GCC unroll {unroll}",
            "    for (int k = 0; k < Kc; k++) {",
            *(f"        {step(f'k + {s} * Kc' if s else 'k', s)}" for s in range(ks)),
            "    }", f"    for (int k = {ks} * Kc; k < K; k++) {step('k', 0)}"]


def _int4_loop(ks: int, jb: int, unroll: int) -> list[str]:
    """int4: per block of QB rows, pairs of rows (one byte each column) into b{s}_{v}, then scaled into a0_{v}."""
    def pair(t, s):
        return (f"{{ vf xl = vset(x[{t}]), xh = vset(x[{t} + 1]); " + " ".join(
            f"{{ vf lo, hi; w_int4(wp + (long)(({t}) >> 1) * JBV + {v} * V, &lo, &hi); "
            f"b{s}_{v} = xl * lo + b{s}_{v}; b{s}_{v} = xh * hi + b{s}_{v}; }}" for v in range(jb)) + " }")
    odd = ("{ vf xl = vset(x[t]); " + " ".join(
        f"{{ vf lo, hi; w_int4(wp + (long)(t >> 1) * JBV + {v} * V, &lo, &hi); (void)hi; "
        f"b0_{v} = xl * lo + b0_{v}; }}" for v in range(jb)) + " }")
    L = [_acc_decl(1, jb, "a"), "    const float *sb = sp;",
         "    for (int kb = 0; kb < K; kb += QB, sb += JBV) {",
         "        const int kend = kb + QB < K ? kb + QB : K;",
         _acc_decl(ks, jb, "    b"), "        int t = kb;",
         f"        #pragma GCC unroll {unroll}",
         f"        for (; t + {2 * ks} <= kend; t += {2 * ks}) {{",
         *(f"            {pair(f't + {2 * s}', s)}" for s in range(ks)),
         "        }",
         f"        for (; t + 2 <= kend; t += 2) {pair('t', 0)}",
         f"        if (t < kend) {odd}"]
    for v in range(jb):
        tot = " + ".join(f"b{s}_{v}" for s in range(ks))
        L.append(f"        a0_{v} = ({tot}) * vload(sb + {v} * V) + a0_{v};")
    L.append("    }")
    return L


def block_source(knobs: dict[str, Any]) -> str:
    """``qblock(x, wp, sp, bias, y, N, K, j0, epi)``: the ``jb * V`` columns of one panel from ``j0``."""
    fmt, jb, ks, unroll = knobs["wfmt"], knobs["jb"], knobs["ksplit"], knobs["unroll"]
    elem = _ELEM[fmt]
    L = [f"static inline void qblock(const float *restrict x, const {elem} *restrict wp, const float *restrict sp,"
         " const float *restrict bias, float *restrict y, int N, int K, int j0, int epi) {", "    (void)sp;"]
    if fmt == "int4":
        L += _int4_loop(ks, jb, unroll)
        sums = {v: f"a0_{v}" for v in range(jb)}
    else:
        L += _dense_loop(fmt, ks, jb, unroll)
        sums = {v: " + ".join(f"a{s}_{v}" for s in range(ks)) for v in range(jb)}
        if fmt == "int8":  # one scale per channel, applied to the finished sum
            sums = {v: f"({t}) * vload(sp + j0 + {v} * V)" for v, t in sums.items()}
    # the last panel may be partly padding: its results go through a buffer, only the real columns out
    return "\n".join(L + _store(jb, sums))


# int8 weights and dynamic int8 activations: x quantised once per call (asymmetric u8 with a zero point, as ONNX
# Runtime's dynamic quantisation: 255 steps over the range the input spans, so a one-sided input such as a
# SwiGLU's or a ReLU's output gets twice the resolution of a symmetric 127), each column's 4 consecutive rows
# side by side, int32 sums; the zero point is undone with each channel's sum of values:
# y = sx * sw * (acc - zp * colsum). The products of 4 per lane are one u8 x s8 dot-product instruction where
# the CPU has VNNI. AVX2 without it (Zen 3) widens both sides to int16 and multiplies-adds pairs (vpmaddwd),
# which is exact for the full 8 bits of x, where vpmaddubsw's 16-bit pair sums saturate (255 * 127 * 2 > 32767;
# ONNX Runtime's AVX2 u8 x s8 path uses it and offers 7-bit weights against that): each step leaves a column's
# two pair sums in neighbouring lanes of two accumulators, added once at the end (``fold``).
# ``vacc`` is the accumulator, ``VACC0`` its zero, ``fold`` its int32 sum per column.
DOT = r"""
#if V == 16 && defined(__AVX512VNNI__)
typedef vi vacc;
static inline vacc dot4(vacc acc, uint32_t x4, const int8_t *w) {
    return (vi)_mm512_dpbusd_epi32((__m512i)acc, _mm512_set1_epi32((int)x4), _mm512_loadu_si512((const void *)w));
}
#elif V == 8 && defined(__AVX512VNNI__) && defined(__AVX512VL__)
typedef vi vacc;
static inline vacc dot4(vacc acc, uint32_t x4, const int8_t *w) {
    return (vi)_mm256_dpbusd_epi32((__m256i)acc, _mm256_set1_epi32((int)x4), _mm256_loadu_si256((const __m256i *)w));
}
#elif V == 8 && defined(__AVXVNNI__)
typedef vi vacc;
static inline vacc dot4(vacc acc, uint32_t x4, const int8_t *w) {
    return (vi)_mm256_dpbusd_avx_epi32((__m256i)acc, _mm256_set1_epi32((int)x4), _mm256_loadu_si256((const __m256i *)w));
}
#elif V == 8 && defined(__AVX2__)
#define DOT_MADD16 1
/* lo: columns 0-3, hi: columns 4-7, two int32 lanes each (rows 0+1 and rows 2+3 of the group of 4) */
typedef struct { __m256i lo, hi; } vacc;
static inline vacc dot4(vacc acc, uint32_t x4, const int8_t *w) {
    const __m256i xs = _mm256_cvtepu8_epi16(_mm_set1_epi32((int)x4));  /* x0..x3 as int16, four times */
    const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
    const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16)));
    acc.lo = _mm256_add_epi32(acc.lo, _mm256_madd_epi16(w0, xs));
    acc.hi = _mm256_add_epi32(acc.hi, _mm256_madd_epi16(w1, xs));
    return acc;
}
static inline vi fold(vacc a) {
    /* per 128-bit half: columns 0 1 4 5 | 2 3 6 7; the quadwords in order: 0 1 2 3 4 5 6 7 */
    return (vi)_mm256_permute4x64_epi64(_mm256_hadd_epi32(a.lo, a.hi), 0xD8);
}
#define VACC0 ((vacc){ _mm256_setzero_si256(), _mm256_setzero_si256() })
#else
typedef vi vacc;
static inline vacc dot4(vacc acc, uint32_t x4, const int8_t *w) {
    for (int i = 0; i < V; i++) {
        int32_t s = 0;
        for (int t = 0; t < 4; t++) s += (int32_t)((x4 >> (8 * t)) & 255) * w[4 * i + t];
        acc[i] += s;
    }
    return acc;
}
#endif
#ifndef DOT_MADD16
static inline vi fold(vacc a) { return a; }
#define VACC0 ((vacc){0})
#endif
static inline vi vload_i(const int32_t *p) { vi v; memcpy(&v, p, sizeof v); return v; }
/* x -> u8, asymmetric over [min(x, 0), max(x, 0)] in 255 steps: u = round(x / sx) + zp, zero exact at zp; padded
   with zp to whole groups of 4; returns the scale, *zp the zero point */
static float quantise_x(const float *x, uint8_t *xq, int K, int K4, int *zp) {
    float lo = 0.0f, hi = 0.0f;
    for (int k = 0; k < K; k++) { lo = x[k] < lo ? x[k] : lo; hi = x[k] > hi ? x[k] : hi; }
    float inv = 0.0f, sx = 1.0f;
    int z = 0;
    if (hi > lo) { inv = 255.0f / (hi - lo); sx = (hi - lo) / 255.0f; z = (int)nearbyintf(-lo * inv); }
    for (int k = 0; k < K; k++) {
        float r = nearbyintf(x[k] * inv) + (float)z;
        xq[k] = (uint8_t)(r > 255.0f ? 255.0f : (r < 0.0f ? 0.0f : r));
    }
    for (int k = K; k < 4 * K4; k++) xq[k] = (uint8_t)z;
    *zp = z;
    return sx;
}
"""


def a8_block_source(knobs: dict[str, Any]) -> str:
    jb, ks, unroll = knobs["jb"], knobs["ksplit"], knobs["unroll"]
    step = lambda t, s: " ".join(  # noqa: E731
        f"a{s}_{v} = dot4(a{s}_{v}, xq[{t}], wp + ((long)({t}) * JBV + {v} * V) * 4);" for v in range(jb))
    L = ["static inline void qblock(const uint32_t *restrict xq, const int8_t *restrict wp, const float *restrict sp,"
         " const int32_t *restrict cs, const float *restrict bias, float *restrict y, int N, int K4, int j0,"
         " float sx, int zp, int epi) {",
         *("    " + " ".join(f"vacc a{s}_{v} = VACC0;" for v in range(jb)) for s in range(ks)),
         f"    const int K4c = K4 / {ks};",  # set s over its own chunk of K: ksplit streams from memory
         f"    #pragma GCC unroll {unroll}", "    for (int t = 0; t < K4c; t++) {",
         *(f"        {step(f't + {s} * K4c' if s else 't', s)}" for s in range(ks)), "    }",
         f"    for (int t = {ks} * K4c; t < K4; t++) {{ {step('t', 0)} }}"]
    sums = {v: f"__builtin_convertvector(({' + '.join(f'fold(a{s}_{v})' for s in range(ks))}) - zp * "
               f"vload_i(cs + j0 + {v} * V), vf) * (vload(sp + j0 + {v} * V) * sx)" for v in range(jb)}
    return "\n".join(L + _store(jb, sums))


def _store(jb: int, sums: dict[int, str]) -> list[str]:
    """The end of a block: each vector's sum through the epilogue into y (the last panel through a buffer)."""
    L = ["    float yb[JBV], bb[JBV];",
         "    const int full = j0 + JBV <= N;",
         "    float *yo = full ? y + j0 : yb;",
         "    const float *bo = bias && full ? bias + j0 : bb;",
         "    if (!full) for (int i = 0; i < JBV; i++) bb[i] = bias && j0 + i < N ? bias[j0 + i] : 0.0f;"]
    for v in range(jb):
        L.append(f"    {{ vf t = {sums[v]}; vf b = epi ? vload(bo + {v} * V) : vset(0.0f);"
                 f" vstore(yo + {v} * V, vepi(t, b, epi)); }}")
    return L + ["    if (!full) for (int i = 0; j0 + i < N; i++) y[j0 + i] = yb[i];", "}"]


_MAIN = r"""
typedef struct { const float *x; const void *w; const float *scales, *bias; float *y; int N, K, threads;
                 const int32_t *colsum; } qgemv_args;
typedef struct { const qgemv_args *g; const ELEM *w; CTX_FIELDS } qgemv_ctx;

static void qgemv_panels(const void *c, int lo, int hi) {  /* panels [lo, hi) of one call, on any thread */
    const qgemv_ctx *q = (const qgemv_ctx *)c;
    const qgemv_args *g = q->g;
    const ELEM *w = q->w;
    const int N = g->N, K = g->K;
    CTX_READ
    for (int b = lo; b < hi; b++)
        CALL;
}

void pf_qgemv(const qgemv_args *g) {
    const int N = g->N, K = g->K, npanel = (N + JBV - 1) / JBV;
    const ELEM *w = (const ELEM *)g->w;
    PREPARE
    qgemv_ctx q = { g, w CTX_INIT };
    (void)N; (void)K;
    pf_parfor(npanel, g->threads, qgemv_panels, &q);
}
"""


def source(knobs: dict[str, Any], epilogue: str) -> str:
    fmt = knobs["wfmt"]
    a8 = act_int8(knobs)
    head = (f"#define V {knobs['vec']}\n#define JB {knobs['jb']}\n#define JBV (JB * V)\n"
            f"#define EPI {epi_code(epilogue)}\n#define QB {int(knobs.get('qblock', 32))}")
    if a8:
        prepare = ("const int K4 = (K + 3) / 4;\n    static __thread uint8_t *xq; static __thread size_t cap;\n"
                   "    if (cap < (size_t)K4 * 4) { free(xq); xq = aligned_alloc(64, ((size_t)K4 * 4 + 63) / 64 * 64);"
                   " cap = xq ? (size_t)K4 * 4 : 0; }\n    int zp;\n    const float sx = quantise_x(g->x, xq, K, K4, &zp);\n"
                   "    const uint32_t *x4 = (const uint32_t *)xq;  /* the caller's: every thread reads it */")
        # the quantised x, its scale and zero point, made once by the caller, go to every thread's panels
        ctx = ("const uint32_t *x4; float sx; int zp, K4;", ", x4, sx, zp, K4",
               "const uint32_t *x4 = q->x4; const float sx = q->sx; const int zp = q->zp, K4 = q->K4;")
        call = ("qblock(x4, w + (long)b * K4 * 4 * JBV, g->scales, g->colsum, g->bias, g->y, N, K4,"
                " b * JBV, sx, zp, EPI)")
        body = [DOT, a8_block_source(knobs)]
    else:
        per_panel = "((long)K * JBV)" if fmt != "int4" else "((long)((K + QB - 1) / QB) * QB / 2 * JBV)"
        scales = "g->scales + (long)b * ((K + QB - 1) / QB) * JBV" if fmt == "int4" else "g->scales"
        prepare, ctx = "", ("", "", "")
        call = f"qblock(g->x, w + (long)b * {per_panel}, {scales}, g->bias, g->y, N, K, b * JBV, EPI)"
        body = [block_source(knobs)]
    main = (_MAIN.replace("ELEM", _ELEM[fmt]).replace("PREPARE", prepare).replace("CALL", call)
            .replace("CTX_FIELDS", ctx[0]).replace("CTX_INIT", ctx[1]).replace("CTX_READ", ctx[2]))
    return "\n".join([head, header(), PARFOR_C, LOADS, *body, main])


def act_int8(knobs: dict[str, Any]) -> bool:
    return knobs.get("act", "fp32") == "int8" and knobs.get("wfmt") == "int8"


def pack_for(W: np.ndarray, knobs: dict[str, Any]) -> Packed:
    """``W`` quantised and packed for these knobs (cached: every candidate of one format and panel shares it)."""
    return packed(W, knobs["wfmt"], knobs["jb"] * knobs["vec"], knobs.get("qblock"), 4 if act_int8(knobs) else 1)


def quantised(knobs: dict[str, Any]) -> bool:
    """Whether a GEMV candidate reads its weights in a format other than fp32 (no ``wfmt`` knob: fp32)."""
    return knobs.get("wfmt", "fp32") != "fp32"


def variants(lim, activations: bool = True) -> tuple[str, ...]:
    """The quantised variants (``planforge.quant.variant``) this machine runs: every format and int4 block, and
    (``activations``) int8 weights with dynamic int8 activations where a vector width has a u8 x s8 dot
    product (VNNI, or AVX2's multiply-adds)."""
    return ("fp32", "bf16", "int8", *(("int8+a8",) if lim.dot_i8_lanes and activations else ()),
            *(variant("int4", b) for b in INT4_BLOCKS))


def with_formats(space: Space, names: tuple[str, ...], dot_lanes: tuple[int, ...] = (),
                 packed: str = "w_layout == 'packed'", vnni: bool = True) -> Space:
    """``space`` (the fp32 GEMV's, or GEMM's) with the weight format as a gene beside its tile knobs: ``wfmt``
    among the formats of the variants ``names``, ``qblock`` (int4's block along K) among their blocks, and
    ``act`` (dynamic int8 activations) when ``int8+a8`` is among them (at the widths ``dot_lanes`` with a dot
    product). A quantised plan always packs its weights (``packed``: the condition that says so in this
    space), and only int4 has a block size, so the restrictions keep one point per distinct kernel. ``vnni``:
    whether the dot product at those widths is one instruction (else AVX2's multiply-adds), for the cost model
    (the constant ``a8_vnni``)."""
    vk = [variant_knobs(n) for n in names]  # QuantError (a ValueError) names an unknown variant
    formats = tuple(dict.fromkeys(k["wfmt"] for k in vk))
    blocks = tuple(dict.fromkeys(k["qblock"] for k in vk if k["wfmt"] == "int4")) or INT4_BLOCKS[:1]
    knobs = [*space.knobs, categorical("wfmt", formats), categorical("qblock", blocks)]
    rules = [*space.restrictions, f"wfmt == 'fp32' or {packed}", f"wfmt == 'int4' or qblock == {blocks[0]}"]
    if "int8+a8" in names and dot_lanes:
        acts = ("fp32", "int8") if "int8" in names else ("int8",)
        knobs.append(categorical("act", acts))
        rules.append(f"act == 'fp32' or (wfmt == 'int8' and vec in {tuple(dot_lanes)!r})")
        if acts == ("int8",):
            rules.append("wfmt != 'int8' or act == 'int8'")  # weight-only int8 is over budget
        return Space(knobs, rules, constants={**space.constants, "a8_vnni": bool(vnni)})
    return Space(knobs, rules, constants=space.constants)


def reference_inputs(knobs: dict[str, Any], inputs: dict[str, np.ndarray], weight: str = "W", act: str = "x"):
    """``(key, inputs())``: the inputs with the weights a candidate of these knobs really multiplies by
    (dequantised; with dynamic int8 activations, the activations too), made when called, to check the kernel
    against; None for fp32. The key names the variant, so that a caller can cache them."""
    if not quantised(knobs):
        return None
    fmt, block = knobs["wfmt"], knobs.get("qblock") if knobs["wfmt"] == "int4" else None
    a8 = act_int8(knobs)

    def make():
        out = {**inputs, weight: dequantise(quantised_weights(inputs[weight], fmt, block), np.float32)}
        if a8:
            q, scale = quantise_activations(inputs[act])
            out[act] = q.astype(np.float32) * scale
        return out

    return variant(fmt, block, "int8" if a8 else "fp32"), make


def bind(lib: ctypes.CDLL, knobs: dict[str, Any], x, W, bias, y):
    K, N = W.shape
    pk = pack_for(W, knobs)
    args = QGemvArgs(x.ctypes.data, pk.w.ctypes.data, pk.scales.ctypes.data if pk.scales is not None else None,
                     bias.ctypes.data if bias is not None else None, y.ctypes.data, N, K, knobs["threads"],
                     pk.colsum.ctypes.data if pk.colsum is not None else None)
    return struct_call(lib.pf_qgemv, args, (x, W, pk, bias, y))


__all__ = ["DOT", "LOADS", "QGemvArgs", "a8_block_source", "act_int8", "bind", "block_source", "pack_for", "quantised", "reference_inputs", "source",
           "variants", "with_formats"]
