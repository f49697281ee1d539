"""The Proposer protocol, and how a proposal becomes a candidate of the space or a refusal with its reason.

A proposer (the playbook, an LLM) returns plans as data: ``{knob: value}``
dicts, possibly partial (the knobs it has an opinion on; the rest are the
incumbent's). ``admit`` turns each into a ``Candidate`` of the task's space or
refuses it, naming the reason: not a mapping, an unknown knob, a value that is
not one of the knob's values (compared by type as well as value: ``true`` is
not ``1``), a broken restriction, or a plan measured already. Nothing in a
proposal is ever run as code: a value is looked up among the knob's values,
and only a value found there goes on.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from ..space import Candidate, Space
from .context import TaskContext

SHOWN_CHARS = 300  # of a raw proposal, in run.json and the report


@dataclass(frozen=True)
class Proposal:
    """One plan a proposer suggests: ``plan`` (as it came: untrusted data), ``source`` (a playbook rule's id,
    ``records:...``, ``llm``) and ``why`` (the proposer's one-line reason)."""

    plan: Any
    source: str
    why: str = ""


@dataclass
class Proposals:
    """What one call of a proposer gave: its ``proposals`` and the call's ``status`` (``ok``, ``skipped``:
    not configured or not applicable, ``error``: the call failed) with a ``message`` saying why."""

    proposer: str
    proposals: list[Proposal] = field(default_factory=list)
    status: str = "ok"
    message: str = ""
    seconds: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)  # e.g. an LLM's attempts and HTTP statuses

    def to_json(self) -> dict[str, Any]:
        return {"proposer": self.proposer, "status": self.status, "message": self.message,
                "proposals": len(self.proposals), "seconds": self.seconds, **self.detail}


class Proposer(Protocol):
    """A strategy-like plug-in for L2: given a task's context, plans to try.

    ``name`` names it in run.json and the report; ``propose(ctx, n)`` returns up to about ``n`` proposals
    (more is fine: refusals and duplicates are dropped before measuring) and never raises for a failure of
    its own (an unreachable server is ``Proposals(status="error", message=...)``)."""

    name: str

    def propose(self, ctx: TaskContext, n: int) -> Proposals: ...


def shown(plan: Any) -> str:
    """A raw proposal as at most ``SHOWN_CHARS`` characters of JSON (the report escapes it)."""
    try:
        s = json.dumps(plan, sort_keys=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        s = repr(plan)
    return s if len(s) <= SHOWN_CHARS else s[:SHOWN_CHARS] + f"... ({len(s)} characters)"


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same JSON type (``True`` is not ``1``; ``2.0`` is not ``2``)."""
    return type(a) is type(b) and a == b


def admit(space: Space, plan: Any, base: Candidate) -> tuple[Candidate | None, str]:
    """``plan`` as a candidate of ``space`` (knobs it does not name taken from ``base``), or None and why not."""
    if not isinstance(plan, dict):
        return None, f"a plan must be an object of knob -> value, got {type(plan).__name__}"
    knobs = {k.name: k for k in space.knobs}
    unknown = sorted(str(k)[:40] for k in plan if k not in knobs)
    if unknown:
        return None, f"unknown knob{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} " \
                     f"(the space's knobs: {', '.join(knobs)})"
    config = base.as_dict()
    for name, value in plan.items():
        k = knobs[name]
        match = next((v for v in k.values if _same(v, value)), None)
        if match is None:
            if isinstance(value, float) and value.is_integer():  # 8.0 from a JSON writer that only has numbers
                match = next((v for v in k.values if _same(v, int(value))), None)
        if match is None:
            return None, f"{name}={shown(value)[:60]} is not one of its values {list(k.values)}"
        config[name] = match
    c = space.make(config)
    if not space.is_valid(c):
        return None, f"violates: {'; '.join(space.violations(config))}"
    return c, ""


@dataclass
class Verdict:
    """A proposal after admission: its candidate (None when refused) and the reason of a refusal or a
    duplicate (``fate``: ``queued``, ``refused``, ``duplicate``)."""

    proposer: str
    proposal: Proposal
    candidate: Candidate | None
    fate: str
    reason: str = ""


def triage(space: Space, batches: Sequence[Proposals], base: Candidate, measured: frozenset[str],
           screened: frozenset[str] = frozenset()) -> list[Verdict]:
    """Every proposal of ``batches`` admitted or refused, in order, and deduplicated against ``measured``
    (fingerprints of plans measured already), ``screened`` (refused by the search before measuring) and the
    proposals before it."""
    seen: dict[str, str] = {}
    out: list[Verdict] = []
    for b in batches:
        for p in b.proposals:
            c, why = admit(space, p.plan, base)
            if c is None:
                out.append(Verdict(b.proposer, p, None, "refused", why))
            elif c.fingerprint in measured:
                out.append(Verdict(b.proposer, p, c, "duplicate", "measured already by the search"))
            elif c.fingerprint in screened:
                out.append(Verdict(b.proposer, p, c, "duplicate", "refused by the search's screen before measuring"))
            elif c.fingerprint in seen:
                out.append(Verdict(b.proposer, p, c, "duplicate", f"the same plan as {seen[c.fingerprint]}'s"))
            else:
                seen[c.fingerprint] = f"{b.proposer}:{p.source}"
                out.append(Verdict(b.proposer, p, c, "queued"))
    return out
