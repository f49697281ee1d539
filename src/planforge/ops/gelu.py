"""gelu: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (``approximate="tanh"``, the IR's default) or the
exact ``0.5 x (1 + erf(x / sqrt 2))`` (``approximate="none"``); the compiled epilogue computes the tanh form."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .base import Epilogue, Library, Op, elementwise_flops, keep_shape
from .kernel import eltwise_kernel

C0, C1 = 0.7978845608028654, 0.044715  # sqrt(2/pi) and the cubic coefficient of the tanh form


def gelu(x, approximate: str = "tanh"):
    if approximate == "none":
        from scipy.special import erf

        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    return 0.5 * x * (1.0 + np.tanh(C0 * (x + C1 * x**3)))


def numpy_gelu(x: np.ndarray, t: np.ndarray) -> None:
    """GELU (tanh form) of ``x`` in place, with ``t`` as scratch: no temporaries."""
    np.multiply(x, x, out=t)
    np.multiply(t, x, out=t)
    t *= C1
    t += x
    t *= C0
    np.tanh(t, out=t)
    t += 1.0
    t *= x
    np.multiply(t, 0.5, out=x)


def _step(ins, out, attrs):
    a = ins[0]
    t = np.empty_like(out)
    if attrs.get("approximate", "tanh") == "tanh":
        if a is out:  # in place (an epilogue step): no copy
            return lambda: numpy_gelu(out, t)

        def run():
            np.copyto(out, a)
            numpy_gelu(out, t)

        return run
    from scipy.special import erf

    r2 = np.float32(1 / math.sqrt(2.0))

    def run():
        np.multiply(a, r2, out=t)
        erf(t, out=t)
        np.add(t, 1.0, out=t)
        np.multiply(a, t, out=out)
        np.multiply(out, 0.5, out=out)

    return run


def _close(v, want: float) -> bool:
    return v is not None and abs(float(v) - want) <= 1e-6 * abs(want)


def fold_written_out(graph) -> int:
    """Turn GELU written out in its tanh form (GPT-2's ``gelu_new``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
    x^3)))``, imported as scale, pow, scale, add, scale, tanh, bias, multiply) into one ``gelu`` node, in place;
    returns how many. An importer's pass, not an e-graph rule: the ``1`` is a parameter, whose value the e-graph
    cannot read. The nodes the pattern leaves unused are the importer's to drop."""
    by_out = {n.output: n for n in graph.nodes}

    def node(name, op):
        n = by_out.get(name)
        return n if n is not None and n.op == op else None

    def scaled(name, factor):
        n = node(name, "scale")
        return n.inputs[0] if n is not None and _close(n.attrs.get("factor"), factor) else None

    def inner(name):  # the x of 1 + tanh(C0 (x + C1 x^3)), or None
        b = node(name, "bias")
        if b is None or b.inputs[1] not in graph.params or not np.allclose(graph.params[b.inputs[1]], 1.0, 0, 1e-7):
            return None
        t = node(b.inputs[0], "tanh")
        a = node(scaled(t.inputs[0], C0), "add") if t is not None else None
        if a is None:
            return None
        for x, q in (a.inputs, a.inputs[::-1]):
            p = node(scaled(q, C1), "pow")
            if p is not None and p.inputs[0] == x and _close(p.attrs.get("exponent"), 3.0):
                return x
        return None

    count = 0
    for i, n in enumerate(graph.nodes):
        if n.op != "multiply":
            continue
        for h, rest in (n.inputs, n.inputs[::-1]):
            x = scaled(h, 0.5)
            if x is not None and inner(rest) == x:
                graph.nodes[i] = dataclasses.replace(n, op="gelu", inputs=(x,), attrs={"approximate": "tanh"})
                count += 1
                break
    return count


def _approx(em, approx):
    if approx not in ("none", "tanh"):
        raise em.unsupported(f"gelu approximate={approx!r}")
    return approx


def _torch(em, node, a, kw):
    approx = _approx(em, kw.get("approximate", a[1] if len(a) > 1 else "none"))
    return em.node("gelu", [a[0]], node.name, approximate=approx)


def _onnx(em, node, ins, at, opset):
    return em.node("gelu", [ins[0]], node.output[0], approximate=_approx(em, at.get("approximate", "none")))


def _torch_gelu(v, _):
    import torch

    return torch.nn.functional.gelu(v, approximate="tanh")


OPS = [Op(
    "gelu", 1, keep_shape,
    reference=lambda a, attrs: gelu(a[0], attrs.get("approximate", "tanh")),
    library={"gelu": Library(_step)},
    egg_attr=lambda attrs: attrs.get("approximate", "tanh"),
    from_egg=lambda s: {"approximate": s or "tanh"},
    templated=True,
    flops=elementwise_flops(12),
    kernel=eltwise_kernel("gelu"),
    epilogue=Epilogue("v = vgelu(v);", "v = s_gelu(v);", flops=12, attr="tanh", torch=_torch_gelu),
    torch={"gelu": _torch},
    onnx={"Gelu": _onnx},
    doc="GELU, tanh form by default",
)]
