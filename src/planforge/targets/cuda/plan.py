"""The runnable GPU plan: an extracted program lowered to Triton templates and torch library steps.

At load time, as the CPU plan does: values computed from parameters alone
are folded into constants on the host (a transposed weight, two biases
added) and uploaded once; every other value gets a slot of one device arena
whose offsets come from buffer lifetimes (``cpu.plan.plan_arena``: the same
layout, on a torch buffer); a reshape is a view of its input's slot. Each
step is bound once: a template node to its Triton launcher with its knobs
(the GEMM with its epilogue, the batch-1 fused MLP, the row-wise layernorm
and softmax, a one-step eltwise chain, flash attention for ``sdpa``), a library node to its torch calls
(``torchlib``). ``run()`` then launches the bound steps on the inputs
already on the device, with no allocation and no shape logic.

The ``RunnablePlan`` face (``plan(*inputs)``, ``run_on``, ``feed``,
``single``) takes and returns numpy arrays, as every target's plans do: each
call copies the inputs over and the outputs back (and so waits for the GPU).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ...ir import Graph
from ...ops import REGISTRY
from ..cpu.plan import ALIGN, Plan, PlanError, Slot, plan_arena, semantic
from .problem import ProblemError, from_kernel

TEMPLATE_OPS = ("tmpl1", "tmpl2", "tmpl3", "fused_mlp")


def _pair(s: dict) -> bool:
    return s["op"] == "lib2" and s["args"][0] == "pair"


def _folds(s: dict, const) -> bool:
    """Whether library step ``s`` reads parameters alone (its value is computed once, at load time)."""
    return s["op"] in ("lib1", "lib2", "lib3") and bool(s["inputs"]) and all(i in const for i in s["inputs"]) \
        and not _pair(s)


def layout(graph: Graph, program: list[dict]) -> tuple[dict[str, Any], dict[str, str], dict[str, Slot], int]:
    """(constants, aliases, slots, arena floats) of ``program``: the folded values (numpy fp32), the reshapes
    that are views of another class's slot, and the arena slot of every other runtime value."""
    const: dict[str, Any] = {}
    for s in program:
        if s["op"] == "T.param":
            const[s["cls"]] = graph.params[s["args"][0]]
        elif s["op"] == "T.param_t":
            const[s["cls"]] = np.ascontiguousarray(graph.params[s["args"][0]].T)
        elif _folds(s, const):
            const[s["cls"]] = np.ascontiguousarray(
                semantic(s["args"][0], s["args"][1], [const[i] for i in s["inputs"]]), dtype=np.float32)
    alias: dict[str, str] = {}
    slots: dict[str, Slot] = {}
    for i, s in enumerate(program):
        c = s["cls"]
        if c in const or s["op"].startswith("Layers.") or _pair(s):
            continue
        if s["op"] == "lib1" and s["args"][0] == "reshape":
            alias[c] = alias.get(s["inputs"][0], s["inputs"][0])
            continue
        slots[c] = Slot(c, -(-math.prod(s["shape"]) // ALIGN) * ALIGN, -1 if s["op"] == "T.input" else i, i)
    by_cls = {s["cls"]: s for s in program}
    for i, s in enumerate(program):
        for k in s["inputs"]:
            base = alias.get(k, k)
            if base in slots:
                slots[base].last = max(slots[base].last, i)
    for c in outputs_of(program, by_cls):
        base = alias.get(c, c)
        if base in slots:
            slots[base].last = len(program)
    return const, alias, slots, plan_arena(list(slots.values()))


def outputs_of(program: list[dict], by_cls: dict[str, dict]) -> list[str]:
    """The classes of a program's outputs (a ``pair`` root names several)."""
    root = program[-1]
    return Plan._flatten_pairs(root["inputs"] if _pair(root) else [root["cls"]], by_cls)


def peak_bytes_of(graph: Graph, program: list[dict]) -> int:
    """Device bytes a plan of ``program`` holds while it runs: its arena, its constants (fp32) and the fused
    MLPs' packed copies of their layers."""
    const, _, _, floats = layout(graph, program)
    return 4 * floats + sum(v.nbytes for v in const.values()) + _packed_bytes(program, const)


def _packed_bytes(program: list[dict], const: dict) -> int:
    """Bytes of the copies the fused MLP template packs its weights and biases into (one buffer each)."""
    by_cls = {s["cls"]: s for s in program}
    return sum(const[w].nbytes + const[b].nbytes for s in program if s["op"] == "fused_mlp"
               for w, b in Plan._layer_cells(s["inputs"][1], by_cls))


def template_call(problem, knobs: dict, ins: list, out, layers=None) -> Callable[[], None]:
    """A template step's Triton launch: the kernel problem ``problem`` (target-neutral, from the genome) as the
    GPU's, its inputs named as the launchers name them, bound to device tensors ``ins`` and ``out``; a fused
    MLP's ``layers`` are its (weight, bias) tensors."""
    from .jit.run import launcher

    p = from_kernel(problem)
    if p.op == "mlp":
        t = {"x": ins[0].reshape(-1)}
        for i, (w, b) in enumerate(layers):
            t[f"W{i}"], t[f"b{i}"] = w, b
        return launcher(p, knobs, t, out.reshape(-1))
    if p.op == "attention":  # q, k, v [..., H, S, D] as [1, B * H, S, D]
        t = {n: x.reshape(p.dims) for n, x in zip("qkv", ins)}
        return launcher(p, knobs, t, out.reshape(p.dims))
    if p.op == "gemm":
        M, N, K = p.dims
        t = {"A": ins[0].reshape(M, K), "B": ins[1]}
        if len(ins) > 2:
            t["bias"] = ins[2]
        return launcher(p, knobs, t, out.reshape(M, N))
    R, C = p.dims
    t = {"x": ins[0].reshape(R, C)}
    if p.op == "layernorm":
        t.update(gamma=ins[1], beta=ins[2])
    elif p.op == "eltwise" and len(ins) > 1:  # a one-step chain with an operand: a bias vector or a residual
        operand = REGISTRY[p.epilogue].epilogue.operand
        t.update({"bias": ins[1]} if operand == "bias" else {"res": ins[1].reshape(R, C)})
    return launcher(p, knobs, t, out.reshape(R, C))


class CudaPlan:
    """A program bound to a graph's weights on a GPU (or, with ``device="cpu"``, in Triton's interpreter).

    Parameters:
        graph: the source graph (inputs, params).
        program: steps from ``Genome.program`` (children first, root last), with a template step's
            ``problem`` and ``knobs``.
        device: the torch device the plan runs on (default ``"cuda"``).
    Raises ``PlanError`` naming the first step that cannot be bound.
    """

    def __init__(self, graph: Graph, program: list[dict], device: str = "cuda"):
        import torch

        self.graph, self.program, self.device = graph, program, device
        by_cls = {s["cls"]: s for s in program}
        self.output_classes = outputs_of(program, by_cls)
        host, alias, slots, floats = layout(graph, program)
        self.arena_floats = floats
        self.const_bytes = sum(v.nbytes for v in host.values()) + _packed_bytes(program, host)
        self.host_steps = 0  # library steps with no torch form, run on the host (a plan with one is not graphed)
        self._graph = None

        def up(v):
            return torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).to(device)

        const = {c: up(v) for c, v in host.items()}
        self.arena = torch.zeros(floats + ALIGN, dtype=torch.float32, device=device)
        views: dict[str, Any] = {}
        for c, sl in slots.items():
            shape = tuple(by_cls[c]["shape"])
            views[c] = self.arena[sl.offset: sl.offset + math.prod(shape)].view(shape)
        for c, base in alias.items():
            views[c] = views[base].reshape(tuple(by_cls[c]["shape"]))
        value = {**const, **views}
        self.inputs = []
        for name in graph.inputs:
            cls = next((s["cls"] for s in program if s["op"] == "T.input" and s["args"][0] == name), None)
            self.inputs.append((name, views.get(cls)))  # None: the input is not used by this plan
        self.outputs = [value[c] for c in self.output_classes]
        self.steps: list[Callable[[], Any]] = []
        for s in program:
            c = s["cls"]
            if c in views and c not in alias and s["op"] != "T.input":
                self.steps.append(self._bind(s, by_cls, value))

    def _bind(self, s: dict, by_cls: dict, value: dict) -> Callable[[], Any]:
        from . import torchlib

        op, out = s["op"], value[s["cls"]]
        try:
            if op in ("lib1", "lib2", "lib3"):
                kind, attr = s["args"][0], s["args"][1]
                from ...ops import LIBRARIES

                if kind not in LIBRARIES:
                    raise PlanError(f"no library implementation of {kind!r}")
                self.host_steps += not torchlib.on_device(kind)
                return torchlib.bind(kind, LIBRARIES[kind][0].from_egg(attr), [value[k] for k in s["inputs"]], out)
            if op in TEMPLATE_OPS:
                if s.get("problem") is None or s.get("knobs") is None:
                    raise PlanError(f"template step {s['cls']} ({op} {s['args']}) has no problem or knobs")
                if op == "fused_mlp":
                    cells = Plan._layer_cells(s["inputs"][1], by_cls)
                    return template_call(s["problem"], s["knobs"], [value[s["inputs"][0]]], out,
                                         [(value[w], value[b]) for w, b in cells])
                return template_call(s["problem"], s["knobs"], [value[k] for k in s["inputs"]], out)
        except (ProblemError, KeyError, ValueError) as e:
            raise PlanError(f"step {s['cls']} ({op} {s['args'][:1]}): {e}") from None
        raise PlanError(f"step {s['cls']}: {op} is not an implementation")

    # -- running on the device ----------------------------------------------------------
    def run(self) -> None:
        """Launch every step on the inputs already in their device slots (asynchronous on a GPU)."""
        for f in self.steps:
            f()

    def graphed(self) -> Callable[[], None] | None:
        """The plan's launches captured once into a CUDA graph: ``replay()`` then costs one launch for the whole
        plan instead of one Python call per step (the inputs stay in the slots the graph reads). None where there
        is nothing to capture: not on a GPU, or a step that runs on the host. Captured on first call, after two
        warm runs on a side stream (Triton compiles at the first)."""
        if self._graph is None:
            self._graph = False
            if self.device == "cuda" and not self.host_steps:
                import torch

                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    self.run()
                    self.run()
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(g):
                        self.run()
                except RuntimeError:  # a step torch cannot capture: the plan launches step by step
                    return None
                self._graph = g
        return self._graph.replay if self._graph else None

    def load(self, *inputs) -> None:
        """Copy ``inputs`` (numpy arrays or tensors of the tuned shapes) into their device slots."""
        import torch

        for (_, view), x in zip(self.inputs, inputs):
            if view is not None:
                view.copy_(x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x, np.float32)))

    # -- the RunnablePlan face: numpy in, numpy out --------------------------------------------------
    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        if len(inputs) != len(self.inputs):
            raise PlanError(f"the plan takes {len(self.inputs)} inputs ({', '.join(self.graph.inputs)}), "
                            f"got {len(inputs)}")
        for (name, view), x in zip(self.inputs, inputs):
            if view is not None and tuple(np.shape(x)) != tuple(view.shape):
                raise PlanError(f"input {name!r} has shape {tuple(np.shape(x))}; the plan was tuned for "
                                f"{tuple(view.shape)}")
        return self.run_on(*inputs)

    def run_on(self, *inputs: np.ndarray) -> list[np.ndarray]:
        self.load(*inputs)
        (self.graphed() or self.run)()
        return [o.cpu().numpy().copy() for o in self.outputs]

    def feed(self, *inputs: np.ndarray) -> list[np.ndarray]:
        return self.run_on(*inputs)

    def single(self) -> Callable[[np.ndarray], np.ndarray]:
        run = self.run_on
        return lambda x: run(x)[0]

    @property
    def peak_bytes(self) -> int:
        """Device bytes held: the arena plus the constants."""
        return 4 * self.arena_floats + self.const_bytes


class TorchPlan:
    """The torch-eager baseline of a graph as a plan (what a spec that fell back to the library runs)."""

    def __init__(self, graph: Graph, device: str = "cuda"):
        from .torchlib import forward

        self.graph, self.device = graph, device
        self.fn = forward(graph, device)
        self.output_classes = list(graph.outputs)

    def run_on(self, *inputs: np.ndarray) -> list[np.ndarray]:
        import torch

        xs = [torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(self.device) for x in inputs]
        return [o.cpu().numpy().copy() for o in self.fn(*xs)]

    __call__ = feed = run_on

    def single(self) -> Callable[[np.ndarray], np.ndarray]:
        run = self.run_on
        return lambda x: run(x)[0]


__all__ = ["CudaPlan", "TorchPlan", "layout", "peak_bytes_of", "template_call"]
