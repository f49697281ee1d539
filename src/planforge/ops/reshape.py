"""reshape to a concrete ``shape``: a view of its input at run time (no copy, no work)."""
from __future__ import annotations

import math

import numpy as np
from egglog import rewrite

from .base import Library, Op, ints, need


def shape(s, attrs):
    shp = tuple(attrs.get("shape", ()))
    need(all(isinstance(d, int) and d >= 1 for d in shp),
         f"reshape target {shp} has a dynamic or non-positive size; give a concrete shape")
    need(math.prod(shp) == math.prod(s[0]), f"cannot reshape {s[0]} into {shp}")
    return shp


def _step(ins, out, attrs):
    a = ins[0]
    return lambda: np.copyto(out, a.reshape(out.shape))


def _out_shape(node):
    return tuple(int(d) for d in node.meta["val"].shape)


def _torch(em, node, a, kw):
    return em.reshape(a[0], _out_shape(node), node.name)


def _onnx_reshape(em, node, ins, at, opset):
    x = ins[0]
    src = em.shape(x)
    want = em.const_ints(ins[1], "the target shape")
    if not at.get("allowzero", 0):
        if any(d == 0 and i >= len(src) for i, d in enumerate(want)):
            raise em.unsupported(f"shape {want} copies an axis that {src} does not have")
        want = [src[i] if d == 0 else d for i, d in enumerate(want)]
    if want.count(-1) > 1:
        raise em.unsupported(f"shape {want} has more than one -1")
    if -1 in want:
        known = math.prod(d for d in want if d != -1)
        if known == 0 or math.prod(src) % known:
            raise em.unsupported(f"cannot reshape {src} into {want}")
        want = [math.prod(src) // known if d == -1 else d for d in want]
    return em.reshape(x, want, node.output[0])


def _onnx_flatten(em, node, ins, at, opset):
    s = em.shape(ins[0])
    axis = int(at.get("axis", 1))
    axis = axis + len(s) if axis < 0 else axis
    return em.reshape(ins[0], (math.prod(s[:axis]), math.prod(s[axis:])), node.output[0])


def _onnx_unsqueeze(em, node, ins, at, opset):
    s = list(em.shape(ins[0]))
    axes = at["axes"] if opset < 13 else em.const_ints(ins[1], "the axes")
    rank = len(s) + len(axes)
    for a in sorted(int(a) % rank for a in axes):
        s.insert(a, 1)
    return em.reshape(ins[0], s, node.output[0])


def _onnx_squeeze(em, node, ins, at, opset):
    s = em.shape(ins[0])
    if opset < 13:
        axes = at.get("axes")
    else:
        axes = em.const_ints(ins[1], "the axes") if len(ins) > 1 and ins[1] is not None else None
    drop = {i for i, d in enumerate(s) if d == 1} if axes is None else {int(a) % len(s) for a in axes}
    if any(s[i] != 1 for i in drop):
        raise em.unsupported(f"squeezes an axis of size > 1 in {s}")
    return em.reshape(ins[0], [d for i, d in enumerate(s) if i not in drop], node.output[0])


def _rules(E, v):
    """An activation of a reshaped value is the reshape of the activation (elementwise: the order of the elements is
    the same): GPT-2's ``Conv1D`` reshapes its GEMM's [32, 1024] output to [1, 32, 1024] before the GELU, which
    then could not become the GEMM's epilogue."""
    from .kernel import activations

    out = []
    for name, op in activations().items():
        attr = name.partition(":")[2]
        out.append(rewrite(E(op, E("reshape", v.x, attr=v.s), attr=attr)).to(E("reshape", E(op, v.x, attr=attr),
                                                                               attr=v.s)))
    return {"epilogue": out}


OPS = [Op(
    "reshape", 1, shape,
    reference=lambda a, attrs: np.reshape(a[0], attrs["shape"]),
    library={"reshape": Library(_step)},
    egg_attr=lambda attrs: ",".join(map(str, attrs["shape"])),
    from_egg=lambda s: {"shape": ints(s)},
    flops=lambda s, out, attrs: 0.0,
    rules=_rules,
    view=True,
    torch={k: _torch for k in ("view", "reshape", "_unsafe_view", "view_copy", "flatten", "unflatten", "unsqueeze",
                               "squeeze", "unsqueeze_copy", "squeeze_copy")},
    onnx={"Reshape": _onnx_reshape, "Flatten": _onnx_flatten, "Unsqueeze": _onnx_unsqueeze,
          "Squeeze": _onnx_squeeze},
    doc="reshape (a view)",
)]
