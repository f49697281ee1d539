"""Winograd F(m x m, 3 x 3) convolutions in NHWC: the conv template's ``algo`` knob ``wino2`` (m = 2) and ``wino4``.

A 3x3, stride-1, undilated, ungrouped convolution computes each m x m block of outputs from a t x t input tile
(t = m + 2) as ``A^T [ (G g G^T) . (B^T d B) ] A`` (Lavin and Gray, 2016): the products per output pixel and channel
pair fall from 9 to t^2 / m^2 (4 for m = 2, 2.25 for m = 4), which is what a compute-bound 3x3 layer (ResNet's,
at 2x its peers' FLOP rate needed) has left to win once a direct convolution already runs at the FMA peak.

The kernel, per block of ``tb`` tiles (a thread's unit):
1. input transform: each tile's t x t pixels (zero outside the input: the padding is never copied) as vectors of
   channels, ``B^T d B`` -> ``vs[xi][tile][c]`` for the t^2 points ``xi``;
2. per block of ``ob`` vectors of output channels: t^2 small GEMMs ``ms[xi][tile][o] = vs[xi][tile][:] @
   u[xi][:][o]`` in register tiles of ``owb`` tiles x ``ob`` vectors (the direct template's tile shape, so the
   same register restriction holds), then the output transform ``A^T m A`` of each tile, the per-channel scale and
   shift, the epilogue chain (activations, a residual) and the store of the pixels inside the output.
The weights are transformed (``G g G^T``, in float64, then rounded) and packed once at bind time, as
``u[xi][block of ob vectors][C][ob * V]`` with the output channels padded to whole blocks. A layer with fewer
tile blocks than twice the threads splits each block's output-channel blocks over the threads (each thread then
transforms the block's input itself: a deep layer has few tiles and many channels).

The transforms are generated from the matrices: a zero coefficient emits nothing, +-1 an add or a subtract.
m = 4 needs coefficients up to 8 (A^T) and 5 (B^T), so it rounds a little more than m = 2 (the finalist walk's
numeric check judges each plan); both stay within the conv problem's tolerance on the shapes the tests draw.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .scratch import aligned_zeros

# (B^T, G, A^T) of F(m, 3), Lavin and Gray's points 0, +-1 (and +-2, +-1/2 for m = 4)
MATRICES = {
    2: ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
         [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
         [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}
ALGOS = {"wino2": 2, "wino4": 4}
TILE_BLOCKS = (8, 16, 32, 64)  # tiles per block (``tb``)


def tile_m(knobs: dict) -> int:
    """The output block m of a setting's ``algo`` (0: the direct template)."""
    return ALGOS.get(knobs.get("algo", "direct"), 0)


def applies(g: dict, layout: str) -> bool:
    """Whether a convolution (``conv.geometry``) has a Winograd form here: 3x3, stride 1, undilated, one group,
    NHWC (the e-graph's NHWC forms; an NCHW problem keeps the direct template and its layout copies)."""
    return (layout == "nhwc" and g["KH"] == g["KW"] == 3 and g["SH"] == g["SW"] == 1 and g["DH"] == g["DW"] == 1
            and g["G"] == 1)


def tiles(g: dict, m: int) -> int:
    """Tiles of m x m outputs that cover the output (the last row and column of tiles may overhang)."""
    return g["N"] * -(-g["OH"] // m) * -(-g["OW"] // m)


def op_counts(m: int) -> tuple[int, int]:
    """Vector operations per tile and channel vector: (input transform, output transform), loads and stores
    included, from the matrices' nonzero terms (each output of a pass costs its terms less one)."""
    bt, _, at = (np.asarray(x) for x in MATRICES[m])
    t = m + 2

    def pass_ops(mat, cols):  # one pass of ``mat`` over ``cols`` columns
        return sum(max(0, int(np.count_nonzero(r)) - 1) + int(np.count_nonzero(np.abs(r) != 1)) for r in mat) * cols

    tin = t * t + pass_ops(bt, t) + pass_ops(bt, t) + t * t
    tout = t * t + pass_ops(at, t) + pass_ops(at, m) + 3 * m * m  # scale, shift and store per pixel
    return tin, tout


def transform_weights(w: np.ndarray, m: int) -> np.ndarray:
    """``G g G^T`` of every (o, c) 3x3 kernel: [t*t, O, C] float32 (computed in float64)."""
    G = np.asarray(MATRICES[m][1], dtype=np.float64)
    u = np.einsum("ik,ockl,jl->ijoc", G, np.asarray(w, np.float64), G)
    t = m + 2
    return u.reshape(t * t, *w.shape[:2]).astype(np.float32)


def pack(w: np.ndarray, m: int, obw: int, slack: int) -> np.ndarray:
    """The transformed weights as the GEMMs read them: [t*t][O in blocks of obw][C][obw], zero-padded channels."""
    u = transform_weights(w, m)
    tt, O, C = u.shape
    nob = -(-O // obw)
    up = np.zeros((tt, nob * obw, C), np.float32)
    up[:, :O] = u
    out = aligned_zeros(tt * nob * C * obw + slack)
    out[:tt * nob * C * obw].reshape(tt, nob, C, obw)[:] = np.transpose(up.reshape(tt, nob, obw, C), (0, 1, 3, 2))
    return out


def _term(coef: float, name: str) -> str:
    if coef == 1:
        return f"+ {name}"
    if coef == -1:
        return f"- {name}"
    return f"+ {float(coef)!r}f * {name}" if coef > 0 else f"- {float(-coef)!r}f * {name}"


def _combo(row, names) -> str:
    """C of ``sum(row[k] * names[k])`` over the nonzero coefficients."""
    terms = [_term(c, n) for c, n in zip(row, names) if c != 0]
    if not terms:
        return "vset(0.0f)"
    s = " ".join(terms)
    return s[2:] if s.startswith("+ ") else "-" + s[2:]  # a leading "+ x" is "x", a leading "- x" "-x"


def _two_pass(mat, src: str, dst: str, rows_in: int, cols_in: int) -> list[str]:
    """``dst = mat @ src @ mat^T`` on named vectors ``{src}_i_j`` (rows_in x cols_in), through ``{dst}h_i_j``."""
    out_rows = len(mat)
    lines = []
    for i in range(out_rows):  # first pass: down the columns
        for j in range(cols_in):
            lines.append(f"vf {dst}h_{i}_{j} = {_combo(mat[i], [f'{src}_{k}_{j}' for k in range(rows_in)])};")
    for i in range(out_rows):  # second pass: along the rows
        for j in range(out_rows):
            lines.append(f"vf {dst}_{i}_{j} = {_combo(mat[j], [f'{dst}h_{i}_{k}' for k in range(cols_in)])};")
    return lines


def source(m: int, knobs: dict[str, Any], store) -> str:
    """The C of the Winograd kernel (after the conv template's ``#define``s, header and ``conv_args``):
    ``pf_conv(conv_args *)``.
    ``store(acc, offset, channel, lanes)`` is the conv template's scale, shift, chain and store of one vector."""
    bt, _, at = MATRICES[m]
    t = m + 2
    mr, ob, unroll, tb = knobs["owb"], knobs["ob"], knobs["unroll"], knobs["tb"]
    tbp = -(-tb // mr) * mr
    loads = []
    for i in range(t):
        for j in range(t):
            loads.append(f"vf d_{i}_{j} = r{i} && q{j} ? vload_n(xn + ((long)(ih0 + {i}) * W + iw0 + {j}) * C + c0, nc)"
                         f" : vset(0.0f);")
    vin = _two_pass(bt, "d", "v", t, t)
    vst = [f"vstore_n(dst + (long)({i * t + j}) * TBP * C + c0, v_{i}_{j}, nc);" for i in range(t) for j in range(t)]
    mld = [f"vf m_{i}_{j} = vload(ms + ((long)({i * t + j}) * TBP + row) * OBW + jv * V);"
           for i in range(t) for j in range(t)]
    yout = _two_pass(at, "m", "y", t, t)
    stores = "\n".join(
        f"                if (oh0 + {a} < OH && ow0 + {b} < OW) "
        + store(f"y_{a}_{b}", f"(((long)n * OH + oh0 + {a}) * OW + ow0 + {b}) * O + och", "och", "O - och")
        for a in range(m) for b in range(m))
    acc = " ".join(f"vf a{i}_{j} = vset(0.0f);" for i in range(mr) for j in range(ob))
    body = [f"vf w{j} = vload(uc + {j} * V);" for j in range(ob)]
    body += [f"{{ vf xv = vset(vr[(long){i} * C]); " + " ".join(f"a{i}_{j} = xv * w{j} + a{i}_{j};" for j in range(ob))
             + " }" for i in range(mr)]
    keep = " ".join(f"vstore(mx + (long)(r0 + {i}) * OBW + {j} * V, a{i}_{j});" for i in range(mr) for j in range(ob))
    return f"""
#define WM {m}
#define WT {t}
#define TH ((OH + WM - 1) / WM)
#define TW ((OW + WM - 1) / WM)
#define NT (N * TH * TW)
#define TB {tb}
#define TBP {tbp}
#define MR {mr}
#define WNOB ((O + OBW - 1) / OBW)
#define NBLK ((NT + TB - 1) / TB)

static __thread float *buf_vs, *buf_ms;
static __thread size_t cap_vs, cap_ms;

/* n < V channels left: the vector's other lanes zero (loads) or untouched (stores) */
static inline vf vload_n(const float *p, int n) {{
    if (n >= V) return vload(p);
    float t[V] = {{0}};
    memcpy(t, p, (size_t)n * sizeof(float));
    return vload(t);
}}
static inline void vstore_n(float *p, vf v, int n) {{
    if (n >= V) {{ vstore(p, v); return; }}
    float t[V];
    vstore(t, v);
    memcpy(p, t, (size_t)n * sizeof(float));
}}

/* tiles [t0, t1): B^T d B of each tile's WT x WT pixels, vs[xi][tile - t0][c] */
static void in_transform(const float *x, float *vs, int t0, int t1) {{
    for (int tl = t0; tl < t1; tl++) {{
        const int n = tl / (TH * TW), r = tl % (TH * TW), ih0 = r / TW * WM - PT, iw0 = r % TW * WM - PL;
        const float *xn = x + (long)n * H * W * C;
        float *dst = vs + (long)(tl - t0) * C;
        {" ".join(f"const int r{i} = (unsigned)(ih0 + {i}) < (unsigned)H;" for i in range(t))}
        {" ".join(f"const int q{j} = (unsigned)(iw0 + {j}) < (unsigned)W;" for j in range(t))}
        for (int c0 = 0; c0 < C; c0 += V) {{
            const int nc = C - c0;
            {chr(10).join("            " + s for s in loads).strip()}
            {chr(10).join("            " + s for s in vin).strip()}
            {chr(10).join("            " + s for s in vst).strip()}
        }}
    }}
}}

/* output-channel blocks [b_lo, b_hi) of the rows [0, nrows) of a block whose first tile is t0: the WT*WT GEMMs
   into ms, then A^T m A of each tile, the epilogue and the store */
static void gemm_out(const float *vs, const float *u, float *ms, const float *scale, const float *shift,
                     const float *R, float *Y, int t0, int nrows, int b_lo, int b_hi) {{
    for (int b = b_lo; b < b_hi; b++) {{
        for (int xi = 0; xi < WT * WT; xi++) {{
            const float *ux = u + ((long)xi * WNOB + b) * C * OBW;
            const float *vx = vs + (long)xi * TBP * C;
            float *mx = ms + (long)xi * TBP * OBW;
            for (int r0 = 0; r0 < nrows; r0 += MR) {{
                {acc}
                const float *vr = vx + (long)r0 * C;
                #pragma GCC unroll {unroll}
                for (int c = 0; c < C; c++, vr++) {{
                    const float *uc = ux + (long)c * OBW;
                    {" ".join(body)}
                }}
                {keep}
            }}
        }}
        for (int row = 0; row < nrows; row++) {{
            const int tl = t0 + row, n = tl / (TH * TW), r = tl % (TH * TW), oh0 = r / TW * WM, ow0 = r % TW * WM;
            for (int jv = 0; jv < OBV; jv++) {{
                const int och = b * OBW + jv * V;  /* (the store declares its own ch) */
                if (och >= O) break;
                {chr(10).join("                " + s for s in mld).strip()}
                {chr(10).join("                " + s for s in yout).strip()}
{stores}
            }}
        }}
    }}
}}

typedef struct {{ const conv_args *a; int split; }} wino_ctx;

static void wino_units(const void *cv, int lo, int hi) {{  /* units (tile block, share of its channel blocks) */
    const wino_ctx *c = (const wino_ctx *)cv;
    const conv_args *a = c->a;
    float *vs = scratch(&buf_vs, &cap_vs, (size_t)WT * WT * TBP * C + SLACK);
    float *ms = scratch(&buf_ms, &cap_ms, (size_t)WT * WT * TBP * OBW + SLACK);
    int have = -1;  /* the tile block whose transform vs holds */
    for (int i = lo; i < hi; i++) {{
        const int blk = i / c->split, s = i % c->split, t0 = blk * TB, t1 = t0 + TB < NT ? t0 + TB : NT;
        if (blk != have) {{ in_transform(a->x, vs, t0, t1); have = blk; }}
        gemm_out(vs, a->w, ms, a->scale, a->shift, a->res, a->y, t0, t1 - t0, WNOB * s / c->split,
                 WNOB * (s + 1) / c->split);
    }}
}}

void pf_conv(const conv_args *a) {{
    /* few tile blocks (a deep layer): each block's channel blocks shared out, so that every thread has work */
    int split = 1;
    if (NBLK < 2 * a->threads) {{
        split = (2 * a->threads + NBLK - 1) / NBLK;
        if (split > WNOB) split = WNOB;
    }}
    wino_ctx c = {{ a, split }};
    pf_parfor(NBLK * split, a->threads, wino_units, &c);
}}
"""


def executed_flops(g: dict, m: int, tb, mr, obw) -> dict[str, np.ndarray]:
    """FLOPs a Winograd point executes (numpy columns over points): ``gemm`` (its register tiles, padded rows and
    channels included), ``gemm_useful`` (the t^2 GEMMs on the real tiles and channels: what no run avoids) and
    ``transform`` (vector operations of both transforms, each counted as one FLOP per lane)."""
    t = m + 2
    nt = tiles(g, m)
    tb = np.minimum(np.asarray(tb, dtype=np.int64), nt)
    mr = np.asarray(mr, dtype=np.int64)
    blocks = -(-nt // tb)
    last = nt - (blocks - 1) * tb
    rows = (blocks - 1) * (-(-tb // mr) * mr) + -(-last // mr) * mr
    op = -(-g["O"] // np.asarray(obw, dtype=np.int64)) * np.asarray(obw, dtype=np.int64)
    tin, tout = op_counts(m)
    return {"gemm": 2.0 * t * t * rows * g["C"] * op, "gemm_useful": 2.0 * t * t * nt * g["C"] * g["O"],
            "transform": float(nt) * (g["C"] * tin + op * tout)}


def weight_bytes(g: dict, m: int, obw) -> np.ndarray:
    """Bytes of the packed transformed weights."""
    t = m + 2
    return 4.0 * t * t * g["C"] * (-(-g["O"] // np.asarray(obw)) * np.asarray(obw))


def scratch_bytes(g: dict, m: int, tb) -> np.ndarray:
    """Bytes of a thread's transformed input block (vs)."""
    return 4.0 * (m + 2) ** 2 * np.asarray(tb) * g["C"]


__all__ = ["ALGOS", "MATRICES", "TILE_BLOCKS", "applies", "executed_flops", "op_counts", "pack", "scratch_bytes",
           "source", "tile_m", "tiles", "transform_weights", "weight_bytes"]
