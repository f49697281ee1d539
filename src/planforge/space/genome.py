"""The genome over a saturated e-graph: one gene per e-class, plus the knobs of each template.

Genes are the e-classes with more than one usable e-node; a gene's values are
the e-nodes it may choose. Each template e-node carries one more gene, its
knob setting, drawn from a fixed list of valid settings of that template's
space for that node's shapes. A genome is turned into a program by following
its choices from the root (classes not reachable under the current choices
are ignored, so mutating them changes nothing); a choice that closes a cycle
is repaired towards the greedy extraction. The fingerprint of a genome is the
hash of the program it extracts (with the knobs of the templates it uses):
two genomes that extract the same program are measured once.
"""
from __future__ import annotations

import math
import random
import weakref
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..rewrite.analysis import Analysis
from ..rewrite.egraph import EClassGraph, ENode
from ..rewrite.extract import Choice, reachable, repair
from .space import Candidate, Knob, Space, SpaceError

CONFIGS_PER_NODE = 24
MAX_MISSES = 200  # consecutive already-drawn samples after which a node's knob space counts as exhausted

# a template node's settings depend only on its problem and the target whose knob space and model rank them:
# per target (held weakly), problem -> settings, so that the same GEMM in every layer and in every task of a
# model is ranked once (GPT-2's 63 template nodes spent 15 of its 18 s of planning drawing settings)
# (targets are dataclasses, compared by value and unhashable: keyed by identity, with a weak reference that
# tells a live target from a new one at a dead one's address)
_SETTINGS: dict[int, tuple[Any, dict[tuple, list[dict[str, Any]]]]] = {}


def short(cid: str) -> str:
    """``planforge.rewrite.lang.T-14`` -> ``T14``."""
    tail = cid.rsplit(".", 1)[-1]
    return tail.replace("-", "")


def label(n: ENode, idx: int) -> str:
    args = ",".join(a for a in n.args if a != "")
    return f"{n.op}({args})#{idx}" if args else f"{n.op}#{idx}"


def knob_configs(space: Space, first: dict[str, Any], n: int, seed: int,
                 rank: Callable[[list[Candidate]], list[float]] | None = None, pool: int = 20) -> list[dict[str, Any]]:
    """Up to ``n`` distinct valid settings of a template node.

    Without ``rank``: ``first`` (a careful default, snapped to the space) then
    random ones. With ``rank`` (a cost model's predicted seconds): the ``n``
    best predicted among ``first`` and ``pool * n`` random valid settings, best
    first, so index 0 (what the extracted seed plans use) is the model's pick."""
    rng = random.Random(seed)
    cands: list[Candidate] = []
    seen: set[str] = set()
    try:  # the careful default, snapped to the nearest valid setting where this machine's rules break it
        c = space.nearest_valid({k.name: first.get(k.name, k.values[0]) for k in space.knobs})
        if c is not None:
            cands.append(c)
            seen.add(c.fingerprint)
    except (SpaceError, ValueError):
        pass
    want = n * pool if rank is not None else n
    misses = 0
    for _ in range(want * 30):
        # a small space (a GPU template's at small shapes) is exhausted long before: stop when samples keep
        # finding only settings already drawn
        if len(cands) >= want or misses >= MAX_MISSES:
            break
        c = space.sample(rng)
        if c.fingerprint not in seen:
            seen.add(c.fingerprint)
            cands.append(c)
            misses = 0
        else:
            misses += 1
    if rank is not None and len(cands) > n:
        scores = rank(cands)
        order = sorted(range(len(cands)), key=lambda i: scores[i])
        cands = [cands[i] for i in order[:n]]
    return [c.as_dict() for c in cands[:n]]


def _settings(problem: Any, knob_space: Callable[[Any], Space], defaults: Callable[[Any], dict], n: int,
              ranker: Callable[[Any, Space], Callable | None] | None) -> list[dict[str, Any]]:
    """A template node's settings (``knob_configs``, seeded by the problem, so that equal problems get equal
    settings), remembered per target when ``knob_space`` is a target's method and the problem is hashable."""
    return _ranked_settings(problem, knob_space, defaults, n, ranker)[0]


def _ranked_settings(problem: Any, knob_space: Callable[[Any], Space], defaults: Callable[[Any], dict], n: int,
                     ranker: Callable[[Any, Space], Callable | None] | None
                     ) -> tuple[list[dict[str, Any]], float | None]:
    """``_settings``, and the ranker's predicted seconds of the first (None without a model)."""
    owner = getattr(knob_space, "__self__", None)
    key = (problem, n, ranker is not None)
    memo = None
    try:
        hash(key)
        if owner is not None:
            ref, memo = _SETTINGS.get(id(owner), (None, None))
            if ref is None or ref() is not owner:
                for k in [k for k, (r, _) in _SETTINGS.items() if r() is None]:  # targets gone since
                    del _SETTINGS[k]
                memo = {}
                _SETTINGS[id(owner)] = (weakref.ref(owner), memo)
    except TypeError:  # an owner that cannot be referenced weakly, or an unhashable problem
        memo = None
    if memo is not None and key in memo:
        out, first = memo[key]
        return [dict(c) for c in out], first
    sp = knob_space(problem)
    rank = ranker(problem, sp) if ranker is not None else None
    out = knob_configs(sp, defaults(problem), n, zlib.crc32(repr(problem).encode()), rank)
    first = None
    if rank is not None and out:
        t = float(rank([sp.make(out[0])])[0])
        first = t if math.isfinite(t) and t > 0 else None
    if memo is not None:
        memo[key] = ([dict(c) for c in out], first)
    return out, first


def _stratified(problem: Any, spaces: Sequence[Callable[[Any], Space]], defaults: Callable[[Any], dict], n: int,
                ranker) -> tuple[list[dict[str, Any]], list[int]]:
    """Up to ``n`` settings: each space's best (``_settings``) in turn, the first space's first; and where each
    space's best sits among them."""
    share = max(2, -(-n // len(spaces)))
    lists = [_settings(problem, sp, defaults, share, ranker) for sp in spaces]
    out, seen, firsts = [], {}, [0] * len(lists)
    for i in range(share):
        for j, lst in enumerate(lists):
            if i < len(lst):
                key = repr(sorted(lst[i].items()))
                if key not in seen:
                    seen[key] = len(out)
                    out.append(lst[i])
                if i == 0:
                    firsts[j] = seen[key]
    keep = max(n, len(spaces))
    return out[:keep], [f if f < keep else 0 for f in firsts]


@dataclass
class Genome:
    """The plan space of a graph: build it with ``Genome.build``; ``space`` is what strategies search."""

    eg: EClassGraph
    analysis: Analysis
    allowed: dict[str, list[str]]        # class -> usable node ids (memory-pruned, available)
    fallback: Choice                      # greedy extraction: acyclic, used for cycle repair
    problems: dict[str, Any]              # template node id -> Problem / layer tuple
    configs: dict[str, list[dict]]        # template node id -> knob settings
    space: Space = field(init=False)
    genes: dict[str, str] = field(default_factory=dict)   # gene name -> class id
    knob_of: dict[str, str] = field(default_factory=dict)  # knob gene name -> node id
    # stratified node id -> where each stratum's best setting sits among its settings (``Genome.build``'s strata)
    strata_firsts: dict[str, list[int]] = field(default_factory=dict)
    # template node id -> its cost model's predicted seconds at its first setting (what the seed plans run); only
    # nodes whose template has a model and draws from one knob space
    predicted: dict[str, float] = field(default_factory=dict)

    @classmethod
    def build(cls, eg: EClassGraph, analysis: Analysis, allowed: Mapping[str, list[str]], fallback: Choice,
              knob_space: Callable[[Any], Space], defaults: Callable[[Any], dict],
              configs_per_node: int = CONFIGS_PER_NODE,
              ranker: Callable[[Any, Space], Callable | None] | None = None,
              strata: Callable[[Any], Sequence[Callable[[Any], Space]] | None] | None = None) -> "Genome":
        """``knob_space(problem)`` and ``defaults(problem)`` come from the kernel templates;
        ``ranker(problem, space)`` gives a cost model's ``predict`` for that node (or None); ``strata(problem)``
        (or None for a node without): knob spaces whose settings a node draws in equal shares, interleaved,
        instead of from ``knob_space`` (a quantised plan space: one per weight format, so that a model ranking
        the smallest format first still leaves every format among the node's settings)."""
        problems, configs, firsts, predicted = {}, {}, {}, {}
        for ns in allowed.values():
            for nid in ns:
                n = eg.node(nid)
                if n.impl in ("tmpl", "fused"):
                    p = analysis.problem(n)
                    problems[nid] = p
                    spaces = strata(p) if strata is not None else None
                    if spaces:
                        configs[nid], firsts[nid] = _stratified(p, spaces, defaults, configs_per_node, ranker)
                    else:
                        configs[nid], t = _ranked_settings(p, knob_space, defaults, configs_per_node, ranker)
                        if t is not None:
                            predicted[nid] = t
        g = cls(eg, analysis, {c: list(v) for c, v in allowed.items()}, dict(fallback), problems, configs)
        g.strata_firsts = firsts
        g.predicted = predicted
        g._make_space()
        return g

    def remake_space(self) -> None:
        """The space again after ``configs`` changed (a node's settings reordered or dropped by measurement,
        ``workloads.measured``): candidates of the old space do not carry over."""
        self._make_space()

    def _make_space(self) -> None:
        self.genes, self.knob_of = {}, {}
        knobs: list[Knob] = []
        for c in sorted(self.allowed, key=short):
            ns = self.allowed[c]
            if len(ns) > 1:
                name = f"c_{short(c)}"
                self.genes[name] = c
                knobs.append(Knob(name, tuple(label(self.eg.node(nid), i) for i, nid in enumerate(ns)), "gene"))
        for nid in sorted(self.configs, key=lambda x: (short(self.eg.node(x).eclass), x)):
            n = self.eg.node(nid)
            if len(self.configs[nid]) > 1:
                name = f"k_{short(n.eclass)}_{self.allowed[n.eclass].index(nid)}"
                self.knob_of[name] = nid
                knobs.append(Knob(name, tuple(range(len(self.configs[nid]))), "categorical"))
        if not knobs:  # a single possible plan: still a (one-point) space
            knobs.append(Knob("plan", ("only",), "gene"))
        self.space = Space(knobs, canon=self.program_json, active=self.active)

    # -- genome -> program ------------------------------------------------------
    def choice(self, config: Mapping[str, Any]) -> Choice:
        ch = dict(self.fallback)
        for name, c in self.genes.items():
            if name in config:
                idx = int(str(config[name]).rsplit("#", 1)[1])
                ch[c] = self.allowed[c][idx]
        for c, ns in self.allowed.items():
            if len(ns) == 1:
                ch[c] = ns[0]
        return repair(self.eg, ch, self.fallback)

    def active(self, config: Mapping[str, Any]) -> set[str]:
        """Genes that matter under ``config``: the classes its plan reaches, and their templates' knobs."""
        ch = self.choice(config)
        classes = set(reachable(self.eg, ch))
        live = {name for name, c in self.genes.items() if c in classes}
        live |= {name for name, nid in self.knob_of.items() if self.eg.node(nid).eclass in classes and ch.get(
            self.eg.node(nid).eclass) == nid}
        return live

    def knobs_for(self, nid: str, config: Mapping[str, Any]) -> dict[str, Any] | None:
        if nid not in self.configs:
            return None
        n = self.eg.node(nid)
        name = f"k_{short(n.eclass)}_{self.allowed[n.eclass].index(nid)}"
        return self.configs[nid][int(config.get(name, 0))]

    def program(self, config: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The extracted plan: steps in execution order (children first). A transpose that moves only axes of
        length 1 is the reshape it equals (a view, no step: ``Analysis.view_of``)."""
        ch = self.choice(config)
        steps = []
        for c in reachable(self.eg, ch):
            n = self.eg.node(ch[c])
            p = self.problems.get(n.id)
            view = self.analysis.view_of(n)
            op, args, knobs = ("lib1", ["reshape", view], None) if view is not None else \
                (n.op, list(n.args), self.knobs_for(n.id, config))
            steps.append({"cls": short(c), "op": op, "args": args,
                          "inputs": [short(k) for k in n.children], "knobs": knobs,
                          "problem": None if p is None or view is not None else p.to_json(),
                          "shape": list(self.analysis.shapes[c]) if self.analysis.shapes.get(c) else None})
        return steps

    def program_json(self, config: Mapping[str, Any]) -> list[dict[str, Any]]:
        return self.program(config)

    def candidate_of(self, choice: Choice, knob_index: int = 0, stratum: int | None = None) -> Candidate:
        """The genome that extracts ``choice`` with every template at setting ``knob_index``; with ``stratum``,
        every stratified node at that stratum's best setting (e.g. its weights in one format) and the others at
        their first."""
        cfg: dict[str, Any] = {}
        for k in self.space.knobs:
            if k.name in self.genes:
                c = self.genes[k.name]
                nid = choice.get(c, self.fallback.get(c, self.allowed[c][0]))
                cfg[k.name] = k.values[self.allowed[c].index(nid)] if nid in self.allowed[c] else k.values[0]
            elif k.name in self.knob_of:
                if stratum is None:
                    cfg[k.name] = min(knob_index, len(k.values) - 1)
                else:
                    fs = self.strata_firsts.get(self.knob_of[k.name], [])
                    cfg[k.name] = fs[stratum] if stratum < len(fs) else 0
            else:
                cfg[k.name] = k.values[0]
        return self.space.make(cfg)

    def template_steps(self, config: Mapping[str, Any]) -> list[tuple[str, Any, dict]]:
        """(node id, problem, knobs) of every template in the extracted program."""
        ch = self.choice(config)
        out = []
        for c in reachable(self.eg, ch):
            nid = ch[c]
            if nid in self.problems:
                out.append((nid, self.problems[nid], self.knobs_for(nid, config)))
        return out

    def describe(self) -> dict[str, Any]:
        n_plans = 1
        for name, c in self.genes.items():
            n_plans *= len(self.allowed[c])
        return {"eclasses": len(self.eg.classes), "enodes": self.eg.n_nodes, "genes": len(self.genes),
                "knob_genes": len(self.knob_of), "genome_size": self.space.size,
                "graph_choices": n_plans, "saturation": self.eg.stats}


__all__ = ["Genome", "knob_configs", "short"]
