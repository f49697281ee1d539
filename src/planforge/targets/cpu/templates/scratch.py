"""Scratch a bound step uses only while it runs (a convolution's padded input copy, its NHWC output before the
write-back), shared between the steps of a plan.

A bound step alone owns its scratch. ``share`` gives many steps, which run one after the other, one buffer: each
step's scratch then starts at the same address, so a whole call touches one step's worth of scratch (kept warm in
the caches) instead of a fresh copy per step. A step that shares must not rely on its scratch keeping anything
between calls (a convolution writes its padding borders on every call).
"""
from __future__ import annotations

import ctypes
import mmap
import threading
from contextlib import contextmanager
from typing import Iterable, Iterator

import numpy as np

ALIGN = 16  # floats: every region starts 64-byte aligned

HUGE_PAGE = 2 << 20  # bytes: x86-64's huge page, what a ``Pages`` chunk is aligned to and made of
SMALL = 64 << 10  # bytes: arrays under this stay on numpy's heap, even within ``huge_pages``


class Pages:
    """The large arrays of one plan (its packed weights, its arenas), in chunks of whole 2 MiB pages, each chunk
    2 MiB-aligned and advised as huge pages (``madvise(MADV_HUGEPAGE)``: Linux's transparent huge pages in their
    ``madvise`` mode back it with 2 MiB pages, where numpy's own arrays get 4 KiB ones). A large model's weights
    stream from memory through thousands of 4 KiB pages a call, each a page walk; MobileNetV2 at 96 (14 MB of
    weights) on the 2-core Xeon guest, its plan loaded twice in one process, interleaved: 0.972, 0.957 and 0.977
    of the time with this, 0.99 with the same layout in 4 KiB pages. Bump-allocated, never freed on its own: the
    chunks go when the last array in them does. Where ``MADV_HUGEPAGE`` is not there (not Linux) or a chunk
    cannot be mapped, ``take`` returns None and the caller allocates on the heap."""

    def __init__(self):
        self._chunk: np.ndarray | None = None
        self._pos = 0
        self.mapped = 0  # bytes of chunks mapped so far

    def take(self, nbytes: int, align: int) -> np.ndarray | None:
        """``nbytes`` zero bytes at a multiple of ``align``, or None."""
        if not hasattr(mmap, "MADV_HUGEPAGE"):
            return None
        if self._chunk is not None:
            off = self._pos + (-(self._chunk.ctypes.data + self._pos) % align)
            if off + nbytes <= self._chunk.size:
                self._pos = off + nbytes
                return self._chunk[off: off + nbytes]
        size = -(-max(nbytes + align, 1) // HUGE_PAGE) * HUGE_PAGE
        try:
            m = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, ValueError):
            return None
        raw = np.frombuffer(m, np.uint8)
        start = -raw.ctypes.data % HUGE_PAGE
        try:
            m.madvise(mmap.MADV_HUGEPAGE, start, size)
        except OSError:  # a kernel without transparent huge pages: the chunk still serves, in small pages
            pass
        self._chunk, self._pos, self.mapped = raw[start: start + size], 0, self.mapped + size
        self._pos = nbytes
        return self._chunk[:nbytes]


_local = threading.local()


@contextmanager
def huge_pages(pages: Pages | None) -> Iterator[None]:
    """Within it (on this thread), ``aligned_zeros`` takes arrays of ``SMALL`` bytes or more from ``pages``
    (None: from the heap, as outside it)."""
    before = getattr(_local, "pages", None)
    _local.pages = pages
    try:
        yield
    finally:
        _local.pages = before


def aligned_zeros(shape, dtype=np.float32, align: int = 64) -> np.ndarray:
    """``np.zeros(shape, dtype)`` starting at an address that is a multiple of ``align`` bytes (default 64, a
    cache line and an AVX-512 vector). numpy's own large arrays start 16 bytes past one, so that every 64-byte
    vector load of a packed weight panel, and every store into an arena slot, spanned two lines (a convolution's
    weights 16 bytes off: 4% slower alone). Within ``huge_pages``, a large one comes from its ``Pages``."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    pages = getattr(_local, "pages", None)
    if pages is not None and n * dt.itemsize >= SMALL:
        got = pages.take(n * dt.itemsize, align)
        if got is not None:
            return got.view(dt).reshape(shape)
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
