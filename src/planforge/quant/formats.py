"""Weight formats: fp32, bf16, int8 per output channel, int4 block-wise; quantise, dequantise, error bounds.

Weights are ``W [K, N]`` (K the reduction, N the output channels), as the GEMV,
GEMM and fused-MLP templates take them. Activations stay fp32 and every format
accumulates in fp32: only the stream of weights shrinks.

- ``bf16``: the top 16 bits of the fp32 value, rounded to nearest even (8
  significand bits: a relative error of at most 2^-8 per weight).
- ``int8``: symmetric per output channel: ``q = round(w / s)``, ``s = max|W[:, j]| / 127``,
  so ``|w - s q| <= s / 2``.
- ``int4``: symmetric per block of ``block`` consecutive K of one channel:
  ``s = max|block| / 7``, ``q`` in [-7, 7], two values to a byte; ``|w - s q| <= s / 2``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FORMATS = ("fp32", "bf16", "int8", "int4")
INT4_BLOCKS = (32, 64, 128)
_QMAX = {"int8": 127, "int4": 7}


class QuantError(ValueError):
    """An unknown weight format or block size, or weights a format cannot hold (not finite, not 2-D)."""


def check_format(fmt: str, block: int | None = None) -> None:
    if fmt not in FORMATS:
        raise QuantError(f"unknown weight format {fmt!r}; known: {', '.join(FORMATS)}")
    if fmt == "int4" and block not in INT4_BLOCKS:
        raise QuantError(f"int4 block size must be one of {', '.join(map(str, INT4_BLOCKS))}, got {block!r}")


def variant(fmt: str, block: int | None = None, act: str = "fp32") -> str:
    """The name of a quantised kernel variant: ``fp32``, ``bf16``, ``int8``, ``int8+a8`` (int8 weights and
    dynamic int8 activations), ``int4:32``..."""
    check_format(fmt, block)
    return f"int4:{block}" if fmt == "int4" else fmt + ("+a8" if act == "int8" else "")


def variant_knobs(name: str) -> dict:
    """The knobs ``wfmt``, ``qblock`` and ``act`` of a variant name (``variant``'s inverse)."""
    fmt, _, rest = name.partition(":")
    base, plus, act = fmt.partition("+")
    if (plus and (act != "a8" or base != "int8")) or (rest and base != "int4"):
        raise QuantError(f"unknown quantised variant {name!r}; e.g. fp32, bf16, int8, int8+a8, int4:32")
    try:
        block = int(rest) if rest else INT4_BLOCKS[0]
    except ValueError:
        raise QuantError(f"unknown quantised variant {name!r}: the int4 block is not a number") from None
    check_format(base, block)
    return {"wfmt": base, "qblock": block, "act": "int8" if plus else "fp32"}


def bytes_per_weight(fmt: str, k: int, block: int | None = None) -> float:
    """Bytes streamed per weight, scales included (``k``: the reduction length, which int8's scales are shared over)."""
    check_format(fmt, block)
    if fmt == "fp32":
        return 4.0
    if fmt == "bf16":
        return 2.0
    if fmt == "int8":
        return 1.0 + 4.0 / max(1, k)
    return 0.5 + 4.0 / block


@dataclass(frozen=True)
class QWeights:
    """Quantised weights: ``q`` [K, N] (uint16 bf16 bits, or int8 values: int4's within [-7, 7]); ``scales``
    None (fp32, bf16), [N] (int8) or [ceil(K / block), N] (int4)."""

    fmt: str
    q: np.ndarray
    scales: np.ndarray | None = None
    block: int | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)  # type: ignore[return-value]


def _weights(W) -> np.ndarray:
    W = np.asarray(W)
    if W.ndim != 2:
        raise QuantError(f"weights must be a 2-D [K, N] array, got shape {W.shape}")
    if not np.all(np.isfinite(W)):
        raise QuantError("weights hold non-finite values: no format can quantise them")
    return W.astype(np.float32, copy=False)


def to_bf16(W: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits (uint16), rounded to nearest, ties to even."""
    u = np.ascontiguousarray(W, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def from_bf16(h: np.ndarray) -> np.ndarray:
    return (h.astype(np.uint32) << 16).view(np.float32)


def _scales(amax: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """The scales of groups whose largest magnitude is ``amax``, and the same with 1 for an all-zero group (to
    divide by)."""
    s = (amax / qmax).astype(np.float32)
    return s, np.where(s > 0, s, np.float32(1.0)).astype(np.float32)


def quantise(W, fmt: str, block: int | None = None) -> QWeights:
    """``W`` [K, N] in format ``fmt`` (``block``: int4's block size along K)."""
    check_format(fmt, block)
    W = _weights(W)
    K, N = W.shape
    if fmt == "fp32":
        return QWeights(fmt, np.ascontiguousarray(W))
    if fmt == "bf16":
        return QWeights(fmt, to_bf16(W))
    qmax = _QMAX[fmt]
    if fmt == "int8":
        s, safe = _scales(np.abs(W).max(axis=0) if K else np.zeros(N), qmax)
        q = np.clip(np.rint(W / safe), -qmax, qmax).astype(np.int8)
        return QWeights(fmt, q, s)
    nb = -(-K // block)
    pad = np.zeros((nb * block, N), np.float32)
    pad[:K] = W
    groups = np.abs(pad.reshape(nb, block, N)).max(axis=1)  # [nb, N]
    s, safe = _scales(groups, qmax)
    q = np.clip(np.rint(pad.reshape(nb, block, N) / safe[:, None, :]), -qmax, qmax).astype(np.int8)
    return QWeights(fmt, q.reshape(nb * block, N)[:K], s, block)


def dequantise(qw: QWeights, dtype=np.float64) -> np.ndarray:
    """The weights a kernel of this format computes with, exactly (fp32 values held in ``dtype``)."""
    if qw.fmt == "fp32":
        return qw.q.astype(dtype)
    if qw.fmt == "bf16":
        return from_bf16(qw.q).astype(dtype)
    s = qw.scales.astype(dtype)
    if qw.fmt == "int8":
        return qw.q.astype(dtype) * s[None, :]
    K = qw.q.shape[0]
    rows = np.repeat(s, qw.block, axis=0)[:K]
    return qw.q.astype(dtype) * rows


def quantise_activations(x) -> tuple[np.ndarray, np.float32]:
    """Dynamic int8 of an activation vector, as the kernels do it per call (in fp32, the same operations in the
    same order, so that the values match bit for bit): asymmetric, ``u = round(x / scale) + zp`` clamped to
    0..255 over the range ``[min(x, 0), max(x, 0)]`` (zero is exact), as ONNX Runtime's dynamic quantisation
    does. Returns ``(q, scale)`` with ``q = u - zp`` (int16) and ``x ~ scale * q``."""
    x = np.asarray(x, np.float32)
    lo = min(np.float32(np.min(x)), np.float32(0)) if x.size else np.float32(0)
    hi = max(np.float32(np.max(x)), np.float32(0)) if x.size else np.float32(0)
    if not hi > lo:
        return np.zeros(x.shape, np.int16), np.float32(1)
    inv = np.float32(255) / np.float32(hi - lo)
    zp = np.rint(-lo * inv).astype(np.float32)
    u = np.clip(np.rint(x * inv) + zp, 0, 255)
    return (u - zp).astype(np.int16), np.float32(hi - lo) / np.float32(255)


def error_bound(W, qw: QWeights) -> np.ndarray:
    """Per-weight bound on ``|w - dequantise(q)|`` (round to nearest: half a step of the format)."""
    W = _weights(W).astype(np.float64)
    if qw.fmt == "fp32":
        return np.zeros_like(W)
    if qw.fmt == "bf16":
        return np.abs(W) * 2.0**-8
    s = qw.scales.astype(np.float64)
    if qw.fmt == "int8":
        return np.broadcast_to(s[None, :] / 2, W.shape)
    return np.repeat(s, qw.block, axis=0)[: W.shape[0]] / 2


__all__ = ["FORMATS", "INT4_BLOCKS", "QWeights", "QuantError", "bytes_per_weight", "check_format", "dequantise",
           "error_bound", "from_bf16", "quantise", "quantise_activations", "to_bf16", "variant", "variant_knobs"]
