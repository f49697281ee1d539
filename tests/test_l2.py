"""L2: admission of proposals, keep/revert on a synthetic table (exact), the playbook's rules and records."""
from __future__ import annotations

import json

import pytest

from planforge.l2 import Proposal, Proposals, Queue, TaskContext, admit, build_context, run_l2, trigger
from planforge.l2.playbook import Playbook, PlaybookError, Rule, learnt, load_rules
from planforge.l2.run import make_proposers
from planforge.outcome import Outcome
from planforge.space import Space, categorical
from planforge.targets.cpu.templates import Limits
from planforge.targets.cpu.templates import gemm as gemm_t
from planforge.targets.cpu.templates import gemv as gemv_t
from planforge.targets.table import TableBackend


def table_space() -> Space:
    return Space([categorical("a", (1, 2, 4, 8)), categorical("b", ("x", "y"))], ["a * b_w <= 8"],
                 constants={"b_w": 1})


TIMES = {(1, "x"): 5e-6, (2, "x"): 3e-6, (4, "x"): 4e-6, (8, "x"): 6e-6,
         (1, "y"): 7e-6, (2, "y"): 2e-6, (4, "y"): 5e-6, (8, "y"): 9e-6}


def table(times=TIMES):
    sp = table_space()
    return sp, TableBackend({sp.make({"a": a, "b": b}).fingerprint: t for (a, b), t in times.items()}, label="l2")


class Fixed:
    """A proposer that returns the given plans (the test's stand-in for the playbook or an LLM)."""

    def __init__(self, plans, name="fixed"):
        self.plans, self.name = plans, name

    def propose(self, ctx, n):
        return Proposals(self.name, [Proposal(p, f"p{i}") for i, p in enumerate(self.plans)])


def context(sp, backend, measured_plans=({"a": 1, "b": "x"},)):
    trials = [(c, backend.measure([c])[0]) for c in (sp.make(p) for p in measured_plans)]
    return build_context("t", sp, backend, trials)


# -- admission ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("plan, reason", [
    ({"c": 1}, "unknown knob 'c' (the space's knobs: a, b)"),
    ({"a": 3}, "a=3 is not one of its values [1, 2, 4, 8]"),
    ({"a": True}, "a=true is not one of its values"),          # a bool is not the int 1
    ({"a": "2"}, "a=\"2\" is not one of its values"),           # nor is a string
    ({"b": "__import__('os').system('rm -rf /')"}, "is not one of its values ['x', 'y']"),
    ([["a", 2]], "a plan must be an object of knob -> value, got list"),
    ("a=2; rm -rf /", "a plan must be an object of knob -> value, got str"),
])
def test_out_of_space_proposals_are_refused_with_the_reason(plan, reason):
    sp, _ = table()
    c, why = admit(sp, plan, sp.make({"a": 1, "b": "x"}))
    assert c is None and reason in why


def test_restrictions_refuse_and_partial_plans_complete_from_the_incumbent():
    sp = Space([categorical("a", (1, 2, 4, 8)), categorical("b", (1, 2))], ["a * b <= 8"])
    base = sp.make({"a": 2, "b": 2})
    c, why = admit(sp, {"a": 8}, base)
    assert c is None and why == "violates: a * b <= 8"
    c, why = admit(sp, {"b": 1}, base)
    assert why == "" and c.as_dict() == {"a": 2, "b": 1}
    c, _ = admit(sp, {"a": 4.0}, base)  # a JSON writer with only numbers: 4.0 is the int 4
    assert c["a"] == 4 and type(c["a"]) is int


# -- keep / revert on a synthetic table -----------------------------------------------------------------------------

def test_the_fastest_proposal_is_kept_exactly_and_the_rest_reverted():
    sp, be = table()
    ctx = context(sp, be)
    assert ctx.incumbent.as_dict() == {"a": 1, "b": "x"} and ctx.incumbent_s == 5e-6
    seen = []
    res = run_l2(ctx, [Fixed([{"a": 4}, {"a": 2}, {"a": 8, "b": "y"}, {"a": 2, "b": "y"}])], be, budget=8,
                 on_trial=seen.append)
    fates = {f.source: f for f in res.fates}
    assert [f.fate for f in res.fates] == ["reverted", "reverted", "reverted", "kept"]
    assert fates["p3"].latency_s == 2e-6 and fates["p3"].remeasured_s == 2e-6
    assert res.kept[0].as_dict() == {"a": 2, "b": "y"} and res.incumbent[1].metric == 5e-6
    assert "slower than the best proposal's 2e-06 s" in fates["p0"].reason
    assert len(seen) == 4 and all(t.outcome.ok for t in seen)  # every measurement goes to the records callback
    out = res.to_json()
    assert out["kept"]["proposer"] == "fixed" and out["counts"]["kept"] == 1 and out["measured"] == 4
    json.dumps(out)  # plain JSON


def test_no_proposal_faster_than_the_incumbent_is_kept():
    sp, be = table()
    ctx = context(sp, be, [{"a": 2, "b": "y"}])  # the incumbent is the table's optimum
    res = run_l2(ctx, [Fixed([{"a": 2, "b": "x"}, {"a": 1}])], be)
    assert res.kept is None and [f.fate for f in res.fates] == ["reverted", "reverted"]
    assert "not faster" in res.fates[0].reason


def test_a_tie_with_the_incumbent_is_reverted():
    times = dict(TIMES)
    times[(4, "y")] = times[(1, "x")]
    sp, be = table(times)
    res = run_l2(context(sp, be), [Fixed([{"a": 4, "b": "y"}])], be)
    assert res.kept is None and res.fates[0].fate == "reverted"
    assert "5e-06 s vs its 5e-06 s (not faster)" in res.fates[0].reason


def test_a_faster_proposal_that_fails_a_validator_is_reverted_with_its_reason():
    sp, be = table()
    res = run_l2(context(sp, be), [Fixed([{"a": 2, "b": "y"}])], be,
                 validators=[lambda c: "too much memory" if c["b"] == "y" else None])
    assert res.kept is None and res.fates[0].fate == "reverted" and "too much memory" in res.fates[0].reason


def test_refusals_duplicates_the_budget_and_failures_are_recorded():
    times = dict(TIMES)
    del times[(4, "y")]  # the table lacks it: measuring it fails
    sp, be = table(times)
    ctx = context(sp, be)
    plans = [{"zz": 1}, {"a": 1}, {"a": 2}, {"a": 2, "b": "x"}, {"a": 4, "b": "y"}, {"b": "y"}, {"a": 8}]
    res = run_l2(ctx, [Fixed(plans)], be, budget=3)
    got = [(f.source, f.fate) for f in res.fates]
    assert got == [("p0", "refused"), ("p1", "duplicate"), ("p2", "kept"), ("p3", "duplicate"), ("p4", "failed"),
                   ("p5", "reverted"), ("p6", "unmeasured")]
    assert res.fates[1].reason == "measured already by the search"
    assert res.fates[3].reason == "the same plan as fixed:p2's"
    assert res.fates[4].reason == "constraints: a=4 b=y is not in table 'l2'"
    assert res.fates[6].reason == "beyond the L2 budget of 3 evaluations"


def test_a_proposer_that_raises_is_a_recorded_error_and_changes_nothing():
    class Broken:
        name = "broken"

        def propose(self, ctx, n):
            raise RuntimeError("bug")

    sp, be = table()
    res = run_l2(context(sp, be), [Broken()], be)
    assert res.kept is None and res.fates == [] and res.calls[0].status == "error"
    assert res.calls[0].message == "RuntimeError: bug"


def test_the_queue_strategy_proposes_in_order_once():
    sp, _ = table()
    cs = [sp.make({"a": a, "b": "x"}) for a in (4, 1, 2)]
    q = Queue(sp, cs + [cs[0]])
    assert q.ask(2) == cs[:2] and q.ask(5) == cs[2:] and q.ask(1) == [] and q.done


def test_the_trigger():
    assert trigger("off", {"to": "numpy"}) is None
    assert trigger("always", None) == "always"
    assert trigger("auto", None) is None
    assert trigger("auto", {"to": "numpy", "reason": "r"}) == "below the 95% rule: r"
    assert trigger("auto", None, task_level_missed=True) == "the task-level target was missed"
    with pytest.raises(ValueError, match="unknown --l2 mode 'sometimes'; choose from off, auto, always"):
        trigger("sometimes", None)
    with pytest.raises(ValueError, match="unknown L2 proposer 'oracle'"):
        make_proposers("oracle")


# -- the playbook ---------------------------------------------------------------------------------------------------

AVX2 = Limits("avx2-like", 8, 16, 4, {"L1d": 32 * 1024, "L2": 1 << 20, "L3": 16 << 20})
AVX512 = Limits("avx512-like", 16, 32, 2, {"L1d": 48 * 1024, "L2": 2 << 20, "L3": 105 << 20})


def device(lim: Limits) -> dict:
    return {"physical_cores": lim.physical_cores, "vector_lanes_fp32": lim.vector_lanes,
            "caches": {k: {"bytes": v, "instances": lim.physical_cores if k != "L3" else 1}
                       for k, v in lim.caches.items()}}


def kernel_ctx(template: str, dims, lim: Limits, incumbent=None) -> TaskContext:
    sp = gemm_t.space(*dims, lim) if template == "gemm" else gemv_t.space(*dims, lim)
    inc = sp.make(incumbent) if incumbent else next(sp.enumerate())
    return TaskContext(f"{template}_{'x'.join(map(str, dims))}_bias_relu", template,
                       {"op": template, "dims": list(dims)}, sp, device(lim), inc, 1e-5)


def test_the_package_rules_load_and_each_names_its_evidence():
    rules = load_rules()
    assert len(rules) >= 8
    for r in rules:
        assert r.evidence["source"] and r.evidence["measured"], r.id


@pytest.mark.parametrize("lim", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_register_blocks_come_from_the_profiles_register_count(lim):
    ctx = kernel_ctx("gemm", (64, 512, 512), lim)
    got = Playbook().propose(ctx, 8)
    assert got.status == "ok"
    half = next(p for p in got.proposals if p.source == "gemm-half-the-vector-registers")
    fill = next(p for p in got.proposals if p.source == "gemm-fill-vector-registers")
    vregs = lim.vector_registers
    assert half.plan["mr"] * half.plan["nv"] == vregs // 2
    assert half.plan["vec"] == lim.vector_lanes  # the widest vector the profile has, not a fixed 16
    # the largest tile the register restriction allows
    best = max(m * n for m in (1, 2, 3, 4, 6, 8, 12) for n in (1, 2, 3, 4) if m * n + n + 1 <= vregs and m <= 64)
    assert fill.plan["mr"] * fill.plan["nv"] == best
    for p in got.proposals:  # every playbook proposal is inside the space
        c, why = admit(ctx.space, p.plan, ctx.base)
        assert c is not None, (p.source, why)


def test_gemv_rules_follow_the_weights_against_the_caches():
    small = Playbook().propose(kernel_ctx("gemv", (256, 256), AVX512), 8)
    big = Playbook().propose(kernel_ctx("gemv", (1024, 1024), AVX512), 8)
    assert "gemv-one-core-when-call-bound" in small.detail["rules"]
    assert "gemv-split-when-weights-fill-one-l2" not in small.detail["rules"]
    assert "gemv-split-when-weights-fill-one-l2" in big.detail["rules"]
    split = next(p for p in big.proposals if p.source == "gemv-split-when-weights-fill-one-l2")
    assert split.plan["threads"] == AVX512.physical_cores and split.plan["w_layout"] == "packed"
    assert big.proposals[0].source.startswith("combined:")


def test_a_template_without_rules_is_skipped_with_the_reason():
    sp, be = table()
    got = Playbook().propose(context(sp, be), 8)
    assert got.status == "skipped" and got.proposals == [] and "no rule applies to table" in got.message


def test_a_bad_rule_names_its_file_and_id(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rules": [{"id": "x", "templates": ["gemm"], "when": "__import__('os')",
                                          "set": {}, "evidence": {"source": "s", "measured": "m"}}]}))
    with pytest.raises(PlaybookError, match=r"bad.json: rule x: when: .*not allowed|bad.json: rule x: when"):
        load_rules([bad])
    bad.write_text(json.dumps({"rules": [{"id": "y", "templates": ["gemm"], "when": "True", "set": {}}]}))
    with pytest.raises(PlaybookError, match="bad.json: rule y: .*'evidence' is a required property"):
        load_rules([bad])
    bad.write_text("{")
    with pytest.raises(PlaybookError, match="bad.json: not JSON"):
        load_rules([bad])


def test_a_condition_on_an_absent_fact_does_not_hold():
    r = Rule.from_json({"id": "z", "templates": ["gemv"], "when": "no_such_fact > 1", "set": {"vec": 4},
                        "evidence": {"source": "s", "measured": "m"}})
    ctx = kernel_ctx("gemv", (256, 256), AVX2)
    assert "does not hold" in r.applies(ctx, ctx.variables())


def test_the_playbook_learns_the_best_setting_of_earlier_runs_from_the_records(tmp_path):
    from planforge.spec import Records

    ctx = kernel_ctx("gemv", (512, 512), AVX512)
    sp = ctx.space
    good = next(c for c in sp.enumerate() if c["jb"] == 4 and c["w_layout"] == "packed" and c["threads"] == 2)
    slow = next(c for c in sp.enumerate() if c["jb"] == 1)
    db = Records(tmp_path / "r.db")
    run, _ = db.start_run("gemv", "k", {"x": 1})
    for c, t in ((good, 2e-6), (slow, 9e-6)):
        db.add(run, "k", "gemv_256x256_bias_relu", "dev", c.fingerprint, {**c.as_dict(), "gone": 1},
               Outcome.measured([t]), 1)
    db.add(run, "k", "gemm_8x8x8_bias_relu", "dev", "f", {"mr": 1}, Outcome.measured([1e-7]), 2)
    got = learnt(db, ctx, "dev")
    assert [p.plan for p in got] == [good.as_dict()] and got[0].source == "records:gemv_256x256_bias_relu"
    assert learnt(db, ctx, "other-device") == [] and learnt(db, ctx, "dev", exclude_run=run) == []
    props = Playbook(records=db, target="dev").propose(ctx, 8).proposals
    assert any(p.source.startswith("records:") for p in props)
    # at a shape where the learnt jb=4 breaks a restriction (jb * vec <= n) it is mapped to the nearest valid plan
    narrow = kernel_ctx("gemv", (32, 512), AVX512)
    mapped = [p for p in Playbook(records=db, target="dev").propose(narrow, 8).proposals
              if p.source.startswith("records:")]
    assert mapped and all(admit(narrow.space, p.plan, narrow.base)[0] is not None for p in mapped)
    assert mapped[0].plan["jb"] * mapped[0].plan["vec"] <= 32 and mapped[0].plan["w_layout"] == "packed"
    db.close()


# -- through the driver: the drill (a table, exact) and the CLI on a tiny GEMM ------------------------------------

def drill_plans():
    """The drill's valid plans (passing its validators) by table time, and one invalid but fast plan."""
    from planforge.workloads import load_workload

    task = load_workload("drill").tasks[0]
    ok = sorted(((task.backend.table[c.fingerprint], c.as_dict()) for c in task.space.enumerate()
                if not any(v(c) for v in task.validators)), key=lambda x: x[0])
    bad = min(((task.backend.table[c.fingerprint], c.as_dict()) for c in task.space.enumerate()
               if any(v(c) for v in task.validators)), key=lambda x: x[0])
    return ok, bad


def tune_drill(tmp_path, monkeypatch, plans, mode="always"):
    import planforge.l2.run as l2run
    from planforge.l2 import L2Settings
    from planforge.search import Budget
    from planforge.tuning import tune
    from planforge.workloads import load_workload

    monkeypatch.setattr(l2run, "make_proposers", lambda *a, **k: [Fixed(plans)])
    return tune(load_workload("drill"), strategy="random", budget=Budget(evals=2), seed=0, out=tmp_path,
                l2=L2Settings(mode, budget=4))


def test_the_driver_keeps_a_faster_valid_proposal_and_the_spec_says_it_came_from_l2(tmp_path, monkeypatch):
    from planforge.spec import Records

    ok, _ = drill_plans()
    (t_best, best), (t_mid, mid) = ok[0], ok[len(ok) // 2]
    res = tune_drill(tmp_path, monkeypatch, [mid, best])
    t = next(iter(res.spec["tasks"].values()))
    assert t["plan"] == best and t["latency_s"] == t_best and t["rank"] == 1
    assert t["l2"]["proposer"] == "fixed" and t["l2"]["trigger"] == "always" and t["l2"]["latency_s"] == t_best
    assert t["search"]["evaluations"] == 2  # the search's own figures stand as they were
    run = json.loads((tmp_path / "run.json").read_text())
    l2 = next(iter(run["tasks"].values()))["l2"]
    assert [(f["source"], f["fate"]) for f in l2["proposals"]] in ([("p0", "reverted"), ("p1", "kept")],
                                                                   [("p0", "duplicate"), ("p1", "kept")])
    html = (tmp_path / "report.html").read_text()
    assert "Proposals (L2)" in html and "kept" in html
    with Records(tmp_path / "records.db") as db:  # the proposals' measurements are in the records
        fps = {r.fingerprint for r in db.records(run_id=res.run_id)}
    assert res.tasks[0].walk.accepted.candidate.fingerprint in fps


def test_the_driver_reverts_slower_and_invalid_proposals_and_the_spec_is_unchanged(tmp_path, monkeypatch):
    from planforge.search import Budget
    from planforge.tuning import tune
    from planforge.workloads import load_workload

    ok, (t_bad, bad) = drill_plans()
    plain = tune(load_workload("drill"), strategy="random", budget=Budget(evals=2), seed=0, out=tmp_path / "plain")
    p0 = next(iter(plain.spec["tasks"].values()))
    slower = [p for t, p in ok if t > p0["latency_s"]][-1]
    assert t_bad < p0["latency_s"]  # the invalid plan is faster than what the search accepted
    res = tune_drill(tmp_path / "l2", monkeypatch, [slower, bad])
    t = next(iter(res.spec["tasks"].values()))
    assert "l2" not in t and t["plan"] == p0["plan"] and t["latency_s"] == p0["latency_s"]
    fates = res.tasks[0].l2["proposals"]
    assert [f["fate"] for f in fates] == ["reverted", "reverted"]
    assert "rejected by a validator" in fates[1]["reason"]  # faster, but the drill's validators reject it


def test_auto_leaves_a_task_without_a_library_alone(tmp_path, monkeypatch):
    ok, _ = drill_plans()
    res = tune_drill(tmp_path, monkeypatch, [ok[0][1]], mode="auto")  # the drill has no library: no 95% rule
    assert res.tasks[0].l2 is None and "l2" not in next(iter(res.spec["tasks"].values()))


def test_cli_l2_always_on_a_tiny_gemm_shows_the_proposals(cli, tmp_path):
    out = tmp_path / "out"
    cli("tune", "--workload", "gemm", "--shape", "8,32,32", "--budget", "3", "--l2", "always", "--out", str(out),
        "-q", cwd=tmp_path, check=True)
    run = json.loads((out / "run.json").read_text())
    l2 = next(iter(run["tasks"].values()))["l2"]
    assert l2["trigger"] == "always" and l2["proposers"][0]["proposer"] == "playbook"
    assert l2["proposers"][0]["status"] == "ok" and l2["proposals"]
    assert {f["proposer"] for f in l2["proposals"]} == {"playbook"}
    assert all(f["fate"] in ("kept", "reverted", "failed", "refused", "duplicate", "unmeasured")
               for f in l2["proposals"])
    assert sum(f["fate"] in ("kept", "reverted", "failed") for f in l2["proposals"]) == l2["measured"] <= 8
    html = (out / "report.html").read_text()
    assert "Proposals (L2)" in html and "gemm-half-the-vector-registers" in html
    spec = json.loads((out / "spec.json").read_text())
    t = next(iter(spec["tasks"].values()))
    assert ("l2" in t) == (l2["kept"] is not None and l2["kept"]["fingerprint"] == t["fingerprint"])


def test_cli_refuses_a_bad_l2_setting(cli, tmp_path):
    r = cli("tune", "--workload", "drill", "--l2", "sometimes", cwd=tmp_path)
    assert r.returncode != 0 and "unknown --l2 mode 'sometimes'; choose from off, auto, always" in r.stderr
    r = cli("tune", "--workload", "drill", "--l2", "always", "--l2-proposer", "oracle", cwd=tmp_path)
    assert r.returncode != 0 and "unknown L2 proposer 'oracle'" in r.stderr


def test_a_plan_the_search_screened_out_is_not_proposed_again():
    sp, be = table()
    c0, c1 = sp.make({"a": 1, "b": "x"}), sp.make({"a": 2, "b": "y"})
    ctx = build_context("t", sp, be, [(c0, be.measure([c0])[0]), (c1, Outcome.rejected("bound slower than best"))])
    assert c1.fingerprint in ctx.screened and c1.fingerprint not in ctx.measured
    res = run_l2(ctx, [Fixed([{"a": 2, "b": "y"}])], be)
    assert res.fates[0].fate == "duplicate" and res.fates[0].reason == "refused by the search's screen before measuring"


def test_auto_runs_l2_on_every_task_when_the_task_level_target_is_missed(tmp_path, profile, monkeypatch):
    import planforge.endtoend as endtoend
    from planforge.ir.zoo import transformer
    from planforge.l2 import L2Settings
    from planforge.search import Budget
    from planforge.targets.cpu.target import CpuTarget
    from planforge.tuning import tune
    from planforge.workloads.models import graph_workload

    # the whole plan misses its target whatever this machine measures: every task is then given L2
    monkeypatch.setattr(endtoend.EndToEnd, "holds", property(lambda self: False))
    made = []  # the model's runtimes are exported and loaded once, even when a kept L2 plan re-measures the chain
    real_peers = endtoend._peers
    monkeypatch.setattr(endtoend, "_peers", lambda *a: made.append(1) or real_peers(*a))
    wl = graph_workload(transformer(layers=2, seq=6, width=16, heads=2), "t2", whole_below=0,
                        target=CpuTarget(profile))
    res = tune(wl, budget=Budget(evals=6), seed=0, out=tmp_path, l2=L2Settings("auto", budget=2))
    assert res.ok and res.end_to_end is not None
    triggers = {tr.task.key: tr.l2["trigger"] for tr in res.tasks}
    assert set(triggers) == {t.key for t in wl.tasks}
    assert all(t == "the task-level target was missed" or t.startswith("below the 95% rule") for t in triggers.values())
    assert "the task-level target was missed" in triggers.values() or all(tr.fallback for tr in res.tasks)
    run = json.loads((tmp_path / "run.json").read_text())
    assert all(t["l2"] is not None for t in run["tasks"].values())
    assert any("L2 (" in n for n in run["notes"])
    assert made == [1]


def test_a_graph_rule_prefers_the_fused_e_nodes():
    from planforge.space import gene

    sp = Space([gene("c1", ("lib2(matmul)#0", "fused_mlp#1")), gene("c2", ("fused_mlp#0", "lib1(relu)#1")),
                gene("c3", ("lib1(relu)#0", "tmpl1(relu)#1"))])
    inc = sp.make({"c1": "lib2(matmul)#0", "c2": "lib1(relu)#1", "c3": "tmpl1(relu)#1"})
    ctx = TaskContext("graph", "graph", {}, sp, None, inc, 1e-5)
    got = Playbook().propose(ctx, 4)
    fused = next(p for p in got.proposals if p.source == "graph-fuse-the-mlp")
    assert fused.plan == {"c1": "fused_mlp#1", "c2": "fused_mlp#0", "c3": "tmpl1(relu)#1"}
    assert "graph-fuse-the-mlp" in got.detail["rules"]
    plain = Space([gene("c1", ("lib2(matmul)#0", "lib2(matmul_bcast)#1"))])
    none = Playbook().propose(TaskContext("graph", "graph", {}, plain, None, plain.make({"c1": "lib2(matmul)#0"})), 4)
    assert none.status == "skipped" and "no gene has a value starting 'fused_mlp'" in none.message
