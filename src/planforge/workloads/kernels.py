"""Single-kernel workloads: gemm (gemv at M = 1), softmax, layernorm, eltwise, on a target (default the CPU).

``planforge tune --workload gemm --shape M,N,K --epilogue bias_relu`` tunes the
GEMM template's knobs for that shape on this machine, measures numpy (and
torch, when installed) on the same inputs in the same run, and falls back to
the best library when the tuned kernel is not within 95% of it.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..costmodel.analytic import analytic_model
from ..quant import QuantError, QuantTarget, parse_budget
from ..targets import Target, get_target
from ..validate import AccuracyBudget
from .base import Manifest, Task, Workload, WorkloadError


@runtime_checkable
class ModelledTarget(Protocol):
    """A target whose templates bring their own analytic model, task key and input dtypes (the cuda
    target: a GPU roofline, and problems that carry a dtype)."""

    def cost_model(self, problem, space) -> Any: ...

    def task_key(self, problem) -> str: ...

    def input_dtypes(self, problem) -> dict[str, str]: ...


def _dims(shape: str, n: int, what: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in str(shape).replace("x", ",").split(","))
    except ValueError:
        dims = ()
    if len(dims) != n or min(dims) < 1:
        raise WorkloadError(f"--shape {shape!r}: expected {n} positive integers ({what})")
    return dims


def _quantised(problem, target, accuracy: str, key: str, seed: int):
    """The accuracy budget of task ``key`` (``planforge.quant.parse_budget``), its knob space (the weight format
    a gene beside the tiles when a budget is stated), the validator that judges its finalists, and what the
    screen of formats found (each format's error before any kernel ran; those over budget are not searched)."""
    try:
        budgets = parse_budget(accuracy)
    except QuantError as e:
        raise WorkloadError(f"option accuracy={accuracy!r}: {e}") from None
    budget = budgets.of(key)
    if not budgets.stated:
        return None, target.knob_space(problem), None, {}
    if not isinstance(target, QuantTarget) or len(target.quant_variants(problem)) < 2:
        raise WorkloadError(f"an accuracy budget was stated, but the {target.name} target's {problem.op} template "
                            f"reads fp32 weights only")
    # validation inputs: drawn with another seed than the search checks its candidates on
    vseed = seed + 1
    check = AccuracyBudget(budget, lambda c: target.validation_output(problem, c.as_dict(), vseed))
    if not budget.allows_quantisation:
        return budgets, target.quant_space(problem, ("fp32",)), check, {}
    variants = target.quant_variants(problem)
    errors = target.variant_errors(problem, variants, vseed, budget.measure)
    kept = tuple(v for v in variants if v == "fp32" or budget.excess(errors[v]) is None)
    screen = {"metric": budget.metric, "errors": errors, "searched": list(kept)}
    return budgets, target.quant_space(problem, kept), check, screen


def kernel_workload(problem, seed: int = 0, target: str | Target = "cpu", accuracy: str = "") -> Workload:
    """A one-task workload measuring ``problem`` (from ``target.problem(op, dims, epilogue)``).

    Parameters:
        problem: the kernel problem, one of ``target``'s templates.
        seed: seeds the inputs (default 0).
        target: a target name or a ``Target`` (default "cpu": this machine, its profile quick
            when ``PLANFORGE_PROBE=quick``).
        accuracy: the accuracy budget, ``METRIC:BOUND`` (``planforge.quant.parse_budget``; default "": none
            stated, which allows no quantisation). Stated, the weight format (fp32, bf16, int8, int4) is a
            gene of the plan, and the finalist walk rejects a plan whose measured error is over budget.
    """
    target = get_target(target)
    key = f"{problem.op}_{'x'.join(map(str, problem.dims))}_{problem.epilogue}"
    budgets, space, check, screen = _quantised(problem, target, accuracy, key, seed)
    backend = target.kernel_backend(problem, seed=seed)
    own = isinstance(target, ModelledTarget)
    task = Task(
        key=target.task_key(problem) if own else key,
        space=space,
        backend=backend,
        # the roofline model: the L0 funnel, the learned model's features, the proxy diagnostics
        cost_model=target.cost_model(problem, space) if own else analytic_model(problem, space, target,
                                                                                 cold=target.cold),
        validators=(check,) if check else (),
        # the spec records the plan's format, measured error, tiles and budget, and the screen of formats
        record=(lambda c: {**check.record(c), **({"screen": screen} if screen else {})}) if check else None,
    )
    shapes = target.input_shapes(problem)
    dtypes = target.input_dtypes(problem) if own else {k: "fp32" for k in shapes}
    manifest = Manifest(problem.op, shapes=shapes, dtypes=dtypes,
                        options={"dims": list(problem.dims), "epilogue": problem.epilogue, "seed": seed},
                        accuracy=budgets.to_json() if budgets else None)
    return Workload(manifest, [task], description=f"{problem.op} {problem.dims} {problem.epilogue} on the "
                                                  f"{target.name} target")


def gemm(shape: str = "64,256,256", epilogue: str = "bias_relu", seed: int = 0, accuracy: str = "",
         target: str | Target = "cpu") -> Workload:
    """C = act(A @ B + bias) with A: [M, K], B: [K, N]; M = 1 takes the GEMV template. accuracy: a budget such
    as max_rel_err:0.01 makes the weight format a gene (default none: fp32 weights only)."""
    t = get_target(target)
    M, N, K = _dims(shape, 3, "M,N,K")
    p = t.problem("gemv", (N, K), epilogue) if M == 1 else t.problem("gemm", (M, N, K), epilogue)
    return kernel_workload(p, seed, t, accuracy)


def gemv(shape: str = "256,256", epilogue: str = "bias_relu", seed: int = 0, accuracy: str = "",
         target: str | Target = "cpu") -> Workload:
    """y = act(x @ W + bias) with x: [K], W: [K, N]. accuracy: a budget such as max_rel_err:0.01 or
    cosine:0.9999 makes the weight format (fp32, bf16, int8, int4) a gene (default none: fp32 weights only)."""
    t = get_target(target)
    return kernel_workload(t.problem("gemv", _dims(shape, 2, "N,K"), epilogue), seed, t, accuracy)


def softmax(shape: str = "32,256", seed: int = 0, target: str | Target = "cpu") -> Workload:
    """Row-wise softmax of an [rows, cols] matrix."""
    t = get_target(target)
    return kernel_workload(t.problem("softmax", _dims(shape, 2, "rows,cols")), seed, t)


def layernorm(shape: str = "32,256", seed: int = 0, target: str | Target = "cpu") -> Workload:
    """Row-wise layer normalisation of an [rows, cols] matrix (gamma, beta)."""
    t = get_target(target)
    return kernel_workload(t.problem("layernorm", _dims(shape, 2, "rows,cols")), seed, t)


def eltwise(shape: str = "64,1024", epilogue: str = "bias_gelu", seed: int = 0,
            target: str | Target = "cpu") -> Workload:
    """An elementwise chain (steps among bias, relu, gelu, add, joined by '_')."""
    t = get_target(target)
    return kernel_workload(t.problem("eltwise", _dims(shape, 2, "rows,cols"), epilogue), seed, t)
