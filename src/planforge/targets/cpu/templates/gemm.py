"""GEMM template: C = act(A @ B + bias), fp32, row-major, BLIS-style blocking.

Loops (outer to inner): jc over N by ``nc``, pc over K by ``kc`` (B block
packed into NR-wide panels when ``pack_b``), ic over M by ``mc`` (A block
packed into MR-tall panels when ``pack_a``), then the MR x NR register tiles
in ``order`` ("ji": columns outer, "ij": rows outer). The micro-kernel keeps
MR x NV vector accumulators in registers, unrolls K by ``unroll`` and applies
the epilogue (bias, ReLU, GELU) while the tile is still in registers on the
last K block. With ``threads`` > 1 each OpenMP thread takes a slice of N
(``par="n"``) or of M (``par="m"``) and runs the whole blocked loop on it.

Compile-time knobs (baked into the source, one library each): mr, nv, pack_a,
pack_b, order, unroll, vec, and whether OpenMP is on. Runtime knobs (passed
per call, no rebuild): mc, kc, nc, threads, par.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from ....space import Space, categorical, pow2
from . import qgemm
from .common import epi_code, header, struct_call
from .epilogues import apply_chain, chain_flops, dense_tolerance, numpy_dense, torch_dense
from .facts import Facts



class GemmArgs(ctypes.Structure):
    _fields_ = [("A", ctypes.c_void_p), ("B", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("C", ctypes.c_void_p),
                ("M", ctypes.c_int), ("N", ctypes.c_int), ("K", ctypes.c_int), ("mc", ctypes.c_int),
                ("kc", ctypes.c_int), ("nc", ctypes.c_int), ("threads", ctypes.c_int), ("par", ctypes.c_int)]


def space(M: int, N: int, K: int, profile) -> Space:
    """The GEMM knob space for one shape on one device (restrictions from the profile)."""
    lanes = profile.vector_lanes
    vecs = tuple(v for v in (4, 8, 16) if v <= lanes) or (1,)
    return Space(
        [
            categorical("vec", vecs),
            categorical("mr", (1, 2, 3, 4, 6, 8, 12)),
            categorical("nv", (1, 2, 3, 4)),
            categorical("unroll", (1, 2, 4, 8)),
            categorical("pack_a", (0, 1)),
            categorical("pack_b", (0, 1)),
            categorical("order", ("ji", "ij")),
            pow2("mc", 8, 512),
            pow2("kc", 32, 2048),
            pow2("nc", 64, 8192),
            categorical("threads", tuple(range(1, profile.physical_cores + 1))),
            categorical("par", ("n", "m")),
        ],
        [
            # accumulators + B vectors + one broadcast fit in the register file
            "mr * nv + nv + 1 <= vregs",
            # register tile no larger than the problem calls for
            "mr <= max(1, m) and nv * vec <= max(vec, 2 * n)",
            # cache blocking: B micro-panel in L1, A block in L2, B block in L3
            "kc * nv * vec * 4 <= l1_bytes",
            "mc * kc * 4 <= l2_bytes",
            "kc * nc * 4 <= l3_bytes",
            # block sizes beyond the problem are all the same plan: keep the smallest
            "mc < 2 * m or mc == 8",
            "kc < 2 * k or kc == 32",
            "nc < 2 * n or nc == 64",
            "mc % mr == 0 or mc < mr",
            "threads == 1 or par == 'n' or m >= 2 * mr",
            "threads > 1 or par == 'n'",
        ],
        constants={"m": M, "n": N, "k": K, "vregs": profile.vector_registers,
                   "l1_bytes": profile.caches["L1d"], "l2_bytes": profile.caches["L2"],
                   "l3_bytes": profile.caches.get("L3", profile.caches["L2"])},
    )


def _ukernel(mr: int, nv: int, pack_a: int, pack_b: int, unroll: int) -> str:
    """The MR x NR micro-kernel, written out so every accumulator is a named register variable."""
    a_at = (lambda i: f"a[k * {mr} + {i}]") if pack_a else (lambda i: f"a[{i} * lda + k]")
    b_at = (lambda v: f"b + k * NR + {v} * V") if pack_b else (lambda v: f"b + k * ldb + {v} * V")
    L = []
    L.append("static inline void ukernel(int kc, const float *restrict a, long lda, const float *restrict b, long ldb,"
             " float *restrict c, long ldc, int first, int last, const float *restrict bias, int epi) {")
    for i in range(mr):
        L.append("    " + " ".join(f"vf c{i}_{v} = vset(0.0f);" for v in range(nv)))
    L.append(f"    #pragma GCC unroll {unroll}")
    L.append("    for (int k = 0; k < kc; k++) {")
    for v in range(nv):
        L.append(f"        vf b{v} = vload({b_at(v)});")
    for i in range(mr):
        L.append(f"        {{ vf av = vset({a_at(i)}); " + " ".join(f"c{i}_{v} = av * b{v} + c{i}_{v};" for v in range(nv)) + " }")
    L.append("    }")
    for v in range(nv):
        L.append(f"    vf bias{v} = last && epi ? vload(bias + {v} * V) : vset(0.0f);")
    for i in range(mr):
        for v in range(nv):
            L.append(f"    {{ float *p = c + {i} * ldc + {v} * V; vf x = c{i}_{v}; if (!first) x += vload(p);"
                     f" if (last) x = vepi(x, bias{v}, epi); vstore(p, x); }}")
    L.append("}")
    return "\n".join(L)


def source(knobs: dict[str, Any], epilogue: str) -> str:
    """C source for the compile-time knobs of ``knobs`` (runtime knobs are ignored here)."""
    mr, nv, pa, pb = knobs["mr"], knobs["nv"], knobs["pack_a"], knobs["pack_b"]
    loop_ji = knobs["order"] == "ji"
    tile_loops = (("jr", "ir") if loop_ji else ("ir", "jr"))
    defs = f"#define V {knobs['vec']}\n#define MR {mr}\n#define NV {nv}\n#define NR (NV * V)\n#define EPI {epi_code(epilogue)}\n"
    loops = {
        "jr": "for (int jr = 0; jr < nb; jr += NR)",
        "ir": "for (int ir = 0; ir < mb; ir += MR)",
    }
    a_ptr = "ap + (ir / MR) * MR * kb" if pa else "A + (long)(ic + ir) * lda + pc"
    b_ptr = "bp + (jr / NR) * NR * kb" if pb else "B + (long)pc * ldb + jc + jr"
    a_ld = "MR" if pa else "lda"
    b_ld = "NR" if pb else "ldb"
    q = qgemm.parts(knobs) or {}  # a quantised B: its packing, type and the slices' column offsets
    pack_call = q.get("pack_call", "pack_b(kb, nb, B + (long)pc * ldb + jc, ldb, bp);")
    body = f"""
{defs}{header()}
{_ukernel(mr, nv, pa, pb, knobs['unroll'])}

/* scalar tile for the edges that packing does not pad */
static void edge_tile(int mr, int nr, int kc, const float *a, long a_rs, long a_cs, const float *b, long b_rs,
                      float *c, long ldc, int first, int last, const float *bias, int epi) {{
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {{
            float s = 0.0f;
            for (int k = 0; k < kc; k++) s += a[i * a_rs + k * a_cs] * b[k * b_rs + j];
            if (!first) s += c[i * ldc + j];
            if (last) s = s_epi(s, bias ? bias[j] : 0.0f, epi);
            c[i * ldc + j] = s;
        }}
}}

static __thread float *buf_a, *buf_b;
static __thread size_t cap_a, cap_b;

static void pack_a(int mb, int kb, const float *A, long lda, float *ap) {{
    for (int p = 0; p < mb; p += MR)
        for (int k = 0; k < kb; k++)
            for (int i = 0; i < MR; i++)
                *ap++ = p + i < mb ? A[(long)(p + i) * lda + k] : 0.0f;
}}

{q.get("pack_b", "")}static void pack_b(int kb, int nb, const float *B, long ldb, float *bp) {{
    for (int q = 0; q < nb; q += NR)
        for (int k = 0; k < kb; k++) {{
            const float *src = B + (long)k * ldb + q;
            if (q + NR <= nb) {{ memcpy(bp, src, NR * sizeof(float)); bp += NR; }}
            else for (int j = 0; j < NR; j++) *bp++ = q + j < nb ? src[j] : 0.0f;
        }}
}}

static void gemm_block(const float *A, {q.get("block_b", "const float *B")}, const float *bias, float *C, int M, int N, int K,
                       long lda, long ldb, long ldc, int mc, int kc, int nc{q.get("block_j0", "")}) {{
    const int epi = EPI;
    float tile[MR * NR];
    for (int jc = 0; jc < N; jc += nc) {{
        int nb = N - jc < nc ? N - jc : nc;
        for (int pc = 0; pc < K; pc += kc) {{
            int kb = K - pc < kc ? K - pc : kc;
            int first = pc == 0, last = pc + kb >= K;
            float *bp = {"scratch(&buf_b, &cap_b, (size_t)((nb + NR - 1) / NR) * NR * kb)" if pb else "NULL"};
            {pack_call if pb else ""}
            for (int ic = 0; ic < M; ic += mc) {{
                int mb = M - ic < mc ? M - ic : mc;
                float *ap = {"scratch(&buf_a, &cap_a, (size_t)((mb + MR - 1) / MR) * MR * kb)" if pa else "NULL"};
                {"pack_a(mb, kb, A + (long)(ic) * lda + pc, lda, ap);" if pa else ""}
                (void)ap; (void)bp;
                {loops[tile_loops[0]]}
                {loops[tile_loops[1]]} {{
                    int mr = mb - ir < MR ? mb - ir : MR, nr = nb - jr < NR ? nb - jr : NR;
                    float *c = C + (long)(ic + ir) * ldc + jc + jr;
                    const float *bs = bias ? bias + jc + jr : NULL;
                    if (mr == MR && nr == NR) {{
                        ukernel(kb, {a_ptr}, {a_ld}, {b_ptr}, {b_ld}, c, ldc, first, last, bs, epi);
                    }} else if ({pa} && {pb}) {{
                        /* padded panels: full tile into scratch, then the valid part */
                        ukernel(kb, {a_ptr}, {a_ld}, {b_ptr}, {b_ld}, tile, NR, 1, 0, NULL, 0);
                        for (int i = 0; i < mr; i++)
                            for (int j = 0; j < nr; j++) {{
                                float x = tile[i * NR + j] + (first ? 0.0f : c[i * ldc + j]);
                                c[i * ldc + j] = last ? s_epi(x, bs ? bs[j] : 0.0f, epi) : x;
                            }}
                    }} else {{
                        edge_tile(mr, nr, kb, {"ap + (ir / MR) * MR * kb" if pa else "A + (long)(ic + ir) * lda + pc"},
                                  {"1, MR" if pa else "lda, 1"},
                                  {"bp + (jr / NR) * NR * kb" if pb else "B + (long)pc * ldb + jc + jr"}, {b_ld},
                                  c, ldc, first, last, bs, epi);
                    }}
                }}
            }}
        }}
    }}
}}

{q.get("args", "typedef struct {{ const float *A, *B, *bias; float *C; int M, N, K, mc, kc, nc, threads, par; }} gemm_args;").replace("{{", "{").replace("}}", "}")}

void pf_gemm(const gemm_args *g) {{
    {q.get("setup", "const float *A = g->A, *B = g->B, *bias = g->bias; float *C = g->C;")}
    int M = g->M, N = g->N, K = g->K;
#ifdef _OPENMP
    if (g->threads > 1) {{
        #pragma omp parallel num_threads(g->threads)
        {{
            int t = omp_get_thread_num(), T = omp_get_num_threads();
            if (g->par == 0) {{
                int units = (N + NR - 1) / NR, per = (units + T - 1) / T;
                int n0 = t * per * NR, n1 = n0 + per * NR < N ? n0 + per * NR : N;
                if (n0 < n1) gemm_block(A, {q.get("b_cols", "B + n0")}, bias ? bias + n0 : NULL, C + n0, M, n1 - n0, K, K, N, N,
                                        g->mc, g->kc, g->nc{q.get("j0", "")});
            }} else {{
                int units = (M + MR - 1) / MR, per = (units + T - 1) / T;
                int m0 = t * per * MR, m1 = m0 + per * MR < M ? m0 + per * MR : M;
                if (m0 < m1) gemm_block(A + (long)m0 * K, B, bias, C + (long)m0 * N, m1 - m0, N, K, K, N, N,
                                        g->mc, g->kc, g->nc{q.get("j0_zero", "")});
            }}
        }}
        return;
    }}
#endif
    gemm_block(A, B, bias, C, M, N, K, K, N, N, g->mc, g->kc, g->nc{q.get("j0_zero", "")});
}}
"""
    return body


def bind(lib: ctypes.CDLL, knobs: dict[str, Any], A, B, bias, C):
    """A zero-argument callable running the kernel on these numpy arrays (kept alive by the closure)."""
    M, K = A.shape
    N = B.shape[1]
    if qgemm.parts(knobs) is not None:  # quantised B, packed once (cached) in the layout its packing reads
        args, pk = qgemm.args(knobs, A, B, bias, C)
        return struct_call(lib.pf_gemm, args, (A, B, pk, bias, C))
    args = GemmArgs(A.ctypes.data, B.ctypes.data, bias.ctypes.data if bias is not None else None, C.ctypes.data,
                    M, N, K, knobs["mc"], knobs["kc"], knobs["nc"], knobs["threads"], 0 if knobs["par"] == "n" else 1)
    return struct_call(lib.pf_gemm, args, (A, B, bias, C))


# -- the gemm problem: C = act(A @ B + bias), A [M, K], B [K, N] ------------------------------------------------------

def _inputs(p, rand):
    M, N, K = p.dims
    d = {"A": rand(M, K), "B": rand(K, N) / np.float32(math.sqrt(K))}
    if p.epilogue != "none":
        d["bias"] = rand(N)
    return d


def _torch(p, inp, out):
    import torch

    t = {k: torch.from_numpy(v) for k, v in inp.items()}
    return torch_dense(t["A"], t["B"], t.get("bias"), torch.from_numpy(out), p.epilogue)


FACTS = Facts(
    inputs=_inputs,
    output_shape=lambda p: (p.dims[0], p.dims[1]),
    reference=lambda p, f: apply_chain(f["A"] @ f["B"], p.epilogue, f.get("bias")),
    tolerance=lambda p, f: dense_tolerance(np.abs(f["A"]) @ np.abs(f["B"]) + np.abs(f.get("bias", 0.0)),
                                           p.dims[2], p.epilogue),
    flops=lambda p: 2.0 * p.dims[0] * p.dims[1] * p.dims[2] + chain_flops(p.epilogue) * p.dims[0] * p.dims[1],
    numpy=lambda p, inp, out: numpy_dense(inp["A"], inp["B"], inp.get("bias"), out, p.epilogue),
    torch=_torch,
)
