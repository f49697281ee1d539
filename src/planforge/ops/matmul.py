"""matmul: ``a @ b`` with numpy's batch rules (equal batch dimensions, or a 2-D right operand)."""
from __future__ import annotations

import math

import numpy as np
from egglog import rewrite

from .base import Library, Op, need
from .egg import T
from .kernel import Problem


def shape(s, attrs):
    a, b = s[0], s[1]
    need(len(a) >= 2 and len(b) >= 2, f"matmul needs operands of rank >= 2, got {a} and {b}")
    need(a[-1] == b[-2], f"shape mismatch: {a} @ {b} (inner sizes {a[-1]} != {b[-2]})")
    batch_a, batch_b = a[:-2], b[:-2]
    need(not batch_b or batch_a == batch_b, f"batch dimensions differ: {a} @ {b}")
    return (*(batch_a or batch_b), a[-2], b[-1])


def flops(s, out, attrs):
    return 2.0 * math.prod(s[0]) * s[1][-1]


def gemm_problem(s, out, epilogue: str):
    """The GEMM (or, for one row, GEMV) problem of ``x @ w`` with a 2-D ``w``; None otherwise. ``x``'s leading
    axes are the GEMM's rows (a transformer's [batch, seq, width] activations: the plan passes a C-contiguous
    ``x`` as [rows, K] and its output as [rows, N])."""
    x, w = s[0], s[1]
    if len(x) < 2 or len(w) != 2 or epilogue is None:
        return None
    rows, K, N = math.prod(x[:-1]), x[-1], w[1]
    return Problem("gemv", (N, K), epilogue) if rows == 1 else Problem("gemm", (rows, N, K), epilogue)


def _step(ins, out, attrs):
    a, b = ins[0], ins[1]
    return lambda: np.matmul(a, b, out=out)


def _bcast_step(ins, out, attrs):
    a, b = ins[0], ins[1]
    ws = np.empty((*a.shape, b.shape[-1]), np.float32)  # the [.., M, K, N] product this form materialises

    def run():
        np.multiply(a[..., :, :, None], b[..., None, :, :], out=ws)
        np.sum(ws, axis=-2, out=out)

    return run


def _bcast_workspace(s) -> int:
    return 4 * math.prod(s[0]) * s[1][-1]


def _torch(em, node, a, kw):
    return em.matmul(a[0], a[1], node.name)


def _onnx(em, node, ins, at, opset):
    return em.matmul(ins[0], ins[1], node.output[0])


def _rules(E, v):
    # weight layout: a parameter may be stored transposed and read through a transposed view
    return {"layout": [rewrite(E("matmul", v.x, T.param(v.s))).to(E("matmul", v.x, E("transpose", T.param_t(v.s), attr="1,0")))]}


OPS = [Op(
    "matmul", 2, shape,
    reference=lambda a, attrs: a[0] @ a[1],
    library={"matmul": Library(_step),
             # broadcast-multiply-reduce: materialises [M, K, N]; twice the FLOPs, three times the traffic
             "matmul_bcast": Library(_bcast_step, workspace=_bcast_workspace, extra_flops=2.0)},
    rules=_rules,
    templated=True,
    kernel=lambda s, out, attrs: gemm_problem(s, out, "none"),
    flops=flops,
    torch={"mm": _torch, "bmm": _torch, "matmul": _torch},
    onnx={"MatMul": _onnx},
    tolerance_terms=lambda s: s[0][-1],
    doc="a @ b",
)]
