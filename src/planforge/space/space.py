"""Plan spaces: genes and knobs, restrictions, candidates and their fingerprints.

A ``Space`` is the cross product of its parameters (genes: e-class choices;
knobs: schedule values) cut down by restrictions. Points are addressed by a
tuple of value indices; the mixed-radix integer of that tuple addresses the
cross product, which lets the space sample and enumerate without building it.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

from .restrict import Restriction, RestrictionError

ENUMERATE_LIMIT = 5_000_000  # points of a cross product that ``valid_ints`` enumerates at most

Value = Any  # str | int | float | bool: anything JSON can hold exactly


class SpaceError(ValueError):
    """A space that cannot be built or used as asked."""


@dataclass(frozen=True)
class Knob:
    """One dimension of a space.

    ``kind`` is ``"gene"`` (an e-class choice), ``"categorical"``, ``"int"`` (a
    range with a step) or ``"pow2"``. Ordered kinds (int, pow2) have neighbours
    one step away; unordered kinds treat every other value as a neighbour.
    """

    name: str
    values: tuple[Value, ...]
    kind: str = "categorical"

    def __post_init__(self):
        if not self.name.isidentifier():
            raise SpaceError(f"knob name {self.name!r} must be an identifier")
        if not self.values:
            raise SpaceError(f"knob {self.name!r} has no values")
        if len(set(map(_canon_value, self.values))) != len(self.values):
            raise SpaceError(f"knob {self.name!r} repeats a value: {self.values}")
        for v in self.values:
            if not isinstance(v, (str, int, float, bool)):
                raise SpaceError(f"knob {self.name!r}: value {v!r} is not a str, int, float or bool")

    @property
    def ordered(self) -> bool:
        return self.kind in ("int", "pow2")

    def index(self, value: Value) -> int:
        try:
            return self.values.index(value)
        except ValueError:
            raise SpaceError(f"{value!r} is not a value of {self.name!r} (values: {self.values})") from None


def gene(name: str, choices: Sequence[Value]) -> Knob:
    """An e-class choice: which of ``choices`` (e-nodes, implementations) a plan takes."""
    return Knob(name, tuple(choices), "gene")


def categorical(name: str, values: Sequence[Value]) -> Knob:
    """An unordered knob (a loop order, a layout)."""
    return Knob(name, tuple(values), "categorical")


def int_range(name: str, lo: int, hi: int, step: int = 1) -> Knob:
    """Integers ``lo, lo+step, ..., <= hi``."""
    if step <= 0 or hi < lo:
        raise SpaceError(f"int_range {name!r}: need lo <= hi and step > 0, got {lo}, {hi}, {step}")
    return Knob(name, tuple(range(lo, hi + 1, step)), "int")


def pow2(name: str, lo: int, hi: int) -> Knob:
    """Powers of two from ``lo`` to ``hi`` inclusive (both powers of two)."""
    if lo < 1 or hi < lo or lo & (lo - 1) or hi & (hi - 1):
        raise SpaceError(f"pow2 {name!r}: need powers of two 1 <= lo <= hi, got {lo}, {hi}")
    vals, v = [], lo
    while v <= hi:
        vals.append(v)
        v *= 2
    return Knob(name, tuple(vals), "pow2")


def _canon_value(v: Value) -> str:
    return json.dumps(v)


def fingerprint_of(obj: Any) -> str:
    """Stable short hash of a JSON-able object (sorted keys, no whitespace)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Candidate:
    """One point of a space: ``config`` maps knob names to values, in space order."""

    config: tuple[tuple[str, Value], ...]
    index: tuple[int, ...]
    fingerprint: str

    def __getitem__(self, name: str) -> Value:
        for k, v in self.config:
            if k == name:
                return v
        raise KeyError(name)

    def as_dict(self) -> dict[str, Value]:
        return dict(self.config)

    def __str__(self) -> str:
        """Gene choices read best as a path (``cublaslt/fused/col/fp32``), numeric knobs as ``k=v``."""
        if all(isinstance(v, str) for _, v in self.config):
            return "/".join(v for _, v in self.config)
        return " ".join(f"{k}={v}" for k, v in self.config)


@dataclass
class Space:
    """A plan space: ``knobs`` (genes first, then schedule knobs) and ``restrictions``.

    Parameters:
        knobs: the dimensions, in a fixed order (enumeration follows it,
            ``itertools.product`` style: the last knob varies fastest).
        restrictions: expression strings (see ``planforge.space.restrict``)
            that every valid point satisfies.
        constants: extra names a restriction may use (``l1_bytes`` from the
            device profile, problem sizes); default none.
        canon: maps a config dict to the canonical form that is hashed into the
            fingerprint; default the config itself. The graph level passes the
            extracted program here, so two genomes that extract the same program
            share a fingerprint.
        active: maps a config to the names of the knobs that matter for it
            (default: all). The graph level passes the genes of the e-classes
            reachable under the current choices: mutating any other gene
            cannot change the plan, so mutation and neighbours skip them.
    """

    knobs: Sequence[Knob]
    restrictions: Sequence[str] = ()
    constants: Mapping[str, Value] = field(default_factory=dict)
    canon: Callable[[dict[str, Value]], Any] | None = None
    active: Callable[[dict[str, Value]], set[str]] | None = None

    def __post_init__(self):
        self.knobs = tuple(self.knobs)
        names = [k.name for k in self.knobs]
        if len(set(names)) != len(names):
            raise SpaceError(f"knob names repeat: {names}")
        clash = set(names) & set(self.constants)
        if clash:
            raise SpaceError(f"names used both as knobs and constants: {sorted(clash)}")
        self._pos = {n: i for i, n in enumerate(names)}
        known = frozenset(names) | frozenset(self.constants)
        self._rules = tuple(Restriction.parse(r, known) if isinstance(r, str) else r for r in self.restrictions)
        for r in self._rules:
            if not isinstance(r, Restriction):
                raise RestrictionError(f"restriction {r!r} is not a string")
        # check each rule as soon as the last knob it reads is fixed (depth-first pruning)
        self._rules_at: list[list[Restriction]] = [[] for _ in self.knobs]
        self._always: list[Restriction] = []
        for r in self._rules:
            used = [self._pos[n] for n in r.names if n in self._pos]
            (self._rules_at[max(used)] if used else self._always).append(r)
        self._radix = tuple(len(k.values) for k in self.knobs)
        self._valid: list[int] | None = None
        self._cands: dict[tuple[int, ...], Candidate] = {}

    # -- size ------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    @property
    def size(self) -> int:
        """Points in the cross product, before restrictions."""
        return math.prod(self._radix)

    def valid_size(self, limit: int = 5_000_000) -> int:
        """Points that satisfy every restriction (enumerated once, then cached).

        Raises ``SpaceError`` when the cross product exceeds ``limit``."""
        return len(self.valid_ints(limit))

    # -- conversion ------------------------------------------------------
    def _env(self, idx: Sequence[int]) -> dict[str, Value]:
        env = dict(self.constants)
        for k, i in zip(self.knobs, idx):
            env[k.name] = k.values[i]
        return env

    def to_int(self, idx: Sequence[int]) -> int:
        n = 0
        for i, r in zip(idx, self._radix):
            n = n * r + i
        return n

    def from_int(self, n: int) -> tuple[int, ...]:
        out = []
        for r in reversed(self._radix):
            n, i = divmod(n, r)
            out.append(i)
        return tuple(reversed(out))

    def is_valid_index(self, idx: Sequence[int]) -> bool:
        env = self._env(idx)
        return all(r(env) for r in self._rules)

    def violations(self, config: Mapping[str, Value]) -> list[str]:
        """The restrictions a config breaks (their source strings)."""
        env = {**self.constants, **config}
        return [r.source for r in self._rules if not r(env)]

    def candidate(self, idx: Sequence[int]) -> Candidate:
        idx = tuple(idx)
        c = self._cands.get(idx)
        if c is None:
            config = tuple((k.name, k.values[i]) for k, i in zip(self.knobs, idx))
            canon = dict(config) if self.canon is None else self.canon(dict(config))
            c = Candidate(config, idx, fingerprint_of(canon))
            if len(self._cands) < 1_000_000:
                self._cands[idx] = c
        return c

    def make(self, config: Mapping[str, Value]) -> Candidate:
        """The candidate of a full config; unknown or missing names are an error."""
        extra = set(config) - set(self._pos)
        missing = set(self._pos) - set(config)
        if extra or missing:
            raise SpaceError(f"config does not match the space: unknown {sorted(extra)}, missing {sorted(missing)}")
        return self.candidate(tuple(k.index(config[k.name]) for k in self.knobs))

    def is_valid(self, c: Candidate) -> bool:
        return self.is_valid_index(c.index)

    # -- enumeration -----------------------------------------------------
    def enumerate(self) -> Iterator[Candidate]:
        """Valid points in product order, lazily, pruning a prefix as soon as a rule fails."""
        for idx in self._enumerate_idx():
            yield self.candidate(idx)

    def _enumerate_idx(self) -> Iterator[tuple[int, ...]]:
        if not self.knobs or not all(r(dict(self.constants)) for r in self._always):
            return
        n = len(self.knobs)
        idx = [0] * n
        env = dict(self.constants)

        def ok(d: int) -> bool:
            return all(r(env) for r in self._rules_at[d])

        d = 0
        env[self.knobs[0].name] = self.knobs[0].values[0]
        while d >= 0:
            if ok(d):
                if d == n - 1:
                    yield tuple(idx)
                else:
                    d += 1
                    idx[d] = 0
                    env[self.knobs[d].name] = self.knobs[d].values[0]
                    continue
            # advance at depth d, backtracking past exhausted knobs
            while d >= 0:
                idx[d] += 1
                if idx[d] < self._radix[d]:
                    env[self.knobs[d].name] = self.knobs[d].values[idx[d]]
                    break
                d -= 1

    def valid_ints(self, limit: int | None = None) -> list[int]:
        limit = ENUMERATE_LIMIT if limit is None else limit
        if self._valid is None:
            if self.size > limit:
                raise SpaceError(f"space of {self.size} points is too large to enumerate (limit {limit})")
            self._valid = [self.to_int(idx) for idx in self._enumerate_idx()]
        return self._valid

    # -- sampling and moves ----------------------------------------------
    def sample(self, rng: random.Random, tries: int = 256) -> Candidate:
        """A point drawn among the valid ones.

        Rejection sampling on the cross product (exactly uniform); when the
        restrictions reject nearly everything, a draw from the enumerated valid
        set (uniform too), or, where the space is too large to enumerate, a
        random descent (valid, not exactly uniform)."""
        if self._valid is None:
            for _ in range(tries):
                idx = tuple(rng.randrange(r) for r in self._radix)
                if self.is_valid_index(idx):
                    return self.candidate(idx)
            if self.size > ENUMERATE_LIMIT:
                # a GEMM's space grows with the core count (its threads knob): 4.2 M points on 2 cores, where a few
                # shapes' restrictions reject 255 draws in a row 2% of the time, and 8.4 M on 4 cores, past the limit
                idx = self._descend(rng)
                if idx is None:
                    raise SpaceError("the space has no valid point: its restrictions exclude everything")
                return self.candidate(idx)
        valid = self.valid_ints()
        if not valid:
            raise SpaceError("the space has no valid point: its restrictions exclude everything")
        return self.candidate(self.from_int(valid[rng.randrange(len(valid))]))

    def _descend(self, rng: random.Random) -> tuple[int, ...] | None:
        """A valid point found depth first with each knob's values in random order, a prefix abandoned as soon as
        a rule over its knobs fails (``_enumerate_idx``'s pruning); None when there is none."""
        env = dict(self.constants)
        if not self.knobs or not all(r(env) for r in self._always):
            return None
        n = len(self.knobs)
        orders = [rng.sample(range(r), r) for r in self._radix[:1]]
        pos = [0]
        while orders:
            d = len(orders) - 1
            if pos[d] >= len(orders[d]):  # every value at this depth failed: back up one
                orders.pop()
                pos.pop()
                if pos:
                    pos[-1] += 1
                continue
            k = self.knobs[d]
            env[k.name] = k.values[orders[d][pos[d]]]
            if not all(r(env) for r in self._rules_at[d]):
                pos[d] += 1
            elif d == n - 1:
                return tuple(o[p] for o, p in zip(orders, pos))
            else:
                orders.append(rng.sample(range(self._radix[d + 1]), self._radix[d + 1]))
                pos.append(0)
        return None

    def _movable(self, c: Candidate) -> list[int]:
        live = None if self.active is None else self.active(c.as_dict())
        return [i for i, r in enumerate(self._radix) if r > 1 and (live is None or self.knobs[i].name in live)]

    def mutate(self, c: Candidate, rng: random.Random, genes: int = 1, tries: int = 64,
               which: Callable[[Knob], bool] | None = None) -> Candidate | None:
        """``c`` with ``genes`` randomly chosen knobs (among those that matter, and pass ``which`` when given) set
        to other values; valid, or None if none found."""
        movable = [i for i in self._movable(c) if which is None or which(self.knobs[i])]
        if not movable:
            return None
        for _ in range(tries):
            idx = list(c.index)
            for i in rng.sample(movable, min(genes, len(movable))):
                j = rng.randrange(self._radix[i] - 1)
                idx[i] = j if j < idx[i] else j + 1
            if self.is_valid_index(idx):
                return self.candidate(idx)
        return None

    def crossover(self, a: Candidate, b: Candidate, rng: random.Random, tries: int = 16) -> Candidate:
        """Uniform crossover of two parents; ``a`` when no valid child turns up."""
        for _ in range(tries):
            idx = tuple(x if rng.random() < 0.5 else y for x, y in zip(a.index, b.index))
            if self.is_valid_index(idx):
                return self.candidate(idx)
        return a

    def nearest_valid(self, config: Mapping[str, Value], max_changes: int = 2,
                      keep: Collection[str] = ()) -> Candidate | None:
        """The valid point closest to ``config`` (a full config, maybe breaking restrictions): fewest knobs
        changed (at most ``max_changes``, never those named in ``keep``), then the smallest moves along each
        knob's values; None when none is that close. A careful first setting that breaks this machine's
        restrictions is snapped, not dropped."""
        from itertools import combinations, product

        unknown = set(keep) - {k.name for k in self.knobs}
        if unknown:
            raise KeyError(f"keep names knobs this space does not have: {sorted(unknown)}")
        base = tuple(k.index(config[k.name]) for k in self.knobs)
        if self.is_valid_index(base):
            return self.candidate(base)
        movable = [i for i, k in enumerate(self.knobs) if k.name not in keep]
        for n in range(1, max_changes + 1):
            best = None
            for which in combinations(movable, n):
                choices = [[j for j in range(self._radix[i]) if j != base[i]] for i in which]
                for js in product(*choices):
                    idx = list(base)
                    for i, j in zip(which, js):
                        idx[i] = j
                    cost = sum(abs(j - base[i]) for i, j in zip(which, js))
                    if (best is None or cost < best[0]) and self.is_valid_index(idx):
                        best = (cost, tuple(idx))
            if best is not None:
                return self.candidate(best[1])
        return None

    def neighbours(self, c: Candidate) -> list[Candidate]:
        """Valid points one move away: the next value up or down for ordered
        knobs, any other value for unordered ones."""
        out = []
        movable = set(self._movable(c))
        for i, k in enumerate(self.knobs):
            if i not in movable:
                continue
            if k.ordered:
                steps = [j for j in (c.index[i] - 1, c.index[i] + 1) if 0 <= j < self._radix[i]]
            else:
                steps = [j for j in range(self._radix[i]) if j != c.index[i]]
            for j in steps:
                idx = c.index[:i] + (j,) + c.index[i + 1 :]
                if self.is_valid_index(idx):
                    out.append(self.candidate(idx))
        return out

    def describe(self) -> dict[str, Any]:
        """A JSON-able description (for specs and reports)."""
        return {
            "knobs": [{"name": k.name, "kind": k.kind, "values": list(k.values)} for k in self.knobs],
            "restrictions": [r.source for r in self._rules],
            "size": self.size,
        }
