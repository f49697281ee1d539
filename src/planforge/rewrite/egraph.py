"""Put a graph in an e-graph, saturate it within limits, and read it back.

``saturate`` runs the rule sets one iteration at a time; before each
iteration it pushes the e-graph, and when an iteration overshoots the node
limit it pops back to the last e-graph within the limit. egglog's
serialisation is private API (``EGraph._serialize().to_json()``): ``_read``
is the one place that touches it.
"""
from __future__ import annotations

import gc
import json
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from egglog import EGraph

from ..ir import Graph
from ..ops import REGISTRY
from ..ops.egg import E, T, output
from .lang import rulesets as all_rulesets


class RewriteError(ValueError):
    """A graph that cannot be encoded, or an e-graph that cannot be read back."""


@dataclass(frozen=True)
class ENode:
    """One e-node: ``op`` (``lib2``, ``tmpl3``, ``T.matmul``, ``T.param``...), its string
    arguments (``kind``, ``attr``, names) in ``args``, and its e-class children."""

    id: str
    op: str
    args: tuple[str, ...]
    children: tuple[str, ...]
    eclass: str

    @property
    def executable(self) -> bool:
        """An implementation, a leaf or a layer-list cell (semantic ops cannot run)."""
        return self.op in IMPL_OPS or self.op in LEAF_OPS or self.op.startswith("Layers.")

    @property
    def impl(self) -> str:
        """``lib``, ``tmpl``, ``fused``, ``leaf`` or ``layers``."""
        if self.op in LEAF_OPS:
            return "leaf"
        if self.op.startswith("Layers."):
            return "layers"
        return "fused" if self.op == "fused_mlp" else self.op.rstrip("123")

    @property
    def kind(self) -> str:
        return self.args[0] if self.args else self.op


IMPL_OPS = {"lib1", "lib2", "lib3", "tmpl1", "tmpl2", "tmpl3", "fused_mlp"}
LEAF_OPS = {"T.input", "T.param", "T.param_t"}


@dataclass
class EClassGraph:
    """The saturated e-graph as plain data: classes of e-nodes, and the root class."""

    classes: dict[str, list[ENode]]
    root: str
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def n_nodes(self) -> int:
        return sum(len(v) for v in self.classes.values())

    def node(self, nid: str) -> ENode:
        return self._by_id[nid]

    def __post_init__(self):
        self._by_id = {n.id: n for ns in self.classes.values() for n in ns}


@dataclass(frozen=True)
class Limits:
    """Saturation limits: e-nodes, iterations and seconds (default 20000, 12, 10 s)."""

    nodes: int = 20_000
    iterations: int = 12
    seconds: float = 10.0


def encode(g: Graph, eg: EGraph) -> T:
    """Add the graph to ``eg``; returns the root expression (outputs paired). Each node is encoded by its op
    (``Op.encode``, or the generic ``E(op, *inputs, attr=Op.egg_attr(attrs))``)."""
    g.shapes()
    env: dict[str, T] = {n: T.input(n) for n in g.inputs}
    env.update({n: T.param(n) for n in g.params})
    for node in g.nodes:
        op = REGISTRY[node.op]
        a = [env[i] for i in node.inputs]
        try:
            e = op.encode(E, a, node.attrs) if op.encode else E(node.op, *a, attr=op.egg_attr(node.attrs))
        except (KeyError, TypeError, ValueError) as err:
            raise RewriteError(f"{node.where()}: cannot encode it in the e-graph: {err}") from None
        env[node.output] = eg.let(f"v_{len(env)}", e)
    root = env[g.outputs[0]]
    for o in g.outputs[1:]:
        root = E("pair", root, env[o])
    return eg.let("root", output(root))


def _size(eg: EGraph) -> int:
    return sum(n for _, n in eg.all_function_sizes())


def release_egraphs() -> None:
    """Free the e-graphs that are garbage by now, on this thread. egglog's e-graph may not be dropped on another
    thread, and one caught in a reference cycle is freed whenever the cycle collector next runs, on whichever thread
    allocates then: a kernel build thread or a measurement worker's reader, where egglog prints "EGraph is
    unsendable, but is being dropped on another thread" to the user's terminal (and leaks it). Call it after the
    e-graphs of a plan are read and before threads start."""
    gc.collect()


def saturate(g: Graph, rulesets: list[str], limits: Limits = Limits()) -> EClassGraph:
    """Encode ``g``, run ``rulesets`` (names from ``lang.rulesets()``, applied together,
    then lowered to implementations) within ``limits``, and read the result back."""
    known = all_rulesets()
    unknown = [r for r in rulesets if r not in known]
    if unknown:
        raise RewriteError(f"unknown rule sets {unknown}; known: {', '.join(known)}")
    eg = EGraph()
    try:
        return _saturate(g, eg, known, rulesets, limits)
    except BaseException as e:
        # the e-graph is freed here, on the thread that made it: egglog's may not be dropped on another thread,
        # nor in a forked child (its drop waits for a thread pool the fork did not copy). An exception's traceback
        # keeps the frames below alive, so their locals (the e-graph among them) are cleared; the lines stay.
        traceback.clear_frames(e.__traceback__)
        raise
    finally:
        del eg


def _saturate(g: Graph, eg: EGraph, known, rulesets: list[str], limits: Limits) -> EClassGraph:
    t0 = time.perf_counter()
    root = encode(g, eg)
    rules = None
    for name in [r for r in rulesets if r != "lowering"]:
        rules = known[name] if rules is None else rules | known[name]
    iterations, stop, rolled_back = 0, "saturated", False
    sizes = [_size(eg)]
    if rules is not None:
        while True:
            if iterations >= limits.iterations:
                stop = "iteration limit"
                break
            if time.perf_counter() - t0 > limits.seconds:
                stop = "time limit"
                break
            eg.push()
            report = eg.run(rules * 1)
            iterations += 1
            size = _size(eg)
            if size > limits.nodes:
                eg.pop()  # roll the overshooting iteration back
                rolled_back, stop = True, "node limit"
                iterations -= 1
                break
            sizes.append(size)
            if not report.updated:
                break
    eg.run(known["lowering"] * 1)
    lowered = _size(eg)
    if lowered > limits.nodes * 2:
        raise RewriteError(f"lowering grew the e-graph to {lowered} nodes, past twice the node limit {limits.nodes}")
    out = _read(eg, root)
    out.stats = {"iterations": iterations, "stop": stop, "rolled_back": rolled_back, "sizes": sizes,
                 "seconds": time.perf_counter() - t0, "nodes": out.n_nodes, "classes": len(out.classes),
                 "rulesets": list(rulesets)}
    return out


def _read(eg: EGraph, root: T) -> EClassGraph:
    """The single adapter over egglog's (private) serialisation."""
    try:
        data = json.loads(eg._serialize().to_json())
        nodes = data["nodes"]
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise RewriteError(f"cannot read the e-graph back from egglog ({type(e).__name__}: {e}); "
                           "this planforge expects egglog 13.2") from None
    prims = {nid: n for nid, n in nodes.items() if not n["children"] and n["op"].startswith('"')}
    marks = [n for n in nodes.values() if n["op"] == "output"]
    if len(marks) != 1:
        raise RewriteError(f"expected one output marker in the e-graph, found {len(marks)}")
    root_class = nodes[marks[0]["children"][0]]["eclass"]
    classes: dict[str, list[ENode]] = {}
    for nid, n in nodes.items():
        if nid in prims or n.get("subsumed") or n["op"] == "output":
            continue
        op = n["op"].replace("·", "")
        if op.startswith("."):  # a method: name it after its class (T.matmul, Layers.then)
            op = ("Layers" if ".Layers-" in n["eclass"] else "T") + op
        args = tuple(json.loads(prims[c]["op"]) for c in n["children"] if c in prims)
        kids = tuple(nodes[c]["eclass"] for c in n["children"] if c not in prims)
        if op in ("let", "root") or op.startswith("v_"):
            continue
        classes.setdefault(n["eclass"], []).append(ENode(nid, op, args, kids, n["eclass"]))
    for ns in classes.values():
        ns.sort(key=lambda n: (n.op, n.args, n.id))
    return EClassGraph(classes, root_class)
