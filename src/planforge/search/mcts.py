"""Monte Carlo tree search over the knob tree (UCT).

The tree fixes one knob per level, in the space's order (knobs with a single
value are skipped): a node is a prefix of value choices, a leaf a full
point. Each proposal walks down from the root, taking the child with the
best UCB1 score (mean reward + ``c`` * sqrt(ln N / n)) while every child
has been tried, expands an untried child at random, and completes the point
with a uniformly random unproposed valid completion (the rollout). The
measurement is then backed up along the path.

The reward of a measurement is its rank among everything measured so far
(1 for a new best, near 0 for the slowest); a failure rewards 0. Ranks keep
rewards in [0, 1] whatever the spread of the times.

Spaces small enough to enumerate know exactly which prefixes have valid
completions (the valid points of a prefix are a contiguous run of the sorted
valid list), so a subtree whose points have all been proposed is closed and
never visited again. Larger spaces complete a prefix by rejection sampling,
and close a node that yields nothing new after ``tries`` attempts.
"""
from __future__ import annotations

import bisect
import math
from typing import Sequence

from ..space import Candidate, Space, SpaceError
from .settings import Setting
from .strategies import Result, Strategy


class _Node:
    __slots__ = ("depth", "digits", "lo", "hi", "left", "n", "w", "children", "closed")

    def __init__(self, depth: int, digits: tuple[int, ...], lo: int, hi: int):
        self.depth = depth  # branching levels fixed
        self.digits = digits  # value indices of every knob up to the last fixed level
        self.lo, self.hi = lo, hi  # range in the sorted valid list (enumerable spaces)
        self.left = hi - lo  # unproposed valid points below
        self.n = 0
        self.w = 0.0
        self.children: dict[int, _Node] | None = None
        self.closed = False


class MCTS(Strategy):
    """UCT over the knob tree.

    Parameters:
        c: exploration constant of UCB1 (default 0.3; rewards are ranks in [0, 1]).
        tries: rollout attempts before a node of a non-enumerable space is
            closed (default 64).
        enumerate_limit: cross-product size up to which the space is enumerated
            (default 2e6).
    """

    name = "mcts"
    settings = (Setting("c", "float", 0.3, "UCB1 exploration constant (rewards are ranks in [0, 1])", low=0),
                Setting("tries", "int", 64, "rollout attempts before a node of a non-enumerable space is closed",
                        low=1),
                Setting("enumerate_limit", "int", 2_000_000, "cross-product size up to which the space is enumerated",
                        low=0))
    duplicate_limit = 1_000_000  # the tree never re-proposes; closing handles exhaustion

    def __init__(self, space: Space, seed: int = 0, c: float = 0.3, tries: int = 64,
                 enumerate_limit: int = 2_000_000, **kw):
        super().__init__(space, seed, **kw)
        self.c, self.tries = c, tries
        self._radix = [len(k.values) for k in space.knobs]
        self._levels = [i for i, r in enumerate(self._radix) if r > 1]
        self._valid: list[int] | None = None
        if space.size <= enumerate_limit:
            try:
                self._valid = list(space.valid_ints())
            except SpaceError:
                self._valid = None
        hi = len(self._valid) if self._valid is not None else 0
        self.root = _Node(0, (), 0, hi)
        if self._valid is not None and not self._valid:
            self.root.closed = True
        self._paths: dict[str, list[_Node]] = {}
        self._proposed_ints: set[int] = set()
        self._times: list[float] = []  # sorted measured metrics

    # -- tree helpers ------------------------------------------------------------
    def _stride(self, knob: int) -> int:
        return math.prod(self._radix[knob + 1:])

    def _prefix_int(self, digits: tuple[int, ...]) -> int:
        n = 0
        for d, r in zip(digits, self._radix):
            n = n * r + d
        return n

    def _children(self, node: _Node) -> dict[int, _Node]:
        if node.children is None:
            node.children = {}
            if node.depth < len(self._levels):
                knob = self._levels[node.depth]
                base = node.digits + (0,) * (knob - len(node.digits))  # singleton knobs in between take value 0
                stride = self._stride(knob)
                for v in range(self._radix[knob]):
                    digits = base + (v,)
                    if self._valid is not None:
                        start = self._prefix_int(digits) * stride
                        lo = bisect.bisect_left(self._valid, start, node.lo, node.hi)
                        hi = bisect.bisect_left(self._valid, start + stride, lo, node.hi)
                        if hi > lo:
                            node.children[v] = _Node(node.depth + 1, digits, lo, hi)
                    else:
                        node.children[v] = _Node(node.depth + 1, digits, 0, 0)
        return node.children

    def _ucb(self, parent: _Node, child: _Node) -> float:
        return child.w / child.n + self.c * math.sqrt(math.log(parent.n) / child.n)

    def _rollout(self, node: _Node) -> Candidate | None:
        """A random unproposed valid point below ``node``."""
        if self._valid is not None:
            for _ in range(16):
                n = self._valid[self.rng.randrange(node.lo, node.hi)]
                if n not in self._proposed_ints:
                    return self.space.candidate(self.space.from_int(n))
            start = self.rng.randrange(node.lo, node.hi)
            for i in range(node.hi - node.lo):
                n = self._valid[node.lo + (start - node.lo + i) % (node.hi - node.lo)]
                if n not in self._proposed_ints:
                    return self.space.candidate(self.space.from_int(n))
            return None
        fixed = len(node.digits)
        for _ in range(self.tries):
            idx = node.digits + tuple(self.rng.randrange(r) for r in self._radix[fixed:])
            if self.space.is_valid_index(idx):
                c = self.space.candidate(idx)
                if c.fingerprint not in self.proposed:
                    return c
        return None

    def _close(self, path: list[_Node]) -> None:
        """Close the nodes of ``path``, deepest first, that have nothing left to propose."""
        for node in reversed(path):
            if self._valid is not None:
                done = node.left <= 0  # exact: the count of unproposed valid points below
            else:
                kids = node.children
                done = node.closed or (bool(kids) and all(k.closed for k in kids.values()))
            if not done:
                break
            node.closed = True

    def _propose(self) -> Candidate | None:
        while not self.root.closed:
            path = [self.root]
            node = self.root
            while node.depth < len(self._levels):
                kids = [k for k in self._children(node).values() if not k.closed]
                if not kids:
                    node.closed = True
                    break
                fresh = [k for k in kids if k.n == 0]
                if fresh:  # expansion: an untried child, chosen at random
                    node = self.rng.choice(fresh)
                    path.append(node)
                    break
                parent = node
                node = max(kids, key=lambda k: (self._ucb(parent, k), self.rng.random()))
                path.append(node)
            c = None if node.closed else self._rollout(node)
            if c is None:
                node.closed = True
                self._close(path)
                continue
            self._proposed_ints.add(self.space.to_int(c.index))
            # back up along the leaf's whole path, so deeper statistics accumulate too
            leaf_path = self._descend(path, c)
            for x in leaf_path:
                x.left -= 1
                x.n += 1  # a virtual visit now; its reward arrives with the measurement
            leaf_path[-1].closed = True  # a leaf is one point
            self._close(leaf_path)
            self._paths[c.fingerprint] = leaf_path
            return c
        self._stop("space exhausted")
        return None

    def _descend(self, path: list[_Node], c: Candidate) -> list[_Node]:
        """``path`` extended to the leaf of ``c`` (creating the nodes on the way)."""
        out = list(path)
        node = path[-1]
        while node.depth < len(self._levels):
            v = c.index[self._levels[node.depth]]
            node = self._children(node)[v]
            out.append(node)
        return out

    def _reward(self, metric: float | None) -> float:
        if metric is None:
            return 0.0
        pos = bisect.bisect_left(self._times, metric)
        bisect.insort(self._times, metric)
        return 1.0 - pos / len(self._times)

    def ask(self, n: int = 1) -> list[Candidate]:
        return self._fill(n, self._propose)

    def tell(self, results: Sequence[Result]) -> None:
        for c, o in results:
            path = self._paths.pop(c.fingerprint, None)
            if path is None:
                continue
            r = self._reward(o.metric if o.ok else None)
            for x in path:
                x.w += r
        super().tell(results)

    def describe(self) -> dict:
        return {**super().describe(), "c": self.c}
