"""Import a PyTorch module into the IR through ``torch.export`` (extra ``torch``).

``from_torch(module, example_inputs)`` exports the module in eval mode at the
example inputs' shapes and maps the ATen graph op by op (the table is
``ATEN`` below). If an op has no mapping, the program is lowered to the core
ATen op set with ``run_decompositions()`` and mapped again, since a composite
op may decompose into mapped ones. An op that still has no mapping runs as a
library fallback step (torch at run time, ``ir.fallback``), unless the import
is ``strict``: then every such op is listed in one ``UnsupportedOps``. Weights come from the exported program's parameters,
buffers and constants; a linear weight is stored [K, N]. Ops whose operands
are all known at import time are evaluated by torch itself and become
constants.
"""
from __future__ import annotations

import operator
import os
import re
import warnings
from typing import Any, Sequence

import numpy as np

from .frontend import (Const, Emitter, ModelError, Unavailable, UnsupportedOp, UnsupportedOps, _first_lines,
                       need_module, op_table)
from ..ops import TORCH
from ..ops.gelu import fold_written_out
from .fallback import torch_node
from .graph import Graph, GraphError, ModelSource


def from_torch(module, example_inputs, name: str | None = None, strict: bool = False) -> Graph:
    """Export ``module`` (a ``torch.nn.Module``) with ``torch.export`` at ``example_inputs`` and import it.

    ``example_inputs``: a tensor or a sequence of tensors, the positional arguments of ``forward``;
    their shapes become the graph's (concrete) shapes. The module is exported in eval mode and the training
    flags of it and its submodules restored afterwards. ``name`` defaults to the module's class name.
    A ``torch.export.ExportedProgram`` may be passed instead of a module (``example_inputs`` is then unused).
    An op with no IR mapping runs as a library fallback step (torch itself, at run time; ``ops.fallback``);
    ``strict`` (default False) refuses the model instead, with an ``UnsupportedOps`` listing every such op.
    """
    torch = need_module("torch", "torch", "importing a PyTorch module")
    if isinstance(module, torch.export.ExportedProgram):
        return from_exported(module, name=name, strict=strict)
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"from_torch expects a torch.nn.Module or an ExportedProgram, got {type(module).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    args = tuple(example_inputs)
    modes = [(m, m.training) for m in module.modules()]   # each submodule's own flag, put back as it was
    try:
        ep = torch.export.export(module.eval(), args)
    except Exception as e:  # export raises many kinds (UserError, Unsupported, TypeError from forward)
        raise ModelError(f"torch.export could not capture {type(module).__name__}: {type(e).__name__}: "
                         f"{_first_lines(str(e))}") from None
    finally:
        for m, training in modes:
            m.training = training
    graph = from_exported(ep, name=name or type(module).__name__, strict=strict)
    graph.source = ModelSource("torch", module=module)  # the user's module, as they would run it eagerly
    return graph


def from_exported(ep, input_shapes: dict[str, Sequence[int]] | None = None, name: str | None = None,
                  strict: bool = False) -> Graph:
    """Import a ``torch.export.ExportedProgram``.

    ``input_shapes`` maps user input names (the names in ``ep.graph_signature``) to concrete shapes;
    it is needed when the program was exported with dynamic sizes, and then the program is
    re-exported at those shapes. ``name`` defaults to ``"exported"``.
    ``strict``: refuse ops with no mapping (all of them listed at once) instead of running them as fallback steps.
    Where the program as exported needs fallbacks, its core-ATen decomposition is tried too, and the import with
    fewer fallback steps is kept.
    """
    name = name or "exported"
    ep = _specialise(ep, input_shapes)
    first, error = None, None
    try:
        first = _Importer(ep, name).run()
        if not first[1]:
            return first[0]
    except UnsupportedOp as e:
        error = e
    try:
        with warnings.catch_warnings():      # torch's own deprecation noise, not the user's concern
            warnings.simplefilter("ignore", FutureWarning)
            core = _Importer(ep.run_decompositions(), name).run()
    except Exception:  # decomposing may raise anything; the import as exported stands
        core = None
    best = min((r for r in (first, core) if r is not None), key=lambda r: len(r[1]), default=None)
    if best is None:
        raise error from None
    graph, fallbacks = best
    if strict and fallbacks:
        raise UnsupportedOps(fallbacks)
    graph.source = ModelSource("torch", module=ep)  # its module is made when a peer first runs it
    return graph


# -- shapes -----------------------------------------------------------------------------------------------------------

def _user_inputs(ep) -> list:
    from torch.export.graph_signature import InputKind

    return [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]


def _placeholder_vals(ep) -> dict[str, Any]:
    return {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}


def _is_static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def _specialise(ep, input_shapes):
    """The program itself when its inputs are concrete, else re-exported at ``input_shapes``."""
    import torch

    vals = _placeholder_vals(ep)
    users = [s.arg.name for s in _user_inputs(ep)]
    dynamic = {n: vals[n].shape for n in users
               if isinstance(vals.get(n), torch.Tensor) and not _is_static(vals[n].shape)}
    if input_shapes is None:
        if dynamic:
            n, shp = next(iter(dynamic.items()))
            axes = [i for i, d in enumerate(shp) if not isinstance(d, int)]
            example = {k: tuple(1 if not isinstance(d, int) else d for d in vals[k].shape) for k in dynamic}
            raise ModelError(f"input {n!r} has dynamic size(s) {tuple(str(d) for d in shp)} (axis "
                             f"{', '.join(map(str, axes))}); planforge tunes concrete shapes: export with fixed-size "
                             f"example inputs and no dynamic_shapes, or pass input_shapes={example!r}")
        return ep
    unknown = sorted(set(input_shapes) - set(users))
    if unknown:
        raise ModelError(f"input_shapes names {unknown}, which are not inputs of the exported program "
                         f"(its inputs: {users})")
    missing = [n for n in dynamic if n not in input_shapes]
    if missing:
        raise ModelError(f"inputs {missing} have dynamic sizes; give their shapes in input_shapes too")
    shapes = {}
    for n in users:
        v = vals[n]
        if not isinstance(v, torch.Tensor):
            raise ModelError(f"input {n!r} is not a tensor ({type(v).__name__}); only tensor inputs are supported")
        shp = tuple(int(d) for d in input_shapes.get(n, tuple(v.shape)))
        if len(shp) != v.dim() or any(isinstance(d, int) and d != s for d, s in zip(v.shape, shp)):
            raise ModelError(f"input_shapes[{n!r}] = {shp} does not fit the exported shape "
                             f"{tuple(str(d) for d in v.shape)}")
        shapes[n] = shp
    if not dynamic:
        return ep
    args = tuple(torch.zeros(shapes[n], dtype=vals[n].dtype) for n in users)
    try:
        return torch.export.export(ep.module(), args)
    except Exception as e:
        raise ModelError(f"could not re-export the program at input_shapes {shapes}: {type(e).__name__}: "
                         f"{_first_lines(str(e))}") from None


# -- where is a node --------------------------------------------------------------------------------------------------

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def _where(node) -> str:
    """``node 'sin' in module 'act' (MyAct) at model.py:12 in forward: `h = torch.sin(x)```."""
    parts = [f"node {node.name!r}"]
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, kind = list(stack.values())[-1]
        if path:
            parts.append(f"in module {path!r} ({getattr(kind, '__name__', kind)})")
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    if frames:
        import torch

        lib = os.path.dirname(torch.__file__)
        mine = [f for f in frames if not f[0].startswith(lib)] or frames
        file, line, fn, code = mine[-1]
        parts.append(f"at {file}:{line} in {fn}: `{code.strip()}`")
    return " ".join(parts)


# -- the op table -----------------------------------------------------------------------------------------------------
# Each op module of planforge.ops maps its own ATen ops (``Op.torch``); this table holds only the framework's plumbing,
# which computes nothing the IR needs an op for.

PLUMBING, _op = op_table()   # op name -> lowering


def _out_shape(node) -> tuple[int, ...]:
    return tuple(int(d) for d in node.meta["val"].shape)


@_op("clone", "contiguous", "detach", "alias", "lift_fresh_copy", "detach_copy", "alias_copy")
def _identity(em, node, a, kw):
    return a[0]


@_op("dropout", "feature_dropout")
def _dropout(em, node, a, kw):
    if kw.get("train", a[2] if len(a) > 2 else False):
        raise em.unsupported("dropout in training mode (import the module in eval mode)")
    return a[0]


def _dtype_of(x):
    val = getattr(x, "meta", {}).get("val")
    return getattr(val, "dtype", None)


@_op("_to_copy", "to", "type_as")
def _to(em, node, a, kw):
    """A cast. Values are fp32 in the IR, integers and booleans among them held exactly, so a cast between those
    kinds is the value itself; to bool it is ``x != 0``; float to integer (truncation) has no op here."""
    src, dst = _dtype_name(_dtype_of(node.args[0])), _dtype_name(node.meta["val"].dtype)
    if dst == "bool" and src != "bool":
        return em.node("ne", [a[0], em.const(np.float32(0), node.name + ".zero")], node.name)
    if src == dst or (dst in ("float32", "int64", "int32") and src in _INTEGRAL):
        return a[0]
    raise em.unsupported(f"casts {src} to {dst}; the IR computes in fp32 (integers and booleans held exactly)")


@_op("_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size", "_assert_async")
def _check(em, node, a, kw):
    return None          # a check torch.export leaves behind; every shape and dtype is already known


_SHAPE_ONLY = {"new_ones", "new_zeros", "new_full", "new_empty", "ones_like", "zeros_like", "full_like",
               "empty_like", "sym_size", "sym_numel", "sym_stride"}


def lowering(name: str):
    """The lowering of ATen op ``name``: the plumbing's, else the op registry's; None when neither has one."""
    fn = PLUMBING.get(name)
    if fn is None and name in TORCH:
        fn = TORCH[name].torch[name]
    return fn


# -- the walk ---------------------------------------------------------------------------------------------------------

_INPUT_DTYPES = {"float32": "fp32", "int64": "int64", "int32": "int32", "bool": "bool"}
_INTEGRAL = {"int64", "int32", "int16", "int8", "uint8", "bool"}   # held exactly in fp32 (to EXACT_INT)


def _dtype_name(dt) -> str:
    return str(dt).removeprefix("torch.")

def _to_numpy(t) -> np.ndarray:
    import torch

    t = t.detach().cpu()
    if t.is_floating_point() and t.dtype != torch.float64:
        t = t.float()
    return t.numpy().copy()


class _Importer:
    def __init__(self, ep, name: str):
        self.ep, self.em = ep, Emitter(name)
        self.env: dict[str, Any] = {}

    def run(self) -> tuple[Graph, list[UnsupportedOp]]:
        """The graph and the ops it runs as fallback steps."""
        import torch
        from torch.export.graph_signature import InputKind, OutputKind

        ep, em = self.ep, self.em
        specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
        for s in ep.graph_signature.output_specs:
            if s.kind not in (OutputKind.USER_OUTPUT,):
                raise ModelError(f"the program's output {s.arg.name!r} is a {s.kind.name.lower()} (the module mutates "
                                 f"{s.target!r} in forward); planforge imports pure inference functions only")
        for node in ep.graph.nodes:
            em.at(str(node.target), _where(node))
            if node.op == "placeholder":
                self.env[node.name] = self._placeholder(node, specs[node.name], InputKind)
            elif node.op == "call_function":
                v = self._call(node)
                val = node.meta.get("val")
                if isinstance(val, torch.Tensor) and not isinstance(v, (tuple, list)):
                    em.check(v, tuple(val.shape), f"{node.name!r}")
                self.env[node.name] = v
            elif node.op == "output":
                outs = node.args[0]
                outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
                vals = []
                for o in outs:
                    if not isinstance(o, torch.fx.Node):
                        raise ModelError(f"the module returns a non-tensor value {o!r}; only tensor outputs are "
                                         f"supported")
                    vals.append(self.env[o.name])
                fold_written_out(em.g)  # GPT-2's gelu_new, one gelu node (its dead parts dropped by finish)
                return em.finish(vals), list(em.fallbacks)
            else:
                raise UnsupportedOp(node.op, _where(node), "graph node kind not supported")
        raise ModelError("the exported program has no output node")

    def _placeholder(self, node, spec, InputKind):
        import torch

        ep = self.ep
        if spec.kind == InputKind.USER_INPUT:
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                raise ModelError(f"input {node.name!r} is a {type(val).__name__}, not a tensor; only tensor inputs "
                                 f"are supported (bind other arguments before exporting)")
            dtype = _INPUT_DTYPES.get(_dtype_name(val.dtype))
            if dtype is None:
                raise ModelError(f"input {node.name!r} has dtype {val.dtype}; the IR takes float32, int64, int32 "
                                 f"and bool inputs")
            if not _is_static(val.shape):
                raise ModelError(f"input {node.name!r} has dynamic shape {tuple(str(d) for d in val.shape)}; "
                                 f"pass input_shapes")
            name = self.em.input(node.name, tuple(val.shape))
            if dtype != "fp32":
                self.em.g.input_dtypes[name] = dtype
            return name
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            t = ep.state_dict.get(spec.target)
            if t is None:
                t = ep.constants.get(spec.target)
            if not isinstance(t, torch.Tensor):
                raise ModelError(f"{spec.kind.name.lower()} {spec.target!r} is not stored in the exported program")
            return Const(_to_numpy(t), spec.target)
        raise UnsupportedOp(f"{spec.kind.name.lower()} input", _where(node),
                            "only tensor inputs, parameters, buffers and constants are supported")

    def _args(self, node, shapes_only: bool = False):
        """The node's arguments as importer values; ``shapes_only``: runtime tensors as zero constants of their
        shape and dtype (for ops whose result depends on nothing else)."""
        import torch

        def conv(x):
            if isinstance(x, torch.fx.Node):
                v = self.env[x.name]
                if shapes_only and isinstance(x.meta.get("val"), torch.Tensor) and not isinstance(v, Const):
                    val = x.meta["val"]
                    return Const(np.zeros(tuple(val.shape), dtype=torch.empty(0, dtype=val.dtype).numpy().dtype),
                                 x.name)
                return v
            if isinstance(x, (list, tuple)):
                return type(x)(conv(y) for y in x)
            return x
        return conv(node.args), {k: conv(v) for k, v in node.kwargs.items()}

    def _call(self, node):
        import torch

        args, kwargs = self._args(node)
        if node.target is operator.getitem:
            src, i = args
            if not isinstance(src, (tuple, list)):
                raise self.em.unsupported("indexes a tensor")
            return src[i]
        if not isinstance(node.target, torch._ops.OpOverload) or node.target.namespace != "aten":
            raise self.em.unsupported("not an ATen op")
        if self._foldable(node, args, kwargs):
            return self._fold(node, args, kwargs)
        kind = node.target.overloadpacket.__name__
        if kind in _SHAPE_ONLY:                   # the result depends on shapes alone, which are all known
            return self._fold(node, *self._args(node, shapes_only=True))
        fn = lowering(kind)
        try:
            if fn is None:
                raise self.em.unsupported()
            return fn(self.em, node, list(args), kwargs)
        except UnsupportedOp as why:
            return torch_node(self.em, node, args, kwargs, why)

    @staticmethod
    def _leaves(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                yield from _Importer._leaves(y)
        elif isinstance(x, dict):
            for y in x.values():
                yield from _Importer._leaves(y)
        else:
            yield x

    def _foldable(self, node, args, kwargs) -> bool:
        import torch

        for x in self._leaves((args, kwargs)):
            if isinstance(x, Unavailable) or (isinstance(x, str) and x in self.em.shapes):
                return False                      # a runtime value: not known at import time
        return torch.Tag.nondeterministic_seeded not in node.target.tags

    def _fold(self, node, args, kwargs):
        """Evaluate an op whose operands are all constants with torch itself."""
        import torch

        def conv(x):
            if isinstance(x, Const):
                return torch.from_numpy(x.value.copy())
            if isinstance(x, (list, tuple)):
                return type(x)(conv(y) for y in x)
            return x
        hints = [x.hint for x in self._leaves(args) if isinstance(x, Const)]
        hint = hints[0] if len(hints) == 1 else node.name
        try:
            out = node.target(*conv(args), **{k: conv(v) for k, v in kwargs.items()})
        except Exception as e:
            raise self.em.unsupported(f"could not evaluate it on constants: {type(e).__name__}: {e}") from None
        if isinstance(out, torch.Tensor):
            return Const(_to_numpy(out), hint)
        if isinstance(out, (tuple, list)):
            return tuple(Const(_to_numpy(o), hint) if isinstance(o, torch.Tensor) else o for o in out)
        return out
