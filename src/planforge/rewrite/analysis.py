"""What each e-class holds (shape) and what each e-node costs (estimate, bytes, kernel problem).

Shapes come from the graph's inputs and parameters, propagated through the
e-nodes' own semantics. A template e-node whose op the templates cannot run
(a batched matmul, say) is marked unavailable. Costs are analytic estimates
from the DeviceProfile (roofline plus a per-call overhead); they guide the
extractors and seed the search, the measurements decide.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..ir import Graph
from ..targets.cpu.templates import Problem
from .egraph import EClassGraph, ENode

EPI_OF_ACT = {"none": "bias", "relu": "bias_relu", "gelu:tanh": "bias_gelu"}
VIEW_KINDS = {"reshape", "pair"}  # no work at run time


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(",") if x != "")


@dataclass
class Analysis:
    """Per-class shapes (``None`` for non-tensor classes, e.g. layer lists),
    layer lists of ``Layers`` classes, and per-node facts."""

    eg: EClassGraph
    graph: Graph
    shapes: dict[str, tuple[int, ...] | None] = field(default_factory=dict)
    layers: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)  # class -> [(w cls, b cls, act)]
    unavailable: set[str] = field(default_factory=set)  # node ids

    def node_shape(self, n: ENode) -> tuple[int, ...] | None:
        return self.shapes.get(n.eclass)

    def problem(self, n: ENode) -> Problem | tuple | None:
        """The kernel problem of a template node (``Problem``), or for a fused MLP
        the layer tuple ((K, N, act), ...); None for other nodes."""
        if n.impl == "fused":
            return tuple((self.shapes[w][0], self.shapes[w][1], act) for w, _, act in self.layers[n.children[1]])
        if n.impl != "tmpl":
            return None
        kind, attr = n.args[0], n.args[1]
        out = self.shapes[n.eclass]
        rows = math.prod(out[:-1])
        cols = out[-1]
        if kind in ("linear", "matmul"):
            x, w = (self.shapes[c] for c in n.children[:2])
            if len(x) != 2 or len(w) != 2:
                return None
            K = x[1]
            epi = EPI_OF_ACT.get(attr) if kind == "linear" else "none"
            if epi is None:
                return None
            return Problem("gemv", (cols, K), epi) if rows == 1 else Problem("gemm", (rows, cols, K), epi)
        if kind in ("bias", "add", "relu"):
            return Problem("eltwise", (rows, cols), kind)
        if kind == "gelu" and attr == "tanh":
            return Problem("eltwise", (rows, cols), "gelu")
        if kind == "softmax":
            return Problem("softmax", (rows, cols))
        if kind == "layernorm" and abs(float(attr) - 1e-5) < 1e-12:
            return Problem("layernorm", (rows, cols))
        return None

    def out_bytes(self, n: ENode) -> int:
        s = self.shapes.get(n.eclass)
        return 4 * math.prod(s) if s else 0

    def workspace_bytes(self, n: ENode) -> int:
        """Extra memory an implementation materialises (the broadcast matmul's [.., M, K, N])."""
        if n.impl == "lib" and n.args[0] == "matmul_bcast":
            x, w = (self.shapes[c] for c in n.children)
            return 4 * math.prod(x) * w[-1]
        return 0


def _shape(a: Analysis, n: ENode, g: Graph) -> tuple[int, ...] | None | bool:
    """The output shape of ``n`` from its children's, ``False`` when a child is still unknown."""
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
    kind, attr = (n.args[0], n.args[1]) if n.impl in ("lib", "tmpl") else (op.split(".")[-1], n.args[0] if n.args else "")
    x = kids[0]
    if kind in ("matmul", "matmul_bcast", "linear"):
        w = kids[1]
        return (*(x[:-2] or w[:-2]), x[-2], w[-1])
    if kind == "transpose":
        perm = _ints(attr) or tuple(reversed(range(len(x))))
        return tuple(x[p] for p in perm)
    if kind == "reshape":
        return _ints(attr)
    if kind == "concat":
        ax = int(attr) % len(x)
        return tuple(x[i] + kids[1][i] if i == ax else x[i] for i in range(len(x)))
    if kind == "pair":
        return x
    return x  # elementwise and row-wise ops keep the shape


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
                if s is not False:
                    a.shapes[cid] = s
                    changed = True
                    break
    for ns in eg.classes.values():
        for n in ns:
            if n.impl in ("tmpl", "fused") and (n.eclass not in a.shapes or a.problem(n) is None):
                a.unavailable.add(n.id)
            if n.impl == "fused":
                x = a.shapes.get(n.children[0])
                if x is None or math.prod(x[:-1]) != 1:
                    a.unavailable.add(n.id)  # the fused MLP runs one row
    return a


def estimate(a: Analysis, n: ENode, profile) -> float:
    """Seconds one e-node costs per run, by roofline plus call overhead (0 for leaves and views)."""
    if n.impl in ("leaf", "layers") or (n.impl == "lib" and n.args[0] in VIEW_KINDS):
        return 0.0
    call = profile.call_overhead_s
    peak = profile.peak_flops_all
    bw = profile.bandwidth.get("L2", profile.bandwidth.get("DRAM", {})).get("read", 1e10)
    shapes = [a.shapes.get(c) for c in n.children]
    out = a.shapes.get(n.eclass) or ()
    size = math.prod(out) if out else 0
    if n.impl == "fused":
        layers = a.problem(n)
        flops = sum(2.0 * k * m for k, m, _ in layers)
        byts = sum(4.0 * (k * m + m) for k, m, _ in layers)
        return call + max(flops / peak, byts / bw)
    kind = n.args[0]
    if kind in ("matmul", "matmul_bcast", "linear") and shapes[0] and shapes[1]:
        x, w = shapes[0], shapes[1]
        flops = 2.0 * math.prod(x) * w[-1]
        byts = 4.0 * (math.prod(x) + math.prod(w) + size)
        if kind == "matmul_bcast":
            byts += 8.0 * math.prod(x) * w[-1]
            flops *= 2
    else:
        flops = 10.0 * size
        byts = 4.0 * (sum(math.prod(s) for s in shapes if s) + size)
    ops = 1
    if n.impl == "lib":
        # numpy pays its dispatch per call, and an epilogue is one more pass each
        ops = {"linear": 2 if n.args[1] == "none" else 3, "layernorm": 8, "softmax": 5}.get(kind, 1)
        call *= 4
    return ops * call + max(flops / peak, byts / bw)
