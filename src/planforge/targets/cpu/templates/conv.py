"""Convolution templates in NHWC: direct (``conv``, any groups) and depthwise (``dwconv``), fp32.

Both copy the input once per call into a zero-bordered NHWC scratch (padding and, for an NCHW problem,
the layout change fused into that one pass), so the register tiles run without a bounds check, except where
they read an NHWC input in place (``_reads_in_place``): a direct convolution without padding, and a depthwise
one whose channel tiles divide the channels (its rows skip the kernel rows outside the input, its edge columns
the taps outside it). A problem in NCHW also reads its residual through an NHWC copy and writes its output back
transposed (the e-graph's NHWC forms avoid both). Weights are packed when the kernel is bound (load time):
``conv`` as [G][blocks of ob vectors of output channels][blocks of cb input channels][KH][KW][cb][ob x vec] (a
tile's block of input channels is one contiguous run, which the prefetcher follows; a stride of a whole row of
output channels per input channel, and then one 4 KiB run per tap and channel block, a page apart, made deep
layers wait on memory latency), ``dwconv`` as [KH][KW][C rounded up].

``conv``: per output row, tiles of ``owb`` output columns x ``ob`` vectors of output channels kept in
registers; the input channels run in blocks of ``cb`` (a block's weights stay in cache while the row's
tiles reuse them; partial sums wait in a per-thread row buffer between blocks); the channel loop is
unrolled by ``unroll``; rows are split over ``threads`` (``order`` 0), or, with ``order`` 1, blocks of ``ob``
vectors of output channels go outermost (split over ``threads``), each running every row, so that a block's
weights come from memory once rather than once per row (deep layers, whose weights outgrow the L2); ``order`` 2
also puts the blocks of ``cb`` input channels outside the rows (every row's partial sums wait in a plane buffer),
so that each piece of a block's weights is used by every row as soon as it arrives. A row ends with a tail tile
of the ``OW % owb`` columns left, so that no column past the row is computed.
``dwconv``: tiles of ``owb`` columns x ``cbv`` vectors of channels. Both apply the per-channel scale and shift
(bias, or a batch norm), then the epilogue chain (activations from the op registry's snippets, a residual
add) in registers.
Compile-time knobs: vec, ob/cbv, owb, unroll, pf (software prefetch distance in the weight stream, floats;
0: none), the problem's geometry; runtime: cb, threads, order.
``algo`` (3x3, stride-1, undilated, ungrouped NHWC layers only): ``direct`` (the above), or ``wino2`` / ``wino4``,
Winograd F(2x2, 3x3) / F(4x4, 3x3) (``winograd.py``: ``owb`` tiles x ``ob`` vectors per register tile, ``tb`` tiles
per block, the same epilogues).
"""
from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from ....ops import REGISTRY
from ....ops.conv2d import conv_ref, geom_attrs
from ....ops.conv_fused import apply_act, unpack
from ....ops.kernel import activations, conv_epilogue
from ....space import Space, categorical, pow2
from .common import header, struct_call
from .epilogues import U32
from .facts import Facts
from .parfor import PARFOR_C
from .scratch import Scratch, aligned_zeros
from . import winograd


# floats past the end of every packed buffer: a tile's last vectors may read (never use) up to 4 x 16 beyond
SLACK = 256


class ConvArgs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("x", "w", "scale", "shift", "res", "y", "xp", "rt", "yt")] + \
               [(n, ctypes.c_int) for n in ("cb", "threads", "order")]


def geometry(p) -> dict[str, int]:
    N, C, H, W, O, KH, KW, SH, SW, PT, PL, PB, PR, DH, DW, G = p.dims
    OH = (H + PT + PB - DH * (KH - 1) - 1) // SH + 1
    OW = (W + PL + PR - DW * (KW - 1) - 1) // SW + 1
    return dict(N=N, C=C, H=H, W=W, O=O, KH=KH, KW=KW, SH=SH, SW=SW, PT=PT, PL=PL, PB=PB, PR=PR, DH=DH, DW=DW, G=G,
                OH=OH, OW=OW, Cg=C // G, Og=O // G)


def _vecs(lim) -> tuple[int, ...]:
    return tuple(v for v in (4, 8, 16) if v <= lim.vector_lanes) or (1,)


# Multiply-adds per fp32 vector lane below which a convolution runs on one thread (the default's threshold, and the
# space's). Ten million when a step's second thread was an OpenMP team woken from sleep (MobileNetV2 tuned with two
# threads on most steps: 12.0 ms a call, 5.5 with its convolutions on one). On the process's shared pool, whose
# workers spin between steps, every MobileNetV2 convolution at 96x96 gained from the second core, measured alone
# (AVX-512, two threads against one): 1x1 16 -> 96 at 48x48 (3.5 M MACs) 42 against 75 us, 96 -> 24 at 24x24 18
# against 30, 384 -> 64 at 6x6 (0.9 M) 7.5 against 11; depthwise 3x3 at 48x48x96 stride 2 (0.5 M) 28 against 57,
# at 12x12x192 (0.25 M) 13.2 against 14.7. 2**14 per lane is about 3 us of one core's FMA throughput: below it the
# second thread's share is not worth the loop's hand-off.
PAR_MACS_PER_LANE = 2 ** 14


def par_macs(lim) -> int:
    """Multiply-adds below which a convolution stays on one thread on this machine (its widest vectors)."""
    return PAR_MACS_PER_LANE * max(_vecs(lim))


def _weight_bytes(g, lim) -> int:
    """Bytes of a convolution's packed weights (output channels padded to the widest vector)."""
    vec = max(_vecs(lim))
    return 4 * g["G"] * g["KH"] * g["KW"] * g["Cg"] * (-(-g["Og"] // vec) * vec)


def _macs(g) -> int:
    return g["N"] * g["OH"] * g["OW"] * g["O"] * g["Cg"] * g["KH"] * g["KW"]


def space(p, lim) -> Space:
    """The knob space of a convolution problem on a machine (vector widths from its ISA, blocks from its caches)."""
    g = geometry(p)
    consts = {"ow": g["OW"], "og": g["Og"], "cg": g["Cg"], "c": g["C"], "k": g["KH"] * g["KW"], "o": g["O"],
              "vregs": lim.vector_registers, "l1_bytes": lim.caches["L1d"], "l2_bytes": lim.caches["L2"],
              "rows": g["N"] * g["OH"], "macs": _macs(g), "par_macs": par_macs(lim), "wbytes": _weight_bytes(g, lim)}
    common = [categorical("vec", _vecs(lim)), categorical("owb", (1, 2, 3, 4, 6, 8)), categorical("unroll", (1, 2, 4)),
              categorical("threads", tuple(range(1, lim.physical_cores + 1)))]
    shared = ["owb <= max(1, ow)", "threads <= rows", "threads == 1 or macs >= par_macs"]
    if p.op == "dwconv":
        return Space([*common, categorical("cbv", (1, 2, 3, 4))],
                     [*shared, "owb * cbv + 2 * cbv + 1 <= vregs", "cbv * vec <= max(vec, c + vec - 1)"],
                     constants=consts)
    wino = winograd.applies(g, conv_epilogue(p)[0])
    # restrictions of the direct template alone (the Winograd forms pin its knobs instead: see _WINO_RULES)
    direct = (lambda r: f"algo != 'direct' or ({r})") if wino else (lambda r: r)
    knobs = [*common, categorical("ob", (1, 2, 3, 4)), pow2("cb", 8, 1024), categorical("order", (0, 1, 2)),
             categorical("pf", (0, 1024, 4096))]
    if wino:
        knobs += [categorical("algo", ("direct", *winograd.ALGOS)), categorical("tb", winograd.TILE_BLOCKS)]
        consts.update({f"tiles{m}": winograd.tiles(g, m) for m in winograd.ALGOS.values()})
    return Space(knobs,
                 [*shared,
                  # channel blocks outermost: no more threads than blocks of ob * vec output channels
                  "order == 0 or threads * ob * vec <= o + ob * vec - 1",
                  # rows outermost only while the packed weights stay in half the L2 (or there is one row): past
                  # that each row reads them from the L3 again. ResNet-18's 256-channel 3x3 at 6x6 (2.4 MB of weights),
                  # two threads, in one process: 0.58 ms channel blocks outermost against 0.68 rows outermost hot, 0.55
                  # against 0.69 with the L2 swept before each call; its tuned plan had picked rows outermost twice
                  direct("order != 0 or 2 * wbytes <= l2_bytes or rows == 1"),
                  # input-channel blocks outside the rows: more than one block, and every row's partial sums (the
                  # plane buffer) in half the L2
                  "order != 2 or (cb < cg and rows > 1 and rows * (ow + owb + 1) * (o + 5 * vec) * 8 <= l2_bytes)",
                  # and where it can, it replaces order 1: in a whole call a deep layer's weights come from memory,
                  # and its next-piece prefetch hides that (two threads, the caches swept with 100 MB before each
                  # call: 512-channel 7x7 1.02 ms against 1.29 at order 1, 256-channel 14x14 0.94-0.98 against
                  # 0.99-1.05; from the caches the two are even, 0.97 against 1.01), while a measurement of the task
                  # alone, its weights left in the L3, cannot tell them apart
                  "order != 1 or cb >= cg or rows == 1 or rows * (ow + owb + 1) * (o + 5 * vec) * 8 > l2_bytes",
                  # accumulators + weight vectors + one broadcast input in the register file
                  "owb * ob + ob + 1 <= vregs",
                  # no vector block wider than a group's output channels call for
                  "ob * vec <= max(vec, og + vec - 1)",
                  # one block's weights for one tile stay in L1, the row's partial sums in L2
                  "cb * k * ob * vec * 4 <= l1_bytes or cb == 8",
                  direct("(ow + owb) * og * 4 <= l2_bytes"),
                  "cb < 2 * cg or cb == 8",
                  *(_WINO_RULES if wino else [])],
                 constants=consts)


# The Winograd forms (``algo`` wino2 / wino4, templates/winograd.py): the direct template's loop-order, channel-block
# and prefetch knobs pinned to one value each and ``tb`` (tiles per block) to its first for the direct template, so
# that no setting is counted twice; a register tile of ``owb`` tiles no larger than a block; no block of tiles
# past the first that covers every tile; and a thread's transformed input block in half the L2 (each output-channel
# block's GEMMs read it again)
MIN_TILES = 8
_WINO_RULES = [
    "algo == 'direct' or (order == 0 and pf == 0 and cb == 8)",
    f"algo != 'direct' or tb == {winograd.TILE_BLOCKS[0]}",
    "algo == 'direct' or owb <= tb",
    "algo == 'direct' or tb == 8 or tb < 2 * (tiles2 if algo == 'wino2' else tiles4)",
    # each transformed weight (t^2 / 9 times the direct template's bytes) used by enough tiles: its GEMMs do
    # tiles / 2 FLOPs per weight byte, and in a whole call a deep layer's weights come from memory (the task
    # measured alone has them in the L3, which flatters the Winograd form); from 8 tiles that is 4 FLOPs a byte,
    # about these machines' peak over their memory bandwidth (Zen 4: 232 GFLOP/s over 60 GB/s). ResNet-18 at
    # 96x96: 512 channels at 3x3 (4 tiles of 2x2) would read 1.8x the weights to save a fifth of the products;
    # 256 channels at 6x6 keep F(2x2) (9 tiles), 128 at 12x12 F(4x4) too (9 tiles: 0.075 ms against 0.257 for the
    # direct template's first setting, measured alone)
    f"algo == 'direct' or (tiles2 if algo == 'wino2' else tiles4) >= {MIN_TILES}",
    "algo == 'direct' or (16 if algo == 'wino2' else 36) * tb * c * 4 * 2 <= l2_bytes",
]


def defaults(p, lim) -> dict[str, Any]:
    g = geometry(p)
    vec = max(_vecs(lim))
    rows = g["N"] * g["OH"]
    threads = min(lim.physical_cores, rows) if _macs(g) >= par_macs(lim) else 1
    if p.op == "dwconv":
        # the column tile that computes the fewest columns past the row, counting one more per tile (6x6 maps at owb 4
        # computed 8 columns: 0.023 -> 0.011 ms at owb 6 for 384 channels, measured alone)
        ow = max(1, g["OW"])
        owb = min((x for x in (8, 6, 4, 3, 2, 1) if x <= ow and x + 3 <= lim.vector_registers),
                  key=lambda x: (-(-ow // x) * (x + 1), -x))  # columns computed, plus one per tile
        return {"vec": vec, "owb": owb, "cbv": 1, "unroll": 1, "threads": threads}
    # the register tile with the most accumulators (ob * owb) that the register file, the group's output channels and
    # the row hold; on a tie the wider ob (fewer broadcasts per FMA). Measured alone on one thread (AVX-512), 3x3 at
    # 64-256 channels: ob 4 x owb 6 took 0.45-0.52 ms where ob 2 x owb 6-8 took 0.56-0.63
    tiles = [(ob * owb, ob, owb) for ob in (1, 2, 3, 4) for owb in (1, 2, 3, 4, 6, 8)
             if owb * ob + ob + 1 <= lim.vector_registers and owb <= max(1, g["OW"])
             and ob * vec <= max(vec, g["Og"] + vec - 1)]
    _, ob, owb = max(tiles)
    cb = 8
    while cb * 2 <= 1024 and cb < g["Cg"] and cb * 2 * g["KH"] * g["KW"] * ob * vec * 4 <= lim.caches["L1d"]:
        cb *= 2
    # rows outermost read every weight once per output row: from cache while the packed weights fit half the L2,
    # else from memory each row, and then output-channel blocks go outermost (each block's weights read once)
    order = int(2 * _weight_bytes(g, lim) > lim.caches["L2"] and rows > 1)
    if order and threads * ob * vec > g["O"] + ob * vec - 1:
        threads = 1
    # and the input-channel blocks outside the rows too where there is more than one and the plane buffer fits
    if order and cb < g["Cg"] and rows * (g["OW"] + owb + 1) * (g["O"] + 5 * vec) * 8 <= lim.caches["L2"]:
        order = 2
    # software prefetch 16 KiB ahead in the weight stream where it comes from memory (512 channels at 3x3, cold
    # caches: 1.60-1.80 ms from 1.75-2.16 without, measured alone on one thread)
    d = {"vec": vec, "owb": owb, "ob": ob, "cb": cb, "unroll": 2, "threads": threads, "order": order,
         "pf": 4096 if order else 0}
    if winograd.applies(g, conv_epilogue(p)[0]):  # the direct template first; the search measures the others
        d.update(algo="direct", tb=winograd.TILE_BLOCKS[0])
    return d


# -- C ------------------------------------------------------------------------------------------------------------

def _steps_c(steps: list[str]) -> tuple[str, str]:
    """(vector, scalar) C of the epilogue chain, each step its op's snippet (``add``: the residual at ``res + c``)."""
    acts = activations()
    vec, sc = [], []
    for s in steps:
        op = REGISTRY["add" if s == "add" else acts[s]]
        vec.append(op.epilogue.vec)
        sc.append(op.epilogue.scalar)
    return " ".join(vec), " ".join(sc)


def _obv(knobs) -> int:
    """Vectors of output channels per register tile (``ob``; ``cbv`` for the depthwise template)."""
    return knobs.get("ob", knobs.get("cbv", 1))


def _padded_width(p, g, knobs) -> int:
    """Columns of a padded input line: the padding, and for the depthwise template (whose tiles run past the row)
    room for the last tile's overhang; the direct template's tail tile reads no column past the row."""
    ow = g["OW"] if p.op == "conv" else -(-g["OW"] // knobs["owb"]) * knobs["owb"]
    return max(g["W"] + g["PL"] + g["PR"], (ow - 1) * g["SW"] + (g["KW"] - 1) * g["DW"] + 1)


def _reads_in_place(p, g, knobs) -> bool:
    """Whether the template reads its NHWC input where it lies, without the padded copy. The direct template: with
    no padding, so that the padded lines would be the input's own (1x1 convolutions, MobileNet's expansions and
    projections, ResNet's downsampling shortcuts; a copy of up to 0.3 MB and one more parallel loop a step at
    96x96). The depthwise template: whenever its channel tiles divide the channels (no tile reads past a pixel's
    channels), its rows skipping the kernel rows outside the input and its edge columns the taps outside it
    (the copy of a depthwise step's input costs more than its few multiply-adds a byte: MobileNetV2's stride-2
    3x3 at 48x48x96 copies 0.9 MB for 0.5 M)."""
    layout, _, _ = conv_epilogue(p)
    if layout != "nhwc":
        return False
    if p.op == "dwconv":
        return g["C"] % (knobs["cbv"] * knobs["vec"]) == 0
    return not any(g[k] for k in ("PT", "PL", "PB", "PR")) and _padded_width(p, g, knobs) == g["W"]


def _interior_columns(g) -> tuple[int, int]:
    """[lo, hi): the output columns all of whose kernel taps lie inside the input row."""
    lo = min(g["OW"], -(-g["PL"] // g["SW"]))
    hi = min(g["OW"], (g["W"] - 1 - (g["KW"] - 1) * g["DW"] + g["PL"]) // g["SW"] + 1)
    return lo, max(lo, hi)


def _defs(p, knobs) -> str:
    g = geometry(p)
    layout, form, steps = conv_epilogue(p)
    V = knobs["vec"]
    cp = -(-g["C"] // V) * V if p.op == "dwconv" else g["C"]
    ogp = -(-g["Og"] // V) * V
    owp = -(-g["OW"] // knobs["owb"]) * knobs["owb"]
    wp = _padded_width(p, g, knobs)
    hp = g["H"] + g["PT"] + g["PB"]
    d = {**g, "V": V, "CP": cp, "OGP": ogp, "OWP": owp, "WP": wp, "HP": hp, "NCHW": int(layout == "nchw"),
         "NOCOPY": int(_reads_in_place(p, g, knobs)),
         "RES": int("add" in steps), "OWB": knobs["owb"], "OBV": _obv(knobs), "OBW": _obv(knobs) * V,
         "NB": -(-g["Og"] // (_obv(knobs) * V))}
    return "".join(f"#define {k} {v}\n" for k, v in d.items())


_COPY = r"""
/* d[j * ds + i] = s[i * ss + j] for i < rows, j < cols, in 8 x 8 blocks (both sides' lines stay in L1 while a
   block is moved): the layout changes of an NCHW problem (element by element over whole rows before, which cost
   more than the convolution itself on MobileNet's first 1x1 and depthwise layers) */
static void tr(const float *restrict s, float *restrict d, int rows, int cols, long ss, long ds) {
    for (int i0 = 0; i0 < rows; i0 += 8)
        for (int j0 = 0; j0 < cols; j0 += 8) {
            int i1 = i0 + 8 < rows ? i0 + 8 : rows, j1 = j0 + 8 < cols ? j0 + 8 : cols;
            for (int j = j0; j < j1; j++)
                for (int i = i0; i < i1; i++) d[(long)j * ds + i] = s[(long)i * ss + j];
        }
}

/* the input into the zero-bordered NHWC scratch (channels padded to CP): padding and layout in one pass. The
   borders (and the padded channels) are written on every call: the scratch is shared by the steps of a plan
   (``Plan``'s workspace), each with its own geometry, so none of its zeros survive another step's call */
typedef struct { const float *x; float *xp; } copy_ctx;

static void copy_lines(const void *c, int lo, int hi) {  /* padded lines [lo, hi) of N x HP, on any thread */
    const float *x = ((const copy_ctx *)c)->x;
    float *xp = ((const copy_ctx *)c)->xp;
    for (int i = lo; i < hi; i++) {
        const int n = i / HP, hp = i % HP;
        {
            float *line = xp + ((long)n * HP + hp) * WP * CP;
            int h = hp - PT;
            if (h < 0 || h >= H) { memset(line, 0, (size_t)WP * CP * sizeof(float)); continue; }
            if (PL) memset(line, 0, (size_t)PL * CP * sizeof(float));
            if (WP > PL + W) memset(line + (long)(PL + W) * CP, 0, (size_t)(WP - PL - W) * CP * sizeof(float));
            float *dst = line + (long)PL * CP;
            if (CP != C) memset(dst, 0, (size_t)W * CP * sizeof(float));
            if (NCHW) {
                tr(x + (long)n * C * H * W + (long)h * W, dst, C, W, (long)H * W, CP);
            } else if (CP == C) {
                memcpy(dst, x + ((long)n * H + h) * W * C, (size_t)W * C * sizeof(float));
            } else {
                for (int w = 0; w < W; w++) memcpy(dst + (long)w * CP, x + (((long)n * H + h) * W + w) * C, C * 4);
            }
        }
    }
}

static void copy_in(const float *x, float *xp, int threads) {
    copy_ctx c = { x, xp };
    pf_parfor(N * HP, threads, copy_lines, &c);
}

/* NCHW <-> NHWC for a residual read and the output written back */
typedef struct { const float *src; float *dst; int ch, hw, back; } tr_ctx;

static void tr_images(const void *c, int lo, int hi) {  /* images [lo, hi), on any thread */
    const tr_ctx *t = (const tr_ctx *)c;
    const long sz = (long)t->ch * t->hw;
    for (int n = lo; n < hi; n++)
        if (t->back) tr(t->src + n * sz, t->dst + n * sz, t->hw, t->ch, t->ch, t->hw);
        else tr(t->src + n * sz, t->dst + n * sz, t->ch, t->hw, t->hw, t->ch);
}

static void to_nhwc(const float *src, float *dst, int ch, int hw, int threads) {
    tr_ctx c = { src, dst, ch, hw, 0 };
    pf_parfor(N, threads, tr_images, &c);
}

static void to_nchw(const float *src, float *dst, int ch, int hw, int threads) {
    tr_ctx c = { src, dst, ch, hw, 1 };
    pf_parfor(N, threads, tr_images, &c);
}
"""


def _store(acc: str, y: str, ch: str, lanes: str, vec_ops: str, sc_ops: str) -> str:
    """Scale, shift, the chain and the store of one accumulator vector at output offset ``y``, channel ``ch``;
    ``lanes`` valid channels (fewer in a tail vector, which goes lane by lane)."""
    return f"""{{
        long off = {y}; int ch = {ch}, nl = {lanes};
        vf v = {acc} * vload(scale + ch) + vload(shift + ch);
        if (nl >= V) {{ const float *res = R; long c = off; (void)res; (void)c; {vec_ops} vstore(Y + off, v); }}
        else {{ float t[V]; vstore(t, v);
            for (int l = 0; l < nl; l++) {{ const float *res = R; long c = off + l; (void)res; (void)c; float v = t[l];
                {sc_ops} Y[off + l] = v; }} }}
    }}"""


def _tile_conv(ob: int, owb: int, unroll: int, vec_ops: str, sc_ops: str, pf: int = 0, vec: int = 16,
               ow: int | None = None) -> str:
    """The direct template's row: tiles of ``owb`` columns, then (``ow`` given and not a multiple of ``owb``) one
    tail tile of the ``ow % owb`` columns left, so that no column past the row is computed (7x7 maps at owb 4
    computed 8 columns a row, 14x14 at owb 6 18)."""
    acc = "\n".join("        " + " ".join(f"vf a{i}_{j};" for j in range(ob)) for i in range(owb))

    def tile(nw: int) -> str:  # the body of one tile of ``nw`` columns at ``ow0``
        init = "\n".join(f"            a{i}_{j} = first ? vset(0.0f) : vload(part + (long)(ow0 + {i}) * GOP + gch + {j} * V);"
                         for i in range(nw) for j in range(ob))
        body = []
        for j in range(ob):
            body.append(f"vf w{j} = vload(wk + (long)(c - c0) * OBW + {j} * V);")
        # the weight stream fetched ``pf`` floats ahead, a line (16 floats) per prefetch: a deep layer's first row
        # reads its weights from memory, faster than the hardware prefetcher brings them
        body += [f"__builtin_prefetch(wk + (long)(c - c0) * OBW + {pf + j * 16});" for j in range(-(-ob * vec // 16))
                 if pf]
        for i in range(nw):
            body.append(f"{{ vf xv = xk[(long){i} * SW * CP + c] - (vf){{0}}; " +
                        " ".join(f"a{i}_{j} = xv * w{j} + a{i}_{j};" for j in range(ob)) + " }")
        keep = "\n".join(f"                vstore(part + (long)(ow0 + {i}) * GOP + gch + {j} * V, a{i}_{j});"
                         for i in range(nw) for j in range(ob))
        stores = "\n".join(
            f"                if (ow0 + {i} < OW) " +
            _store(f"a{i}_{j}", f"(((long)n * OH + oh) * OW + ow0 + {i}) * O + g * Og + o0 + {j} * V",
                   f"g * OGP + o0 + {j} * V", f"Og - o0 - {j} * V", vec_ops, sc_ops)
            for i in range(nw) for j in range(ob))
        return f"""{init}
                for (int kh = 0; kh < KH; kh++) {{
                    const float *xr = xp + (((long)n * HP + (long)oh * SH + kh * DH) * WP + (long)ow0 * SW) * CP + g * Cg;
                    for (int kw = 0; kw < KW; kw++) {{
                        for (int q = 0; q < pfq && pfp < pfe; q++, pfp += 16) __builtin_prefetch(pfp, 0, 2);
                        const float *xk = xr + (long)kw * DW * CP;
                        const float *wk = w + (((long)g * NB + o0 / OBW) * Cg * KH * KW + (long)c0 * KH * KW
                                               + (long)(kh * KW + kw) * (c1 - c0)) * OBW;
                        #pragma GCC unroll {unroll}
                        for (int c = c0; c < c1; c++) {{
                            {" ".join(body)}
                        }}
                    }}
                }}
                if (!last) {{
{keep}
                }} else {{
{stores}
                }}"""

    tail = ow % owb if ow else 0
    main = ow - tail if ow else None
    tail_c = f"""
            if ({main} < OW) {{  /* the tail tile: the {tail} columns left */
                const int ow0 = {main};
{tile(tail)}
            }}""" if tail else ""
    return f"""
/* one output row: tiles of OWB columns x OB channel vectors{" and a tail tile" if tail else ""}, input channels in
   blocks of cb */
static void row(const float *xp, const float *w, const float *scale, const float *shift, const float *R, float *Y,
                float *part, int n, int oh, int cb, int g_lo, int g_hi, int o_lo, int o_hi, int c_lo, int c_hi,
                const float *pfp, const float *pfe) {{
    const int GOP = G * OGP + {ob} * V;  /* a column's partial sums, with room for the last block's overhang */
    /* lines of [pfp, pfe) to fetch into the L2 at each kernel tap of the row's tiles: spread over the row */
    const long taps = (long)(g_hi - g_lo) * ((o_hi < Og ? o_hi : Og) - o_lo + {ob} * V - 1) / ({ob} * V)
                      * ((c_hi - c_lo + cb - 1) / cb) * ((OW + OWB - 1) / OWB) * KH * KW;
    const int pfq = pfp < pfe && taps > 0 ? (int)(((pfe - pfp + 15) / 16 + taps - 1) / taps) : 0;
{acc}
    for (int c0 = c_lo; c0 < c_hi; c0 += cb) {{
        int c1 = c0 + cb < Cg ? c0 + cb : Cg, first = c0 == 0, last = c1 >= Cg;
        for (int g = g_lo; g < g_hi; g++)
        for (int o0 = o_lo; o0 < (o_hi < Og ? o_hi : Og); o0 += {ob} * V) {{
            int gch = g * OGP + o0;
            for (int ow0 = 0; ow0 < {main if tail else "OW"}; ow0 += OWB) {{
{tile(owb)}
            }}{tail_c}
        }}
    }}
}}
"""


def _tile_dw(cbv: int, owb: int, unroll: int, vec_ops: str, sc_ops: str) -> str:
    decl = "\n".join("        " + " ".join(f"vf a{i}_{j} = vset(0.0f);" for j in range(cbv)) for i in range(owb))
    body = []
    for j in range(cbv):
        body.append(f"vf w{j} = vload(wk + {j} * V);")
    for i in range(owb):
        body.append(" ".join(f"a{i}_{j} = vload(xk + (long){i} * SW * CP + {j} * V) * w{j} + a{i}_{j};"
                             for j in range(cbv)))
    stores = "\n".join(
        f"            if (ow0 + {i} < OW) " +
        _store(f"a{i}_{j}", f"(((long)n * OH + oh) * OW + ow0 + {i}) * C + c0 + {j} * V", f"c0 + {j} * V",
               f"C - c0 - {j} * V", vec_ops, sc_ops)
        for i in range(owb) for j in range(cbv))
    return f"""
/* one output row of a depthwise convolution: tiles of OWB columns x CBV channel vectors */
static void row(const float *xp, const float *w, const float *scale, const float *shift, const float *R, float *Y,
                float *part, int n, int oh, int cb, int g_lo, int g_hi, int o_lo, int o_hi, int c_lo, int c_hi,
                const float *pfp, const float *pfe) {{
    (void)part; (void)cb; (void)g_lo; (void)g_hi; (void)o_lo; (void)o_hi; (void)c_lo; (void)c_hi; (void)pfp; (void)pfe;
    for (int c0 = 0; c0 < C; c0 += {cbv} * V) {{
        for (int ow0 = 0; ow0 < OW; ow0 += OWB) {{
{decl}
            for (int kh = 0; kh < KH; kh++) {{
                const float *xr = xp + (((long)n * HP + (long)oh * SH + kh * DH) * WP + (long)ow0 * SW) * CP + c0;
                #pragma GCC unroll {unroll}
                for (int kw = 0; kw < KW; kw++) {{
                    const float *xk = xr + (long)kw * DW * CP;
                    const float *wk = w + ((long)kh * KW + kw) * CP + c0;
                    {" ".join(body)}
                }}
            }}
{stores}
        }}
    }}
}}
"""


def _tile_dw_in_place(cbv: int, owb: int, unroll: int, vec_ops: str, sc_ops: str, g) -> str:
    """The depthwise row reading the unpadded NHWC input: kernel rows outside the input skipped for the whole row,
    the columns whose taps all lie inside in tiles of ``owb`` (the last tile moved back onto the one before where
    the columns do not divide, unless a residual is added: recomputing a column is harmless only then), the edge
    columns one at a time, each skipping its taps outside."""
    lo, hi = _interior_columns(g)
    decl = "\n".join("        " + " ".join(f"vf a{i}_{j} = vset(0.0f);" for j in range(cbv)) for i in range(owb))
    body = [f"vf w{j} = vload(wk + {j} * V);" for j in range(cbv)]
    for i in range(owb):
        body.append(" ".join(f"a{i}_{j} = vload(xk + (long){i} * SW * C + {j} * V) * w{j} + a{i}_{j};"
                             for j in range(cbv)))
    stores = "\n".join(
        "            " + _store(f"a{i}_{j}", f"(((long)n * OH + oh) * OW + ow0 + {i}) * C + c0 + {j} * V",
                                f"c0 + {j} * V", "V", vec_ops, sc_ops)
        for i in range(owb) for j in range(cbv))
    col_decl = " ".join(f"vf a0_{j} = vset(0.0f);" for j in range(cbv))
    col_body = " ".join(f"a0_{j} = vload(xk + {j} * V) * vload(wk + {j} * V) + a0_{j};" for j in range(cbv))
    col_stores = "\n".join(
        "        " + _store(f"a0_{j}", f"(((long)n * OH + oh) * OW + ow) * C + c0 + {j} * V", f"c0 + {j} * V", "V",
                            vec_ops, sc_ops)
        for j in range(cbv))
    return f"""
#define OW_LO {lo}
#define OW_HI {hi}
/* one output column of a depthwise row, its taps outside the input skipped */
static inline void dw_col(const float *xn, const float *w, const float *scale, const float *shift, const float *R,
                          float *Y, int n, int oh, int ow, int c0, int ih0, int kh_lo, int kh_hi) {{
    {col_decl}
    for (int kh = kh_lo; kh < kh_hi; kh++)
        for (int kw = 0; kw < KW; kw++) {{
            const int iw = ow * SW - PL + kw * DW;
            if (iw < 0 || iw >= W) continue;
            const float *xk = xn + ((long)(ih0 + kh * DH) * W + iw) * C + c0;
            const float *wk = w + ((long)kh * KW + kw) * CP + c0;
            {col_body}
        }}
{col_stores}
}}

/* one output row of a depthwise convolution read from the unpadded input: tiles of OWB columns x CBV channel
   vectors over the interior columns, the edge columns one by one */
static void row(const float *x, const float *w, const float *scale, const float *shift, const float *R, float *Y,
                float *part, int n, int oh, int cb, int g_lo, int g_hi, int o_lo, int o_hi, int c_lo, int c_hi,
                const float *pfp, const float *pfe) {{
    (void)part; (void)cb; (void)g_lo; (void)g_hi; (void)o_lo; (void)o_hi; (void)c_lo; (void)c_hi; (void)pfp; (void)pfe;
    const int ih0 = oh * SH - PT;
    int kh_lo = 0, kh_hi = KH;
    while (kh_lo < KH && ih0 + kh_lo * DH < 0) kh_lo++;
    while (kh_hi > kh_lo && ih0 + (kh_hi - 1) * DH >= H) kh_hi--;
    const float *xn = x + (long)n * H * W * C;
    for (int c0 = 0; c0 < C; c0 += {cbv} * V) {{
        for (int ow = 0; ow < OW_LO; ow++) dw_col(xn, w, scale, shift, R, Y, n, oh, ow, c0, ih0, kh_lo, kh_hi);
        int done = OW_LO;  /* interior columns computed so far */
        for (; done + OWB <= OW_HI || (!RES && done < OW_HI && OW_HI - OW_LO >= OWB); done += OWB) {{
            const int ow0 = done + OWB <= OW_HI ? done : OW_HI - OWB;
{decl}
            for (int kh = kh_lo; kh < kh_hi; kh++) {{
                const float *xr = xn + ((long)(ih0 + kh * DH) * W + (long)ow0 * SW - PL) * C + c0;
                #pragma GCC unroll {unroll}
                for (int kw = 0; kw < KW; kw++) {{
                    const float *xk = xr + (long)kw * DW * C;
                    const float *wk = w + ((long)kh * KW + kw) * CP + c0;
                    {" ".join(body)}
                }}
            }}
{stores}
        }}
        for (int ow = done < OW_HI ? done : OW_HI; ow < OW; ow++)
            dw_col(xn, w, scale, shift, R, Y, n, oh, ow, c0, ih0, kh_lo, kh_hi);
    }}
}}
"""


# ``pf_conv``'s argument, as ``ConvArgs`` lays it out (the direct and the Winograd kernels take the same)
ARGS_C = r"""
typedef struct { const float *x, *w, *scale, *shift, *res; float *y, *xp, *rt, *yt; int cb, threads, order; } conv_args;
"""

_MAIN = r"""

static __thread float *buf_part;
static __thread size_t cap_part;

#define PART_FLOATS ((size_t)(OWP + OWB + 1) * (G * OGP + 4 * V) + SLACK)

typedef struct { const conv_args *a; const float *R; float *Y; } conv_ctx;

static void conv_rows(const void *c, int lo, int hi) {  /* output rows [lo, hi) of N x OH, on any thread */
    const conv_ctx *x = (const conv_ctx *)c;
    const conv_args *a = x->a;
    float *part = PART ? scratch(&buf_part, &cap_part, PART_FLOATS) : NULL;
    for (int i = lo; i < hi; i++)
        row(a->xp, a->w, a->scale, a->shift, x->R, x->Y, part, i / OH, i % OH, a->cb, 0, G, 0, Og, 0, Cg, NULL, NULL);
}

static void conv_blocks(const void *c, int lo, int hi) {  /* (group, channel block)s [lo, hi), on any thread */
    const conv_ctx *x = (const conv_ctx *)c;
    const conv_args *a = x->a;
    float *part = PART ? scratch(&buf_part, &cap_part, PART_FLOATS) : NULL;
    for (int i = lo; i < hi; i++) {
        const int g = i / NB, b = i % NB;
        for (int n = 0; n < N; n++)
            for (int oh = 0; oh < OH; oh++)
                row(a->xp, a->w, a->scale, a->shift, x->R, x->Y, part, n, oh, a->cb, g, g + 1, b * OBW, (b + 1) * OBW,
                    0, Cg, NULL, NULL);
    }
}

/* (group, channel block)s [lo, hi) with the input channels outermost in each: every row's partial sums wait in a
   plane buffer while one block of cb input channels runs over all the rows, so that each piece of the block's
   weights comes from memory once and is used at once by every row (``order`` 1 reads a block's whole weights
   from memory in its first row and from the L2 in the others). The weights are one stream over the blocks in
   order: while a piece's rows run, each row fetches its share of the next piece into the L2 (prefetcht1, a few lines
   at each kernel tap of its tiles), so that the next piece's first row does not wait on memory (a deep layer's
   weights come from memory in a whole call) */
#define PLANE_ROW ((size_t)(OWP + OWB + 1) * (G * OGP + 4 * V))
static void conv_planes(const void *c, int lo, int hi) {
    const conv_ctx *x = (const conv_ctx *)c;
    const conv_args *a = x->a;
    float *part = scratch(&buf_part, &cap_part, (size_t)N * OH * PLANE_ROW + SLACK);
    const long piece = (long)KH * KW * OBW;  /* floats per input channel of a block */
    const float *end = a->w + (long)hi * Cg * piece;  /* the end of this thread's blocks' weights */
    for (int i = lo; i < hi; i++) {
        const int g = i / NB, b = i % NB;
        for (int c0 = 0; c0 < Cg; c0 += a->cb) {
            const int c1 = c0 + a->cb < Cg ? c0 + a->cb : Cg;
            const float *next = a->w + ((long)i * Cg + c1) * piece;  /* the piece after this one, in the stream */
            long left = end - next, want = (long)a->cb * piece;
            if (want > left) want = left;
            for (int n = 0; n < N; n++)
                for (int oh = 0; oh < OH; oh++) {
                    const long r = (long)n * OH + oh, f0 = want * r / (N * OH) & ~15L, f1 = want * (r + 1) / (N * OH);
                    row(a->xp, a->w, a->scale, a->shift, x->R, x->Y, part + (size_t)r * PLANE_ROW, n, oh,
                        a->cb, g, g + 1, b * OBW, (b + 1) * OBW, c0, c1, next + f0, next + f1);
                }
        }
    }
}

/* one thread, rows outermost and in order: each padded input line is copied just before the first row that reads
   it, so that the rows read lines still in L1 rather than the whole padded copy back from the L2 (a depthwise
   step does a few multiply-adds per byte: MobileNetV2's stride-2 depthwise at 48x48x96 copies 0.9 MB for 0.5 M
   multiply-adds) */
static void conv_rows_in_order(const conv_ctx *x) {
    const conv_args *a = x->a;
    copy_ctx cc = { a->x, a->xp };
    float *part = PART ? scratch(&buf_part, &cap_part, PART_FLOATS) : NULL;
    int done = 0;  /* padded lines (of N x HP) copied so far */
    for (int i = 0; i < N * OH; i++) {
        const int n = i / OH, oh = i % OH, need = n * HP + oh * SH + (KH - 1) * DH + 1;
        if (need > done) { copy_lines(&cc, done, need); done = need; }
        row(a->xp, a->w, a->scale, a->shift, x->R, x->Y, part, n, oh, a->cb, 0, G, 0, Og, 0, Cg, NULL, NULL);
    }
}

void pf_conv(const conv_args *args) {
    conv_args in_place = *args;
    const conv_args *a = args;
    if (NOCOPY) { in_place.xp = (float *)args->x; a = &in_place; }  /* read in place (``_reads_in_place``) */
    const int in_order = !NOCOPY && a->threads <= 1 && a->order == 0;
    if (!in_order && !NOCOPY) copy_in(a->x, a->xp, a->threads);
    const float *R = a->res;
    float *Y = a->y;
    if (NCHW && RES) { to_nhwc(a->res, a->rt, O, OH * OW, a->threads); R = a->rt; }
    if (NCHW) Y = a->yt;
    conv_ctx c = { a, R, Y };
    if (in_order)
        conv_rows_in_order(&c);
    else if (a->order == 0)  /* rows outermost: each row reads every weight block */
        pf_parfor(N * OH, a->threads, conv_rows, &c);
    else if (a->order == 1)  /* output-channel blocks outermost: a block's weights from memory once, then cache */
        pf_parfor(G * NB, a->threads, conv_blocks, &c);
    else  /* output-channel blocks, then input-channel blocks, outermost */
        pf_parfor(G * NB, a->threads, conv_planes, &c);
    if (NCHW) to_nchw(a->yt, a->y, O, OH * OW, a->threads);
}
"""


def source(p, knobs: dict[str, Any]) -> str:
    _, _, steps = conv_epilogue(p)
    vec_ops, sc_ops = _steps_c(steps)
    if winograd.tile_m(knobs):
        return (_defs(p, knobs) + f"#define SLACK {SLACK}\n" + header() + PARFOR_C + ARGS_C
                + winograd.source(winograd.tile_m(knobs), knobs,
                                  lambda acc, y, ch, lanes: _store(acc, y, ch, lanes, vec_ops, sc_ops)))
    if p.op == "dwconv" and _reads_in_place(p, geometry(p), knobs):
        tile = _tile_dw_in_place(knobs["cbv"], knobs["owb"], knobs["unroll"], vec_ops, sc_ops, geometry(p))
    elif p.op == "dwconv":
        tile = _tile_dw(knobs["cbv"], knobs["owb"], knobs["unroll"], vec_ops, sc_ops)
    else:
        tile = _tile_conv(knobs["ob"], knobs["owb"], knobs["unroll"], vec_ops, sc_ops, knobs.get("pf", 0),
                          knobs["vec"], geometry(p)["OW"])
    part = int(p.op == "conv" and knobs.get("cb", 1 << 30) < geometry(p)["Cg"])
    return (_defs(p, knobs) + f"#define PART {part}\n#define SLACK {SLACK}\n" + header() + PARFOR_C + ARGS_C + _COPY
            + tile + _MAIN)


# -- binding: weights packed at load time ---------------------------------------------------------------------------

def canonical(p, ins: dict) -> dict:
    """The inputs of a plan's step as the template reads them: ``x``, ``w`` [O, Cg, KH, KW], ``scale`` and
    ``shift`` [O], ``res`` (from any operand form: ``w``, ``wb``, ``wss``, ``packed``)."""
    _, form, _ = conv_epilogue(p)
    g = geometry(p)
    O = g["O"]
    out = {"x": ins["x"]}
    if form == "packed":
        w, scale, shift = unpack(ins["w"], (O, g["Cg"], g["KH"], g["KW"]))
        out.update(w=w, scale=scale, shift=shift, res=ins["res"])
        return out
    out["w"] = ins["w"]
    out["scale"] = ins["ss"][0] if form == "wss" else np.ones(O, np.float32)
    out["shift"] = ins["ss"][1] if form == "wss" else ins["b"] if form == "wb" else np.zeros(O, np.float32)
    return out


def plan_inputs(p, ins: list) -> dict:
    """A plan step's operands (in e-node order) by name."""
    _, form, _ = conv_epilogue(p)
    d = {"x": ins[0], "w": ins[1]}
    if form == "wb":
        d["b"] = ins[2]
    elif form == "wss":
        d["ss"] = ins[2]
    elif form == "packed":
        d["res"] = ins[2]
    return canonical(p, d)


def bind(lib, p, knobs, inputs: dict, out: np.ndarray):
    g = geometry(p)
    V = knobs["vec"]
    N, C, O, KH, KW, G, Cg, Og = (g[k] for k in ("N", "C", "O", "KH", "KW", "G", "Cg", "Og"))
    w = np.asarray(inputs["w"], np.float32).reshape(O, Cg, KH, KW)
    scale = np.asarray(inputs["scale"], np.float32).reshape(O)
    shift = np.asarray(inputs["shift"], np.float32).reshape(O)
    if winograd.tile_m(knobs):  # the transformed weights, [t*t][blocks of ob vectors][C][ob * V]
        cp, obw = C, _obv(knobs) * V
        wp = winograd.pack(w, winograd.tile_m(knobs), obw, SLACK)
        sc, sh = (aligned_zeros(-(-O // obw) * obw + SLACK) for _ in range(2))
        sc[:O], sh[:O] = scale, shift
    elif p.op == "dwconv":
        cp = -(-C // V) * V
        wp = aligned_zeros(KH * KW * cp + SLACK)
        wp[:KH * KW * cp].reshape(KH, KW, cp)[:, :, :C] = np.transpose(w[:, 0], (1, 2, 0))
        sc, sh = (aligned_zeros(cp + SLACK) for _ in range(2))
        sc[:C], sh[:C] = scale, shift
    else:  # [G][Og in blocks of ob vectors][Cg in blocks of cb][KH][KW][cb][ob * V]: in the order the tiles read it
        cp, ogp, obw = C, -(-Og // V) * V, _obv(knobs) * V
        nb = -(-Og // obw)
        n = G * nb * KH * KW * Cg * obw
        wp = aligned_zeros(n + SLACK)
        wg = np.zeros((G, nb * obw, Cg, KH, KW), np.float32)
        wg[:, :Og] = w.reshape(G, Og, Cg, KH, KW)
        blocks = wp[:n].reshape(G, nb, Cg * KH * KW * obw)
        cb = int(knobs.get("cb", Cg))
        for c0 in range(0, Cg, cb):  # one contiguous run per channel block: the prefetcher streams it
            c1 = min(Cg, c0 + cb)
            blocks[:, :, c0 * KH * KW * obw: c1 * KH * KW * obw] = np.transpose(
                wg[:, :, c0:c1].reshape(G, nb, obw, c1 - c0, KH, KW), (0, 1, 4, 5, 3, 2)).reshape(G, nb, -1)
        sc, sh = (aligned_zeros(G * ogp + SLACK) for _ in range(2))
        for k in range(G):
            sc[k * ogp: k * ogp + Og] = scale[k * Og:(k + 1) * Og]
            sh[k * ogp: k * ogp + Og] = shift[k * Og:(k + 1) * Og]
    wpad = 0 if winograd.tile_m(knobs) or _reads_in_place(p, g, knobs) else _padded_width(p, g, knobs)
    layout, _, steps = conv_epilogue(p)
    nchw = layout == "nchw"
    res = inputs.get("res")
    # the step's scratch (the padded input, and for NCHW the residual and the output in NHWC), used only while
    # it runs: its own buffer here, which a plan re-points into one workspace shared by all its steps
    need = {"xp": N * (g["H"] + g["PT"] + g["PB"]) * wpad * cp + SLACK if wpad else 0,
            "rt": out.size if nchw and res is not None else 0, "yt": out.size if nchw else 0}
    ptr = lambda a: None if a is None else a.ctypes.data  # noqa: E731
    args = ConvArgs(ptr(inputs["x"]), ptr(wp), ptr(sc), ptr(sh), ptr(res), ptr(out), None, None, None,
                    int(knobs.get("cb", 1 << 20)), int(knobs["threads"]), int(knobs.get("order", 0)))
    scratch = Scratch(args, {k: v for k, v in need.items() if v}, shareable=int(knobs["threads"]) == 1)
    run = struct_call(lib.pf_conv, args, (inputs, wp, sc, sh, out, scratch))
    run.scratch = scratch
    return run


# -- the conv problem's facts ---------------------------------------------------------------------------------------

def _attrs(p) -> dict:
    return geom_attrs(",".join(map(str, (*p.dims[5:7], *p.dims[7:16]))))


def _x_shape(p):
    g = geometry(p)
    layout, _, _ = conv_epilogue(p)
    return (g["N"], g["C"], g["H"], g["W"]) if layout == "nchw" else (g["N"], g["H"], g["W"], g["C"])


def output_shape(p):
    g = geometry(p)
    layout, _, _ = conv_epilogue(p)
    return (g["N"], g["O"], g["OH"], g["OW"]) if layout == "nchw" else (g["N"], g["OH"], g["OW"], g["O"])


def _inputs(p, rand):
    g = geometry(p)
    _, _, steps = conv_epilogue(p)
    fan = g["Cg"] * g["KH"] * g["KW"]
    d = {"x": rand(*_x_shape(p)), "w": rand(g["O"], g["Cg"], g["KH"], g["KW"]) / np.float32(math.sqrt(fan)),
         "scale": 1.0 + 0.1 * rand(g["O"]), "shift": 0.1 * rand(g["O"])}
    if "add" in steps:
        d["res"] = rand(*output_shape(p))
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in d.items()}


def _chain(p, y, res):
    """The epilogue chain on an NCHW result ``y`` (fp64), residual ``res`` NCHW."""
    _, _, steps = conv_epilogue(p)
    for s in steps:
        y = y + res if s == "add" else apply_act(y, s)
    return y


def reference(p, f):
    layout, _, steps = conv_epilogue(p)
    nchw = layout == "nchw"
    x = f["x"] if nchw else np.transpose(f["x"], (0, 3, 1, 2))
    y = conv_ref(x, f["w"], None, _attrs(p)) * f["scale"].reshape(1, -1, 1, 1) + f["shift"].reshape(1, -1, 1, 1)
    res = f.get("res")
    if res is not None and not nchw:
        res = np.transpose(res, (0, 3, 1, 2))
    y = _chain(p, y, res)
    return y if nchw else np.transpose(y, (0, 2, 3, 1))


def tolerance(p, f):
    """gamma_K |x| * |w| bound of the sum (K = Cg*KH*KW terms), scaled, plus the epilogue's rounding."""
    mag = reference(p, {**f, "x": np.abs(f["x"]), "w": np.abs(f["w"]), "scale": np.abs(f["scale"]),
                        "shift": np.abs(f["shift"]), **({"res": np.abs(f["res"])} if "res" in f else {})})
    _, _, steps = conv_epilogue(p)
    smooth = any(s not in ("add", "relu", "relu6") for s in steps)
    tol = 4.0 * (p.reduction + 4) * U32 * np.abs(mag)
    return tol * (1.2 if smooth else 1.0) + (1e-6 * (1.0 + np.abs(mag)) if smooth else 0.0) + 1e-30


def _flops(p):
    g = geometry(p)
    return 2.0 * g["N"] * g["O"] * g["OH"] * g["OW"] * (g["Cg"] * g["KH"] * g["KW"] + 1)


def _numpy(p, inp, out):
    """im2col + matmul (the op's library step) in NCHW, then the epilogue with numpy."""
    from ....ops.conv2d import conv_step

    layout, _, steps = conv_epilogue(p)
    nchw = layout == "nchw"
    x = inp["x"] if nchw else np.ascontiguousarray(np.transpose(inp["x"], (0, 3, 1, 2)))
    y = out if nchw else np.empty(output_shape(p)[:1] + (out.shape[3],) + out.shape[1:3], np.float32)
    conv = conv_step(x, inp["w"], y, _attrs(p))
    sc, sh = inp["scale"].reshape(1, -1, 1, 1), inp["shift"].reshape(1, -1, 1, 1)
    res = inp.get("res")
    res = res if res is None or nchw else np.transpose(res, (0, 3, 1, 2))

    def run():
        conv()
        np.multiply(y, sc, out=y)
        np.add(y, sh, out=y)
        np.copyto(y, _chain(p, y, res))
        if not nchw:
            np.copyto(out, np.transpose(y, (0, 2, 3, 1)))

    return run


def _torch(p, inp, out):
    import torch
    import torch.nn.functional as F

    layout, _, steps = conv_epilogue(p)
    nchw = layout == "nchw"
    a = _attrs(p)
    pt, pl, pb, pr = a["pads"]
    t = {k: torch.from_numpy(v) for k, v in inp.items()}
    o = torch.from_numpy(out)
    acts = activations()

    def run():
        with torch.inference_mode():
            x = t["x"] if nchw else t["x"].permute(0, 3, 1, 2)
            if (pt, pl) != (pb, pr):
                x = F.pad(x, (pl, pr, pt, pb))
                pad = 0
            else:
                pad = (pt, pl)
            y = F.conv2d(x, t["w"], None, a["stride"], pad, a["dilation"], a["groups"])
            y = y * t["scale"].view(1, -1, 1, 1) + t["shift"].view(1, -1, 1, 1)
            for s in steps:
                if s == "add":
                    y = y + (t["res"] if nchw else t["res"].permute(0, 3, 1, 2))
                else:
                    y = REGISTRY[acts[s]].epilogue.torch(y, None)
            o.copy_(y if nchw else y.permute(0, 2, 3, 1))

    return run


FACTS = Facts(inputs=_inputs, output_shape=output_shape, reference=reference, tolerance=tolerance, flops=_flops,
              numpy=_numpy, torch=_torch)
