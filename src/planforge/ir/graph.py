"""Graph IR: ops with concrete shapes and dtypes, a validator and an fp64 reference interpreter.

A ``Graph`` has runtime ``inputs`` (in call order), ``params`` (weights, as
numpy arrays), ``nodes`` in topological order, each producing one named
value, and ``outputs``. Weights of matmul/linear are stored [K, N] (the
importers transpose PyTorch's [N, K]).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

DTYPES = ("fp32",)
GELU_C0, GELU_C1 = 0.7978845608028654, 0.044715


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
class Graph:
    name: str
    inputs: dict[str, tuple[int, ...]]          # runtime inputs and their shapes, in call order
    params: dict[str, np.ndarray]               # weights and constants (fp32)
    nodes: list[Node]
    outputs: list[str]
    dtype: str = "fp32"

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every value; ``GraphError`` when the graph is not valid."""
        return validate(self)

    def evaluate(self, *args: np.ndarray, dtype=np.float64) -> list[np.ndarray]:
        """Run the graph with numpy in ``dtype`` (fp64 by default: the reference)."""
        return interpret(self, args, dtype)

    def example_inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(s, dtype=np.float32) for s in self.inputs.values()]

    def param_bytes(self) -> int:
        return sum(int(v.nbytes) for v in self.params.values())


def _need(cond: bool, node: Node, msg: str) -> None:
    if not cond:
        raise GraphError(f"{node.where()}: {msg}")


def _mm(s, node):
    a, b = s
    _need(len(a) >= 2 and len(b) >= 2, node, f"matmul needs operands of rank >= 2, got {a} and {b}")
    _need(a[-1] == b[-2], node, f"shape mismatch: {a} @ {b} (inner sizes {a[-1]} != {b[-2]})")
    batch_a, batch_b = a[:-2], b[:-2]
    if batch_b and batch_a != batch_b:
        _need(False, node, f"batch dimensions differ: {a} @ {b}")
    return (*(batch_a or batch_b), a[-2], b[-1])


def _linear(s, node):
    out = _mm(s[:2], node)
    if len(s) == 3:
        _need(s[2] == (out[-1],), node, f"bias shape {s[2]} does not match output width {out[-1]}")
    return out


def _same(s, node):
    _need(s[0] == s[1], node, f"shape mismatch: {s[0]} vs {s[1]}")
    return s[0]


def _bias(s, node):
    _need(len(s[1]) == 1 and s[1][0] == s[0][-1], node, f"bias {s[1]} does not match last dimension of {s[0]}")
    return s[0]


def _layernorm(s, node):
    n = s[0][-1]
    _need(s[1] == (n,) and s[2] == (n,), node, f"gamma {s[1]} / beta {s[2]} must be ({n},)")
    return s[0]


def _transpose(s, node):
    perm = node.attrs.get("perm") or tuple(reversed(range(len(s[0]))))
    _need(sorted(perm) == list(range(len(s[0]))), node, f"perm {perm} is not a permutation of {len(s[0])} axes")
    return tuple(s[0][p] for p in perm)


def _reshape(s, node):
    shape = tuple(node.attrs.get("shape", ()))
    _need(all(isinstance(d, int) and d >= 1 for d in shape), node,
          f"reshape target {shape} has a dynamic or non-positive size; give a concrete shape")
    _need(math.prod(shape) == math.prod(s[0]), node, f"cannot reshape {s[0]} into {shape}")
    return shape


def _concat(s, node):
    axis = node.attrs.get("axis", -1)
    r = len(s[0])
    ax = axis % r
    for t in s[1:]:
        _need(len(t) == r and all(t[i] == s[0][i] for i in range(r) if i != ax), node,
              f"concat shapes differ outside axis {axis}: {s}")
    return tuple(sum(t[ax] for t in s) if i == ax else s[0][i] for i in range(r))


def _unary(s, node):
    return s[0]


OPS: dict[str, tuple[int | None, Callable]] = {
    # op: (number of inputs or None for variadic, shape rule)
    "matmul": (2, _mm), "linear": (None, _linear), "add": (2, _same), "bias": (2, _bias),
    "relu": (1, _unary), "gelu": (1, _unary), "softmax": (1, _unary), "layernorm": (3, _layernorm),
    "transpose": (1, _transpose), "reshape": (1, _reshape), "concat": (None, _concat), "scale": (1, _unary),
}


def validate(g: Graph) -> dict[str, tuple[int, ...]]:
    if g.dtype not in DTYPES:
        raise GraphError(f"graph {g.name!r}: dtype {g.dtype!r} is not supported (supported: {', '.join(DTYPES)})")
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
        if node.op not in OPS:
            raise GraphError(f"{node.where()}: unknown op {node.op!r}; supported ops: {', '.join(sorted(OPS))}")
        arity, rule = OPS[node.op]
        if node.op == "linear":
            _need(len(node.inputs) in (2, 3), node, f"linear takes x, w[, b], got {len(node.inputs)} inputs")
        elif node.op == "concat":
            _need(len(node.inputs) >= 1, node, "concat needs at least one input")
        else:
            _need(len(node.inputs) == arity, node, f"{node.op} takes {arity} inputs, got {len(node.inputs)}")
        for i in node.inputs:
            _need(i in shapes, node, f"input {i!r} is not defined before it is used")
        _need(node.output not in shapes, node, f"value {node.output!r} is defined twice")
        shapes[node.output] = tuple(rule([shapes[i] for i in node.inputs], node))
    for o in g.outputs:
        if o not in shapes:
            raise GraphError(f"graph output {o!r} is not produced by any node")
    if not g.outputs:
        raise GraphError(f"graph {g.name!r} has no outputs")
    return shapes


def gelu(x, approximate: str = "tanh"):
    if approximate == "none":
        from scipy.special import erf

        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    return 0.5 * x * (1.0 + np.tanh(GELU_C0 * (x + GELU_C1 * x**3)))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layernorm(x, g, b, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def apply_op(op: str, args: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """One op's semantics in numpy (any float dtype)."""
    if op == "matmul":
        return args[0] @ args[1]
    if op == "linear":
        y = args[0] @ args[1]
        return y + args[2] if len(args) == 3 else y
    if op in ("add", "bias"):
        return args[0] + args[1]
    if op == "relu":
        return np.maximum(args[0], 0)
    if op == "gelu":
        return gelu(args[0], attrs.get("approximate", "tanh"))
    if op == "softmax":
        return softmax(args[0])
    if op == "layernorm":
        return layernorm(args[0], args[1], args[2], attrs.get("eps", 1e-5))
    if op == "transpose":
        return np.transpose(args[0], attrs.get("perm"))
    if op == "reshape":
        return np.reshape(args[0], attrs["shape"])
    if op == "concat":
        return np.concatenate(args, axis=attrs.get("axis", -1))
    if op == "scale":
        return args[0] * attrs["factor"]
    raise GraphError(f"unknown op {op!r}")


def interpret(g: Graph, args: Sequence[np.ndarray], dtype=np.float64) -> list[np.ndarray]:
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
    return [env[o] for o in g.outputs]


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
