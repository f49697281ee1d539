"""``torch.compile(model, backend="planforge")``: each graph dynamo captures becomes a planforge plan.

The backend is registered with torch's dynamo backend registry lazily: through
the ``torch_dynamo_backends`` entry point (``pyproject.toml``; torch imports
this module only when a model asks for the backend by name) or by importing
``planforge.dynamo``. Options (``torch.compile(..., options={...})``):

- ``budget`` (default 0): unique evaluations to tune each captured graph with
  on its first call (``planforge.tune``); 0 runs the graph's library plan (each
  op a bound numpy step, fallback steps included) without searching;
- ``spec``: a spec file to apply instead of tuning (``planforge.load``);
- ``strict`` (default False): import with ``strict=True``, so a graph with ops
  planforge has no rule for is refused (and runs eagerly) rather than run with
  fallback steps;
- ``out``: where tuning writes its spec and report (default
  ``planforge-out/dynamo``).

A graph planforge refuses (it does not export, or has dynamic shapes, or a
strict import fails) runs as dynamo gave it, eagerly, with a warning saying
why. Each compiled graph is called with tensors and returns a tuple of
tensors, as dynamo expects.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

NAME = "planforge"


class DynamoFallback(UserWarning):
    """A captured graph planforge did not take; it runs eagerly."""


def _concrete(example_inputs) -> tuple | None:
    """Zero tensors of the example inputs' shapes and dtypes (dynamo may hand fake tensors); None when a size is
    symbolic (a dynamic shape)."""
    import torch

    out = []
    for t in example_inputs:
        if not isinstance(t, torch.Tensor):
            return None
        try:
            shape = tuple(int(d) for d in t.shape)
        except (TypeError, RuntimeError):
            return None
        out.append(torch.zeros(shape, dtype=t.dtype))
    return tuple(out)


def _plan(gm, example_inputs, budget: int, spec: str | None, strict: bool, out: str | None) -> Callable:
    from . import api
    from .ir import from_torch
    from .targets import get_target

    args = _concrete(example_inputs)
    if args is None:
        raise ValueError("the captured graph has symbolic sizes or non-tensor inputs; planforge plans concrete "
                         "shapes (compile with dynamic=False)")
    if spec is not None:
        graph = from_torch(gm, args, name="dynamo", strict=strict)
        return api.load(spec, graph=graph)
    if budget > 0:
        return api.tune(gm, args, budget=int(budget), out=Path(out or "planforge-out/dynamo"),
                        name=f"dynamo_{abs(hash(str(gm.graph))) % 10**8}").plan
    graph = from_torch(gm, args, name="dynamo", strict=strict)
    plan = get_target("cpu").plan(graph, None)
    return lambda *xs: plan(*[np.asarray(x) for x in xs])


def backend(gm, example_inputs, options: dict[str, Any] | None = None, mode: str | None = None) -> Callable:
    """The dynamo backend: ``gm`` (an FX GraphModule) and its example inputs -> a callable on tensors."""
    import torch

    opts = dict(options or {})
    unknown = sorted(set(opts) - {"budget", "spec", "strict", "out"})
    if unknown:
        raise ValueError(f"planforge backend options {unknown} are unknown; known: budget, spec, strict, out")
    try:
        plan = _plan(gm, example_inputs, int(opts.get("budget", 0)), opts.get("spec"), bool(opts.get("strict")),
                     opts.get("out"))
    except (ValueError, OSError, RuntimeError) as e:   # GraphError/ModelError/WorkloadError are ValueErrors
        warnings.warn(f"planforge: a captured graph runs eagerly: {type(e).__name__}: {e}", DynamoFallback,
                      stacklevel=2)
        return gm.forward

    def run(*xs):
        outs = plan(*[x.detach() if isinstance(x, torch.Tensor) else x for x in xs])
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        return tuple(o if isinstance(o, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(o)) for o in outs)

    run.planforge_plan = plan
    return run


def register() -> None:
    """Make ``backend="planforge"`` known to torch (idempotent). Where torch found the entry point, its lookup
    registers the backend itself (and imports this module to do so): registering here too would be a duplicate."""
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

    if NAME not in _COMPILER_FNS and _BACKENDS.get(NAME) is None:
        register_backend(compiler_fn=backend, name=NAME)


register()
