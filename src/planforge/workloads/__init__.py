"""Built-in workloads, by name. ``load_workload(name, options, target)`` builds one."""
from __future__ import annotations

import inspect
from typing import Any, Callable

from ..targets import Target
from ..ir import ZOO
from ..rewrite.partition import WHOLE_BELOW
from .base import Manifest, Task, Workload, WorkloadError
from .drill import drill
from .kernels import eltwise, gemm, gemv, layernorm, softmax
from .measured import TRIALS
from .models import file_workload, zoo_workload


def _zoo(name: str) -> Callable[..., Workload]:
    def build(memory_budget_mb: float = 1024.0, seed: int = 0, objective: str = "", whole_below: int = WHOLE_BELOW,
              accuracy: str = "", kernel_trials: int = TRIALS, target: str | Target = "cpu") -> Workload:
        return zoo_workload(name, memory_budget_mb=memory_budget_mb, seed=seed, target=target,
                            objective=objective or None, whole_below=whole_below, accuracy=accuracy,
                            kernel_trials=kernel_trials)

    build.__doc__ = (f"The zoo model {name!r}: cut into tasks when it is larger than whole_below ops; objective "
                     f"e.g. control:chunk_steps=8,control_hz=10; accuracy e.g. max_rel_err:0.01 makes the weight "
                     f"format a gene (default none: fp32 weights only); kernel_trials: settings of each seed kernel "
                     f"measured alone before the search (default {TRIALS}; 0: the analytic model's order).")
    return build


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "drill": drill, "gemm": gemm, "gemv": gemv, "softmax": softmax, "layernorm": layernorm, "eltwise": eltwise,
    **{name: _zoo(name) for name in ZOO},
}
DEFAULT_WORKLOAD = "policy-mlp"
MODEL_SUFFIXES = (".onnx", ".pt2")
# every builder takes ``target`` as a keyword; it is not a workload option (``--target`` sets it)
TARGET_PARAM = "target"


def _convert(name: str, value: Any, annotation: Any, default: Any) -> Any:
    kind = type(default) if default is not inspect.Parameter.empty and default is not None else annotation
    if isinstance(value, str) and kind in (int, float, bool, "int", "float", "bool"):
        kind = {"int": int, "float": float, "bool": bool}.get(kind, kind)
        try:
            if kind is bool:
                if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError(value)
                return value.lower() in ("1", "true", "yes")
            return kind(value)
        except ValueError:
            raise WorkloadError(f"option {name}={value!r}: expected {kind.__name__}") from None
    return value


def load_workload(name: str, options: dict[str, Any] | None = None, target: str | Target | None = None) -> Workload:
    """Build the built-in workload (or model file) ``name``.

    Parameters:
        name: a key of ``WORKLOADS`` or a model file path (.onnx, .pt2).
        options: workload options (strings are converted to the option's type; default none).
        target: a target name or a ``Target`` to tune on (default None: the workload's own,
            "cpu" for kernels and models, "table" for the drill).
    Raises ``WorkloadError`` for an unknown workload, option or target, or one the workload cannot
    run on."""
    if name not in WORKLOADS and name.lower().endswith(MODEL_SUFFIXES):
        def build(memory_budget_mb: float = 1024.0, seed: int = 0, input_shapes: str = "",
                  target: str | Target = "cpu", strict: bool = False, peers: str = "auto",
                  accuracy: str = "", inputs: str = "") -> Workload:
            return file_workload(name, memory_budget_mb, seed, input_shapes, target, strict, peers, accuracy, inputs)
    elif name not in WORKLOADS:
        raise WorkloadError(f"unknown workload {name!r}; built-in workloads: {', '.join(sorted(WORKLOADS))}, "
                            f"or a model file ({', '.join(MODEL_SUFFIXES)})")
    else:
        build = WORKLOADS[name]
    params = {k: p for k, p in inspect.signature(build).parameters.items() if k != TARGET_PARAM}
    kwargs = {}
    for k, v in (options or {}).items():
        if k == TARGET_PARAM:
            raise WorkloadError("the target is not a workload option: pass it as --target (target=... in Python)")
        if k not in params:
            known = ", ".join(params) or "none"
            raise WorkloadError(f"workload {name!r} has no option {k!r}; its options: {known}")
        kwargs[k] = _convert(k, v, params[k].annotation, params[k].default)
    if target is not None:
        kwargs[TARGET_PARAM] = target
    try:
        return build(**kwargs)
    except (ValueError, OSError) as e:  # ProblemError, GraphError, TargetError, a missing file...
        raise WorkloadError(f"workload {name!r}: {e}") from None


__all__ = ["DEFAULT_WORKLOAD", "Manifest", "TARGET_PARAM", "Task", "WORKLOADS", "Workload", "WorkloadError",
           "load_workload"]
