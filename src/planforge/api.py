"""Python API: load a tuned plan from its spec and call it like a function."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .spec import SpecError, load_spec


class PlanMismatch(SpecError):
    """A spec that does not fit this machine or these inputs."""


def _graph_for(manifest: dict[str, Any]):
    from .ir import ZOO

    opts = manifest.get("options", {})
    if manifest["workload"] in ZOO:
        return ZOO[manifest["workload"]]()
    if "file" in opts:
        from .ir import load_model
        from .workloads.models import parse_shapes

        return load_model(opts["file"], input_shapes=parse_shapes(opts.get("input_shapes", "")))
    raise PlanMismatch(f"spec workload {manifest['workload']!r} is not a graph plan (a zoo model or a model file); "
                       "only graph plans can be loaded and run")


def load(spec_path: str | os.PathLike, check_device: bool = True) -> "LoadedPlan":
    """The plan a spec describes, compiled for this machine, as a callable.

    The weights come from the workload the spec references (a zoo model or
    model file); kernels are rebuilt from the spec's knobs (or taken from the
    build cache). ``check_device`` (default True) refuses a spec tuned on
    another machine: its times say nothing about this one."""
    spec = load_spec(spec_path)
    task = spec["tasks"].get("graph")
    if task is None or "program" not in task:
        raise PlanMismatch(f"{spec_path}: not a graph plan (tasks: {', '.join(spec['tasks'])}); "
                           "tune a model workload to get a runnable plan")
    if check_device and spec["target"]["backend"] == "cpu":
        from .backends.probe import hardware

        here = hardware().fingerprint
        if spec["target"]["fingerprint"] != here:
            raise PlanMismatch(f"{spec_path} was tuned on device {spec['target']['fingerprint']}, this machine is "
                               f"{here}; re-tune here (or pass check_device=False to run it anyway)")
    graph = _graph_for(spec["manifest"])
    want = {k: list(v) for k, v in graph.inputs.items()}
    if want != spec["manifest"]["shapes"]:
        raise PlanMismatch(f"{spec_path}: the workload's inputs {want} no longer match the spec's "
                           f"{spec['manifest']['shapes']}")
    return LoadedPlan(spec, graph, task)


class LoadedPlan:
    """Call with the graph's inputs (numpy arrays, or torch tensors on the CPU) in order."""

    def __init__(self, spec: dict, graph, task: dict):
        from .backends.graph import numpy_forward, template_source
        from .backends.plan import Plan
        from .kernels.build import build_many
        from .kernels.cpu import Problem

        self.spec, self.graph = spec, graph
        self.fallback = task.get("fallback")
        program = task["program"]
        if self.fallback:
            self._fn: Callable = numpy_forward(graph)
            self.plan = None
            return
        problems = {}
        for s in program:
            p = s.get("problem")
            if p is not None:
                problems[s["cls"]] = tuple(tuple(x) for x in p["layers"]) if "layers" in p else Problem.from_json(p)
        items = list(problems.items())
        built = build_many([template_source(p, next(s for s in program if s["cls"] == c)["knobs"]) for c, p in items])
        libs = {}
        for (c, _), (b, err, log) in zip(items, built):
            if b is None:
                raise PlanMismatch(f"step {c} does not compile here: {err}")
            libs[c] = str(b.path)
        self.plan = Plan(graph, program, libs, problems)
        self._fn = self.plan

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    def __call__(self, *inputs):
        torch_in = any(type(x).__module__.startswith("torch") for x in inputs)
        arrays = [x.detach().cpu().numpy() if type(x).__module__.startswith("torch") else np.asarray(x)
                  for x in inputs]
        outs = self._fn(*arrays)
        if torch_in:
            import torch

            outs = [torch.from_numpy(np.ascontiguousarray(o)) for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

