"""concat along ``axis`` (default -1); the e-graph holds it as a chain of binary concats."""
from __future__ import annotations

import numpy as np

from .base import Library, Op, need


def shape(s, attrs):
    axis = attrs.get("axis", -1)
    r = len(s[0])
    ax = axis % r
    for t in s[1:]:
        need(len(t) == r and all(t[i] == s[0][i] for i in range(r) if i != ax),
             f"concat shapes differ outside axis {axis}: {list(s)}")
    return tuple(sum(t[ax] for t in s) if i == ax else s[0][i] for i in range(r))


def _step(ins, out, attrs):
    ax = int(attrs.get("axis", -1))
    return lambda: np.concatenate(ins, axis=ax, out=out)


def encode(E, args, attrs):
    e = args[0]
    for t in args[1:]:
        e = E("concat", e, t, attr=str(attrs.get("axis", -1)))
    return e


def _torch(em, node, a, kw):
    return em.concat(list(a[0]), int(kw.get("dim", a[1] if len(a) > 1 else 0)), node.name)


OPS = [Op(
    "concat", (1, None), shape,
    reference=lambda a, attrs: np.concatenate(list(a), axis=attrs.get("axis", -1)),
    library={"concat": Library(_step)},
    egg_attr=lambda attrs: str(attrs.get("axis", -1)),
    from_egg=lambda s: {"axis": int(s)},
    encode=encode,
    flops=lambda s, out, attrs: 0.0,
    torch={"cat": _torch, "concat": _torch},
    onnx={"Concat": lambda em, node, ins, at, opset: em.concat([v for v in ins if v is not None], int(at["axis"]),
                                                              node.output[0])},
    doc="concatenate along an axis",
)]
