"""Binding a problem's inputs to torch tensors on a device, and a candidate's knobs to its launcher."""
from __future__ import annotations

from typing import Callable

import numpy as np

from . import attention, eltwise, gemm, mlp, rowwise
from .common import torch_dtype

LAUNCHERS = {"gemm": gemm.launcher, "softmax": rowwise.launcher, "layernorm": rowwise.launcher,
             "rmsnorm": rowwise.launcher, "eltwise": eltwise.launcher, "mlp": mlp.launcher,
             "attention": attention.launcher}


def tensors(problem, inputs: dict[str, np.ndarray], device: str) -> dict:
    """``inputs`` (fp32 arrays, exact in the problem's dtype) as contiguous torch tensors of its storage dtype."""
    import torch

    dt = torch_dtype(problem.dtype)
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(device=device, dtype=dt) for k, v in inputs.items()}


def output(problem, device: str):
    """An empty output tensor of the problem's shape and storage dtype."""
    import torch

    return torch.empty(problem.output_shape(), dtype=torch_dtype(problem.dtype), device=device)


def launcher(problem, knobs: dict, t: dict, out) -> Callable[[], None]:
    """The no-argument call running ``problem``'s template with ``knobs`` on tensors ``t`` into ``out``."""
    return LAUNCHERS[problem.op](problem, knobs, t, out)
