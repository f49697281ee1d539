"""layernorm over the last axis with gamma and beta, and ``normalize`` (without them) that the algebra rule exposes.

The compiled template bakes its eps into the kernel: the problem's epilogue is
``none`` for PyTorch's default 1e-5 and ``eps=1e-12`` for another (BERT's)."""
from __future__ import annotations

import math

import numpy as np
from egglog import rewrite

from .base import Library, Op, need
from .kernel import LAYERNORM_EPS as TEMPLATE_EPS, Problem, rowwise_kernel


def shape(s, attrs):
    n = s[0][-1] if s[0] else 0
    need(tuple(s[1]) == (n,) and tuple(s[2]) == (n,), f"gamma {s[1]} / beta {s[2]} must be ({n},)")
    return tuple(s[0])


def normalize(x, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


def _step(affine: bool):
    def step(ins, out, attrs):
        a = ins[0]
        eps = np.float32(float(attrs.get("eps", 1e-5)))
        red = tuple(a.shape[:-1]) + (1,)
        mu = np.empty(red, np.float32)
        var = np.empty(red, np.float32)
        sq = np.empty_like(out)
        g, beta = (ins[1], ins[2]) if affine else (None, None)

        def run():
            np.mean(a, axis=-1, keepdims=True, out=mu)
            np.subtract(a, mu, out=out)
            np.multiply(out, out, out=sq)
            np.mean(sq, axis=-1, keepdims=True, out=var)
            np.add(var, eps, out=var)
            np.sqrt(var, out=var)
            np.divide(out, var, out=out)
            if g is not None:
                np.multiply(out, g, out=out)
                np.add(out, beta, out=out)

        return run
    return step


def _kernel(s, out, attrs):
    """The row-wise template's problem; its eps is compiled in (epilogue ``none`` for 1e-5, else ``eps=...``)."""
    p = rowwise_kernel("layernorm")(s, out, attrs)
    eps = float(attrs.get("eps", 1e-5))
    if p is None or abs(eps - TEMPLATE_EPS) < 1e-12:
        return p
    return Problem("layernorm", p.dims, f"eps={eps!r}")


def _rules(E, v):
    return {"algebra": [rewrite(E("layernorm", v.x, v.g, v.b, attr=v.s)).to(
        E("bias", E("mul", E("normalize", v.x, attr=v.s), v.g), v.b))]}


def lower(em, x, n_axes: int, gamma, beta, eps: float, name: str):
    """Normalise over the last ``n_axes`` axes; several axes become one by a reshape sandwich; a missing
    gamma or beta is ones or zeros."""
    s = em.shape(x)
    if not 1 <= n_axes <= len(s):
        raise em.unsupported(f"normalises over {n_axes} trailing axes of a rank-{len(s)} tensor")
    inner = s[len(s) - n_axes:]
    n = math.prod(inner)
    affine = []
    for v, fill, what in ((gamma, 1.0, "weight"), (beta, 0.0, "bias")):
        if v is None:
            v = em.const(np.full(n, fill, np.float32), f"{name}.{what}")
        if em.shape(v) != inner:
            raise em.unsupported(f"layer norm {what} has shape {em.shape(v)}, expected {inner}")
        affine.append(em.reshape(v, (n,), name + "." + what))
    lead = s[:len(s) - n_axes]
    back = (*lead, n) != s
    flat = em.reshape(x, (*lead, n), name + ".flat")
    y = em.node("layernorm", [flat, *affine], name + ".ln" if back else name, eps=float(eps))
    return em.reshape(y, s, name)


def _torch_layer_norm(em, node, a, kw):
    x, ns = a[0], a[1]
    w = kw.get("weight", a[2] if len(a) > 2 else None)
    b = kw.get("bias", a[3] if len(a) > 3 else None)
    eps = kw.get("eps", a[4] if len(a) > 4 else 1e-5)
    return lower(em, x, len(ns), w, b, eps, node.name)


def _torch_native(em, node, a, kw):
    y = lower(em, a[0], len(a[1]), a[2], a[3], a[4], node.name)
    return (y, em.unavailable("layer norm's mean"), em.unavailable("layer norm's reciprocal std"))


def _onnx(em, node, ins, at, opset):
    x = ins[0]
    rank = len(em.shape(x))
    axis = int(at.get("axis", -1))
    if not -rank <= axis < rank:
        raise em.unsupported(f"axis {axis} is out of range for rank {rank}")
    n_axes = rank - axis % rank
    y = lower(em, x, n_axes, ins[1], ins[2] if len(ins) > 2 else None, at.get("epsilon", 1e-5), node.output[0])
    return (y, em.unavailable("layer norm's mean"), em.unavailable("layer norm's inverse std"))


_EPS = dict(egg_attr=lambda attrs: repr(float(attrs.get("eps", 1e-5))), from_egg=lambda s: {"eps": float(s)})

OPS = [
    Op("layernorm", 3, shape,
       reference=lambda a, attrs: normalize(a[0], attrs.get("eps", 1e-5)) * a[1] + a[2],
       library={"layernorm": Library(_step(True), passes=8)}, rules=_rules, templated=True, kernel=_kernel,
       flops=lambda s, out, attrs: 8.0 * math.prod(out),
       torch={"layer_norm": _torch_layer_norm, "native_layer_norm": _torch_native},
       onnx={"LayerNormalization": _onnx}, tolerance_terms=lambda s: s[0][-1],
       doc="layer normalisation over the last axis", **_EPS),
    Op("normalize", 1, lambda s, attrs: tuple(s[0]),
       reference=lambda a, attrs: normalize(a[0], attrs.get("eps", 1e-5)),
       library={"normalize": Library(_step(False))}, internal=True, doc="(x - mean) / sqrt(var + eps)", **_EPS),
]
