"""What the torch and ONNX importers share: their errors, and an ``Emitter`` that lowers framework ops onto IR ops.

Both importers walk a framework graph in order and hand each op to the
emitter, which tracks the shape of every value with the IR's own shape rules
and folds what is known at import time (weights, shape arithmetic) into
constants. A value is either the name of a runtime IR value (``str``) or a
``Const`` (a numpy array); a ``Const`` becomes a ``Graph.params`` entry only
when a runtime op consumes it, so a weight that is only ever transposed is
stored once, already transposed.

The lowerings keep to what the IR can express exactly: broadcasting adds of a
constant become ``bias`` (a vector on the last axis) or ``add`` of the
broadcast constant, a multiply by a uniform constant becomes ``scale``,
softmax on another axis is a transpose sandwich, layer norm over several
trailing axes is a reshape sandwich. Anything else is ``UnsupportedOp``, which
names the op and where it is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..ops.base import EXACT_INT
from .graph import Graph, GraphError, Node, node_shape


class UnsupportedOp(GraphError):
    """A framework op (or a use of one) with no IR mapping. ``op`` is its name, ``where`` says where it is."""

    def __init__(self, op: str, where: str, reason: str = ""):
        self.op, self.where, self.reason = op, where, reason
        msg = f"unsupported op {op} at {where}"
        super().__init__(msg + (f": {reason}" if reason else ""))


class UnsupportedOps(UnsupportedOp):
    """Every op of a model with no IR mapping (strict import), each with where it is; ``ops`` lists them."""

    def __init__(self, ops: Sequence[UnsupportedOp]):
        self.ops = list(ops)
        first = self.ops[0]
        self.op, self.where, self.reason = first.op, first.where, first.reason
        lines = [f"  - {u.op} at {u.where}" + (f": {u.reason}" if u.reason else "") for u in self.ops]
        kinds = sorted({u.op for u in self.ops})
        GraphError.__init__(self, f"{len(self.ops)} unsupported op(s) ({', '.join(kinds)}); strict import refuses "
                                  f"them (without strict they run as library fallback steps):\n" + "\n".join(lines))


class ModelError(GraphError):
    """A model that cannot be imported as a whole: unreadable file, dynamic shapes, missing extra, bad dtype."""


@dataclass(eq=False)
class Const:
    """A value known at import time; ``hint`` names the parameter it becomes."""

    value: np.ndarray
    hint: str


@dataclass(eq=False)
class Unavailable:
    """A side output the IR does not produce (layer norm's mean, dropout's mask); an error only if used."""

    what: str


Value = Any  # str (runtime IR value) | Const


def need_module(module: str, extra: str, what: str):
    """Import an optional dependency or fail with the install line."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ModelError(f"{what} needs the {module!r} package ({e}); install it with: "
                         f"pip install 'planforge[{extra}]'") from None


def op_table() -> tuple[dict[str, Callable], Callable]:
    """An importer's op table and the decorator that fills it: ``@op("Relu")`` over a lowering."""
    table: dict[str, Callable] = {}

    def op(*names: str):
        def deco(fn: Callable) -> Callable:
            for n in names:
                table[n] = fn
            return fn
        return deco
    return table, op


def as_shape(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


class Emitter:
    """Builds a ``Graph`` op by op; ``where`` (set by the importer per source op) goes into every error."""

    def __init__(self, name: str):
        self.g = Graph(name, {}, {}, [], [])
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.op = "?"
        self.where = "?"
        self._params: dict[int, tuple[Const, str]] = {}
        self._transposed: dict[int, Const] = {}
        self._keep: list[Const] = []
        self.producer: dict[str, Node] = {}
        self.fallbacks: list[UnsupportedOp] = []   # ops lowered to fallback steps (ir.fallback), in order
        self.dtypes: dict[str, Any] = {}           # source element types by value name, where the importer knows them

    # -- bookkeeping ---------------------------------------------------------------------------------------------

    def at(self, op: str, where: str) -> None:
        self.op, self.where = op, where

    def unsupported(self, reason: str = "") -> UnsupportedOp:
        return UnsupportedOp(self.op, self.where, reason)

    def unique(self, name: str) -> str:
        base, i = name or "v", 1
        while name in self.shapes or not name:
            name = f"{base}.{i}"
            i += 1
        return name

    def input(self, name: str, shape: Sequence[int]) -> str:
        shape = as_shape(shape)
        name = self.unique(name)
        self.g.inputs[name] = shape
        self.shapes[name] = shape
        return name

    def param(self, c: Const) -> str:
        """The IR name of a constant used as a runtime operand (stored once, fp32)."""
        hit = self._params.get(id(c))
        if hit:
            return hit[1]
        if c.value.dtype.kind not in "fiub":
            raise self.unsupported(f"constant {c.hint!r} of dtype {c.value.dtype} is used as a tensor operand; "
                                   f"the IR computes in fp32 only")
        if c.value.dtype.kind != "f" and c.value.size and np.abs(c.value).max() > EXACT_INT:
            raise self.unsupported(f"integer constant {c.hint!r} holds values past {EXACT_INT}, which fp32 (how the "
                                   f"IR carries integers) does not hold exactly")
        name = self.unique(c.hint)
        self.g.params[name] = np.ascontiguousarray(c.value, dtype=np.float32)
        self.shapes[name] = tuple(c.value.shape)
        self._params[id(c)] = (c, name)      # keep c alive so its id stays unique
        return name

    def ref(self, v: Value) -> str:
        if isinstance(v, Const):
            return self.param(v)
        if isinstance(v, Unavailable):
            raise self.unsupported(f"uses {v.what}, which the IR does not compute")
        if not isinstance(v, str):
            raise self.unsupported(f"expects a tensor operand, got {type(v).__name__} {v!r}")
        return v

    def shape(self, v: Value) -> tuple[int, ...]:
        if isinstance(v, Const):
            return tuple(v.value.shape)
        return self.shapes[self.ref(v)]

    def node(self, op: str, inputs: Sequence[Value], name: str, **attrs) -> str:
        """Append ``name = op(*inputs, **attrs)``, checking it with the IR's shape rule."""
        ins = tuple(self.ref(v) for v in inputs)
        out = self.unique(name)
        n = Node(op, ins, out, attrs)
        try:
            shape = node_shape(n, self.shapes)
        except GraphError as e:
            raise GraphError(f"{self.op} at {self.where}: lowered to {e}") from None
        self.g.nodes.append(n)
        self.shapes[out] = shape
        self.producer[out] = n
        return out

    def finish(self, outputs: Sequence[Value]) -> Graph:
        self.g.outputs = [self.ref(v) for v in outputs]
        if not self.g.outputs:
            raise ModelError(f"graph {self.g.name!r} has no tensor outputs")
        self._drop_dead()
        self.g.shapes()          # the whole graph, checked once more by the validator itself
        return self.g

    def _drop_dead(self) -> None:
        """Drop nodes and params no output depends on (left behind by folded shape arithmetic and patterns)."""
        live = set(self.g.outputs)
        keep = []
        for n in reversed(self.g.nodes):
            if n.output in live:
                keep.append(n)
                live.update(n.inputs)
        self.g.nodes = keep[::-1]
        self.g.params = {k: v for k, v in self.g.params.items() if k in live}

    # -- lowerings -------------------------------------------------------------------------------------------------

    def axis(self, axis: int, rank: int) -> int:
        """``axis`` of a rank-``rank`` tensor made non-negative; an unsupported-op error when out of range."""
        return self._axis(axis, rank)

    def _axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < max(rank, 1):
            raise self.unsupported(f"axis {axis} is out of range for rank {rank}")
        return axis % max(rank, 1)

    def identity(self, x: Value) -> Value:
        return x

    def transpose(self, x: Value, perm: Sequence[int], name: str) -> Value:
        rank = len(self.shape(x))
        perm = tuple(self._axis(int(p), rank) for p in perm)
        if sorted(perm) != list(range(rank)):
            raise self.unsupported(f"{perm} is not a permutation of {rank} axes")
        if perm == tuple(range(rank)):
            return x
        if isinstance(x, Const):
            return Const(np.ascontiguousarray(np.transpose(x.value, perm)), x.hint)
        return self.node("transpose", [x], name, perm=perm)

    def transposed_weight(self, w: Value, name: str) -> Value:
        """``w`` with its last two axes swapped; a constant is transposed once however often it is used."""
        rank = len(self.shape(w))
        if rank < 2:
            raise self.unsupported(f"weight of shape {self.shape(w)} has fewer than 2 axes")
        perm = (*range(rank - 2), rank - 1, rank - 2)
        if isinstance(w, Const):
            if id(w) not in self._transposed:
                self._transposed[id(w)] = self.transpose(w, perm, name)
                self._keep.append(w)          # keep w alive while its id is a key
            return self._transposed[id(w)]
        return self.transpose(w, perm, name)

    def reshape(self, x: Value, shape: Sequence[int], name: str) -> Value:
        shape = as_shape(shape)
        src = self.shape(x)
        if math.prod(shape) != math.prod(src) or any(d < 1 for d in shape):
            raise self.unsupported(f"cannot reshape {src} into {shape}")
        if shape == src:
            return x
        if isinstance(x, Const):
            return Const(x.value.reshape(shape), x.hint)
        return self.node("reshape", [x], name, shape=shape)

    def scale(self, x: Value, factor: float, name: str) -> Value:
        factor = float(factor)
        if factor == 1.0:
            return x
        if isinstance(x, Const):
            return Const((x.value * factor).astype(x.value.dtype), x.hint)
        return self.node("scale", [x], name, factor=factor)

    def uniform(self, c: Any) -> float | None:
        """The single value of a scalar or a constant whose entries are all equal, else None."""
        if isinstance(c, (bool, int, float, np.number)):
            return float(c)
        if isinstance(c, Const) and c.value.size >= 1 and c.value.dtype.kind in "fiub":
            flat = c.value.reshape(-1)
            if np.all(flat == flat[0]):
                return float(flat[0])
        return None

    def const(self, value: np.ndarray, hint: str) -> "Const":
        """A value known at import time (it becomes a parameter named after ``hint`` where a node reads it)."""
        return Const(np.asarray(value), hint)

    def unavailable(self, what: str) -> "Unavailable":
        """A value the framework computes but the IR does not (an op's second output); using it is an error."""
        return Unavailable(what)

    def const_ints(self, v: Any, what: str) -> list[int]:
        """The integers of a value known at import time (a target shape, axes)."""
        if not isinstance(v, Const):
            raise self.unsupported(f"{what} is computed at run time; the IR needs it known at import time")
        return [int(d) for d in np.asarray(v.value).reshape(-1)]

    def _as_const(self, v: Any, name: str) -> Any:
        if isinstance(v, (bool, int, float, np.number)):
            return Const(np.asarray(v, dtype=np.float32), name + ".c")
        return v

    def mul(self, a: Value, b: Value, name: str) -> Value:
        a, b = self._as_const(a, name), self._as_const(b, name)
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(a.value * b.value, a.hint)
        if isinstance(a, Const):
            a, b = b, a
        k = self.uniform(b) if isinstance(b, Const) else None
        try:
            out = np.broadcast_shapes(self.shape(a), self.shape(b))
        except ValueError:
            raise self.unsupported(f"shapes {self.shape(a)} and {self.shape(b)} do not broadcast") from None
        if k is None or out != self.shape(a):
            return self.node("multiply", [a, b], name)     # elementwise, broadcast
        return self.scale(a, k, name)

    def div(self, a: Value, b: Value, name: str) -> Value:
        """``a / b``: a scale by a uniform constant divisor, else an elementwise (broadcast) ``divide``."""
        a, b = self._as_const(a, name), self._as_const(b, name)
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(a.value / b.value, a.hint)
        d = self.uniform(b) if isinstance(b, Const) else None
        if d is not None and d != 0 and np.broadcast_shapes(self.shape(a), self.shape(b)) == self.shape(a):
            return self.scale(a, 1.0 / d, name)
        return self.node("divide", [a, b], name)

    def add(self, a: Value, b: Value, name: str, alpha: float = 1.0) -> Value:
        """``a + alpha * b`` with numpy broadcasting where the IR can say it exactly."""
        a, b = self._as_const(a, name), self._as_const(b, name)
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(a.value + alpha * b.value, a.hint)
        if isinstance(a, Const):                      # c + alpha*x  ->  (alpha*x) + c
            return self.add(self.scale(b, alpha, name + ".scaled"), a, name)
        if isinstance(b, Const):
            sa, sb = self.shape(a), self.shape(b)
            try:
                out = np.broadcast_shapes(sa, sb)
            except ValueError:
                raise self.unsupported(f"shapes {sa} and {sb} do not broadcast") from None
            v = b.value.astype(np.float32) * np.float32(alpha)
            hint = b.hint if alpha == 1.0 else f"{b.hint}*{alpha:g}"
            if out != sa or not sa:       # the constant widens the tensor (or the tensor is 0-d): a plain add
                return self.node("add", [self.broadcast(a, out, name + ".a"), Const(
                    np.ascontiguousarray(np.broadcast_to(v, out)), hint)], name)
            n = sa[-1]
            if v.size == 1:
                return self.node("bias", [a, Const(np.full(n, v.reshape(-1)[0], np.float32), hint)], name)
            if v.ndim and math.prod(v.shape[:-1]) == 1 and v.shape[-1] == n:
                same = v.shape == (n,) and alpha == 1.0 and b.value.dtype.kind == "f"
                return self.node("bias", [a, b if same else Const(v.reshape(n), hint)], name)   # one param per b
            return self.node("add", [a, Const(np.ascontiguousarray(np.broadcast_to(v, sa)), hint)], name)
        if alpha != 1.0:
            b = self.scale(b, alpha, name + ".scaled")
        sa, sb = self.shape(a), self.shape(b)
        if sa != sb:
            try:
                out = np.broadcast_shapes(sa, sb)
            except ValueError:
                raise self.unsupported(f"shapes {sa} and {sb} do not broadcast") from None
            a, b = self.broadcast(a, out, name + ".a"), self.broadcast(b, out, name + ".b")
        return self.node("add", [a, b], name)

    def broadcast(self, x: Value, shape: Sequence[int], name: str) -> Value:
        """``x`` expanded to ``shape`` (numpy's rules; op ``expand``): how ``add`` meets operands of two shapes."""
        shape = as_shape(shape)
        if self.shape(x) == shape:
            return x
        if isinstance(x, Const):
            return Const(np.ascontiguousarray(np.broadcast_to(x.value, shape)), x.hint)
        return self.node("expand", [x], name, shape=shape)

    def matmul(self, a: Value, b: Value, name: str) -> Value:
        sa, sb = self.shape(a), self.shape(b)
        if len(sa) < 2 or len(sb) < 2:
            raise self.unsupported(f"matmul of {sa} and {sb}: the IR needs operands of rank >= 2")
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(a.value @ b.value, a.hint)
        if len(sb) > 2 and sa[:-2] != sb[:-2]:
            if isinstance(b, Const) and math.prod(sb[:-2]) == 1:
                b = self.reshape(b, sb[-2:], name + ".w")
            else:
                raise self.unsupported(f"matmul of {sa} and {sb} broadcasts batch dimensions; the IR needs equal "
                                       f"batch dimensions or a 2-D right operand")
        return self.node("matmul", [a, b], name)

    def concat(self, xs: Sequence[Value], axis: int, name: str) -> Value:
        if not xs:
            raise self.unsupported("concatenates no tensors")
        rank = len(self.shape(xs[0]))
        axis = self._axis(axis, rank)
        xs = [x for x in xs if self.shape(x)[axis:axis + 1] != (0,)]
        if len(xs) == 1:
            return xs[0]
        if all(isinstance(x, Const) for x in xs):
            return Const(np.concatenate([x.value for x in xs], axis=axis), xs[0].hint)
        return self.node("concat", list(xs), name, axis=axis)

    def check(self, v: Value, expected: Sequence[int] | None, what: str) -> None:
        """Compare a lowered value's shape with the framework's; a mismatch is an importer bug, said plainly."""
        if expected is None or isinstance(v, Unavailable):
            return
        got = self.shape(v)
        if tuple(got) != as_shape(expected):
            raise GraphError(f"{self.op} at {self.where}: planforge lowered {what} to shape {got}, the model says "
                             f"{as_shape(expected)}; this is a bug in planforge's importer, please report it")


def _first_lines(text: str, n: int = 6) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[:n]) + (" ..." if len(lines) > n else "")
