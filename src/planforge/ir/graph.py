"""Graph IR: ops with concrete shapes and dtypes, a validator and an fp64 reference interpreter.

A ``Graph`` has runtime ``inputs`` (in call order), ``params`` (weights, as
numpy arrays), ``nodes`` in topological order, each producing one named
value, and ``outputs``. Weights of matmul/linear are stored [K, N] (the
importers transpose PyTorch's [N, K]).

Every value is computed in ``dtype`` (fp32). An input may instead be declared
integer or boolean (``input_dtypes``: token ids, an attention mask): callers
pass it in that dtype, and inside the graph it is carried, like every integer
or boolean intermediate (a comparison's 0/1, a gathered index), as exact
float32 values. That is exact for integers of magnitude up to 2**24
(``ops.base.EXACT_INT``), which the ops that index (``gather``) check against their
table sizes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..ops import REGISTRY, ShapeError, ir_ops

DTYPES = ("fp32",)
INPUT_DTYPES = {"fp32": np.float32, "int64": np.int64, "int32": np.int32, "bool": np.bool_}


class GraphError(ValueError):
    """A graph that is not well formed: unknown op, shape mismatch, dynamic shape, dangling name."""


@dataclass(frozen=True)
class Node:
    """``output = op(*inputs, **attrs)``."""

    op: str
    inputs: tuple[str, ...]
    output: str
    attrs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def where(self) -> str:
        return f"node {self.output!r} ({self.op})"


@dataclass
class ModelSource:
    """Where an imported graph came from: the runtimes a whole model is measured against (``planforge.peers``)
    run this, not planforge's reading of it. ``kind``: ``"onnx"`` (``onnx_path``, or ``onnx_bytes`` of an
    in-memory model) or ``"torch"`` (``module``: the ``torch.nn.Module``, or a ``torch.export.ExportedProgram``).
    Only the file path survives pickling (a graph sent to a measuring process carries no module or bytes)."""

    kind: str
    onnx_path: str | None = None
    onnx_bytes: bytes | None = None
    module: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"kind": self.kind, "onnx_path": self.onnx_path, "onnx_bytes": None, "module": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


@dataclass
class Graph:
    name: str
    inputs: dict[str, tuple[int, ...]]          # runtime inputs and their shapes, in call order
    params: dict[str, np.ndarray]               # weights and constants (fp32)
    nodes: list[Node]
    outputs: list[str]
    dtype: str = "fp32"
    input_dtypes: dict[str, str] = field(default_factory=dict)   # inputs that are not `dtype`: int64, int32, bool
    source: ModelSource | None = field(default=None, compare=False, repr=False)  # an imported model's original

    def input_dtype(self, name: str) -> str:
        return self.input_dtypes.get(name, self.dtype)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every value; ``GraphError`` when the graph is not valid."""
        return validate(self)

    def evaluate(self, *args: np.ndarray, dtype=np.float64) -> list[np.ndarray]:
        """Run the graph with numpy in ``dtype`` (fp64 by default: the reference)."""
        return interpret(self, args, dtype)

    def example_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Random inputs: standard normal floats; integers in [0, rows) of the smallest table an op indexes with
        them (``index_bound``; 2 when none does); booleans 0/1."""
        rng = np.random.default_rng(seed)
        out = []
        for name, s in self.inputs.items():
            dt = self.input_dtype(name)
            if dt == self.dtype:
                out.append(rng.standard_normal(s, dtype=np.float32))
            else:
                high = 2 if dt == "bool" else self.index_bound(name)
                out.append(rng.integers(0, high, size=s).astype(INPUT_DTYPES[dt]))
        return out

    def index_bound(self, name: str) -> int:
        """The number of rows of the smallest table an op indexes with value ``name`` (2 when none does)."""
        shapes = {**self.inputs, **{k: tuple(v.shape) for k, v in self.params.items()}}
        bounds = []
        for n in self.nodes:
            op = REGISTRY.get(n.op)
            if op is not None and op.index_bound is not None and name in n.inputs[1:]:
                src = shapes.get(n.inputs[0])
                if src is not None:
                    bounds.append(op.index_bound(src, n.attrs))
        return min(bounds, default=2)

    def param_bytes(self) -> int:
        return sum(int(v.nbytes) for v in self.params.values())


def node_shape(node: Node, shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The output shape of ``node`` from its inputs' ``shapes`` by its op's rule; ``GraphError`` says why not."""
    op = REGISTRY.get(node.op)
    if op is None or op.internal:
        raise GraphError(f"{node.where()}: unknown op {node.op!r}; supported ops: {', '.join(ir_ops())}")
    why = op.check_arity(len(node.inputs))
    if why:
        raise GraphError(f"{node.where()}: {why}")
    for i in node.inputs:
        if i not in shapes:
            raise GraphError(f"{node.where()}: input {i!r} is not defined before it is used")
    if node.output in shapes:
        raise GraphError(f"{node.where()}: value {node.output!r} is defined twice")
    try:
        return tuple(op.shape([shapes[i] for i in node.inputs], node.attrs))
    except ShapeError as e:
        raise GraphError(f"{node.where()}: {e}") from None
    except (KeyError, TypeError, ValueError, IndexError) as e:  # a missing or malformed attribute
        raise GraphError(f"{node.where()}: bad attributes {node.attrs!r} for {node.op}: {type(e).__name__}: {e}") from None


def validate(g: Graph) -> dict[str, tuple[int, ...]]:
    if g.dtype not in DTYPES:
        raise GraphError(f"graph {g.name!r}: dtype {g.dtype!r} is not supported (supported: {', '.join(DTYPES)})")
    for name, dt in g.input_dtypes.items():
        if name not in g.inputs or dt not in INPUT_DTYPES:
            raise GraphError(f"graph {g.name!r}: input_dtypes[{name!r}] = {dt!r}: not an input of the graph or not "
                             f"one of {', '.join(INPUT_DTYPES)}")
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shp in g.inputs.items():
        shp = tuple(shp)
        if not all(isinstance(d, int) and d >= 1 for d in shp):
            raise GraphError(f"input {name!r} has a dynamic or non-positive shape {shp}; give concrete sizes "
                             f"(e.g. batch 1) when building or importing the graph")
        shapes[name] = shp
    for name, arr in g.params.items():
        if name in shapes:
            raise GraphError(f"{name!r} is both an input and a parameter")
        shapes[name] = tuple(arr.shape)
    for node in g.nodes:
        shapes[node.output] = node_shape(node, shapes)
    for o in g.outputs:
        if o not in shapes:
            raise GraphError(f"graph output {o!r} is not produced by any node")
    if not g.outputs:
        raise GraphError(f"graph {g.name!r} has no outputs")
    return shapes


def apply_op(op: str, args: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """One op's semantics in numpy (any float dtype): the registry's reference."""
    entry = REGISTRY.get(op)
    if entry is None:
        raise GraphError(f"unknown op {op!r}")
    return entry.reference(list(args), attrs)


def interpret(g: Graph, args: Sequence[np.ndarray], dtype=np.float64) -> list[np.ndarray]:
    return values_of(g, args, g.outputs, dtype)


def values_of(g: Graph, args: Sequence[np.ndarray], names: Sequence[str], dtype=np.float64) -> list[np.ndarray]:
    """The values ``names`` (inputs, parameters or any node's output) of ``g`` run on ``args`` with numpy in
    ``dtype``: what flows into a part of a partitioned graph, for instance."""
    shapes = validate(g)
    if len(args) != len(g.inputs):
        raise GraphError(f"graph {g.name!r} takes {len(g.inputs)} inputs ({', '.join(g.inputs)}), got {len(args)}")
    env: dict[str, np.ndarray] = {}
    for (name, shp), a in zip(g.inputs.items(), args):
        a = np.asarray(a)
        if tuple(a.shape) != tuple(shp):
            raise GraphError(f"input {name!r} has shape {tuple(a.shape)}, the graph expects {tuple(shp)}")
        env[name] = a.astype(dtype)
    for name, p in g.params.items():
        env[name] = p.astype(dtype)
    for node in g.nodes:
        env[node.output] = apply_op(node.op, [env[i] for i in node.inputs], node.attrs)
    assert all(tuple(env[o].shape) == shapes[o] for o in g.outputs)
    missing = [n for n in names if n not in env]
    if missing:
        raise GraphError(f"graph {g.name!r} has no value {', '.join(map(repr, missing))}")
    return [env[n] for n in names]


class GraphBuilder:
    """Small helper to write graphs by hand (the model zoo uses it)."""

    def __init__(self, name: str, seed: int = 0):
        self.g = Graph(name, {}, {}, [], [])
        self.rng = np.random.default_rng(seed)
        self._n = 0

    def input(self, name: str, shape: Sequence[int]) -> str:
        self.g.inputs[name] = tuple(shape)
        return name

    def param(self, name: str, value: np.ndarray) -> str:
        self.g.params[name] = np.ascontiguousarray(value, dtype=np.float32)
        return name

    def weight(self, name: str, k: int, n: int) -> str:
        return self.param(name, self.rng.standard_normal((k, n), dtype=np.float32) / np.float32(math.sqrt(k)))

    def vector(self, name: str, n: int, scale: float = 0.1, offset: float = 0.0) -> str:
        return self.param(name, self.rng.standard_normal(n, dtype=np.float32) * np.float32(scale) + np.float32(offset))

    def op(self, op: str, *inputs: str, name: str | None = None, **attrs) -> str:
        self._n += 1
        out = name or f"{op}{self._n}"
        self.g.nodes.append(Node(op, tuple(inputs), out, attrs))
        return out

    def linear(self, x: str, k: int, n: int, prefix: str, act: str | None = None) -> str:
        w = self.weight(f"{prefix}.w", k, n)
        b = self.vector(f"{prefix}.b", n)
        y = self.op("bias", self.op("matmul", x, w), b)
        return self.op(act, y) if act else y

    def output(self, *names: str) -> Graph:
        self.g.outputs = list(names)
        validate(self.g)
        return self.g
