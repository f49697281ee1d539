"""Epilogues and elementwise chains by the op registry: the reference, the FLOPs and the library form of each step.

Shared by the problem facts of the GEMM, GEMV and eltwise kernels; the C of
each step comes from its op's ``Epilogue`` (``common.header``, ``rowwise``).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ....ops import REGISTRY
from ....ops.kernel import gemm_residual, parse_chain

U32 = 2.0**-24


def act_of(epilogue: str):
    """The activation op of a GEMM epilogue ``bias_<op>``, or None (``none``, ``bias``, ``bias_add``)."""
    epilogue = gemm_residual(epilogue)[0]
    return REGISTRY[epilogue[len("bias_"):]] if epilogue.startswith("bias_") else None


def steps(chain: str) -> list:
    """The ops of an elementwise chain (``none``: no steps)."""
    return [] if chain == "none" else [REGISTRY[s] for s in parse_chain(chain)]


def operands(chain: str) -> set[str]:
    """What a chain reads besides ``x``: ``bias`` (a row vector) and/or ``residual`` (a tensor like ``x``)."""
    return {op.epilogue.operand for op in steps(chain) if op.epilogue.operand}


def apply_chain(x, chain: str, bias=None, res=None):
    """A chain by its ops' reference semantics (``bias_gelu``, ``relu_add``...), in ``x``'s dtype."""
    for op in steps(chain):
        ep = op.epilogue
        operand = {"bias": bias, "residual": res}.get(ep.operand)
        x = op.reference([x] if not ep.operand else [x, operand], op.from_egg(ep.attr))
    return x


def chain_flops(chain: str) -> float:
    """FLOPs per element of a chain (a GEMM epilogue ``bias_relu`` is the chain bias, relu)."""
    return float(sum(op.epilogue.flops for op in steps(chain)))


def numpy_chain(chain: str, out: np.ndarray, bias=None, res=None) -> Callable[[], None]:
    """The chain as library steps in place on ``out``, each its op's own numpy step."""
    fs = []
    for op in steps(chain):
        ep = op.epilogue
        operand = {"bias": bias, "residual": res}.get(ep.operand)
        fs.append(op.library[op.name].step([out] + ([operand] if ep.operand else []), out, op.from_egg(ep.attr)))
    fs = tuple(fs)

    def run():
        for f in fs:
            f()

    return run


def torch_chain(chain: str, operand_of: dict[str, Any]) -> list[tuple[Callable, Any]]:
    """(torch step, its operand) per step of a chain, for the torch baseline."""
    return [(op.epilogue.torch, operand_of.get(op.epilogue.operand)) for op in steps(chain)]


def smooth(epilogue: str) -> bool:
    """An epilogue with a smooth activation computed through exp/tanh approximations (looser tolerance)."""
    act = act_of(epilogue)
    return act is not None and act.name != "relu"


def dense_tolerance(mag: np.ndarray, K: int, epilogue: str) -> np.ndarray:
    """Per-element tolerance of ``act(a @ b + bias)`` in fp32: the standard bound gamma_K |A||B| (Higham 3.5)
    with gamma_K ~ K u, times 4 for slack, plus the rounding of the epilogue. ``mag``: |A||B| (+ |bias|)."""
    tol = 4.0 * (K + 2) * U32 * mag
    if smooth(epilogue):
        # GELU's and SiLU's slopes are below 1.13, sigmoid's and tanh's below 1; exp/tanh approximations
        tol = tol * 1.2 + 1e-6 * (1.0 + mag)
    return tol + 1e-30


def numpy_dense(a, b, bias, out: np.ndarray, epilogue: str, res=None) -> Callable[[], None]:
    """``act(a @ b + bias)`` (or ``a @ b + bias + res``) as numpy would be written by hand: out= everywhere, the
    activation in place."""
    act = act_of(epilogue)
    tail = None if act is None else act.library[act.name].step([out], out, act.from_egg(act.epilogue.attr))

    def run():
        np.matmul(a, b, out=out)
        if epilogue == "none":
            return
        np.add(out, bias, out=out)
        if res is not None:
            np.add(out, res, out=out)
        if tail is not None:
            tail()

    return run


def torch_dense(a, b, bias, o, epilogue: str, res=None) -> Callable[[], None]:
    """``act(a @ b + bias)`` (or ``a @ b + bias + res``) in torch (``addmm`` then the activation or the
    residual), into ``o``."""
    import torch

    act = act_of(epilogue)
    f = act.epilogue.torch if act is not None else None

    def run():
        with torch.inference_mode():
            if epilogue == "none":
                torch.mm(a, b, out=o)
            else:
                torch.addmm(bias, a, b, out=o)
                if res is not None:
                    o.add_(res)
                if f is not None:
                    o.copy_(f(o, None))

    return run
