"""Fixed orders of the rule groups whose order matters, as destructive rewriters, and what each keeps.

The seeds' phase-ordering problem: the convolution rule groups (``ops.conv_fused.rule_groups``: ``fold``,
``fuse``, ``epilogue``, ``layout``) pre-empt one another when applied one after another with ``subsume``
(a rewrite removes the form it matched: fold first leaves nothing for the Conv+BN kernel to fuse). Such a
fixed order is a sequential rewriter: ``fixed_order`` runs it (each group to saturation, then the other ops'
rules of the same rule sets, then the lowering). The e-graph applies every group together and keeps every
form, so each fixed order's e-graph is a sub-e-graph of it: ``embed`` finds the e-nodes of the saturated
e-graph that a fixed order kept, which is "what the fixed order keeps" as a restriction on extraction, and
the extraction under it is the plan that fixed order would have started from. ``workloads.models`` seeds the
search with those plans, so the e-graph's search starts from every fixed order's plan.
"""
from __future__ import annotations

import time
from functools import lru_cache
from typing import Sequence

from egglog import EGraph, ruleset

from ..ir import Graph
from ..ops import REGISTRY
from ..ops.conv_fused import GROUPS, group_rules, rule_groups
from ..ops.egg import E, Vars
from .egraph import EClassGraph, Limits, _read, _size, encode
from .lang import rulesets as all_rulesets

ORDERS: dict[str, tuple[str, ...]] = {f"{g} first": (g, *[h for h in GROUPS if h != g]) for g in GROUPS}


@lru_cache(maxsize=1)
def _groups():
    """Each group's rules, subsuming (built once)."""
    return {k: ruleset(*rs) for k, rs in rule_groups(E, Vars(), subsume=True).items()}


@lru_cache(maxsize=8)
def _others(names: tuple[str, ...]):
    """The rules of ``names`` that are not in a group (every op's but the groups' own), or None for none."""
    v = Vars()
    rules = []
    for op in REGISTRY.values():
        if op.rules is not None and op.rules is not group_rules:
            for name, rs in op.rules(E, v).items():
                if name in names:
                    rules.extend(rs)
    return ruleset(*rules) if rules else None


def groups_fire(g: Graph, limits: Limits = Limits()) -> bool:
    """Whether any group's rule matches ``g`` at all (if none does, every fixed order is the plain e-graph and
    there is nothing to seed from): the groups alone, run once over the encoded graph, cheap for a graph with
    no convolution."""
    eg = EGraph()
    encode(g, eg)
    before = _size(eg)
    for name in GROUPS:
        eg.run(_groups()[name] * limits.iterations)
    return _size(eg) != before


def fixed_order(g: Graph, order: Sequence[str], rulesets: Sequence[str], limits: Limits = Limits()) -> EClassGraph:
    """``g``'s e-graph under the sequential rewriter ``order`` (group names from ``GROUPS``): each group to
    saturation (at most ``limits.iterations`` rounds) with subsuming rewrites, then the rest of ``rulesets``,
    then the lowering."""
    if not set(order) <= set(GROUPS):
        raise ValueError(f"unknown rule groups {sorted(set(order) - set(GROUPS))}; known: {', '.join(GROUPS)}")
    eg = EGraph()
    t0 = time.perf_counter()
    root = encode(g, eg)
    for name in order:
        eg.run(_groups()[name] * limits.iterations)
    others = _others(tuple(r for r in rulesets if r != "lowering"))
    if others is not None:
        eg.run(others * limits.iterations)
    eg.run(all_rulesets()["lowering"] * 1)
    out = _read(eg, root)
    out.stats = {"order": list(order), "nodes": out.n_nodes, "classes": len(out.classes),
                 "seconds": time.perf_counter() - t0, "stop": "sequential", "iterations": 0,
                 "rolled_back": False, "sizes": [], "rulesets": list(rulesets)}
    return out


def embed(full: EClassGraph, part: EClassGraph) -> set[str]:
    """The ids of ``full``'s e-nodes that are also e-nodes of ``part`` (same op, arguments and, recursively,
    children): ``part`` (a fixed order's e-graph) as a restriction of ``full`` (the saturated one). Matched
    bottom-up to a fixed point; an e-node of ``part`` that ``full`` lacks (``full`` stopped at a limit) is
    left out, and so is everything above it that has no other way in."""
    index = {(n.op, n.args, n.children): n for ns in full.classes.values() for n in ns}
    where: dict[str, set[str]] = {}  # part's class -> full's classes it matched
    kept: set[str] = set()
    todo = [n for ns in part.classes.values() for n in ns]
    while todo:
        left = []
        for n in todo:
            if not all(k in where for k in n.children):
                left.append(n)
                continue
            for kids in _products([sorted(where[k]) for k in n.children]):
                m = index.get((n.op, n.args, kids))
                if m is not None:
                    kept.add(m.id)
                    where.setdefault(n.eclass, set()).add(m.eclass)
        if len(left) == len(todo):
            break
        todo = left
    return kept


def _products(lists: list[list[str]], cap: int = 16) -> list[tuple[str, ...]]:
    """The tuples of one choice per list (at most ``cap``: a part class matches one full class, rarely two)."""
    out: list[tuple[str, ...]] = [()]
    for xs in lists:
        out = [(*t, x) for t in out for x in xs][:cap]
    return out


__all__ = ["ORDERS", "embed", "fixed_order", "groups_fire"]
