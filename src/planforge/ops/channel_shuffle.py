"""channel_shuffle: ShuffleNet's ``groups``-way interleave of the channels of an NCHW tensor
(``reshape(N, g, C/g, H, W) -> transpose(0, 2, 1, 3, 4) -> reshape(N, C, H, W)``, one copy)."""
from __future__ import annotations

import numpy as np

from .base import Library, Op, need


def shape(s, attrs):
    x = s[0]
    g = int(attrs["groups"])
    need(len(x) >= 2 and g >= 1 and x[1] % g == 0, f"{x[1] if len(x) > 1 else '?'} channels do not split into {g} groups")
    return tuple(x)


def _view(x, g):
    n, c = x.shape[0], x.shape[1]
    return x.reshape(n, g, c // g, *x.shape[2:]).swapaxes(1, 2)


def reference(a, attrs):
    x = a[0]
    return np.ascontiguousarray(_view(x, int(attrs["groups"]))).reshape(x.shape)


def _step(ins, out, attrs):
    x, g = ins[0], int(attrs["groups"])
    dst = out.reshape(x.shape[0], x.shape[1] // g, g, *x.shape[2:])
    return lambda: np.copyto(dst, _view(x, g))


def _torch(em, node, a, kw):
    return em.node("channel_shuffle", [a[0]], node.name, groups=int(kw.get("groups", a[1])))


OPS = [Op(
    "channel_shuffle", 1, shape, reference,
    library={"channel_shuffle": Library(_step)},
    egg_attr=lambda at: str(int(at["groups"])),
    from_egg=lambda s: {"groups": int(s)},
    flops=lambda s, out, attrs: 0.0,
    torch={"channel_shuffle": _torch, "native_channel_shuffle": _torch},
    doc="ShuffleNet's channel interleave over groups",
)]
