"""Scratch a bound step uses only while it runs (a convolution's padded input copy, its NHWC output before the
write-back), shared between the steps of a plan.

A bound step alone owns its scratch. ``share`` gives many steps, which run one after the other, one buffer: each
step's scratch then starts at the same address, so a whole call touches one step's worth of scratch (kept warm in
the caches) instead of a fresh copy per step. A step that shares must not rely on its scratch keeping anything
between calls (a convolution writes its padding borders on every call).
"""
from __future__ import annotations

import ctypes
from typing import Iterable

import numpy as np

ALIGN = 16  # floats: every region starts 64-byte aligned


def aligned_zeros(shape, dtype=np.float32, align: int = 64) -> np.ndarray:
    """``np.zeros(shape, dtype)`` starting at an address that is a multiple of ``align`` bytes (default 64, a
    cache line and an AVX-512 vector). numpy's own large arrays start 16 bytes past one, so that every 64-byte
    vector load of a packed weight panel, and every store into an arena slot, spanned two lines (a convolution's
    weights 16 bytes off: 4% slower alone)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.zeros(n * dt.itemsize + align, np.uint8)
    off = -raw.ctypes.data % align
    return raw[off: off + n * dt.itemsize].view(dt).reshape(shape)


def _round(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class Scratch:
    """The scratch regions of one bound step: ``fields`` names pointer fields of the ctypes struct ``args`` and
    the floats each needs. Bound to a private buffer until ``point`` moves it into a shared one."""

    def __init__(self, args: ctypes.Structure, fields: dict[str, int], shareable: bool = True):
        self.args, self.fields, self.shareable = args, dict(fields), shareable
        self.buffer: np.ndarray | None = None
        self.point(aligned_zeros(max(self.floats, 1)))

    @property
    def floats(self) -> int:
        """Floats the regions take, laid out one after the other (each aligned)."""
        return sum(_round(n) for n in self.fields.values())

    def point(self, buffer: np.ndarray) -> None:
        """Lay the regions out from the start of ``buffer`` (fp32, C-contiguous, at least ``floats`` long)."""
        if buffer.dtype != np.float32 or buffer.ndim != 1 or buffer.size < self.floats:
            raise ValueError(f"a scratch buffer must be 1-D fp32 of at least {self.floats} floats, got "
                             f"{buffer.dtype} {buffer.shape}")
        base, off = buffer.ctypes.data, 0
        for name, n in self.fields.items():
            setattr(self.args, name, base + 4 * off)
            off += _round(n)
        self.buffer = buffer  # held: the struct points into it


def share(steps: Iterable) -> np.ndarray | None:
    """Point the scratch of every step in ``steps`` that has a shareable one (``step.scratch``) into one buffer, as
    large as the largest step's; the buffer, or None when no step has one. The steps must run one at a time.

    A step on more than one thread keeps its own (``shareable`` False): measured on MobileNetV2's plan (two
    threads per step, 2 cores, 00:20 UTC), sharing made a whole call 10.4-11.9 ms against 8.4-8.6 with a buffer per
    step (a step then writes lines the other core holds modified from the step before), while on one thread it
    wins (8.7 against 9.7 ms; 4-15% on the three models)."""
    scratches = [s for s in (getattr(f, "scratch", None) for f in steps) if s is not None and s.shareable]
    if not scratches:
        return None
    buf = aligned_zeros(max(s.floats for s in scratches))
    for s in scratches:
        s.point(buf)
    return buf
