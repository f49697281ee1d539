"""Kernel settings ranked by measurement before a graph's plan search (``workloads.measured``)."""
from collections import namedtuple
from types import SimpleNamespace

import pytest

from planforge.outcome import Outcome
from planforge.space import Knob, Space
from planforge.workloads.measured import Measured, measure_first_settings


P = namedtuple("P", "op dims epilogue")  # a kernel problem as the ranking reads it: hashable, labelled
GEMM, GEMM2, CONV = P("gemm", (32, 256, 256), "bias"), P("gemm", (32, 256, 1024), "bias"), P("conv", (1, 3), "odd")


class _Backend:
    """Measures a setting at ``times[tile]`` seconds; a tile of None fails to build. Side by side (``remeasure``,
    logged as ``("race", tiles)``) at ``race[tile]`` where given, else as ``measure`` does."""

    def __init__(self, times, log, race=None):
        self.times, self.log, self.race = times, log, race

    def measure(self, cands):
        self.log.extend(c["tile"] for c in cands)
        return [Outcome.invalid("compile", "no") if self.times[c["tile"]] is None else
                Outcome.measured([self.times[c["tile"]]] * 3) for c in cands]

    def remeasure(self, cands, libraries=None, rounds=3):
        assert libraries == () and rounds >= 2  # settings only, no library baselines
        self.log.append(("race", [c["tile"] for c in cands]))
        times = self.race if self.race is not None else self.times
        return [Outcome.invalid("runtime", "crashed") if times[c["tile"]] is None else
                Outcome.measured([times[c["tile"]]] * 3 * rounds) for c in cands], {}

    def close(self):
        self.log.append("closed")


class _Target:
    def __init__(self, times, refuse=(), race=None):
        self.times, self.refuse, self.log, self.race = times, set(refuse), [], race

    def knob_space(self, problem):
        return Space([Knob("tile", tuple(range(len(self.times))), "categorical")])

    def kernel_backend(self, problem, seed=0, constant_weights=False):
        if problem in self.refuse:
            raise ValueError(f"no kernel for {problem}")
        self.log.append(("const",) if constant_weights else ())
        return _Backend(self.times, self.log, self.race)


def _genome(problems: dict[str, str], n: int):
    """A genome's fields the ranking reads: node -> problem, node -> settings (tile 0..n-1, the model's order),
    node -> predicted seconds."""
    return SimpleNamespace(problems=dict(problems), strata_firsts={},
                           configs={nid: [{"tile": i} for i in range(n)] for nid in problems},
                           predicted={nid: 1.0 + i for i, nid in enumerate(problems)})


def test_settings_are_reordered_fastest_first_slow_ones_and_failures_dropped_equal_problems_measured_once():
    times = [5.0, 1.05, None, 1.0, 9.0, 3.0]  # the model's first is slow, its third fails, its fourth is fastest
    target = _Target(times)
    store = Measured(trials=5, rounds=0)  # the first settings only (refinement: below)
    g = _genome({"a": GEMM, "b": GEMM}, 6)
    info = measure_first_settings(g, target, {"a": {}, "b": {}}, 1, store)
    # five measured once for the two nodes of one problem, then the backend closed; then the two within CONFIRM x the
    # best measured again (the second pass); then the two within RACE x the best side by side, the fastest first
    first = [(), 0, 1, 2, 3, 4, "closed", (), 1, 3, "closed", (), ("race", [3, 1]), "closed"]
    assert target.log == first
    for nid in "ab":
        # measured within SLOWER x the best, fastest first, then the one not measured (5); slower ones (0: 5x,
        # 4: 9x) and the failure (2) dropped (and refinement off: no setting found beyond the model's)
        assert [c["tile"] for c in g.configs[nid]] == [3, 1, 5]
        assert g.predicted[nid] == 1.0
    assert list(info) == ["gemm 32x256x256 bias"]
    (row,) = info.values()
    assert row["measured"] == 5 and row["first_s"] == 5.0 and row["best_s"] == 1.0 and row["kept"] == 3
    assert row["refined"] == 0 and row["confirmed"] == 2 and row["raced"] == 2
    assert row["note"].startswith("1 of 5 settings failed: invalid")
    assert "1 of 5 settings failed" in next(iter(store.notes.values()))
    # another task's node of the same problem reuses the measurements
    g2 = _genome({"c": GEMM}, 6)
    measure_first_settings(g2, target, {"c": {}}, 1, store)
    assert target.log == first and [c["tile"] for c in g2.configs["c"]][:2] == [3, 1]
    assert list(store.times) == [(GEMM, False)] and store.times[GEMM, False][3] == ({"tile": 3}, 1.0)


class _Passes(_Target):
    """A host slow for the first pass of one problem: ``passes[problem][k]`` is the k-th pass's seconds per tile."""

    def __init__(self, passes):
        super().__init__(next(iter(passes.values()))[0])
        self.passes, self.count = passes, {}

    def kernel_backend(self, problem, seed=0, constant_weights=False):
        k = self.count[problem] = self.count.get(problem, -1) + 1
        self.log.append((problem.dims, k))
        return _Backend(self.passes[problem][min(k, len(self.passes[problem]) - 1)], self.log)


def test_a_second_pass_after_the_other_problems_undoes_a_slow_stretch_and_keeps_each_settings_faster_time():
    # GEMM's two-thread settings (tiles 1 and 2) measured while another tenant held the second core: 1.8x, past
    # SLOWER, so they would have been dropped; a pass later (after GEMM2's first) they run at 0.7 and 0.75
    passes = {GEMM: [[1.0, 1.8, 1.9, 5.0], [1.2, 0.7, 0.75, 1.0]], GEMM2: [[2.0, 2.1, 9.0, 2.0], [2.0, 2.1, 9.0, 2.0]]}
    target = _Passes(passes)
    store = Measured(trials=4, rounds=0)
    g = _genome({"a": GEMM, "b": GEMM2}, 4)
    info = measure_first_settings(g, target, {"a": {}, "b": {}}, 1, store)
    firsts = [e for e in target.log if isinstance(e, tuple) and e and e[0] != "race"]
    # GEMM2's first pass (the larger predicted), GEMM's, then the second passes; then GEMM2's race (2.0, 2.0 and 2.1
    # within RACE x its best; GEMM's 0.7 has none that close: not raced)
    assert firsts == [((32, 256, 1024), 0), ((32, 256, 256), 0), ((32, 256, 1024), 1), ((32, 256, 256), 1),
                      ((32, 256, 1024), 2)]
    assert target.log[-2] == ("race", [0, 3, 1])
    # GEMM: the three within CONFIRM x its best (1.0, 1.8, 1.9; not 5.0) again, each at the faster of its times
    assert [t for _, t in store.times[GEMM, False]] == [1.0, 0.7, 0.75, 5.0]
    assert [c["tile"] for c in g.configs["a"]] == [1, 2]  # 1.0 is over 1.1 x 0.7 now, and 5.0 was
    assert g.predicted["a"] == 0.7 and info["gemm 32x256x256 bias"]["confirmed"] == 3
    assert [c["tile"] for c in g.configs["b"]] == [0, 3, 1] and info["gemm 32x256x1024 bias"]["confirmed"] == 3
    # a failure the second time keeps the first pass's time
    target = _Passes({GEMM: [[1.0, 1.5], [None, 0.9]]})
    store = Measured(trials=2, rounds=0)
    g = _genome({"a": GEMM}, 2)
    measure_first_settings(g, target, {"a": {}}, 1, store)
    assert [t for _, t in store.times[GEMM, False]] == [1.0, 0.9]


def test_the_fastest_settings_are_raced_side_by_side_and_keep_their_place_against_the_others():
    # measured one at a time, tiles 0-2 came within 4% of each other, 0 first; side by side, 2 is the fastest and 0
    # 10% slower (its first time a fast moment of the host)
    times = [1.0, 1.03, 1.04, 1.08, 3.0]
    race = [1.32, 1.26, 1.2, 9.0, 9.0]  # the race's own times (its moment slower): only their ratios count
    target = _Target(times, race=race)
    store = Measured(trials=5, rounds=0)
    g = _genome({"a": CONV}, 5)
    info = measure_first_settings(g, target, {"a": {}}, 1, store)
    # the three within RACE x the best, fastest first (tile 3 at 1.08 is not, so it keeps its time unraced)
    assert target.log[-2] == ("race", [0, 1, 2])
    # each at the best so far times its ratio to the race's fastest: 2 at 1.0, 1 at 1.05, 0 at 1.1; tile 3 keeps 1.08
    assert [t for _, t in store.times[CONV, False]] == pytest.approx([1.1, 1.05, 1.0, 1.08, 3.0])
    assert [c["tile"] for c in g.configs["a"]] == [2, 1, 3, 0]  # 3.0 is past SLOWER
    assert g.predicted["a"] == pytest.approx(1.0) and info["conv 1x3 odd"]["raced"] == 3
    # at most RACE_SIZE of them, the fastest; one failing in the race keeps its earlier time
    target = _Target([1.0, 1.01, 1.02, 1.03, 1.04, 1.045], race=[1.0, None, 0.9, 1.0, 1.0, 1.0])
    store = Measured(trials=6, rounds=0)
    g = _genome({"a": CONV}, 6)
    measure_first_settings(g, target, {"a": {}}, 1, store)
    assert target.log[-2] == ("race", [0, 1, 2, 3])
    assert [t for _, t in store.times[CONV, False]] == pytest.approx([1.0 / 0.9, 1.01, 1.0, 1.0 / 0.9, 1.04, 1.045])
    assert [c["tile"] for c in g.configs["a"]][:3] == [2, 1, 4]
    # the race's clock: none at 0 s; and no race where no other setting is that close
    for times, race_s in (([1.0, 1.01], 0.0), ([1.0, 1.2], 20.0)):
        target = _Target(times, race=[2.0, 1.0])
        store = Measured(trials=2, rounds=0, race_seconds=race_s)
        g = _genome({"a": CONV}, 2)
        measure_first_settings(g, target, {"a": {}}, 1, store)
        assert not any(isinstance(e, tuple) and e and e[0] == "race" for e in target.log)
        assert [c["tile"] for c in g.configs["a"]][0] == 0


def test_a_refused_problem_keeps_the_models_order_and_says_why():
    target = _Target([2.0, 1.0], refuse={CONV})
    store = Measured(trials=2)
    g = _genome({"a": CONV, "b": GEMM}, 2)
    info = measure_first_settings(g, target, {"a": {}, "b": {}}, 1, store)
    assert [c["tile"] for c in g.configs["a"]] == [0, 1] and [c["tile"] for c in g.configs["b"]] == [1]
    assert info["conv 1x3 odd"] == {"measured": 0, "note": f"ValueError: no kernel for {CONV}"}
    assert list(store.notes) == [(CONV, False)] and list(store.times) == [(GEMM, False)]


def test_a_node_with_constant_weights_is_measured_as_its_plan_binds_it_apart_from_one_without():
    # the same GEMM with a parameter for B (packed once when its plan is loaded) and with an activation for B
    target = _Target([3.0, 1.0, 2.0])
    store = Measured(trials=3)
    g = _genome({"w": GEMM, "x": GEMM}, 3)
    info = measure_first_settings(g, target, {"w": {}, "x": {}}, 1, store, constant=lambda nid: nid == "w")
    # two problems, one of each, each measured in two passes
    assert target.log.count(("const",)) == 2 and target.log.count(()) == 2
    assert set(store.times) == {(GEMM, True), (GEMM, False)}
    assert set(info) == {"gemm 32x256x256 bias", "gemm 32x256x256 bias (constant weights)"}


def test_the_time_budget_stops_measuring_the_smaller_problems():
    target = _Target([2.0, 1.0])
    store = Measured(trials=2, seconds=0.0)
    g = _genome({"a": GEMM, "b": GEMM2}, 2)
    measure_first_settings(g, target, {"a": {}, "b": {}}, 1, store)
    assert target.log == [] and [c["tile"] for c in g.configs["a"]] == [0, 1]


def test_a_model_workloads_seeds_run_measured_kernels(profile):
    """Built for real: the lead seed's kernels have their first settings measured, each node's first setting is
    the fastest measured, the task says so, and kernel_trials=0 keeps the model's order (in the manifest)."""
    from planforge.ir import ZOO
    from planforge.workloads.models import graph_workload
    from planforge.workloads.base import WorkloadError

    g = ZOO["transformer-block"]()
    wl = graph_workload(g, "tb", kernel_trials=3)
    measured = {k: v for t in wl.tasks for k, v in t.info.get("measured_settings", {}).items()}
    assert measured and all(v["measured"] == 3 + v["refined"] for v in measured.values())
    assert any(v["refined"] > 0 for v in measured.values())  # the largest kernels refined by one-knob moves
    assert any(k.startswith("gemm") for k in measured)
    for v in measured.values():
        assert v["best_s"] is not None and v["best_s"] <= v["first_s"]
    for t in wl.tasks:  # the space indexes the settings left after the slow ones were dropped
        genome = t.backend.genome
        knobs = {k.name: k for k in t.space.knobs}
        for name, nid in genome.knob_of.items():
            assert knobs[name].values == tuple(range(len(genome.configs[nid])))
        assert t.seeds and all(t.space.is_valid(c) for c in t.seeds)
    assert wl.manifest.options["kernel_trials"] == 3 and wl.phases["kernels_s"] > 0
    plain = graph_workload(g, "tb", kernel_trials=0)
    assert not any("measured_settings" in t.info for t in plain.tasks) and plain.phases["kernels_s"] == 0
    with pytest.raises(WorkloadError, match="kernel_trials"):
        graph_workload(g, "tb", kernel_trials=-1)


def test_a_kernel_no_model_predicts_is_measured_too_after_the_predicted_ones():
    # an attention kernel has no roofline model: its settings were left in the template's order, which the search
    # rarely leaves; now it is measured after the kernels the model ranks, and its settings reordered the same way
    target = _Target([4.0, 1.0, 1.1])
    store = Measured(trials=3)
    g = _genome({"a": GEMM, "s": CONV}, 3)
    del g.predicted["s"]
    info = measure_first_settings(g, target, {"s": {}, "a": {}}, 1, store)
    # each problem's first pass, then each problem's second (the two settings within CONFIRM x its best)
    assert target.log == [(), 0, 1, 2, "closed", (), 0, 1, 2, "closed", (), 1, 2, "closed", (), 1, 2, "closed"]
    assert list(store.times) == [(GEMM, False), (CONV, False)]  # the predicted one first, whatever the plan's order
    assert [c["tile"] for c in g.configs["s"]] == [1, 2] and g.predicted["s"] == 1.0
    assert set(info) == {"gemm 32x256x256 bias", "conv 1x3 odd"}


def test_the_cpu_target_refuses_a_fused_mlp_kernel_at_once(profile):
    """A fused MLP runs inside a plan only: its kernel backend is refused when asked for (one note in the task's
    ``measured_settings``), not built and failed once per setting."""
    from planforge.targets import TargetError, get_target

    with pytest.raises(TargetError, match="inside a model's plan"):
        get_target("cpu").kernel_backend(SimpleNamespace(op="mlp", dims=(1, 4), epilogue="none"))


# -- refinement: one-knob moves from the best measured setting ------------------------------------------------------

def _tile_time(c):
    """kc 32..256 (ordered), vec 8 or 16: larger kc and vec 16 faster; (256, 16) the best at 5."""
    return 10.0 - {32: 0, 64: 1, 128: 2, 256: 3}[c["kc"]] - (2.0 if c["vec"] == 16 else 0.0)


class _Backend2:
    def __init__(self, log, time_of):
        self.log, self.time_of = log, time_of

    def measure(self, cands):
        self.log.append([(c["kc"], c["vec"]) for c in cands])
        return [Outcome.measured([self.time_of(c.as_dict())] * 3) for c in cands]

    def remeasure(self, cands, libraries=None, rounds=3):
        self.log.append(("race", [(c["kc"], c["vec"]) for c in cands]))
        return [Outcome.measured([self.time_of(c.as_dict())] * 3 * rounds) for c in cands], {}

    def close(self):
        pass


class _Target2:
    """Two knobs, ``kc`` ordered (neighbours one step away) and ``vec`` categorical; ``time_of(setting)`` seconds."""

    def __init__(self, time_of=_tile_time):
        self.log, self.time_of = [], time_of

    def knob_space(self, problem):
        return Space([Knob("kc", (32, 64, 128, 256), "pow2"), Knob("vec", (8, 16), "categorical")])

    def kernel_backend(self, problem, seed=0, constant_weights=False):
        return _Backend2(self.log, self.time_of)


def _model(problem, space):
    """A model that rates each setting by the true time (refinement's moves in the order it prefers)."""
    return lambda cands: [_tile_time(c.as_dict()) for c in cands]


def _genome2(problems, configs):
    return SimpleNamespace(problems=dict(problems), strata_firsts={},
                           configs={nid: [dict(c) for c in configs] for nid in problems},
                           predicted={nid: 1.0 for nid in problems})


def test_refinement_walks_one_knob_moves_from_the_best_and_adds_what_it_finds_to_the_settings():
    target = _Target2()
    store = Measured(trials=4)  # 2 moves a round, 2 rounds
    g = _genome2({"a": GEMM, "b": GEMM}, [{"kc": 32, "vec": 8}, {"kc": 64, "vec": 8}])  # the model's picks: 10, 9
    info = measure_first_settings(g, target, {"a": {}}, 1, store, ranker=_model)
    # the first settings, then from (64, 8) the model's best move of each knob, best rated first: vec 16 (7), kc
    # up a step (8); then from (64, 16): kc 128 (6) rated over kc 32 (8), vec 8 measured; two rounds, then done
    # (the first settings' second pass between)
    assert target.log == [[(32, 8), (64, 8)], [(32, 8), (64, 8)], [(64, 16), (128, 8)], [(128, 16)]]
    row = info["gemm 32x256x256 bias"]
    assert row["measured"] == 5 and row["refined"] == 3 and row["best_s"] == 6.0 and row["first_s"] == 10.0
    for nid in "ab":  # refinement's best joins every node of the problem, first; the rest over SLOWER dropped
        assert g.configs[nid] == [{"kc": 128, "vec": 16}]
        assert g.predicted[nid] == 6.0


def test_refinement_stops_when_a_round_finds_nothing_faster_and_skips_moves_the_model_rules_out():
    flat = lambda c: 9.0 if (c["kc"], c["vec"]) == (64, 8) else 9.5  # noqa: E731  (64, 8) already the best
    target = _Target2(flat)
    store = Measured(trials=4)
    g = _genome2({"a": GEMM}, [{"kc": 32, "vec": 8}, {"kc": 64, "vec": 8}])
    no_vec16 = lambda problem, space: lambda cands: [float("inf") if c["vec"] == 16 else 1.0 for c in cands]  # noqa
    info = measure_first_settings(g, target, {"a": {}}, 1, store, ranker=no_vec16)
    # the first settings twice, then one round: kc 128 only, vec 16 never measured
    assert target.log == [[(32, 8), (64, 8)], [(32, 8), (64, 8)], [(128, 8)]]
    assert info["gemm 32x256x256 bias"]["refined"] == 1


def test_refinement_has_its_own_clock_and_leaves_small_problems_alone():
    target = _Target2()
    store = Measured(trials=4, refine_seconds=0.0)
    g = _genome2({"a": GEMM}, [{"kc": 32, "vec": 8}, {"kc": 64, "vec": 8}])
    measure_first_settings(g, target, {"a": {}}, 1, store, ranker=_model)
    assert target.log == [[(32, 8), (64, 8)], [(32, 8), (64, 8)]] and store.refined == {}
    # two problems of one task: the one taking under REFINE_SHARE of its measured time is not refined
    big_small = lambda c: 100.0 * _tile_time(c)  # noqa: E731
    target = _Target2()
    times = {GEMM: big_small, GEMM2: _tile_time}
    target.kernel_backend = lambda problem, seed=0, constant_weights=False: _Backend2(target.log, times[problem])
    store = Measured(trials=4)
    g = _genome2({"a": GEMM, "b": GEMM2}, [{"kc": 32, "vec": 8}, {"kc": 64, "vec": 8}])
    info = measure_first_settings(g, target, {"a": {}, "b": {}}, 1, store, ranker=_model)
    assert info["gemm 32x256x256 bias"]["refined"] > 0 and info["gemm 32x256x1024 bias"]["refined"] == 0


def test_each_task_gets_its_weights_share_of_the_kernel_clocks_and_passes_on_what_it_leaves():
    """A model's tasks share the kernel clocks by weight: with a 90 s clock, a task run twice of a model whose tasks
    weigh 2 + 1 may spend 60 s; what it leaves passes to the next, which may then spend all that is left. Without
    a task begun, the whole clock is there (a one-task workload)."""
    from planforge.workloads.measured import Measured

    m = Measured(seconds=90.0, refine_seconds=30.0, race_seconds=20.0)
    assert m.left("spent") == 90.0
    m.start_task(2, 3)
    assert m.left("spent") == pytest.approx(60.0) and m.left("refine_spent") == pytest.approx(20.0)
    m.spent, m.refine_spent = 10.0, 25.0   # over its refinement share: the next is given what is left
    assert m.left("spent") == pytest.approx(50.0) and m.left("refine_spent") < 0
    m.start_task(1, 1)
    assert m.left("spent") == pytest.approx(80.0) and m.left("refine_spent") == pytest.approx(5.0)
    assert m.left("race_spent") == pytest.approx(20.0)
