"""The IR as an egglog language: the sorts and constructors every op's e-nodes are made of.

Two layers of e-nodes, both generic over the op registry:
- semantic e-nodes ``op1..3(kind, attr, ...)``: what is computed (``kind`` is
  the op's name, ``attr`` its attributes as a string); they cannot run;
- implementation e-nodes ``lib1..3`` (a library call; ``kind`` may name a
  library variant such as ``matmul_bcast``), ``tmpl1..3`` (a compiled
  template) and ``fused_mlp``: how. A plan picks one per e-class it needs.
``E(kind, *args, attr=...)`` builds a semantic e-node of the right arity, so
an op module writes its rules as ``E("bias", E("matmul", x, w), b)``.
"""
from __future__ import annotations

from egglog import Expr, String, StringLike, function, var, vars_


class T(Expr):
    """A tensor value."""

    @classmethod
    def input(cls, name: StringLike) -> T: ...

    @classmethod
    def param(cls, name: StringLike) -> T: ...

    @classmethod
    def param_t(cls, name: StringLike) -> T:
        """The parameter stored transposed (column-major); ``transpose(param_t(n), "1,0") == param(n)``."""

    def pair(self, y: T) -> T:
        """Groups several graph outputs under one root."""


class Layers(Expr):
    """The layers of a fused batch-1 MLP, first to last."""

    @classmethod
    def one(cls, w: T, b: T, act: StringLike) -> Layers: ...

    def then(self, w: T, b: T, act: StringLike) -> Layers: ...


@function
def op1(kind: StringLike, attr: StringLike, a: T) -> T: ...


@function
def op2(kind: StringLike, attr: StringLike, a: T, b: T) -> T: ...


@function
def op3(kind: StringLike, attr: StringLike, a: T, b: T, c: T) -> T: ...


@function
def mlp(x: T, layers: Layers) -> T:
    """Consecutive linear layers applied to a single row."""


@function
def output(x: T) -> T:
    """Marks the graph's result, so the root e-class can be found after saturation."""


@function
def lib1(kind: StringLike, attr: StringLike, a: T) -> T: ...


@function
def lib2(kind: StringLike, attr: StringLike, a: T, b: T) -> T: ...


@function
def lib3(kind: StringLike, attr: StringLike, a: T, b: T, c: T) -> T: ...


@function
def tmpl1(kind: StringLike, attr: StringLike, a: T) -> T: ...


@function
def tmpl2(kind: StringLike, attr: StringLike, a: T, b: T) -> T: ...


@function
def tmpl3(kind: StringLike, attr: StringLike, a: T, b: T, c: T) -> T: ...


@function
def fused_mlp(x: T, layers: Layers) -> T: ...


SEMANTIC = {1: op1, 2: op2, 3: op3}
LIBRARY = {1: lib1, 2: lib2, 3: lib3}
TEMPLATE = {1: tmpl1, 2: tmpl2, 3: tmpl3}
MAX_ARITY = 3


def E(kind: str, *args: T, attr: StringLike = "") -> T:
    """The semantic e-node ``kind(*args)`` with attribute string ``attr``."""
    if len(args) not in SEMANTIC:
        raise ValueError(f"e-graph op {kind!r} with {len(args)} operands: e-nodes take 1 to {MAX_ARITY}")
    return SEMANTIC[len(args)](kind, attr, *args)


class Vars:
    """Pattern variables for rules: tensors ``x y w b g w2 b2``, strings ``s s2``, a layer list ``L``."""

    def __init__(self):
        self.x, self.y, self.w, self.b, self.g, self.w2, self.b2 = vars_("x y w b g w2 b2", T)
        self.s, self.s2 = var("s", String), var("s2", String)
        self.L = var("L", Layers)
        self.xs = tuple(vars_("a0 a1 a2", T))


__all__ = ["E", "LIBRARY", "Layers", "MAX_ARITY", "SEMANTIC", "T", "TEMPLATE", "Vars", "fused_mlp", "lib1", "lib2",
           "lib3", "mlp", "op1", "op2", "op3", "output", "tmpl1", "tmpl2", "tmpl3"]
