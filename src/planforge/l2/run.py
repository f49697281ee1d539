"""The L2 phase of one task: propose, measure through the tuning loop, re-measure the best against the
incumbent, keep or revert, and record every proposal's fate.

The proposals that survive admission (``proposer.triage``) are measured by the
one tuning loop (``search.loop.search``) on the task's backend, proposed in
order by ``Queue``, a Strategy that knows nothing else; every outcome goes to
the records database through the same callback as the search's. The fastest
measured proposal is then re-measured interleaved with the incumbent
(``Backend.remeasure``): it is KEPT only when it is faster there and passes the
task's validators, else REVERTED. Fates: ``refused`` (outside the space, with
the reason), ``duplicate``, ``unmeasured`` (beyond the L2 budget), ``failed``
(its measurement's category and message), ``reverted``, ``kept``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..outcome import Outcome
from ..search.loop import Budget, Trial, search
from ..search.strategies import Strategy
from ..space import Candidate, Space
from .context import TaskContext, build_context
from .proposer import Proposals, Proposer, Verdict, shown, triage

MODES = ("off", "auto", "always")
PROPOSERS = ("playbook", "llm", "both")
DEFAULT_BUDGET = 8
REMEASURE_ROUNDS = 3


class Queue(Strategy):
    """Proposes the given candidates in order, then stops: the L2 proposals as a Strategy of the loop."""

    name = "l2-queue"

    def __init__(self, space: Space, candidates: Sequence[Candidate], seed: int = 0):
        super().__init__(space, seed)
        self._queue = list(reversed(candidates))

    def ask(self, n: int = 1) -> list[Candidate]:
        out: list[Candidate] = []
        while len(out) < n and not self.done:
            if not self._queue:
                self._stop("every L2 proposal proposed")
                break
            self._offer(self._queue.pop(), out)
        return out


@dataclass
class Fate:
    """One proposal and what became of it."""

    proposer: str
    source: str
    plan: str                 # the raw proposal, as at most SHOWN_CHARS of JSON
    fate: str
    reason: str = ""
    why: str = ""
    fingerprint: str | None = None
    latency_s: float | None = None
    remeasured_s: float | None = None
    at_s: float = 0.0         # seconds into the L2 phase when the fate was settled

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class L2Result:
    """The L2 phase of one task: every proposal's fate, each proposer's call, and the kept plan if any.

    ``kept``: the kept candidate and its outcome in the interleaved re-measurement; ``incumbent``: the plan it
    was measured against and that outcome; ``baselines``: the libraries from the same re-measurement."""

    trigger: str
    fates: list[Fate] = field(default_factory=list)
    calls: list[Proposals] = field(default_factory=list)
    trials: list[Trial] = field(default_factory=list)
    kept: tuple[Candidate, Outcome] | None = None
    incumbent: tuple[Candidate, Outcome | None] | None = None
    baselines: dict[str, Outcome] = field(default_factory=dict)
    budget: int = DEFAULT_BUDGET
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        inc = self.incumbent
        return {
            "trigger": self.trigger, "budget": self.budget, "seconds": self.seconds,
            "proposers": [c.to_json() for c in self.calls],
            "proposals": [f.to_json() for f in self.fates],
            "measured": len(self.trials),
            "kept": ({"plan": self.kept[0].as_dict(), "fingerprint": self.kept[0].fingerprint,
                      "latency_s": self.kept[1].metric,
                      "proposer": next((f.proposer for f in self.fates if f.fate == "kept"), None)}
                     if self.kept else None),
            "incumbent": ({"plan": inc[0].as_dict(), "fingerprint": inc[0].fingerprint,
                           "latency_s": inc[1].metric if inc[1] is not None else None} if inc else None),
            "counts": {k: sum(f.fate == k for f in self.fates) for k in
                       ("kept", "reverted", "failed", "refused", "duplicate", "unmeasured")},
        }


def run_l2(ctx: TaskContext, proposers: Sequence[Proposer], backend, budget: int = DEFAULT_BUDGET,
           trigger: str = "always", on_trial: Callable[[Trial], None] | None = None,
           validators: Sequence[Callable[[Candidate], str | None]] = (), rounds: int = REMEASURE_ROUNDS) -> L2Result:
    """Run L2 on the task of ``ctx``, measuring on ``backend`` at most ``budget`` proposals.

    Parameters:
        proposers: asked in order; their proposals are measured in that order.
        on_trial: called with each measurement (the driver records it in the records database).
        validators: the task's finalist validators; a faster proposal that fails one is reverted with the reason.
        rounds: rounds of the interleaved re-measurement of the best proposal, the incumbent and the
            libraries (default 3): a kept plan is compared with libraries measured beside it."""
    t0 = time.perf_counter()
    res = L2Result(trigger, budget=budget)
    now = lambda: time.perf_counter() - t0  # noqa: E731
    base = ctx.base
    for p in proposers:
        try:
            batch = p.propose(ctx, budget)
        except Exception as e:  # a proposer's own bug must not end the tuning run: it is a recorded outcome
            batch = Proposals(p.name, [], "error", f"{type(e).__name__}: {str(e)[:200]}")
        res.calls.append(batch)
    verdicts = triage(ctx.space, res.calls, base, ctx.measured, ctx.screened)
    queued: list[Verdict] = []
    by_fp: dict[str, Fate] = {}
    for v in verdicts:
        f = Fate(v.proposer, v.proposal.source, shown(v.proposal.plan), v.fate, v.reason, v.proposal.why[:200],
                 v.candidate.fingerprint if v.candidate else None, at_s=now())
        if v.fate == "queued":
            if len(queued) < budget:
                queued.append(v)
                by_fp[f.fingerprint] = f  # type: ignore[index]
            else:
                f.fate, f.reason = "unmeasured", f"beyond the L2 budget of {budget} evaluations"
        res.fates.append(f)
    if queued:
        def record(t: Trial) -> None:
            res.trials.append(t)
            if on_trial:
                on_trial(t)

        search(ctx.space, Queue(ctx.space, [v.candidate for v in queued]), backend,  # type: ignore[misc]
               Budget(evals=len(queued)), keep=len(queued), on_trial=record)
    measured: list[tuple[float, Candidate]] = []
    for t in res.trials:
        f = by_fp.get(t.candidate.fingerprint)
        if f is None:
            continue
        f.at_s = now()
        if t.outcome.ok:
            f.latency_s = t.outcome.metric
            measured.append((t.outcome.metric, t.candidate))  # type: ignore[arg-type]
        else:
            f.fate = "failed"
            f.reason = f"{t.outcome.category or t.outcome.status}: {t.outcome.message[:200]}"
    for f in by_fp.values():
        if f.fate == "queued" and f.latency_s is None:  # the loop stopped before it (a time budget): never measured
            f.fate, f.reason = "unmeasured", "the loop stopped before measuring it"
    if measured:
        best_s, best = min(measured, key=lambda x: x[0])
        _decide(res, ctx, backend, best, best_s, by_fp, validators, rounds, now)
    res.seconds = now()
    return res


def _decide(res: L2Result, ctx: TaskContext, backend, best: Candidate, best_s: float, by_fp: dict[str, Fate],
            validators, rounds: int, now) -> None:
    """Re-measure ``best`` interleaved with the incumbent, keep it if faster there and valid, revert the rest."""
    inc = ctx.incumbent
    for fp, f in by_fp.items():
        if f.fate == "queued" and fp != best.fingerprint:
            f.fate = "reverted"
            f.reason = f"measured {f.latency_s:.4g} s in the search, slower than the best proposal's {best_s:.4g} s"
    f = by_fp[best.fingerprint]
    cands = [best] if inc is None else [best, inc]  # without an incumbent the proposal stands alone
    outs, libs = backend.remeasure(cands, rounds=rounds)
    o_new, o_inc = outs[0], (outs[1] if inc is not None else None)
    res.incumbent = (inc, o_inc) if inc is not None else None
    res.baselines = dict(libs)
    f.at_s = now()
    if not o_new.ok:
        f.fate, f.reason = "failed", f"re-measurement: {o_new.category}: {o_new.message[:200]}"
        return
    f.remeasured_s = o_new.metric
    if o_inc is not None and o_inc.ok and not o_new.metric < o_inc.metric:  # type: ignore[operator]
        f.fate = "reverted"
        f.reason = (f"re-measured beside the incumbent: {o_new.metric:.4g} s vs its {o_inc.metric:.4g} s "
                    f"(not faster)")
        return
    for check in validators:
        why = check(best)
        if why:
            f.fate, f.reason = "reverted", f"faster, but rejected by a validator: {why}"
            return
    f.fate = "kept"
    f.reason = (f"re-measured beside the incumbent: {o_new.metric:.4g} s vs its {o_inc.metric:.4g} s"
                if o_inc is not None and o_inc.ok else "no measured incumbent to beat")
    res.kept = (best, o_new)


def make_proposers(which: str, records=None, target: str | None = None, exclude_run: str | None = None,
                   environ=None) -> list[Proposer]:
    """The proposers ``which`` names (``playbook``, ``llm``, ``both``), the playbook learning from ``records``
    on device ``target``."""
    from .llm import LLMProposer
    from .playbook import Playbook

    if which not in PROPOSERS:
        raise ValueError(f"unknown L2 proposer {which!r}; choose from {', '.join(PROPOSERS)}")
    out: list[Proposer] = []
    if which in ("playbook", "both"):
        out.append(Playbook(records=records, target=target, exclude_run=exclude_run))
    if which in ("llm", "both"):
        out.append(LLMProposer(environ=environ))
    return out


def trigger(mode: str, fallback: dict | None, task_level_missed: bool = False) -> str | None:
    """Why L2 runs on a task in ``mode`` (``off``, ``auto``, ``always``), or None when it does not. In
    ``auto``: the task is below the 95% rule (``fallback``: the library it falls back to), or its task-level
    target was missed."""
    if mode not in MODES:
        raise ValueError(f"unknown --l2 mode {mode!r}; choose from {', '.join(MODES)}")
    if mode == "always":
        return "always"
    if mode == "auto" and fallback:
        return f"below the 95% rule: {fallback.get('reason', fallback.get('to'))}"
    if mode == "auto" and task_level_missed:
        return "the task-level target was missed"
    return None


@dataclass(frozen=True)
class L2Settings:
    """How the driver runs L2: ``mode`` (``off``, ``auto``: after L1 on a task below the 95% rule, ``always``),
    ``budget`` (evaluations per triggered task, default ``DEFAULT_BUDGET``) and ``proposer`` (``playbook``,
    ``llm``, ``both``; default ``playbook``; the LLM sends nothing unless configured)."""

    mode: str = "off"
    budget: int = DEFAULT_BUDGET
    proposer: str = "playbook"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown --l2 mode {self.mode!r}; choose from {', '.join(MODES)}")
        if self.proposer not in PROPOSERS:
            raise ValueError(f"unknown L2 proposer {self.proposer!r}; choose from {', '.join(PROPOSERS)}")
        if self.budget < 1:
            raise ValueError(f"--l2-budget must be at least 1, got {self.budget}")

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "budget": self.budget, "proposer": self.proposer}


def task_phase(task, trials: Sequence[Trial], incumbent: tuple[Candidate, float] | None, why: str,
               settings: L2Settings, roofline=None, baselines=None, records=None, target: str | None = None,
               run_id: str | None = None, on_trial: Callable[[Trial], None] | None = None) -> L2Result:
    """L2 on a tuned ``task`` (``workloads.Task``: its space, backend, validators): the context from the
    search's ``trials`` and the ``incumbent`` (the accepted plan, re-measured), the proposers of ``settings``
    (the playbook learning from ``records`` on device ``target``, leaving out run ``run_id``), then ``run_l2``
    on the task's whole space (not the funnel's cut: a proposal may lie outside the predicted top-k)."""
    ctx = build_context(task.key, task.space, task.backend, [(t.candidate, t.outcome) for t in trials],
                        incumbent, roofline, baselines)
    proposers = make_proposers(settings.proposer, records, target, run_id)
    return run_l2(ctx, proposers, task.backend, settings.budget, why, on_trial, task.validators)
