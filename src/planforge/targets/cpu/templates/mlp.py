"""Fused batch-1 MLP template: every layer of a chain in one call, on a persistent weight-stationary pool.

y = act_L(... act_1(x @ W_1 + b_1) ... @ W_L + b_L) for a single row. Each
layer is a GEMV made of the GEMV template's blocks; the layer sizes,
activations and knobs are compile-time constants.

With ``threads`` T > 1 the plan owns a pool of T - 1 pinned worker threads
(``pool.py``; the caller is thread 0), started when the plan is bound and
stopped when it is freed. Each thread owns a slice of every layer's weights,
packed once at bind time by the thread itself into its own memory, so that it
stays in that core's L2 across calls (weight-stationary). Per layer the slice
is along N (``split<i> = "n"``: the thread computes a range of output columns
for the whole input) or along K (``"k"``: a range of input rows for every
column, giving partial sums that the next layer's threads add up, with the
bias and activation, as they read them). One barrier per layer; the last
layer's split-K sums are added by the caller after the call. ``spin_us``:
how long an idle worker spins before it sleeps (a control loop that calls
more often than that never pays a wake-up; 0: it sleeps as soon as a call
ends, the only value for a ``shared`` problem, a step of a partitioned model
whose next call comes after every other part has run). ``pin``: 1 pins each worker to
its own physical core, 0 leaves placement to the scheduler (see ``pool.py``).
``threads = 1`` runs on the caller alone, no pool.

Weight formats (``wfmt<i>`` per layer, beside the tiles; only in the space when an
accuracy budget is stated, ``with_formats``): fp32, or bf16 / int8 per output
channel / int4 by blocks of ``qblock`` rows, as the quantised GEMV
(``qgemv.py``) reads them: each thread packs its slice of the quantised values
into panels of ``jb * vec`` columns (padded with zero weights), widens them to
fp32 in registers and accumulates in fp32; activations stay fp32. A split-K
slice of an int4 layer starts on a block boundary, so that each thread's blocks
carry their own scales. Where a vector width has an exact u8 x s8 dot product
(VNNI; or AVX2's int16 multiply-adds at 8 lanes, ``qgemv.DOT``),
``act = "int8"`` also quantises each int8 layer's input (per call, asymmetric over
the whole input, as the quantised GEMV's ``int8+a8`` does) and multiplies in
int32, four rows a lane; such a layer is split along N, so that every thread
quantises the same whole input with the same scale.

Exported C (``PF_API`` defaults to external linkage; the C export includes
this source with ``PF_API`` set to ``static``):

- ``void *pf_mlp_create(const float *const *W, const float *const *B)``:
  W[i] is layer i's [K][N] row-major weights, B[i] its [N] bias (both copied);
  NULL when a thread or an allocation fails (fp32 layers only).
- ``void *pf_mlp_create_q(const void *const *W, const float *const *S, const float *const *B)``:
  the same with each layer's weights in its format: fp32 values, bf16 bits
  (uint16), int8 values, or int4 values held one per int8 in [-7, 7]; S[i] its
  scales (int8: [N]; int4: [ceil(K / qblock)][N]; NULL otherwise).
- ``void pf_mlp_run(void *h, const float *x, float *y)``; ``pf_mlp_bind(h, x,
  y)`` then ``pf_mlp_go(h)``: the same with pointers bound once.
- ``void pf_mlp_destroy(void *h)``: stops and joins the workers, frees all.

Compile-time knobs: vec, jb, ksplit, unroll, threads, split0..split<L-1>, spin_us, pin, and with formats
wfmt0..wfmt<L-1>, qblock and act.
"""
from __future__ import annotations

import ctypes
import weakref
from typing import Any, Sequence

import numpy as np

from ....ops.kernel import epilogue_of_act
from ....quant import INT4_BLOCKS, variant_knobs
from ....quant.pack import quantised as quantised_weights
from ....space import Space, categorical
from .common import epi_code, header
from .gemv import block_source, tail_source
from .pool import POOL_BODY, POOL_HEAD
from . import qgemv

SPIN_US = (1000, 100, 20000, 0)  # the first is what one thread (no pool) is canonicalised to
FORMAT_CODES = {"fp32": 0, "bf16": 1, "int8": 2, "int4": 3}
A8 = 4  # a layer's code for int8 weights with dynamic int8 activations


def format_names(layers: Sequence[tuple[int, int, str]]) -> list[str]:
    return [f"wfmt{i}" for i in range(len(layers))]


def formats_of(layers: Sequence[tuple[int, int, str]], knobs: dict[str, Any]) -> list[str]:
    """Each layer's weight format (``fp32`` where the knobs have none)."""
    fs = [knobs.get(n, "fp32") for n in format_names(layers)]
    bad = [f for f in fs if f not in FORMAT_CODES]
    if bad:
        raise ValueError(f"weight formats take {', '.join(FORMAT_CODES)}, got {bad}")
    return fs


def quantised(layers, knobs: dict[str, Any]) -> bool:
    return any(f != "fp32" for f in formats_of(layers, knobs))


def layer_codes(layers, knobs: dict[str, Any]) -> list[int]:
    """Each layer's kernel: its format's code, or ``A8`` for int8 weights when ``act`` is ``int8``."""
    a8 = knobs.get("act", "fp32") == "int8"
    return [A8 if a8 and f == "int8" else FORMAT_CODES[f] for f in formats_of(layers, knobs)]


def split_names(layers: Sequence[tuple[int, int, str]]) -> list[str]:
    return [f"split{i}" for i in range(len(layers))]


def spins(shared: bool) -> tuple[int, ...]:
    """The ``spin_us`` values a fused MLP may take: every one alone, none but 0 for a ``shared`` problem."""
    return (0,) if shared else SPIN_US


def space(layers: Sequence[tuple[int, int, str]], profile, shared: bool = False) -> Space:
    """``layers``: (K, N, act) per layer, first to last; ``profile``: the templates' ``Limits``; ``shared``: the
    problem's (its pool sleeps at once)."""
    spin = spins(shared)
    lanes = profile.vector_lanes
    vecs = tuple(v for v in (4, 8, 16) if v <= lanes) or (1,)
    n_min = min(n for _, n, _ in layers)
    return Space(
        [categorical("vec", vecs), categorical("jb", (1, 2, 4, 8)), categorical("ksplit", (1, 2, 4)),
         categorical("unroll", (1, 2, 4)), categorical("threads", tuple(range(1, profile.physical_cores + 1))),
         *[categorical(s, ("n", "k")) for s in split_names(layers)],
         categorical("spin_us", spin), categorical("pin", (1, 0))],
        ["jb * ksplit + jb + 1 <= vregs", "jb * vec <= max(vec, n_min)",
         # one thread has no pool to spin: every spin bound is the same plan
         f"threads > 1 or (spin_us == {spin[0]} and pin == 1)"],
        constants={"vregs": profile.vector_registers, "n_min": n_min},
    )


def variants(lim) -> tuple[str, ...]:
    """The weight formats the fused MLP reads, and int8 weights with dynamic int8 activations (``int8+a8``)
    where a vector width has a u8 x s8 dot product."""
    return ("fp32", "bf16", "int8", *(("int8+a8",) if lim.dot_i8_lanes else ()), *(f"int4:{b}" for b in INT4_BLOCKS))


def with_formats(space: Space, layers: Sequence[tuple[int, int, str]], names: Sequence[str],
                 dot_lanes: Sequence[int] = (), vnni: bool = True) -> Space:
    """``space`` with each layer's weight format a gene (``wfmt<i>``) among the variants ``names`` (fp32, bf16,
    int8, int8+a8, int4:BLOCK; ``variant_knobs`` refuses others), ``qblock`` among their int4 blocks and, with
    ``int8+a8`` among them and ``dot_lanes`` (the vector widths with a u8 x s8 dot product), ``act``: whether
    int8 layers quantise their input too. Points that are one kernel under two names are left out: no int4 layer
    keeps the first block, no int8 layer keeps fp32 activations. ``vnni``: as for ``qgemv.with_formats``."""
    vk = [variant_knobs(n) for n in names]
    a8 = any(k["act"] == "int8" for k in vk)
    if a8 and not dot_lanes:
        raise ValueError("int8+a8 needs a vector width with a u8 x s8 dot product, and this machine has none")
    formats = tuple(dict.fromkeys(k["wfmt"] for k in vk))
    blocks = tuple(dict.fromkeys(k["qblock"] for k in vk if k["wfmt"] == "int4")) or INT4_BLOCKS[:1]
    fn = format_names(layers)
    knobs = [*space.knobs, *[categorical(n, formats) for n in fn], categorical("qblock", blocks)]
    any4 = " or ".join(f"{n} == 'int4'" for n in fn)
    rules = [*space.restrictions, f"{any4} or qblock == {blocks[0]}"] if len(blocks) > 1 else list(space.restrictions)
    if a8:
        weight_only = any(k["wfmt"] == "int8" and k["act"] == "fp32" for k in vk)
        knobs.append(categorical("act", ("fp32", "int8") if weight_only else ("int8",)))
        any8 = " or ".join(f"{n} == 'int8'" for n in fn)
        rules += [f"act == 'fp32' or (vec in {tuple(dot_lanes)!r} and ({any8}))",
                  # a layer with int8 activations is split along N: every thread quantises the whole input
                  *(f"act == 'fp32' or {n} != 'int8' or {s} == 'n'" for n, s in zip(fn, split_names(layers)))]
        if not weight_only:
            rules.append(f"act == 'int8' or not ({any8})")
        return Space(knobs, rules, constants={**space.constants, "a8_vnni": bool(vnni)})
    return Space(knobs, rules, constants=space.constants)


def defaults(layers: Sequence[tuple[int, int, str]], lim, shared: bool = False) -> dict[str, Any]:
    """Where the search starts: all cores when each one's weight slice is worth more than a barrier (larger
    than its L1, so it would stream from L2 or beyond), split along N where every thread gets whole blocks of
    columns, else along K; measurements decide."""
    vec = max(x for x in (1, 4, 8, 16) if x <= lim.vector_lanes)
    n_min = min(n for _, n, _ in layers)
    jb = 2 if 2 * vec <= max(vec, n_min) else 1  # the space's rule: no block wider than the narrowest layer
    wbytes = 4 * sum(k * n for k, n, _ in layers)
    cores = max(1, lim.physical_cores)
    threads = cores if cores > 1 and wbytes / cores > lim.caches["L1d"] else 1
    d = {"vec": vec, "jb": jb, "ksplit": 2, "unroll": 2, "threads": threads, "spin_us": spins(shared)[0], "pin": 1}
    for s, (k, n, _) in zip(split_names(layers), layers):
        d[s] = "n" if threads == 1 or n // (jb * vec) >= 2 * threads else "k"
    return d


def source(layers: Sequence[tuple[int, int, str]], knobs: dict[str, Any]) -> str:
    """The C of the fused MLP for ``layers`` at ``knobs`` (see the module docstring for its functions)."""
    T, L = int(knobs.get("threads", 1)), len(layers)
    if T < 1:
        raise ValueError(f"threads must be at least 1, got {T}")
    splits = [knobs.get(s, "n") for s in split_names(layers)]
    bad = [s for s in splits if s not in ("n", "k")]
    if bad:
        raise ValueError(f"split knobs take 'n' or 'k', got {bad}")
    fmts = formats_of(layers, knobs)
    codes = layer_codes(layers, knobs)
    bad = [i for i, (c, s) in enumerate(zip(codes, splits)) if c == A8 and s != "n"]
    if bad:
        raise ValueError(f"layers {bad} take int8 activations and must be split along N")
    qb = int(knobs.get("qblock", INT4_BLOCKS[0]))
    if qb not in INT4_BLOCKS:
        raise ValueError(f"qblock must be one of {INT4_BLOCKS}, got {qb}")
    widest = max(max(k, n) for k, n, _ in layers)
    arr = lambda xs: "{" + ", ".join(str(x) for x in xs) + "}"  # noqa: E731
    head = f"""#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* CPU sets, sched_getcpu and thread affinity (pool.py) */
#endif
#define V {knobs['vec']}
#define JBV ({knobs['jb']} * V)
#define PT {T}
#define NL {L}
#define STAGES NL
#define SPIN_NS ({int(knobs.get('spin_us', SPIN_US[0]))}L * 1000L)
#define PIN {int(knobs.get('pin', 1))}  /* 1: workers pinned one per physical core */
#define WIDEST {widest}
#ifndef PF_API
#define PF_API
#endif
static const int LK[NL] = {arr(k for k, _, _ in layers)};
static const int LN[NL] = {arr(n for _, n, _ in layers)};
static const int LEPI[NL] = {arr(epi_code(epilogue_of_act(a)) for _, _, a in layers)};
static const int LSPLIT[NL] = {arr(int(s == 'k') for s in splits)};  /* 1: this layer is split along K */
static const int LFMT[NL] = {arr(codes)};  /* 0 fp32, 1 bf16, 2 int8, 3 int4, 4 int8 with int8 activations */
#define QB {qb}
#define QUANT {int(any(codes))}
#define A8 {int(A8 in codes)}
"""
    quant = []
    if any(codes):  # the quantised GEMV's panel kernels, one per format
        quant = [qgemv.LOADS] + [qgemv.block_source({**knobs, "wfmt": f}).replace("qblock(", f"qblock_{f}(")
                                 for f in ("bf16", "int8", "int4")]
    if A8 in codes:
        quant += [qgemv.DOT, qgemv.a8_block_source(knobs).replace("qblock(", "qblock_a8(")]
    return "\n".join([head, header(), block_source({**knobs, "w_layout": "packed"}), tail_source(), *quant,
                      POOL_HEAD, _STRUCT, POOL_BODY, _MLP])


_STRUCT = r"""
struct pool {
    POOL_FIELDS
    const float *x; float *y;           /* this call's input and output */
    const float *bx; float *by;         /* the bound ones (pf_mlp_bind) */
    const void *const *wsrc; const float *const *ssrc, *const *bsrc;  /* the caller's, read while packing */
    float *bias[NL];
    void *w[PT][NL]; float *sc[PT][NL]; int lo[PT][NL], hi[PT][NL];
    uint8_t *xq[PT];                    /* a thread's input quantised to u8, for layers with int8 activations */
    float *act[2];                      /* split-N layers' outputs, shared; alternate by layer */
    float *part[2][PT];                 /* split-K layers' partial sums per thread; alternate by layer */
    float *xin[PT];                     /* a thread's input, added up from a split-K layer's partials */
    void *mem[PT]; float *shared;
};
"""

_MLP = r"""
static inline long rup(long n) { return (n + 15) / 16 * 16; }  /* floats: 64-byte aligned pieces */

#ifdef __linux__
#include <sys/mman.h>
#endif
/* a thread's weights of 2 MiB or more in huge pages (transparent huge pages in their madvise mode; what
   ``templates/scratch.py``'s ``Pages`` does for the other templates' packed weights) */
static void *mlp_alloc(size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const size_t huge = (size_t)2 << 20;
    if (n >= huge) {
        const size_t sz = (n + huge - 1) / huge * huge;
        void *m = aligned_alloc(huge, sz);
        if (m) madvise(m, sz, MADV_HUGEPAGE);
        return m;
    }
#endif
    return aligned_alloc(64, n);
}

/* thread t's slice of layer i: output columns (split N, whole blocks of JBV) or input rows (split K) */
static void slice_of(int i, int t, int *lo, int *hi) {
    const int K = LK[i], N = LN[i];
    if (LSPLIT[i]) {  /* an int4 layer's slices start on its blocks of QB rows */
        const int a = LFMT[i] == 3 ? QB : (LFMT[i] == 4 ? 4 : 1);
        *lo = t == 0 ? 0 : (int)((long)t * K / PT) / a * a;
        *hi = t == PT - 1 ? K : (int)((long)(t + 1) * K / PT) / a * a;
        return;
    }
    const int nblk = N / JBV;
    *lo = (int)((long)t * nblk / PT) * JBV;
    *hi = t == PT - 1 ? N : (int)((long)(t + 1) * nblk / PT) * JBV;
}

/* rows [r0, r1) x columns [c0, c1) of W [K][N] into panels of [rows][JBV] and a row-major tail */
static void pack(const float *W, int N, int r0, int r1, int c0, int c1, float *dst) {
    const int rows = r1 - r0, nb = (c1 - c0) / JBV, tail = c1 - c0 - nb * JBV;
    for (int b = 0; b < nb; b++)
        for (int r = 0; r < rows; r++)
            memcpy(dst + ((long)b * rows + r) * JBV, W + (long)(r0 + r) * N + c0 + b * JBV, JBV * sizeof(float));
    float *t = dst + (long)nb * rows * JBV;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < tail; j++) t[(long)r * tail + j] = W[(long)(r0 + r) * N + c0 + nb * JBV + j];
}

/* y[c0..c1) = epi(x[0..rows) @ panel + bias) for a packed slice */
static inline void mv(const float *x, const float *wp, int rows, int c0, int c1, const float *bias, float *y,
                      int N, int epi) {
    const int nb = (c1 - c0) / JBV;
    for (int b = 0; b < nb; b++) block(x, NULL, wp + (long)b * rows * JBV, bias, y, N, rows, c0 + b * JBV, epi);
    const int j = c0 + nb * JBV;
    if (j < c1) tail(x, wp + (long)nb * rows * JBV, c1 - j, bias, y, j, c1, rows, epi);
}

static inline long rupb(long n) { return (n + 63) / 64 * 64; }  /* bytes: 64-byte aligned pieces */

/* bytes of a slice of layer i (rows x cols of W) as packed, and of its scales */
static void slice_bytes(int i, int rows, int cols, long *wb, long *sb) {
    const long np = (cols + JBV - 1) / JBV, nkb = (rows + QB - 1) / QB;
    switch (LFMT[i]) {
    case 0: *wb = 4L * rows * cols; *sb = 0; break;
    case 1: *wb = 2L * np * rows * JBV; *sb = 0; break;
    case 2: *wb = np * rows * JBV; *sb = 4L * ((LN[i] + JBV - 1) / JBV) * JBV; break;  /* all the channels' scales */
    case 4: *wb = np * ((rows + 3) / 4) * 4 * JBV; *sb = 8L * ((LN[i] + JBV - 1) / JBV) * JBV; break;  /* + sums */
    default: *wb = np * nkb * QB / 2 * JBV; *sb = 4L * np * nkb * JBV; break;
    }
}

#if QUANT
/* rows [r0, r1) x columns [c0, c1) of the quantised Q [K][N] (elements of es bytes) into zero-padded panels */
static void qpack(const void *Q, int es, int N, int r0, int r1, int c0, int c1, char *dst) {
    const int rows = r1 - r0;
    const long np = (c1 - c0 + JBV - 1) / JBV;
    memset(dst, 0, (size_t)(np * rows * JBV * es));
    for (long b = 0; b < np; b++) {
        const int j0 = c0 + (int)b * JBV, w = c1 - j0 < JBV ? c1 - j0 : JBV;
        for (int r = 0; r < rows; r++)
            memcpy(dst + (b * rows + r) * JBV * es, (const char *)Q + ((long)(r0 + r) * N + j0) * es, (size_t)w * es);
    }
}

/* int4: two rows a byte (even row low nibble), rows padded to whole blocks; the blocks' scales per panel */
static void qpack4(const int8_t *Q, const float *S, int N, int r0, int r1, int c0, int c1, uint8_t *dst, float *sd) {
    const int rows = r1 - r0, nkb = (rows + QB - 1) / QB;
    const long np = (c1 - c0 + JBV - 1) / JBV, ph = (long)nkb * QB / 2;
    memset(dst, 0, (size_t)(np * ph * JBV));
    memset(sd, 0, (size_t)(np * nkb * JBV) * sizeof(float));
    for (long b = 0; b < np; b++)
        for (int j = 0; j < JBV && c0 + b * JBV + j < c1; j++) {
            const long c = c0 + b * JBV + j;
            for (int r = 0; r < rows; r++) {
                const uint8_t q = (uint8_t)Q[(long)(r0 + r) * N + c] & 15;
                dst[(b * ph + r / 2) * JBV + j] |= (uint8_t)(r & 1 ? q << 4 : q);
            }
            for (int kb = 0; kb < nkb; kb++) sd[(b * nkb + kb) * JBV + j] = S[(long)(r0 / QB + kb) * N + c];
        }
}

#if A8
/* int8 for the dot product: each column's 4 consecutive rows side by side, [panel][k / 4][JBV][4] (rows padded
   with zeros), and each column's sum of values over the slice's rows (cs, by global column) */
static void qpack_a8(const int8_t *Q, int N, int r0, int r1, int c0, int c1, int8_t *dst, int32_t *cs) {
    const int rows = r1 - r0, K4 = (rows + 3) / 4;
    const long np = (c1 - c0 + JBV - 1) / JBV;
    memset(dst, 0, (size_t)(np * K4 * 4 * JBV));
    for (long b = 0; b < np; b++)
        for (int j = 0; j < JBV && c0 + b * JBV + j < c1; j++) {
            const long c = c0 + b * JBV + j;
            int32_t sum = 0;
            for (int r = 0; r < rows; r++) {
                const int8_t q = Q[(long)(r0 + r) * N + c];
                dst[((b * K4 + r / 4) * JBV + j) * 4 + r % 4] = q;
                sum += q;
            }
            cs[c] = sum;
        }
}
#endif

/* y[c0..c1) = epi(x[0..rows) @ deq(panels) + bias) for a quantised slice */
static inline void qmv(int f, const float *x, const void *wp, const float *sp, int rows, int c0, int c1,
                       const float *bias, float *y, int N, int epi) {
    const long np = (c1 - c0 + JBV - 1) / JBV, nkb = (rows + QB - 1) / QB;
    for (long b = 0; b < np; b++) {
        const int j0 = c0 + (int)b * JBV;
        if (f == 1) qblock_bf16(x, (const uint16_t *)wp + b * rows * JBV, sp, bias, y, N, rows, j0, epi);
        else if (f == 2) qblock_int8(x, (const int8_t *)wp + b * rows * JBV, sp, bias, y, N, rows, j0, epi);
        else qblock_int4(x, (const uint8_t *)wp + b * nkb * QB / 2 * JBV, sp + b * nkb * JBV, bias, y, N, rows, j0, epi);
    }
}
#endif

/* a layer's slice, in its format */
static inline void lmv(struct pool *p, int t, int i, const float *x, int rows, int c0, int c1, const float *bias,
                       float *y, int epi) {
#if A8
    if (LFMT[i] == 4) {  /* the input quantised (the whole of it: this layer is split along N), int32 dot products */
        const int K4 = (rows + 3) / 4, N = LN[i], Np = (N + JBV - 1) / JBV * JBV;
        int zp;
        const float sx = quantise_x(x, p->xq[t], rows, K4, &zp);
        const float *sc = p->sc[t][i];
        const long np = (c1 - c0 + JBV - 1) / JBV;
        for (long b = 0; b < np; b++)
            qblock_a8((const uint32_t *)p->xq[t], (const int8_t *)p->w[t][i] + b * K4 * 4 * JBV, sc,
                      (const int32_t *)(sc + Np), bias, y, N, K4, c0 + (int)b * JBV, sx, zp, epi);
        return;
    }
#endif
#if QUANT
    if (LFMT[i]) { qmv(LFMT[i], x, p->w[t][i], p->sc[t][i], rows, c0, c1, bias, y, LN[i], epi); return; }
#endif
    mv(x, (const float *)p->w[t][i], rows, c0, c1, bias, y, LN[i], epi);
}

/* dst[a..b) = epi(sum over threads of part[par][u] + bias) */
static inline void reduce(struct pool *p, int par, int a, int b, const float *bias, int epi, float *dst) {
    int j = a;
#if V > 1
    for (; j + V <= b; j += V) {
        vf s = vload(p->part[par][0] + j);
        for (int u = 1; u < PT; u++) s += vload(p->part[par][u] + j);
        vstore(dst + j, vepi(s, vload(bias + j), epi));
    }
#endif
    for (; j < b; j++) {
        float s = p->part[par][0][j];
        for (int u = 1; u < PT; u++) s += p->part[par][u][j];
        dst[j] = s_epi(s, bias[j], epi);
    }
}

static int mlp_init(struct pool *p, int t) {
    long n = 4L * rup(WIDEST) * 3 + rupb(WIDEST + 4);  /* xin, part[0], part[1]; xq */
    long wb[NL], sb[NL];
    for (int i = 0; i < NL; i++) {
        slice_of(i, t, &p->lo[t][i], &p->hi[t][i]);
        const int w = p->hi[t][i] - p->lo[t][i];
        slice_bytes(i, LSPLIT[i] ? w : LK[i], LSPLIT[i] ? LN[i] : w, &wb[i], &sb[i]);
        n += rupb(wb[i]) + rupb(sb[i]);
    }
    char *m = mlp_alloc((size_t)rupb(n));
    if (!m) return -1;
    memset(m, 0, (size_t)n);  /* first touch by the thread that reads it */
    p->mem[t] = m;
    p->xin[t] = (float *)m; m += 4L * rup(WIDEST);
    p->part[0][t] = (float *)m; m += 4L * rup(WIDEST);
    p->part[1][t] = (float *)m; m += 4L * rup(WIDEST);
    p->xq[t] = (uint8_t *)m; m += rupb(WIDEST + 4);
    for (int i = 0; i < NL; i++) {
        const int lo = p->lo[t][i], hi = p->hi[t][i], K = LK[i], N = LN[i];
        const int r0 = LSPLIT[i] ? lo : 0, r1 = LSPLIT[i] ? hi : K, c0 = LSPLIT[i] ? 0 : lo, c1 = LSPLIT[i] ? N : hi;
        p->w[t][i] = m;
        p->sc[t][i] = (float *)(m + rupb(wb[i]));
        switch (LFMT[i]) {
        case 0: pack((const float *)p->wsrc[i], N, r0, r1, c0, c1, (float *)m); break;
#if QUANT
        case 1: qpack(p->wsrc[i], 2, N, r0, r1, c0, c1, m); break;
        case 2:
            qpack(p->wsrc[i], 1, N, r0, r1, c0, c1, m);
            memcpy(p->sc[t][i], p->ssrc[i], (size_t)N * sizeof(float));
            break;
        case 3: qpack4((const int8_t *)p->wsrc[i], p->ssrc[i], N, r0, r1, c0, c1, (uint8_t *)m, p->sc[t][i]); break;
#endif
#if A8
        default:
            memcpy(p->sc[t][i], p->ssrc[i], (size_t)N * sizeof(float));
            qpack_a8((const int8_t *)p->wsrc[i], N, r0, r1, c0, c1, (int8_t *)m,
                     (int32_t *)(p->sc[t][i] + (N + JBV - 1) / JBV * JBV));
            break;
#endif
        }
        m += rupb(wb[i]) + rupb(sb[i]);
    }
    if (t == 0) {  /* biases and the shared activations: the caller's */
        long s = 2 * rup(WIDEST);
        for (int i = 0; i < NL; i++) s += rup(LN[i]);
        float *q = aligned_alloc(64, s * sizeof(float));
        if (!q) return -1;
        memset(q, 0, s * sizeof(float));
        p->shared = q;
        p->act[0] = q; q += rup(WIDEST);
        p->act[1] = q; q += rup(WIDEST);
        for (int i = 0; i < NL; i++) { p->bias[i] = q; memcpy(q, p->bsrc[i], LN[i] * sizeof(float)); q += rup(LN[i]); }
    }
    return 0;
}

static void pool_work(struct pool *p, int t) {
    for (int i = 0; i < NL; i++) {
        const int K = LK[i], N = LN[i], lo = p->lo[t][i], hi = p->hi[t][i];
        const float *in;
        if (i == 0) in = p->x;
        else if (!LSPLIT[i - 1]) in = p->act[(i - 1) & 1];
        else {  /* the previous layer left partial sums: add up what this slice reads */
            reduce(p, (i - 1) & 1, LSPLIT[i] ? lo : 0, LSPLIT[i] ? hi : K, p->bias[i - 1], LEPI[i - 1], p->xin[t]);
            in = p->xin[t];
        }
        if (LSPLIT[i]) lmv(p, t, i, in + lo, hi - lo, 0, N, NULL, p->part[i & 1][t], 0);
        else lmv(p, t, i, in, K, lo, hi, p->bias[i], i == NL - 1 ? p->y : p->act[i & 1], LEPI[i]);
        if (i < NL - 1) pool_barrier(p, t, i + 1);
    }
    pool_sync(p, t, STAGES);
}

PF_API void pf_mlp_destroy(void *h) {
    struct pool *p = (struct pool *)h;
    if (!p) return;
    pool_stop(p);
    for (int t = 0; t < PT; t++) free(p->mem[t]);
    free(p->shared);
    free(p);
}

PF_API void *pf_mlp_create_q(const void *const *W, const float *const *S, const float *const *B) {
    struct pool *p = aligned_alloc(64, (sizeof(struct pool) + 63) / 64 * 64);
    if (!p) return NULL;
    memset(p, 0, sizeof *p);
    p->wsrc = W;
    p->ssrc = S;
    p->bsrc = B;
    if (pool_start(p, mlp_init) != 0) { pf_mlp_destroy(p); return NULL; }
    p->wsrc = NULL;
    p->ssrc = NULL;
    p->bsrc = NULL;
    return p;
}

PF_API void *pf_mlp_create(const float *const *W, const float *const *B) {
    for (int i = 0; i < NL; i++)
        if (LFMT[i]) return NULL;  /* quantised layers: pf_mlp_create_q */
    return pf_mlp_create_q((const void *const *)W, NULL, B);
}

PF_API void pf_mlp_run(void *h, const float *x, float *y) {
    struct pool *p = (struct pool *)h;
    p->x = x;
    p->y = y;
    pool_call(p);
    if (LSPLIT[NL - 1]) reduce(p, (NL - 1) & 1, 0, LN[NL - 1], p->bias[NL - 1], LEPI[NL - 1], y);
}

PF_API void pf_mlp_bind(void *h, const float *x, float *y) {
    struct pool *p = (struct pool *)h;
    p->bx = x;
    p->by = y;
}

PF_API void pf_mlp_go(void *h) {
    struct pool *p = (struct pool *)h;
    pf_mlp_run(h, p->bx, p->by);
}
"""


class MlpError(RuntimeError):
    """The fused MLP's pool did not start (a thread or an allocation failed)."""


def _fn(lib: ctypes.CDLL, name: str, args: list, res=None):
    f = getattr(lib, name)
    f.argtypes = args
    f.restype = res
    return f


class Pool:
    """A started fused MLP (its threads and weight slices) in library ``lib``; ``close()`` (or garbage
    collection, or interpreter exit) stops and joins its workers and frees its memory. ``formats``: each
    layer's weight format (default all fp32), int4's blocks of ``qblock`` rows: the weights are quantised
    here (cached by content) and each thread packs its slice of them."""

    def __init__(self, lib: ctypes.CDLL, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray],
                 formats: Sequence[str] | None = None, qblock: int = INT4_BLOCKS[0]):
        formats = list(formats or ["fp32"] * len(weights))
        ws, ss = [], []
        for w, f in zip(weights, formats):
            if f == "fp32":
                ws.append(np.ascontiguousarray(w, dtype=np.float32))
                ss.append(None)
            else:
                qw = quantised_weights(np.asarray(w, np.float32), f, qblock if f == "int4" else None)
                ws.append(np.ascontiguousarray(qw.q))
                ss.append(None if qw.scales is None else np.ascontiguousarray(qw.scales, np.float32))
        bs = [np.ascontiguousarray(b, dtype=np.float32).reshape(-1) for b in biases]
        wp = (ctypes.c_void_p * len(ws))(*[w.ctypes.data for w in ws])
        sp = (ctypes.c_void_p * len(ss))(*[s.ctypes.data if s is not None else None for s in ss])
        bp = (ctypes.c_void_p * len(bs))(*[b.ctypes.data for b in bs])
        create = _fn(lib, "pf_mlp_create_q", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p], ctypes.c_void_p)
        destroy = _fn(lib, "pf_mlp_destroy", [ctypes.c_void_p])
        self.run = _fn(lib, "pf_mlp_run", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p])
        self.bind = _fn(lib, "pf_mlp_bind", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p])
        self.go = _fn(lib, "pf_mlp_go", [ctypes.c_void_p])
        # the weights are packed by the threads before create returns: ws, ss, bs may go after it
        h = create(ctypes.addressof(wp), ctypes.addressof(sp), ctypes.addressof(bp))
        if not h:
            raise MlpError("the fused MLP could not start its threads or allocate its weight slices")
        self.handle = h
        self._close = weakref.finalize(self, destroy, h)

    def close(self) -> None:
        self._close()

    @property
    def alive(self) -> bool:
        return self._close.alive


def bind(lib: ctypes.CDLL, layers, knobs: dict[str, Any], x: np.ndarray, weights, biases, y: np.ndarray):
    """The fused MLP bound to ``x`` and ``y`` as a no-argument call; ``run.pool`` is its ``Pool`` (the call
    keeps it alive: the workers stop when the call is freed) and ``run.entry`` is ``(address of
    pf_mlp_run, handle, pool, x address, y address)``, for a caller that passes other buffers per call."""
    for i, ((k, n, _), w, b) in enumerate(zip(layers, weights, biases)):
        if tuple(np.shape(w)) != (k, n) or np.size(b) != n:
            raise ValueError(f"layer {i}: weights {np.shape(w)} and bias {np.shape(b)} do not match ({k}, {n})")
    if x.size != layers[0][0] or y.size != layers[-1][1]:
        raise ValueError(f"input of {x.size} and output of {y.size} floats do not match the layers "
                         f"({layers[0][0]} in, {layers[-1][1]} out)")
    pool = Pool(lib, weights, biases, formats_of(layers, knobs), int(knobs.get("qblock", INT4_BLOCKS[0])))
    pool.bind(pool.handle, x.ctypes.data, y.ctypes.data)
    go, h, raw = pool.go, pool.handle, pool.run
    keep = (x, y)

    def run(go=go, h=h, keep=keep, pool=pool):
        go(h)

    run.pool = pool
    run.native = (ctypes.cast(go, ctypes.c_void_p).value, h)  # pf_mlp_go(handle) on the bound buffers, from C
    # what a lean caller needs to run it on its own buffers: run(handle, x, y)'s address, the handle, its owner,
    # and the buffers it is bound to (the caller checks they are the ones it would otherwise copy through)
    run.entry = (ctypes.cast(raw, ctypes.c_void_p).value, h, pool, x.ctypes.data, y.ctypes.data)
    return run


def reference(layers, knobs: dict[str, Any], x, weights, biases) -> np.ndarray:
    """What a fused MLP of these knobs computes, in fp64: its dequantised weights, and each layer with int8
    activations fed its input as the kernel quantises it (asymmetric over the whole input, in fp32)."""
    from ....quant import quantise_activations

    h = np.asarray(x, np.float64).reshape(-1)
    for (_, _, act), w, b, code in zip(layers, dequantised(layers, knobs, weights), biases, layer_codes(layers, knobs)):
        if code == A8:
            q, scale = quantise_activations(h.astype(np.float32))
            h = q.astype(np.float64) * np.float64(scale)
        h = h @ w.astype(np.float64) + np.asarray(b, np.float64).reshape(-1)
        h = np.maximum(h, 0.0) if act == "relu" else _act64(act, h)
    return h


def _act64(act: str, h: np.ndarray) -> np.ndarray:
    if act == "none":
        return h
    from ....ops import REGISTRY

    return np.asarray(REGISTRY[act].reference([h], {}), np.float64)


def dequantised(layers, knobs: dict[str, Any], weights) -> list[np.ndarray]:
    """The weights a fused MLP of these knobs really multiplies by (fp32 layers as they are): its reference."""
    from ....quant import dequantise

    qb = int(knobs.get("qblock", INT4_BLOCKS[0]))
    return [np.asarray(w, np.float32) if f == "fp32" else
            dequantise(quantised_weights(np.asarray(w, np.float32), f, qb if f == "int4" else None), np.float32)
            for w, f in zip(weights, formats_of(layers, knobs))]


def weight_bytes(layers: Sequence[tuple[int, int, str]]) -> int:
    return 4 * sum(k * n + n for k, n, _ in layers)


def limit_estimate(layers: Sequence[tuple[int, int, str]], threads: int, ceilings) -> tuple[float, str]:
    """The physical limit of one call: the weights' bytes over the read bandwidth of the smallest cache level
    that holds them across ``threads`` cores (``ceilings``: ``targets.target.Ceilings``); (seconds, level)."""
    wb = weight_bytes(layers)
    threads = max(1, int(threads))
    for lvl in ("L1", "L2", "L3"):
        cap, bw = ceilings.cache.get(lvl), ceilings.bw.get(lvl)
        if cap is None or bw is None:
            continue
        size, instances, shared_by = cap
        private = shared_by == 1
        held = size * min(threads, instances) if private else size  # a shared level: one instance for all
        if wb <= held:
            return wb / _rate(bw["read"], threads, ceilings.threads, private), lvl
    return wb / _rate(ceilings.bw["DRAM"]["read"], threads, ceilings.threads, False), "DRAM"


def _rate(read: tuple[float, float], threads: int, probed: int, private: bool) -> float:
    """Read bytes/s of ``threads`` threads from (one thread's, all ``probed`` threads') measured rates."""
    one, allt = read
    if threads == 1:
        return one
    if threads >= probed:
        return allt
    return one * threads if private else min(allt, one * threads)


__all__ = ["A8", "FORMAT_CODES", "MlpError", "Pool", "SPIN_US", "bind", "defaults", "dequantised", "format_names", "formats_of", "layer_codes", "reference",
           "limit_estimate", "quantised", "source", "space", "split_names", "variants", "weight_bytes", "with_formats"]
