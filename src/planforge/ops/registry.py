"""The op registry: every ``Op`` of every op module in ``planforge.ops``, collected without import side effects.

An op module is any module of this package other than the infrastructure
(``base``, ``egg``, ``kernel``, ``registry``); it declares ``OPS = [Op(...),
...]``. Adding an op is adding one such module: nothing else lists ops.
"""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from .base import Library, Op

INFRASTRUCTURE = {"base", "egg", "kernel", "registry"}


def _collect() -> dict[str, Op]:
    ops: dict[str, Op] = {}
    here = Path(__file__).parent
    for info in sorted(pkgutil.iter_modules([str(here)]), key=lambda m: m.name):
        if info.name in INFRASTRUCTURE or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__package__}.{info.name}")
        for op in getattr(module, "OPS", ()):
            if not isinstance(op, Op):
                raise TypeError(f"planforge.ops.{info.name}.OPS holds {op!r}, not an Op")
            if op.name in ops:
                raise ValueError(f"op {op.name!r} is declared twice (planforge.ops.{info.name} and another module)")
            ops[op.name] = op
    return ops


REGISTRY: dict[str, Op] = _collect()


def _index(attr: str) -> dict[str, Op]:
    out: dict[str, Op] = {}
    for op in REGISTRY.values():
        for key in getattr(op, attr):
            if key in out:
                raise ValueError(f"{attr} mapping {key!r} is claimed by ops {out[key].name!r} and {op.name!r}")
            out[key] = op
    return out


TORCH = _index("torch")      # ATen overload packet name -> op
ONNX = _index("onnx")        # ONNX op type -> op
LIBRARIES: dict[str, tuple[Op, Library]] = {
    name: (op, lib) for op in REGISTRY.values() for name, lib in op.library.items()}


def get(name: str) -> Op:
    """The op ``name``; ``KeyError`` with the known names when there is none."""
    op = REGISTRY.get(name)
    if op is None:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(n for n, o in REGISTRY.items() if not o.internal))}")
    return op


def ir_ops() -> list[str]:
    """The ops an IR graph may use (internal e-graph ops excluded)."""
    return sorted(n for n, o in REGISTRY.items() if not o.internal)


__all__ = ["LIBRARIES", "ONNX", "REGISTRY", "TORCH", "get", "ir_ops"]
