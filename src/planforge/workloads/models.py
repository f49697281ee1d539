"""Whole-model workloads: a graph (zoo model or imported file) cut into tasks, each tuned as one plan space.

The graph is partitioned (``rewrite.partition``: at values that alone carry
its state; identical parts are one task, weighted by their count; small
graphs stay whole). Each task's graph goes into an e-graph, the rule sets
saturate it within limits, the e-nodes that cannot fit the memory budget are
pruned, greedy and ILP extraction give two starting plans, and the genome
(one gene per e-class plus the knobs of each template) is what the search
explores, measuring the task's plans end to end. Where the rule groups whose order
matters fire (``rewrite.phases``: the convolution groups), each fixed order's
extraction seeds the search too, so the e-graph's search starts from every plan
a fixed-order rewriter would have started from.
"""
from __future__ import annotations

import os
import time
from typing import Any, Sequence

import numpy as np

from ..ir import ZOO, Graph
from ..ir.graph import INPUT_DTYPES, values_of
from ..ops.fallback import steps as fallback_steps
from ..peers import peers_option
from ..rewrite import Limits, release_egraphs, saturate
from ..rewrite.analysis import analyse, estimate
from ..rewrite.extract import greedy, ilp, prune_memory, reachable, usable
from ..rewrite.partition import WHOLE_BELOW, partition
from ..rewrite.phases import ORDERS, embed, fixed_order, groups_fire
from ..space.genome import Genome
from ..targets import Target, TargetError, get_target
from ..validate import MemoryBudget
from .base import Manifest, Task, Workload, WorkloadError
from .measured import TRIALS, Measured, measure_first_settings
from .objective import Objective

DEFAULT_RULESETS = ("epilogue", "layout", "algebra")


def _rulesets(graph: Graph) -> list[str]:
    """Everything, plus fusing consecutive layers when every matmul works on a single row."""
    shapes = graph.shapes()
    rows = [shapes[n.inputs[0]][:-1] for n in graph.nodes if n.op in ("matmul", "linear")]
    single = bool(rows) and all(len(r) >= 1 and all(d == 1 for d in r) for r in rows)
    return [*DEFAULT_RULESETS, *(["mlp_fusion"] if single else [])]


def _no_template(eg, a, target: Target) -> set[str]:
    """The template e-nodes whose kernel problem ``target`` has no template for (its ``knob_space`` refuses it:
    a GPU's Triton epilogues cover fewer ops than the CPU's C ones); a plan may not choose them."""
    out = set()
    for ns in eg.classes.values():
        for n in ns:
            if n.impl in ("tmpl", "fused") and n.id not in a.unavailable:
                try:
                    target.knob_space(a.problem(n))
                except TargetError:
                    out.add(n.id)
    return out


def price(eg, choice, costs) -> float:
    """The summed cost of the plan ``choice`` extracts (each class it reaches once)."""
    return sum(costs.get(choice[c], 0.0) for c in reachable(eg, choice))


def _order_choices(graph: Graph, eg, names: list[str], limits: Limits, costs, allowed) -> dict[str, Any]:
    """Each fixed order's ILP extraction (``rewrite.phases``), as a choice over ``eg``: what the order's
    sequential rewriter keeps (``embed``) restricts ``allowed``. Empty when no group's rule matches ``graph``;
    an order whose plan ``eg`` does not hold (``eg`` stopped at a limit) is left out."""
    if not groups_fire(graph, limits):
        return {}
    out = {}
    for label, order in ORDERS.items():
        kept = embed(eg, fixed_order(graph, order, names, limits))
        sub = usable(eg, {c: [n for n in ns if n in kept] for c, ns in allowed.items()})
        if eg.root in sub:
            out[label] = ilp(eg, costs, sub)[0]
    return out


def _variant_errors(target: Target, problem, variants, seed: int, accuracy) -> dict[str, float]:
    """Each variant's error (``accuracy``'s metric) on ``problem``'s kernel alone; a fused MLP's is the worst of
    its layers', each as the GEMV it is made of (a chain of layers in one format is no more accurate than its
    least accurate one)."""
    if problem.op != "mlp":
        return target.variant_errors(problem, variants, seed, accuracy.measure)
    from ..ops.kernel import epilogue_of_act

    per = [target.variant_errors(target.problem("gemv", (n, k), epilogue_of_act(a)), variants, seed,
                                 accuracy.measure) for k, n, a in problem.layers]
    return {v: accuracy.worst(e[v] for e in per) for v in variants}


def _mixed(space, layers: int):
    """A fused MLP's space of formats restricted to its layers not all in one format (each one-format plan is a
    stratum of its own)."""
    from ..space import Space

    differ = " or ".join(f"wfmt{i} != wfmt{i + 1}" for i in range(layers - 1))
    return Space(space.knobs, [*space.restrictions, differ], constants=space.constants)


def _quant_strata(target: Target, accuracy, seed: int = 0):
    """``Genome.build``'s strata under an accuracy budget that allows quantisation: per template node whose
    template reads other formats, one knob space per format the screen keeps (and, for a fused MLP, one
    mixing them per layer); None where there is no budget, so that the plan space is what it was. The screen:
    each format's error on the node's kernel alone (random inputs of ``seed``, computed in fp64 before any
    kernel runs); a format over the whole budget on one kernel cannot be within it for the model, and is not
    searched. ``strata.screens`` keeps what it found, per kernel problem."""
    from ..quant import QuantTarget

    if accuracy is None or not accuracy.allows_quantisation or not isinstance(target, QuantTarget):
        return None
    screens: dict[str, dict] = {}

    def strata(problem):
        vs = target.quant_variants(problem)
        if len(vs) < 2:
            return None
        key = repr(problem)
        if key not in screens:
            errors = _variant_errors(target, problem, vs, seed + 1, accuracy)
            screens[key] = {"metric": accuracy.metric, "errors": errors,
                            "searched": [v for v in vs if v == "fp32" or accuracy.excess(errors[v]) is None]}
        kept = tuple(screens[key]["searched"])
        if len(kept) < 2:
            return None
        out = [lambda p, v=v: target.quant_space(p, (v,)) for v in kept]
        if problem.op == "mlp" and len(problem.layers) > 1 and len(kept) > 2:
            out.append(lambda p: _mixed(target.quant_space(p, kept), len(p.layers)))
        return out

    strata.screens = screens
    return strata


VALIDATION_DRAWS = 4  # input draws a quantised plan's error is judged on in the walk: the worst counts


def validation_draws(graph: Graph, seed: int, given: Sequence[Sequence[np.ndarray]] = ()) -> list[list[np.ndarray]]:
    """The model inputs a quantised plan's error is judged on, ``VALIDATION_DRAWS`` of them (a quantised plan's
    error moves with the input: one draw within the budget says little of the next). The user's example inputs
    first when ``given`` (a list of input lists), then draws like them: each float tensor from a normal of its
    mean and standard deviation, each integer or boolean one its values resampled. Without them, the graph's
    own random inputs, of other seeds than the search checks plans on."""
    given = [[np.asarray(a) for a in xs] for xs in given]
    if not given:
        return [graph.example_inputs(seed + 1 + i) for i in range(VALIDATION_DRAWS)]
    rng = np.random.default_rng(seed + 1)
    out = [list(xs) for xs in given]
    while len(out) < max(VALIDATION_DRAWS, len(given)):
        base = given[len(out) % len(given)]
        out.append([(rng.normal(float(a.mean()), float(a.std()) or 1.0, a.shape).astype(a.dtype)
                     if np.issubdtype(a.dtype, np.floating) else rng.choice(a.ravel(), a.shape)) for a in base])
    return out


def example_arrays(graph: Graph, example_inputs: Sequence[Any]) -> list[np.ndarray] | None:
    """A torch module's example inputs (tensors, or arrays) as the graph's inputs, in its order; None when they
    are not one tensor per graph input of its shape (a module with non-tensor arguments, say)."""
    arrays = []
    for a in example_inputs:
        if hasattr(a, "detach"):
            a = a.detach().cpu().numpy()
        if not isinstance(a, np.ndarray):
            return None
        arrays.append(a)
    if len(arrays) != len(graph.inputs) or any(tuple(a.shape) != tuple(s)
                                               for a, s in zip(arrays, graph.inputs.values())):
        return None
    return arrays


def _accuracy_check(graph: Graph, target: Target, genome, accuracy, seed: int, draws=None, judged_on: str = ""):
    """The finalist walk's judge of a plan's quantised steps (``validate.PlanAccuracy``): the worst error over
    ``draws`` (inputs of ``graph``: ``validation_draws``, or for a part of a model what flows into it on those).
    """
    from ..quant import Accuracy
    from ..validate import PlanAccuracy
    from ..validate.accuracy import program_formats

    if draws is None:
        draws = validation_draws(graph, seed)
        judged_on = f"{len(draws)} generated input draws"

    def output(c):
        plan = target.plan(graph, genome.program(c.as_dict()))
        outs, refs = [], []
        for xs in draws:
            outs += [o.copy() for o in plan(*xs)]
            refs += graph.evaluate(*xs)
        return outs, refs

    return PlanAccuracy(accuracy or Accuracy(), lambda c: program_formats(genome.program(c.as_dict())), output,
                        judged_on=judged_on, draws=draws)


# plans whose kernels are measured before the search, at most, to find the one that leads it
LEAD_MEASURES = 3


def weights_cold(graph: Graph, target: Target) -> bool:
    """Whether a step of ``graph`` finds its weights out of the caches in the model's whole call: the model's
    weights are more than half of what the last cache level holds for all the target's threads (its ceilings';
    the other half is the activations', and other processes'). In GPT-2's whole call with 6 layers (19 MB of
    weights, a 32 MiB L3) a layer's GEMM ran as slowly as with every cache flushed (100-110 us against 58-64
    hot), and which of its settings streams the weights well only a measurement in that state ranks
    (``targets/cpu/scrub.py``); with 2 layers (6.6 MB) the same GEMMs ran in the whole call as fast as alone.
    Only the levels that read faster than memory count (``Ceilings.caching_levels``): on a Xeon guest that reports
    its host's 480 MiB L3 and reads it at DRAM's rate, MobileNetV2's 14 MB of weights took twice their hot time in
    the whole call. False for a target with no cache levels."""
    device = target.ceilings()
    if device is None or device.kind != "cpu" or not device.cache:
        return False
    last = max(float(device.capacity(level, device.threads)) for level in device.caching_levels())
    return graph.param_bytes() > last / 2


def graph_task(graph: Graph, key: str, target: Target, budget: int, seed: int = 0, node_limit: int = 20_000,
               weight: int = 1, accuracy=None, validation: tuple[list, str] | None = None,
               shared: bool = False, measured: Measured | None = None, cold_weights: bool = False) -> Task:
    """The task of one graph (a whole model, or one part of a partitioned one): its e-graph saturated within
    ``node_limit`` e-nodes, memory-pruned to ``budget`` bytes, extracted greedily and by ILP (the two seeds of
    the search), and the genome over it (implementation choices and template knobs) as its space.
    ``accuracy``: the task's accuracy budget (``planforge.quant.Accuracy``; None: none stated, fp32 weights
    only); one that allows quantisation makes each linear template's weight format a gene, and the plan's
    outputs are judged by it, in the finalist walk on ``validation`` (``(draws, what they are)``: the graph's
    inputs; default: ``validation_draws`` of its own). ``shared``: the graph is one part of a partitioned model,
    timed apart from the others, so a fused MLP's pool may not spin after a call (``MlpProblem.shared``; default
    False). ``measured``: the workload's kernel measurements so far (``workloads.measured``), which this task's
    lead seeds' kernels are added to; None measures none (the model's order of settings). ``cold_weights``: the
    model's weights are more than the caches hold (``weights_cold``), so its kernels are measured with their
    weights out of the caches, and so is the graph where it is one part of the model (a whole model measured
    call after call is in that state already); default False: hot."""
    device = target.ceilings()  # (measures the device on first use: before the clock starts)
    if device is None:
        raise TargetError(f"target {target.name!r} has no device ceilings: it cannot plan a whole model")
    t0 = time.perf_counter()
    limits, names = Limits(nodes=node_limit), _rulesets(graph)
    eg = saturate(graph, names, limits)
    a = analyse(eg, graph)
    a.shared = shared
    a.unavailable |= _no_template(eg, a, target)
    allowed = usable(eg, {c: [n.id for n in ns if n.executable and n.id not in a.unavailable]
                          for c, ns in eg.classes.items()})
    node_bytes = {nid: a.out_bytes(eg.node(nid)) + a.workspace_bytes(eg.node(nid))
                  for ns in allowed.values() for nid in ns}
    allowed, pruned = prune_memory(eg, allowed, node_bytes, budget)
    costs = {nid: estimate(a, eg.node(nid), device) for ns in allowed.values() for nid in ns}
    t1 = time.perf_counter()

    def ranker(problem, space):
        """The analytic roofline model of a kernel node ranks its knob settings (fused MLPs have none)."""
        from ..costmodel.analytic import analytic_model
        from .kernels import ModelledTarget

        # a target whose templates bring their own model (the cuda target's GPU roofline) ranks with it
        model = target.cost_model(problem, space) if isinstance(target, ModelledTarget) else \
            analytic_model(problem, space, target)
        return None if model is None else model.predict

    strata = _quant_strata(target, accuracy, seed)
    g_choice = greedy(eg, costs, allowed)
    t2 = time.perf_counter()
    genome = Genome.build(eg, a, allowed, g_choice, knob_space=target.knob_space, defaults=target.default_knobs,
                          ranker=ranker, strata=strata)
    t3 = time.perf_counter()
    i_choice, how = ilp(eg, costs, allowed)
    t4 = time.perf_counter()
    orders = _order_choices(graph, eg, names, limits, costs, allowed)
    release_egraphs()  # the fixed orders' e-graphs, before the kernel measurements start threads
    t5 = time.perf_counter()
    # the extractions (the ILP's, the greedy one, each fixed order's) are ranked at their kernels' prices: each
    # template step at what its kernel's model predicts for the setting a seed runs, where the roofline prices every
    # template of one op alike (an NCHW convolution and an NHWC one between transposes, whose kernels differ by
    # 1.5x). A small budget measures only the first of them (``Task.lead_seeds``). (The extractions themselves keep
    # the roofline prices: priced by the kernels' models, whose scale is not the library steps' roofline, the ILP
    # chose numpy steps and unfused epilogues that ran 2-4x slower on ResNet-18 and MobileNetV2.) Before the seeds
    # are made, the kernels of the cheapest extraction and of the next cheapest then have their first settings
    # measured and reordered fastest first (``workloads.measured``), which also makes those prices measured ones;
    # the cheaper of those two at its measured price leads. (The ILP's plan led at any price until then: on the
    # phase-ordering bench's tiny ResNet it is the all-NCHW plan, which ran 72 us where the NHWC ones ran 36-49,
    # and took one of the six evaluations of a budget of six.) With no kernel measured, the ILP's plan leads.
    measured_info: dict[str, Any] = {}
    t_measure = 0.0

    def weight_is_constant(nid: str) -> bool:
        """Whether a kernel node's weight operand (its second) is a constant of the plan (a parameter, or computed
        from parameters when the plan is loaded)."""
        children = eg.node(nid).children
        return len(children) > 1 and children[1] in a.constant

    def measure(choice) -> bool:
        """Measure the first settings of ``choice``'s kernels; whether kernels are measured at all."""
        nonlocal t_measure
        if measured is None or measured.trials <= 0:
            return False
        t = time.perf_counter()
        steps = genome.template_steps(genome.candidate_of(choice).as_dict())
        measured_info.update(measure_first_settings(genome, target, {nid: k for nid, _, k in steps}, weight,
                                                    measured, seed, constant=weight_is_constant,
                                                    cold=cold_weights, ranker=ranker))
        genome.remake_space()  # settings dropped: the knob genes index what is left
        t_measure += time.perf_counter() - t
        return True

    extractions = [("ilp", i_choice), ("greedy", g_choice), *orders.items()]

    def by_price(among=extractions):
        kernel_costs = {**costs, **genome.predicted}
        return sorted(among, key=lambda lc: price(eg, lc[1], kernel_costs))  # stable: the ILP's first in a tie

    def plan_of(lc) -> str:  # two extractions of one plan measure nothing new
        return genome.candidate_of(lc[1]).fingerprint

    first = by_price()[0]
    if measure(first[1]):
        done = {plan_of(first): first}
        rest = [lc for lc in by_price() if plan_of(lc) not in done]
        if rest:
            measure(rest[0][1])
            done[plan_of(rest[0])] = rest[0]
        # the measurements reprice what they did not measure (an NHWC convolution's measured settings move the
        # prediction of its unfused kind too): while the cheapest plan now is one not measured, it is measured,
        # up to LEAD_MEASURES plans, so that the plan that leads is the cheapest by what is known, and measured
        while len(done) < LEAD_MEASURES:
            top = by_price()[0]
            if plan_of(top) in done or not measure(top[1]):
                break
            done[plan_of(top)] = top
        lead_label, lead_choice = by_price(list(done.values()))[0]
    else:
        lead_label, lead_choice = extractions[0]
    seeds, seed_of = [], {}

    def add(c, label: str) -> None:
        if c.fingerprint not in seed_of:  # two extractions of one plan are one seed
            seed_of[c.fingerprint] = label
            seeds.append(c)

    add(genome.candidate_of(lead_choice), lead_label)
    # under an accuracy budget: the lead plan in each other format too (every quantisable kernel at that format's
    # best-ranked tiles), so that the search starts from every "quantise first" plan and can only improve on them
    for i in range(1, max((len(f) for f in genome.strata_firsts.values()), default=0)):
        c = genome.candidate_of(lead_choice, stratum=i)
        if c.fingerprint not in seed_of:
            from ..validate.accuracy import program_formats

            fmts = sorted(set(program_formats(genome.program(c.as_dict())).values()))
            add(c, f"{lead_label} in {', '.join(fmts) or 'fp32'}")
    lead = len(seeds)
    for label, ch in by_price():
        add(genome.candidate_of(ch), label)
    t6 = time.perf_counter()

    def peak(c) -> int:
        return target.peak_bytes(graph, genome.program(c.as_dict()))

    quant = strata is not None
    # a target written before the budget (or the cold weights) existed takes no such argument: pass one only
    # where it says something
    extra = {**({"accuracy": accuracy.to_json()} if quant else {}),
             **({"cold_weights": True} if cold_weights and shared else {})}
    backend = target.graph_backend(graph, genome, seed=seed, **extra)
    check = _accuracy_check(graph, target, genome, accuracy, seed, *(validation or ())) if quant else None
    task = Task(key=key, space=genome.space, backend=backend, weight=weight,
                validators=(MemoryBudget(budget, peak), *((check,) if check else ())), peak_bytes=peak,
                record=(lambda c: {**check.record(c), "screen": strata.screens}) if check else None)
    task.seeds, task.lead_seeds = seeds, lead
    task.info = {**genome.describe(), "pruned_by_memory": len(pruned), "saturation_s": t1 - t0,
                 "greedy_s": t2 - t1, "ilp_s": t4 - t3, "ilp": how, "genome_s": (t3 - t2) + (t6 - t5) - t_measure,
                 "orders_s": t5 - t4, "kernels_s": t_measure, "seeds": list(seed_of.values()),
                 "weights_cold": bool(cold_weights)}
    if measured_info:
        task.info["measured_settings"] = measured_info
    return task


def graph_workload(graph: Graph, name: str, options: dict[str, Any] | None = None, memory_budget_mb: float = 1024,
                   seed: int = 0, node_limit: int = 20_000, target: str | Target = "cpu",
                   whole_below: int = WHOLE_BELOW, objective: "str | dict | None" = None,
                   accuracy: str = "", example_inputs: Sequence[Sequence[np.ndarray]] = (),
                   kernel_trials: int = TRIALS) -> Workload:
    """A whole-model workload: ``graph`` cut into parts (``rewrite.partition``), one task per distinct part
    (its weight: how many parts share its structure), each with its own e-graph and genome.

    Parameters:
        graph: the program, with concrete shapes and weights.
        name: the workload's name in its manifest.
        options: what built it, recorded in the manifest (default none).
        memory_budget_mb: a plan (of the whole graph, or of one part) whose peak memory exceeds this is pruned
            or rejected (default 1024).
        seed: seeds the plan backends' inputs (default 0).
        node_limit: e-graph size at which saturation stops, per task (default 20 000).
        target: a target name or a ``Target`` (default "cpu"): its templates, profile and plan backend.
        whole_below: a graph of at most this many ops stays one task (default ``rewrite.partition.WHOLE_BELOW``;
            0 cuts every graph that has a cut point).
        objective: what the whole plan is judged by (``objective.Objective``: a dict, or a string such as
            ``control:chunk_steps=8,control_hz=10``; default None: end-to-end latency); recorded in the manifest.
        accuracy: the accuracy budget, ``METRIC:BOUND[;TASK=METRIC:BOUND]`` (``planforge.quant.parse_budget``;
            default "": none stated, fp32 weights only). Stated, each linear template's weight format (fp32,
            bf16, int8, int4; per layer in a fused MLP) is a gene beside its tiles, a plan's outputs are judged
            by the budget instead of the fp32 tolerance, and the whole model's output too (``endtoend``).
        example_inputs: the user's own inputs of the model (a list of input lists; default none): with a budget,
            the finalist walk judges a quantised plan on them and on draws like them (``validation_draws``),
            and a part of a partitioned model on what flows into it on those, instead of on random inputs.
        kernel_trials: settings of each distinct kernel of the seed plans measured alone before the search, which
            reorder that kernel's settings fastest first (``workloads.measured``; default ``measured.TRIALS``;
            0: none, the analytic model's order); recorded in the manifest when not the default.
    A graph that stays whole is one task named ``graph``; the parts' tasks are named ``partK`` after the
    first part of their structure. ``Workload.partition`` holds the parts and why it was cut where it was.
    """
    from ..quant import QuantError, QuantTarget, parse_budget

    target = get_target(target)
    try:
        budgets = parse_budget(accuracy)
    except QuantError as e:
        raise WorkloadError(f"option accuracy={accuracy!r}: {e}") from None
    if budgets.stated and not isinstance(target, QuantTarget):
        raise WorkloadError(f"an accuracy budget was stated, but the {target.name} target reads fp32 weights only")
    budget = int(memory_budget_mb * 2**20)
    t0 = time.perf_counter()
    part = partition(graph, whole_below=whole_below)
    t_part = time.perf_counter() - t0
    # the workload's budget holds for the whole model's output: a part not given its own gets an equal share
    # of it (``Accuracy.split``), and the chained plan is judged by the whole budget (``endtoend``)
    share = budgets.default.split(len(part.parts))
    acc = (lambda key: budgets.tasks.get(key, share)) if budgets.stated else (lambda key: None)
    draws = validation_draws(graph, seed, example_inputs) if budgets.stated else None
    about = (f"the model's example inputs ({len(example_inputs)}) and {len(draws) - len(example_inputs)} draws "
             f"like them" if example_inputs else f"{len(draws)} generated input draws") if draws else ""
    if kernel_trials < 0:
        raise WorkloadError(f"kernel_trials must be 0 or more, got {kernel_trials}")
    store = Measured(trials=kernel_trials)
    cold = weights_cold(graph, target)
    if len(part.parts) == 1:
        tasks = [graph_task(graph, "graph", target, budget, seed, node_limit, accuracy=acc("graph"),
                            validation=(draws, about) if draws else None, measured=store, cold_weights=cold)]
    else:
        tasks = []
        # the parts repeated most first: the kernels they measure, and refine, are the model's largest shares of
        # both clocks (ViT-tiny's patch embedding, run once, spent 17 of its 40 s refining before the 12 blocks)
        built = sorted(part.keys.items(), key=lambda kv: -len(kv[1]))
        weight_left = sum(len(idx) for _, idx in built)
        for key, idx in built:
            store.start_task(len(idx), weight_left)  # each task its weight's share of the kernel clocks
            weight_left -= len(idx)
            rep = part.parts[idx[0]]
            # a part is judged on what flows into it when the model runs on the validation draws
            flows = [[v.astype(np.float32) if np.issubdtype(v.dtype, np.floating) else v
                      for v in values_of(part.graph, d, rep.inputs)] for d in draws] if draws else None
            t = graph_task(rep.graph, f"part{rep.index}", target, budget, seed, node_limit, weight=len(idx),
                           accuracy=acc(f"part{rep.index}"), shared=True, measured=store, cold_weights=cold,
                           validation=(flows, f"the values flowing into it on {about}") if flows else None)
            t.info.update({"structure": key, "instances": list(idx), "ops": len(rep.graph.nodes)})
            tasks.append(t)
        order = {key: i for i, key in enumerate(part.keys)}  # then in the model's order again
        tasks.sort(key=lambda t: order[t.info["structure"]])
    phases = {"partition_s": t_part, "saturation_s": sum(t.info["saturation_s"] for t in tasks),
              "extraction_s": sum(t.info["greedy_s"] + t.info["ilp_s"] + t.info["orders_s"] for t in tasks),
              "genome_s": sum(t.info["genome_s"] for t in tasks), "kernels_s": store.spent + store.refine_spent}
    shapes = {k: list(v) for k, v in graph.inputs.items()}
    peers_option(options or {})  # a bad value fails here, before anything is built or measured
    opts = {**(options or {}), "memory_budget_mb": memory_budget_mb, "seed": seed}
    if whole_below != WHOLE_BELOW:
        opts["whole_below"] = whole_below
    if kernel_trials != TRIALS:
        opts["kernel_trials"] = kernel_trials
    goal = Objective.parse(objective)
    if goal.kind != "latency" or goal.share_threshold != Objective().share_threshold:
        opts["objective"] = goal.to_json()
    manifest = Manifest(name, shapes=shapes, dtypes={k: graph.input_dtype(k) for k in shapes}, options=opts,
                        accuracy=budgets.to_json() if budgets.stated else None)
    desc = f"{graph.name}: {len(graph.nodes)} ops, {graph.param_bytes() / 1e6:.2f} MB of weights"
    if len(part.parts) > 1:
        desc += f", {len(part.parts)} parts in {len(part.keys)} tasks"
    if cold:
        desc += ("; kernels and parts measured with their weights out of the caches (more than half the last cache "
                 "level that reads faster than memory)")
    fallbacks = fallback_steps(graph)
    if fallbacks:
        desc += (f"; {len(fallbacks)} op(s) with no rule run as library fallback steps: "
                 f"{', '.join(sorted({op for op, _ in fallbacks}))}")
    return Workload(manifest, tasks, description=desc, graph=graph, partition=part if len(part.parts) > 1 else None,
                    phases=phases, target=target, validation=draws)


def zoo_workload(name: str, memory_budget_mb: float = 1024, seed: int = 0, target: str | Target = "cpu",
                 objective: "str | dict | None" = None, whole_below: int = WHOLE_BELOW,
                 accuracy: str = "", kernel_trials: int = TRIALS) -> Workload:
    """The zoo model ``name`` as a graph workload (see ``graph_workload`` for the rest)."""
    return graph_workload(ZOO[name](), name, memory_budget_mb=memory_budget_mb, seed=seed, target=target,
                          objective=objective, whole_below=whole_below, accuracy=accuracy, kernel_trials=kernel_trials)


def parse_shapes(text: str) -> dict[str, tuple[int, ...]] | None:
    """``"x=1x256;mask=1x32"`` -> {"x": (1, 256), "mask": (1, 32)} (None for an empty string)."""
    if not text.strip():
        return None
    out = {}
    for part in text.split(";"):
        name, sep, dims = part.partition("=")
        try:
            out[name.strip()] = tuple(int(d) for d in dims.lower().replace(",", "x").split("x"))
        except ValueError:
            sep = ""
        if not sep or not name.strip() or not out.get(name.strip()):
            raise ValueError(f"input shapes {text!r}: expected name=AxB[;name=CxD...], e.g. x=1x256")
    return out


def file_workload(path: str, memory_budget_mb: float = 1024, seed: int = 0, input_shapes: str = "",
                  target: str | Target = "cpu", strict: bool = False, peers: str = "auto",
                  accuracy: str = "", inputs: str = "", kernel_trials: int = TRIALS) -> Workload:
    """A model file (.onnx, .pt2); ``input_shapes`` fixes dynamic sizes, e.g. ``x=1x256``; ``strict`` refuses a
    model with ops that have no rule (listing them all) instead of running them as library fallback steps;
    ``peers``: the runtimes the whole plan is timed against (``planforge.peers``: auto, compile, none);
    ``accuracy``: the accuracy budget (``graph_workload``); ``inputs``: a .npz (or, for a one-input model,
    .npy) of real inputs that quantised plans are judged on (``load_inputs``; recorded with its hash);
    ``kernel_trials``: settings of each seed kernel measured alone before the search (``graph_workload``)."""
    from ..ir import load_model

    peers_option({"peers": peers})
    shapes = parse_shapes(input_shapes)
    g = load_model(path, input_shapes=shapes, strict=strict)
    given, digest = load_inputs(inputs, g) if inputs else ([], "")
    opts = {"file": os.path.abspath(path), **({"input_shapes": input_shapes} if shapes else {}),
            **({"peers": peers} if peers != "auto" else {}),
            **({"inputs": {"file": os.path.abspath(inputs), "sha256": digest}} if inputs else {})}
    return graph_workload(g, os.path.abspath(path), opts, memory_budget_mb=memory_budget_mb, seed=seed, target=target,
                          accuracy=accuracy, example_inputs=given, kernel_trials=kernel_trials)


def load_inputs(path: str, graph: Graph) -> tuple[list[list[np.ndarray]], str]:
    """The model inputs in ``path`` as validation samples, and the file's sha256: a .npz with an array per graph
    input (by its name, or ``arr_0``, ``arr_1``... in input order), each of the input's shape (one sample) or
    with a leading axis of samples; a .npy for a one-input model. ``WorkloadError`` names what does not fit."""
    import hashlib

    try:
        raw = open(path, "rb").read()
    except OSError as e:
        raise WorkloadError(f"option inputs={path!r}: {e.strerror or e}") from None
    names = list(graph.inputs)
    try:
        import io

        data = np.load(io.BytesIO(raw), allow_pickle=False)
        if isinstance(data, np.ndarray):
            if len(names) != 1:
                raise WorkloadError(f"option inputs={path!r}: a .npy holds one array, the model takes "
                                    f"{len(names)} inputs ({', '.join(names)}): save them in a .npz by name")
            arrays = {names[0]: data}
        else:
            arrays = {k: data[k] for k in data.files}
    except WorkloadError:
        raise
    except Exception as e:  # a truncated or foreign file: numpy raises several kinds
        raise WorkloadError(f"option inputs={path!r}: not a .npy or .npz numpy file ({type(e).__name__}: {e})") \
            from None
    if all(n in arrays for n in names):
        picked = [arrays[n] for n in names]
    elif all(f"arr_{i}" in arrays for i in range(len(names))):
        picked = [arrays[f"arr_{i}"] for i in range(len(names))]
    else:
        raise WorkloadError(f"option inputs={path!r}: holds {', '.join(sorted(arrays)) or 'nothing'}; the model's "
                            f"inputs are {', '.join(names)}")
    samples = None
    for n, a in zip(names, picked):
        want = tuple(graph.inputs[n])
        s = 1 if tuple(a.shape) == want else a.shape[0] if tuple(a.shape[1:]) == want else None
        if s is None or (samples is not None and s != samples):
            raise WorkloadError(f"option inputs={path!r}: input {n!r} has shape {tuple(a.shape)}; the model takes "
                                f"{want} (or a leading axis of samples, the same count for every input)")
        samples = s
    dtypes = [np.float32 if graph.input_dtype(n) == graph.dtype else INPUT_DTYPES[graph.input_dtype(n)] for n in names]
    out = []
    for i in range(samples or 0):
        draw = []
        for n, a, dt in zip(names, picked, dtypes):
            v = a if tuple(a.shape) == tuple(graph.inputs[n]) else a[i]
            draw.append(v.astype(dt))
        out.append(draw)
    return out, hashlib.sha256(raw).hexdigest()
