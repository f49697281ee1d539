"""The runnable plan: an extracted program executed over a preallocated arena.

At load time: values computed from parameters alone are folded into
constants (a transposed weight, two biases added, a packed panel), every other
value gets a slot in one arena whose offsets come from buffer lifetimes, and
each step is bound once to its kernel and its arena views. A call then copies
the inputs into their slots and runs one bound call per step: no allocation,
no shape logic, no Python per op beyond that call.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ...ir import Graph
from ...ops import LIBRARIES, REGISTRY
from ...ops.kernel import gemm_residual
from ...ops.pool import geometry as pool_geometry
from .templates import TEMPLATES, maxpool, passes
from .templates.parfor import open_library, wake_step
from .templates.scratch import Pages, aligned_zeros, huge_pages, share

ALIGN = 16  # floats: 64-byte aligned slots
U32 = 2.0**-24


class PlanError(ValueError):
    """A program that cannot be run (an unknown step, a missing library, a bad input)."""


def semantic(kind: str, attr: str, vals: Sequence[np.ndarray]) -> np.ndarray:
    """What a library step computes, by its op's reference semantics (for constant folding)."""
    op, _ = LIBRARIES[kind]
    return np.ascontiguousarray(op.reference(list(vals), op.from_egg(attr)))


# library steps this target runs as one compiled pass where there is a compiler (the op's numpy step otherwise):
# kind -> whether its layout is NHWC
COMPILED_POOLS = {"maxpool2d": False, "maxpool2d_nhwc": True}
# a chain wakes the shared pool where each part begins (``parfor.wake_step``): a part after a run of one-thread
# steps longer than the pool's spin found its worker asleep and ran its first parallel loop alone for the wake's
# tens of microseconds (MobileNetV3-small 96 whole call 0.718 against 0.736 ms, MobileNetV2 1.062 against 1.077)
WAKE_PARTS = True
# the global mean, broadcast multiply and transpose library steps as compiled passes (``templates/passes.py``)
COMPILED_PASSES = True
# a plan's large arrays (packed weights, arenas) in huge pages (``templates/scratch.py``, ``Pages``); a chain's
# parts share one ``Pages`` with their ``SharedArena``
HUGE_PAGES = True


def lib_step(kind: str, attr: str, ins: list[np.ndarray], out: np.ndarray) -> Callable[[], None]:
    """The library implementation ``kind`` (an op's, from the registry) bound to ``ins`` and ``out``; a max pool,
    a global mean, a broadcast multiply, a transpose or a gather as this target's compiled pass
    (``templates/maxpool.py``, ``templates/passes.py``) where it has one and it builds."""
    hit = LIBRARIES.get(kind)
    if hit is None:
        raise PlanError(f"no library implementation of {kind!r}")
    op, lib = hit
    attrs = op.from_egg(attr)
    return compiled_step(kind, attrs, ins, out) or lib.step(ins, out, attrs)


def compiled_step(kind: str, attrs: dict, ins: list[np.ndarray], out: np.ndarray) -> Callable[[], None] | None:
    """The library step ``kind`` as this target's compiled pass, where it has one for these arrays and it builds
    (a native step, so that a chain's run of compiled steps does not break at it); None otherwise."""
    if kind in COMPILED_POOLS:
        return maxpool.bind(ins[0], out, pool_geometry(attrs), COMPILED_POOLS[kind])
    if not COMPILED_PASSES:
        return None
    if kind == "global_avg_pool_nhwc":
        return passes.bind_mean(ins[0], out, nhwc=True)
    if kind == "adaptive_avg_pool2d" and tuple(attrs["out"]) == (1, 1):
        return passes.bind_mean(ins[0], out, nhwc=False)
    if kind == "multiply":
        return passes.bind_mul(ins[0], ins[1], out)
    if kind == "transpose":
        return passes.bind_transpose(ins[0], out, attrs.get("perm"))
    if kind == "gather":
        return passes.bind_gather(ins[0], ins[1], out, int(attrs.get("axis", 0)))
    return None


def template_step(problem, knobs: dict, lib: ctypes.CDLL, ins: list[np.ndarray], out: np.ndarray,
                  layer_params=None, consts: Sequence[bool] = ()) -> Callable[[], None]:
    """Bind a compiled template to arena views, naming the inputs as its problem's ``make_inputs`` does.
    ``consts``: per input, whether it is a constant of the plan (a GEMM packs a constant B once, when bound)."""
    t = TEMPLATES[problem.op]
    op = problem.op
    if t.plan_inputs is not None:
        return t.bind(lib, problem, knobs, t.plan_inputs(problem, ins), out)
    if op == "mlp":
        ws, bs = layer_params
        return t.bind(lib, problem, knobs, {"x": ins[0].reshape(-1), "weights": ws, "biases": bs}, out.reshape(-1))
    if op == "gemm":
        M, N, K = problem.dims
        if gemm_residual(problem.epilogue)[1]:  # linear_add(x, gemm_pack(w, b), r): B and the bias are one operand
            d = {"A": ins[0].reshape(M, K), "B": ins[1][:K], "bias": ins[1][K], "res": ins[2].reshape(M, N)}
        else:
            d = {"A": ins[0].reshape(M, K), "B": ins[1], "bias": ins[2] if len(ins) > 2 else None}
        d["B_const"] = len(consts) > 1 and consts[1]
        return t.bind(lib, problem, knobs, d, out.reshape(M, N))
    if op == "gemv":
        d = {"x": ins[0].reshape(-1), "W": ins[1], "bias": ins[2] if len(ins) > 2 else None}
        return t.bind(lib, problem, knobs, d, out.reshape(-1))
    R, C = problem.dims
    x = ins[0].reshape(R, C)
    if op == "layernorm":
        d = {"x": x, "gamma": ins[1], "beta": ins[2]}
    elif op == "eltwise" and len(ins) > 1:  # a one-step chain with an operand: a bias vector or a residual
        ep = REGISTRY[problem.epilogue].epilogue
        d = {"x": x, "bias": ins[1]} if ep.operand == "bias" else {"x": x, "res": ins[1].reshape(R, C)}
    else:
        d = {"x": x}
    return t.bind(lib, problem, knobs, d, out.reshape(R, C))


@dataclass
class Slot:
    cls: str
    size: int           # floats
    first: int
    last: int
    offset: int = -1


def plan_arena(slots: list[Slot]) -> int:
    """Assign offsets so that slots alive at the same time never overlap; returns the
    arena size in floats. Largest first, each at the lowest offset that fits."""
    placed: list[Slot] = []
    for s in sorted(slots, key=lambda s: (-s.size, s.first)):
        busy = sorted((p.offset, p.offset + p.size) for p in placed if not (p.last < s.first or s.last < p.first))
        off = 0
        for lo, hi in busy:
            if off + s.size <= lo:
                break
            off = max(off, -(-hi // ALIGN) * ALIGN)
        s.offset = off
        placed.append(s)
    return max((s.offset + s.size for s in slots), default=0)


class Plan:
    """A program bound to a graph's weights and compiled kernels; call it on the graph's inputs.

    Parameters:
        graph: the source graph (inputs, params).
        program: steps from ``Genome.program`` (children first, root last).
        libs: compiled library path per template step's ``cls``.
        problems: the kernel problem per template step's ``cls``.
        inputs: arrays that hold some of the graph's inputs (by name) when the plan runs, read in place rather
            than copied into slots of the plan's own: a chain's earlier part's outputs (``out_views``), valid
            until that part runs again (default None: every input gets a slot). ``feed`` skips the copy for an
            input passed as that very array; an array of another shape, dtype or layout gets a slot.
        shared: the region the plans of one chain's parts, which run one after the other, share for the values
            that live only while the part runs (``SharedArena``); its outputs keep slots of its own (later parts
            read them in place). Default None: every value in the plan's own arena.
    """

    def __init__(self, graph: Graph, program: list[dict], libs: dict[str, str], problems: dict[str, Any],
                 inputs: dict[str, np.ndarray] | None = None, shared: "SharedArena | None" = None):
        self.graph, self.program = graph, program
        by_cls = {s["cls"]: s for s in program}
        bound = {}  # T.input cls -> the array it reads in place
        for s in program:
            a = (inputs or {}).get(s["args"][0]) if s["op"] == "T.input" else None
            if isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous \
                    and tuple(a.shape) == tuple(s["shape"]):
                bound[s["cls"]] = a
        root = program[-1]
        outs = root["inputs"] if root["op"] == "lib2" and root["args"][0] == "pair" else [root["cls"]]
        self.output_classes = self._flatten_pairs(outs, by_cls)
        const: dict[str, np.ndarray] = {}
        for s in program:  # constant folding: leaves and anything computed from parameters alone
            if s["op"] == "T.param":
                const[s["cls"]] = graph.params[s["args"][0]]
            elif s["op"] == "T.param_t":
                const[s["cls"]] = np.ascontiguousarray(graph.params[s["args"][0]].T)
            elif s["op"] in ("lib1", "lib2", "lib3") and s["inputs"] and all(i in const for i in s["inputs"]) \
                    and s["args"][0] != "pair":
                const[s["cls"]] = np.ascontiguousarray(
                    semantic(s["args"][0], s["args"][1], [const[i] for i in s["inputs"]]), dtype=np.float32)
        self.constants = const
        # slots for every runtime value; reshape is a view of its input's slot
        alias: dict[str, str] = {}
        slots: dict[str, Slot] = {}
        for i, s in enumerate(program):
            c = s["cls"]
            if c in const or c in bound or s["op"].startswith("Layers.") or \
                    (s["op"] == "lib2" and s["args"][0] == "pair"):
                continue
            if s["op"] == "lib1" and s["args"][0] == "reshape" and s["inputs"][0] not in const:
                alias[c] = alias.get(s["inputs"][0], s["inputs"][0])
                continue
            slots[c] = Slot(c, -(-math.prod(s["shape"]) // ALIGN) * ALIGN, i, i)
        end = len(program)
        for i, s in enumerate(program):
            for k in s["inputs"]:
                base = alias.get(k, k)
                if base in slots:
                    slots[base].last = max(slots[base].last, i)
        for c in self.output_classes:
            base = alias.get(c, c)
            if base in slots:
                slots[base].last = end
        # inputs live from the start; an index or mask input (not fp32) to the end too: ``run`` runs again on the
        # inputs in their slots (a measurement's repeats), and a gather reading a later value's bytes as token ids
        # fails (an fp32 input's slot is reused: the repeat times the same work on other values)
        for name in graph.inputs:
            for s in program:
                if s["op"] == "T.input" and s["args"][0] == name and s["cls"] in slots:
                    slots[s["cls"]].first = -1
                    if graph.input_dtype(name) != graph.dtype:
                        slots[s["cls"]].last = end
        outs = {alias.get(c, c) for c in self.output_classes}
        inner = {c: sl for c, sl in slots.items() if c not in outs} if shared is not None else {}
        self.inner = frozenset(inner)  # the values in the shared region
        self.shared_floats = plan_arena(list(inner.values()))
        self.arena_floats = plan_arena([sl for c, sl in slots.items() if c not in inner])
        self.arena = aligned_zeros(self.arena_floats + ALIGN)  # its slots' offsets are whole lines too
        region = shared.region(self.shared_floats) if inner else None
        views: dict[str, np.ndarray] = dict(bound)
        for c, sl in slots.items():
            shape = tuple(by_cls[c]["shape"])
            buf = region if c in inner else self.arena
            views[c] = buf[sl.offset: sl.offset + math.prod(shape)].reshape(shape)
        for c, base in alias.items():
            views[c] = views[base].reshape(tuple(by_cls[c]["shape"]))
        self.views = views
        self.input_views = []
        for name in graph.inputs:
            cls = next((s["cls"] for s in program if s["op"] == "T.input" and s["args"][0] == name), None)
            self.input_views.append(views.get(cls))  # None: the input is not used by this plan
        self._in = list(zip(graph.inputs, self.input_views))
        self._out = [self._value(c, const, views) for c in self.output_classes]
        self._libs: dict[str, ctypes.CDLL] = {}
        self.steps: list[Callable[[], None]] = []
        self.packed_bytes = 0
        for s in program:
            c = s["cls"]
            if c not in views or c in alias or s["op"] in ("T.input",):
                continue
            self.steps.append(self._bind(s, by_cls, const, views, libs, problems))
        # the steps run one after the other: their scratch (a convolution's padded input copy) is one buffer
        self.scratch = share(self.steps)

    @staticmethod
    def _flatten_pairs(outs, by_cls):
        flat = []
        for o in outs:
            s = by_cls[o]
            if s["op"] == "lib2" and s["args"][0] == "pair":
                flat.extend(Plan._flatten_pairs(s["inputs"], by_cls))
            else:
                flat.append(o)
        return flat

    def _value(self, c: str, const, views) -> np.ndarray:
        return const[c] if c in const else views[c]

    def _bind(self, s, by_cls, const, views, libs, problems) -> Callable[[], None]:
        out = views[s["cls"]]
        op = s["op"]
        if op in ("lib1", "lib2", "lib3"):
            ins = [self._value(k, const, views) for k in s["inputs"]]
            return lib_step(s["args"][0], s["args"][1], ins, out)
        if op in ("tmpl1", "tmpl2", "tmpl3", "fused_mlp"):
            path = libs.get(s["cls"])
            if path is None:
                raise PlanError(f"no compiled library for step {s['cls']} ({op} {s['args']})")
            lib = self._libs.get(path) or self._libs.setdefault(path, open_library(path))
            if op == "fused_mlp":
                cells = self._layer_cells(s["inputs"][1], by_cls)
                ws = [const[w] for w, _ in cells]
                bs = [const[b] for _, b in cells]
                self.packed_bytes += sum(w.nbytes for w in ws)
                return template_step(problems[s["cls"]], s["knobs"], lib, [views[s["inputs"][0]]], out, (ws, bs))
            ins = [self._value(k, const, views) for k in s["inputs"]]
            p = problems[s["cls"]]
            if p.op == "gemv" and s["knobs"].get("w_layout") == "packed":
                self.packed_bytes += ins[1].nbytes
            return template_step(p, s["knobs"], lib, ins, out, consts=[k in const for k in s["inputs"]])
        raise PlanError(f"step {s['cls']}: {op} is not an implementation")

    @staticmethod
    def _layer_cells(cls: str, by_cls) -> list[tuple[str, str]]:
        s = by_cls[cls]
        if s["op"] == "Layers.one":
            return [(s["inputs"][0], s["inputs"][1])]
        return Plan._layer_cells(s["inputs"][0], by_cls) + [(s["inputs"][1], s["inputs"][2])]

    # -- running ------------------------------------------------------------------
    def run(self) -> None:
        """Run every step on the inputs already in their slots (an index or mask input keeps its slot to the end
        of a call; an fp32 input's slot is reused after its last read, so a repeat computes on other values)."""
        for f in self.steps:
            f()

    def __call__(self, *inputs: np.ndarray, out: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """Outputs for ``inputs``: fresh arrays, or written into ``out`` (one array per output, default None)
        and returned; the hot path is one copy in, the steps, one copy out."""
        if out is not None and len(out) != len(self._out):
            raise PlanError(f"out holds {len(out)} arrays; the plan has {len(self._out)} outputs")
        if len(inputs) != len(self._in):
            raise PlanError(f"the plan takes {len(self._in)} inputs ({', '.join(self.graph.inputs)}), got {len(inputs)}")
        for (name, view), x in zip(self._in, inputs):
            if view is None:
                continue
            if getattr(x, "shape", None) != view.shape:
                x = np.asarray(x)
                if x.shape != view.shape:
                    raise PlanError(f"input {name!r} has shape {tuple(x.shape)}; the plan was tuned for {view.shape}")
            np.copyto(view, x, casting="same_kind")
        for f in self.steps:
            f()
        if out is None:
            return [o.copy() for o in self._out]
        for o, r in zip(out, self._out):
            if getattr(o, "shape", None) != r.shape:
                raise PlanError(f"an out array has shape {getattr(o, 'shape', None)}; that output is {r.shape}")
            np.copyto(o, r, casting="same_kind")
        return list(out)

    def run_on(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """``__call__`` for inputs already known to have the tuned shapes and dtype (no checks)."""
        for (_, view), x in zip(self._in, inputs):
            if view is not None:
                view[...] = x
        for f in self.steps:
            f()
        return [o.copy() for o in self._out]

    @property
    def out_views(self) -> list[np.ndarray]:
        """The arrays ``feed`` returns, the same every call (valid until the plan runs again): a later part's
        ``inputs``."""
        return self._out

    def feed(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """``run_on`` returning the output views themselves (valid until the plan runs again): for chaining. An
        input that is the very array the plan reads it from (``inputs``) is not copied."""
        for (_, view), x in zip(self._in, inputs):
            if view is not None and view is not x:
                view[...] = x
        for f in self.steps:
            f()
        return self._out

    single_takes_out = True  # single()'s f(x, out=None) writes into a given output array

    def single(self, lean: bool = True) -> Callable[..., np.ndarray]:
        """For a one-input, one-output plan: ``f(x, out=None) -> y`` with everything bound (no shape checks).

        ``out``: an array of the output's shape to write into and return (default None: a fresh array).
        ``lean`` (default True): the compiled call of ``lean()`` where the plan has one, so that a C-contiguous
        fp32 ``x`` and ``out`` are read and written in place; otherwise (and for any other ``x`` or ``out``) the
        copy path: ``x`` copied into the plan's input slot, the steps, the output copied out."""
        view = self._in[0][1]
        res = self._out[0]
        steps = tuple(self.steps)
        shape = res.shape

        def run(x, out=None):
            if view is not None:
                view[...] = x
            for f in steps:
                f()
            if out is None:
                return res.copy()
            if getattr(out, "shape", None) != shape:
                raise PlanError(f"out has shape {getattr(out, 'shape', None)}; the plan's output is {shape}")
            np.copyto(out, res, casting="same_kind")
            return out

        return (self.lean(run) if lean else None) or run

    def lean(self, fallback: Callable | None = None) -> Callable[..., np.ndarray] | None:
        """The hot path as one compiled call (``fastcall``): ``f(x, *, out=None)`` runs the plan on a numpy
        C-contiguous fp32 ``x`` of the input's shape and ``out`` of the output's (default: a fresh array), and
        hands any other arguments, as given, to ``fallback`` (default None: ``single(lean=False)``). A plan that
        is one native step taking its buffers per call (a fused MLP) runs on ``x`` and ``out`` in place; a plan
        whose every step is native (compiled kernels, no library step) runs as one chain from C, ``x`` copied into
        its input slot and its output slot into ``out``. None when a step is not native, the plan has more than
        one input or output, or the extension cannot be built here."""
        view = self._in[0][1] if len(self._in) == 1 else None
        res = self._out[0] if len(self._out) == 1 else None
        steps = self.steps
        if view is None or res is None or not steps or any(res is c for c in self.constants.values()):
            return None
        from .fastcall import bound

        fallback = fallback or self.single(lean=False)
        entry = getattr(steps[0], "entry", None) if len(steps) == 1 else None
        # the one step must read the input slot and write the output slot, or skipping them would skip data
        if entry is not None and entry[3:] == (view.ctypes.data, res.ctypes.data):
            return bound(entry[0], entry[1], view.shape, res.shape, fallback, entry[2])
        return compiled_call(view, steps, res, fallback, self)

    @property
    def peak_bytes(self) -> int:
        """Arena plus weights (and their packed copies): what the plan holds while it runs."""
        params = sum(v.nbytes for v in self.constants.values())
        return 4 * (self.arena_floats + self.shared_floats) + params + self.packed_bytes


class SharedArena:
    """One region for the values that live within one part of a chain, shared by the parts' plans (``Plan``'s
    ``shared``): the parts run one after the other, so each may use all of it. A whole call then touches one
    part's worth of such values, warm in the caches from the part before, where with an arena per part it
    touched every part's (MobileNetV2 at 96x96: 4.5 MB of arenas, 1.1 MB the largest part's), each last
    written a whole call earlier.

    ``capacity``: floats at least any part asks for, allocated at once before the parts are built (``bound_of``:
    the largest part's values all at once, an upper bound of what its arena needs)."""

    def __init__(self, capacity: int):
        self.pages = Pages()  # the parts' large arrays too (``CpuTarget.plan``)
        with huge_pages(self.pages if HUGE_PAGES else None):
            self.buffer = aligned_zeros(max(int(capacity), 0) + ALIGN)

    def region(self, floats: int) -> np.ndarray:
        """The whole region, for a part that needs ``floats`` of it (``PlanError`` when it is smaller)."""
        if floats > self.buffer.size:
            raise PlanError(f"a part asks for {floats} floats of the chain's shared arena of {self.buffer.size}")
        return self.buffer

    @staticmethod
    def bound_of(programs: list[list[dict]]) -> int:
        """Floats enough for any part of ``programs``: the largest program's values all at once."""
        return max((sum(-(-math.prod(s["shape"]) // ALIGN) * ALIGN for s in prog if s.get("shape") is not None)
                    for prog in programs), default=0)


def rebind(program: list[dict], names: dict[str, str]) -> list[dict]:
    """``program`` with its leaves' input and parameter names renamed by ``names``: the plan of one part run on
    another instance of the same structure (another layer's weights)."""
    out = []
    for s in program:
        if s["op"] in ("T.input", "T.param", "T.param_t") and s["args"][0] in names:
            s = {**s, "args": [names[s["args"][0]], *s["args"][1:]]}
        out.append(s)
    return out


def compiled_call(view: np.ndarray, steps: list, res: np.ndarray, fallback: Callable, owner) -> Callable | None:
    """``steps`` (each native) as one compiled call ``f(x, *, out=None)`` (``fastcall``'s chain runner): ``x`` copied
    into ``view``, the steps run, ``res`` copied into ``out`` (a fresh array by default); other arguments go to
    ``fallback``. None when a step is not native, a slot is not C-contiguous, or the runner does not build here.
    ``owner`` (the plan) is kept alive with the call."""
    from .fastcall import bound, chain

    natives = [getattr(f, "native", None) for f in steps]
    if not natives or None in natives or not (view.flags.c_contiguous and res.flags.c_contiguous):
        return None
    try:
        fn, handle, keep = chain(natives, view, res, (steps, owner))
    except Exception:  # noqa: BLE001 - no compiler for the runner here: the Python path stays
        return None
    return bound(fn, handle, view.shape, res.shape, fallback, keep)


class ChainPlan:
    """A partitioned model's plan: one ``Plan`` per part, in order, each fed the values earlier parts produced.

    Parameters:
        graph: the whole model (its inputs and outputs name the chain's).
        parts: per part, in source order, ``(plan, inputs, outputs)``: its ``Plan`` and the source value names
            it reads and produces (``rewrite.partition.Part``)."""

    def __init__(self, graph: Graph, parts: list[tuple["Plan", list[str], list[str]]]):
        self.graph = graph
        self.parts = [(p, tuple(ins), tuple(outs)) for p, ins, outs in parts]
        self._names = list(graph.inputs)
        self._outputs = list(graph.outputs)
        self.output_classes = list(graph.outputs)
        # the parts run one after the other too: one scratch buffer for every step of the chain, so that a whole
        # call touches one step's worth of scratch (warm in the caches), not a copy per convolution
        self.scratch = share(f for p, _, _ in self.parts for f in getattr(p, "steps", ()))
        for p, _, _ in self.parts:
            if getattr(p, "scratch", None) is not None:
                p.scratch = self.scratch
        self._flat = self._flatten()
        # each run of compiled steps of such a chain one call of a compiled runner (``fastcall.runs``)
        self._calls = None
        if self._flat is not None:
            from .fastcall import runs

            self._calls = runs(self._flat[1])

    def _flatten(self) -> tuple[np.ndarray, list, np.ndarray] | None:
        """(input view, every part's steps in order, output view) when the chain is one run of steps: one input,
        read by the first part alone, one output, and every later part reading what earlier parts produced in
        place (``Plan``'s ``inputs``); None otherwise (then each part is fed in turn)."""
        if len(self._names) != 1 or len(self._outputs) != 1 or not self.parts:
            return None
        first = self.parts[0][0]
        if not isinstance(first, Plan) or tuple(self.parts[0][1]) != tuple(self._names) or len(first._in) != 1 \
                or first._in[0][1] is None:
            return None
        env = {self._names[0]: first._in[0][1]}
        steps: list = []
        for k, (p, ins, outs) in enumerate(self.parts):
            if not isinstance(p, Plan):
                return None
            if k and any(view is not None and view is not env.get(n) for n, (_, view) in zip(ins, p._in)):
                return None
            steps.extend([wake_step(), *p.steps] if WAKE_PARTS else p.steps)
            env.update(zip(outs, p.out_views))
        out = env.get(self._outputs[0])
        return (first._in[0][1], steps, out) if isinstance(out, np.ndarray) else None

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        if len(inputs) != len(self._names):
            raise PlanError(f"the plan takes {len(self._names)} inputs ({', '.join(self._names)}), got {len(inputs)}")
        for name, x in zip(self._names, inputs):
            want = tuple(self.graph.inputs[name])
            if tuple(np.shape(x)) != want:
                raise PlanError(f"input {name!r} has shape {tuple(np.shape(x))}; the plan was tuned for {want}")
        return self.run_on(*inputs)

    def feed(self, *inputs: np.ndarray) -> list[np.ndarray]:
        if self._flat is not None:  # one run of steps: the input into the first part's slot, then every step
            view, _, out = self._flat
            if view is not inputs[0]:
                view[...] = inputs[0]
            for f in self._calls:
                f()
            return [out]
        env: dict[str, np.ndarray] = dict(zip(self._names, inputs))
        for plan, ins, outs in self.parts:
            env.update(zip(outs, plan.feed(*[env[i] for i in ins])))
        return [env[o] for o in self._outputs]

    def run_on(self, *inputs: np.ndarray) -> list[np.ndarray]:
        return [np.array(o, copy=True) for o in self.feed(*inputs)]

    def single(self) -> Callable[[np.ndarray], np.ndarray]:
        feed = self.feed
        return lambda x: np.array(feed(x)[0], copy=True)

    def lean(self, fallback: Callable | None = None) -> Callable[..., np.ndarray] | None:
        """``Plan.lean`` for a chain that is one run of native steps (``_flat``, every step compiled): one compiled
        call, the input copied into the first part's slot and the last part's output into ``out`` (a fresh array
        by default), with no Python frame between (the Python path cost 5-10 us a call: 1-2% of MobileNetV3-small's
        at 96x96); other arguments go to ``fallback``. None otherwise."""
        if self._flat is None:
            return None
        view, steps, res = self._flat
        return compiled_call(view, steps, res, fallback or self.single(), self)

    @property
    def peak_bytes(self) -> int:
        """Each part's own arena and weights, and the region they share once (the largest part's use of it)."""
        shared = max((getattr(p, "shared_floats", 0) for p, _, _ in self.parts), default=0)
        return sum(p.peak_bytes - 4 * getattr(p, "shared_floats", 0) for p, _, _ in self.parts) + 4 * shared


def peak_bytes_of(program: list[dict], graph: Graph) -> int:
    """Peak bytes of a program without compiling it: arena (with workspaces) plus weights."""
    const = set()
    by_cls = {s["cls"]: s for s in program}
    slots: dict[str, Slot] = {}
    alias: dict[str, str] = {}
    params = 0
    for i, s in enumerate(program):
        c = s["cls"]
        if s["op"] in ("T.param", "T.param_t"):
            const.add(c)
            params += graph.params[s["args"][0]].nbytes
            continue
        if s["op"] in ("lib1", "lib2", "lib3") and s["inputs"] and all(k in const for k in s["inputs"]) \
                and s["args"][0] != "pair":
            const.add(c)
            params += 4 * math.prod(s["shape"])
            continue
        if s["op"].startswith("Layers.") or (s["op"] == "lib2" and s["args"][0] == "pair"):
            continue
        if s["op"] == "lib1" and s["args"][0] == "reshape":
            alias[c] = alias.get(s["inputs"][0], s["inputs"][0])
            continue
        ws = 0
        if s["op"] == "lib2" and s["args"][0] == "matmul_bcast":
            x = by_cls[s["inputs"][0]]["shape"]
            w = by_cls[s["inputs"][1]]["shape"]
            ws = math.prod(x) * w[-1]
        slots[c] = Slot(c, -(-(math.prod(s["shape"]) + ws) // ALIGN) * ALIGN, i, i)
    for i, s in enumerate(program):
        for k in s["inputs"]:
            base = alias.get(k, k)
            if base in slots:
                slots[base].last = max(slots[base].last, i)
    root = program[-1]["cls"]
    base = alias.get(root, root)
    if base in slots:
        slots[base].last = len(program)
    for s in program:  # index and mask inputs hold their slots for the whole call, as ``Plan`` keeps them
        if s["op"] == "T.input" and s["cls"] in slots and graph.input_dtype(s["args"][0]) != graph.dtype:
            slots[s["cls"]].first, slots[s["cls"]].last = -1, len(program)
    return 4 * plan_arena(list(slots.values())) + params

