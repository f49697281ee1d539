"""Row-wise templates over a [rows, cols] fp32 tensor: softmax, layernorm, RMS scaling, elementwise chains.

Each row is processed with ``vec``-wide vectors (1 is scalar), the column loop
unrolled by ``unroll``; rows are split over ``threads``. Softmax and
layernorm keep the row's statistics in vector accumulators; layernorm offers
one pass (sum and sum of squares together) or two (mean, then the centred
variance: more accurate when the mean is large against the spread). ``rms``
(RMSNorm without its weight, ``x / sqrt(mean(x**2) + eps)``) takes ``eps`` as
a one-element operand: one sweep for the sum of squares, one to scale.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from ....ops import REGISTRY
from ....ops.kernel import layernorm_eps, parse_chain
from ....space import Space, categorical
from .common import header, struct_call
from .parfor import PARFOR_C
from .epilogues import U32, apply_chain, chain_flops, numpy_chain, operands, torch_chain
from .facts import Facts


RMS_EPS = 1e-6  # the eps of a kernel workload's inputs (Llama's; a plan's comes from its model)


class RowArgs(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("p0", ctypes.c_void_p), ("p1", ctypes.c_void_p),
                ("R", ctypes.c_int), ("C", ctypes.c_int), ("threads", ctypes.c_int)]


def space(op: str, R: int, C: int, profile) -> Space:
    lanes = profile.vector_lanes
    knobs = [
        categorical("vec", (1,) + tuple(v for v in (4, 8, 16) if v <= lanes)),
        categorical("unroll", (1, 2, 4)),
        categorical("threads", tuple(range(1, profile.physical_cores + 1))),
    ]
    if op == "layernorm":
        knobs.append(categorical("passes", (1, 2)))
    return Space(knobs, ["vec <= max(1, cols)", "threads <= max(1, rows)"], constants={"rows": R, "cols": C})


_LOOP = r"""
typedef struct { const float *x; float *y; const float *p0, *p1; int R, C, threads; } row_args;

static void rows(const void *c, int lo, int hi) {  /* rows [lo, hi) of one call, on any thread */
    const row_args *g = (const row_args *)c;
    const int C = g->C;
    for (int r = lo; r < hi; r++) row(g->x + (long)r * C, g->y + (long)r * C, g->p0, g->p1, C, r);
}

void pf_row(const row_args *g) {
    pf_parfor(g->R, g->threads, rows, g);  /* rows claimed in chunks (templates/parfor.py) */
}
"""


def _softmax_row(unroll: int) -> str:
    return f"""
static void row(const float *restrict x, float *restrict y, const float *p0, const float *p1, int C, int r) {{
    (void)p0; (void)p1; (void)r;
    int c = 0;
    vf m = vset(-INFINITY);
    #pragma GCC unroll {unroll}
    for (; c + V <= C; c += V) m = vmaxf(m, vload(x + c));
    float mx = vmaxr(m);
    for (; c < C; c++) mx = x[c] > mx ? x[c] : mx;
    vf s = vset(0.0f);
    c = 0;
    #pragma GCC unroll {unroll}
    for (; c + V <= C; c += V) {{ vf e = vexp(vload(x + c) - mx); vstore(y + c, e); s += e; }}
    float sum = vsum(s);
    for (; c < C; c++) {{ y[c] = expf(x[c] - mx); sum += y[c]; }}
    float inv = 1.0f / sum;
    c = 0;
    #pragma GCC unroll {unroll}
    for (; c + V <= C; c += V) vstore(y + c, vload(y + c) * inv);
    for (; c < C; c++) y[c] *= inv;
}}
"""


def _layernorm_row(unroll: int, passes: int, eps: float) -> str:
    stats = f"""
    vf s = vset(0.0f), q = vset(0.0f);
    int c = 0;
    #pragma GCC unroll {unroll}
    for (; c + V <= C; c += V) {{ vf v = vload(x + c); s += v; q += v * v; }}
    float sum = vsum(s), sq = vsum(q);
    for (; c < C; c++) {{ sum += x[c]; sq += x[c] * x[c]; }}
    float mean = sum / C, var = sq / C - mean * mean;
    var = var > 0.0f ? var : 0.0f;
""" if passes == 1 else f"""
    vf s = vset(0.0f);
    int c = 0;
    #pragma GCC unroll {unroll}
    for (; c + V <= C; c += V) s += vload(x + c);
    float sum = vsum(s);
    for (; c < C; c++) sum += x[c];
    float mean = sum / C;
    vf q = vset(0.0f);
    c = 0;
    #pragma GCC unroll {unroll}
    for (; c + V <= C; c += V) {{ vf d = vload(x + c) - mean; q += d * d; }}
    float sq = vsum(q);
    for (; c < C; c++) sq += (x[c] - mean) * (x[c] - mean);
    float var = sq / C;
"""
    return f"""
static void row(const float *restrict x, float *restrict y, const float *gamma, const float *beta, int C, int r) {{
    (void)r;
{stats}
    float rstd = 1.0f / sqrtf(var + {eps!r}f);
    c = 0;
    #pragma GCC unroll {unroll}
    for (; c + V <= C; c += V) vstore(y + c, (vload(x + c) - mean) * rstd * vload(gamma + c) + vload(beta + c));
    for (; c < C; c++) y[c] = (x[c] - mean) * rstd * gamma[c] + beta[c];
}}
"""


def _rms_row(unroll: int) -> str:
    return f"""
static void row(const float *restrict x, float *restrict y, const float *eps, const float *p1, int C, int r) {{
    (void)p1; (void)r;
    vf q = vset(0.0f);
    int c = 0;
    #pragma GCC unroll {unroll}
    for (; c + V <= C; c += V) {{ vf v = vload(x + c); q += v * v; }}
    float sq = vsum(q);
    for (; c < C; c++) sq += x[c] * x[c];
    float rs = 1.0f / sqrtf(sq / C + eps[0]);
    c = 0;
    #pragma GCC unroll {unroll}
    for (; c + V <= C; c += V) vstore(y + c, vload(x + c) * rs);
    for (; c < C; c++) y[c] = x[c] * rs;
}}
"""


def _eltwise_row(unroll: int, chain: str) -> str:
    """Each step of the chain is its op's epilogue snippet (the op registry), applied in registers."""
    steps = [REGISTRY[s].epilogue for s in parse_chain(chain)]
    vec_ops = " ".join(ep.vec for ep in steps)
    sc_ops = " ".join(ep.scalar for ep in steps)
    return f"""
static void row(const float *restrict x, float *restrict y, const float *bias, const float *res0, int C, int r) {{
    const float *res = res0 ? res0 + (long)r * C : NULL;
    (void)bias; (void)res;
    int c = 0;
    #pragma GCC unroll {unroll}
    for (; c + V <= C; c += V) {{ vf v = vload(x + c); {vec_ops} vstore(y + c, v); }}
    for (; c < C; c++) {{ float v = x[c]; {sc_ops} y[c] = v; }}
}}
"""


def source(op: str, knobs: dict[str, Any], chain: str = "") -> str:
    head = f"#define V {knobs['vec']}\n" + header()
    if op == "softmax":
        body = _softmax_row(knobs["unroll"])
    elif op == "layernorm":
        body = _layernorm_row(knobs["unroll"], knobs["passes"], layernorm_eps(chain or "none"))
    elif op == "rms":
        body = _rms_row(knobs["unroll"])
    elif op == "eltwise":
        body = _eltwise_row(knobs["unroll"], chain)
    else:
        raise ValueError(f"no row-wise template for {op!r}")
    return head + PARFOR_C + body + _LOOP


def bind(lib: ctypes.CDLL, knobs: dict[str, Any], x, y, p0=None, p1=None):
    R, C = x.shape
    args = RowArgs(x.ctypes.data, y.ctypes.data, p0.ctypes.data if p0 is not None else None,
                   p1.ctypes.data if p1 is not None else None, R, C, knobs["threads"])
    return struct_call(lib.pf_row, args, keep=(x, y, p0, p1))  # with ``.native``: a step a C chain can call


# -- the problems: softmax, layernorm and elementwise chains over [rows, cols] ----------------------------------------

def _inputs(p, rand):
    R, C = p.dims
    d = {"x": rand(R, C) * (np.float32(3.0) if p.op == "softmax" else np.float32(1.0))}
    if p.op == "layernorm":
        d["gamma"] = rand(C)
        d["beta"] = rand(C)
        d["x"] += np.float32(2.0)  # a non-zero mean, as activations have
    if p.op == "rms":
        d["eps"] = np.array([RMS_EPS], np.float32)
    if p.op == "eltwise":
        need = operands(p.epilogue)
        if "bias" in need:
            d["bias"] = rand(C)
        if "residual" in need:
            d["res"] = rand(R, C)
    return d


def _reference(p, f):
    x = f["x"]
    if p.op == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if p.op == "layernorm":
        mu = x.mean(axis=1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
        return (x - mu) / np.sqrt(var + layernorm_eps(p.epilogue)) * f["gamma"] + f["beta"]
    if p.op == "rms":
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + f["eps"][0])
    return apply_chain(x, p.epilogue, f.get("bias"), f.get("res"))


def _tolerance(p, f):
    """Softmax: a few ulps times the row length's log; layer norm: scaled by the row's mean/std (cancellation);
    chains: a few ulps of the magnitudes summed."""
    C = p.dims[1]
    if p.op == "softmax":
        return np.full(tuple(p.dims), 64 * U32 * (1 + math.log2(C))) * 1.0
    if p.op == "layernorm":
        x = f["x"]
        rel = x.std(axis=1, keepdims=True)
        scale = (np.abs(x).max(axis=1, keepdims=True) / np.maximum(rel, 1e-12))
        return 64 * U32 * (C ** 0.5) * scale * (np.abs(f["gamma"]) * 4 + 1) + 1e-6 + 0 * x
    if p.op == "rms":  # a sum of C squares (all positive: no cancellation), a square root, one product
        x = f["x"]
        return 16 * U32 * (1 + math.log2(C)) * np.abs(x) / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-30) \
            + 1e-6
    mag = np.abs(f["x"]) + (np.abs(f["bias"]) if "bias" in f else 0) + (np.abs(f["res"]) if "res" in f else 0)
    return 8 * U32 * mag + 1e-6


def _flops(p) -> float:
    R, C = p.dims
    per = {"softmax": 25, "layernorm": 8, "rms": 4}.get(p.op) or chain_flops(p.epilogue)
    return float(per * R * C)


def _numpy(p, inp, out):
    """The fastest numpy formulation we know: out= everywhere, no temporaries where avoidable."""
    x = inp["x"]
    if p.op == "softmax":
        mx = np.empty((x.shape[0], 1), np.float32)
        s = np.empty_like(mx)

        def run():
            np.max(x, axis=1, keepdims=True, out=mx)
            np.subtract(x, mx, out=out)
            np.exp(out, out=out)
            np.sum(out, axis=1, keepdims=True, out=s)
            np.divide(out, s, out=out)

        return run
    if p.op == "layernorm":
        g, b = inp["gamma"], inp["beta"]
        eps = np.float32(layernorm_eps(p.epilogue))
        mu = np.empty((x.shape[0], 1), np.float32)
        var = np.empty_like(mu)

        def run():
            np.mean(x, axis=1, keepdims=True, out=mu)
            np.subtract(x, mu, out=out)
            np.mean(np.square(out), axis=1, keepdims=True, out=var)
            np.add(var, eps, out=var)
            np.sqrt(var, out=var)
            np.divide(out, var, out=out)
            np.multiply(out, g, out=out)
            np.add(out, b, out=out)

        return run
    if p.op == "rms":
        eps = inp["eps"]
        ms = np.empty((x.shape[0], 1), np.float32)

        def run():
            np.multiply(x, x, out=out)
            np.mean(out, axis=1, keepdims=True, out=ms)
            np.add(ms, eps, out=ms)
            np.sqrt(ms, out=ms)
            np.divide(x, ms, out=out)

        return run
    chain = numpy_chain(p.epilogue, out, inp.get("bias"), inp.get("res"))

    def run():
        np.copyto(out, x)
        chain()

    return run


def _torch(p, inp, out):
    import torch

    t = {k: torch.from_numpy(v) for k, v in inp.items()}
    o = torch.from_numpy(out)
    x = t["x"]
    if p.op == "softmax":
        def run():
            with torch.inference_mode():
                torch.softmax(x, dim=1, out=o)

        return run
    if p.op == "layernorm":
        C = p.dims[1]
        F = torch.nn.functional

        def run():
            with torch.inference_mode():
                o.copy_(F.layer_norm(x, (C,), t["gamma"], t["beta"], layernorm_eps(p.epilogue)))

        return run
    if p.op == "rms":
        e = float(inp["eps"][0])

        def run():
            with torch.inference_mode():
                o.copy_(x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + e))

        return run
    steps = torch_chain(p.epilogue, {"bias": t.get("bias"), "residual": t.get("res")})

    def run():
        with torch.inference_mode():
            y = x
            for f, operand in steps:
                y = f(y, operand)
            o.copy_(y)

    return run


FACTS = Facts(inputs=_inputs, output_shape=lambda p: tuple(p.dims), reference=_reference, tolerance=_tolerance,
              flops=_flops, numpy=_numpy, torch=_torch)
