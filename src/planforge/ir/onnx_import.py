"""Import an ONNX model into the IR (extra ``onnx``).

``from_onnx(path)`` checks the model, fixes its input shapes (dynamic sizes
must be given in ``input_shapes``), runs ONNX shape inference, and maps the
nodes in order (the table is ``ONNX`` below). Initializers become
``Graph.params``. Nodes whose inputs are all known at import time (shape
arithmetic, ``Constant``) are evaluated with ONNX's reference evaluator at the
model's opset and become constants; ``Shape`` of a runtime value is known too,
since every shape is concrete.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .fallback import onnx_node
from .frontend import (Const, Emitter, ModelError, Unavailable, UnsupportedOp, UnsupportedOps, as_shape, need_module,
                       op_table)
from ..ops import ONNX
from ..ops.gelu import fold_written_out
from .graph import Graph, ModelSource

_INPUT_DTYPES = {1: "fp32", 7: "int64", 6: "int32", 9: "bool"}   # TensorProto FLOAT, INT64, INT32, BOOL
_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def from_onnx(path_or_model, input_shapes: dict[str, Sequence[int]] | None = None, name: str | None = None,
              strict: bool = False) -> Graph:
    """Import an ONNX model: a path to a ``.onnx`` file or an ``onnx.ModelProto``.

    ``input_shapes`` maps input names to concrete shapes; it is required for inputs with dynamic
    sizes (a ``dim_param`` such as ``"batch"``, or no size at all) and may not contradict a fixed size.
    ``name`` defaults to the file's stem, else the graph's name. A node with no IR mapping runs as a library
    fallback step (ONNX's reference evaluator, numpy); ``strict`` (default False) refuses the model instead,
    listing every such node at once (``UnsupportedOps``).
    """
    onnx = need_module("onnx", "onnx", "importing an ONNX model")
    model, src = _load(onnx, path_or_model)
    is_file = isinstance(path_or_model, (str, Path))
    try:    # by path where there is one: the checker then handles external data and models over 2 GB
        onnx.checker.check_model(str(path_or_model) if is_file else model)
    except Exception as e:  # ValidationError, and C++ errors for broken protos
        first = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
        raise ModelError(f"{src} is not a valid ONNX model: {first}") from None
    if not model.graph.output:
        raise ModelError(f"{src} has no graph outputs")
    name = name or (Path(path_or_model).stem if is_file else None) or model.graph.name or "onnx"
    graph, fallbacks = _Importer(onnx, model, src, name, input_shapes or {}).run()
    if strict and fallbacks:
        raise UnsupportedOps(fallbacks)
    graph.source = ModelSource("onnx", onnx_path=str(Path(path_or_model).resolve()) if is_file else None,
                               onnx_bytes=None if is_file else model.SerializeToString())
    return graph


def _load(onnx, path_or_model):
    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model, f"ONNX model {path_or_model.graph.name or '(unnamed)'!r}"
    p = Path(path_or_model)
    src = repr(str(p))
    if not p.is_file():
        raise ModelError(f"cannot read ONNX file {src}: no such file")
    try:
        model = onnx.load(str(p))
    except Exception as e:  # DecodeError for garbage, OSError, external-data errors
        raise ModelError(f"cannot read ONNX file {src}: not an ONNX model ({type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from None
    if not model.HasField("graph"):
        raise ModelError(f"cannot read ONNX file {src}: it holds no ONNX graph (empty or not an ONNX model)")
    return model, src


# -- the op table -----------------------------------------------------------------------------------------------------

# Each op module of planforge.ops maps its own ONNX op types (``Op.onnx``); this table holds only the plumbing, which
# computes nothing the IR needs an op for.
PLUMBING, _op = op_table()   # op type -> lowering


def _name(node) -> str:
    return node.output[0]


@_op("Identity")
def _identity(em, node, ins, at, opset):
    return ins[0]


@_op("Dropout")
def _dropout(em, node, ins, at, opset):
    if len(ins) > 2 and ins[2] is not None:
        if not isinstance(ins[2], Const) or bool(np.asarray(ins[2].value).reshape(-1)[0]):
            raise em.unsupported("dropout in training mode")
    return (ins[0], Unavailable("dropout's mask"))


@_op("Cast")
def _cast(em, node, ins, at, opset):
    """Values are fp32 in the IR, integers and booleans held exactly: a cast among those kinds is the value itself,
    to bool it is ``x != 0``; from a float to an integer (truncation) there is no op here."""
    import onnx

    T = onnx.TensorProto
    src, dst = em.dtypes.get(node.input[0], T.FLOAT), at.get("to")
    integral = (T.INT64, T.INT32, T.INT16, T.INT8, T.UINT8, T.BOOL)
    if dst == T.BOOL and src != T.BOOL:
        return em.node("ne", [ins[0], em.const(np.float32(0), node.output[0] + ".zero")], node.output[0])
    if src == dst or (dst in (T.FLOAT, T.INT64, T.INT32) and src in integral):
        return ins[0]
    raise em.unsupported(f"casts {T.DataType.Name(src)} to {T.DataType.Name(dst or 0)}; the IR computes in fp32 "
                         f"(integers and booleans held exactly)")


@_op("Shape")
def _shape(em, node, ins, at, opset):
    s = em.shape(ins[0])
    start, end = at.get("start", 0), at.get("end", len(s))
    return Const(np.array(s[start:end], dtype=np.int64), _name(node))


@_op("Size")
def _size(em, node, ins, at, opset):
    return Const(np.array(math.prod(em.shape(ins[0])), dtype=np.int64), _name(node))


# -- GELU written out with Erf: 0.5 * x * (1 + erf(x / sqrt(2))), as exporters emit it before opset 20 ------------

@dataclass(eq=False)
class _ErfGelu(Unavailable):
    """Part of the pattern: ``coef * (x if has_x else 1) * (one + erf(x / sqrt 2))``; any other use is an error."""

    x: str = ""
    coef: float = 1.0
    has_x: bool = False
    one: bool = False


_PATTERN = "the GELU pattern 0.5 * x * (1 + erf(x / sqrt(2)))"


def _erf_gelu(em: Emitter, node, op: str, ins: list):
    """Follow the pattern node by node; emit ``gelu`` once it is complete."""
    name = _name(node)
    if op == "Erf":
        src = em.producer.get(ins[0]) if isinstance(ins[0], str) else None
        if src is None or src.op != "scale" or not math.isclose(src.attrs["factor"], 2 ** -0.5, rel_tol=1e-6):
            raise em.unsupported(f"Erf is supported only inside {_PATTERN}")
        return _ErfGelu(f"erf outside {_PATTERN}", x=src.inputs[0])
    p = next(v for v in ins if isinstance(v, _ErfGelu))
    other = ins[1] if ins[0] is p else ins[0]
    k = em.uniform(other)
    if op == "Add" and not (p.one or p.has_x) and p.coef == 1.0 and k is not None and math.isclose(k, 1.0) \
            and np.broadcast_shapes(em.shape(p.x), em.shape(other)) == em.shape(p.x):
        q = replace(p, one=True)
    elif op == "Mul" and k is not None and em.shape(other) in ((), (1,)):
        q = replace(p, coef=p.coef * k)
    elif op == "Mul" and other == p.x and not p.has_x:
        q = replace(p, has_x=True)
    elif op == "Mul" and isinstance(other, str) and not p.has_x and em.producer.get(other) is not None \
            and em.producer[other].op == "scale" and em.producer[other].inputs[0] == p.x:
        q = replace(p, has_x=True, coef=p.coef * em.producer[other].attrs["factor"])
    else:
        raise em.unsupported(f"uses erf outside {_PATTERN}")
    if q.has_x and q.one and math.isclose(q.coef, 0.5, rel_tol=1e-6):
        return em.node("gelu", [q.x], name, approximate="none")
    return q


# -- the walk ---------------------------------------------------------------------------------------------------------

def _attrs(onnx, node) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


class _Importer:
    def __init__(self, onnx, model, src: str, name: str, input_shapes: dict):
        self.onnx, self.model, self.src = onnx, model, src
        self.em = Emitter(name)
        self.input_shapes = {k: as_shape(v) for k, v in input_shapes.items()}
        self.env: dict[str, Any] = {}
        self.opset = max([o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] or [1])

    def run(self) -> tuple[Graph, list[UnsupportedOp]]:
        """The graph and the nodes it runs as fallback steps."""
        g, em = self.model.graph, self.em
        for init in g.initializer:
            self.env[init.name] = Const(self.onnx.numpy_helper.to_array(init), init.name)
        shapes = self._input_shapes()
        for vi in g.input:
            if vi.name not in self.env:
                self.env[vi.name] = em.input(vi.name, shapes[vi.name])
                dtype = _INPUT_DTYPES[vi.type.tensor_type.elem_type]
                if dtype != "fp32":
                    em.g.input_dtypes[self.env[vi.name]] = dtype
        inferred = self.inferred = self._infer(shapes)
        em.dtypes = self.types
        for idx, node in enumerate(g.node):
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            label = repr(node.name) if node.name else f"(unnamed, output {node.output[0]!r})" if node.output else ""
            em.at(op, f"node #{idx} {label}".rstrip())
            ins = []
            for i in node.input:
                if i and i not in self.env:
                    raise ModelError(f"{self.src}: {em.op} at {em.where} reads {i!r}, which nothing defines")
                ins.append(self.env[i] if i else None)
            outs = self._node(node, op, ins)
            outs = outs if isinstance(outs, tuple) else (outs,)
            for o, v in zip(node.output, outs):
                if o:
                    em.check(v, inferred.get(o), repr(o))
                    self.env[o] = v
            for o in node.output[len(outs):]:
                if o:
                    self.env[o] = Unavailable(f"output {o!r}")
        fold_written_out(em.g)  # GPT-2's gelu_new, one gelu node (its dead parts dropped by finish)
        return em.finish([self.env[o.name] for o in g.output]), list(em.fallbacks)

    def _input_shapes(self) -> dict[str, tuple[int, ...]]:
        g = self.model.graph
        runtime = [vi for vi in g.input if vi.name not in self.env]
        names = [vi.name for vi in runtime]
        unknown = sorted(set(self.input_shapes) - set(names))
        if unknown:
            raise ModelError(f"{self.src}: input_shapes names {unknown}, which are not inputs of the model "
                             f"(its inputs: {names})")
        out = {}
        for vi in runtime:
            t = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                raise ModelError(f"{self.src}: input {vi.name!r} is not a tensor; only tensor inputs are supported")
            if t.elem_type not in _INPUT_DTYPES:
                kind = self.onnx.TensorProto.DataType.Name(t.elem_type)
                raise ModelError(f"{self.src}: input {vi.name!r} has element type {kind}; the IR takes FLOAT, INT64, "
                                 f"INT32 and BOOL inputs")
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
                    for d in t.shape.dim] if t.HasField("shape") else None
            given = self.input_shapes.get(vi.name)
            if given is not None:
                if dims is not None and (len(given) != len(dims) or any(
                        isinstance(d, int) and d != s for d, s in zip(dims, given))):
                    raise ModelError(f"{self.src}: input_shapes[{vi.name!r}] = {given} does not fit the model's "
                                     f"shape {tuple(dims)}")
                out[vi.name] = given
                continue
            if dims is None or not all(isinstance(d, int) for d in dims):
                shown = "unknown rank" if dims is None else str(tuple(dims))
                example = {vi.name: tuple(d if isinstance(d, int) else 1 for d in (dims or [1]))}
                raise ModelError(f"{self.src}: input {vi.name!r} has a dynamic shape {shown}; planforge tunes "
                                 f"concrete shapes: pass input_shapes={example!r} (from_onnx / load_model)")
            out[vi.name] = tuple(dims)
        return out

    def _infer(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """ONNX's own shapes for every value, with the inputs made concrete; used to check the lowering."""
        onnx = self.onnx
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        for vi in m.graph.input:
            if vi.name in shapes:
                t = vi.type.tensor_type
                t.shape.Clear()
                for d in shapes[vi.name]:
                    t.shape.dim.add().dim_value = d
        try:
            m = onnx.shape_inference.infer_shapes(m, strict_mode=False)
        except Exception as e:  # InferenceError: the model contradicts itself
            raise ModelError(f"{self.src}: ONNX shape inference failed: {str(e).strip().splitlines()[0]}") from None
        out = {}
        self.types = {i.name: i.data_type for i in m.graph.initializer}
        for vi in [*m.graph.input, *m.graph.value_info, *m.graph.output]:
            if vi.type.HasField("tensor_type"):
                self.types[vi.name] = vi.type.tensor_type.elem_type
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
                dims = vi.type.tensor_type.shape.dim
                if all(d.HasField("dim_value") for d in dims):
                    out[vi.name] = tuple(d.dim_value for d in dims)
        return out

    def _node(self, node, op: str, ins: list):
        em = self.em
        if node.domain not in ("", "ai.onnx"):
            raise em.unsupported(f"custom domain {node.domain!r}")
        if all(isinstance(v, Const) or v is None for v in ins) and op not in _RANDOM \
                and not any(a.type in (self.onnx.AttributeProto.GRAPH, self.onnx.AttributeProto.GRAPHS)
                            for a in node.attribute):
            return self._fold(node, ins)
        if op == "Erf" or any(isinstance(v, _ErfGelu) for v in ins):
            return _erf_gelu(em, node, op, ins)
        fn = PLUMBING.get(op) or (ONNX[op].onnx[op] if op in ONNX else None)
        if any(isinstance(v, Unavailable) for v in ins):
            em.ref(next(v for v in ins if isinstance(v, Unavailable)))
        try:
            if fn is None:
                raise em.unsupported()
            return fn(em, node, ins, _attrs(self.onnx, node), self.opset)
        except UnsupportedOp as why:
            return self._fallback(node, ins, why)

    def _fallback(self, node, ins, why):
        """The node run by ONNX's reference evaluator at run time (its inputs in their source element types)."""
        T = self.onnx.TensorProto
        dtypes = [self.onnx.helper.tensor_dtype_to_np_dtype(self.types.get(i, T.FLOAT)).name if i else "float32"
                  for i in node.input]
        opsets = {o.domain or "": o.version for o in self.model.opset_import}
        return onnx_node(self.em, node, ins, opsets, dtypes, [self.inferred.get(o) for o in node.output], why)

    def _fold(self, node, ins):
        """Evaluate a node whose inputs are all constants with ONNX's reference evaluator, at the model's opset."""
        from onnx.reference import ReferenceEvaluator

        opsets = {o.domain or "": o.version for o in self.model.opset_import}
        feeds = {i: v.value for i, v in zip(node.input, ins) if i}
        try:
            outs = ReferenceEvaluator(node, opsets=opsets).run(None, feeds)
        except Exception as e:  # the reference evaluator mis-evaluates some nodes: onnxruntime is the second opinion
            try:
                outs = self._fold_ort(node, feeds)
            except Exception as e2:
                raise self.em.unsupported(f"could not evaluate it on constants: {type(e).__name__}: {e} (and with "
                                          f"onnxruntime: {type(e2).__name__}: {_first_line(e2)})") from None
        outs = [o if isinstance(o, np.ndarray) else np.asarray(o) for o in outs]
        hint = next((v.hint for v in ins if isinstance(v, Const)), node.output[0])
        hint = hint if sum(isinstance(v, Const) for v in ins) == 1 else node.output[0]
        return tuple(Const(np.asarray(o), hint) for o in outs)

    def _fold_ort(self, node, feeds: dict) -> list:
        """Evaluate one node on constants with onnxruntime (a one-node model at the source model's opsets)."""
        import onnxruntime as ort

        helper = self.onnx.helper
        ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
               for k, v in feeds.items()]
        outs = [helper.make_tensor_value_info(o, self.types.get(o, 0), None) for o in node.output if o]
        model = helper.make_model(helper.make_graph([node], "fold", ins, outs),
                                  opset_imports=list(self.model.opset_import))
        model.ir_version = min(self.model.ir_version or 9, 9)
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return sess.run(None, {k: np.asarray(v) for k, v in feeds.items()})


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else repr(e)
