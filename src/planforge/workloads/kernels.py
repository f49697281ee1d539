"""Single-kernel workloads: gemm (gemv at M = 1), softmax, layernorm, eltwise, on a target (default the CPU).

``planforge tune --workload gemm --shape M,N,K --epilogue bias_relu`` tunes the
GEMM template's knobs for that shape on this machine, measures numpy (and
torch, when installed) on the same inputs in the same run, and falls back to
the best library when the tuned kernel is not within 95% of it.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..costmodel.analytic import analytic_model
from ..targets import Target, get_target
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


def kernel_workload(problem, seed: int = 0, target: str | Target = "cpu") -> Workload:
    """A one-task workload measuring ``problem`` (from ``target.problem(op, dims, epilogue)``).

    Parameters:
        problem: the kernel problem, one of ``target``'s templates.
        seed: seeds the inputs (default 0).
        target: a target name or a ``Target`` (default "cpu": this machine, its profile quick
            when ``PLANFORGE_PROBE=quick``).
    """
    target = get_target(target)
    space = target.knob_space(problem)
    backend = target.kernel_backend(problem, seed=seed)
    own = isinstance(target, ModelledTarget)
    task = Task(
        key=target.task_key(problem) if own else f"{problem.op}_{'x'.join(map(str, problem.dims))}_{problem.epilogue}",
        space=space,
        backend=backend,
        # the roofline model: the L0 funnel, the learned model's features, the proxy diagnostics
        cost_model=target.cost_model(problem, space) if own else analytic_model(problem, space, target,
                                                                                 cold=target.cold),
    )
    shapes = target.input_shapes(problem)
    dtypes = target.input_dtypes(problem) if own else {k: "fp32" for k in shapes}
    manifest = Manifest(problem.op, shapes=shapes, dtypes=dtypes,
                        options={"dims": list(problem.dims), "epilogue": problem.epilogue, "seed": seed})
    return Workload(manifest, [task], description=f"{problem.op} {problem.dims} {problem.epilogue} on the "
                                                  f"{target.name} target")


def gemm(shape: str = "64,256,256", epilogue: str = "bias_relu", seed: int = 0, target: str | Target = "cpu") -> Workload:
    """C = act(A @ B + bias) with A: [M, K], B: [K, N]; M = 1 takes the GEMV template."""
    t = get_target(target)
    M, N, K = _dims(shape, 3, "M,N,K")
    p = t.problem("gemv", (N, K), epilogue) if M == 1 else t.problem("gemm", (M, N, K), epilogue)
    return kernel_workload(p, seed, t)


def gemv(shape: str = "256,256", epilogue: str = "bias_relu", seed: int = 0, target: str | Target = "cpu") -> Workload:
    """y = act(x @ W + bias) with x: [K], W: [K, N]."""
    t = get_target(target)
    return kernel_workload(t.problem("gemv", _dims(shape, 2, "N,K"), epilogue), seed, t)


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
