"""Kernel settings ranked by measurement before a graph's plan search.

A graph's genome gives each template node a list of knob settings ranked by its kernel's analytic model, and the
seed plans run each node at the first. Among the model's best the predictions are nearly flat where the kernels
are not: a 32x256x256 GEMM's first six settings are all predicted at 29 us and measure 21 to 50 us, a 32x1024x256
one's 88 to 200 us; the whole-model search, a few evaluations per task over dozens of knob genes, rarely moves
them. So before the search, the plans the search starts from (the lead seeds' template steps) have each distinct
kernel problem's first ``trials`` settings measured alone, as a kernel workload measures them
(``target.kernel_backend``), and every node of that problem has its settings reordered fastest first: the seeds
then run measured kernels, and the knob genes step from them. Equal problems (the same layer in every block, in
every part) are measured once per workload; the largest by predicted time first, within ``seconds``. A kernel
whose weight operand is a constant of the plan is measured as the plan binds it (``constant_weights``: a GEMM's
B packed once when bound, not at every call; timed with the packing, a 32x1024x256 GEMM's packed settings ran
118-284 us against 98-120 as the plan runs them, and lost their places to unpacked ones).

The first settings are only the model's picks, which can all sit far from a problem's best: GPT-2's 32x1024x256
GEMM (GELU epilogue) ran the best of its model's first sixteen at 86 us, the setting gpt2-6's plan kept at 95, and
that setting one knob away (``kc`` 32 -> 256) at 80 (settings past L1 the model then failed outright). So the
problems that take a large share of a task's measured time (``REFINE_SHARE``) are then refined by measurement: a
round measures one-knob moves from the best setting so far (``Space.neighbours``: for each knob, the value its model
predicts best, the best predicted moves first; ``trials // 2`` of them), and a second round moves again from the
new best where the first found one; the settings found join their nodes' settings. Refinement has its own wall
clock (``REFINE_SECONDS`` per workload), so a model with many kernels spends no more on the first settings.

The host is shared: for seconds at a time another tenant's work can take a core, and every two-thread setting
measured then runs at about its one-thread time (a Conv-BN-ReLU layer's two-thread settings measured in such a
stretch, a one-thread one came first, the others were dropped, and the plan ran 93 us where the two-thread one runs
63). So once every problem of the call has had its first settings measured, each problem's settings within
``CONFIRM`` times its best are measured again, a pass of the other problems later, and each keeps the faster of its
two times: a stretch shorter than that gap slows one of them only. (A stretch longer than the whole measurement, or
a call with one problem, is not caught.)

Among a problem's best settings the measured times are often within a few per cent of each other, and which of them
comes first is then the host's noise at the moment each was measured: the phase-ordering bench's Conv-BN-ReLU layer,
tuned twice (once in the e-graph, once by a fixed order that reaches the same kernel), kept two settings one knob
apart whose plans then ran 1-3% apart in one process, one way or the other. So the problems refined (those taking a
large share of the task's time) then have their fastest settings, those within ``RACE`` times the best (at most
``RACE_SIZE``), measured again side by side, round by round (``Backend.remeasure``, ``RACE_ROUNDS`` rounds, every
round's samples pooled): a slow stretch then falls on all of them alike, and each ends at the best time scaled by its
pooled median over the fastest one's, so that the race orders them without moving them against the settings it did
not run. It has its own clock (``RACE_SECONDS`` per workload).

A setting measured over ``SLOWER`` times its problem's best, or failing to build or run, is dropped from its
node's settings, so that the search's one-knob steps from the seeds never step to it: measured as part of a whole
plan, a step to a setting 6 us slower in a 170 us part is within the host's noise, and llama-2's search kept
such a step to a SwiGLU twice as slow as its best (12 against 6 us, in both layers). A failure is said in the
task's ``measured_settings``; a target without kernel backends, or a problem its kernel backend refuses, keeps the model's
order, and says why.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

TRIALS = 16  # settings measured per distinct kernel problem (0: none, the model's order)
SECONDS = 90.0  # wall seconds a workload spends on them at most
SLOWER = 1.1  # a measured setting over this many times the best is dropped from its node's settings
REFINE_ROUNDS = 2  # rounds of one-knob moves from the best measured setting, trials // 2 moves each
REFINE_SECONDS = 30.0  # wall seconds a workload spends refining at most
REFINE_SHARE = 0.05  # a problem is refined when its measured best takes this share of its task's kernel time
IMPROVED = 0.01  # a round that finds no setting this much faster than the best ends the refinement
CONFIRM = 2.0  # settings within this many times their problem's best are measured a second time (``_confirm``)
RACE = 1.05  # a refined problem's settings within this many times its best are measured side by side (``_race``)
RACE_SIZE = 4  # at most this many of them, the fastest
RACE_ROUNDS = 3  # interleaved rounds of the race
RACE_SECONDS = 20.0  # wall seconds a workload spends on races at most


@dataclass
class Measured:
    """What one workload measured so far, shared by its tasks: per problem, its settings' seconds (None: failed)
    in the order measured, and the clock."""

    trials: int = TRIALS
    seconds: float = SECONDS
    rounds: int = REFINE_ROUNDS
    refine_seconds: float = REFINE_SECONDS
    times: dict[Any, list[tuple[dict, float | None]]] = field(default_factory=dict)  # by (problem, constant)
    notes: dict[Any, str] = field(default_factory=dict)
    refined: dict[Any, int] = field(default_factory=dict)  # settings measured by refinement, per problem
    confirmed: dict[Any, int] = field(default_factory=dict)  # settings measured a second time, per problem
    race_seconds: float = RACE_SECONDS
    raced: dict[Any, int] = field(default_factory=dict)  # settings measured side by side at the end, per problem
    spent: float = 0.0
    refine_spent: float = 0.0
    race_spent: float = 0.0
    caps: dict[str, float] = field(default_factory=dict)  # the current task's limit on each clock (``start_task``)

    def start_task(self, weight: float, weight_left: float) -> None:
        """A task run ``weight`` times a model call begins measuring, ``weight_left`` the weight of it and of the
        tasks after it: of what is left of each clock it may spend its weight's share, and what it leaves unspent
        passes on. (Without shares the tasks built first took the whole clock: ResNet-18's e-graph measures five
        forms of each convolution, and its last three tasks, the deepest layers and 40% of its time, had none of
        their kernels measured and ran their model's first settings.)"""
        f = min(1.0, weight / weight_left) if weight_left > 0 else 1.0
        for spent, total in self._CLOCKS.items():
            used = getattr(self, spent)
            self.caps[spent] = used + max(0.0, getattr(self, total) - used) * f

    def left(self, spent: str) -> float:
        """Seconds the current task may still spend on the clock ``spent`` ("spent", "refine_spent", "race_spent")."""
        total = getattr(self, self._CLOCKS[spent])
        return min(total, self.caps.get(spent, total)) - getattr(self, spent)

    _CLOCKS = {"spent": "seconds", "refine_spent": "refine_seconds", "race_spent": "race_seconds"}


def _label(problem, constant: bool = False) -> str:
    dims = "x".join(map(str, getattr(problem, "dims", ())))
    label = f"{getattr(problem, 'op', type(problem).__name__)} {dims} {getattr(problem, 'epilogue', '')}".strip()
    return label + (" (constant weights)" if constant else "")


def measure_first_settings(genome, target, configs_of: dict[str, dict], weight: int, store: Measured,
                           seed: int = 0, constant: Callable[[str], bool] | None = None,
                           cold: bool = False, ranker: Callable[[Any, Any], Callable | None] | None = None
                           ) -> dict[str, Any]:
    """Measure the problems of the template nodes the lead seeds run (``configs_of``: those nodes' ids, each with a
    seed's config) that ``store`` has not measured yet, largest predicted share first (``weight``: how many times the
    task runs per model call), and reorder the settings of every node of ``genome`` whose problem ``store`` holds
    fastest first. ``constant(node id)``: whether that node's weight operand is a constant of the plan (default
    None: none is). ``cold``: the model's weights are more than the caches hold, so a kernel whose weights are
    constant is timed with them out of the caches (``Target.kernel_backend``'s ``cold_weights``; default False).
    ``ranker(problem, space)``: a cost model's ``predict`` for a problem's settings (or None), which orders the
    refinement's moves (default None: in the space's order). Returns, per problem the seeds run, how many settings
    were measured (of them by refinement), the first and best seconds, and how many of its settings were kept
    (``SLOWER``)."""
    def key(nid: str) -> tuple[Any, bool]:
        return genome.problems[nid], bool(constant is not None and constant(nid))

    nodes: dict[Any, list[str]] = {}  # every node of each (problem, constant) key: equal problems keep equal settings
    for nid in genome.problems:  # a template node with one knob space (not a stratified one)
        if nid not in genome.strata_firsts:
            nodes.setdefault(key(nid), []).append(nid)
    wanted = {key(nid) for nid in configs_of if nid in genome.problems and nid not in genome.strata_firsts}
    # the largest predicted share first; a kernel no model predicts (an attention, a rotary embedding) after those,
    # in the plan's order: its settings are otherwise in its template's order, which the search rarely leaves
    # (llama-2's second attention kept a one-thread setting at 25 us where the first layer's search found 11)
    rank = {pk: i for i, pk in enumerate(dict.fromkeys(key(nid) for nid in configs_of if key(nid) in wanted))}
    order = sorted(wanted, key=lambda p: (-weight * max(genome.predicted.get(n, 0.0) for n in nodes[p]), rank[p]))
    fresh = []
    for pk in order:
        if pk not in store.times and pk not in store.notes:
            if store.left("spent") <= 0:
                break
            _measure(pk, genome.configs[nodes[pk][0]][:store.trials], target, store, seed, cold)
            fresh.append(pk)
    for pk in fresh:  # the second pass, each problem after the others' first
        if store.left("spent") <= 0:
            break
        _confirm(pk, target, store, seed, cold)
    share = {pk: weight * _best(store.times.get(pk, [])) for pk in order if _best(store.times.get(pk, [])) < math.inf}
    total = sum(share.values())
    # the problems taking a large share of this task's measured kernel time, largest first, refined, then their
    # fastest settings raced side by side, each on its own clock
    for pk in sorted(share, key=lambda p: -share[p]):
        if share[pk] < REFINE_SHARE * total:
            continue
        if pk not in store.refined and store.left("refine_spent") > 0:
            _refine(pk, target, store, seed, cold, ranker)
        if pk not in store.raced and store.left("race_spent") > 0:
            _race(pk, target, store, seed, cold)
    out = {}
    for pk, ts in store.times.items():
        if pk not in nodes or not ts:
            continue
        times = {_fp(c): t for c, t in ts}
        listed = {_fp(c) for c in genome.configs[nodes[pk][0]]}
        found = [dict(c) for c, t in ts if t is not None and _fp(c) not in listed]  # refinement's settings

        def place(i: int, c: dict) -> tuple:
            """Measured and ok, fastest first; then the ones not measured, in the model's order; failures last."""
            k = _fp(c)
            return (1, 0.0, i) if k not in times else (2, 0.0, i) if times[k] is None else (0, times[k], i)

        ok = [t for _, t in ts if t is not None]
        for nid in nodes[pk]:
            cfgs = sorted(enumerate(genome.configs[nid] + [dict(c) for c in found]), key=lambda ic: place(*ic))
            if ok:  # what measured over SLOWER x the best, or failed, is no setting to step to
                cfgs = [(i, c) for i, c in cfgs if place(i, c)[0] == 1 or
                        (place(i, c)[0] == 0 and place(i, c)[1] <= SLOWER * min(ok))]
            genome.configs[nid] = [c for _, c in cfgs]
            first = place(*cfgs[0])
            if first[0] == 0:
                genome.predicted[nid] = first[1]
        if pk in wanted:
            out[_label(*pk)] = {"measured": len(ts), "first_s": ts[0][1], "best_s": min(ok) if ok else None,
                                "kept": len(genome.configs[nodes[pk][0]]), "refined": store.refined.get(pk, 0),
                                "confirmed": store.confirmed.get(pk, 0), "raced": store.raced.get(pk, 0)}
    for pk in wanted:  # what failed, or was refused, and why
        if pk in store.notes:
            out.setdefault(_label(*pk), {"measured": 0})["note"] = store.notes[pk]
    return out


def _fp(config: dict) -> str:
    return repr(sorted(config.items()))


def _best(ts: list[tuple[dict, float | None]]) -> float:
    return min((t for _, t in ts if t is not None), default=math.inf)


def _backend(key: tuple[Any, bool], target, seed: int, cold: bool):
    problem, constant = key
    return (target.kernel_backend(problem, seed=seed, constant_weights=True, cold_weights=True)
            if constant and cold else target.kernel_backend(problem, seed=seed, constant_weights=constant))


def _moves(space, best: dict, seen: set[str], predict: Callable | None, n: int) -> list:
    """Up to ``n`` settings one knob away from ``best`` not measured yet: per knob the move ``predict`` rates best
    (without a model, the first), the best rated first."""
    per_knob: dict[str, list] = {}
    for c in space.neighbours(space.make(best)):
        if _fp(c.as_dict()) not in seen:
            knob = next(k for k, v in c.as_dict().items() if best.get(k) != v)
            per_knob.setdefault(knob, []).append(c)
    cands = [c for cs in per_knob.values() for c in cs]
    if not cands:
        return []
    t = [float(x) for x in predict(cands)] if predict is not None else [0.0] * len(cands)
    rated = dict(zip((id(c) for c in cands), t))
    firsts = [min(cs, key=lambda c: rated[id(c)]) for cs in per_knob.values()]
    # a move the model finds infeasible (a register tile that spills) is not worth a measurement
    return sorted((c for c in firsts if math.isfinite(rated[id(c)])), key=lambda c: rated[id(c)])[:n]


def _measure_again(key: tuple[Any, bool], target, store: Measured, seed: int, cold: bool, what: str, clock: str,
                   body: Callable[[Any, Any], None]) -> None:
    """``body(backend, space)`` on a kernel backend of ``key`` opened for it and closed after, its wall time added to
    ``store``'s ``clock`` attribute; an error in it is said in ``key``'s notes as ``what``, and what was measured
    before stands."""
    t0 = time.perf_counter()
    backend = None
    try:
        backend = _backend(key, target, seed, cold)
        body(backend, target.knob_space(key[0]))
    except Exception as e:
        store.notes.setdefault(key, f"{what}: {type(e).__name__}: {e}")
    finally:
        if backend is not None and hasattr(backend, "close"):
            backend.close()
        setattr(store, clock, getattr(store, clock) + time.perf_counter() - t0)


def _confirm(key: tuple[Any, bool], target, store: Measured, seed: int, cold: bool) -> None:
    """``key``'s settings measured within ``CONFIRM`` x its best measured again, each keeping the faster of its two
    times (a failure the second time keeps the first); nothing where fewer than two are that close."""
    ts = store.times.get(key, [])
    best = _best(ts)
    again = [i for i, (_, t) in enumerate(ts) if t is not None and t <= CONFIRM * best]
    if len(again) < 2:
        return

    def body(backend, space):
        outs = backend.measure([space.make(ts[i][0]) for i in again])
        for i, o in zip(again, outs):
            if o.ok:
                ts[i] = (ts[i][0], min(ts[i][1], o.metric))
        store.confirmed[key] = len(again)

    _measure_again(key, target, store, seed, cold, "second pass", "spent", body)


def _race(key: tuple[Any, bool], target, store: Measured, seed: int, cold: bool) -> None:
    """``key``'s fastest settings (within ``RACE`` x its best, at most ``RACE_SIZE``) measured again side by side for
    ``RACE_ROUNDS`` rounds; each ends at the best time so far times its pooled median over the fastest one's (one
    failing now keeps its earlier time); nothing where fewer than two are that close."""
    ts = store.times.get(key, [])
    best = _best(ts)
    store.raced[key] = 0
    close = sorted((i for i, (_, t) in enumerate(ts) if t is not None and t <= RACE * best),
                   key=lambda i: ts[i][1])[:RACE_SIZE]
    if len(close) < 2:
        return

    def body(backend, space):
        outs, _ = backend.remeasure([space.make(ts[i][0]) for i in close], libraries=(), rounds=RACE_ROUNDS)
        pooled = {i: o.metric for i, o in zip(close, outs) if o.ok}
        if len(pooled) >= 2:
            fastest = min(pooled.values())
            for i, t in pooled.items():
                ts[i] = (ts[i][0], best * t / fastest)
            store.raced[key] = len(pooled)

    _measure_again(key, target, store, seed, cold, "race", "race_spent", body)


def _refine(key: tuple[Any, bool], target, store: Measured, seed: int, cold: bool,
            ranker: Callable[[Any, Any], Callable | None] | None) -> None:
    """Rounds of one-knob moves from the best measured setting of ``key``'s problem (``_moves``), each measured;
    ends after ``store.rounds`` rounds, a round that finds nothing ``IMPROVED`` faster, or the refinement's clock."""
    t0 = time.perf_counter()
    backend = None
    store.refined[key] = 0
    try:
        space = target.knob_space(key[0])
        predict = ranker(key[0], space) if ranker is not None else None
        for _ in range(store.rounds):
            ts = store.times[key]
            best_t = _best(ts)
            if best_t == math.inf or time.perf_counter() - t0 >= store.left("refine_spent"):
                break
            best = next(c for c, t in ts if t == best_t)
            picks = _moves(space, best, {_fp(c) for c, _ in ts}, predict, max(1, store.trials // 2))
            if not picks:
                break
            backend = backend or _backend(key, target, seed, cold)
            outs = backend.measure(picks)
            ts.extend((c.as_dict(), o.metric if o.ok else None) for c, o in zip(picks, outs))
            store.refined[key] += len(picks)
            if _best(ts) > best_t * (1.0 - IMPROVED):
                break
    except Exception as e:  # the first settings' measurements stand
        store.notes.setdefault(key, f"refinement: {type(e).__name__}: {e}")
    finally:
        if backend is not None and hasattr(backend, "close"):
            backend.close()
        store.refine_spent += time.perf_counter() - t0


def _measure(key: tuple[Any, bool], configs: list[dict], target, store: Measured, seed: int,
             cold: bool = False) -> None:
    t0 = time.perf_counter()
    backend = None
    problem, constant = key
    try:
        # a target without kernel backends, one refusing this problem, or a broken backend: the model's order, and why
        backend = _backend(key, target, seed, cold)
        space = target.knob_space(problem)
        outs = backend.measure([space.make(c) for c in configs])
        store.times[key] = [(c, o.metric if o.ok else None) for c, o in zip(configs, outs)]
        bad = [o for o in outs if not o.ok]
        if bad:
            store.notes[key] = f"{len(bad)} of {len(outs)} settings failed: {bad[0].status} {bad[0].message[:200]}"
    except Exception as e:
        store.notes[key] = f"{type(e).__name__}: {e}"
    finally:
        if backend is not None and hasattr(backend, "close"):
            backend.close()
        store.spent += time.perf_counter() - t0


__all__ = ["CONFIRM", "Measured", "RACE", "RACE_ROUNDS", "RACE_SECONDS", "RACE_SIZE", "REFINE_SECONDS", "SECONDS",
           "TRIALS", "measure_first_settings"]
