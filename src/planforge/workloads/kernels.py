"""Single-kernel workloads on the CPU: gemm (gemv at M = 1), softmax, layernorm, eltwise.

``planforge tune --workload gemm --shape M,N,K --epilogue bias_relu`` tunes the
GEMM template's knobs for that shape on this machine, measures numpy (and
torch, when installed) on the same inputs in the same run, and falls back to
the best library when the tuned kernel is not within 95% of it.
"""
from __future__ import annotations

from ..targets.cpu.kernel import CpuBackend
from ..costmodel.analytic import AnalyticModel
from ..targets.cpu.templates import Problem, ProblemError, TEMPLATES, limits, make_inputs
from .base import Manifest, Task, Workload


def _dims(shape: str, n: int, what: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in str(shape).replace("x", ",").split(","))
    except ValueError:
        dims = ()
    if len(dims) != n or min(dims) < 1:
        raise ProblemError(f"--shape {shape!r}: expected {n} positive integers ({what})")
    return dims


def kernel_workload(problem: Problem, seed: int = 0, profile=None) -> Workload:
    """A one-task workload measuring ``problem`` on this machine's CPU."""
    if profile is None:
        import os

        from ..targets.cpu.probe import get_profile

        # PLANFORGE_PROBE=quick accepts (or measures) a quick profile: for tests and CI
        profile = get_profile(quick=os.environ.get("PLANFORGE_PROBE", "") == "quick")
    lim = limits(profile)
    template = TEMPLATES[problem.op]
    space = template.space(problem, lim)
    backend = CpuBackend(problem, template, profile, seed=seed)
    task = Task(
        key=f"{problem.op}_{'x'.join(map(str, problem.dims))}_{problem.epilogue}",
        space=space,
        backend=backend,
        # the roofline model: the L0 funnel, the learned model's features, the proxy diagnostics
        cost_model=AnalyticModel.for_problem(problem, space, profile, cold=backend.timing.flush_bytes > 0),
    )
    shapes = {k: list(v.shape) for k, v in make_inputs(problem, seed, shapes_only=True).items()}
    manifest = Manifest(problem.op, shapes=shapes, dtypes={k: "fp32" for k in shapes},
                        options={"dims": list(problem.dims), "epilogue": problem.epilogue, "seed": seed})
    return Workload(manifest, [task], description=f"{problem.op} {problem.dims} {problem.epilogue} on the CPU")


def gemm(shape: str = "64,256,256", epilogue: str = "bias_relu", seed: int = 0) -> Workload:
    """C = act(A @ B + bias) with A: [M, K], B: [K, N]; M = 1 takes the GEMV template."""
    M, N, K = _dims(shape, 3, "M,N,K")
    p = Problem("gemv", (N, K), epilogue) if M == 1 else Problem("gemm", (M, N, K), epilogue)
    return kernel_workload(p, seed)


def gemv(shape: str = "256,256", epilogue: str = "bias_relu", seed: int = 0) -> Workload:
    """y = act(x @ W + bias) with x: [K], W: [K, N]."""
    return kernel_workload(Problem("gemv", _dims(shape, 2, "N,K"), epilogue), seed)


def softmax(shape: str = "32,256", seed: int = 0) -> Workload:
    return kernel_workload(Problem("softmax", _dims(shape, 2, "rows,cols")), seed)


def layernorm(shape: str = "32,256", seed: int = 0) -> Workload:
    return kernel_workload(Problem("layernorm", _dims(shape, 2, "rows,cols")), seed)


def eltwise(shape: str = "64,1024", epilogue: str = "bias_gelu", seed: int = 0) -> Workload:
    """An elementwise chain (steps among bias, relu, gelu, add, joined by '_')."""
    return kernel_workload(Problem("eltwise", _dims(shape, 2, "rows,cols"), epilogue), seed)
