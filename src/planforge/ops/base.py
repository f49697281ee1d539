"""What planforge knows about one operation, as one ``Op`` value.

Every stage that needs a fact about an op reads it here: the IR's validator
(``shape``), the fp64 reference interpreter (``reference``), the e-graph
encoder and rule sets (``egg_attr``/``from_egg``, ``encode``, ``rules``), the
analysis and the analytic estimates (``flops``, ``passes``), the runnable
plan (``library``: bound numpy steps), the importers (``torch``, ``onnx``)
and the CPU templates (``kernel``: which template problem implements a node;
``epilogue``: C for elementwise epilogues). An op is one module in
``planforge.ops`` whose ``OPS`` lists its ``Op`` values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

Shape = tuple[int, ...]
Attrs = Mapping[str, Any]


class ShapeError(ValueError):
    """Operands whose shapes or attributes an op cannot take (the caller adds where)."""


def need(cond: bool, msg: str) -> None:
    if not cond:
        raise ShapeError(msg)


def ints(s: str) -> tuple[int, ...]:
    """``"1,0,2"`` -> (1, 0, 2); ``""`` -> ()."""
    return tuple(int(x) for x in s.split(",") if x != "")


EXACT_INT = 2 ** 24   # float32 holds every integer of at most this magnitude exactly (how the IR carries integers)


def broadcast_shape(shapes: Sequence[Shape], attrs: Attrs = {}) -> Shape:
    """numpy's broadcast of all operands' shapes; ``ShapeError`` when they do not broadcast."""
    try:
        return tuple(np.broadcast_shapes(*(tuple(s) for s in shapes)))
    except ValueError:
        raise ShapeError(f"shapes {', '.join(map(str, shapes))} do not broadcast") from None


def operand(em: "Emitter", v: Any, hint: str) -> Any:
    """A framework scalar (a Python number) as a 0-d fp32 constant; anything else as it is."""
    if isinstance(v, (bool, int, float, np.number)):
        return em.const(np.asarray(v, dtype=np.float32), hint)
    return v


def torch_out_shape(node) -> Shape:
    """The output shape torch.export recorded for an FX node (its first output for a tuple)."""
    val = node.meta["val"]
    val = val[0] if isinstance(val, (tuple, list)) else val
    return tuple(int(d) for d in val.shape)


def keep_shape(shapes: Sequence[Shape], attrs: Attrs) -> Shape:
    """Elementwise and row-wise ops: the output has the first operand's shape."""
    return tuple(shapes[0])


def elementwise_flops(per: float) -> Callable[[Sequence[Shape], Shape, Attrs], float]:
    return lambda shapes, out, attrs: per * math.prod(out)


class Emitter(Protocol):
    """What an op's importer mapping (``Op.torch``, ``Op.onnx``) may call: the importers' ``ir.frontend.Emitter``.

    Values are runtime IR value names or constants known at import time; every
    lowering helper folds constants itself and checks shapes with the ops'
    rules, and ``unsupported(reason)`` is the error to raise (it names the
    framework op and where it sits)."""

    def shape(self, v: Any) -> Shape: ...

    def node(self, op: str, inputs: Sequence[Any], name: str, **attrs) -> str: ...

    def unsupported(self, reason: str = "") -> Exception: ...

    def unavailable(self, what: str) -> Any: ...

    def const(self, value: np.ndarray, hint: str) -> Any: ...

    def const_ints(self, v: Any, what: str) -> list[int]: ...

    def uniform(self, c: Any) -> float | None: ...

    def axis(self, axis: int, rank: int) -> int: ...

    def add(self, a: Any, b: Any, name: str, alpha: float = 1.0) -> Any: ...

    def mul(self, a: Any, b: Any, name: str) -> Any: ...

    def scale(self, x: Any, factor: float, name: str) -> Any: ...

    def div(self, a: Any, b: Any, name: str) -> Any: ...

    def broadcast(self, x: Any, shape: Sequence[int], name: str) -> Any: ...

    def matmul(self, a: Any, b: Any, name: str) -> Any: ...

    def transpose(self, x: Any, perm: Sequence[int], name: str) -> Any: ...

    def transposed_weight(self, w: Any, name: str) -> Any: ...

    def reshape(self, x: Any, shape: Sequence[int], name: str) -> Any: ...

    def concat(self, xs: Sequence[Any], axis: int, name: str) -> Any: ...


@dataclass(frozen=True)
class Epilogue:
    """An op a compiled elementwise kernel can apply to a value ``v`` in registers.

    ``vec`` and ``scalar`` are C statements updating ``v`` (a ``vf`` vector of
    ``V`` floats, resp. a float); an operand (``operand``: ``"bias"``, a
    vector of the row's width, or ``"residual"``, a tensor of the output's
    shape) is read through ``LD(p)`` from the pointer ``p`` the template
    names (``bias + c``, ``res + c``). ``attr``: the e-graph attribute the
    code implements (GELU's template computes the tanh form only).
    ``flops``: per element, for the analytic model. ``torch``: the same step
    on torch tensors (``f(v, operand) -> tensor``), for the torch baseline."""

    vec: str
    scalar: str
    flops: float = 1.0
    operand: str = ""
    attr: str = ""
    torch: Callable[[Any, Any], Any] | None = None


@dataclass(frozen=True)
class Library:
    """One library (numpy) implementation of an op: ``step(ins, out, attrs)``
    returns a bound call writing into ``out``; ``workspace(shapes)`` the
    bytes it materialises besides its output; ``passes`` how many numpy calls
    it makes, or ``passes(attrs)`` (each pays the call overhead; the analytic estimate counts them);
    ``extra_flops`` multiplies its FLOPs (a broadcast product does more work)."""

    step: Callable[[list[np.ndarray], np.ndarray, Attrs], Callable[[], None]]
    workspace: Callable[[Sequence[Shape]], int] | None = None
    passes: int | Callable[[Attrs], int] = 1
    extra_flops: float = 1.0


def ufunc_step(f: Callable, *consts) -> Callable[[list[np.ndarray], np.ndarray, Attrs], Callable[[], None]]:
    """A library step ``f(*ins, *consts, out=out)`` for a numpy ufunc."""
    def step(ins, out, attrs):
        args = (*ins, *consts)
        return lambda: f(*args, out=out)
    return step


@dataclass(frozen=True)
class Op:
    """One operation of the IR (or of the e-graph only, ``internal``).

    Parameters:
        name: the IR name (``Node.op``) and the e-graph kind.
        arity: number of inputs, or a (min, max) range (max None: any).
        shape: ``shape(input_shapes, attrs) -> output shape``; raises ``ShapeError``.
        reference: ``reference(inputs, attrs) -> array``: the numpy semantics in
            the inputs' dtype (fp64 gives the reference).
        library: library implementations by name (the op's own name first);
            empty for views and internal markers with nothing to run.
        egg_attr: IR attributes -> the e-graph's attribute string (default "").
        from_egg: the e-graph's attribute string -> IR attributes (default {}).
        encode: ``encode(E, args, attrs) -> e-graph expression``, when the op is
            not simply ``E(name, *args, attr=egg_attr(attrs))`` (default None).
        rules: extra egglog rewrites per rule set name (``epilogue``,
            ``algebra``, ``layout``, ``mlp_fusion``), built on first use by
            ``rules(E, v)`` (``E`` makes op e-nodes, ``v`` holds pattern variables).
        templated: the op has a compiled-template e-node (``kernel`` says, per
            node, which template problem runs it, or None when none can).
        kernel: ``kernel(input_shapes, out_shape, attrs) -> Problem | None``.
        epilogue: how an elementwise template applies the op (None: it cannot).
        flops: ``flops(input_shapes, out_shape, attrs)`` (default 1 per output element).
        roofline: the analysis estimates the op by its own ``flops`` and its operands' bytes (a convolution),
            not by the per-element default (default False).
        layout_bytes: for a ``roofline`` op, the bytes it moves in passes of its own beyond reading its operands and
            writing its output (an NCHW convolution's NHWC copy of its output, written back transposed), which
            the analysis adds to its estimate at stream bandwidth (default None: none).
        view: no work at run time (a reshape is a view of its input).
        torch: ATen overload packet name -> ``lower(em, node, args, kwargs)`` (``em``: an ``Emitter``).
        onnx: ONNX op type -> ``lower(em, node, inputs, attrs, opset)``.
        tolerance_terms: how many accumulation terms the op adds to a plan's
            error bound (``tolerance_terms(input_shapes)``; default none).
        internal: appears only in the e-graph (from a rewrite), never in an IR graph.
        index_bound: for an op whose later inputs index into its first (gather), ``index_bound(table_shape,
            attrs)``: how many index values are valid (random example inputs draw from them; default None).
        doc: one line for error messages and docs.
    """

    name: str
    arity: int | tuple[int, int | None]
    shape: Callable[[Sequence[Shape], Attrs], Shape]
    reference: Callable[[Sequence[np.ndarray], Attrs], np.ndarray]
    library: Mapping[str, Library] = field(default_factory=dict)
    egg_attr: Callable[[Attrs], str] = lambda attrs: ""
    from_egg: Callable[[str], dict[str, Any]] = lambda s: {}
    encode: Callable | None = None
    rules: Callable[[Any, Any], Mapping[str, list]] | None = None
    templated: bool = False
    kernel: Callable[[Sequence[Shape], Shape, Attrs], Any] | None = None
    epilogue: Epilogue | None = None
    flops: Callable[[Sequence[Shape], Shape, Attrs], float] = elementwise_flops(1.0)
    roofline: bool = False
    layout_bytes: Callable[[Sequence[Shape], Shape, Attrs], float] | None = None
    view: bool = False
    torch: Mapping[str, Callable] = field(default_factory=dict)
    onnx: Mapping[str, Callable] = field(default_factory=dict)
    tolerance_terms: Callable[[Sequence[Shape]], int] | None = None
    internal: bool = False
    index_bound: Callable[[Shape, Attrs], int] | None = None
    doc: str = ""

    def check_arity(self, n: int) -> str | None:
        """Why ``n`` inputs do not fit, or None."""
        if isinstance(self.arity, int):
            return None if n == self.arity else f"{self.name} takes {self.arity} inputs, got {n}"
        lo, hi = self.arity
        if n < lo or (hi is not None and n > hi):
            want = f"{lo} to {hi}" if hi is not None else f"at least {lo}"
            return f"{self.name} takes {want} inputs, got {n}"
        return None

    def act_name(self, attr: str) -> str | None:
        """The name a fused GEMM epilogue knows this op by (``relu``, ``gelu:tanh``), or None."""
        ep = self.epilogue
        if ep is None or ep.operand or attr != ep.attr:
            return None
        return f"{self.name}:{attr}" if attr else self.name
