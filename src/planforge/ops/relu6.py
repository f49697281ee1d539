"""relu6: ``min(max(x, 0), 6)`` (MobileNet's activation; ``Clip(x, 0, 6)`` in ONNX)."""
from __future__ import annotations

import numpy as np

from .base import Epilogue, Library, Op, elementwise_flops, keep_shape
from .kernel import eltwise_kernel

# min(v, 6) as -max(-v, -6): the scalar build of the templates (V == 1) has vmaxf only
VEC = "v = vmaxf(v, vset(0.0f)); v = -vmaxf(-v, vset(-6.0f));"
SCALAR = "v = fminf(fmaxf(v, 0.0f), 6.0f);"


def _step(ins, out, attrs):
    a = ins[0]
    return lambda: np.clip(a, 0.0, 6.0, out=out)


def _onnx_clip(em, node, ins, at, opset):
    """Clip to [0, 6] (bounds as attributes before opset 11, as constant inputs after) is relu6; [0, inf) is relu."""
    if opset < 11:
        lo, hi = at.get("min", -np.inf), at.get("max", np.inf)
    else:
        lo = em.uniform(ins[1]) if len(ins) > 1 and ins[1] is not None else -np.inf
        hi = em.uniform(ins[2]) if len(ins) > 2 and ins[2] is not None else np.inf
        if lo is None or hi is None:
            raise em.unsupported("Clip bounds computed at run time")
    if lo == 0.0 and hi == 6.0:
        return em.node("relu6", [ins[0]], node.output[0])
    if lo == 0.0 and hi == np.inf:
        return em.node("relu", [ins[0]], node.output[0])
    raise em.unsupported(f"Clip to [{lo:g}, {hi:g}]; the IR has relu (0, inf) and relu6 (0, 6)")


def _torch_hardtanh(em, node, a, kw):
    lo, hi = float(kw.get("min_val", a[1] if len(a) > 1 else -1.0)), float(kw.get("max_val", a[2] if len(a) > 2 else 1.0))
    if (lo, hi) != (0.0, 6.0):
        raise em.unsupported(f"hardtanh to [{lo:g}, {hi:g}]; the IR has relu6 (hardtanh to [0, 6]) only")
    return em.node("relu6", [a[0]], node.name)


OPS = [Op(
    "relu6", 1, keep_shape,
    reference=lambda a, attrs: np.clip(a[0], 0.0, 6.0),
    library={"relu6": Library(_step)},
    templated=True,
    kernel=eltwise_kernel("relu6"),
    flops=elementwise_flops(2),
    epilogue=Epilogue(VEC, SCALAR, flops=2, torch=lambda v, _: v.clamp(0.0, 6.0)),
    torch={"relu6": lambda em, node, a, kw: em.node("relu6", [a[0]], node.name), "hardtanh": _torch_hardtanh},
    onnx={"Clip": _onnx_clip},
    doc="min(max(x, 0), 6)",
)]
