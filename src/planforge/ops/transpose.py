"""transpose: permute the axes (``perm``; default: reverse them)."""
from __future__ import annotations

import numpy as np
from egglog import rewrite

from .base import Library, Op, ints, need

INVOLUTIONS = ("1,0", "1,0,2", "0,2,1", "0,2,1,3")  # permutations equal to their own inverse (the last: heads)


def _perm(attrs, rank):
    return tuple(attrs.get("perm") or tuple(reversed(range(rank))))


def shape(s, attrs):
    perm = _perm(attrs, len(s[0]))
    need(sorted(perm) == list(range(len(s[0]))), f"perm {perm} is not a permutation of {len(s[0])} axes")
    return tuple(s[0][p] for p in perm)


# NCHW -> NHWC of an image with this many channels or fewer runs one strided copy per channel: numpy's copy of
# the transposed view walks the output's innermost axis, which is then 1-4 floats long (a 1x3x96x96 input:
# 92 us as one copy, 22 us as three; from 16 channels on the one copy is faster, 35 against 87 us)
FEW_CHANNELS = 4


def _step(ins, out, attrs):
    a = ins[0]
    perm = attrs.get("perm") or None
    if perm is not None and tuple(perm) == (0, 2, 3, 1) and a.shape[1] <= FEW_CHANNELS and \
            a.flags.c_contiguous and out.flags.c_contiguous:  # reshapes of both are views of the buffers
        N, C = a.shape[0], a.shape[1]
        rows = out.reshape(N, -1, C)  # [N, H*W, C]: a view of the output buffer
        planes = a.reshape(N, C, -1)

        def per_channel():
            for c in range(C):
                rows[:, :, c] = planes[:, c]

        return per_channel
    return lambda: np.copyto(out, np.transpose(a, perm))


def kernel(s, out, attrs):
    """The head transpose ``[B, X, Y, D] -> [B, Y, X, D]`` (perm 0,2,1,3: rows of D floats moved whole) as the
    native row-copy template (``templates/attention.py``); None for any other permutation."""
    from .kernel import Problem

    if len(s[0]) != 4 or _perm(attrs, 4) != (0, 2, 1, 3):
        return None
    return Problem("swap12", tuple(s[0]))


def _rules(E, v):
    return {"algebra": [rewrite(E("transpose", E("transpose", v.x, attr=p), attr=p)).to(v.x) for p in INVOLUTIONS]}


def _torch_t(em, node, a, kw):
    return em.transpose(a[0], tuple(reversed(range(len(em.shape(a[0]))))), node.name)


def _torch_transpose(em, node, a, kw):
    rank = len(em.shape(a[0]))
    d0, d1 = (int(d) % max(rank, 1) for d in a[1:3])
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return em.transpose(a[0], perm, node.name)


def _onnx(em, node, ins, at, opset):
    rank = len(em.shape(ins[0]))
    return em.transpose(ins[0], at.get("perm", list(reversed(range(rank)))), node.output[0])


OPS = [Op(
    "transpose", 1, shape,
    reference=lambda a, attrs: np.transpose(a[0], attrs.get("perm") or None),
    library={"transpose": Library(_step)},
    egg_attr=lambda attrs: ",".join(map(str, attrs.get("perm") or ())),
    from_egg=lambda s: {"perm": ints(s) or None},
    rules=_rules,
    templated=True,
    kernel=kernel,
    flops=lambda s, out, attrs: 0.0,
    torch={"t": _torch_t, "numpy_T": _torch_t, "permute": lambda em, node, a, kw: em.transpose(a[0], a[1], node.name),
           "transpose": _torch_transpose},
    onnx={"Transpose": _onnx},
    doc="permute axes",
)]
