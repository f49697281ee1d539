"""slice: ``x[start:stop:step]`` along one axis; also what split, chunk, unbind, select and narrow lower to.

The attributes are normalised at import (``0 <= start``, ``stop <= size``,
``step >= 1``), so the shape rule is plain arithmetic. ``select`` is a slice
of one entry and a reshape dropping the axis; ``split``/``chunk``/``unbind``
are tuples of slices, one per piece (the importers hand each ``getitem`` its
piece).
"""
from __future__ import annotations

import numpy as np

from .base import Library, Op, ints, need


def _axis(attrs, rank):
    return int(attrs["axis"]) % max(rank, 1)


def _count(start, stop, step):
    return max(0, -(-(stop - start) // step))


def shape(s, attrs):
    x = s[0]
    need(len(x) >= 1, "slice of a 0-d tensor")
    ax = _axis(attrs, len(x))
    start, stop, step = int(attrs["start"]), int(attrs["stop"]), int(attrs.get("step", 1))
    need(step >= 1 and 0 <= start and stop <= x[ax], f"slice {start}:{stop}:{step} is not normalised for size {x[ax]}")
    n = _count(start, stop, step)
    need(n >= 1, f"slice {start}:{stop}:{step} of an axis of size {x[ax]} is empty")
    return (*x[:ax], n, *x[ax + 1:])


def _index(attrs, rank):
    ax = _axis(attrs, rank)
    return (slice(None),) * ax + (slice(int(attrs["start"]), int(attrs["stop"]), int(attrs.get("step", 1))),)


def reference(a, attrs):
    return a[0][_index(attrs, a[0].ndim)]


def _step(ins, out, attrs):
    view = ins[0][_index(attrs, ins[0].ndim)]
    return lambda: np.copyto(out, view)


def kernel(s, out, attrs):
    """A step-1 slice as the native block copy (``Problem("slab", (outer, axis size, inner, count), start)``,
    ``templates/attention.py``): GPT-2's fused QKV split; None for a strided slice."""
    import math

    from .kernel import Problem

    x = s[0]
    ax = _axis(attrs, len(x))
    start, stop, step = int(attrs["start"]), int(attrs["stop"]), int(attrs.get("step", 1))
    if step != 1 or not x:
        return None
    return Problem("slab", (math.prod(x[:ax]), x[ax], math.prod(x[ax + 1:]), stop - start), str(start))


def slice_axis(em, x, axis: int, start, stop, step, name: str):
    """``x[start:stop:step]`` on ``axis`` with Python's rules for None, negatives and overshoot; the value itself
    when that is all of it, a constant when ``x`` is one."""
    s = em.shape(x)
    ax = em.axis(int(axis), len(s))
    step = 1 if step is None else int(step)
    if step < 1:
        raise em.unsupported(f"slice with step {step}; only positive steps are supported")
    start, stop, step = slice(start, stop, step).indices(s[ax])
    if (start, stop, step) == (0, s[ax], 1):
        return x
    if _count(start, stop, step) < 1:
        raise em.unsupported(f"slice {start}:{stop}:{step} of axis {ax} (size {s[ax]}) is empty")
    attrs = {"axis": ax, "start": start, "stop": stop, "step": step}
    if not isinstance(x, str):
        return em.const(reference([x.value], attrs), x.hint)
    return em.node("slice", [x], name, **attrs)


def select(em, x, axis: int, index: int, name: str):
    """``x.select(axis, index)``: one entry of ``axis``, the axis dropped."""
    s = em.shape(x)
    ax = em.axis(int(axis), len(s))
    i = int(index) + (s[ax] if int(index) < 0 else 0)
    if not 0 <= i < s[ax]:
        raise em.unsupported(f"index {index} is out of range for axis {ax} of size {s[ax]}")
    return em.reshape(slice_axis(em, x, ax, i, i + 1, 1, name + ".row"), s[:ax] + s[ax + 1:], name)


def split(em, x, sizes, axis: int, name: str) -> tuple:
    """Consecutive pieces of ``sizes`` along ``axis``."""
    ax = em.axis(int(axis), len(em.shape(x)))
    if sum(sizes) != em.shape(x)[ax] or any(n < 0 for n in sizes):
        raise em.unsupported(f"split sizes {list(sizes)} do not add up to axis {ax} of {em.shape(x)}")
    out, at = [], 0
    for k, n in enumerate(sizes):
        out.append(slice_axis(em, x, ax, at, at + n, 1, f"{name}.{k}") if n else em.unavailable("an empty split"))
        at += n
    return tuple(out)


def even_sizes(total: int, size: int) -> list[int]:
    """Pieces of ``size`` (the last one shorter): torch's ``split(int)``."""
    return [min(size, total - i) for i in range(0, total, max(size, 1))]


def _dim(a, kw, i, default=0):
    return int(kw.get("dim", a[i] if len(a) > i else default))


def _torch_slice(em, node, a, kw):
    return slice_axis(em, a[0], _dim(a, kw, 1), kw.get("start", a[2] if len(a) > 2 else None),
                      kw.get("end", a[3] if len(a) > 3 else None), kw.get("step", a[4] if len(a) > 4 else 1), node.name)


def _torch_narrow(em, node, a, kw):
    start = int(a[2])
    return slice_axis(em, a[0], int(a[1]), start, start + int(a[3]), 1, node.name)


def _torch_split(em, node, a, kw):
    ax = _dim(a, kw, 2)
    total = em.shape(a[0])[em.axis(ax, len(em.shape(a[0])))]
    sizes = a[1]
    sizes = even_sizes(total, int(sizes)) if isinstance(sizes, int) else [int(n) for n in sizes]
    return split(em, a[0], sizes, ax, node.name)


def _torch_chunk(em, node, a, kw):
    ax = _dim(a, kw, 2)
    total = em.shape(a[0])[em.axis(ax, len(em.shape(a[0])))]
    return split(em, a[0], even_sizes(total, -(-total // int(a[1]))), ax, node.name)


def _torch_unbind(em, node, a, kw):
    ax = _dim(a, kw, 1)
    n = em.shape(a[0])[em.axis(ax, len(em.shape(a[0])))]
    return tuple(select(em, a[0], ax, i, f"{node.name}.{i}") for i in range(n))


def _onnx_slice(em, node, ins, at, opset):
    x, s = ins[0], em.shape(ins[0])
    if opset < 10:
        starts, ends = at["starts"], at["ends"]
        axes, steps = at.get("axes", list(range(len(starts)))), [1] * len(starts)
    else:
        starts, ends = em.const_ints(ins[1], "the starts"), em.const_ints(ins[2], "the ends")
        axes = em.const_ints(ins[3], "the axes") if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
        steps = em.const_ints(ins[4], "the steps") if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    for k, (b, e, ax, st) in enumerate(zip(starts, ends, axes, steps)):
        big = 2 ** 62                            # ONNX writes "to the end" as INT64_MAX
        x = slice_axis(em, x, ax, max(min(b, big), -big), max(min(e, big), -big), st,
                       node.output[0] if k == len(axes) - 1 else f"{node.output[0]}.{k}")
    return x


def _onnx_split(em, node, ins, at, opset):
    x = ins[0]
    ax = em.axis(int(at.get("axis", 0)), len(em.shape(x)))
    total = em.shape(x)[ax]
    if opset >= 13 and len(ins) > 1 and ins[1] is not None:
        sizes = em.const_ints(ins[1], "the split sizes")
    elif opset < 13 and "split" in at:
        sizes = list(at["split"])
    else:
        n = int(at.get("num_outputs", len(node.output)))
        sizes = even_sizes(total, -(-total // n))
    return split(em, x, sizes, ax, node.output[0])


OPS = [Op(
    "slice", 1, shape, reference,
    library={"slice": Library(_step)},
    egg_attr=lambda attrs: f"{attrs['axis']},{attrs['start']},{attrs['stop']},{attrs.get('step', 1)}",
    from_egg=lambda s: dict(zip(("axis", "start", "stop", "step"), ints(s))),
    flops=lambda s, out, attrs: 0.0,
    templated=True,
    kernel=kernel,
    torch={"slice": _torch_slice, "slice_copy": _torch_slice, "narrow": _torch_narrow,
           "select": lambda em, node, a, kw: select(em, a[0], a[1], a[2], node.name),
           "split": _torch_split, "split_with_sizes": _torch_split, "chunk": _torch_chunk, "unbind": _torch_unbind},
    onnx={"Slice": _onnx_slice, "Split": _onnx_split},
    doc="x[start:stop:step] along one axis",
)]
