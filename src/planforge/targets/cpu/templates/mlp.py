"""Fused batch-1 MLP template: every layer of a chain in one call.

y = act_L(... act_1(x @ W_1 + b_1) ... @ W_L + b_L) for a single row. Each
layer is a GEMV (the GEMV template's block code), the intermediate rows live
in a small scratch that stays in L1, and the layer sizes and activations are
compile-time constants. With ``threads`` > 1 one OpenMP parallel region
covers the whole chain, splitting each layer's column blocks, with a barrier
between layers. One call from Python instead of one per layer (and per
epilogue op) is what wins at batch 1.

Compile-time knobs: vec, jb, ksplit, unroll, w_layout (and the layer shapes);
runtime: threads.
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

import numpy as np

from ....ops.kernel import epilogue_of_act
from ....space import Space, categorical
from .common import epi_code, header
from .gemv import block_source, pack_weights, tail_source



class MlpArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("W", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("scratch", ctypes.c_void_p), ("y", ctypes.c_void_p), ("threads", ctypes.c_int)]


def space(layers: Sequence[tuple[int, int, str]], profile) -> Space:
    """``layers``: (K, N, act) per layer, first to last."""
    lanes = profile.vector_lanes
    vecs = tuple(v for v in (4, 8, 16) if v <= lanes) or (1,)
    n_min = min(n for _, n, _ in layers)
    return Space(
        [categorical("vec", vecs), categorical("jb", (1, 2, 4, 8)), categorical("ksplit", (1, 2, 4)),
         categorical("unroll", (1, 2, 4)), categorical("w_layout", ("row", "packed")),
         categorical("threads", tuple(range(1, profile.physical_cores + 1)))],
        ["jb * ksplit + jb + 1 <= vregs", "jb * vec <= max(vec, n_min)"],
        constants={"vregs": profile.vector_registers, "n_min": n_min},
    )


def source(layers: Sequence[tuple[int, int, str]], knobs: dict[str, Any]) -> str:
    jbv = knobs["jb"] * knobs["vec"]
    L = [f"#define V {knobs['vec']}", header(), block_source(knobs), tail_source()]
    packed = knobs["w_layout"] == "packed"
    body = []
    offs = 0
    for i, (k, n, act) in enumerate(layers):
        src = "g->x" if i == 0 else f"s{(i - 1) % 2}"
        dst = "g->y" if i == len(layers) - 1 else f"s{i % 2}"
        nblk = n // jbv
        epi = epi_code(epilogue_of_act(act))
        wl = f"W[{i}]"
        wp = f"{wl} + (long)b * {k} * {jbv}" if packed else "NULL"
        tail_w, tail_ld = (f"{wl} + (long){nblk} * {k} * {jbv}", n - nblk * jbv) if packed else (f"{wl} + {nblk * jbv}", n)
        body.append(f"""
        /* layer {i}: [{k}] -> [{n}], {act} */
#ifdef _OPENMP
        #pragma omp for schedule(static)
#endif
        for (int b = 0; b < {nblk}; b++) block({src}, {wl}, {wp}, B[{i}], {dst}, {n}, {k}, b * {jbv}, {epi});
#ifdef _OPENMP
        #pragma omp single
#endif
        tail({src}, {tail_w}, {tail_ld}, B[{i}], {dst}, {nblk * jbv}, {n}, {k}, {epi});""")
        offs += k * n
    widest = max(n for _, n, _ in layers)
    L.append(f"""
typedef struct {{ const float *x; const float *const *W; const float *const *bias; float *scratch; float *y;
                 int threads; }} mlp_args;

void pf_mlp(const mlp_args *g) {{
    const float *const *W = g->W, *const *B = g->bias;
    float *s0 = g->scratch, *s1 = g->scratch + {widest};
    (void)s0; (void)s1;
#ifdef _OPENMP
    #pragma omp parallel num_threads(g->threads) if (g->threads > 1)
#endif
    {{{''.join(body)}
    }}
}}
""")
    return "\n".join(L)


def prepare(weights: Sequence[np.ndarray], biases: Sequence[np.ndarray], knobs: dict[str, Any]):
    """Weights in the kernel's layout (packed once at load time) and the pointer arrays."""
    ws = [pack_weights(np.ascontiguousarray(w, dtype=np.float32), knobs) for w in weights]
    bs = [np.ascontiguousarray(b, dtype=np.float32) for b in biases]
    wp = (ctypes.c_void_p * len(ws))(*[w.ctypes.data for w in ws])
    bp = (ctypes.c_void_p * len(bs))(*[b.ctypes.data for b in bs])
    return ws, bs, wp, bp


def bind(lib: ctypes.CDLL, layers, knobs: dict[str, Any], x: np.ndarray, weights, biases, y: np.ndarray):
    ws, bs, wp, bp = prepare(weights, biases, knobs)
    widest = max(n for _, n, _ in layers)
    scratch = np.zeros(2 * widest + 64, np.float32)
    args = MlpArgs(x.ctypes.data, ctypes.addressof(wp), ctypes.addressof(bp), scratch.ctypes.data, y.ctypes.data,
                   knobs["threads"])
    fn = lib.pf_mlp
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = None
    ptr = ctypes.addressof(args)
    keep = (x, ws, bs, wp, bp, scratch, y, args)

    def run(fn=fn, ptr=ptr, keep=keep):
        fn(ptr)

    return run
