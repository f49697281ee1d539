"""fallback: a framework op planforge has no rule for, run as a library step by the framework itself.

An importer that meets an op no module of the registry maps (and that it
cannot fold to a constant) records the call as this op instead of refusing
the model: ``attrs["call"]`` is a JSON description (``describe``) holding the
framework, the op, its non-tensor arguments, the dtypes its tensor operands
had in the source model, the output shape and where the op sits in the
source. ``torch`` calls run through ``torch.ops`` (torch must be installed
where the plan runs); ``onnx`` nodes through ONNX's reference evaluator
(numpy). Operands held as fp32 are converted to their source dtypes for the
call and the result back (integers and booleans exactly), so the step
computes what the model computes. ``strict`` importers refuse such nodes
instead, listing every one (``ir.frontend.UnsupportedOps``).
"""
from __future__ import annotations

import base64
import json
import math
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from .base import Library, Op, need


def describe(framework: str, target: str, args: Any, kwargs: dict, dtypes: Sequence[str], shape: Sequence[int],
             where: str, item: int | None = None, **extra) -> str:
    """The ``call`` attribute: one canonical JSON string (the e-graph holds it as the node's attribute)."""
    return json.dumps({"fw": framework, "target": target, "args": args, "kwargs": kwargs, "dtypes": list(dtypes),
                       "shape": [int(d) for d in shape], "item": item, "where": where, **extra},
                      sort_keys=True, separators=(",", ":"))


def spec(attrs) -> dict:
    return _parse(attrs["call"])


@lru_cache(maxsize=512)
def _parse(call: str) -> dict:
    return json.loads(call)


def shape(s, attrs):
    d = spec(attrs)
    need(len(s) == len(d["dtypes"]), f"fallback {d['target']} takes {len(d['dtypes'])} operands, got {len(s)}")
    return tuple(d["shape"])


# -- torch --------------------------------------------------------------------------------------------------------

def _torch_dtype(torch, name: str, float_dtype):
    dt = getattr(torch, name)
    return float_dtype if dt.is_floating_point and dt == torch.float32 else dt


def _decode(torch, x, tensors):
    if isinstance(x, dict):
        if "in" in x:
            return tensors[x["in"]]
        if "dtype" in x:
            return getattr(torch, x["dtype"])
        if "device" in x:
            return torch.device(x["device"])
        if "layout" in x:
            return getattr(torch, x["layout"])
        if "memory_format" in x:
            return getattr(torch, x["memory_format"])
        if "list" in x:
            return [_decode(torch, y, tensors) for y in x["list"]]
    if isinstance(x, list):
        return tuple(_decode(torch, y, tensors) for y in x)
    return x


def _torch_fn(torch, target: str):
    ns, packet, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, ns), packet), overload)


def _torch_call(d: dict, float_dtype_name: str):
    """``f(arrays) -> tensor``: the op bound to its non-tensor arguments."""
    import torch

    fd = getattr(torch, float_dtype_name)
    fn = _torch_fn(torch, d["target"])
    dts = [_torch_dtype(torch, n, fd) for n in d["dtypes"]]
    item = d.get("item")

    def call(arrays):
        ts = [torch.from_numpy(np.ascontiguousarray(a)).to(dt) for a, dt in zip(arrays, dts)]
        out = fn(*_decode(torch, d["args"], ts), **{k: _decode(torch, v, ts) for k, v in d["kwargs"].items()})
        return out[item] if item is not None else out

    return call


# -- onnx -----------------------------------------------------------------------------------------------------------

def _onnx_call(d: dict, float_dtype):
    import onnx
    from onnx.reference import ReferenceEvaluator

    node = onnx.NodeProto()
    node.ParseFromString(base64.b64decode(d["node"]))
    ev = ReferenceEvaluator(node, opsets=d["opsets"])
    dts = [float_dtype if n == "float32" else np.dtype(n) for n in d["dtypes"]]
    names = list(d["inputs"])
    item = d.get("item") or 0

    def call(arrays):
        feeds = {n: np.asarray(a).astype(dt) for n, a, dt in zip(names, arrays, dts)}
        return ev.run(None, feeds)[item]

    return call


def _call(d: dict, float_dtype):
    if d["fw"] == "torch":
        return _torch_call(d, np.dtype(float_dtype).name)
    if d["fw"] == "onnx":
        return _onnx_call(d, float_dtype)
    raise ValueError(f"fallback for an unknown framework {d['fw']!r}")


def _numpy(r) -> np.ndarray:
    return r.detach().cpu().numpy() if hasattr(r, "detach") else np.asarray(r)


def reference(a, attrs):
    dt = a[0].dtype if a and a[0].dtype.kind == "f" else np.float64
    return _numpy(_call(spec(attrs), dt)(list(a))).astype(dt)


def _step(ins, out, attrs):
    f = _call(spec(attrs), np.float32)

    def run():
        np.copyto(out, _numpy(f(ins)).reshape(out.shape), casting="unsafe")   # integers and 0/1 exactly

    return run


def steps(graph) -> list[tuple[str, str]]:
    """The fallback steps of a graph: (framework op, where it sits in the source), in order."""
    return [(spec(n.attrs)["target"], spec(n.attrs)["where"]) for n in graph.nodes if n.op == "fallback"]


OPS = [Op(
    "fallback", (1, 3), shape, reference,
    library={"fallback": Library(_step)},
    egg_attr=lambda attrs: attrs["call"],
    from_egg=lambda s: {"call": s},
    flops=lambda s, out, attrs: float(math.prod(out)),
    doc="an op with no rule, run by its framework",
)]
