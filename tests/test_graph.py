"""The graph level: IR, rewrites, extraction, genome, arena, runnable plans."""
import math

import numpy as np

from planforge.targets.cpu.target import ceilings_of
import pytest

from planforge.targets.cpu.graph import tolerance
from planforge.targets.cpu.plan import Plan, Slot, peak_bytes_of, plan_arena
from planforge.ir import ZOO, GraphBuilder, GraphError, Node
from planforge.rewrite import Limits, saturate
from planforge.rewrite.analysis import analyse, estimate
from planforge.rewrite.extract import ExtractionError, dag_cost, greedy, ilp, prune_memory, reachable, usable
from planforge.search import Budget
from planforge.tuning import tune
from planforge.workloads import load_workload
from planforge.workloads.models import _rulesets, graph_workload


def small_mlp(batch=1, gelu="tanh"):
    b = GraphBuilder(f"mlp{batch}", seed=1)
    h = b.input("x", (batch, 24))
    h = b.linear(h, 24, 40, "a", act="relu")
    h = b.op("gelu", b.linear(h, 40, 16, "b"), approximate=gelu)
    return b.output(b.linear(h, 16, 8, "c"))


def block():
    b = GraphBuilder("blk", seed=2)
    x = b.input("x", (6, 16))
    h = b.op("layernorm", x, b.vector("g", 16, 0.1, 1.0), b.vector("be", 16), eps=1e-5)
    q = b.op("transpose", b.op("reshape", b.linear(h, 16, 16, "q"), shape=(6, 2, 8)), perm=(1, 0, 2))
    k = b.op("transpose", b.op("reshape", b.linear(h, 16, 16, "k"), shape=(6, 2, 8)), perm=(1, 2, 0))
    p = b.op("softmax", b.op("scale", b.op("matmul", q, k), factor=0.35))
    y = b.op("add", x, b.op("bias", b.op("bias", b.linear(h, 16, 16, "o"), b.vector("b2", 16)), b.vector("b3", 16)))
    return b.output(b.op("add", y, b.op("reshape", b.op("transpose", p, perm=(1, 0, 2)), shape=(6, 12)))
                    if False else y)


def test_validator_errors_are_clear():
    b = GraphBuilder("bad")
    x = b.input("x", (2, 3))
    w = b.weight("w", 4, 5)
    b.op("matmul", x, w)
    with pytest.raises(GraphError, match=r"shape mismatch: \(2, 3\) @ \(4, 5\)"):
        b.output("matmul1")
    g = small_mlp()
    g.nodes.append(Node("conv3d", ("x",), "z"))
    with pytest.raises(GraphError, match="unknown op 'conv3d'"):
        g.shapes()
    g = small_mlp()
    g.inputs["x"] = (None, 24)
    with pytest.raises(GraphError, match="dynamic or non-positive shape"):
        g.shapes()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_models_validate_and_evaluate(name):
    g = ZOO[name]()
    out = g.evaluate(*g.example_inputs())
    assert all(np.isfinite(o).all() for o in out)


def all_extractions(eg, allowed, limit=200):
    """Every acyclic program the e-graph holds (up to ``limit``), by DFS over choices."""
    from itertools import islice, product

    classes = list(allowed)
    out = []
    for combo in islice(product(*[allowed[c] for c in classes]), 20000):
        choice = dict(zip(classes, combo))
        try:
            order = reachable(eg, choice)
        except (ExtractionError, KeyError):
            continue
        key = tuple((c, choice[c]) for c in order)
        if key not in {tuple((c, ch[c]) for c in o) for o, ch in out}:
            out.append((order, choice))
        if len(out) >= limit:
            break
    return out


@pytest.mark.parametrize("make", [small_mlp, lambda: small_mlp(3), lambda: small_mlp(2, gelu="none"), block])
def test_rule_sets_preserve_semantics(make, profile):
    """Every program extracted from the saturated e-graph computes the original graph."""
    from planforge.space.genome import Genome

    g = make()
    eg = saturate(g, _rulesets(g))
    a = analyse(eg, g)
    allowed = usable(eg, {c: [n.id for n in ns if n.executable and n.id not in a.unavailable and n.impl != "tmpl"
                               and n.impl != "fused"] for c, ns in eg.classes.items()})
    costs = {nid: estimate(a, eg.node(nid), ceilings_of(profile)) for ns in allowed.values() for nid in ns}
    fb = greedy(eg, costs, allowed)
    genome = Genome.build(eg, a, allowed, fb, knob_space=lambda p: None, defaults=lambda p: {})
    xs = g.example_inputs(7)
    ref = g.evaluate(*xs)
    tol = tolerance(g, ref)
    seen = set()
    rng = np.random.default_rng(0)
    for _ in range(60):  # random genomes: library-only programs, compared in fp32
        cfg = {k.name: k.values[rng.integers(len(k.values))] for k in genome.space.knobs}
        prog = genome.program(cfg)
        key = str([(s["op"], s["args"]) for s in prog])
        if key in seen:
            continue
        seen.add(key)
        out = Plan(g, prog, {}, {})(*xs)
        assert max(float(np.abs(o - r).max()) for o, r in zip(out, ref)) <= tol, key
    assert len(seen) >= 3


def test_saturation_limits_hold_on_an_explosive_rule_set():
    from egglog import rewrite, ruleset, vars_

    from planforge.ops.egg import E, T
    from planforge.rewrite import lang

    x, y, z = vars_("x y z", T)
    add = lambda a, b: E("add", a, b)  # noqa: E731
    explosive = ruleset(rewrite(add(x, y)).to(add(y, x)), rewrite(add(add(x, y), z)).to(add(x, add(y, z))),
                        rewrite(add(x, add(y, z))).to(add(add(x, y), z)), rewrite(E("relu", x)).to(E("relu", E("relu", x))))
    lang.rulesets()["explosive"] = explosive
    try:
        b = GraphBuilder("chain")
        h = b.input("x", (1, 4))
        for i in range(8):
            h = b.op("add", h, b.input(f"y{i}", (1, 4)))  # associativity + commutativity: 2^n sub-sums
        g = b.output(h)
        eg = saturate(g, ["explosive"], Limits(nodes=400, iterations=50, seconds=10))
        assert eg.stats["stop"] == "node limit" and eg.stats["rolled_back"]
        assert max(eg.stats["sizes"]) <= 400
        eg2 = saturate(g, ["explosive"], Limits(nodes=10**6, iterations=3, seconds=10))
        assert eg2.stats["stop"] == "iteration limit" and eg2.stats["iterations"] == 3
    finally:
        del lang.rulesets()["explosive"]


@pytest.mark.parametrize("name", ["policy-mlp", "transformer-block", "drill-mlp"])
def test_ilp_never_worse_than_greedy(name, profile):
    g = ZOO[name]()
    eg = saturate(g, _rulesets(g))
    a = analyse(eg, g)
    allowed = usable(eg, {c: [n.id for n in ns if n.executable and n.id not in a.unavailable]
                          for c, ns in eg.classes.items()})
    rng = np.random.default_rng(1)
    for trial in range(3):  # the model's costs, then random costs
        costs = {nid: (estimate(a, eg.node(nid), ceilings_of(profile)) if trial == 0 else float(rng.random()))
                 for ns in allowed.values() for nid in ns}
        gch = greedy(eg, costs, allowed)
        ich, how = ilp(eg, costs, allowed, time_limit=20)
        assert dag_cost(eg, ich, costs) <= dag_cost(eg, gch, costs) + 1e-12, how


def test_memory_pruning_cascades_and_never_empties_the_root(profile):
    g = ZOO["drill-mlp"]()
    eg = saturate(g, _rulesets(g))
    a = analyse(eg, g)
    allowed = usable(eg, {c: [n.id for n in ns if n.executable and n.id not in a.unavailable]
                          for c, ns in eg.classes.items()})
    node_bytes = {nid: a.out_bytes(eg.node(nid)) + a.workspace_bytes(eg.node(nid))
                  for ns in allowed.values() for nid in ns}
    bcast = [nid for nid, b in node_bytes.items() if eg.node(nid).args[:1] == ("matmul_bcast",)]
    assert bcast and all(node_bytes[n] == 64 * 256 * 256 * 4 + 64 * 256 * 4 for n in bcast)
    kept, pruned = prune_memory(eg, allowed, node_bytes, 8 * 2**20)
    assert set(bcast) <= set(pruned)  # the [M, K, N] broadcast form does not fit 8 MiB
    assert eg.root in kept
    with pytest.raises(ExtractionError, match="no plan fits the memory budget"):
        prune_memory(eg, allowed, node_bytes, 1000)


def test_arena_planner_reuses_dead_buffers():
    slots = [Slot("a", 100, 0, 1), Slot("b", 100, 1, 2), Slot("c", 100, 2, 3), Slot("d", 50, 3, 4)]
    size = plan_arena(slots)
    for s in slots:
        for t in slots:
            if s is not t and not (s.last < t.first or t.last < s.first):
                assert s.offset + s.size <= t.offset or t.offset + t.size <= s.offset
    assert size < sum(s.size for s in slots)  # a and c share memory


@pytest.mark.parametrize("name", ["policy-mlp", "policy-mlp-b64", "drill-mlp", "transformer-block"])
def test_zoo_tune_spec_run_matches_reference(name, tmp_path, cli):
    r = cli("tune", "--workload", name, "--budget", "4", "--out", tmp_path, "--quiet", timeout=900, check=True)
    run = cli("run", tmp_path / "spec.json", "--json", check=True, timeout=300)
    import json

    d = json.loads(run.stdout)
    assert d["ok"] and d["max_abs_error"] <= d["tolerance"]
    assert "e-graph:" in r.stdout


def test_finalist_walk_rejects_plans_over_the_memory_budget():
    import random

    from planforge.search import Ranked, walk_finalists
    from planforge.validate import MemoryBudget

    t = load_workload("drill-mlp").tasks[0]
    rng = random.Random(0)
    cands = {c.fingerprint: c for c in (t.space.sample(rng) for _ in range(40))}
    peaks = sorted({t.peak_bytes(c) for c in cands.values()})
    assert len(peaks) >= 2, "plans should differ in peak memory (e.g. a transposed weight copy)"
    budget = (peaks[0] + peaks[-1]) // 2
    ranked = Ranked(40)
    for c in sorted(cands.values(), key=lambda c: -t.peak_bytes(c)):  # the biggest plans rank first
        ranked.insert(1.0 + len(ranked) * 1e-3, c)
    walk = walk_finalists(ranked, [MemoryBudget(budget, t.peak_bytes)], t.peak_bytes)
    assert walk.rejected and all("memory: peak" in f.reasons[0] for f in walk.rejected)
    assert walk.accepted.peak_bytes <= budget < walk.rejected[0].peak_bytes
    assert isinstance(t.validators[0], MemoryBudget)  # the workload's own budget check is the same validator


def test_load_refuses_a_spec_from_another_device(tmp_path):
    import json

    import planforge
    from planforge.api import PlanMismatch

    res = tune(load_workload("policy-mlp"), strategy="random", budget=Budget(evals=2), out=tmp_path)
    spec = json.loads(res.spec_path.read_text())
    spec["target"]["fingerprint"] = "0000000000000000"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(spec))
    with pytest.raises(PlanMismatch, match="re-tune here"):
        planforge.load(other)
    plan = planforge.load(res.spec_path)
    x = plan.graph.example_inputs(5)[0]
    assert np.allclose(plan(x), plan.graph.evaluate(x)[0], atol=1e-4)


def test_multi_output_graph_tunes_and_runs(profile):
    b = GraphBuilder("two")
    x = b.input("x", (2, 8))
    h = b.linear(x, 8, 8, "l", act="relu")
    g = b.output(h, b.op("scale", h, factor=2.0))
    from planforge.targets.cpu.target import CpuTarget

    wl = graph_workload(g, "two", target=CpuTarget(profile))
    res = tune(wl, strategy="random", budget=Budget(evals=3))
    assert res.ok
    t = wl.tasks[0]
    prog = t.backend.genome.program(res.tasks[0].walk.accepted.candidate.as_dict())
    outs = Plan(g, prog, *t.backend.plan_parts(res.tasks[0].walk.accepted.candidate)[1:])(*g.example_inputs(2))
    for o, r in zip(outs, g.evaluate(*g.example_inputs(2))):
        assert np.allclose(o, r, atol=1e-5)
    assert len(outs) == 2


def test_onnx_file_through_tune_spec_run(tmp_path, cli):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 32)).astype(np.float32) / 4
    w2 = rng.standard_normal((32, 16)).astype(np.float32) / 6  # Gemm with transB: stored [N, K]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "onnx-mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2.T.copy(), "w2"),
                               numpy_helper.from_array(np.zeros(16, np.float32) + 0.1, "b2")])
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    r = cli("tune", "--workload", path, "--budget", "2", "--out", tmp_path / "out", "--quiet")
    assert r.returncode == 2 and "batch" in r.stderr and "Traceback" not in r.stderr  # dynamic batch: say so
    cli("tune", "--workload", path, "--option", "input_shapes=x=1x16", "--budget", "3", "--out", tmp_path / "out",
        "--quiet", check=True, timeout=600)
    import json

    d = json.loads(cli("run", tmp_path / "out" / "spec.json", "--json", check=True).stdout)
    assert d["ok"] and d["outputs"] == [[1, 16]]


def test_torch_module_through_tune_spec_run(tmp_path, cli):
    torch = pytest.importorskip("torch")

    class Policy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(24, 48)
            self.b = torch.nn.Linear(48, 8)
            self.ln = torch.nn.LayerNorm(48)

        def forward(self, x):
            return self.b(torch.nn.functional.gelu(self.ln(torch.relu(self.a(x))), approximate="tanh"))

    torch.manual_seed(0)
    m = Policy().eval()
    x = torch.randn(1, 24)
    path = tmp_path / "policy.pt2"
    torch.export.save(torch.export.export(m, (x,)), path)
    cli("tune", "--workload", path, "--budget", "3", "--out", tmp_path / "out", "--quiet", check=True, timeout=600)
    import json

    d = json.loads(cli("run", tmp_path / "out" / "spec.json", "--json", check=True).stdout)
    assert d["ok"] and d["outputs"] == [[1, 8]]
    import planforge

    plan = planforge.load(tmp_path / "out" / "spec.json")
    with torch.no_grad():
        want = m(x).numpy()
    assert np.allclose(plan(x.numpy()), want, atol=1e-4)


def test_equal_template_problems_get_equal_settings_drawn_once(profile):
    """A model's repeated layers give the same template problem in every task: its settings are drawn (and
    ranked) once per target, and each node gets them seeded by the problem, not by the node."""
    from planforge.ir.zoo import transformer
    from planforge.space import genome
    from planforge.targets.cpu.target import CpuTarget
    from planforge.workloads.models import graph_workload

    calls = []
    orig = genome.knob_configs

    def counting(*a, **k):
        calls.append(a[3])
        return orig(*a, **k)

    genome.knob_configs = counting
    try:
        wl = graph_workload(transformer(layers=2, seq=6, width=16, heads=2), "t2", whole_below=0,
                            target=CpuTarget(profile))
    finally:
        genome.knob_configs = orig
    problems = [p for t in wl.tasks for p in _genome_of(t).problems.values()]
    assert len(calls) == len(set(problems)) < len(problems)  # two identical layers: each problem drawn once
    by_problem = {}
    for t in wl.tasks:
        g = _genome_of(t)
        for nid, p in g.problems.items():
            by_problem.setdefault(p, []).append(g.configs[nid])
    assert all(all(c == cs[0] for c in cs) for cs in by_problem.values())


def _genome_of(task):
    return task.backend.genome
