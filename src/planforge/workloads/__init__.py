"""Built-in workloads, by name. ``load_workload(name, options)`` builds one."""
from __future__ import annotations

import inspect
from typing import Any, Callable

from .base import Manifest, Task, Workload
from .drill import drill
from .kernels import eltwise, gemm, gemv, layernorm, softmax
from .models import file_workload, zoo_workload


def _zoo(name: str) -> Callable[..., Workload]:
    def build(memory_budget_mb: float = 1024.0, seed: int = 0) -> Workload:
        return zoo_workload(name, memory_budget_mb=memory_budget_mb, seed=seed)

    build.__doc__ = f"The zoo model {name!r}, tuned as a whole plan."
    return build


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "drill": drill, "gemm": gemm, "gemv": gemv, "softmax": softmax, "layernorm": layernorm, "eltwise": eltwise,
    **{name: _zoo(name) for name in ("policy-mlp", "policy-mlp-b64", "drill-mlp", "transformer-block")},
}
DEFAULT_WORKLOAD = "policy-mlp"
MODEL_SUFFIXES = (".onnx", ".pt2")


class WorkloadError(ValueError):
    """An unknown workload or a bad workload option."""


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


def load_workload(name: str, options: dict[str, Any] | None = None) -> Workload:
    """Build the built-in workload ``name`` with ``options`` (strings are converted to the option's type)."""
    if name not in WORKLOADS and name.lower().endswith(MODEL_SUFFIXES):
        def build(memory_budget_mb: float = 1024.0, seed: int = 0, input_shapes: str = "") -> Workload:
            return file_workload(name, memory_budget_mb, seed, input_shapes)
    elif name not in WORKLOADS:
        raise WorkloadError(f"unknown workload {name!r}; built-in workloads: {', '.join(sorted(WORKLOADS))}, "
                            f"or a model file ({', '.join(MODEL_SUFFIXES)})")
    else:
        build = WORKLOADS[name]
    params = inspect.signature(build).parameters
    kwargs = {}
    for k, v in (options or {}).items():
        if k not in params:
            known = ", ".join(params) or "none"
            raise WorkloadError(f"workload {name!r} has no option {k!r}; its options: {known}")
        kwargs[k] = _convert(k, v, params[k].annotation, params[k].default)
    try:
        return build(**kwargs)
    except (ValueError, OSError) as e:  # ProblemError, GraphError, a missing file...
        raise WorkloadError(f"workload {name!r}: {e}") from None


__all__ = ["DEFAULT_WORKLOAD", "Manifest", "Task", "WORKLOADS", "Workload", "WorkloadError", "load_workload"]
