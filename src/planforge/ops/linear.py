"""linear: ``act(x @ w + b)``, the epilogue-fused form of matmul, bias and an activation.

In an IR graph ``linear`` takes ``x, w[, b]`` and an optional ``act`` (default
``none``); the e-graph encodes it as its parts, and the ``epilogue`` rules
fuse matmul, bias and any activation with a compiled epilogue back into
``linear(x, w, b)`` with the activation as its attribute (``relu``,
``gelu:tanh``). ``mlp_fusion`` chains consecutive single-row linears into
one fused MLP kernel.
"""
from __future__ import annotations

import math

import numpy as np
from egglog import rewrite

from .base import Library, Op, need
from .egg import Layers, fused_mlp, mlp
from .kernel import activations, epilogue_of_act
from .matmul import gemm_problem, shape as mm_shape


def shape(s, attrs):
    out = mm_shape(s[:2], attrs)
    if len(s) == 3:
        need(tuple(s[2]) == (out[-1],), f"bias shape {s[2]} does not match output width {out[-1]}")
    return out


def _act(name: str):
    """(op, attrs) of an activation name such as ``gelu:tanh``; None for ``none``."""
    if name in ("none", ""):
        return None
    from .registry import REGISTRY

    op_name, _, attr = name.partition(":")
    op = REGISTRY.get(op_name)
    if op is None or op.epilogue is None or op.epilogue.operand:
        raise ValueError(f"linear activation {name!r} is not an elementwise op with an epilogue")
    return op, op.from_egg(attr)


def reference(a, attrs):
    y = a[0] @ a[1]
    if len(a) == 3:
        y = y + a[2]
    act = _act(attrs.get("act", "none"))
    return y if act is None else act[0].reference([y], act[1])


def _step(ins, out, attrs):
    a, b = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    act = _act(attrs.get("act", "none"))
    tail = None if act is None else act[0].library[act[0].name].step([out], out, act[1])

    def run():
        np.matmul(a, b, out=out)
        if bias is not None:
            np.add(out, bias, out=out)
        if tail is not None:
            tail()

    return run


def flops(s, out, attrs):
    act = _act(attrs.get("act", "none"))
    extra = (1 if len(s) == 3 else 0) + (act[0].epilogue.flops if act else 0)
    return 2.0 * math.prod(s[0]) * s[1][-1] + extra * math.prod(out)


def encode(E, args, attrs):
    """As its parts: matmul, bias, activation (the epilogue rules fuse them back)."""
    e = E("matmul", args[0], args[1])
    if len(args) == 3:
        e = E("bias", e, args[2])
    act = _act(attrs.get("act", "none"))
    if act is not None:
        e = E(act[0].name, e, attr=act[0].egg_attr(act[1]))
    return e


def _rules(E, v):
    x, w, b, L = v.x, v.w, v.b, v.L
    acts = activations()  # every op with a fused GEMM epilogue: relu, gelu:tanh, ...
    epilogue = [rewrite(E("bias", E("matmul", x, w), b)).to(E("linear", x, w, b, attr="none"))]
    for name, op in acts.items():
        attr = name.partition(":")[2]
        epilogue.append(rewrite(E(op, E("linear", x, w, b, attr="none"), attr=attr)).to(E("linear", x, w, b, attr=name)))
    fusion = []
    for a in ("none", *acts):
        fusion.append(rewrite(E("linear", x, w, b, attr=a)).to(mlp(x, Layers.one(w, b, a))))
        fusion.append(rewrite(E("linear", mlp(x, L), w, b, attr=a)).to(mlp(x, L.then(w, b, a))))
    return {"epilogue": epilogue, "mlp_fusion": fusion, "lowering": [rewrite(mlp(x, L)).to(fused_mlp(x, L))]}


def _torch_linear(em, node, a, kw):
    x, w, b = (list(a) + [None, None])[:3]
    b = kw.get("bias", b)
    y = em.matmul(x, em.transposed_weight(w, node.name + ".w"), node.name if b is None else node.name + ".mm")
    return y if b is None else em.add(y, b, node.name)


def _torch_addmm(em, node, a, kw):
    c, x, w = a[:3]
    beta, alpha = kw.get("beta", a[3] if len(a) > 3 else 1), kw.get("alpha", a[4] if len(a) > 4 else 1)
    y = em.scale(em.matmul(x, w, node.name + ".mm"), alpha, node.name + ".alpha")
    return em.add(y, c, node.name, alpha=float(beta))


def _onnx_gemm(em, node, ins, at, opset):
    name = node.output[0]
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    if at.get("transA", 0):
        a = em.transpose(a, (1, 0), name + ".at")
    if at.get("transB", 0):
        b = em.transposed_weight(b, name + ".bt")
    y = em.matmul(a, b, name + ".mm" if c is not None or at.get("alpha", 1.0) != 1.0 else name)
    y = em.scale(y, at.get("alpha", 1.0), name + ".alpha" if c is not None else name)
    return y if c is None else em.add(y, c, name, alpha=float(at.get("beta", 1.0)))


OPS = [Op(
    "linear", (2, 3), shape, reference,
    library={"linear": Library(_step, passes=lambda at: 2 if at.get("act", "none") == "none" else 3)},
    egg_attr=lambda attrs: attrs.get("act", "none"),
    from_egg=lambda s: {"act": s or "none"},
    encode=encode,
    rules=_rules,
    templated=True,
    kernel=lambda s, out, attrs: gemm_problem(s, out, epilogue_of_act(attrs.get("act", "none"))),
    flops=flops,
    torch={"linear": _torch_linear, "addmm": _torch_addmm},
    onnx={"Gemm": _onnx_gemm},
    tolerance_terms=lambda s: s[0][-1],
    doc="act(x @ w + b)",
)]
