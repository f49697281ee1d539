"""GEMV template for batch-1 inference: y = act(x @ W + bias), x: [K], W: [K, N].

Each block of ``jb`` vectors of output columns keeps ``ksplit`` independent
sets of accumulators (more FMA chains in flight, each over its own contiguous
chunk of K: as many streams from memory) and streams W row by row
(``w_layout="row"``) or from a pre-packed layout (``"packed"``: W rearranged
once into [N / (jb*V)] panels of [K][jb*V] contiguous floats, so each block
streams one contiguous region). Blocks are split over ``threads``.

Compile-time knobs: vec, jb, ksplit, unroll, w_layout; runtime: threads.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from ....space import Space, categorical
from .common import epi_code, header, struct_call
from .parfor import PARFOR_C
from .scratch import aligned_zeros
from .epilogues import apply_chain, chain_flops, dense_tolerance, numpy_dense, torch_dense
from .facts import Facts



class GemvArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("W", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p),
                ("N", ctypes.c_int), ("K", ctypes.c_int), ("threads", ctypes.c_int)]


def space(N: int, K: int, profile) -> Space:
    lanes = profile.vector_lanes
    vecs = tuple(v for v in (4, 8, 16) if v <= lanes) or (1,)
    return Space(
        [
            categorical("vec", vecs),
            categorical("jb", (1, 2, 4, 8)),
            categorical("ksplit", (1, 2, 4)),
            categorical("unroll", (1, 2, 4, 8)),
            categorical("w_layout", ("row", "packed")),
            categorical("threads", tuple(range(1, profile.physical_cores + 1))),
        ],
        [
            "jb * ksplit + jb + 1 <= vregs",
            "jb * vec <= max(vec, n)",
            "ksplit <= k",
            # at least one block per thread
            "threads == 1 or n >= threads * jb * vec",
        ],
        constants={"n": N, "k": K, "vregs": profile.vector_registers},
    )


def block_source(knobs: dict[str, Any], name: str = "block") -> str:
    """``name(x, W, wp, bias, y, N, K, j0, epi)``: one block of ``jb * V`` output
    columns starting at ``j0``; reads W row-major, or the block's packed panel ``wp``.

    The ``ksplit`` sets of accumulators each take a contiguous chunk of K (rows ``[s * Kc, (s + 1) * Kc)``),
    so a block streams ``ksplit`` regions at once: from DRAM one sequential stream per core leaves bandwidth
    unused (a 1 x 4096 x 4096 block ran about 25% faster as four streams than as one, on one thread)."""
    jb, ks = knobs["jb"], knobs["ksplit"]
    packed = knobs["w_layout"] == "packed"
    jbv = f"({jb} * V)"
    w_at = (lambda kk, v: f"wp + (long)({kk}) * {jbv} + {v} * V") if packed else \
        (lambda kk, v: f"W + (long)({kk}) * N + j0 + {v} * V")
    L = [f"static inline void {name}(const float *restrict x, const float *restrict W, const float *restrict wp,"
         " const float *restrict bias, float *restrict y, int N, int K, int j0, int epi) {",
         "    (void)W; (void)wp;",
         f"    const int Kc = K / {ks};"]
    for s in range(ks):
        L.append("    " + " ".join(f"vf a{s}_{v} = vset(0.0f);" for v in range(jb)))
    L.append(f"    #pragma GCC unroll {knobs['unroll']}")
    L.append("    for (int k = 0; k < Kc; k++) {")
    for s in range(ks):
        row = f"k + {s} * Kc" if s else "k"
        L.append(f"        {{ vf xv = vset(x[{row}]); " +
                 " ".join(f"a{s}_{v} = xv * vload({w_at(row, v)}) + a{s}_{v};" for v in range(jb)) + " }")
    L.append("    }")
    L.append(f"    for (int k = {ks} * Kc; k < K; k++) {{ vf xv = vset(x[k]); " +
             " ".join(f"a0_{v} = xv * vload({w_at('k', v)}) + a0_{v};" for v in range(jb)) + " }")
    for v in range(jb):
        tot = " + ".join(f"a{s}_{v}" for s in range(ks))
        L.append(f"    {{ vf t = {tot}; vf b = epi ? vload(bias + j0 + {v} * V) : vset(0.0f);"
                 f" vstore(y + j0 + {v} * V, vepi(t, b, epi)); }}")
    L.append("}")
    return "\n".join(L)


def tail_source(name: str = "tail") -> str:
    """Columns past the last full block; the packed layout keeps them row-major after the panels."""
    return r"""
static void """ + name + r"""(const float *x, const float *tail, long tld, const float *bias, float *y, int j_from, int N,
                 int K, int epi) {
    for (int j = j_from; j < N; j++) {
        float s = 0.0f;
        for (int k = 0; k < K; k++) s += x[k] * tail[(long)k * tld + (j - j_from)];
        y[j] = s_epi(s, epi ? bias[j] : 0.0f, epi);
    }
}
"""


def source(knobs: dict[str, Any], epilogue: str) -> str:
    jb = knobs["jb"]
    packed = knobs["w_layout"] == "packed"
    head = f"#define V {knobs['vec']}\n#define JB {jb}\n#define JBV (JB * V)\n#define EPI {epi_code(epilogue)}"
    return "\n".join([head, header(), PARFOR_C, block_source(knobs), tail_source(), r"""
typedef struct { const float *x, *W, *bias; float *y; int N, K, threads; } gemv_args;

static void gemv_panels(const void *c, int lo, int hi) {  /* panels [lo, hi) of one call, on any thread */
    const gemv_args *g = (const gemv_args *)c;
    const int N = g->N, K = g->K;
    const float *W = g->W;
    for (int b = lo; b < hi; b++)
        block(g->x, W, """ + ("W + (long)b * K * JBV" if packed else "NULL") + r""", g->bias, g->y, N, K, b * JBV, EPI);
}

void pf_gemv(const gemv_args *g) {
    const int N = g->N, K = g->K, nblk = N / JBV;
    const float *W = g->W;
    pf_parfor(nblk, g->threads, gemv_panels, g);
    tail(g->x, """ + ("W + (long)nblk * K * JBV, N - nblk * JBV" if packed else "W + nblk * JBV, N") +
        r""", g->bias, g->y, nblk * JBV, N, K, EPI);
}
"""])


def pack_weights(W: np.ndarray, knobs: dict[str, Any]) -> np.ndarray:
    """W [K, N] in the layout the kernel reads (a copy; row layout returns W itself)."""
    if knobs["w_layout"] == "row":
        return W
    K, N = W.shape
    jbv = knobs["jb"] * knobs["vec"]
    nblk = N // jbv
    panels = W[:, : nblk * jbv].reshape(K, nblk, jbv).transpose(1, 0, 2).ravel()
    tail = W[:, nblk * jbv:].ravel()
    out = aligned_zeros(panels.size + tail.size)
    out[: panels.size], out[panels.size:] = panels, tail
    return out


def bind(lib: ctypes.CDLL, knobs: dict[str, Any], x, W, bias, y):
    K, N = W.shape
    Wk = pack_weights(W, knobs)
    args = GemvArgs(x.ctypes.data, Wk.ctypes.data, bias.ctypes.data if bias is not None else None, y.ctypes.data,
                    N, K, knobs["threads"])
    return struct_call(lib.pf_gemv, args, (x, W, Wk, bias, y))


# -- the gemv problem: y = act(x @ W + bias), x [K], W [K, N] ---------------------------------------------------------

def _inputs(p, rand):
    N, K = p.dims
    d = {"x": rand(K), "W": rand(K, N) / np.float32(math.sqrt(K))}
    if p.epilogue != "none":
        d["bias"] = rand(N)
    return d


def _torch(p, inp, out):
    import torch

    t = {k: torch.from_numpy(v) for k, v in inp.items()}
    return torch_dense(t["x"].unsqueeze(0), t["W"], t.get("bias"), torch.from_numpy(out).unsqueeze(0), p.epilogue)


FACTS = Facts(
    inputs=_inputs,
    output_shape=lambda p: (p.dims[0],),
    reference=lambda p, f: apply_chain(f["x"] @ f["W"], p.epilogue, f.get("bias")),
    tolerance=lambda p, f: dense_tolerance(np.abs(f["x"]) @ np.abs(f["W"]) + np.abs(f.get("bias", 0.0)),
                                           p.dims[1], p.epilogue),
    flops=lambda p: 2.0 * p.dims[0] * p.dims[1] + chain_flops(p.epilogue) * p.dims[0],
    numpy=lambda p, inp, out: numpy_dense(inp["x"], inp["W"], inp.get("bias"), out, p.epilogue),
    torch=_torch,
)
