"""Spaces as numpy columns: every knob's value per point, for models that score whole spaces.

``valid_points(space)`` finds the valid points of a space without building a
``Candidate`` per point: it walks the cross product in chunks of mixed-radix
integers and evaluates each restriction's parsed tree (the same ``Expr`` the
space checks one point at a time) on numpy arrays. Arithmetic that would raise
for one point (division by zero, overflow) marks that point invalid, as
``Restriction.__call__`` does. A space that decides validity some other way
(a subclass with its own ``is_valid_index``, such as a recorded space) is
enumerated the ordinary way instead.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..space import Candidate, Space
from ..space.restrict import Expr, Restriction

CHUNK = 1 << 19


class Unvectorisable(Exception):
    """A restriction uses something the numpy evaluator does not cover."""


def _array(values: Sequence[Any]) -> np.ndarray:
    if all(isinstance(v, bool) for v in values) or not all(isinstance(v, (int, float)) for v in values):
        return np.array(values, dtype=object)
    return np.array(values, dtype=float if any(isinstance(v, float) for v in values) else np.int64)


def value_arrays(space: Space) -> dict[str, np.ndarray]:
    """Per knob, its values as an array (object dtype for strings and booleans)."""
    return {k.name: _array(k.values) for k in space.knobs}


def index_columns(space: Space, idx: np.ndarray) -> dict[str, np.ndarray]:
    """Knob values of the points whose value indices are the rows of ``idx``."""
    vals = value_arrays(space)
    return {k.name: vals[k.name][idx[:, i]] for i, k in enumerate(space.knobs)}


def columns(space: Space, candidates: Sequence[Candidate]) -> dict[str, np.ndarray]:
    """Knob values of ``candidates`` as columns."""
    idx = np.array([c.index for c in candidates], dtype=np.int64).reshape(len(candidates), len(space.knobs))
    return index_columns(space, idx)


def shape_columns(space: Space, candidates: Sequence[Candidate], dims: Sequence[int]) -> np.ndarray:
    """Shape features of ``candidates`` at the problem sizes ``dims`` (rows): log2 of each size, then for
    each tile-like knob (integer values, at least 1, more than two of them) the log2 of its tile count
    along each size, ceil(size / value): 0 once one tile covers the size. Which knob tiles which size is
    the template's business; a learned model finds the pairs that matter."""
    n = len(candidates)
    out = [np.full(n, math.log2(max(int(d), 1))) for d in dims]
    if n:
        cols = columns(space, candidates)
        for k in space.knobs:
            v = cols[k.name]
            if v.dtype.kind != "i" or len(k.values) <= 2 or min(k.values) < 1:
                continue
            out += [np.log2(np.ceil(max(int(d), 1) / v)) for d in dims]
    return np.column_stack(out) if out else np.zeros((n, 0))


def _eval(e: Expr, env: Mapping[str, Any], bad: list[np.ndarray]) -> Any:
    op, a = e.op, e.args
    if op == "const":
        return a[0]
    if op == "name":
        return env[a[0]]
    if op == "tuple":
        return tuple(_eval(x, env, bad) for x in a)
    if op == "and":
        out = True
        for x in a:
            out = np.logical_and(out, _eval(x, env, bad))
        return out
    if op == "or":
        out = False
        for x in a:
            out = np.logical_or(out, _eval(x, env, bad))
        return out
    if op == "if":
        return np.where(_eval(a[0], env, bad), _eval(a[1], env, bad), _eval(a[2], env, bad))
    if op == "call":
        args = [_eval(x, env, bad) for x in a[1:]]
        if a[0] == "abs" and len(args) == 1:
            return np.abs(args[0])
        if a[0] in ("min", "max") and len(args) >= 2:
            f = np.minimum if a[0] == "min" else np.maximum
            out = args[0]
            for x in args[1:]:
                out = f(out, x)
            return out
        raise Unvectorisable(f"call {a[0]} with {len(args)} argument(s)")
    if len(a) == 1:
        x = _eval(a[0], env, bad)
        if op == "not":
            return np.logical_not(x)
        return -x if op == "-" else x
    x, y = _eval(a[0], env, bad), _eval(a[1], env, bad)
    if op in ("in", "not in"):
        if not isinstance(y, tuple):
            raise Unvectorisable("'in' over something other than a literal tuple")
        hit = np.isin(np.asarray(x, dtype=object), np.array(y, dtype=object))
        return hit if op == "in" else np.logical_not(hit)
    if op in ("/", "//", "%"):
        zero = np.asarray(y) == 0
        bad.append(zero)
        y = np.where(zero, 1, y)
    if op == "**":
        raise Unvectorisable("powers")
    fn = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide, "//": np.floor_divide,
          "%": np.mod, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
          "==": np.equal, "!=": np.not_equal}.get(op)
    if fn is None:
        raise Unvectorisable(f"operator {op}")
    return fn(x, y)


def _mask(rules: Sequence[Expr], env: Mapping[str, Any], n: int) -> np.ndarray:
    ok = np.ones(n, dtype=bool)
    with np.errstate(all="ignore"):
        for r in rules:
            bad: list[np.ndarray] = []
            v = np.broadcast_to(np.asarray(_eval(r, env, bad), dtype=bool), (n,))
            ok &= v
            for b in bad:
                ok &= ~np.broadcast_to(b, (n,))
    return ok


def valid_points(space: Space, limit: int = 20_000_000) -> np.ndarray:
    """Value-index rows (``n x knobs``, int64) of every valid point, in enumeration order.

    Raises ``ValueError`` when the cross product exceeds ``limit`` points."""
    d = len(space.knobs)
    radix = np.array([len(k.values) for k in space.knobs], dtype=np.int64)
    custom = type(space).is_valid_index is not Space.is_valid_index or type(space).enumerate is not Space.enumerate
    if custom or d == 0:
        ints = space.valid_ints()
        return _unravel(np.asarray(ints, dtype=np.int64), radix)
    if space.size > limit:
        raise ValueError(f"space of {space.size} points is too large to score whole (limit {limit})")
    try:
        rules = [Restriction.parse(src).expr for src in space.describe()["restrictions"]]
        vals = value_arrays(space)
        out = []
        for start in range(0, space.size, CHUNK):
            ints = np.arange(start, min(space.size, start + CHUNK), dtype=np.int64)
            idx = _unravel(ints, radix)
            env = dict(space.constants)
            env.update({k.name: vals[k.name][idx[:, i]] for i, k in enumerate(space.knobs)})
            out.append(idx[_mask(rules, env, len(ints))])
        return np.concatenate(out) if out else np.zeros((0, d), dtype=np.int64)
    except Unvectorisable:
        return _unravel(np.asarray(space.valid_ints(limit), dtype=np.int64), radix)


def _unravel(ints: np.ndarray, radix: np.ndarray) -> np.ndarray:
    idx = np.empty((len(ints), len(radix)), dtype=np.int64)
    n = ints.copy()
    for i in range(len(radix) - 1, -1, -1):
        idx[:, i] = n % radix[i]
        n //= radix[i]
    return idx


def ravel(idx: np.ndarray, space: Space) -> np.ndarray:
    """Mixed-radix integers of value-index rows (``Space.to_int`` for many points)."""
    n = np.zeros(len(idx), dtype=np.int64)
    for i, k in enumerate(space.knobs):
        n = n * len(k.values) + idx[:, i]
    return n
