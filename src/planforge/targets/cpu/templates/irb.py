"""The inverted-residual block template (``Problem("irb", (N, H, W, C, E, O, K, S), "act1/act2/res")``), NHWC, fp32.

One kernel for ``y = dw(act1(x @ w1 + b1)) @ w2 + b2 (+ x)``, the depthwise convolution (KxK, stride S, padding
K // 2) followed by its activation ``act2``. Each work item keeps, in its thread's scratch, a ring of K expanded
input rows (``E`` channels, zero columns either side for the padding): for each of its output rows it expands the
input rows the depthwise window newly reaches (one at stride 1, two at stride 2) into the ring, runs the depthwise
row into a row buffer and projects that row into the output. With ``whole`` (small maps, a few rows of deep
channels, where the weights are most of the time) it expands the whole map into a padded map at once, then runs
every depthwise row, then projects every pixel: each weight is read once a call, not once per row. The expanded
tensor never leaves the core's caches: as three kernels it is written out and read back (MobileNetV2 at 96x96:
0.9 MB at 48x48), and each step reads what the other core wrote.

Work items (``split``): ``h``, bands of output rows (a band expands the rows its window needs, so the rows at a
band's edge are expanded by both: one or two rows in a band of many at 48x48, a third of the expansion at 6x6); or
``e``, groups of the expanded channels (each group expands, convolves and projects its channels for every row, the
projection then a partial sum over the group's channels: group 0 writes the output, with the bias and the residual,
the others a partial buffer each, added into the output by a second parallel loop). No work is done twice.

Register tiles: the expansion ``mr1`` pixels x ``nv1`` vectors of expanded channels (over the C input channels),
the depthwise ``owb`` output columns x ``cbv`` channel vectors (its K*K weights in registers where they fit, each
input vector loaded once per tile row), the projection ``mr2`` pixels x ``nv2`` vectors of output channels (over the
item's expanded channels; its last block compiled with its lane counts). With ``pf`` (``whole`` only: there each
weight is read once a call, and in a large model's whole call from memory) both weight streams are prefetched
``PF_AHEAD`` floats ahead, a line per 16 floats of each row a tile reads. Weights are packed at load time in the
order the tiles read them: the expansion [blocks of nv1 * vec channels][C][nv1 * vec], the depthwise [K*K][E] (its
scale folded in), the projection [blocks of nv2 * vec channels][E][nv2 * vec], channels padded with zeros (a padded
expanded channel's projection weights are zero, so it adds nothing whatever its activation makes of zero). The
scratch is the process's per-thread buffer, shared by every such kernel of a plan (``pf_use_scratch``): each call
writes the zero padding it reads.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from ....ops import REGISTRY
from ....ops.conv2d import conv_ref
from ....ops.conv_fused import apply_act
from ....ops.irb import unpack
from ....ops.kernel import activations, irb_epilogue
from ....space import Space, categorical
from .common import header, struct_call
from .conv import _vecs
from .epilogues import U32
from .facts import Facts
from .parfor import PARFOR_C
from .scratch import Scratch, aligned_zeros

SLACK = 64  # floats past the end of every packed buffer

# How far ahead (floats) ``pf`` prefetches a whole-map block's weight streams. MobileNetV2 at 96 on the 2-core
# Xeon guest, its kept plan with every whole-map block prefetching against none, interleaved in one process (two
# runs of 15 rounds): 0.757 and 0.782 ms against 0.788 and 0.809 at 512 floats, 0.758-0.790 at 1024 and 2048;
# the NTA hint instead (no L2 copy) ran 1.43 ms, the blocks with several tiles re-reading their weights from memory.
PF_AHEAD = 512


class IrbArgs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("x", "w1", "b1", "wd", "bd", "w2", "b2", "y", "part")] + \
               [("threads", ctypes.c_int)]


def geometry(p) -> dict[str, int]:
    N, H, W, C, E, O, K, S = p.dims
    P = K // 2
    return dict(N=N, H=H, W=W, C=C, E=E, O=O, K=K, S=S, P=P, OH=(H + 2 * P - K) // S + 1,
                OW=(W + 2 * P - K) // S + 1)


def _macs(g) -> int:
    return g["N"] * (g["H"] * g["W"] * g["C"] * g["E"] + g["OH"] * g["OW"] * g["E"] * (g["K"] ** 2 + g["O"]))


def space(p, lim) -> Space:
    """Vector width, the three register tiles, threads and how the work is split (restrictions: each tile in the
    register file, no tile wider than its channels call for, at least one block of expanded channels per group)."""
    g = geometry(p)
    consts = {"e": g["E"], "o": g["O"], "w": g["W"], "ow": g["OW"], "rows": g["N"] * g["OH"], "kk": g["K"] ** 2,
              "hw": g["H"] * g["W"], "ohow": g["OH"] * g["OW"], "vregs": lim.vector_registers,
              "map_bytes": 4 * g["E"] * ((g["H"] + 2 * g["P"]) * (g["W"] + 2 * g["P"]) + g["OH"] * g["OW"]),
              "l2_bytes": lim.caches["L2"]}
    knobs = [categorical("vec", _vecs(lim)), categorical("mr1", (2, 3, 4, 6, 8, 9)), categorical("nv1", (1, 2, 3, 4)),
             categorical("owb", (1, 2, 4, 6)), categorical("cbv", (1, 2)), categorical("mr2", (2, 3, 4, 6, 8, 9)),
             categorical("nv2", (1, 2, 3, 4)),
             categorical("threads", tuple(range(1, lim.physical_cores + 1))), categorical("split", ("h", "e")),
             categorical("whole", (0, 1)), categorical("pf", (0, 1))]
    return Space(knobs, [
        "mr1 * nv1 + nv1 + 1 <= vregs", "mr2 * nv2 + nv2 + 1 <= vregs",
        "cbv * (kk + owb) + 2 <= vregs or (owb == 1 and cbv == 1)",
        "mr1 <= max(2, hw if whole else w)", "mr2 <= max(2, ohow if whole else ow)", "owb <= max(1, ow)",
        # the whole map (expanded, padded, and the depthwise output) in half the L2 of the threads sharing it; its
        # work split by channel groups
        "whole == 0 or (map_bytes <= threads * l2_bytes // 2 and (split == 'e' or threads == 1))",
        "pf == 0 or whole == 1",  # row by row, the weights are read once per row: from the caches after the first
        "nv1 * vec <= max(vec, e + vec - 1)", "nv2 * vec <= max(vec, o + vec - 1)",
        # one split when there is one thread; row bands need rows, channel groups blocks of channels
        "threads > 1 or split == 'h'", "split != 'h' or threads <= rows",
        "split != 'e' or threads * nv1 * vec <= e + nv1 * vec - 1",
    ], constants=consts)


def defaults(p, lim) -> dict[str, Any]:
    """Row bands through the ring on large maps; on small ones (a few rows, deep channels: most of a block's time
    is its weights) the whole map at once, split by channel groups, so that each weight is read once a call."""
    g = geometry(p)
    vec = max(_vecs(lim))
    regs = lim.vector_registers
    threads = min(lim.physical_cores, g["N"] * g["OH"])
    map_bytes = 4 * g["E"] * ((g["H"] + 2 * g["P"]) * (g["W"] + 2 * g["P"]) + g["OH"] * g["OW"])
    whole = int(g["OH"] * g["OW"] <= 64 and map_bytes <= threads * lim.caches["L2"] // 2)

    def nv(ch):
        return max(x for x in (1, 2, 3, 4) if x * vec <= max(vec, ch + vec - 1) and 4 * x + x + 1 <= regs)

    nv1, nv2 = nv(g["E"]), nv(g["O"])
    split = "e" if whole or g["OH"] < 8 * threads else "h"
    if split == "e" and threads * nv1 * vec > g["E"] + nv1 * vec - 1:
        split, whole = "h", 0
    if threads == 1:
        split = "h"

    def mr(n, nvx):  # the widest tile the registers hold that wastes fewest pixels of ``n``
        fits = [x for x in (2, 3, 4, 6, 8, 9) if x * nvx + nvx + 1 <= regs and x <= max(2, n)]
        return min(fits, key=lambda x: (-(-n // x) * x - n, -x))

    owb = max(x for x in (1, 2, 4) if x == 1 or (g["K"] ** 2 + x + 2 <= regs and x <= g["OW"]))
    return {"vec": vec, "mr1": mr(g["H"] * g["W"] if whole else g["W"], nv1), "nv1": nv1, "owb": owb, "cbv": 1,
            "mr2": mr(g["OH"] * g["OW"] if whole else g["OW"], nv2), "nv2": nv2, "threads": threads, "split": split,
            "whole": whole, "pf": whole}


# -- C ------------------------------------------------------------------------------------------------------------

def _act(name: str) -> str:
    """The vector C of an activation on ``v`` (none for ``none`` and ``copy``)."""
    if name in ("none", "copy"):
        return ""
    return REGISTRY[activations()[name]].epilogue.vec


def _blocks(g, knobs) -> dict[str, int]:
    V = knobs["vec"]
    nb1w, nb2w = knobs["nv1"] * V, knobs["nv2"] * V
    nblk1, nblk2 = -(-g["E"] // nb1w), -(-g["O"] // nb2w)
    items = int(knobs["threads"])
    split_e = int(knobs["split"] == "e" and items > 1)
    ecs = (-(-nblk1 // items) if split_e else nblk1) * nb1w
    return {"V": V, "NB1": nb1w, "NBLK1": nblk1, "EP": nblk1 * nb1w, "NB2": nb2w, "NBLK2": nblk2, "OP": nblk2 * nb2w,
            "ITEMS": items, "SPLIT_E": split_e, "ECS": ecs}


def _ahead(row: str, width: int) -> str:
    """The prefetches of the weight row at ``row`` (a C expression) ``PF_AHEAD`` floats on: a line per 16 of its
    ``width`` floats."""
    return " ".join(f"__builtin_prefetch({row} + {PF_AHEAD + 16 * j}, 0, 3);" for j in range(-(-width // 16)))


def _exp_tile(mr: int, nv: int, act: str, whole: bool = False, pf: int = 0, vec: int = 16) -> str:
    """One register tile of the expansion: ``mr`` pixels (of one row; of the flattened map from pixel ``p0`` with
    ``whole``, each stored at its place in the padded map) x ``nv`` vectors; ``pf``: the weight row ``PF_AHEAD``
    floats on prefetched."""
    at = (lambda i: f"dst + (long)(((p0 + {i}) / W) * (W + 2 * P) + (p0 + {i}) % W) * ECS") if whole else \
        (lambda i: f"dst + {i} * ECS")
    acc = " ".join(f"vf a{i}_{j} = vload(bb + {j} * V);" for i in range(mr) for j in range(nv))
    loads = " ".join(f"vf w{j} = vload(wb + (long)k * NB1 + {j} * V);" for j in range(nv))
    if pf:
        loads += " " + _ahead("wb + (long)k * NB1", nv * vec)
    fmas = " ".join(f"{{ vf xv = vset(xr[{i} * C + k]); " + " ".join(f"a{i}_{j} = xv * w{j} + a{i}_{j};"
                                                                   for j in range(nv)) + " }" for i in range(mr))
    stores = " ".join(f"{{ vf v = a{i}_{j}; {act} vstore({at(i)} + {j} * V, v); }}"
                      for i in range(mr) for j in range(nv))
    return f"""
static inline void exp_tile_{mr}(const float *xr, const float *wb, const float *bb, float *dst, int p0) {{
    (void)p0;
    {acc}
    #pragma GCC unroll 2
    for (int k = 0; k < C; k++) {{ {loads} {fmas} }}
    {stores}
}}
"""


def _expand_c(knobs, g, act1: str) -> str:
    """``expand_row``: the expansion of the ``NPX`` pixels at ``xr`` (an input row; with ``whole``, the whole map,
    stored into the padded map) into ``dst``, for the channel blocks [blo, bhi)."""
    whole = bool(knobs.get("whole", 0))
    npx = g["H"] * g["W"] if whole else g["W"]
    if act1 == "copy":  # no expansion: the ring rows are the input's own channels
        at = "(long)((p / W) * (W + 2 * P) + p % W)" if whole else "(long)p"
        return f"""
static void expand_row(const float *xr, const float *w1, const float *b1, float *dst, int blo, int bhi) {{
    (void)w1; (void)b1;
    const int e0 = blo * NB1, e1 = bhi * NB1 < E ? bhi * NB1 : E, ec = (bhi - blo) * NB1;
    for (int p = 0; p < {npx}; p++) {{
        memcpy(dst + {at} * ECS, xr + (long)p * C + e0, sizeof(float) * (e1 - e0));
        /* the block's channels past E: zeros, not what the shared scratch held (a NaN there times a zero weight) */
        if (ec > e1 - e0) memset(dst + {at} * ECS + (e1 - e0), 0, sizeof(float) * (ec - (e1 - e0)));
    }}
}}
"""
    mr, nv = knobs["mr1"], knobs["nv1"]
    tail = npx % mr
    pf, vec = bool(knobs.get("pf", 0)) and whole, knobs["vec"]
    body = _exp_tile(mr, nv, _act(act1), whole, pf, vec) + (_exp_tile(tail, nv, _act(act1), whole, pf, vec)
                                                            if tail else "")
    at = (lambda w: "d") if whole else (lambda w: f"d + (long){w} * ECS")
    return body + f"""
static void expand_row(const float *xr, const float *w1, const float *b1, float *dst, int blo, int bhi) {{
    for (int jb = blo; jb < bhi; jb++) {{
        const float *wb = w1 + (long)jb * C * NB1, *bb = b1 + (long)jb * NB1;
        float *d = dst + (long)(jb - blo) * NB1;
        int w0 = 0;
        for (; w0 + {mr} <= {npx}; w0 += {mr}) exp_tile_{mr}(xr + (long)w0 * C, wb, bb, {at("w0")}, w0);
        {f"exp_tile_{tail}(xr + (long)w0 * C, wb, bb, {at('w0')}, w0);" if tail else "(void)w0;"}
    }}
}}
"""


def _dw_c(knobs, g, act2: str, regs: int) -> str:
    """``dw_row``: a depthwise output row of the item's channels, in tiles of ``owb`` columns x ``cbv`` channel
    vectors (``cbv`` 2: twice the independent FMA chains of a tile; the channels past the last pair one vector at a
    time), each tile's K*K weights in registers where they fit."""
    K, S, OW = g["K"], g["S"], g["OW"]
    owb, cbv = knobs["owb"], knobs.get("cbv", 1)

    def loop(nc: int) -> str:
        in_regs = nc * (K * K + owb) + 2 <= regs
        wdecl = " ".join(f"vf k{t}_{q} = vload(wd + (long){t} * EP + e0 + c + {q} * V);"
                         for t in range(K * K) for q in range(nc)) if in_regs else ""

        def wk(t, q):
            return f"k{t}_{q}" if in_regs else f"vload(wd + (long){t} * EP + e0 + c + {q} * V)"

        def tile(nw: int) -> str:
            lines = [" ".join(f"vf a{i}_{q} = bias{q};" for i in range(nw) for q in range(nc))]
            for kh in range(K):
                lines.append(f"{{ const float *r = rp[{kh}] + (long)ow0 * S * ECS + c;")
                for j in range((nw - 1) * S + K):
                    uses = [(i, j - i * S) for i in range(nw) if 0 <= j - i * S < K]
                    for q in range(nc):
                        if uses:
                            lines.append(f"  {{ vf xv = vload(r + (long){j} * ECS + {q} * V); "
                                         + " ".join(f"a{i}_{q} = xv * {wk(kh * K + kw, q)} + a{i}_{q};"
                                                    for i, kw in uses) + " }")
                lines.append("}")
            lines.append(" ".join(f"{{ vf v = a{i}_{q}; {_act(act2)} vstore(drow + (long)(ow0 + {i}) * ECS + c + "
                                  f"{q} * V, v); }}" for i in range(nw) for q in range(nc)))
            return "\n            ".join(lines)

        tail = OW % owb
        bias = " ".join(f"const vf bias{q} = vload(bd + e0 + c + {q} * V);" for q in range(nc))
        return f"""for (; c + {nc} * V <= ec; c += {nc} * V) {{
        {wdecl}
        {bias}
        int ow0 = 0;
        for (; ow0 + {owb} <= OW; ow0 += {owb}) {{
            {tile(owb)}
        }}
        {"{ " + tile(tail) + " }" if tail else "(void)ow0;"}
    }}"""

    return f"""
static void dw_row(const float *const *rp, const float *wd, const float *bd, float *drow, int e0, int ec) {{
    int c = 0;
    {loop(cbv)}
    {loop(1) if cbv > 1 else ""}
}}
"""


def _proj_c(knobs, g, res: bool) -> str:
    """``proj_row`` (the output, with the bias and the residual) and ``proj_part`` (a channel group's partial sums,
    rows of OP): tiles of ``mr2`` pixels x ``nv2`` vectors over the item's expanded channels. The full blocks of
    output channels in a loop, then the block past the last full one with its lane counts known when compiled: its
    vectors past O left out, a partial one stored (and its residual loaded) by a fixed-size copy, so that no
    accumulator is indexed by a run-time lane (which kept every accumulator of the tile in memory)."""
    mr, nv, V = knobs["mr2"], knobs["nv2"], knobs["vec"]
    O, nb2 = g["O"], knobs["nv2"] * knobs["vec"]
    full, rest = O // nb2, O % nb2

    def tile(nw: int, first: bool, lanes: list[int]) -> str:
        js = [j for j, nl in enumerate(lanes) if nl > 0]
        init = []
        for i in range(nw):
            for j in js:
                if first:
                    o = f"o0 + {j} * V"
                    if res and lanes[j] == V:
                        r = f" + vload(xres + (long)(ow0 + {i}) * C + {o})"
                    elif res:
                        init.append(f"vf rv{i}_{j} = vset(0.0f); memcpy(&rv{i}_{j}, xres + (long)(ow0 + {i}) * C "
                                    f"+ {o}, {lanes[j]} * sizeof(float));")
                        r = f" + rv{i}_{j}"
                    else:
                        r = ""
                    init.append(f"vf a{i}_{j} = vload(b2 + {o}){r};")
                else:
                    init.append(f"vf a{i}_{j} = vset(0.0f);")
        loads = " ".join(f"vf w{j} = vload(wb + (long)k * NB2 + {j} * V);" for j in js)
        if knobs.get("pf", 0) and knobs.get("whole", 0):
            loads += " " + _ahead("wb + (long)k * NB2", len(js) * V)
        fmas = " ".join(f"{{ vf xv = vset(drow[(long)(ow0 + {i}) * ECS + k]); "
                        + " ".join(f"a{i}_{j} = xv * w{j} + a{i}_{j};" for j in js) + " }" for i in range(nw))
        st = []
        for i in range(nw):
            for j in js:
                if not first:
                    st.append(f"vstore(yrow + (long)(ow0 + {i}) * OP + o0 + {j} * V, a{i}_{j});")
                elif lanes[j] == V:
                    st.append(f"vstore(yrow + (long)(ow0 + {i}) * O + o0 + {j} * V, a{i}_{j});")
                else:
                    st.append(f"memcpy(yrow + (long)(ow0 + {i}) * O + o0 + {j} * V, &a{i}_{j}, "
                              f"{lanes[j]} * sizeof(float));")
        return f"""{" ".join(init)}
            #pragma GCC unroll 2
            for (int k = 0; k < ec; k++) {{ {loads} {fmas} }}
            {" ".join(st)}"""

    npx = g["OH"] * g["OW"] if knobs.get("whole", 0) else g["OW"]
    tail = npx % mr

    def block(first: bool, lanes: list[int]) -> str:
        return f"""const float *wb = w2 + ((long)ob * EP + e0) * NB2;
        const int o0 = ob * NB2;
        int ow0 = 0;
        for (; ow0 + {mr} <= {npx}; ow0 += {mr}) {{
            {tile(mr, first, lanes)}
        }}
        {"{ " + tile(tail, first, lanes) + " }" if tail else "(void)ow0;"}"""

    out = []
    last = [max(0, min(V, rest - j * V)) for j in range(nv)]
    for first in (True, False):
        name = "proj_row" if first else "proj_part"
        out.append(f"""
static void {name}(const float *drow, const float *w2, const float *b2, const float *xres, float *yrow, int e0,
                   int ec) {{
    (void)b2; (void)xres;
    for (int ob = 0; ob < {full}; ob++) {{
        {block(first, [V] * nv)}
    }}
    {"{ const int ob = " + str(full) + "; " + block(first, last) + " }" if rest else ""}
}}
""")
    return "".join(out)


_MAIN = r"""
typedef struct { const float *x, *w1, *b1, *wd, *bd, *w2, *b2; float *y, *part; int threads; } irb_args;

#define WP2 (W + 2 * P)
#define RING_ROW ((size_t)WP2 * ECS)
#if WHOLE
#define BUF_FLOATS ((size_t)(H + 2 * P) * RING_ROW + (size_t)OH * OW * ECS + SLACK)
#else
#define BUF_FLOATS ((size_t)(K + 1) * RING_ROW + (size_t)OW * ECS + SLACK)
#endif

/* the thread's expanded rows (a ring of K and a row of zeros for the padding rows; or the whole padded map) and the
   depthwise output: the process's per-thread scratch, which the plan's other kernels use too (``pf_use_scratch``),
   else one of this library's own */
static float *(*irb_shared)(size_t);
__attribute__((visibility("default"))) void pf_use_scratch(void *fn) { irb_shared = (float *(*)(size_t))fn; }
static __thread float *irb_buf;
static __thread size_t irb_cap;
static float *irb_scratch(void) {
    if (irb_shared) return irb_shared(BUF_FLOATS);
    if (irb_cap < BUF_FLOATS) {
        free(irb_buf);
        irb_buf = aligned_alloc(64, ((BUF_FLOATS * sizeof(float) + 63) / 64) * 64);
        irb_cap = irb_buf ? BUF_FLOATS : 0;
    }
    return irb_buf;
}

/* zeros where the depthwise window reads the padding: the row of zeros and each ring row's padding columns; or the
   whole map's border (the scratch is shared, so every call writes them) */
static void irb_zero_pads(float *buf, int ec) {
    const size_t px = ECS, n = sizeof(float) * ec;
#if WHOLE
    for (int r = 0; r < H + 2 * P; r++)
        for (int c = 0; c < WP2; c++)
            if (r < P || r >= H + P || c < P || c >= W + P) memset(buf + ((size_t)r * WP2 + c) * px, 0, n);
#else
    for (int c = 0; c < WP2; c++) memset(buf + (size_t)K * RING_ROW + (size_t)c * px, 0, n);
    for (int r = 0; r < K; r++)
        for (int c = 0; c < P; c++) {
            memset(buf + (size_t)r * RING_ROW + (size_t)c * px, 0, n);
            memset(buf + (size_t)r * RING_ROW + (size_t)(W + P + c) * px, 0, n);
        }
#endif
}

typedef struct { const irb_args *a; } irb_ctx;

static void irb_items(const void *cx, int lo, int hi) {
    const irb_args *a = ((const irb_ctx *)cx)->a;
    float *buf = irb_scratch();
    if (!buf) return;
    for (int it = lo; it < hi; it++) {
        const int g = SPLIT_E ? it : 0;
        const int blo = SPLIT_E ? g * NBLK1 / ITEMS : 0, bhi = SPLIT_E ? (g + 1) * NBLK1 / ITEMS : NBLK1;
        const int e0 = blo * NB1, ec = (bhi - blo) * NB1;
        irb_zero_pads(buf, ec);
        for (int n = 0; n < N; n++) {
            const float *xn = a->x + (long)n * H * W * C;
#if WHOLE  /* the whole map expanded, then every depthwise row, then the projection of every pixel */
            float *dout = buf + (size_t)(H + 2 * P) * RING_ROW;
            expand_row(xn, a->w1, a->b1, buf + ((size_t)P * WP2 + P) * ECS, blo, bhi);
            for (int oh = 0; oh < OH; oh++) {
                const float *rp[K];
                for (int kh = 0; kh < K; kh++) rp[kh] = buf + (size_t)(oh * S + kh) * RING_ROW;
                dw_row(rp, a->wd, a->bd, dout + (size_t)oh * OW * ECS, e0, ec);
            }
            const long pix = (long)n * OH * OW;
            if (g == 0)
                proj_row(dout, a->w2, a->b2, RES ? xn : NULL, a->y + pix * O, e0, ec);
            else
                proj_part(dout, a->w2, a->b2, NULL, a->part + ((long)(g - 1) * N * OH * OW + pix) * OP, e0, ec);
#else  /* row by row through a ring of K expanded rows */
            float *ring = buf, *zero = buf + (size_t)K * RING_ROW, *drow = buf + (size_t)(K + 1) * RING_ROW;
            const int r0 = SPLIT_E ? 0 : it * OH / ITEMS, r1 = SPLIT_E ? OH : (it + 1) * OH / ITEMS;
            int have = -1;  /* the ring holds the expanded input rows up to this one */
            int started = 0;
            for (int oh = r0; oh < r1; oh++) {
                const float *rp[K];
                const int top = oh * S - P;
                for (int kh = 0; kh < K; kh++) {
                    const int ih = top + kh;
                    if (ih < 0 || ih >= H) { rp[kh] = zero; continue; }
                    if (!started || ih > have) {
                        int r = started && have + 1 > top ? have + 1 : top;
                        if (r < 0) r = 0;
                        for (; r <= ih; r++)
                            expand_row(xn + (long)r * W * C, a->w1, a->b1,
                                       ring + (size_t)(r % K) * RING_ROW + (size_t)P * ECS, blo, bhi);
                        have = ih;
                        started = 1;
                    }
                    rp[kh] = ring + (size_t)(ih % K) * RING_ROW;
                }
                dw_row(rp, a->wd, a->bd, drow, e0, ec);
                const long pix = ((long)n * OH + oh) * OW;
                if (g == 0)
                    proj_row(drow, a->w2, a->b2, RES ? xn + (long)oh * W * C : NULL, a->y + pix * O, e0, ec);
                else
                    proj_part(drow, a->w2, a->b2, NULL, a->part + ((long)(g - 1) * N * OH * OW + pix) * OP, e0, ec);
            }
#endif
        }
    }
}

/* the channel groups' partial projections added into the output, rows [lo, hi) of N x OH */
static void irb_reduce(const void *cx, int lo, int hi) {
    const irb_args *a = ((const irb_ctx *)cx)->a;
    for (int r = lo; r < hi; r++)
        for (int ow = 0; ow < OW; ow++) {
            float *yp = a->y + ((long)r * OW + ow) * O;
            for (int g = 1; g < ITEMS; g++) {
                const float *pp = a->part + (((long)(g - 1) * N * OH + r) * OW + ow) * OP;
                int o = 0;
                for (; o + V <= O; o += V) vstore(yp + o, vload(yp + o) + vload(pp + o));
                for (; o < O; o++) yp[o] += pp[o];
            }
        }
}

void pf_irb(const irb_args *a) {
    irb_ctx c = { a };
    pf_parfor(ITEMS, a->threads, irb_items, &c);
    if (SPLIT_E) pf_parfor(N * OH, a->threads, irb_reduce, &c);
}
"""


def source(p, knobs: dict[str, Any]) -> str:
    g = geometry(p)
    regs = 32 if knobs["vec"] >= 16 else 16  # AVX-512's register file, else AVX2's (x86's widths)
    act1, act2, res = irb_epilogue(p)
    d = {**g, **_blocks(g, knobs), "RES": int(res), "SLACK": SLACK, "WHOLE": int(knobs.get("whole", 0))}
    defs = "".join(f"#define {k} {v}\n" for k, v in d.items())
    return (defs + header() + PARFOR_C + _expand_c(knobs, g, act1) + _dw_c(knobs, g, act2, regs)
            + _proj_c(knobs, g, res) + _MAIN)


# -- binding: weights packed at load time ---------------------------------------------------------------------------

def plan_inputs(p, ins: list) -> dict:
    return {"x": ins[0], "pack": ins[1]}


def _unpacked(p, pack):
    act1, _, _ = irb_epilogue(p)
    return unpack(np.asarray(pack, np.float32), p.dims, act1 != "copy")


def pack_weights(p, knobs, pack) -> dict[str, np.ndarray]:
    """The packed buffers the kernel reads (see the module's docstring), from the block's ``irb_pack`` vector."""
    g = geometry(p)
    b = _blocks(g, knobs)
    C, E, O, K = g["C"], g["E"], g["O"], g["K"]
    w1, b1, wd, scale, shift, w2, b2 = _unpacked(p, pack)
    out = {}
    if w1 is not None:
        w1p = np.zeros((b["NBLK1"], C, b["NB1"]), np.float32)
        wpad = np.zeros((C, b["EP"]), np.float32)
        wpad[:, :E] = w1
        w1p[:] = np.transpose(wpad.reshape(C, b["NBLK1"], b["NB1"]), (1, 0, 2))
        out["w1"] = _flat(w1p)
        out["b1"] = _flat(np.pad(b1, (0, b["EP"] - E)))
    else:
        out["w1"] = out["b1"] = aligned_zeros(SLACK)
    wdp = np.zeros((K * K, b["EP"]), np.float32)
    wdp[:, :E] = (wd[:, 0] * scale.reshape(-1, 1, 1)).reshape(E, K * K).T
    out["wd"] = _flat(wdp)
    out["bd"] = _flat(np.pad(shift, (0, b["EP"] - E)))
    w2pad = np.zeros((b["EP"], b["OP"]), np.float32)
    w2pad[:E, :O] = w2
    out["w2"] = _flat(np.transpose(w2pad.reshape(b["EP"], b["NBLK2"], b["NB2"]), (1, 0, 2)))
    out["b2"] = _flat(np.pad(b2, (0, b["OP"] - O)))
    return out


def _flat(a: np.ndarray) -> np.ndarray:
    buf = aligned_zeros(a.size + SLACK)
    buf[:a.size] = np.asarray(a, np.float32).reshape(-1)
    return buf


def bind(lib, p, knobs, inputs: dict, out: np.ndarray):
    g = geometry(p)
    b = _blocks(g, knobs)
    w = pack_weights(p, knobs, inputs["pack"])
    x = inputs["x"]
    threads = int(knobs["threads"])
    ptr = lambda a: None if a is None else a.ctypes.data  # noqa: E731
    args = IrbArgs(ptr(x), *(ptr(w[k]) for k in ("w1", "b1", "wd", "bd", "w2", "b2")), ptr(out), None, threads)
    part = (b["ITEMS"] - 1) * g["N"] * g["OH"] * g["OW"] * b["OP"] + SLACK if b["SPLIT_E"] else 0
    scratch = Scratch(args, {"part": part} if part else {}, shareable=threads == 1)
    run = struct_call(lib.pf_irb, args, (inputs, w, out, scratch))
    run.scratch = scratch
    return run


# -- the irb problem's facts ----------------------------------------------------------------------------------------

def output_shape(p):
    g = geometry(p)
    return (g["N"], g["OH"], g["OW"], g["O"])


def _inputs(p, rand):
    g = geometry(p)
    act1, _, _ = irb_epilogue(p)
    C, E, O, K = g["C"], g["E"], g["O"], g["K"]
    parts = []
    if act1 != "copy":
        parts.append(np.concatenate([rand(C, E) / np.float32(math.sqrt(C)), 0.1 * rand(1, E)]))
    parts.append(np.concatenate([rand(E, K * K) / np.float32(K), 1.0 + 0.1 * rand(E, 1), 0.1 * rand(E, 1)], axis=1))
    parts.append(np.concatenate([rand(E, O) / np.float32(math.sqrt(E)), 0.1 * rand(1, O)]))
    pack = np.concatenate([np.asarray(t, np.float32).reshape(-1) for t in parts])
    return {"x": np.ascontiguousarray(rand(g["N"], g["H"], g["W"], C), dtype=np.float32),
            "pack": np.ascontiguousarray(pack, dtype=np.float32)}


def _forward(p, x, w1, b1, wd, shift, w2, b2, act=True):
    """The block in ``x``'s dtype (``act`` False: the activations replaced by 1.5 |v|, a bound of every one of them
    on the magnitudes a tolerance needs)."""
    g = geometry(p)
    act1, act2, res = irb_epilogue(p)
    f1 = (lambda v, a: apply_act(v, a)) if act else (lambda v, a: v if a in ("none", "copy") else 1.5 * np.abs(v))
    h = x if w1 is None else f1(x @ w1 + b1, act1)
    y = conv_ref(np.transpose(h, (0, 3, 1, 2)), wd, None, {"kernel": (g["K"], g["K"]), "stride": (g["S"], g["S"]),
                                                           "pads": (g["P"],) * 4, "dilation": (1, 1), "groups": g["E"]})
    y = f1(np.transpose(y, (0, 2, 3, 1)) + shift, act2)
    y = y @ w2 + b2
    return y + x if res else y


def reference(p, f):
    w1, b1, wd, scale, shift, w2, b2 = unpack(np.asarray(f["pack"], np.float64), p.dims, irb_epilogue(p)[0] != "copy")
    return _forward(p, np.asarray(f["x"], np.float64), w1, b1, wd * scale.reshape(-1, 1, 1, 1), shift, w2, b2)


def tolerance(p, f):
    """gamma |.| bounds of the three sums one after the other, each activation taken as 1.5-Lipschitz (hardswish's
    steepest), on the magnitudes of every operand."""
    w1, b1, wd, scale, shift, w2, b2 = (None if t is None else np.abs(np.asarray(t, np.float64)) for t in
                                        unpack(np.asarray(f["pack"], np.float64), p.dims, irb_epilogue(p)[0] != "copy"))
    mag = _forward(p, np.abs(np.asarray(f["x"], np.float64)), w1, b1, wd * scale.reshape(-1, 1, 1, 1), shift, w2, b2,
                   act=False)
    act1, act2, _ = irb_epilogue(p)
    smooth = any(a not in ("none", "copy", "relu", "relu6") for a in (act1, act2))
    tol = 4.0 * (p.reduction + 8) * 2.25 * U32 * mag
    return tol * (1.2 if smooth else 1.0) + (1e-6 * (1.0 + mag) if smooth else 0.0) + 1e-30


def _flops(p):
    g = geometry(p)
    return 2.0 * _macs(g)


def _numpy(p, inp, out):
    """The block as a numpy user writes it: matmuls for the 1x1 convolutions, the depthwise one as K*K shifted
    multiply-adds of the padded expanded tensor."""
    g = geometry(p)
    act1, act2, res = irb_epilogue(p)
    w1, b1, wd, scale, shift, w2, b2 = _unpacked(p, inp["pack"])
    N, H, W, C, E, K, S, P, OH, OW = (g[k] for k in ("N", "H", "W", "C", "E", "K", "S", "P", "OH", "OW"))
    wk = (wd[:, 0] * scale.reshape(-1, 1, 1)).astype(np.float32)
    x = inp["x"]
    hp = np.zeros((N, H + 2 * P, W + 2 * P, E), np.float32)
    acc = np.empty((N, OH, OW, E), np.float32)
    tmp = np.empty_like(acc)

    def run():
        h = x if w1 is None else apply_act(x @ w1 + b1, act1)
        hp[:, P:P + H, P:P + W] = h
        acc[:] = shift
        for i in range(K):
            for j in range(K):
                np.multiply(hp[:, i: i + S * (OH - 1) + 1: S, j: j + S * (OW - 1) + 1: S], wk[:, i, j], out=tmp)
                np.add(acc, tmp, out=acc)
        y = apply_act(acc, act2) @ w2 + b2
        np.copyto(out, y + x if res else y)

    return run


def _torch(p, inp, out):
    import torch
    import torch.nn.functional as F

    g = geometry(p)
    act1, act2, res = irb_epilogue(p)
    w1, b1, wd, scale, shift, w2, b2 = _unpacked(p, inp["pack"])
    acts = activations()
    t = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a, np.float32))  # noqa: E731
    x, o = t(inp["x"]).permute(0, 3, 1, 2), torch.from_numpy(out)
    c1 = None if w1 is None else t(w1.T.reshape(g["E"], g["C"], 1, 1))
    cb1, cd, cbd = t(b1), t(wd * scale.reshape(-1, 1, 1, 1)), t(shift)
    c2, cb2 = t(w2.T.reshape(g["O"], g["E"], 1, 1)), t(b2)

    def act(v, name):
        return v if name in ("none", "copy") else REGISTRY[acts[name]].epilogue.torch(v, None)

    def run():
        with torch.inference_mode():
            h = x if c1 is None else act(F.conv2d(x, c1, cb1), act1)
            h = act(F.conv2d(h, cd, cbd, g["S"], g["P"], 1, g["E"]), act2)
            y = F.conv2d(h, c2, cb2)
            if res:
                y = y + x
            o.copy_(y.permute(0, 2, 3, 1))

    return run


FACTS = Facts(inputs=_inputs, output_shape=output_shape, reference=reference, tolerance=tolerance, flops=_flops,
              numpy=_numpy, torch=_torch)
