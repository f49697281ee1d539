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
more often than that never pays a wake-up). ``pin``: 1 pins each worker to
its own physical core, 0 leaves placement to the scheduler (see ``pool.py``).
``threads = 1`` runs on the caller alone, no pool.

Exported C (``PF_API`` defaults to external linkage; the C export includes
this source with ``PF_API`` set to ``static``):

- ``void *pf_mlp_create(const float *const *W, const float *const *B)``:
  W[i] is layer i's [K][N] row-major weights, B[i] its [N] bias (both copied);
  NULL when a thread or an allocation fails.
- ``void pf_mlp_run(void *h, const float *x, float *y)``; ``pf_mlp_bind(h, x,
  y)`` then ``pf_mlp_go(h)``: the same with pointers bound once.
- ``void pf_mlp_destroy(void *h)``: stops and joins the workers, frees all.

Compile-time knobs: vec, jb, ksplit, unroll, threads, split0..split<L-1>, spin_us, pin.
"""
from __future__ import annotations

import ctypes
import weakref
from typing import Any, Sequence

import numpy as np

from ....ops.kernel import epilogue_of_act
from ....space import Space, categorical
from .common import epi_code, header
from .gemv import block_source, tail_source
from .pool import POOL_BODY, POOL_HEAD

SPIN_US = (1000, 100, 20000)  # the first is what one thread (no pool) is canonicalised to


def split_names(layers: Sequence[tuple[int, int, str]]) -> list[str]:
    return [f"split{i}" for i in range(len(layers))]


def space(layers: Sequence[tuple[int, int, str]], profile) -> Space:
    """``layers``: (K, N, act) per layer, first to last; ``profile``: the templates' ``Limits``."""
    lanes = profile.vector_lanes
    vecs = tuple(v for v in (4, 8, 16) if v <= lanes) or (1,)
    n_min = min(n for _, n, _ in layers)
    return Space(
        [categorical("vec", vecs), categorical("jb", (1, 2, 4, 8)), categorical("ksplit", (1, 2, 4)),
         categorical("unroll", (1, 2, 4)), categorical("threads", tuple(range(1, profile.physical_cores + 1))),
         *[categorical(s, ("n", "k")) for s in split_names(layers)],
         categorical("spin_us", SPIN_US), categorical("pin", (1, 0))],
        ["jb * ksplit + jb + 1 <= vregs", "jb * vec <= max(vec, n_min)",
         # one thread has no pool to spin: every spin bound is the same plan
         f"threads > 1 or (spin_us == {SPIN_US[0]} and pin == 1)"],
        constants={"vregs": profile.vector_registers, "n_min": n_min},
    )


def defaults(layers: Sequence[tuple[int, int, str]], lim) -> dict[str, Any]:
    """Where the search starts: all cores when each one's weight slice is worth more than a barrier (larger
    than its L1, so it would stream from L2 or beyond), split along N where every thread gets whole blocks of
    columns, else along K; measurements decide."""
    vec = max(x for x in (1, 4, 8, 16) if x <= lim.vector_lanes)
    n_min = min(n for _, n, _ in layers)
    jb = 2 if 2 * vec <= max(vec, n_min) else 1  # the space's rule: no block wider than the narrowest layer
    wbytes = 4 * sum(k * n for k, n, _ in layers)
    cores = max(1, lim.physical_cores)
    threads = cores if cores > 1 and wbytes / cores > lim.caches["L1d"] else 1
    d = {"vec": vec, "jb": jb, "ksplit": 2, "unroll": 2, "threads": threads, "spin_us": SPIN_US[0], "pin": 1}
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
"""
    return "\n".join([head, header(), block_source({**knobs, "w_layout": "packed"}), tail_source(), POOL_HEAD, _STRUCT, POOL_BODY, _MLP])


_STRUCT = r"""
struct pool {
    POOL_FIELDS
    const float *x; float *y;           /* this call's input and output */
    const float *bx; float *by;         /* the bound ones (pf_mlp_bind) */
    const float *const *wsrc, *const *bsrc;  /* the caller's weights, read while the threads pack them */
    float *bias[NL];
    float *w[PT][NL]; int lo[PT][NL], hi[PT][NL];
    float *act[2];                      /* split-N layers' outputs, shared; alternate by layer */
    float *part[2][PT];                 /* split-K layers' partial sums per thread; alternate by layer */
    float *xin[PT];                     /* a thread's input, added up from a split-K layer's partials */
    float *mem[PT], *shared;
};
"""

_MLP = r"""
static inline long rup(long n) { return (n + 15) / 16 * 16; }  /* floats: 64-byte aligned pieces */

/* thread t's slice of layer i: output columns (split N, whole blocks of JBV) or input rows (split K) */
static void slice_of(int i, int t, int *lo, int *hi) {
    const int K = LK[i], N = LN[i];
    if (LSPLIT[i]) { *lo = (int)((long)t * K / PT); *hi = (int)((long)(t + 1) * K / PT); return; }
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
    long n = rup(WIDEST) * 3;  /* xin, part[0], part[1] */
    for (int i = 0; i < NL; i++) {
        slice_of(i, t, &p->lo[t][i], &p->hi[t][i]);
        long w = p->hi[t][i] - p->lo[t][i];
        n += rup(w * (LSPLIT[i] ? LN[i] : LK[i]));
    }
    float *m = aligned_alloc(64, n * sizeof(float));
    if (!m) return -1;
    memset(m, 0, n * sizeof(float));  /* first touch by the thread that reads it */
    p->mem[t] = m;
    p->xin[t] = m; m += rup(WIDEST);
    p->part[0][t] = m; m += rup(WIDEST);
    p->part[1][t] = m; m += rup(WIDEST);
    for (int i = 0; i < NL; i++) {
        int lo = p->lo[t][i], hi = p->hi[t][i];
        p->w[t][i] = m;
        if (LSPLIT[i]) { pack(p->wsrc[i], LN[i], lo, hi, 0, LN[i], m); m += rup((long)(hi - lo) * LN[i]); }
        else { pack(p->wsrc[i], LN[i], 0, LK[i], lo, hi, m); m += rup((long)LK[i] * (hi - lo)); }
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
        if (LSPLIT[i]) mv(in + lo, p->w[t][i], hi - lo, 0, N, NULL, p->part[i & 1][t], N, 0);
        else mv(in, p->w[t][i], K, lo, hi, p->bias[i], i == NL - 1 ? p->y : p->act[i & 1], N, LEPI[i]);
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

PF_API void *pf_mlp_create(const float *const *W, const float *const *B) {
    struct pool *p = aligned_alloc(64, (sizeof(struct pool) + 63) / 64 * 64);
    if (!p) return NULL;
    memset(p, 0, sizeof *p);
    p->wsrc = W;
    p->bsrc = B;
    if (pool_start(p, mlp_init) != 0) { pf_mlp_destroy(p); return NULL; }
    p->wsrc = NULL;
    p->bsrc = NULL;
    return p;
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
    collection, or interpreter exit) stops and joins its workers and frees its memory."""

    def __init__(self, lib: ctypes.CDLL, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray]):
        ws = [np.ascontiguousarray(w, dtype=np.float32) for w in weights]
        bs = [np.ascontiguousarray(b, dtype=np.float32).reshape(-1) for b in biases]
        wp = (ctypes.c_void_p * len(ws))(*[w.ctypes.data for w in ws])
        bp = (ctypes.c_void_p * len(bs))(*[b.ctypes.data for b in bs])
        create = _fn(lib, "pf_mlp_create", [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_void_p)
        destroy = _fn(lib, "pf_mlp_destroy", [ctypes.c_void_p])
        self.run = _fn(lib, "pf_mlp_run", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p])
        self.bind = _fn(lib, "pf_mlp_bind", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p])
        self.go = _fn(lib, "pf_mlp_go", [ctypes.c_void_p])
        h = create(ctypes.addressof(wp), ctypes.addressof(bp))  # the weights are copied: ws, bs may go
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
    pool = Pool(lib, weights, biases)
    pool.bind(pool.handle, x.ctypes.data, y.ctypes.data)
    go, h, raw = pool.go, pool.handle, pool.run
    keep = (x, y)

    def run(go=go, h=h, keep=keep, pool=pool):
        go(h)

    run.pool = pool
    # what a lean caller needs to run it on its own buffers: run(handle, x, y)'s address, the handle, its owner,
    # and the buffers it is bound to (the caller checks they are the ones it would otherwise copy through)
    run.entry = (ctypes.cast(raw, ctypes.c_void_p).value, h, pool, x.ctypes.data, y.ctypes.data)
    return run


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


__all__ = ["MlpError", "Pool", "SPIN_US", "bind", "defaults", "limit_estimate", "source", "space", "split_names",
           "weight_bytes"]
