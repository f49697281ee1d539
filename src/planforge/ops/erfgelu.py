"""erfgelu: the exact GELU, ``0.5 x (1 + erf(x / sqrt 2))``, as an op of its own so that it compiles.

The importers read torch's and ONNX's default GELU as ``gelu`` with ``approximate="none"``; that e-node's
only implementation is a library step (scipy's erf, about 25 ns an element in fp32). An ``algebra`` rule
makes it equal to ``erfgelu``, which the eltwise template and the GEMM epilogues compute in registers with
Abramowitz and Stegun's 7.1.26 erf (absolute error at most 1.5e-7): with ``a = |x|`` and
``t = 1 / (1 + p a / sqrt 2)``, ``GELU(x) = (x + a) / 2 - a q``, ``q = poly(t) exp(-x^2 / 2) / 2``, which
needs no sign select, so the same statement compiles at every vector width and in scalar C. Extraction
keeps whichever implementation is cheaper. (The name has no underscore: an eltwise chain joins its steps
with ``_``.)"""
from __future__ import annotations

import math

import numpy as np
from egglog import rewrite

from .base import Epilogue, Library, Op, elementwise_flops, keep_shape
from .kernel import eltwise_kernel

P = 0.3275911 / math.sqrt(2.0)  # A&S's p, with the 1 / sqrt 2 of erf's argument folded in
A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def reference(a, attrs):
    from scipy.special import erf

    x = a[0]
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _poly(t: str, f: str = "f") -> str:
    c = [f"{v!r}{f}" for v in A]
    return f"{t} * ({c[0]} + {t} * ({c[1]} + {t} * ({c[2]} + {t} * ({c[3]} + {t} * {c[4]}))))"


_VEC = (f"{{ vf a_ = vmaxf(v, -v); vf t_ = 1.0f / (1.0f + {P!r}f * a_); "
        f"v = 0.5f * (v + a_) - 0.5f * a_ * ({_poly('t_')}) * vexp(-0.5f * v * v); }}")
_SCALAR = (f"{{ float a_ = fabsf(v); float t_ = 1.0f / (1.0f + {P!r}f * a_); "
           f"v = 0.5f * (v + a_) - 0.5f * a_ * ({_poly('t_')}) * expf(-0.5f * v * v); }}")


def _step(ins, out, attrs):
    """The same formula in numpy with four scratch buffers: seven times scipy's erf. ``out`` may be the input
    itself (an epilogue applied in place): everything read from ``x`` is taken before ``out`` is written."""
    x = ins[0]
    a, t, u, w = (np.empty_like(out) for _ in range(4))
    p, c = np.float32(P), [np.float32(v) for v in A]
    half = np.float32(0.5)

    def run():  # every update through out= (an augmented assignment would make the buffer a local of run)
        np.abs(x, out=a)
        np.multiply(x, x, out=u)
        np.multiply(u, -half, out=u)
        np.exp(u, out=u)               # exp(-x^2 / 2)
        np.add(x, a, out=w)            # x + |x|: the last read of x
        np.multiply(a, p, out=t)
        np.add(t, 1.0, out=t)
        np.reciprocal(t, out=t)
        np.multiply(t, c[4], out=out)  # Horner in out
        for k in (3, 2, 1, 0):
            np.add(out, c[k], out=out)
            np.multiply(out, t, out=out)
        np.multiply(out, u, out=out)
        np.multiply(out, a, out=out)   # 2 a q
        np.subtract(w, out, out=out)
        np.multiply(out, half, out=out)

    return run


def _rules(E, v):
    # the importers' exact GELU is this op: the same function, now with a template and a fused-epilogue form
    return {"algebra": [rewrite(E("gelu", v.x, attr="none")).to(E("erfgelu", v.x))]}


def _torch(v, _):
    import torch

    return torch.nn.functional.gelu(v)


OPS = [Op(
    "erfgelu", 1, keep_shape, reference,
    library={"erfgelu": Library(_step)},
    rules=_rules,
    templated=True,
    flops=elementwise_flops(20),
    kernel=eltwise_kernel("erfgelu"),
    epilogue=Epilogue(_VEC, _SCALAR, flops=20, torch=_torch),
    doc="GELU, exact (erf) form, compiled",
)]
