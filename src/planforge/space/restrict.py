"""Restrictions: constraint strings parsed into a safe expression tree.

A restriction such as ``"block_m * block_k * 4 <= l1_bytes"`` is parsed with
Python's parser (``ast.parse``, which only builds a syntax tree), checked
node by node against a whitelist, and turned into a tree of our own ``Expr``
nodes. The tree is then compiled into plain Python closures for speed. Nothing
is ever handed to ``eval`` or ``exec``.

Allowed: numbers, strings, booleans, names of the space's knobs and of its
constants, ``+ - * / // % **``, unary ``- + not``, comparisons (chained too),
``and``/``or``, ``x in (a, b, ...)``, ``a if cond else b`` and calls of
``min``, ``max`` and ``abs``. Anything else is a ``RestrictionError`` that
names the offending part.
"""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping

FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}

_BINOPS = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
    ast.Pow: ("**", operator.pow),
}
_CMPOPS = {
    ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le),
    ast.Gt: (">", operator.gt),
    ast.GtE: (">=", operator.ge),
    ast.Eq: ("==", operator.eq),
    ast.NotEq: ("!=", operator.ne),
    ast.In: ("in", lambda a, b: a in b),
    ast.NotIn: ("not in", lambda a, b: a not in b),
}
_UNARY = {
    ast.USub: ("-", operator.neg),
    ast.UAdd: ("+", operator.pos),
    ast.Not: ("not", operator.not_),
}


class RestrictionError(ValueError):
    """A restriction string that is not a safe, well-formed expression over the space."""


@dataclass(frozen=True)
class Expr:
    """One node of a parsed restriction: ``op`` with operands ``args``.

    ``op`` is ``"const"`` (args: value), ``"name"`` (args: name), ``"tuple"``,
    ``"call"`` (args: function name, *operands), ``"and"``, ``"or"``, ``"if"``,
    or an operator symbol (``"+"``, ``"<="``, ``"not"``, ...).
    """

    op: str
    args: tuple

    def names(self) -> frozenset[str]:
        if self.op == "name":
            return frozenset(self.args)
        out: frozenset[str] = frozenset()
        for a in self.args:
            if isinstance(a, Expr):
                out |= a.names()
        return out

    def __str__(self) -> str:
        if self.op == "const":
            return repr(self.args[0])
        if self.op == "name":
            return self.args[0]
        if self.op == "tuple":
            return "(" + ", ".join(map(str, self.args)) + ")"
        if self.op == "call":
            return f"{self.args[0]}(" + ", ".join(map(str, self.args[1:])) + ")"
        if self.op == "if":
            return f"({self.args[1]} if {self.args[0]} else {self.args[2]})"
        if len(self.args) == 1:
            return f"({self.op} {self.args[0]})"
        return "(" + f" {self.op} ".join(map(str, self.args)) + ")"


def _segment(src: str, node: ast.AST) -> str:
    return ast.get_source_segment(src, node) or type(node).__name__


def _fail(src: str, node: ast.AST, what: str) -> RestrictionError:
    return RestrictionError(f"restriction {src!r}: {what} ({_segment(src, node)!r})")


def _convert(src: str, node: ast.AST, known: frozenset[str] | None) -> Expr:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (bool, int, float, str)):
            return Expr("const", (node.value,))
        raise _fail(src, node, f"constant of type {type(node.value).__name__} is not allowed")
    if isinstance(node, ast.Name):
        if node.id in FUNCTIONS:
            raise _fail(src, node, f"function {node.id!r} can only be called")
        if node.id in ("True", "False"):
            return Expr("const", (node.id == "True",))
        if known is not None and node.id not in known:
            raise _fail(src, node, f"unknown name {node.id!r}; the space knows {', '.join(sorted(known)) or 'no names'}")
        return Expr("name", (node.id,))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return Expr(_BINOPS[type(node.op)][0], (_convert(src, node.left, known), _convert(src, node.right, known)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return Expr(_UNARY[type(node.op)][0], (_convert(src, node.operand, known),))
    if isinstance(node, ast.BoolOp):
        op = "and" if isinstance(node.op, ast.And) else "or"
        return Expr(op, tuple(_convert(src, v, known) for v in node.values))
    if isinstance(node, ast.Compare):
        parts = [_convert(src, node.left, known)]
        ops = []
        for op, right in zip(node.ops, node.comparators):
            if type(op) not in _CMPOPS:
                raise _fail(src, node, f"comparison {type(op).__name__} is not allowed")
            ops.append(_CMPOPS[type(op)][0])
            parts.append(_convert(src, right, known))
        # a < b < c  ->  (a < b) and (b < c)
        links = [Expr(o, (parts[i], parts[i + 1])) for i, o in enumerate(ops)]
        return links[0] if len(links) == 1 else Expr("and", tuple(links))
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return Expr("tuple", tuple(_convert(src, e, known) for e in node.elts))
    if isinstance(node, ast.IfExp):
        return Expr("if", (_convert(src, node.test, known), _convert(src, node.body, known), _convert(src, node.orelse, known)))
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise _fail(src, node, f"call of {_segment(src, node.func)!r} is not allowed; allowed functions: {', '.join(FUNCTIONS)}")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise _fail(src, node, "keyword or starred arguments are not allowed")
        if not node.args:
            raise _fail(src, node, f"{node.func.id}() needs arguments")
        return Expr("call", (node.func.id, *(_convert(src, a, known) for a in node.args)))
    if isinstance(node, ast.Attribute):
        raise _fail(src, node, "attribute access is not allowed")
    if isinstance(node, ast.Subscript):
        raise _fail(src, node, "subscripts are not allowed")
    raise _fail(src, node, f"{type(node).__name__} is not allowed")


def parse(src: str, known: frozenset[str] | set[str] | None = None) -> Expr:
    """Parse ``src`` into an ``Expr``; ``known`` (default: any name) lists the names it may use."""
    if not isinstance(src, str) or not src.strip():
        raise RestrictionError(f"restriction {src!r}: expected a non-empty expression string")
    if len(src) > 4096:
        raise RestrictionError(f"restriction of {len(src)} characters is too long (limit 4096)")
    try:
        tree = ast.parse(src.strip(), mode="eval")
    except SyntaxError as e:
        raise RestrictionError(f"restriction {src!r}: syntax error at column {e.offset}: {e.msg}") from None
    return _convert(src.strip(), tree.body, None if known is None else frozenset(known))


Env = Mapping[str, Any]


def compile_expr(e: Expr) -> Callable[[Env], Any]:
    """Turn an ``Expr`` into a closure ``f(env) -> value``; no ``eval`` involved."""
    op, args = e.op, e.args
    if op == "const":
        v = args[0]
        return lambda env: v
    if op == "name":
        n = args[0]
        return lambda env: env[n]
    if op == "tuple":
        fs = [compile_expr(a) for a in args]
        return lambda env: tuple(f(env) for f in fs)
    if op == "call":
        fn = FUNCTIONS[args[0]]
        fs = [compile_expr(a) for a in args[1:]]
        return lambda env: fn(*(f(env) for f in fs))
    if op == "and":
        fs = [compile_expr(a) for a in args]
        return lambda env: all(f(env) for f in fs)
    if op == "or":
        fs = [compile_expr(a) for a in args]
        return lambda env: any(f(env) for f in fs)
    if op == "if":
        c, a, b = (compile_expr(x) for x in args)
        return lambda env: a(env) if c(env) else b(env)
    table = {s: f for s, f in (*_BINOPS.values(), *_CMPOPS.values())}
    if len(args) == 1:
        fn = {s: f for s, f in _UNARY.values()}[op]
        a = compile_expr(args[0])
        return lambda env: fn(a(env))
    fn = table[op]
    if op == "**":
        a, b = compile_expr(args[0]), compile_expr(args[1])

        def power(env):
            x, y = a(env), b(env)
            if abs(y) > 64 or (isinstance(x, (int, float)) and abs(x) > 2**32 and y > 4):
                raise OverflowError("exponent too large in restriction")
            return x**y

        return power
    a, b = compile_expr(args[0]), compile_expr(args[1])
    return lambda env: fn(a(env), b(env))


@dataclass(frozen=True)
class Restriction:
    """A parsed, compiled restriction; call it with a name -> value mapping."""

    source: str
    expr: Expr
    names: frozenset[str]
    fn: Callable[[Env], Any]

    @classmethod
    def parse(cls, src: str, known: frozenset[str] | set[str] | None = None) -> "Restriction":
        e = parse(src, known)
        return cls(src.strip(), e, e.names(), compile_expr(e))

    def __call__(self, env: Env) -> bool:
        """True when ``env`` satisfies the restriction. Arithmetic errors (x/0) count as violated."""
        try:
            return bool(self.fn(env))
        except (ZeroDivisionError, OverflowError, ValueError, TypeError):
            return False

    def __str__(self) -> str:
        return self.source
