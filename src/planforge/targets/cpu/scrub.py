"""Weights cold, activations hot: the cache state a step of a large model's whole call runs in.

A step measured alone, called again and again, finds its weights in its cores' L2: a GPT-2 layer's
32x256x768 GEMM (786 KB of weights, half per core) ran 58-64 us so. In the model's whole call the rest
of the model's weights (19 MB for GPT-2 with 6 layers) pass through the caches between two calls of
that step, and the same setting ran 100-110 us there, as fast as with every cache flushed (82-135 us
across its settings): the weights come from memory. Which settings stream them well is not what the
hot measurement ranks: two settings 2% apart hot were 82 and 103 us cold.

``scrubber(nbytes, threads, warm)`` gives the step to run before each timed call of such a measurement:
a buffer of ``nbytes`` (twice the last-level cache: nothing of the step's weights stays) is read by
``threads`` threads of the process's shared pool (each core's L2 is emptied, and the pool's workers are
awake, as a chain's previous step leaves them), then the ``warm`` arrays (the step's activations, which
its previous step has just written) are read back by the caller.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Sequence

import numpy as np

from .templates.parfor import PARFOR_C, built_library

SCRUB_C = PARFOR_C + r"""
#define PF_SCRUB_PARTS 64
typedef struct { const unsigned char *p; long n; } pf_scrub_t;

static unsigned pf_lines(const unsigned char *p, long n) {  /* one byte of every 64-byte line of [p, p + n) */
    unsigned acc = 0;
    for (long i = 0; i < n; i += 64) acc += p[i];
    if (n > 0) acc += p[n - 1];
    return acc;
}

static void pf_scrub_part(const void *c, int lo, int hi) {
    const pf_scrub_t *s = (const pf_scrub_t *)c;
    long per = s->n / PF_SCRUB_PARTS;
    unsigned acc = pf_lines(s->p + (long)lo * per, (long)(hi - lo) * per);
    __asm__ __volatile__("" :: "r"(acc));
}

__attribute__((visibility("default")))
void pf_scrub(const unsigned char *buf, long nbytes, int threads, int nwarm, const unsigned char *const *warm,
              const long *warm_bytes) {
    pf_scrub_t s = { buf, nbytes };
    pf_parfor(PF_SCRUB_PARTS, threads, pf_scrub_part, &s);
    unsigned acc = 0;
    for (int j = 0; j < nwarm; j++) acc += pf_lines(warm[j], warm_bytes[j]);
    __asm__ __volatile__("" :: "r"(acc));
}
"""

_buffers: dict[int, np.ndarray] = {}


def scrub_bytes(caches) -> int:
    """What a scrub reads on a machine with ``caches`` (``CacheLevel`` by name): twice all its cache levels'
    bytes together (at least 8 MiB)."""
    total = sum(c.bytes * c.instances for c in caches.values())
    return max(8 << 20, 2 * total)


def scrubber(nbytes: int, threads: int, warm: Sequence[np.ndarray]) -> Callable[[], None] | None:
    """A call that evicts everything from the caches but ``warm`` (see the module's doc); None where the
    compiled scrub does not build here (the caller then times hot, as before)."""
    lib = built_library(SCRUB_C)
    if lib is None:
        return None
    nbytes = max(1 << 20, int(nbytes))
    buf = _buffers.get(nbytes)
    if buf is None:
        _buffers.clear()  # one size per process: a worker measures one model's steps
        buf = _buffers[nbytes] = np.ones(nbytes, np.uint8)  # written once: its pages are the process's now
    arrays = [a for a in warm if isinstance(a, np.ndarray) and a.size and a.flags.c_contiguous]
    ptrs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
    sizes = (ctypes.c_long * max(1, len(arrays)))(*[a.nbytes for a in arrays])
    fn = lib.pf_scrub
    fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    args = (buf.ctypes.data, buf.nbytes, max(1, int(threads)), len(arrays), ctypes.addressof(ptrs),
            ctypes.addressof(sizes))
    keep = (buf, arrays, ptrs, sizes)

    def scrub(keep=keep):
        fn(*args)
    return scrub


__all__ = ["SCRUB_C", "scrub_bytes", "scrubber"]
