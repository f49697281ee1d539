"""Python API: load a tuned plan from its spec and call it like a function."""
from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .ir.graph import INPUT_DTYPES
from .spec import SpecError, load_spec
from .targets import Target, TargetError, get_target


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
    raise PlanMismatch(f"spec workload {manifest['workload']!r} is not a zoo model or a model file, so its weights "
                       "are not known here: pass the graph (load(spec, graph=...)) or the module "
                       "(planforge.compile(module, spec=...)); only graph plans can be loaded and run")


def load(spec_path: str | os.PathLike, check_device: bool = True, graph=None,
         target: str | Target | None = None) -> "LoadedPlan":
    """The plan a spec describes, compiled for this machine, as a callable.

    The weights come from the workload the spec references (a zoo model or
    model file), or from ``graph`` when given (a graph imported from the module
    the spec was tuned on, see ``planforge.compile``); kernels are rebuilt from
    the spec's knobs (or taken from the build cache) by ``target`` (a name or a
    ``Target``; default None: the target the spec was tuned on). ``check_device``
    (default True) refuses a spec tuned on another device: its times say
    nothing about this one."""
    spec = load_spec(spec_path)
    task = spec["tasks"].get("graph")
    # a partitioned spec: every part has its program, or runs its library having found no valid plan
    chained = "partition" in spec and all("program" in t or "no_plan" in t for t in spec["tasks"].values())
    if not chained and (task is None or "program" not in task):
        raise PlanMismatch(f"{spec_path}: not a graph plan (tasks: {', '.join(spec['tasks'])}); "
                           "tune a model workload to get a runnable plan")
    tuned_on = spec["target"]["backend"]
    try:
        tgt = get_target(target if target is not None else tuned_on)
    except TargetError as e:
        raise PlanMismatch(f"{spec_path}: {e}") from None
    if tgt.name != tuned_on:
        raise PlanMismatch(f"{spec_path} was tuned on target {tuned_on!r}, not {tgt.name!r}; re-tune there")
    if check_device:
        here = tgt.fingerprint
        if spec["target"]["fingerprint"] != here:
            raise PlanMismatch(f"{spec_path} was tuned on device {spec['target']['fingerprint']}, this machine is "
                               f"{here}; re-tune here (or pass check_device=False to run it anyway)")
    graph = graph if graph is not None else _graph_for(spec["manifest"])
    want = {k: list(v) for k, v in graph.inputs.items()}
    if want != spec["manifest"]["shapes"]:
        raise PlanMismatch(f"{spec_path}: the workload's inputs {want} no longer match the spec's "
                           f"{spec['manifest']['shapes']}")
    return LoadedPlan(spec, graph, None if chained else task, tgt)


class LoadedPlan:
    """Call with the graph's inputs (numpy arrays, or torch tensors on the CPU) in order.

    Built by ``load``: ``target`` compiles the spec's ``task`` (its program, or the library
    baseline when the spec fell back to it) for ``graph``; ``task`` None: a partitioned spec,
    whose parts' plans are chained (``endtoend.chain_from_spec``)."""

    def __init__(self, spec: dict, graph, task: dict | None, target: Target):
        self.spec, self.graph, self.target = spec, graph, target
        self.fallback = task.get("fallback") if task is not None else None
        self._signature = [(tuple(spec["manifest"]["shapes"][n]), np.dtype(INPUT_DTYPES[graph.input_dtype(n)]))
                           for n in graph.inputs]
        try:
            if task is None:
                from .endtoend import chain_from_spec

                self.plan = chain_from_spec(spec, graph, target)
            else:
                self.plan = target.plan(graph, None if self.fallback else task["program"])
        except TargetError as e:
            raise PlanMismatch(str(e)) from None
        except ValueError as e:  # the graph does not cut into the spec's parts
            raise PlanMismatch(f"{e}") from None
        self._fn = self.plan
        self._fast = self.plan.run_on
        self._one = None
        if len(self._signature) == 1 and len(self.plan.output_classes) == 1:
            self._one = (*self._signature[0], self.plan.single())
            lean = getattr(self.plan, "lean", None)  # a CPU plan's optional compiled hot path
            fast = None
            if lean is not None:
                # it checks the input's type, shape and dtype itself; anything else comes back to _call (through a
                # weak reference: the plan and its pool go when this object goes)
                ref = weakref.ref(self)
                fast = lean(lambda *xs, out=None: ref()._call(xs, out))
            if fast is not None:
                # calling this object is then that one compiled call, with no Python frame before it: a class
                # attribute without __get__ is called without self, so this instance's own subclass holds it
                self.__class__ = type(type(self).__name__, (type(self),), {"__call__": fast, "__slots__": ()})

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    def __call__(self, *inputs, out=None):
        """The outputs for ``inputs``; ``out`` (default None): an array (a tuple for several outputs) to write
        them into and return instead of fresh ones."""
        return self._call(inputs, out)

    def _call(self, inputs, out=None):
        # the hot path (a batch-1 control loop): one array exactly as tuned, nothing to convert or check further
        if len(inputs) == 1 and self._one is not None:
            x = inputs[0]
            if type(x) is np.ndarray and x.shape == self._one[0] and x.dtype == self._one[1]:
                if out is None:
                    return self._one[2](x)
                if getattr(self.plan, "single_takes_out", False):
                    return self._one[2](x, out=out)
        outs = self._outputs(inputs)
        if out is None:
            return outs[0] if len(outs) == 1 else tuple(outs)
        dest = (out,) if len(outs) == 1 else tuple(out)
        if len(dest) != len(outs):
            raise PlanMismatch(f"out holds {len(dest)} arrays; the plan has {len(outs)} outputs")
        for d, o in zip(dest, outs):
            if getattr(d, "shape", None) != tuple(np.shape(o)):
                raise PlanMismatch(f"out has shape {getattr(d, 'shape', None)}; the output is {tuple(np.shape(o))}")
            d[...] = o.detach().numpy() if type(o).__module__.startswith("torch") else o
        return out

    def _outputs(self, inputs) -> list:
        sig = self._signature
        if len(inputs) == len(sig) and all(type(x) is np.ndarray and x.shape == shp and x.dtype == dt
                                           for x, (shp, dt) in zip(inputs, sig)):
            return list(self._fast(*inputs))
        torch_in = any(type(x).__module__.startswith("torch") for x in inputs)
        # zero-copy: a CPU tensor's numpy view and np.asarray of an array share memory with the caller's
        arrays = [x.detach().cpu().numpy() if type(x).__module__.startswith("torch") else np.asarray(x)
                  for x in inputs]
        check_inputs(self.spec, self.graph, arrays)
        outs = self._fn(*arrays)
        if torch_in:
            import torch

            outs = [torch.from_numpy(np.ascontiguousarray(o)) for o in outs]
        return list(outs)



_NUMPY_DTYPES = INPUT_DTYPES   # manifest dtype -> numpy


def check_inputs(spec: dict, graph, arrays) -> None:
    """Refuse inputs that do not match the spec's manifest (count, shapes, dtypes), naming the first mismatch."""
    names = list(graph.inputs)
    where = f"spec for {spec['manifest']['workload']!r}"
    if len(arrays) != len(names):
        raise PlanMismatch(f"{where} takes {len(names)} input(s) ({', '.join(names)}), got {len(arrays)}")
    for name, a in zip(names, arrays):
        want = tuple(spec["manifest"]["shapes"][name])
        if tuple(a.shape) != want:
            raise PlanMismatch(f"{where}: input {name!r} has shape {tuple(a.shape)}, the plan was tuned for {want}; "
                               "re-tune for this shape (planforge.compile(..., retune=True))")
        dt = spec["manifest"]["dtypes"].get(name, graph.dtype)
        if a.dtype != _NUMPY_DTYPES.get(dt, a.dtype):
            raise PlanMismatch(f"{where}: input {name!r} has dtype {a.dtype}, the plan was tuned for {dt}")


def _is_torch_module(x) -> bool:
    return any(c.__module__.startswith("torch.nn") and c.__name__ == "Module" for c in type(x).__mro__)


def _as_tuple(example_inputs) -> tuple:
    if example_inputs is None:
        return ()
    return tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)


def _workload(workload_or_module, example_inputs, name: str | None, options: dict[str, Any] | None,
              target: Target | None):
    from .workloads import Workload, load_workload

    if isinstance(workload_or_module, Workload):
        built_for = sorted({t.backend.name for t in workload_or_module.tasks})
        if target is not None and built_for != [target.name]:
            raise ValueError(f"workload {workload_or_module.name!r} was built for target {', '.join(built_for)}, not "
                             f"{target.name!r}: build it with load_workload(..., target={target.name!r})")
        return workload_or_module
    if isinstance(workload_or_module, (str, os.PathLike)):
        return load_workload(str(workload_or_module), options, target)
    if _is_torch_module(workload_or_module) or type(workload_or_module).__name__ == "ExportedProgram":
        try:
            from .ir import from_torch
        except ImportError as e:
            raise ValueError(f"tuning a torch module needs planforge's torch importer, which this install lacks "
                             f"({e})") from None
        from .workloads.models import example_arrays, graph_workload

        args = _as_tuple(example_inputs)
        if not args and type(workload_or_module).__name__ != "ExportedProgram":
            raise ValueError("tuning a torch module needs example_inputs (the tensors forward() takes; their shapes "
                             "become the plan's shapes)")
        opts = dict(options or {})
        graph = from_torch(workload_or_module, args, name=name, strict=bool(opts.get("strict", False)))
        given = example_arrays(graph, args) if opts.get("accuracy") else None
        # with an accuracy budget, quantised plans are judged on the user's own inputs (and draws like them)
        return graph_workload(graph, name or graph.name, target=target if target is not None else "cpu",
                              example_inputs=[given] if given is not None else (),
                              **{k: opts[k] for k in ("memory_budget_mb", "seed", "accuracy", "kernel_trials")
                                 if k in opts})
    raise TypeError(f"planforge.tune takes a workload name, a model file, a Workload or a torch.nn.Module, "
                    f"got {type(workload_or_module).__name__}")


def tune(workload_or_module, example_inputs=None, target: str | Target | None = None, budget: int = 64,
         strategy: str = "auto",
         seed: int = 0, out: str | os.PathLike | None = None, time_budget: float | None = None, keep: int = 4,
         options: dict[str, Any] | None = None, name: str | None = None, resume: bool = False,
         executor: dict[str, Any] | None = None, scheduler: str = "gradient", warm_start=(), l2=None):
    """Tune a workload the way ``planforge tune`` does, from Python; returns a ``TuneResult``.

    Parameters:
        workload_or_module: a built-in workload name (``"policy-mlp"``, ``"gemm"``...), a model file
            (.onnx, .pt2), a ``Workload``, or a ``torch.nn.Module`` (imported with
            ``planforge.ir.from_torch`` at ``example_inputs``).
        example_inputs: the module's positional inputs (a tensor or a tuple); needed for modules only.
        target: where to tune: a target name (``"cpu"``, ``"table"``...; see ``planforge.targets.TARGETS``) or a
            ``Target``; default None: the workload's own (the CPU for kernels, models and modules, the table for
            the drill). An unknown name is a ``ValueError`` listing the known ones.
        budget: unique evaluations (default 64); ``time_budget``: wall seconds of the search (default none); for a
            workload of several tasks (a partitioned model), the totals that ``scheduler`` spends across them.
        scheduler: ``"gradient"`` (default: each grant to the task of the largest estimated end-to-end gain per
            evaluation, after a warm-up round) or ``"round-robin"`` (evenly); see ``planforge.search.scheduler``.
        strategy: a search strategy name or ``"auto"`` (default).
        out: output folder for spec.json, run.json and report.html (default ``planforge-out/NAME``).
        options: workload options, as ``--option key=value`` gives them; for a torch module ``strict`` (default
            False) refuses ops with no rule, listing them all, instead of running them as library fallback steps.
            ``accuracy`` (``"max_rel_err:0.01"``...) allows quantised weights within that budget; for a torch
            module a quantised plan is then judged on ``example_inputs`` and draws like them.
        executor: where measurements run, as ``--executor`` gives it: ``{"kind": "local", "workers": 4}`` or
            ``{"kind": "ray", "address": "auto"}`` (default None: one local worker). Slots of several device
            fingerprints tune each on its own and write a spec each (``.specs``).
        warm_start: records databases, Kernel Tuner caches or T4 files of the same kernel tuned on other devices
            or shapes, as ``--warm-start`` gives them (default none; ``auto`` still warm-starts from the records
            database by itself when it holds the task under another device or a nearby shape).
        l2: L2 proposers after the search, as ``--l2`` gives them: ``"auto"``, ``"always"``, or
            ``{"mode": ..., "budget": 8, "proposer": "playbook"|"llm"|"both"}`` (default None: off; see
            ``planforge.l2``).
    The result has ``.spec`` (the spec as a dict), ``.spec_path``, ``.report_path`` and ``.plan``
    (the chosen plan as a callable; graph workloads); ``.specs`` maps each device fingerprint tuned to its spec
    file (``spec.json`` for this machine's)."""
    from .l2 import L2Settings
    from .search import Budget
    from .tuning import tune as run_tune

    if l2 is not None and not isinstance(l2, L2Settings):  # a bad mode or proposer fails before any work
        l2 = L2Settings(**l2) if isinstance(l2, dict) else L2Settings(str(l2))
    wl = _workload(workload_or_module, example_inputs, name, options, None if target is None else get_target(target))
    out = Path(out) if out is not None else Path("planforge-out") / wl.name
    call = f"planforge.tune({wl.name!r}, budget={budget}, strategy={strategy!r}, seed={seed})"
    return run_tune(wl, strategy=strategy, budget=Budget(evals=budget, seconds=time_budget), seed=seed, keep=keep,
                    out=out, resume=resume, command=call, executor=executor, plan_loader=load_tuned,
                    scheduler=scheduler, warm_start=warm_start, l2=l2)


def load_tuned(spec_path: Path, workload) -> "LoadedPlan":
    """The plan a run of ``workload`` chose, from its spec, with the workload's own weights: how
    ``TuneResult.plan`` loads it (the driver sits below the API, so the API hands it this)."""
    return load(spec_path, graph=workload.graph)


class Compiled:
    """What ``planforge.compile`` returns: call it like the module. The plan is loaded (or tuned) on first call."""

    def __init__(self, module, example_inputs=None, spec: str | os.PathLike | None = None, retune: bool = False,
                 check_device: bool = True, target: str | Target | None = None, **tune_kwargs):
        self.module, self.spec_path = module, Path(spec) if spec is not None else None
        self.example_inputs = _as_tuple(example_inputs)
        self.retune, self.check_device, self.tune_kwargs = retune, check_device, tune_kwargs
        self.target = target
        self.plan: LoadedPlan | None = None
        self.result = None  # the TuneResult, when this object tuned

    def _graph(self, args):
        if _is_torch_module(self.module):
            from .ir import from_torch

            return from_torch(self.module, args)
        return None

    def _tune(self, args) -> None:
        self.result = tune(self.module, args or None, target=self.target, **self.tune_kwargs)
        if not self.result.ok or self.result.spec_path is None:
            raise PlanMismatch(f"tuning {self.result.workload.name} found no valid plan")
        self.spec_path = self.result.spec_path
        self.plan = load(self.spec_path, self.check_device, graph=self._graph(args) if args else None,
                         target=self.target)

    def prepare(self, *args) -> LoadedPlan:
        """Load (or tune) the plan for inputs ``args`` (default: the example inputs) without running it."""
        args = args or self.example_inputs
        if self.spec_path is None:
            self._tune(args)
            return self.plan
        try:
            self.plan = load(self.spec_path, self.check_device, graph=self._graph(args) if args else None,
                             target=self.target)
            if args:
                arrays = [x.detach().cpu().numpy() if type(x).__module__.startswith("torch") else np.asarray(x)
                          for x in args]
                check_inputs(self.plan.spec, self.plan.graph, arrays)
        except PlanMismatch:
            if not self.retune:
                raise
            self._tune(args)
        return self.plan

    def __call__(self, *args):
        if self.plan is None:
            self.prepare(*args)
        return self.plan(*args)


def compile(module, example_inputs=None, spec: str | os.PathLike | None = None, retune: bool = False,
            check_device: bool = True, target: str | Target | None = None, **tune_kwargs) -> Compiled:
    """A callable running ``module``'s tuned plan, like ``torch.compile``.

    With ``spec``, the plan it describes is loaded on first call (weights from
    ``module``); a spec whose manifest does not match the inputs (shapes,
    dtypes) or this machine is refused with ``PlanMismatch``, or re-tuned when
    ``retune=True``. Without ``spec``, the first call tunes (``tune_kwargs``
    go to ``planforge.tune``: budget, strategy, out...) at the shapes of
    ``example_inputs``, or of the first call's inputs when none are given.
    ``target`` (a name or a ``Target``; default None: the CPU, or the spec's
    target) tunes and runs the plan there."""
    return Compiled(module, example_inputs, spec, retune, check_device, target, **tune_kwargs)
