"""What each e-class holds (shape) and what each e-node costs (estimate, bytes, kernel problem).

Shapes come from the graph's inputs and parameters, propagated through the
e-nodes by their ops' own shape rules (the op registry). A template e-node
whose op no template can run at its shapes (a batched matmul, say) is marked
unavailable: its op's ``kernel`` gives no problem. So is an e-node whose op's
shape rule refuses its operands (a rewrite matched a form its result does not
fit: a residual add after a batched matmul, whose 3-D weight no ``gemm_pack``
takes), and one reading a class with no shape; its class takes its shape from
another node. Costs are analytic
estimates from the device's ceilings (roofline plus a per-call overhead);
they guide the extractors and seed the search, the measurements decide.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..ir import Graph
from ..ops import LIBRARIES, REGISTRY, MlpProblem, Problem
from .egraph import EClassGraph, ENode


class Roofline(Protocol):
    """What the estimate needs of a device (``targets.Ceilings`` has it): seconds per kernel call, all-thread
    peak FLOP/s, and the bandwidth operands stream at."""

    call_s: float
    peak_flops: float
    stream_bandwidth: float


def op_of(n: ENode):
    """(op, attrs, library) of a semantic, library or template e-node (library None unless a ``lib`` node)."""
    kind, attr = n.args[0], n.args[1]
    lib = None
    if n.impl == "lib":
        op, lib = LIBRARIES[kind]
    else:
        op = REGISTRY[kind]
    return op, op.from_egg(attr), lib


@dataclass
class Analysis:
    """Per-class shapes (``None`` for non-tensor classes, e.g. layer lists),
    layer lists of ``Layers`` classes, and per-node facts."""

    eg: EClassGraph
    graph: Graph
    shapes: dict[str, tuple[int, ...] | None] = field(default_factory=dict)
    layers: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)  # class -> [(w cls, b cls, act)]
    unavailable: set[str] = field(default_factory=set)  # node ids
    # classes computed from parameters alone: the plan folds their library steps into constants at load time
    constant: set[str] = field(default_factory=set)
    # the graph is one part of a partitioned model: its fused MLPs are ``MlpProblem(shared=True)``
    shared: bool = False

    def problem(self, n: ENode) -> Problem | MlpProblem | None:
        """The kernel problem of a template node or a fused MLP; None for other nodes and
        for templates that cannot run at this node's shapes."""
        if n.impl == "fused":
            layers = tuple((self.shapes[w][0], self.shapes[w][1], act) for w, _, act in self.layers[n.children[1]])
            try:
                return MlpProblem(layers, shared=self.shared)
            except ValueError:
                return None
        if n.impl != "tmpl":
            return None
        op, attrs, _ = op_of(n)
        if op.kernel is None or any(c not in self.shapes for c in (*n.children, n.eclass)):
            return None  # (an operand's class with no shape: every node of it refused its operands)
        try:
            return op.kernel([self.shapes[c] for c in n.children], self.shapes[n.eclass], attrs)
        except ValueError:  # a problem the templates cannot take (ProblemError)
            return None

    def view_of(self, n: ENode) -> str | None:
        """The ``reshape`` attribute a library or template transpose equals when it moves only axes of length 1 (it
        reorders no element: ``[1, 1, 1, C] -> [1, C, 1, 1]`` before a classifier, a copy step of 2.5-5 us in
        MobileNets' plans); None for any other node."""
        if n.impl not in ("lib", "tmpl") or n.args[0] != "transpose" or not n.children:
            return None
        src, out = self.shapes.get(n.children[0]), self.shapes.get(n.eclass)
        if not src or not out:
            return None
        perm = op_of(n)[1].get("perm") or tuple(reversed(range(len(src))))
        moved = [p for p in perm if src[p] != 1]
        return ",".join(map(str, out)) if moved == sorted(moved) else None

    def out_bytes(self, n: ENode) -> int:
        s = self.shapes.get(n.eclass)
        return 4 * math.prod(s) if s else 0

    def workspace_bytes(self, n: ENode) -> int:
        """Extra memory an implementation materialises (the broadcast matmul's [.., M, K, N])."""
        if n.impl == "lib":
            _, _, lib = op_of(n)
            if lib.workspace is not None:
                return lib.workspace([self.shapes[c] for c in n.children])
        return 0


_REFUSED = object()  # ``_shape``: the op's shape rule refused the node's operands


def _shape(a: Analysis, n: ENode, g: Graph) -> tuple[int, ...] | None | bool | object:
    """The output shape of ``n`` from its children's, ``False`` when a child is still unknown, ``_REFUSED`` when
    its op's shape rule refuses them."""
    op = n.op
    if op == "T.input":
        return tuple(g.inputs[n.args[0]])
    if op == "T.param":
        return tuple(g.params[n.args[0]].shape)
    if op == "T.param_t":
        return tuple(reversed(g.params[n.args[0]].shape))
    if op.startswith("Layers."):
        return None
    kids = []
    for c in n.children:
        if c not in a.shapes:
            return False
        kids.append(a.shapes[c])
    if op in ("fused_mlp", "mlp"):
        last_w = a.layers.get(n.children[1])
        if not last_w:
            return False
        w = a.shapes.get(last_w[-1][0])
        return (*kids[0][:-1], w[-1]) if w else False
    entry, attrs, _ = op_of(n)
    try:
        return tuple(entry.shape(kids, attrs))
    except ValueError:  # ShapeError
        return _REFUSED


def analyse(eg: EClassGraph, g: Graph) -> Analysis:
    a = Analysis(eg, g)
    # layer lists first (they only need their own cells)
    changed = True
    while changed:
        changed = False
        for cid, nodes in eg.classes.items():
            if cid in a.layers:
                continue
            for n in nodes:
                if n.op == "Layers.one":
                    a.layers[cid] = [(n.children[0], n.children[1], n.args[0])]
                elif n.op == "Layers.then" and n.children[0] in a.layers:
                    a.layers[cid] = a.layers[n.children[0]] + [(n.children[1], n.children[2], n.args[0])]
                else:
                    continue
                changed = True
                break
    changed = True
    while changed:
        changed = False
        for cid, nodes in eg.classes.items():
            if cid in a.shapes:
                continue
            for n in nodes:
                s = _shape(a, n, g)
                if s is not False and s is not _REFUSED:
                    a.shapes[cid] = s
                    changed = True
                    break
    for ns in eg.classes.values():  # every node's operands checked, not only the one that gave its class a shape
        for n in ns:
            if n.op not in ("T.input", "T.param", "T.param_t") and _shape(a, n, g) in (False, _REFUSED):
                a.unavailable.add(n.id)
    changed = True
    while changed:
        changed = False
        for cid, nodes in eg.classes.items():
            if cid not in a.constant and any(n.op in ("T.param", "T.param_t") or (
                    n.impl == "lib" and n.children and all(c in a.constant for c in n.children)) for n in nodes):
                a.constant.add(cid)
                changed = True
    for ns in eg.classes.values():
        for n in ns:
            if n.impl in ("tmpl", "fused") and (n.eclass not in a.shapes or a.problem(n) is None):
                a.unavailable.add(n.id)
            if n.impl == "fused":
                x = a.shapes.get(n.children[0])
                if x is None or math.prod(x[:-1]) != 1:
                    a.unavailable.add(n.id)  # the fused MLP runs one row
    return a


def estimate(a: Analysis, n: ENode, device: Roofline) -> float:
    """Seconds one e-node costs per run, by roofline plus call overhead (0 for leaves and views)."""
    if n.impl in ("leaf", "layers"):
        return 0.0
    call = device.call_s
    peak = device.peak_flops
    bw = device.stream_bandwidth
    if n.impl == "fused":
        layers = a.problem(n).layers
        flops = sum(2.0 * k * m for k, m, _ in layers)
        byts = sum(4.0 * (k * m + m) for k, m, _ in layers)
        return call + max(flops / peak, byts / bw)
    op, attrs, lib = op_of(n)
    if op.view or (lib is not None and n.children and all(c in a.constant for c in n.children)
                   and op.name != "pair"):
        return 0.0  # a view, or folded into a constant when the plan is loaded
    shapes = [a.shapes.get(c) for c in n.children]
    out = a.shapes.get(n.eclass) or ()
    size = math.prod(out) if out else 0
    own = 0.0
    if op.name in ("matmul", "linear") and shapes[0] and shapes[1]:
        x, w = shapes[0], shapes[1]
        flops = 2.0 * math.prod(x) * w[-1]
        byts = 4.0 * (math.prod(x) + math.prod(w) + size)
    elif op.roofline and all(shapes):
        flops = op.flops(shapes, out, attrs)
        byts = 4.0 * (sum(math.prod(s) for s in shapes) + size)
        if op.layout_bytes is not None:  # its own copy passes, after the compute: not overlapped with it
            own = op.layout_bytes(shapes, out, attrs) / bw
    else:
        flops = 10.0 * size
        byts = 4.0 * (sum(math.prod(s) for s in shapes if s) + size)
    passes = 1
    if lib is not None:
        flops *= lib.extra_flops
        if lib.workspace is not None:
            byts += 2.0 * lib.workspace([s for s in shapes if s])  # written, then read back
        # numpy pays its dispatch per call, and an epilogue is one more pass each
        passes = lib.passes(attrs) if callable(lib.passes) else lib.passes
        call *= 4
    return passes * call + max(flops / peak, byts / bw) + own


__all__ = ["Analysis", "Roofline", "analyse", "estimate", "op_of"]
