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

A setting measured over ``SLOWER`` times its problem's best, or failing to build or run, is dropped from its
node's settings, so that the search's one-knob steps from the seeds never step to it: measured as part of a whole
plan, a step to a setting 6 us slower in a 170 us part is within the host's noise, and llama-2's search kept
such a step to a SwiGLU twice as slow as its best (12 against 6 us, in both layers). A failure is said in the
task's ``measured_settings``; a target without kernel backends, or a problem its kernel backend refuses, keeps the model's
order, and says why.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

TRIALS = 16  # settings measured per distinct kernel problem (0: none, the model's order)
SECONDS = 90.0  # wall seconds a workload spends on them at most
SLOWER = 1.25  # a measured setting over this many times the best is dropped from its node's settings


@dataclass
class Measured:
    """What one workload measured so far, shared by its tasks: per problem, its settings' seconds (None: failed)
    in the order measured, and the clock."""

    trials: int = TRIALS
    seconds: float = SECONDS
    times: dict[Any, list[tuple[dict, float | None]]] = field(default_factory=dict)  # by (problem, constant)
    notes: dict[Any, str] = field(default_factory=dict)
    spent: float = 0.0


def _label(problem, constant: bool = False) -> str:
    dims = "x".join(map(str, getattr(problem, "dims", ())))
    label = f"{getattr(problem, 'op', type(problem).__name__)} {dims} {getattr(problem, 'epilogue', '')}".strip()
    return label + (" (constant weights)" if constant else "")


def measure_first_settings(genome, target, configs_of: dict[str, dict], weight: int, store: Measured,
                           seed: int = 0, constant: Callable[[str], bool] | None = None,
                           cold: bool = False) -> dict[str, Any]:
    """Measure the problems of the template nodes the lead seeds run (``configs_of``: those nodes' ids, each with a
    seed's config) that ``store`` has not measured yet, largest predicted share first (``weight``: how many times the
    task runs per model call), and reorder the settings of every node of ``genome`` whose problem ``store`` holds
    fastest first. ``constant(node id)``: whether that node's weight operand is a constant of the plan (default
    None: none is). ``cold``: the model's weights are more than the caches hold, so a kernel whose weights are
    constant is timed with them out of the caches (``Target.kernel_backend``'s ``cold_weights``; default False).
    Returns, per problem the seeds run, how many settings were measured, the first and best seconds, and how
    many of its settings were kept (``SLOWER``)."""
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
    for pk in order:
        if pk not in store.times and pk not in store.notes:
            if store.spent >= store.seconds:
                break
            _measure(pk, genome.configs[nodes[pk][0]][:store.trials], target, store, seed, cold)
    out = {}
    for pk, ts in store.times.items():
        if pk not in nodes or not ts:
            continue
        times = {repr(sorted(c.items())): t for c, t in ts}

        def place(i: int, c: dict) -> tuple:
            """Measured and ok, fastest first; then the ones not measured, in the model's order; failures last."""
            k = repr(sorted(c.items()))
            return (1, 0.0, i) if k not in times else (2, 0.0, i) if times[k] is None else (0, times[k], i)

        ok = [t for _, t in ts if t is not None]
        for nid in nodes[pk]:
            cfgs = sorted(enumerate(genome.configs[nid]), key=lambda ic: place(*ic))
            if ok:  # what measured over SLOWER x the best, or failed, is no setting to step to
                cfgs = [(i, c) for i, c in cfgs if place(i, c)[0] == 1 or
                        (place(i, c)[0] == 0 and place(i, c)[1] <= SLOWER * min(ok))]
            genome.configs[nid] = [c for _, c in cfgs]
            first = place(*cfgs[0])
            if first[0] == 0:
                genome.predicted[nid] = first[1]
        if pk in wanted:
            out[_label(*pk)] = {"measured": len(ts), "first_s": ts[0][1], "best_s": min(ok) if ok else None,
                                "kept": len(genome.configs[nodes[pk][0]])}
    for pk in wanted:  # what failed, or was refused, and why
        if pk in store.notes:
            out.setdefault(_label(*pk), {"measured": 0})["note"] = store.notes[pk]
    return out


def _measure(key: tuple[Any, bool], configs: list[dict], target, store: Measured, seed: int,
             cold: bool = False) -> None:
    t0 = time.perf_counter()
    backend = None
    problem, constant = key
    try:
        # a target without kernel backends, one refusing this problem, or a broken backend: the model's order, and why
        backend = (target.kernel_backend(problem, seed=seed, constant_weights=True, cold_weights=True)
                   if constant and cold else target.kernel_backend(problem, seed=seed, constant_weights=constant))
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


__all__ = ["Measured", "SECONDS", "TRIALS", "measure_first_settings"]
