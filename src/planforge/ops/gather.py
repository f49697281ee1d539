"""gather: ``take(x, idx, axis)``, rows (or slices along ``axis``) of ``x`` picked by integer indices.

An embedding lookup is ``gather(table, ids, axis=0)``; ``index_select`` and
ONNX ``Gather`` are the same op. The indices are IR values like any other:
integers carried exactly in fp32 (the shape rule refuses a table axis longer
than ``EXACT_INT``, past which an fp32 index would not be exact).
"""
from __future__ import annotations

import numpy as np

from .base import EXACT_INT, Library, Op, need


def _axis(s, attrs):
    return int(attrs.get("axis", 0)) % max(len(s[0]), 1)


def shape(s, attrs):
    need(len(s[0]) >= 1, "gather from a 0-d tensor")
    ax = _axis(s, attrs)
    need(s[0][ax] <= EXACT_INT, f"gather along an axis of {s[0][ax]} entries: indices past {EXACT_INT} are not exact "
                                f"in fp32")
    return (*s[0][:ax], *s[1], *s[0][ax + 1:])


def reference(a, attrs):
    return np.take(a[0], a[1].astype(np.int64), axis=_axis([a[0].shape], attrs))


def _step(ins, out, attrs):
    x, idx = ins[0], ins[1]
    ax = _axis([x.shape], attrs)
    ibuf = np.empty(idx.shape, np.intp)

    def run():
        np.copyto(ibuf, idx, casting="unsafe")     # exact: the indices are integers held in fp32
        np.take(x, ibuf, axis=ax, out=out)

    return run


def _torch_embedding(em, node, a, kw):
    return em.node("gather", [a[0], a[1]], node.name, axis=0)


def _torch_index_select(em, node, a, kw):
    return em.node("gather", [a[0], a[2]], node.name, axis=em.axis(int(a[1]), len(em.shape(a[0]))))


def _torch_index(em, node, a, kw):
    """``x[..., idx, ...]``: one index tensor, the other axes taken whole; or ``x[i0, i1, ...]`` with constant
    indices on the leading axes (HF's mask builders), which is one gather from ``x`` flattened over those axes."""
    picks = [(i, t) for i, t in enumerate(a[1]) if t is not None]
    if len(picks) == 1:
        (ax, idx), = picks
        return em.node("gather", [a[0], idx], node.name, axis=ax)
    k = len(a[1])
    if [i for i, _ in picks] != list(range(k)) or any(isinstance(t, str) for _, t in picks):
        raise em.unsupported(f"advanced indexing with {len(picks)} index tensors that are not constants on the "
                             f"leading axes")
    s = em.shape(a[0])
    try:
        idx = np.broadcast_arrays(*[np.asarray(t.value) for _, t in picks])
        flat = np.ravel_multi_index(tuple(i % d for i, d in zip(idx, s)), s[:k])
    except ValueError as e:
        raise em.unsupported(f"advanced indexing: {e}") from None
    x = em.reshape(a[0], (int(np.prod(s[:k])), *s[k:]), node.name + ".flat")
    return em.node("gather", [x, em.const(flat, node.name + ".index")], node.name, axis=0)


def _onnx(em, node, ins, at, opset):
    return em.node("gather", [ins[0], ins[1]], node.output[0], axis=em.axis(int(at.get("axis", 0)),
                                                                             len(em.shape(ins[0]))))


OPS = [Op(
    "gather", 2, shape, reference,
    library={"gather": Library(_step)},
    egg_attr=lambda attrs: str(int(attrs.get("axis", 0))),
    from_egg=lambda s: {"axis": int(s)},
    flops=lambda s, out, attrs: 0.0,
    torch={"embedding": _torch_embedding, "index_select": _torch_index_select, "index": _torch_index},
    onnx={"Gather": _onnx},
    index_bound=lambda table, attrs: table[int(attrs.get("axis", 0)) % max(len(table), 1)],
    doc="take(x, indices, axis): an embedding lookup",
)]
