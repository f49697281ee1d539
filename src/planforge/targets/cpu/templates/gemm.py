"""GEMM template: C = act(A @ B + bias), fp32, row-major, BLIS-style blocking; or C = A @ B + bias + R.

Loops (outer to inner): jc over N by ``nc``, pc over K by ``kc`` (B block
packed into NR-wide panels when ``pack_b``), ic over M by ``mc`` (A block
packed into MR-tall panels when ``pack_a``), then the MR x NR register tiles
in ``order`` ("ji": columns outer, "ij": rows outer). The micro-kernel keeps
MR x NV vector accumulators in registers, unrolls K by ``unroll`` and applies
the epilogue (bias, ReLU, GELU) while the tile is still in registers on the
last K block. A residual R (the epilogue ``bias_add``) is copied into each
thread's block of C before its first K block, which then accumulates onto it
like any later one: no pass over C after the GEMM. With ``threads`` > 1 the
units of N (``par="n"``: NR-wide panels) or of M (``par="m"``: MR-row panels) are cut into one slice per
thread, each running the whole blocked loop; the slices are claimed
(``templates/parfor.py``), so a thread that starts late has its slice taken
by the caller instead of being waited for.

Compile-time knobs (baked into the source, one library each): mr, nv, pack_a,
pack_b, order, unroll, vec, pf (rows of B the micro-kernel prefetches ahead of
the row it multiplies: 0 or ``PF_ROWS``). Runtime knobs (passed per call, no
rebuild): mc, kc, nc, threads, par.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from ....ops.kernel import gemm_residual
from ....space import Space, categorical, pow2
from . import qgemm
from .common import epi_code, header, struct_call
from .parfor import PARFOR_C
from .scratch import aligned_zeros
from .epilogues import apply_chain, chain_flops, dense_tolerance, numpy_dense, torch_dense
from .facts import Facts



# Multiply-adds per fp32 vector lane below which a GEMM runs on one thread. 2**16 when every multi-threaded call
# woke a sleeping OpenMP team (10-15 us on the 2-core machine under load; ViT-tiny's plan 12.9 against 9.6 ms with
# its small GEMMs on one thread). On the process's shared pool, whose workers spin between steps, two threads won
# from 0.66 M MACs up, measured alone (AVX-512, bias + ReLU, best split of two threads against one): 144x32x144 7.1
# against 9.3 us, 36x384x64 9.4 against 12.3, 144x192x32 9.6 against 14.9, 9x960x160 17.5 against 27.8. 2**14
# per lane (as the convolution template's) is about 3 us of one core's FMA throughput.
PAR_MACS_PER_LANE = 2 ** 14

# Rows of B a micro-kernel with ``pf`` on prefetches ahead (every cache line of the row ``k + PF_ROWS`` of its
# panel, into the L1), so that weights coming from memory arrive before the row that multiplies them: packed
# panels run on into the next K block of the same panel, row-major B into the rows below. In a model whose
# weights outgrow the caches (GPT-2 with 6 layers, 19 MB) each weight comes from the L3 or memory in the whole
# call, where the hardware prefetcher, which stops at each 4 KiB page, leaves the FMAs waiting. Measured on a
# Zen 4 (two threads, weights out of the caches, ``targets/cpu/scrub.py``): 32x256x768 packed 73 us against 86,
# 32x1024x256 packed 101-110 against 113-129, row-major 32x256x768 87 against 91 (16 rows ahead: 77, 105, 86;
# 64: 73, 102, 90); with the weights in the caches all even (57-89 us either way). GPT-2 with 6 layers' whole
# call, a plan tuned without it: 1.90 against 2.00 ms with it forced on every GEMM (interleaved).
PF_ROWS = 32


class GemmArgs(ctypes.Structure):
    _fields_ = [("A", ctypes.c_void_p), ("B", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("C", ctypes.c_void_p),
                ("M", ctypes.c_int), ("N", ctypes.c_int), ("K", ctypes.c_int), ("mc", ctypes.c_int),
                ("kc", ctypes.c_int), ("nc", ctypes.c_int), ("threads", ctypes.c_int), ("par", ctypes.c_int),
                ("pre", ctypes.c_int), ("res", ctypes.c_void_p)]


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
            categorical("pf", (0, PF_ROWS)),
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
            # a GEMM that one thread does in a few microseconds stays on one thread
            "threads == 1 or m * n * k >= par_macs",
            "threads > 1 or par == 'n'",
        ],
        constants={"m": M, "n": N, "k": K, "vregs": profile.vector_registers, "par_macs": PAR_MACS_PER_LANE * lanes,
                   "l1_bytes": profile.caches["L1d"], "l2_bytes": profile.caches["L2"],
                   "l3_bytes": profile.caches.get("L3", profile.caches["L2"])},
    )


def _ukernel(mr: int, nv: int, pack_a: int, pack_b: int, unroll: int, name: str = "ukernel",
             rolled_epi: bool = False, pf: int = 0) -> str:
    """An mr x (nv vectors) micro-kernel, written out so every accumulator is a named register variable. Packed
    panels keep the full tile's strides (``MR``, ``NR``): an edge kernel reads the same padded panels.
    ``rolled_epi``: apply the epilogue (the compile-time ``EPI``) in a loop over the stored tile instead of per
    register (an edge kernel: less code to build). ``pf``: rows of B prefetched ahead (0: none; ``PF_ROWS``).
    A prefetch never faults: the rows past the matrix's last are fetched for nothing, not read."""
    a_at = (lambda i: f"a[k * MR + {i}]") if pack_a else (lambda i: f"a[{i} * lda + k]")
    b_at = (lambda v: f"b + k * NR + {v} * V") if pack_b else (lambda v: f"b + k * ldb + {v} * V")
    L = []
    L.append(f"static {'' if rolled_epi else 'inline '}void {name}(int kc, const float *restrict a, long lda, const float *restrict b, long ldb,"
             " float *restrict c, long ldc, int first, int last, const float *restrict bias, int epi) {")
    for i in range(mr):
        L.append("    " + " ".join(f"vf c{i}_{v} = vset(0.0f);" for v in range(nv)))
    L.append(f"    #pragma GCC unroll {unroll}")
    L.append("    for (int k = 0; k < kc; k++) {")
    if pf:  # each cache line (16 floats) of the row pf ahead
        ahead = f"b + (long)(k + {pf}) * NR" if pack_b else f"b + (long)(k + {pf}) * ldb"
        L.append(f"        for (int j = 0; j < NR; j += 16) __builtin_prefetch({ahead} + j, 0, 3);")
    for v in range(nv):
        L.append(f"        vf b{v} = vload({b_at(v)});")
    for i in range(mr):
        L.append(f"        {{ vf av = vset({a_at(i)}); " + " ".join(f"c{i}_{v} = av * b{v} + c{i}_{v};" for v in range(nv)) + " }")
    L.append("    }")
    if not rolled_epi:
        for v in range(nv):
            L.append(f"    vf bias{v} = last && epi ? vload(bias + {v} * V) : vset(0.0f);")
    for i in range(mr):
        for v in range(nv):
            tail = "" if rolled_epi else f" if (last) x = vepi(x, bias{v}, epi);"
            L.append(f"    {{ float *p = c + {i} * ldc + {v} * V; vf x = c{i}_{v}; if (!first) x += vload(p);{tail}"
                     " vstore(p, x); }")
    if rolled_epi:  # the epilogue over the stored tile, in a loop: written out per accumulator it is most of the code
        L.append(f"    if (last && EPI) epi_tile({mr}, {nv}, c, ldc, bias);")
    L.append("}")
    return "\n".join(L)


def _edges(mr: int, nv: int, pack_a: int, pack_b: int) -> str:
    """Vector kernels for the partial tiles and ``edge_vec``, which runs a partial tile (``mr`` of MR rows, ``nr``
    of NR columns) on them: r rows of NV vectors (an M edge), MR rows of n vectors (an N edge), and one row of n
    vectors, called per row for a corner; the columns past the last whole vector (``nr % V``) go to the scalar
    tile. Without them an M of 17 at MR 4 computed its last row, and a partial column panel, in scalar code.
    Edge kernels are not unrolled and not inlined (a fraction of the work, and each adds to the build time)."""
    shapes = sorted({(r, nv) for r in range(1, mr)} | {(mr, n) for n in range(1, nv)} | {(1, n) for n in range(1, nv)})
    out = ["""__attribute__((noinline)) static void epi_tile(int r, int n, float *c, long ldc, const float *bias) {
    for (int i = 0; i < r; i++)
        for (int v = 0; v < n; v++) { float *p = c + i * ldc + v * V; vstore(p, vepi(vload(p), vload(bias + v * V), EPI)); }
}"""] + ["__attribute__((noinline)) " + _ukernel(r, n, pack_a, pack_b, 1, f"uk_{r}_{n}", True) for r, n in shapes]

    def switch(on: str, cases, call) -> str:
        return f"switch ({on}) {{ " + " ".join(f"case {k}: {call(r, n)}; break;" for k, (r, n) in cases) + " default: break; }"

    args = "(kc, a, lda, b, ldb, c, ldc, first, last, bias, epi)"
    row = "(kc, a + i * " + ("1" if pack_a else "lda") + ", lda, b, ldb, c + i * ldc, ldc, first, last, bias, epi)"
    rows = switch("mr", [(r, (r, nv)) for r in range(1, mr)], lambda r, n: f"uk_{r}_{n}{args}")
    cols = switch("nw", [(n, (mr, n)) for n in range(1, nv)], lambda r, n: f"uk_{r}_{n}{args}")
    ones = switch("nw", [(n, (1, n)) for n in range(1, nv)], lambda r, n: f"uk_{r}_{n}{row}")
    out.append(f"""static void edge_vec(int mr, int nr, int kc, const float *a, long lda, const float *b, long ldb, long b_rs,
                     float *c, long ldc, int first, int last, const float *bias, int epi) {{
    int nw = nr / V;
    if (nw == NV) {{ {rows} }}
    else if (nw > 0 && mr == MR) {{ {cols} }}
    else if (nw > 0) for (int i = 0; i < mr; i++) {{ {ones} }}
    if (nr > nw * V)
        edge_tile(mr, nr - nw * V, kc, a, {"1, MR" if pack_a else "lda, 1"}, b + nw * V, b_rs, c + nw * V, ldc, first, last,
                  bias ? bias + nw * V : NULL, epi);
}}""")
    return "\n\n".join(out)


def source(knobs: dict[str, Any], epilogue: str) -> str:
    """C source for the compile-time knobs of ``knobs`` (runtime knobs are ignored here)."""
    mr, nv, pa, pb = knobs["mr"], knobs["nv"], knobs["pack_a"], knobs["pack_b"]
    epilogue, res = gemm_residual(epilogue)
    loop_ji = knobs["order"] == "ji"
    tile_loops = (("jr", "ir") if loop_ji else ("ir", "jr"))
    defs = (f"#define V {knobs['vec']}\n#define MR {mr}\n#define NV {nv}\n#define NR (NV * V)\n#define EPI {epi_code(epilogue)}\n"
            f"#define RES {int(res)}\n")
    loops = {
        "jr": "for (int jr = 0; jr < nb; jr += NR)",
        "ir": "for (int ir = 0; ir < mb; ir += MR)",
    }
    a_ptr = "ap + (ir / MR) * MR * kb" if pa else "A + (long)(ic + ir) * lda + pc"
    q = qgemm.parts(knobs) or {}  # a quantised B: its packing, type and the slices' column offsets
    if q and res:
        raise ValueError("a quantised GEMM takes no residual")
    r_at = (lambda off: f"g->res ? g->res + {off} : NULL") if res else (lambda off: "NULL")
    b_ptr = "B + (long)pc * ldb + jc + jr"
    if pb:  # B packed per call into bp, or (fp32, ``pre``) once when bound, as NR-wide panels of all K rows
        b_ptr = "bp + (jr / NR) * NR * kb" if q else "(pre ? B + (long)((jc + jr) / NR) * NR * K + (long)pc * NR : bp + (jr / NR) * NR * kb)"
    a_ld = "MR" if pa else "lda"
    b_ld = "NR" if pb else "ldb"
    pack_call = q.get("pack_call", "pack_b(kb, nb, B + (long)pc * ldb + jc, ldb, bp);")
    body = f"""
{defs}#define PF_CHUNKS 1  /* one chunk per thread, as a static split: each chunk packs its own A */
{header()}
{PARFOR_C}
{_ukernel(mr, nv, pa, pb, knobs['unroll'], pf=0 if q else knobs.get('pf', 0))}

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

{_edges(mr, nv, pa, pb)}

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

static void gemm_block(const float *A, {q.get("block_b", "const float *B")}, const float *bias, float *C, const float *R, int M, int N, int K,
                       long lda, long ldb, long ldc, int mc, int kc, int nc, int pre{q.get("block_j0", "")}) {{
    const int epi = EPI;
    for (int jc = 0; jc < N; jc += nc) {{
        int nb = N - jc < nc ? N - jc : nc;
        const int res = RES && R;  /* the residual first, so that every K block accumulates (R may be C) */
        if (res && R != C)
            for (int i = 0; i < M; i++) memcpy(C + (long)i * ldc + jc, R + (long)i * ldc + jc, (size_t)nb * sizeof(float));
        for (int pc = 0; pc < K; pc += kc) {{
            int kb = K - pc < kc ? K - pc : kc;
            int first = pc == 0 && !res, last = pc + kb >= K;
            float *bp = {"pre ? NULL : scratch(&buf_b, &cap_b, (size_t)((nb + NR - 1) / NR) * NR * kb)" if pb else "NULL"};
            {"if (!pre) " + pack_call if pb else ""}
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
                    }} else {{
                        edge_vec(mr, nr, kb, {a_ptr}, {a_ld}, {b_ptr}, {b_ld}, {b_ld}, c, ldc, first, last, bs, epi);
                    }}
                }}
            }}
        }}
    }}
}}

{q.get("args", "typedef struct {{ const float *A, *B, *bias; float *C; int M, N, K, mc, kc, nc, threads, par, pre; " + ("const float *res; " if res else "") + "}} gemm_args;").replace("{{", "{").replace("}}", "}")}

typedef struct {{ const gemm_args *g; int nc, pre; }} gemm_ctx;

/* units [lo, hi) of one call (NR-wide column panels for par n, MR-row panels for par m), on any thread */
static void gemm_units(const void *c, int lo, int hi) {{
    const gemm_ctx *x = (const gemm_ctx *)c;
    const gemm_args *g = x->g;
    {q.get("setup", "const float *A = g->A, *B = g->B, *bias = g->bias; float *C = g->C;")}
    int M = g->M, N = g->N, K = g->K, pre = x->pre, nc = x->nc;
    (void)pre;
    if (g->par == 0) {{
        int n0 = lo * NR, n1 = hi * NR < N ? hi * NR : N;
        if (n0 < n1) gemm_block(A, {q.get("b_cols", "pre ? B + (long)(n0 / NR) * NR * K : B + n0")}, bias ? bias + n0 : NULL, C + n0, {r_at("n0")}, M, n1 - n0, K, K, N, N,
                                g->mc, g->kc, nc, pre{q.get("j0", "")});
    }} else {{
        int m0 = lo * MR, m1 = hi * MR < M ? hi * MR : M;
        if (m0 < m1) gemm_block(A + (long)m0 * K, B, bias, C + (long)m0 * N, {r_at("(long)m0 * N")}, m1 - m0, N, K, K, N, N,
                                g->mc, g->kc, nc, pre{q.get("j0_zero", "")});
    }}
}}

void pf_gemm(const gemm_args *g) {{
    {q.get("setup", "const float *A = g->A, *B = g->B, *bias = g->bias; float *C = g->C;")}
    int M = g->M, N = g->N, K = g->K, pre = {"0" if q or not pb else "g->pre"};
    int nc = pre ? (g->nc + NR - 1) / NR * NR : g->nc;  /* prepacked panels: blocks start on a panel */
    if (g->threads > 1) {{  /* each thread's share claimed, not assigned: a late one's is taken by the caller */
        gemm_ctx x = {{ g, nc, pre }};
        pf_parfor(g->par == 0 ? (N + NR - 1) / NR : (M + MR - 1) / MR, g->threads, gemm_units, &x);
        return;
    }}
    gemm_block(A, B, bias, C, {r_at("0")}, M, N, K, K, N, N, g->mc, g->kc, nc, pre{q.get("j0_zero", "")});
}}
"""
    return body


def panels(B: np.ndarray, nr: int) -> np.ndarray:
    """B [K, N] as the micro-kernel reads packed panels: ceil(N / nr) panels of [K, nr], the last padded with zeros."""
    K, N = B.shape
    P = aligned_zeros((-(-N // nr), K, nr))
    for q in range(P.shape[0]):
        w = min(nr, N - q * nr)
        P[q, :, :w] = B[:, q * nr: q * nr + w]
    return P


def bind(lib: ctypes.CDLL, knobs: dict[str, Any], A, B, bias, C, const_b: bool = False, res=None):
    """A zero-argument callable running the kernel on these numpy arrays (kept alive by the closure).

    ``const_b`` (default False): B holds the same values at every call (a weight), so that with ``pack_b`` it is
    packed here, once, instead of at every call. ``res``: the residual [M, N] of a ``bias_add`` kernel (default
    None; it may be C itself)."""
    M, K = A.shape
    N = B.shape[1]
    if qgemm.parts(knobs) is not None:  # quantised B, packed once (cached) in the layout its packing reads
        args, pk = qgemm.args(knobs, A, B, bias, C)
        return struct_call(lib.pf_gemm, args, (A, B, pk, bias, C))
    pre = bool(const_b and knobs["pack_b"])
    Bp = panels(B, knobs["nv"] * knobs["vec"]) if pre else B
    args = GemmArgs(A.ctypes.data, Bp.ctypes.data, bias.ctypes.data if bias is not None else None, C.ctypes.data,
                    M, N, K, knobs["mc"], knobs["kc"], knobs["nc"], knobs["threads"], 0 if knobs["par"] == "n" else 1,
                    int(pre), res.ctypes.data if res is not None else None)
    return struct_call(lib.pf_gemm, args, (A, Bp, bias, C, res))


# -- the gemm problem: C = act(A @ B + bias) (or A @ B + bias + R), A [M, K], B [K, N] ---------------------------

def _inputs(p, rand):
    M, N, K = p.dims
    d = {"A": rand(M, K), "B": rand(K, N) / np.float32(math.sqrt(K))}
    if p.epilogue != "none":
        d["bias"] = rand(N)
    if gemm_residual(p.epilogue)[1]:
        d["res"] = rand(M, N)
    return d


def _torch(p, inp, out):
    import torch

    t = {k: torch.from_numpy(v) for k, v in inp.items()}
    return torch_dense(t["A"], t["B"], t.get("bias"), torch.from_numpy(out), p.epilogue, t.get("res"))


FACTS = Facts(
    inputs=_inputs,
    output_shape=lambda p: (p.dims[0], p.dims[1]),
    reference=lambda p, f: apply_chain(f["A"] @ f["B"], p.epilogue, f.get("bias"), f.get("res")),
    tolerance=lambda p, f: dense_tolerance(np.abs(f["A"]) @ np.abs(f["B"]) + np.abs(f.get("bias", 0.0))
                                           + np.abs(f.get("res", 0.0)), p.dims[2], p.epilogue),
    flops=lambda p: 2.0 * p.dims[0] * p.dims[1] * p.dims[2] + chain_flops(p.epilogue) * p.dims[0] * p.dims[1],
    numpy=lambda p, inp, out: numpy_dense(inp["A"], inp["B"], inp.get("bias"), out, p.epilogue, inp.get("res")),
    torch=_torch,
)
