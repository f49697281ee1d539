"""Partition: a model cut at values that alone carry its state, parts keyed by structure (identical layers: one task)."""
import numpy as np

from planforge.targets.cpu.target import ceilings_of

from planforge.ir import GraphBuilder
from planforge.ir.zoo import policy_mlp, residual_mlp, transformer
from planforge.rewrite.partition import cut_points, partition, structural_key


def run_parts(part, xs):
    """Evaluate the parts one after another, feeding each the source values it reads."""
    env = dict(zip(part.graph.inputs, xs))
    for p in part.parts:
        outs = p.graph.evaluate(*[env[i] for i in p.inputs])
        env.update(zip(p.outputs, outs))
    return [env[o] for o in part.graph.outputs]


def test_identical_layers_share_a_key_and_the_parts_compute_the_model():
    g = transformer(layers=4, seq=6, width=16, heads=2)
    part = partition(g)
    assert len(part.parts) == 8 and len(part.keys) == 3  # attention half, MLP half, and the last MLP half + final LN
    weights = sorted(len(v) for v in part.keys.values())
    assert weights == [1, 3, 4]
    xs = g.example_inputs(3)
    np.testing.assert_allclose(run_parts(part, xs)[0], g.evaluate(*xs)[0], rtol=1e-12, atol=1e-12)
    # each part reads only its own weights, and every weight of the model is read by exactly one part
    seen = [p for q in part.parts for p in q.params]
    assert sorted(seen) == sorted(g.params) and len(seen) == len(set(seen))


def test_keys_differ_when_a_shape_or_an_attribute_differs():
    def layer(width=8, eps=1e-5, act="relu", seed=0):
        b = GraphBuilder("l", seed=seed)
        x = b.input("x", (2, width))
        h = b.op("layernorm", x, b.vector("g", width), b.vector("b", width), eps=eps)
        return b.output(b.op("add", x, b.linear(h, width, width, "fc", act=act)))

    base = structural_key(layer())
    assert structural_key(layer(seed=5)) == base            # other weights, same structure
    assert structural_key(layer(width=16)) != base          # a shape
    assert structural_key(layer(eps=1e-6)) != base          # an attribute
    assert structural_key(layer(act="gelu")) != base        # an op


def test_small_graphs_stay_whole_and_say_why():
    part = partition(policy_mlp(1))
    assert len(part.parts) == 1 and "kept whole" in part.reason
    g = residual_mlp(blocks=6, width=8, batch=2)
    assert len(partition(g, whole_below=1000).parts) == 1
    cut = partition(g, whole_below=0)
    assert len(cut.parts) == 6 and len(cut.keys) == 1 and cut.dedupe == 6.0 and "cut at 5 values" in cut.reason


def test_a_value_still_needed_later_is_never_a_cut():
    b = GraphBuilder("skip", seed=0)
    x = b.input("x", (2, 4))
    h1 = b.op("relu", x)
    h2 = b.op("relu", h1)
    y = b.op("add", h2, x)  # x is live across h1 and h2: no cut before the add
    g = b.output(b.op("relu", y))
    assert cut_points(g) == [2]


def _library_programs(profile, g):
    """``g`` cut into parts, and per task (part structure) a program of library steps of its first part."""
    from planforge.rewrite import saturate
    from planforge.rewrite.analysis import analyse, estimate
    from planforge.rewrite.extract import greedy, usable
    from planforge.space.genome import Genome

    part = partition(g, whole_below=0)
    programs = {}
    for key, idx in part.keys.items():
        rep = part.parts[idx[0]]
        eg = saturate(rep.graph, ["epilogue", "layout", "algebra"])
        a = analyse(eg, rep.graph)
        allowed = usable(eg, {c: [n.id for n in ns if n.executable and n.impl not in ("tmpl", "fused")]
                              for c, ns in eg.classes.items()})
        costs = {nid: estimate(a, eg.node(nid), ceilings_of(profile)) for ns in allowed.values() for nid in ns}
        genome = Genome.build(eg, a, allowed, greedy(eg, costs, allowed), knob_space=lambda p: None,
                              defaults=lambda p: {})
        programs[key] = genome.program({})
    return part, programs


def _own_chain(g, part, programs):
    """The chain of each part's plan on its own weights, every plan with an arena of its own."""
    from planforge.targets.cpu.plan import ChainPlan, Plan, rebind

    chain = []
    for p in part.parts:
        rep = part.parts[part.keys[p.key][0]]
        names = {**dict(zip(rep.inputs, p.inputs)), **dict(zip(rep.params, p.params))}
        chain.append((Plan(p.graph, rebind(programs[p.key], names), {}, {}), p.inputs, p.outputs))
    return ChainPlan(g, chain)


def test_one_plan_per_task_runs_every_instance_chained(profile):
    """The plan tuned on a task's first part runs each other part of that task on its own weights."""
    g = transformer(layers=3, seq=6, width=16, heads=2)
    plan = _own_chain(g, *_library_programs(profile, g))
    xs = g.example_inputs(2)
    ref = g.evaluate(*xs)[0]
    out = plan(*xs)[0]
    assert np.abs(out - ref).max() < 1e-4 * (1 + np.abs(ref).max())
    assert plan(*xs)[0] is not out  # fresh arrays per call


def test_a_chains_parts_share_one_region_for_their_inner_values(profile):
    """``endtoend.chain`` gives every part's plan one ``SharedArena`` for the values that live within the part:
    the parts' inner values overlap there, their outputs (read in place by later parts) stay apart, and the chain
    computes what a chain of plans with arenas of their own does."""
    from planforge.endtoend import chain as build_chain
    from planforge.targets import get_target

    g = transformer(layers=3, seq=6, width=16, heads=2)
    part, programs = _library_programs(profile, g)
    plan = build_chain(g, part, {p.index: p.key for p in part.parts}, programs, get_target("cpu"))
    own = _own_chain(g, part, programs)
    xs = g.example_inputs(3)
    np.testing.assert_array_equal(plan(*xs)[0], own(*xs)[0])
    plans = [p for p, _, _ in plan.parts]
    inner = [[p.views[c] for c in p.inner] for p in plans]
    assert all(inner) and all(p.shared_floats > 0 for p in plans)
    for a_views, b_views in zip(inner, inner[1:]):  # consecutive parts reuse the same memory
        assert any(np.shares_memory(u, v) for u in a_views for v in b_views)
    for p in plans:  # outputs apart from every part's inner values
        for o in p.out_views:
            assert not any(np.shares_memory(o, v) for vs in inner for v in vs)
    assert plan.peak_bytes < sum(p.peak_bytes for p in plans)  # the region counted once


def test_the_parts_repeated_most_are_built_first_and_listed_in_the_models_order(monkeypatch):
    """Kernel measurements and their refinement have clocks of their own, shared by a model's tasks: the tasks of
    the parts repeated most are built (and measure) first, and the workload lists them in the model's order."""
    from planforge.workloads import models

    built = []
    real = models.graph_task

    def spy(graph, key, *a, weight=1, **kw):
        built.append((key, weight))
        return real(graph, key, *a, weight=weight, **kw)

    monkeypatch.setattr(models, "graph_task", spy)
    b = GraphBuilder("stem-res", seed=0)  # a stem run once, then three residual blocks alike
    x = b.linear(b.input("x", (8, 16)), 16, 16, "stem", act="relu")
    for i in range(4):
        h = b.op("layernorm", x, b.vector(f"b{i}.g", 16, 0.1, 1.0), b.vector(f"b{i}.be", 16), eps=1e-5)
        x = b.op("add", x, b.linear(b.linear(h, 16, 16, f"b{i}.fc1", act="relu"), 16, 16, f"b{i}.fc2"))
    g = b.output(x)
    assert [len(v) for v in partition(g, whole_below=0).keys.values()] == [1, 3]
    wl = models.graph_workload(g, "stem-res", whole_below=0, kernel_trials=0)
    assert [w for _, w in built] == [3, 1]
    assert [len(t.info["instances"]) for t in wl.tasks] == [1, 3] and wl.tasks[0].info["instances"] == [0]
