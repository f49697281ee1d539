"""Pieces every Triton template shares: the activation epilogues and torch dtype names."""
from __future__ import annotations

import os

import triton
import triton.language as tl

# constexpr codes of the activations (problem.TRITON_ACTS); 0 is none
ACT_CODE = {"none": 0, "relu": 1, "gelu": 2, "sigmoid": 3, "silu": 4, "tanh": 5}


@triton.jit
def act(y, ACT: tl.constexpr):
    """Activation ``ACT`` (an ``ACT_CODE``) on an fp32 block. tanh is written through the sigmoid,
    which every Triton version has (libdevice's tanh moved between versions)."""
    if ACT == 1:
        y = tl.maximum(y, 0.0)
    elif ACT == 2:
        inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        y = 0.5 * y * (2.0 * tl.sigmoid(2.0 * inner))
    elif ACT == 3:
        y = tl.sigmoid(y)
    elif ACT == 4:
        y = y * tl.sigmoid(y)
    elif ACT == 5:
        y = 2.0 * tl.sigmoid(2.0 * y) - 1.0
    return y


@triton.jit
def empty(X, N: tl.constexpr):
    """Does nothing: the probe times its launches (the launch overhead every template pays)."""
    pass


def torch_dtype(dtype: str):
    """The torch storage dtype of a problem dtype (tf32 is fp32 in memory)."""
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def interpreting() -> bool:
    """Whether the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def widen(dtype: str) -> bool:
    """Whether to widen bf16 operands to fp32 before ``tl.dot``: only in the interpreter, whose dot
    multiplies bf16 blocks as the uint16 words it stores them in (the GPU multiplies them on the tensor
    cores; the GPU check proves that path)."""
    return dtype == "bf16" and interpreting()


def precision(dtype: str) -> str:
    """``tl.dot``'s input_precision: IEEE fp32 products for fp32, tensor-core TF32 for tf32 (16-bit inputs
    ignore it)."""
    return "ieee" if dtype == "fp32" or widen(dtype) else "tf32"
