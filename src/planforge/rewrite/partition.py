"""Cut a model into tasks: subgraphs between single-value cut points, keyed by structure so identical layers are one.

A cut point is a value that alone carries everything later nodes need: after
the node that produces it, no other runtime value is still live (the
residual stream between two transformer blocks, the activation between two
MLP layers). Cutting there never separates a fusion that crosses the cut
from its parts in a way a plan could exploit: the only thing that flows is
one tensor, which both sides must materialise anyway. Weights are not
runtime values: each part takes the parameters it reads.

A part's key is a hash of its canonical structure (ops, attributes, shapes,
dtypes, wiring; values renamed by position, weights left out), so the parts
of a 12-layer model with one layer shape make two tasks (attention half,
MLP half), each with a weight of 12. Parts smaller than ``min_nodes`` are
merged into their neighbour, and a graph of at most ``whole_below`` nodes
stays one task (a batch-1 MLP is fused across its layers as one kernel).

A convolutional chain's cuts carry the activation in NHWC (``_nhwc_cuts``): a
transpose to NHWC ends each part and its inverse starts the next, an identity
the e-graph's layout rules cancel inside each part against the NHWC forms'
own transposes, so a MobileNet runs NHWC from its input to its classifier
instead of paying a layout change at every cut (or keeping NCHW forms because
both sides of a part were NCHW).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..ir import Graph, Node

MIN_NODES = 4
WHOLE_BELOW = 48
TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
# ops whose NCHW output an NHWC twin (or a transpose it commutes with) can produce: a cut after one of them, before
# a convolution, may carry the activation in NHWC
NHWC_PRODUCERS = ("conv2d", "batchnorm", "add", "relu", "relu6", "hardswish", "hardsigmoid", "silu", "maxpool2d",
                  "avgpool2d")


@dataclass
class Part:
    """One instance of a part of the graph: its own graph (inputs = the values that flow in), and where it sits."""

    index: int
    graph: Graph
    key: str
    nodes: tuple[int, int]          # [first, last) node indices in the source graph
    inputs: list[str]               # source value names feeding it, in its input order
    outputs: list[str]              # source value names it produces for later parts or as graph outputs
    params: list[str]               # source parameter names it reads, in canonical order


@dataclass
class Partition:
    """The parts of a graph, their distinct keys, and why it was cut where it was."""

    graph: Graph
    parts: list[Part]
    reason: str
    keys: dict[str, list[int]] = field(default_factory=dict)  # key -> indices of its parts, in order

    def __post_init__(self):
        for p in self.parts:
            self.keys.setdefault(p.key, []).append(p.index)

    @property
    def dedupe(self) -> float:
        """Parts per distinct task (1.0: nothing repeats)."""
        return len(self.parts) / max(1, len(self.keys))

    def describe(self) -> dict[str, Any]:
        return {"parts": len(self.parts), "tasks": len(self.keys), "reason": self.reason,
                "cuts": [p.outputs for p in self.parts[:-1]],
                "weights": {k: len(v) for k, v in self.keys.items()}}


def _canon_attrs(attrs: dict[str, Any]) -> Any:
    def conv(v):
        if isinstance(v, (tuple, list)):
            return [conv(x) for x in v]
        if isinstance(v, float):
            return repr(v)
        if isinstance(v, (int, str, bool)) or v is None:
            return v
        return repr(v)
    return {k: conv(v) for k, v in sorted(attrs.items())}


def structural_key(g: Graph) -> str:
    """A hash of ``g``'s structure: ops, attributes, shapes, dtype and wiring, with every value renamed by its
    position (inputs ``i0..``, parameters ``p0..`` in order of first use, nodes ``v0..``); weights excluded."""
    import hashlib

    shapes = g.shapes()
    names: dict[str, str] = {n: f"i{k}" for k, n in enumerate(g.inputs)}
    doc: dict[str, Any] = {"dtype": g.dtype, "inputs": [list(s) for s in g.inputs.values()], "params": [],
                           "nodes": []}
    for node in g.nodes:
        ins = []
        for i in node.inputs:
            if i not in names:  # a parameter, named by first use
                names[i] = f"p{len(doc['params'])}"
                doc["params"].append([list(shapes[i]), str(g.params[i].dtype)])
            ins.append(names[i])
        names[node.output] = f"v{len(doc['nodes'])}"
        doc["nodes"].append([node.op, ins, _canon_attrs(node.attrs), list(shapes[node.output])])
    doc["outputs"] = [names[o] for o in g.outputs]
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cut_points(g: Graph) -> list[int]:
    """Indices ``i`` such that after node ``i`` only its own output is a live runtime value (and more nodes follow)."""
    last_use: dict[str, int] = {}
    n = len(g.nodes)
    for i, node in enumerate(g.nodes):
        for v in node.inputs:
            if v not in g.params:
                last_use[v] = i
    for o in g.outputs:
        last_use[o] = n  # graph outputs live to the end
    live: set[str] = {v for v in g.inputs if last_use.get(v, -1) >= 0}
    cuts = []
    for i, node in enumerate(g.nodes[:-1]):
        live.add(node.output)
        live = {v for v in live if last_use.get(v, -1) > i}
        if live == {node.output} and node.output not in g.outputs:
            cuts.append(i)
    return cuts


def _segments(g: Graph, cuts: list[int], min_nodes: int, backward: bool = False) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for c in cuts:
        bounds.append((start, c + 1))
        start = c + 1
    bounds.append((start, len(g.nodes)))
    merged: list[tuple[int, int]] = []
    for a, b in bounds:  # a part too small to be worth a task joins the next one (backward: the one before)
        if merged and (b - a < min_nodes if backward else merged[-1][1] - merged[-1][0] < min_nodes):
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    if len(merged) > 1 and merged[-1][1] - merged[-1][0] < min_nodes:
        last = merged.pop()
        merged[-1] = (merged[-1][0], last[1])
    return merged


def _part_graph(g: Graph, index: int, a: int, b: int, shapes) -> tuple[Graph, list[str], list[str], list[str]]:
    nodes = g.nodes[a:b]
    produced = {n.output for n in nodes}
    later = {i for n in g.nodes[b:] for i in n.inputs} | set(g.outputs)
    inputs, params = [], []
    for n in nodes:
        for i in n.inputs:
            if i in g.params:
                if i not in params:
                    params.append(i)
            elif i not in produced and i not in inputs:
                inputs.append(i)
    outputs = [n.output for n in nodes if n.output in later]
    sub = Graph(f"{g.name}/part{index}", {i: tuple(shapes[i]) for i in inputs}, {p: g.params[p] for p in params},
                [Node(n.op, n.inputs, n.output, dict(n.attrs)) for n in nodes], outputs, g.dtype,
                {i: g.input_dtypes[i] for i in inputs if i in g.input_dtypes})
    return sub, inputs, outputs, params


def _distinct(g: Graph, bounds: list[tuple[int, int]], shapes) -> int:
    return len({structural_key(_part_graph(g, k, a, b, shapes)[0]) for k, (a, b) in enumerate(bounds)})


def _work(g: Graph, bounds: list[tuple[int, int]], shapes, keys: dict) -> int:
    """The ops there are to tune: each distinct part's, once (``keys`` caches a segment's key)."""
    seen: dict[str, int] = {}
    for k, (a, b) in enumerate(bounds):
        if (a, b) not in keys:
            keys[(a, b)] = structural_key(_part_graph(g, k, a, b, shapes)[0])
        seen.setdefault(keys[(a, b)], b - a)
    return sum(seen.values())


def _aligned(g: Graph, cuts: list[int], min_nodes: int, shapes, bounds: list[tuple[int, int]]):
    """Cuts kept only before a convolution (a ``roofline`` op: its batch norm and activations follow it, so a cut
    before it separates no fusion), and of those only where the ops on either side are of chosen kinds (``(op
    before, op after)``, the subset with the fewest ops to tune): a stretch of cut points (MobileNet's blocks
    without a residual are cuttable after every op) is cut where blocks meet, not every ``min_nodes`` ops, so that
    identical blocks are identical parts. ``bounds`` when no such choice tunes fewer ops."""
    from itertools import combinations

    from ..ops import REGISTRY

    ahead = [c for c in cuts if getattr(REGISTRY.get(g.nodes[c + 1].op), "roofline", False)]
    sig = {c: (g.nodes[c].op, g.nodes[c + 1].op) for c in ahead}
    kinds = sorted(set(sig.values()))
    if not kinds or len(kinds) > 8:
        return bounds
    keys: dict = {}
    best, best_work = bounds, _work(g, bounds, shapes, keys)
    for r in range(1, len(kinds) + 1):
        for chosen in combinations(kinds, r):
            kept = [c for c in ahead if sig[c] in chosen]
            for back in (False, True):
                b = _segments(g, kept, min_nodes, backward=back)
                w = _work(g, b, shapes, keys)
                if w < best_work:
                    best, best_work = b, w
    return best


def _nhwc_cuts(g: Graph, bounds: list[tuple[int, int]], shapes) -> tuple[Graph, list[tuple[int, int]]]:
    """``g`` with each cut of a convolutional chain carried in NHWC, and the parts' bounds in it: after the last
    node of a part whose 4-D output feeds a convolution (and comes from an op with an NHWC form), a transpose to
    NHWC ends the part and its inverse starts the next one. The pair is the identity, so the model is unchanged;
    within each part the e-graph's ``layout`` rules cancel the transposes against the NHWC forms' own, so a
    chain of NHWC parts runs with no layout change at its cuts (a part that keeps NCHW forms pays for the pair)."""
    taken = set(g.inputs) | set(g.params) | {n.output for n in g.nodes}

    def fresh(name):
        k, out = 0, name
        while out in taken:
            k, out = k + 1, f"{name}{k}"
        taken.add(out)
        return out

    ends = {b - 1 for _, b in bounds[:-1]}
    nodes: list[Node] = []
    rename: dict[str, str] = {}
    starts = []
    for i, n in enumerate(g.nodes):
        if not starts or i - 1 in ends:
            starts.append(len(nodes))
        nodes.append(Node(n.op, tuple(rename.get(x, x) for x in n.inputs), n.output, dict(n.attrs)))
        if i in ends and len(shapes[n.output]) == 4 and n.op in NHWC_PRODUCERS and g.nodes[i + 1].op == "conv2d":
            t, back = fresh(f"{n.output}.nhwc"), fresh(f"{n.output}.nchw")
            nodes.append(Node("transpose", (n.output,), t, {"perm": TO_NHWC}))
            nodes.append(Node("transpose", (t,), back, {"perm": TO_NCHW}))
            rename[n.output] = back
            ends.discard(i)
            starts.append(len(nodes) - 1)  # the next part starts at the transpose back
    if len(nodes) == len(g.nodes):
        return g, bounds
    g2 = Graph(g.name, dict(g.inputs), dict(g.params), nodes, [rename.get(o, o) for o in g.outputs], g.dtype,
               dict(g.input_dtypes), g.source)
    return g2, list(zip(starts, starts[1:] + [len(nodes)]))


def partition(g: Graph, min_nodes: int = MIN_NODES, whole_below: int = WHOLE_BELOW,
              nhwc_cuts: bool = True) -> Partition:
    """The parts of ``g`` (see the module's docstring); a graph too small or without a cut point is one part.
    ``nhwc_cuts``: a convolutional chain's cuts carry NHWC tensors (``_nhwc_cuts``; ``Partition.graph`` is then
    ``g`` with the transposes at its cuts)."""
    shapes = g.shapes()
    if len(g.nodes) <= whole_below:
        reason = f"kept whole: {len(g.nodes)} ops, at most {whole_below} (fusions across all of it stay possible)"
        bounds = [(0, len(g.nodes))]
    else:
        cuts = cut_points(g)
        bounds = _segments(g, cuts, min_nodes)
        # a small part between two blocks (a residual block's closing ReLU) may belong to the block before it:
        # merged that way, identical blocks become one task; keep whichever way repeats more
        back = _segments(g, cuts, min_nodes, backward=True)
        if back != bounds and _distinct(g, back, shapes) < _distinct(g, bounds, shapes):
            bounds = back
        bounds = _aligned(g, cuts, min_nodes, shapes, bounds)
        if len(bounds) == 1:
            reason = f"kept whole: no value alone carries the state between any two of its {len(g.nodes)} ops"
        else:
            reason = (f"cut at {len(bounds) - 1} values that alone carry all state forward (of {len(cuts)} such "
                      f"points; parts under {min_nodes} ops merged into the next)")
    if nhwc_cuts and len(bounds) > 1:
        g, bounds = _nhwc_cuts(g, bounds, shapes)
        shapes = g.shapes()
    parts = []
    for k, (a, b) in enumerate(bounds):
        sub, ins, outs, params = _part_graph(g, k, a, b, shapes)
        parts.append(Part(k, sub, structural_key(sub), (a, b), ins, outs, params))
    return Partition(g, parts, reason)


__all__ = ["MIN_NODES", "Part", "Partition", "WHOLE_BELOW", "cut_points", "partition", "structural_key"]
