"""Load a model file (ONNX or a torch.export archive) into the IR, through the importer its suffix names."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .frontend import ModelError, _first_lines, need_module
from .graph import Graph


def load_model(path: str | Path, input_shapes: dict[str, Sequence[int]] | None = None, strict: bool = False) -> Graph:
    """Import a model file into the IR.

    ``.onnx`` goes through ``from_onnx`` (extra ``onnx``); ``.pt2`` (a ``torch.export.save`` archive)
    through ``torch.export.load`` and ``from_exported`` (extra ``torch``). ``input_shapes`` maps input
    names to concrete shapes and is needed only where the model's inputs have dynamic sizes. ``strict``
    (default False): refuse ops with no rule, listing them all, instead of running them as fallback steps.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    accepted = ("accepted: .onnx (ONNX, extra 'onnx') and .pt2 (torch.export.save, extra 'torch'); "
                "for a torch.nn.Module in Python use planforge.ir.from_torch(module, example_inputs)")
    if suffix not in (".onnx", ".pt2"):
        raise ModelError(f"cannot import {str(p)!r}: unknown model format {suffix or '(no suffix)'!r}; {accepted}")
    if not p.is_file():
        raise ModelError(f"cannot import {str(p)!r}: no such file")
    if suffix == ".onnx":
        from .onnx_import import from_onnx

        return from_onnx(p, input_shapes=input_shapes, strict=strict)
    from .torch_import import from_exported

    torch = need_module("torch", "torch", f"reading {p.name}")
    import logging

    log = logging.getLogger("torch.export")
    level = log.level
    log.setLevel(logging.ERROR)            # torch logs a traceback of its own before raising
    try:
        ep = torch.export.load(str(p))
    except Exception as e:  # torch raises many kinds here (zip, pickle, version errors)
        raise ModelError(f"cannot read {str(p)!r} as a torch.export archive (.pt2): "
                         f"{type(e).__name__}: {_first_lines(str(e))}") from None
    finally:
        log.setLevel(level)
    return from_exported(ep, input_shapes=input_shapes, name=p.stem, strict=strict)
