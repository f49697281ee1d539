"""Quantised weights in the panel layout the kernels stream, made once at load time and cached.

A panel is ``width`` consecutive output columns (a GEMV block of ``jb`` vectors);
the columns are padded up to whole panels with zero weights, so a kernel never
needs a scalar tail for the weights. Per panel, the K rows follow each other:
``[panel][k][width]`` values (bf16 bits, int8), or for int4 ``[panel][k / 2][width]``
bytes holding row ``2t`` in the low nibble and row ``2t + 1`` in the high one
(K padded to whole blocks). Scales: int8 ``[panels * width]``; int4
``[panel][block][width]``.

Quantising and packing 16 M weights takes a good fraction of a second, and a
search binds the same weights to many candidates: ``quantised`` and ``packed``
keep the last few results, keyed by the weights' content (a digest, taken once
per array object: weights are constants once loaded) and the layout.
"""
from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from .formats import QWeights, quantise

CACHE_ENTRIES = 12


@dataclass(frozen=True)
class Packed:
    """What a quantised kernel reads: ``w`` (the packed values), ``scales`` (fp32, or None) and the padded sizes."""

    fmt: str
    w: np.ndarray
    scales: np.ndarray | None
    width: int
    panels: int
    k_padded: int
    block: int | None = None
    colsum: np.ndarray | None = None  # int8 in groups of 4: each channel's sum of values (int32)

    @property
    def nbytes(self) -> int:
        return int(self.w.nbytes + (self.scales.nbytes if self.scales is not None else 0))


def pack(qw: QWeights, width: int, group: int = 1) -> Packed:
    """``qw`` in panels of ``width`` columns; ``group`` 4 (int8 only): each column's 4 consecutive rows side by
    side, ``[panel][k / 4][width][4]`` (K padded to a multiple of 4), for the u8 x s8 dot-product instructions,
    with each channel's sum of values; ``width`` 0: row-major, as the GEMM's packing reads it (``pack_rows``)."""
    K, N = qw.shape
    if width == 0:
        return pack_rows(qw)
    if group == 4:
        return _pack_groups(qw, width)
    panels = -(-N // width)
    Np = panels * width
    if qw.fmt == "int4":
        Kp = -(-K // qw.block) * qw.block
        q = np.zeros((Kp, Np), np.int8)
        q[:K, :N] = qw.q
        nib = (q & 0x0F).astype(np.uint8)
        pairs = nib[0::2] | (nib[1::2] << 4)  # [Kp / 2, Np]
        w = pairs.reshape(Kp // 2, panels, width).transpose(1, 0, 2)
        s = np.zeros((Kp // qw.block, Np), np.float32)
        s[:, :N] = qw.scales
        scales = s.reshape(Kp // qw.block, panels, width).transpose(1, 0, 2)
        return Packed("int4", np.ascontiguousarray(w), np.ascontiguousarray(scales), width, panels, Kp, qw.block)
    q = np.zeros((K, Np), qw.q.dtype)
    q[:, :N] = qw.q
    w = np.ascontiguousarray(q.reshape(K, panels, width).transpose(1, 0, 2))
    scales = None
    if qw.scales is not None:
        scales = np.zeros(Np, np.float32)
        scales[:N] = qw.scales
    return Packed(qw.fmt, w, scales, width, panels, K)


def pack_rows(qw: QWeights) -> Packed:
    """Row-major ``[K][N]`` values (int4: ``[K][ceil(N / 2)]`` bytes, column 2i in the low nibble of byte i,
    2i + 1 in the high one); scales int8 ``[N]``, int4 ``[ceil(K / block)][N]``."""
    K, N = qw.shape
    if qw.fmt == "int4":
        q = np.zeros((K, N + (N & 1)), np.int8)
        q[:, :N] = qw.q
        nib = (q & 0x0F).astype(np.uint8)
        w = nib[:, 0::2] | (nib[:, 1::2] << 4)
        return Packed("int4", np.ascontiguousarray(w), np.ascontiguousarray(qw.scales, np.float32), 0, 1, K, qw.block)
    scales = None if qw.scales is None else np.ascontiguousarray(qw.scales, np.float32)
    return Packed(qw.fmt, np.ascontiguousarray(qw.q), scales, 0, 1, K)


def _pack_groups(qw: QWeights, width: int) -> Packed:
    K, N = qw.shape
    if qw.fmt != "int8":
        raise ValueError(f"groups of 4 rows are an int8 layout, not {qw.fmt}'s")
    panels, Kp = -(-N // width), -(-K // 4) * 4
    q = np.zeros((Kp, panels * width), np.int8)
    q[:K, :N] = qw.q
    w = q.reshape(Kp // 4, 4, panels, width).transpose(2, 0, 3, 1)  # [panel][k / 4][width][4]
    scales = np.zeros(panels * width, np.float32)
    scales[:N] = qw.scales
    colsum = q.astype(np.int32).sum(axis=0, dtype=np.int32)
    return Packed("int8", np.ascontiguousarray(w), scales, width, panels, Kp, None, np.ascontiguousarray(colsum))


_CACHE: "OrderedDict[tuple, Any]" = OrderedDict()
_DIGESTS: dict[int, tuple[weakref.ref, str]] = {}


def digest(W: np.ndarray) -> str:
    """The content digest of ``W``, taken once per array object (weights are constants once loaded: a copy with
    other values is another object, and gets its own)."""
    memo = _DIGESTS.get(id(W))
    if memo is not None and memo[0]() is W:
        return memo[1]
    A = np.ascontiguousarray(W)
    d = hashlib.blake2b(A.view(np.uint8).ravel(), digest_size=16).hexdigest() + f":{A.dtype}:{A.shape}"
    try:
        _DIGESTS[id(W)] = (weakref.ref(W, lambda _, k=id(W): _DIGESTS.pop(k, None)), d)
    except TypeError:  # not weak-referenceable: no memo
        pass
    return d


def _cached(key: tuple, make):
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    out = _CACHE[key] = make()
    while len(_CACHE) > CACHE_ENTRIES:
        _CACHE.popitem(last=False)
    return out


def quantised(W: np.ndarray, fmt: str, block: int | None = None) -> QWeights:
    """``quantise(W, fmt, block)``, from the cache when these weights were quantised so before (in this process)."""
    block = block if fmt == "int4" else None
    return _cached((digest(W), fmt, block), lambda: quantise(W, fmt, block))


def packed(W: np.ndarray, fmt: str, width: int, block: int | None = None, group: int = 1) -> Packed:
    """``W`` [K, N] quantised to ``fmt`` and packed in panels of ``width`` columns (``group``: see ``pack``),
    from the cache when these weights were packed this way before (in this process)."""
    block = block if fmt == "int4" else None
    return _cached((digest(W), fmt, width, block, group), lambda: pack(quantised(W, fmt, block), width, group))


def cache_info() -> dict[str, int]:
    return {"entries": len(_CACHE),
            "bytes": sum(v.nbytes if isinstance(v, Packed) else v.q.nbytes for v in _CACHE.values())}


__all__ = ["CACHE_ENTRIES", "Packed", "cache_info", "digest", "pack", "pack_rows", "packed", "quantised"]
