"""Warm starts: what tuning the same kernel elsewhere (another device, another shape) says about this space.

A *source* is an earlier tuning of a kernel with the same knob names: the
configurations it measured and their metrics (None for a failure), from a
records database, a Kernel Tuner cache or a T4 file (``planforge.warmstart``
reads them). Times of another device or another shape are never compared
with this space's times: only their order within their own source is used,
and each source stays a group of its own.

A ``WarmStart`` maps the sources onto a target space (a configuration that
is not a valid point of it is dropped) and offers them three ways:

(a) ``seeds(k)``: the sources' best configurations, interleaved (the best of
    each source, then the second best of each, ...), proposed first by the
    ``Warmed`` wrapper around any strategy, never proposed twice;
(b) ``rows()``: ``(group, config, metric)`` rows that a strategy with a model
    takes through ``Strategy.take_prior`` / ``warm_start`` (thompson: a prior whose weight
    decays as target measurements arrive, per source weighted by how well it
    ranks what the target measured; the learned ranker: one query group per
    source);
(c) ``predict(candidates)``: the sources' mean rank as a cost model (lower
    is better), which the tuning driver uses as a funnel stage.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..space import Candidate, Space
from .strategies import Result, Strategy

# early proposals of the sources' best configurations, by default (at most a tenth of the budget, see
# search.registry.EARLY_SHARE): the value of 0, 4, 8, 16, 32 that bench/replay_transfer.py --choose picks on
# all families of the benchmark hub; left out one family at a time it picks 32 three times and 16 once
EARLY = 32
# with a cost model of the target (a CPU task's roofline at the target's shape), the early proposals are the ones
# it predicts fastest among this many times as many of the sources' best (issue 20, CPU shape pairs)
SCREEN_POOL = 4


class WarmError(ValueError):
    """Warm-start sources that cannot be used on this space."""


@dataclass
class Source:
    """One earlier tuning: ``rows`` of (configuration by knob name, metric or None for a failure)."""

    label: str
    rows: list[tuple[dict[str, Any], float | None]]
    note: str = ""  # where it came from, for the summary (another device, another shape)
    # read a numeric value above its knob's largest as that largest (``points_of``): set for planforge's own
    # records, whose blocks are bounded by the shape they were tuned at, not for recorded spaces of other tools
    clip: bool = False

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.rows[0][0]) if self.rows else frozenset()


@dataclass
class _Mapped:
    label: str
    ints: np.ndarray  # valid target points (mixed-radix integers)
    metrics: list[float | None]  # their metrics in the source
    rank: dict[int, float] = field(default_factory=dict)  # point -> rank in [0, 1], failures 1
    order: list[int] = field(default_factory=list)  # measured points, best first
    # the points the source measured as they are (no clipped twins): what models take as rows, since a model
    # that reads a row at the source's own shape must not be told that a twin it never ran took that time
    exact: dict[int, float | None] = field(default_factory=dict)


def value_index(space: Space) -> list[dict[Any, int]]:
    """Per knob, value -> its index."""
    return [{v: i for i, v in enumerate(k.values)} for k in space.knobs]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def clip_index(space: Space, lookup: list[dict[Any, int]]) -> list[tuple[float, int] | None]:
    """Per knob whose values are all numbers: (its largest value, that value's index); None for the others."""
    out: list[tuple[float, int] | None] = []
    for k in space.knobs:
        vals = list(k.values)
        if vals and all(_number(v) for v in vals):
            top = max(vals)
            out.append((top, lookup[len(out)][top]))
        else:
            out.append(None)
    return out


def lower_to_fit(space: Space, idx: tuple[int, ...], tops: list[tuple[float, int] | None]) -> tuple[int, ...] | None:
    """A configuration that breaks ``space``'s restrictions, repaired by lowering its numeric knobs (those with a
    ``clip_index`` entry): at each step the knob whose smallest lowering breaks fewer restrictions, fewest value
    steps first (``mc`` from 256 to 128 where ``mc < 2 * m`` and M = 128), until none is broken; None when no
    lowering helps."""
    idx = list(idx)
    names = space.names

    def broken(ix) -> int:
        return len(space.violations({n: k.values[i] for n, k, i in zip(names, space.knobs, ix)}))

    now = broken(idx)
    while now:
        best = None  # (value steps, knob, new index, restrictions broken)
        for i, top in enumerate(tops):
            if top is None:
                continue
            for j in range(idx[i] - 1, -1, -1):
                if best is not None and idx[i] - j >= best[0]:
                    break
                if space.knobs[i].values[j] > space.knobs[i].values[idx[i]]:
                    continue  # values need not be sorted: lower means a smaller value
                trial = idx[:i] + [j] + idx[i + 1:]
                nb = broken(trial)
                if nb < now:
                    best = (idx[i] - j, i, j, nb)
                    break
        if best is None:
            return None
        idx[best[1]], now = best[2], best[3]
    return tuple(idx)


def points_of(space: Space, rows: Iterable[tuple[Mapping[str, Any], float | None]],
              lookup: list[dict[Any, int]] | None = None, clip: bool = False) -> dict[int, float | None]:
    """``(config, metric)`` rows as valid points of ``space`` (mixed-radix integers) -> metric; a configuration
    with a value the space lacks, or outside its restrictions, is left out; one measured twice keeps its best.
    ``clip``: another shape's block that exceeds this shape's extent is read as the largest that fits, so that
    the source's best is proposed as its twin that fits rather than dropped: a numeric value above the largest
    of its knob is read as that largest, and a configuration that breaks the restrictions has its numeric knobs
    lowered until it does not (``lower_to_fit``: ``mc = 256`` -> 128 where ``mc < 2 * m`` and M = 128); the twins
    that coincide with each other or with a point the source measured itself are one point, which keeps the best
    metric."""
    lookup = lookup or value_index(space)
    tops = clip_index(space, lookup) if clip else [None] * len(space.knobs)
    best: dict[int, float | None] = {}
    for cfg, m in rows:
        try:
            idx = []
            for i, k in enumerate(space.knobs):
                v = cfg[k.name]
                j = lookup[i].get(v)
                if j is None:
                    top = tops[i]
                    if top is None or not _number(v) or not v > top[0]:
                        raise KeyError(k.name)
                    j = top[1]
                idx.append(j)
            idx = tuple(idx)
        except (KeyError, TypeError):
            continue
        if not space.is_valid_index(idx):
            idx = lower_to_fit(space, idx, tops) if clip else None
            if idx is None:
                continue
        n = space.to_int(idx)
        if n not in best or (m is not None and (best[n] is None or m < best[n])):
            best[n] = m
    return best


class Rows(list):
    """``WarmStart.rows()``: the rows, and the same as points of ``space`` by source (``points``), so that a
    model of that very space need not map every configuration back."""

    space: Space | None = None
    points: dict[str, dict[int, float | None]]


class WarmStart:
    """``sources`` mapped onto ``space``.

    Parameters:
        early: how many of the sources' best configurations ``seeds`` gives
            by default (default ``EARLY``).
    Raises ``WarmError`` when no source shares the space's knob names or
    none of their configurations is a valid point of it."""

    def __init__(self, space: Space, sources: Sequence[Source], early: int = EARLY):
        if early < 0:
            raise WarmError(f"warm start: early must be at least 0, got {early}")
        self.space, self.early = space, early
        self._rows: list | None = None
        want = frozenset(space.names)
        lookup = value_index(space)
        self.mapped: list[_Mapped] = []
        self.skipped: dict[str, str] = {}
        for s in sources:
            if s.names != want:
                self.skipped[s.label] = (f"its knobs ({', '.join(sorted(s.names))}) are not this space's "
                                         f"({', '.join(space.names)})")
                continue
            best = points_of(space, s.rows, lookup, clip=s.clip)
            if not best:
                self.skipped[s.label] = "none of its configurations is a valid point of this space"
                continue
            mp = _Mapped(s.label, np.array(list(best), dtype=np.int64), list(best.values()),
                         exact=points_of(space, s.rows, lookup) if s.clip else best)
            ok = sorted((m, n) for n, m in best.items() if m is not None)
            mp.order = [n for _, n in ok]
            denom = max(len(ok) - 1, 1)
            mp.rank = {n: i / denom for i, (_, n) in enumerate(ok)}
            for n, m in best.items():
                if m is None:
                    mp.rank[n] = 1.0
            self.mapped.append(mp)
        if not self.mapped:
            why = "; ".join(f"{k}: {v}" for k, v in self.skipped.items()) or "no sources given"
            raise WarmError(f"no warm-start source fits this space ({why})")
        self.labels = [s.label for s in sources]
        self.notes = sorted({s.note for s in sources if s.note})

    # -- (a) early proposals ------------------------------------------------------
    def order(self) -> list[int]:
        """Every source's measured points, interleaved by rank: each source's best, then each one's second..."""
        out, seen = [], set()
        for tier in range(max(len(m.order) for m in self.mapped)):
            for m in self.mapped:
                if tier < len(m.order) and m.order[tier] not in seen:
                    seen.add(m.order[tier])
                    out.append(m.order[tier])
        return out

    def seeds(self, k: int | None = None) -> list[Candidate]:
        """The first ``k`` (default ``early``) points of ``order()`` as candidates of the space."""
        k = self.early if k is None else k
        return [self.space.candidate(self.space.from_int(n)) for n in self.order()[:k]]

    # -- (b) rows for models ----------------------------------------------------------
    def rows(self) -> list[tuple[str, dict[str, Any], float | None]]:
        """``(source label, config, metric)`` for every point a source measured as it is, one group per source
        (made once); clipped twins are early proposals and ranks only."""
        if self._rows is None:
            names, knobs = self.space.names, self.space.knobs
            self._rows = Rows((m.label, {nm: k.values[i] for nm, k, i in zip(names, knobs, self.space.from_int(n))}, v)
                              for m in self.mapped for n, v in m.exact.items())
            self._rows.space = self.space
            self._rows.points = {m.label: dict(m.exact) for m in self.mapped}
        return self._rows

    # -- (c) a cost model ------------------------------------------------------------
    name = "warm-rank"

    def predict(self, candidates: Sequence[Candidate]) -> list[float]:
        """Mean rank over the sources that measured each candidate (0 best, 1 worst or failed); a
        candidate no source measured gets 0.5."""
        out = []
        for c in candidates:
            n = self.space.to_int(c.index)
            r = [m.rank[n] for m in self.mapped if n in m.rank]
            out.append(sum(r) / len(r) if r else 0.5)
        return out

    def describe(self) -> dict[str, Any]:
        d = {"sources": {m.label: len(m.ints) for m in self.mapped}, "early": self.early}
        if self.skipped:
            d["skipped"] = dict(self.skipped)
        if self.notes:
            d["notes"] = self.notes
        return d


def kendall_weight(source: Mapping[int, float], measured: Mapping[int, float], min_pairs: int = 5) -> float | None:
    """How well a source orders the target's measured points: Kendall's tau, clipped at 0 (a source that
    orders them no better than chance gets no weight); None while fewer than ``min_pairs`` points are common."""
    common = [n for n in measured if n in source]
    if len(common) < min_pairs:
        return None
    from scipy.stats import kendalltau

    a = [source[n] for n in common]
    b = [measured[n] for n in common]
    if len(set(a)) < 2 or len(set(b)) < 2:
        return None
    tau = kendalltau(a, b).statistic
    return max(0.0, float(tau)) if tau == tau else None


class Warmed(Strategy):
    """``inner`` with a warm start: the sources' best configurations first, then ``inner``'s proposals.

    ``inner`` is told every result (the early ones included) and has taken
    the sources' rows through its ``warm_start`` and ``take_prior`` (no-ops
    for a strategy without a model). ``describe()`` is ``inner``'s with the warm start added."""

    def __init__(self, inner: Strategy, warm: WarmStart, early: int | None = None, screen=None):
        super().__init__(inner.space, inner.seed, max_duplicates=inner.max_duplicates)
        self.name = inner.name
        self.inner, self.warm = inner, warm
        rows = warm.rows()
        self.taken = max(inner.warm_start(rows), inner.take_prior(rows))  # a ranker's groups, a surrogate's prior
        early = warm.early if early is None else early
        seeds = warm.seeds(early if screen is None else SCREEN_POOL * early)
        if screen is not None and seeds:
            # shape-aware: of the sources' best (which tiles this machine likes), the ones this shape's analytic
            # model predicts fastest (which of them suit this shape) go first; ties keep the sources' order
            pred = screen.predict(seeds)
            seeds = [c for _, _, c in sorted(zip(pred, range(len(seeds)), seeds), key=lambda t: t[:2])][:early]
        self._queue = list(reversed(seeds))
        self.early = len(self._queue)
        self.screened = screen is not None

    def ask(self, n: int = 1) -> list[Candidate]:
        out: list[Candidate] = []
        while self._queue and len(out) < n:
            self._offer(self._queue.pop(), out)
        if len(out) < n and not self.inner.done:
            for c in self.inner.ask(n - len(out)):
                self._offer(c, out)  # an early proposal the inner strategy made again is not proposed twice
        if not out and self.inner.done and not self._queue:
            self._stop(self.inner.stop_reason)
        return out

    def tell(self, results: Sequence[Result]) -> None:
        super().tell(results)
        self.inner.tell(results)

    def warm_start(self, rows) -> int:
        """More rows (this device's own history) for the inner strategy's model."""
        n = self.inner.warm_start(rows)
        self.taken += n
        return n

    @property
    def total_duplicates(self) -> int:  # the loop reports the strategy's duplicates
        return self._dups + self.inner.total_duplicates

    @total_duplicates.setter
    def total_duplicates(self, v: int) -> None:
        self._dups = v

    def describe(self) -> dict:
        return {**self.inner.describe(), "warm_start": {**self.warm.describe(), "early": self.early,
                                                        "early_screened": self.screened,
                                                        "rows_taken_by_model": self.taken}}


def warm_note(task: str, d: Mapping[str, Any]) -> str:
    """One line for the run's summary: what a task's search was warm-started from (``Warmed.describe()``)."""
    srcs = d.get("sources", {})
    notes = "; ".join(d.get("notes", []))
    return (f"task {task}: warm-started from {sum(srcs.values())} configurations of {len(srcs)} earlier "
            f"tuning{'s' if len(srcs) != 1 else ''} ({notes or ', '.join(srcs)}): {d.get('early', 0)} proposed "
            f"first, {d.get('rows_taken_by_model', 0)} taken by the model")


def warmed(strategy: Strategy, warm: WarmStart | None, early: int | None = None, screen=None) -> Strategy:
    """``strategy`` warm-started from ``warm`` (itself when ``warm`` is None); ``screen``: a cost model of this
    space (``predict``) that picks the ``early`` proposals among the sources' ``SCREEN_POOL * early`` best."""
    return strategy if warm is None else Warmed(strategy, warm, early, screen)


__all__ = ["EARLY", "Source", "WarmError", "WarmStart", "Warmed", "kendall_weight", "warm_note", "warmed"]
