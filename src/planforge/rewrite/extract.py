"""Extraction: choose one e-node per needed e-class.

``greedy`` is the greedy-DAG extractor (a node's cost counts each class of its
sub-DAG once); ``ilp`` solves the exact problem with scipy's ``milp`` (HiGHS):
binary choice per node, a chosen node needs a chosen node in each child class,
the root needs one, and order variables per class forbid cycles. It has a time
limit and falls back to greedy, and it never returns a plan worse than greedy
on the same costs. ``prune_memory`` removes e-nodes whose output (plus
workspace) exceeds a memory budget, cascading to nodes that depended on them.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .egraph import EClassGraph

Choice = dict[str, str]  # class id -> node id


class ExtractionError(ValueError):
    """No plan can be extracted (e.g. every way to compute the root was pruned)."""


class CycleError(ExtractionError):
    """The chosen nodes form a cycle; ``path`` holds the classes being expanded when it closed."""

    def __init__(self, cls: str, path: list[str]):
        super().__init__(f"cycle through e-class {cls}")
        self.path = path


def usable(eg: EClassGraph, allowed: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """Allowed nodes whose children all still have an allowed node, to a fixed point."""
    live = {c: list(ns) for c, ns in allowed.items() if ns}
    changed = True
    while changed:
        changed = False
        for c in list(live):
            keep = [nid for nid in live[c] if all(k in live for k in eg.node(nid).children)]
            if len(keep) != len(live[c]):
                changed = True
                if keep:
                    live[c] = keep
                else:
                    del live[c]
    return live


def prune_memory(eg: EClassGraph, allowed: Mapping[str, list[str]], node_bytes: Mapping[str, int],
                 budget: int) -> tuple[dict[str, list[str]], list[str]]:
    """Drop nodes needing more than ``budget`` bytes, then whatever depended on them only.
    Returns the remaining allowed nodes and the ids pruned; never empties the root."""
    kept = {c: [n for n in ns if node_bytes.get(n, 0) <= budget] for c, ns in allowed.items()}
    live = usable(eg, kept)
    if eg.root not in live:
        biggest = max((node_bytes.get(n, 0) for n in allowed.get(eg.root, [])), default=0)
        raise ExtractionError(f"no plan fits the memory budget of {budget} bytes (the graph's output alone needs "
                              f"{biggest} bytes, or every way to compute it needs more)")
    pruned = [n for c, ns in allowed.items() for n in ns if n not in live.get(c, ())]
    return live, pruned


def greedy(eg: EClassGraph, costs: Mapping[str, float], allowed: Mapping[str, list[str]]) -> Choice:
    """Greedy-DAG extraction: per class the node whose sub-DAG (classes counted once) is cheapest."""
    best: dict[str, tuple[float, str, dict[str, float]]] = {}
    for _ in range(len(allowed) + 2):
        changed = False
        for c, ns in allowed.items():
            for nid in ns:
                n = eg.node(nid)
                if not all(k in best for k in n.children):
                    continue
                sub: dict[str, float] = {c: costs.get(nid, 0.0)}
                for k in n.children:
                    sub.update(best[k][2])
                if c in sub and any(c in best[k][2] for k in n.children):
                    continue  # would depend on itself
                total = sum(sub.values())
                if c not in best or total < best[c][0] - 1e-15:
                    best[c] = (total, nid, sub)
                    changed = True
        if not changed:
            break
    if eg.root not in best:
        raise ExtractionError("greedy extraction found no acyclic way to compute the root")
    return {c: v[1] for c, v in best.items()}


def reachable(eg: EClassGraph, choice: Mapping[str, str]) -> list[str]:
    """Classes the choice needs, children before parents; ``ExtractionError`` on a cycle."""
    order: list[str] = []
    state: dict[str, int] = {}
    stack = [(eg.root, 0)]
    while stack:
        c, i = stack.pop()
        if i == 0:
            if state.get(c) == 2:
                continue
            if state.get(c) == 1:
                raise CycleError(c, [x for x, v in state.items() if v == 1])
            state[c] = 1
        kids = eg.node(choice[c]).children
        if i < len(kids):
            stack.append((c, i + 1))
            k = kids[i]
            if state.get(k) == 1:
                raise CycleError(k, [x for x, v in state.items() if v == 1])
            if state.get(k) != 2:
                stack.append((k, 0))
        else:
            state[c] = 2
            order.append(c)
    return order


def dag_cost(eg: EClassGraph, choice: Mapping[str, str], costs: Mapping[str, float]) -> float:
    return sum(costs.get(choice[c], 0.0) for c in reachable(eg, choice))


def ilp(eg: EClassGraph, costs: Mapping[str, float], allowed: Mapping[str, list[str]],
        time_limit: float = 10.0) -> tuple[Choice, str]:
    """Exact extraction by integer programming; returns (choice, how) where ``how``
    says whether the ILP's answer or greedy's was used and why."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    fallback = greedy(eg, costs, allowed)
    base = dag_cost(eg, fallback, costs)
    classes = list(allowed)
    cidx = {c: i for i, c in enumerate(classes)}
    nodes = [(c, nid) for c in classes for nid in allowed[c]]
    nn, nc = len(nodes), len(classes)
    big = nc + 1
    # variables: x_n (binary) for each node, then t_c (order, continuous 0..nc) for each class
    nvar = nn + nc
    rows, lo, hi = [], [], []

    def row(entries: dict[int, float], l: float, h: float):
        r = np.zeros(nvar)
        for k, v in entries.items():
            r[k] += v
        rows.append(r)
        lo.append(l)
        hi.append(h)

    by_class: dict[str, list[int]] = {}
    for j, (c, _) in enumerate(nodes):
        by_class.setdefault(c, []).append(j)
    for c, js in by_class.items():
        row({j: 1.0 for j in js}, 0.0, 1.0)  # at most one node per class
    row({j: 1.0 for j in by_class[eg.root]}, 1.0, 1.0)  # the root is computed
    for j, (c, nid) in enumerate(nodes):
        for k in set(eg.node(nid).children):
            # a chosen node needs its child class computed ...
            row({j: 1.0, **{m: -1.0 for m in by_class[k]}}, -np.inf, 0.0)
            # ... strictly before it: t_c - t_k >= 1 - big * (1 - x_j)
            row({nn + cidx[c]: 1.0, nn + cidx[k]: -1.0, j: -big}, 1.0 - big, np.inf)
    cvec = np.concatenate([[costs.get(nid, 0.0) for _, nid in nodes], np.zeros(nc)])
    integrality = np.concatenate([np.ones(nn), np.zeros(nc)])
    bounds = Bounds(np.zeros(nvar), np.concatenate([np.ones(nn), np.full(nc, float(nc))]))
    res = milp(cvec, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=integrality, bounds=bounds,
               options={"time_limit": time_limit, "mip_rel_gap": 0.0})  # exact: HiGHS stops at 1e-4 by default
    if res.x is None:
        return fallback, f"greedy (ILP found no solution: {res.message})"
    choice = {c: nid for j, (c, nid) in enumerate(nodes) if res.x[j] > 0.5}
    try:
        cost = dag_cost(eg, choice, costs)
    except (ExtractionError, KeyError):
        return fallback, "greedy (ILP answer was not a valid plan)"
    if cost > base + 1e-12:
        return fallback, "greedy (ILP stopped at a worse plan before its time limit)"
    return choice, "ilp" if res.status == 0 else f"ilp (time limit: best found, {res.message})"


def repair(eg: EClassGraph, choice: Choice, fallback: Choice) -> Choice:
    """Make ``choice`` acyclic by switching classes on a cycle to the fallback's (acyclic) choice."""
    choice = dict(choice)
    for _ in range(len(choice) + 1):
        try:
            reachable(eg, choice)
            return choice
        except CycleError as e:
            switch = [c for c in e.path if choice.get(c) != fallback.get(c) and c in fallback]
            if not switch:
                raise
            for c in switch:
                choice[c] = fallback[c]
    raise ExtractionError("could not repair the cycle")
