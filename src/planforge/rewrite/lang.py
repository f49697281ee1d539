"""The rule sets that grow the e-graph, assembled from the op registry.

Each op module contributes its own rewrites (``Op.rules``) to the named rule
sets: ``epilogue`` (matmul + bias + an activation as one kernel),
``mlp_fusion`` (consecutive batch-1 layers as one kernel), ``layout`` (a
weight stored transposed), ``algebra`` (identities). ``lowering`` is built
here for every op alike: each library implementation an op declares becomes
a ``lib`` e-node, and a templated op gets a ``tmpl`` e-node (the analysis
marks it unavailable where no template can run its shapes).
"""
from __future__ import annotations

from functools import lru_cache

from egglog import rewrite, ruleset

from ..ops import REGISTRY
from ..ops.egg import LIBRARY, TEMPLATE, E, Vars

RULESET_NAMES = ("epilogue", "mlp_fusion", "layout", "algebra", "lowering")


def _arities(op) -> list[int]:
    if isinstance(op.arity, int):
        return [op.arity]
    lo, hi = op.arity
    return [n for n in (1, 2, 3) if n >= lo and (hi is None or n <= hi)]


@lru_cache(maxsize=1)
def rulesets() -> dict:
    """Rule set name -> egglog ruleset (built once, on first use)."""
    v = Vars()
    rules: dict[str, list] = {name: [] for name in RULESET_NAMES}
    for op in REGISTRY.values():
        if op.rules is not None:
            for name, rs in op.rules(E, v).items():
                if name not in rules:
                    raise ValueError(f"op {op.name!r} adds rules to an unknown rule set {name!r}; known: "
                                     f"{', '.join(RULESET_NAMES)}")
                rules[name].extend(rs)
        for n in _arities(op):
            if op.name == "concat" and n != 2:
                continue  # the e-graph holds concat as binary
            args = v.xs[:n]
            sem = E(op.name, *args, attr=v.s)
            for lib in op.library:
                rules["lowering"].append(rewrite(sem).to(LIBRARY[n](lib, v.s, *args)))
            if op.templated:
                rules["lowering"].append(rewrite(sem).to(TEMPLATE[n](op.name, v.s, *args)))
    return {name: ruleset(*rs) for name, rs in rules.items()}


def known() -> tuple[str, ...]:
    return RULESET_NAMES
