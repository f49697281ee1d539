"""batchnorm in inference: ``y = (x - mean) / sqrt(var + eps) * gamma + beta`` over axis 1 (channels).

The IR's ``batchnorm(x, stats)`` takes the statistics as one parameter ``stats`` [4, C] (rows gamma, beta,
running mean, running variance; the importers stack them), so that the e-graph's fused forms stay within
three operands. The module also holds the parameter-only ops the rewrites build, each folded into a
constant when a plan is loaded (``targets.cpu.plan``): ``bn_fold_w`` (the weight scaled per output channel),
``bn_fold_b`` (the bias that goes with it) and ``bn_affine`` (the per-channel [scale; shift] a fused
Conv+BN kernel applies). They compute in fp64 and round once, so a folded weight is the fp32 rounding of
the exact fold.
"""
from __future__ import annotations

import numpy as np

from .base import Library, Op, need

DEFAULT_EPS = 1e-5


def _eps(attrs) -> float:
    return float(attrs.get("eps", DEFAULT_EPS))


def scale_shift(st, eps: float, b=None) -> tuple[np.ndarray, np.ndarray]:
    """fp64 per-channel (scale, shift) of ``stats``; ``b``: a convolution bias in front of it."""
    g, beta, mean, var = (np.asarray(r, np.float64) for r in st)
    scale = g / np.sqrt(var + eps)
    mean = mean if b is None else mean - np.asarray(b, np.float64)
    return scale, beta - mean * scale


def shape(s, attrs):
    x, st = s[0], s[1]
    need(len(x) >= 2, f"batchnorm needs channels on axis 1, got shape {x}")
    need(tuple(st) == (4, x[1]), f"batchnorm statistics {st} must be [4, {x[1]}] (gamma, beta, mean, var)")
    return tuple(x)


def _bcast(v, rank):
    return v.reshape((1, -1) + (1,) * (rank - 2))


def reference(a, attrs):
    x = a[0]
    scale, shift = scale_shift(a[1], _eps(attrs))
    return (x * _bcast(scale, x.ndim) + _bcast(shift, x.ndim)).astype(x.dtype, copy=False)


def _step(ins, out, attrs):
    x = ins[0]
    scale, shift = scale_shift(ins[1], _eps(attrs))  # statistics are parameters: fixed when the plan is bound
    sc, sh = _bcast(scale.astype(np.float32), x.ndim), _bcast(shift.astype(np.float32), x.ndim)

    def run():
        np.multiply(x, sc, out=out)
        np.add(out, sh, out=out)

    return run


def stats(em, g, b, mean, var, name: str, channels: int):
    """The [4, C] statistics parameter of an imported batch norm (missing gamma 1, beta 0)."""
    vals = []
    for v, default, what in ((g, 1.0, "weight"), (b, 0.0, "bias"), (mean, None, "running mean"),
                             (var, None, "running variance")):
        if v is None and default is not None:
            vals.append(np.full(channels, default))
            continue
        if v is None or not hasattr(v, "value"):
            raise em.unsupported(f"batch norm {what} is computed at run time (training mode?); the IR folds "
                                 f"inference statistics only")
        vals.append(np.asarray(v.value, np.float64).reshape(-1))
    if any(len(r) != channels for r in vals):
        raise em.unsupported(f"batch norm parameters do not all have {channels} entries")
    return em.const(np.stack(vals).astype(np.float32), name + ".stats")


def _norm(em, x, st, eps, name):
    return em.node("batchnorm", [x, st], name, eps=float(eps))


def _torch(em, node, a, kw):
    kind = node.target.overloadpacket.__name__
    x = a[0]
    C = em.shape(x)[1]
    if kind == "batch_norm":   # (x, weight, bias, mean, var, training, momentum, eps, cudnn)
        if kw.get("training", a[5] if len(a) > 5 else False):
            raise em.unsupported("batch norm in training mode (import the module in eval mode)")
        eps = kw.get("eps", a[7] if len(a) > 7 else DEFAULT_EPS)
        y = _norm(em, x, stats(em, a[1], a[2], a[3], a[4], node.name, C), eps, node.name)
        return y
    # _native_batch_norm_legit_no_training(x, weight, bias, mean, var, momentum, eps) -> (y, mean, rstd)
    eps = kw.get("eps", a[6] if len(a) > 6 else DEFAULT_EPS)
    y = _norm(em, x, stats(em, a[1], a[2], a[3], a[4], node.name, C), eps, node.name)
    return (y, em.unavailable("batch norm's saved mean"), em.unavailable("batch norm's saved rstd"))


def _onnx(em, node, ins, at, opset):
    if at.get("training_mode", 0):
        raise em.unsupported("BatchNormalization in training mode")
    x = ins[0]
    y = _norm(em, x, stats(em, ins[1], ins[2], ins[3], ins[4], node.output[0], em.shape(x)[1]),
              at.get("epsilon", DEFAULT_EPS), node.output[0])
    return (y,) + tuple(em.unavailable("BatchNormalization's running statistics") for _ in node.output[1:])


# -- the parameter-only ops of the rewrites (folded at load time) ------------------------------------------------

def _fold_w(a, attrs):
    w, st = a[0], a[1]
    scale, _ = scale_shift(st, _eps(attrs))
    return (np.asarray(w, np.float64) * scale.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)


def _with_bias(a):
    """(conv bias or None, stats) of a 1- or 2-operand fold op."""
    return (None, a[0]) if len(a) == 1 else (a[0], a[1])


def _fold_b(a, attrs):
    b, st = _with_bias(a)
    return scale_shift(st, _eps(attrs), b)[1].astype(st.dtype)


def _affine(a, attrs):
    b, st = _with_bias(a)
    return np.stack(scale_shift(st, _eps(attrs), b)).astype(st.dtype)


def _param_step(ref):
    def step(ins, out, attrs):
        return lambda: np.copyto(out, ref(ins, attrs))
    return step


def _stats_of(s):
    return s[0] if len(s) == 1 else s[1]


def _fold_w_shape(s, attrs):
    need(len(s[1]) == 2 and s[1][0] == 4 and s[1][1] == s[0][0], f"statistics {s[1]} do not fit weight {s[0]}")
    return tuple(s[0])


def _bias_shape(rows):
    def shape_(s, attrs):
        st = _stats_of(s)
        need(len(st) == 2 and st[0] == 4, f"batch norm statistics must be [4, C], got {st}")
        need(len(s) == 1 or tuple(s[0]) == (st[1],), f"bias {s[0]} does not fit statistics {st}")
        return (st[1],) if rows == 1 else (rows, st[1])
    return shape_


def _param_op(name, arity, shape_, ref, doc):
    return Op(name, arity, shape_, ref, library={name: Library(_param_step(ref))}, egg_attr=lambda at: repr(_eps(at)),
              from_egg=lambda s: {"eps": float(s)} if s else {}, flops=lambda s, out, attrs: 0.0, internal=True,
              doc=doc)


OPS = [
    Op("batchnorm", 2, shape, reference,
       library={"batchnorm": Library(_step, passes=2)},
       egg_attr=lambda at: repr(_eps(at)),
       from_egg=lambda s: {"eps": float(s)} if s else {},
       flops=lambda s, out, attrs: 2.0 * float(np.prod(out)),
       torch={"batch_norm": _torch, "_native_batch_norm_legit_no_training": _torch},
       onnx={"BatchNormalization": _onnx},
       doc="batch norm with inference statistics (channels on axis 1)"),
    _param_op("bn_fold_w", 2, _fold_w_shape, _fold_w, "a weight scaled by a batch norm's gamma / sqrt(var + eps)"),
    _param_op("bn_fold_b", (1, 2), _bias_shape(1), _fold_b, "the bias of a convolution with a batch norm folded in"),
    _param_op("bn_affine", (1, 2), _bias_shape(2), _affine, "a batch norm (after a bias) as per-channel [scale; shift]"),
]
