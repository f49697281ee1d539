"""The playbook proposer: rules written down from the project's measurements, and what the records learnt.

A rule is data (``l2/playbook/*.json``): which templates it is for, a
condition on the task context (``when``: an expression in the restriction
language over ``TaskContext.variables``, parsed into a tree and never
``eval``-ed), the knobs it sets (a value, ``{"pick": "max"|"min"}`` of the
knob's values, or ``{"expr": ...}`` over the same names), optionally knobs it
varies to maximise an expression (register blocks that fill the vector
registers: read off the space's ``vregs`` constant, never a fixed lane count),
and its evidence (the measurement in docs/benchmarks.md it comes from).

Learnt entries come from the records database: the best measured setting of
each earlier run of the same template on this device fingerprint, nearest
shape first, its knobs mapped onto the current space where they exist and
are valid.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from importlib import resources
from itertools import product
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..space import Candidate, Space
from ..space.restrict import RestrictionError, compile_expr, parse
from .context import TaskContext
from .proposer import Proposal, Proposals

RULE_SCHEMA = {
    "type": "object",
    "required": ["id", "templates", "when", "set", "evidence"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]*$"},
        "templates": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "when": {"type": "string", "minLength": 1},
        "set": {"type": "object", "additionalProperties": {
            "oneOf": [{"type": ["string", "integer", "number", "boolean"]},
                      {"type": "object", "required": ["pick"], "additionalProperties": False,
                       "properties": {"pick": {"enum": ["max", "min"]}}},
                      {"type": "object", "required": ["expr"], "additionalProperties": False,
                       "properties": {"expr": {"type": "string"}}}]}},
        "vary": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "maximize": {"type": "string"},
        "take": {"type": "integer", "minimum": 1, "maximum": 8},
        "prefer": {"type": "object", "required": ["value_prefix"], "additionalProperties": False,
                   "properties": {"value_prefix": {"type": "string", "minLength": 1}}},
        "evidence": {"type": "object", "required": ["source", "measured"],
                     "properties": {"source": {"type": "string"}, "section": {"type": "string"},
                                    "measured": {"type": "string"}}},
    },
    "dependentRequired": {"vary": ["maximize"], "maximize": ["vary"]},
}
RECORD_ENTRIES = 3   # learnt entries a playbook proposes at most
VARY_LIMIT = 4096    # combinations a varying rule may try


class PlaybookError(ValueError):
    """A playbook file or rule that cannot be read (names the file and the rule)."""


Env = Mapping[str, Any]


def _expr(src: str, where: str) -> Callable[[Env], Any]:
    try:
        return compile_expr(parse(src))
    except RestrictionError as e:
        raise PlaybookError(f"{where}: {e}") from None


def _holds(fn: Callable[[Env], Any], env: Env) -> bool:
    """A condition evaluated on ``env``; one that names an absent fact, or fails arithmetically, does not hold."""
    try:
        return bool(fn(env))
    except (KeyError, ZeroDivisionError, OverflowError, ValueError, TypeError):
        return False


@dataclass(frozen=True)
class Rule:
    """One playbook rule (see the module docstring); ``origin`` is the file it came from."""

    id: str
    templates: tuple[str, ...]
    when: str
    set: dict[str, Any]
    evidence: dict[str, str]
    vary: tuple[str, ...] = ()
    maximize: str = ""
    take: int = 1
    prefer: str = ""          # every gene with a value starting so takes the first such value (a graph's fusions)
    origin: str = ""
    _when: Callable[[Env], Any] = field(default=None, repr=False, compare=False)  # type: ignore[assignment]
    _objective: Callable[[Env], Any] | None = field(default=None, repr=False, compare=False)
    _exprs: dict[str, Callable[[Env], Any]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], origin: str = "") -> "Rule":
        import jsonschema

        where = f"{origin or 'playbook'}: rule {d.get('id', '?') if isinstance(d, Mapping) else '?'}"
        try:
            jsonschema.validate(d, RULE_SCHEMA)
        except jsonschema.ValidationError as e:
            path = "/".join(map(str, e.absolute_path)) or "(the rule)"
            raise PlaybookError(f"{where}: {path}: {e.message}") from None
        exprs = {k: _expr(v["expr"], f"{where}: set {k}") for k, v in d["set"].items()
                 if isinstance(v, dict) and "expr" in v}
        return cls(d["id"], tuple(d["templates"]), d["when"], dict(d["set"]), dict(d["evidence"]),
                   tuple(d.get("vary", ())), d.get("maximize", ""), d.get("take", 1),
                   (d.get("prefer") or {}).get("value_prefix", ""), origin,
                   _expr(d["when"], f"{where}: when"),
                   _expr(d["maximize"], f"{where}: maximize") if d.get("maximize") else None, exprs)

    def applies(self, ctx: TaskContext, env: Env) -> str | None:
        """None when the rule applies to ``ctx``, else why not."""
        if ctx.template not in self.templates:
            return f"for {', '.join(self.templates)}, not {ctx.template}"
        names = set(ctx.space.names)
        missing = sorted((set(self.set) | set(self.vary)) - names)
        if missing:
            return f"the space has no knob {', '.join(missing)}"
        if self.prefer and not self._preferred(ctx.space):
            return f"no gene has a value starting {self.prefer!r}"
        if not _holds(self._when, env):
            return f"condition {self.when!r} does not hold"
        return None

    def touches(self, space: Space) -> set[str]:
        """The knobs the rule sets in ``space``."""
        return set(self.set) | set(self.vary) | (set(self._preferred(space)) if self.prefer else set())

    def _preferred(self, space: Space) -> dict[str, Any]:
        """Per gene with a value starting ``prefer``, the first such value."""
        out = {}
        for k in space.knobs:
            if k.kind == "gene":
                v = next((x for x in k.values if isinstance(x, str) and x.startswith(self.prefer)), None)
                if v is not None:
                    out[k.name] = v
        return out

    def _value(self, knob, name: str, spec: Any, env: Env) -> Any:
        if isinstance(spec, dict) and "pick" in spec:
            nums = [v for v in knob.values if isinstance(v, (int, float)) and not isinstance(v, bool)]
            pool = nums or list(knob.values)
            return (max if spec["pick"] == "max" else min)(pool)
        if isinstance(spec, dict):
            try:
                return self._exprs[name](env)
            except (KeyError, ZeroDivisionError, OverflowError, ValueError, TypeError):
                return None
        return spec

    def plans(self, ctx: TaskContext, base: Mapping[str, Any], env: Env) -> list[dict[str, Any]]:
        """The rule's settings on top of ``base``: one plan, or the ``take`` best of its varied knobs (valid
        ones, by ``maximize``, ties in the space's order); [] when no varied setting is valid."""
        knobs = {k.name: k for k in ctx.space.knobs}
        plan = dict(base)
        if self.prefer:  # a gene already on a preferred value keeps it
            plan.update({k: v for k, v in self._preferred(ctx.space).items()
                         if not (isinstance(plan.get(k), str) and plan[k].startswith(self.prefer))})
        for name, spec in self.set.items():
            plan[name] = self._value(knobs[name], name, spec, {**env, **plan})
        if not self.vary:
            return [plan]
        axes = [knobs[n].values for n in self.vary]
        if math.prod(len(a) for a in axes) > VARY_LIMIT:
            return [plan]
        scored = []
        for i, values in enumerate(product(*axes)):
            p = {**plan, **dict(zip(self.vary, values))}
            if not _valid(ctx.space, p):
                continue
            try:
                score = float(self._objective({**env, **p}))  # type: ignore[misc]
            except (KeyError, ZeroDivisionError, OverflowError, ValueError, TypeError):
                continue
            scored.append((-score, i, p))
        scored.sort(key=lambda x: (x[0], x[1]))
        return [p for _, _, p in scored[:self.take]]


def _valid(space: Space, plan: Mapping[str, Any]) -> bool:
    try:
        return not space.violations(plan) and all(plan[k.name] in k.values for k in space.knobs)
    except (KeyError, TypeError):
        return False


def repair(space: Space, plan: dict[str, Any], fixed: Iterable[str]) -> dict[str, Any]:
    """``plan`` made valid by the fewest changes to knobs outside ``fixed`` (``Space.nearest_valid``); ``plan``
    as it is when that is not possible (the L2 phase then refuses it, naming the restriction)."""
    if _valid(space, plan):
        return plan
    try:
        c = space.nearest_valid(plan)
    except Exception:  # a value not of the knob (an expr's result): leave it to the refusal's message
        return plan
    if c is None or any(c[k] != plan[k] for k in fixed):
        return plan
    return c.as_dict()


def _package_files() -> list[tuple[str, str]]:
    folder = resources.files("planforge.l2") / "playbook"
    return sorted((f"planforge/l2/playbook/{p.name}", p.read_text(encoding="utf-8"))
                  for p in folder.iterdir() if p.name.endswith(".json"))


def load_rules(paths: Sequence[str | Path] = ()) -> list[Rule]:
    """The package's rules (``l2/playbook/*.json``) and those of ``paths``; PlaybookError names a bad file."""
    texts = _package_files() + [(str(p), Path(p).read_text(encoding="utf-8")) for p in paths]
    rules: list[Rule] = []
    for name, text in texts:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlaybookError(f"{name}: not JSON ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
            raise PlaybookError(f"{name}: expected an object with a 'rules' list")
        rules.extend(Rule.from_json(d, name) for d in data["rules"])
    ids = [r.id for r in rules]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise PlaybookError(f"playbook rule ids repeat: {', '.join(dup)}")
    return rules


def _dims_of(task_key: str) -> tuple[int, ...] | None:
    """The dims of a kernel task key ``op_AxB_epilogue``."""
    parts = task_key.split("_")
    try:
        return tuple(int(x) for x in parts[1].split("x")) if len(parts) > 1 else None
    except ValueError:
        return None


def learnt(records, ctx: TaskContext, target: str, exclude_run: str | None = None,
           limit: int = RECORD_ENTRIES) -> list[Proposal]:
    """The best measured plan of each earlier run of ``ctx``'s template on device ``target`` in ``records``
    (``spec.records.Records``), nearest shape first (the same task first of all), mapped onto ``ctx``'s space:
    knobs it lacks dropped, values it does not have left to the incumbent's."""
    prefix = f"{ctx.template}_"
    best: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
    for r in records.records(target=target, status="measured"):
        if r.run_id == exclude_run or not r.task.startswith(prefix) or r.outcome.metric is None:
            continue
        key = (r.run_id, r.task)
        if key not in best or r.outcome.metric < best[key][0]:
            best[key] = (r.outcome.metric, r.candidate)
    here = tuple(ctx.problem.get("dims") or ())
    knobs = {k.name: k for k in ctx.space.knobs}

    def distance(task: str) -> float:
        d = _dims_of(task)
        if d is None or len(d) != len(here):
            return math.inf
        return sum(abs(math.log2(a / b)) for a, b in zip(d, here) if a > 0 and b > 0)

    out, seen = [], set()
    for (run, task), (metric, config) in sorted(best.items(), key=lambda kv: (distance(kv[0][1]), kv[1][0])):
        plan = {k: v for k, v in config.items() if k in knobs and any(type(v) is type(x) and v == x
                                                                         for x in knobs[k].values)}
        sig = json.dumps(plan, sort_keys=True)
        if not plan or sig in seen:
            continue
        seen.add(sig)
        out.append(Proposal(plan, f"records:{task}", f"the best of run {run} on {task} ({metric:.3g} s)"))
        if len(out) >= limit:
            break
    return out


class Playbook:
    """The playbook proposer.

    Parameters:
        rules: the rules (default: the package's, ``load_rules()``).
        records: a ``spec.records.Records`` to learn from (default None: rules only).
        target: the device fingerprint whose records count (default: none learnt).
        exclude_run: a run id whose records are not learnt from (the run in progress).

    ``propose`` gives, in order: every applicable rule at once (the combination), the learnt entries, then
    each applicable rule on its own, then (when those give fewer than ``n`` distinct new plans: the rules
    agree on most knobs) the first plan's neighbours, knobs no rule sets moved first; a rule's plan is completed from the incumbent and repaired to the
    space's restrictions where changing only knobs it does not set can do it."""

    name = "playbook"

    def __init__(self, rules: Sequence[Rule] | None = None, records=None, target: str | None = None,
                 exclude_run: str | None = None):
        self.rules = list(load_rules() if rules is None else rules)
        self.records, self.target, self.exclude_run = records, target, exclude_run

    def propose(self, ctx: TaskContext, n: int) -> Proposals:
        t0 = time.perf_counter()
        env = ctx.variables()
        base = ctx.base.as_dict()
        applicable, skipped = [], {}
        for r in self.rules:
            why = r.applies(ctx, env)
            if why is None:
                applicable.append(r)
            elif ctx.template in r.templates:
                skipped[r.id] = why
        out: list[Proposal] = []
        if len(applicable) > 1:
            plan, fixed, used = dict(base), set(), []
            for r in applicable:
                if fixed & (set(r.set) | set(r.vary)) - {k for k, v in r.set.items() if plan.get(k) == v}:
                    continue  # an earlier rule chose these knobs already (two register-tile rules disagree)
                got = r.plans(ctx, plan, env)
                if got:
                    plan = got[0]
                    fixed |= r.touches(ctx.space)
                    used.append(r.id)
            out.append(Proposal(repair(ctx.space, plan, fixed), "combined:" + "+".join(used),
                                "the applicable rules at once (a rule whose knobs an earlier one set is left out)"))
        if self.records is not None and self.target:  # mapped to this shape: the fewest changes that make it valid
            out.extend(Proposal(repair(ctx.space, {**base, **p.plan}, ()), p.source, p.why)
                       for p in learnt(self.records, ctx, self.target, self.exclude_run))
        for r in applicable:
            for p in r.plans(ctx, base, env):
                out.append(Proposal(repair(ctx.space, p, r.touches(ctx.space)), r.id,
                                    r.evidence.get("measured", "")[:200]))
        if out:
            out.extend(self._fill(ctx, out, n, fixed_all={k for r in applicable for k in r.touches(ctx.space)}))
        status = "ok" if out else "skipped"
        msg = "" if out else (f"no rule applies to {ctx.template}" if not skipped
                              else f"no rule applies: {'; '.join(f'{k}: {v}' for k, v in skipped.items())}")
        return Proposals(self.name, out, status, msg, time.perf_counter() - t0,
                         {"rules": [r.id for r in applicable], "not_applicable": skipped})

    @staticmethod
    def _fill(ctx: TaskContext, out: list[Proposal], n: int, fixed_all: set[str]) -> list[Proposal]:
        """Up to ``n`` distinct new plans in all: the rules' first plan's neighbours (``Space.neighbours``),
        moves of knobs no rule set first, for when the rules alone give fewer (they agree on most knobs)."""
        from .proposer import admit

        base = ctx.base
        distinct: set[str] = set()
        first = None
        for p in out:
            c, _ = admit(ctx.space, p.plan, base)
            if c is None:
                continue
            first = first or c  # measured already or not: its neighbours are the rules' next guesses
            if c.fingerprint not in ctx.measured | ctx.screened:
                distinct.add(c.fingerprint)
        if first is None or len(distinct) >= n:
            return []
        moves = ctx.space.neighbours(first)
        moves.sort(key=lambda c: any(c[k] != first[k] for k in fixed_all))  # stable: free knobs first
        extra = []
        for c in moves:
            if len(distinct) >= n:
                break
            if c.fingerprint in distinct or c.fingerprint in ctx.measured or c.fingerprint in ctx.screened:
                continue
            distinct.add(c.fingerprint)
            changed = ", ".join(f"{k}={c[k]}" for k in ctx.space.names if c[k] != first[k])
            extra.append(Proposal(c.as_dict(), "neighbour", f"one move from the rules' plan: {changed}"))
        return extra
