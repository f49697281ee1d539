"""A parallel loop whose caller never waits for a thread that has not started: chunks are claimed, not assigned.

An OpenMP ``parallel for schedule(static)`` gives each thread its share before
the loop starts and ends with a barrier: the call returns when the slowest
thread has done its share. With idle threads asleep (``OMP_WAIT_POLICY=PASSIVE``)
every call wakes the team, and on a machine whose other core is busy the
woken thread waits for the scheduler: a two-thread GEMV timed at 0.47 ms took
3-3.5 ms in those samples, and whole two-thread CNN plans ran 10-30x their
one-thread time (docs/benchmarks.md, issues 14 and 17).

Here the loop's ``n`` items are cut into chunks (``PF_CHUNKS`` per thread) and
each of the call's T threads has a home share: the k-th of T runs of chunks,
in order. Every thread, the caller (thread 0) included, takes its own share's
next chunk with one compare-and-swap, and once its share is empty takes the
other shares' last chunks. The caller starts at once; a worker that wakes late
finds its share taken from the end, or gone, and the call returns once every
claimed chunk is done. So a call takes about the one-thread time when its
workers are late and less when they come, never the time of a thread waiting
for a core. Thread k's share is the same part of every loop of the same size:
a convolution's thread copies the padded input lines its own rows read, and
writes the output rows that the next layer's same thread reads, from its own
core's L2 rather than the other core's (claimed in one global order, the rows
went to whichever thread came first: ResNet-18's 56x56x64 3x3 layer alone,
hot, two threads: 0.87 ms against 0.79-0.81 with one share per thread).

Each kernel library has its own pool, started at its first parallel call
(workers with ids 0 to threads - 2, thread id + 1 of every call they join; a
call asking for fewer uses fewer), its workers asleep on a futex between
calls; one asleep for ``PF_IDLE_S`` seconds leaves (the next call starts
another with its id), and a forked child starts workers of its own. One call
runs at a time per library: a second caller meanwhile runs its loop alone.
Each share is a 64-bit word: 24 bits of call number, 20 each for its next and
its end chunk; a stale worker's compare-and-swap can only succeed on the very
state of the current call, so a claim is always the current call's (its
function and context are read after the claim, and stay valid until the
call's last chunk is done).

``PARFOR_C`` defines ``static void pf_parfor(int n, int threads, pf_fn fn,
const void *ctx)``, which runs ``fn(ctx, lo, hi)`` over ``[0, n)`` in chunks;
a template includes it and calls it instead of an OpenMP loop (and is built
without ``-fopenmp``).

**One pool per process.** A library opened with ``open_library`` (every plan
step and every measured kernel) runs its loops on the process's shared pool
(``shared_pool``: this code built once as a library of its own, handed to the
kernel library through its exported ``pf_use_pool``), not on one of its own:
a plan's steps are many libraries, and with a pool each, every step's loop
woke a worker asleep since its last call. A futex wake takes tens of
microseconds to get the worker onto its core, during which the caller runs
the loop alone: ResNet-18 at 224x224 makes about 40 such loops a call (a
convolution's padded copy, then its rows), and its whole call took 19.7 ms
where its steps, each timed hot, summed to 15.2. The shared pool's workers
also spin ``PLANFORGE_POOL_SPIN_US`` microseconds (default 200; 0: sleep at
once) after a call before they sleep, so that the next step's loop finds them
awake; a library's own pool (opened otherwise) sleeps at once, as before. A
kernel with a pinned pool of its own (``pool.py``: the fused MLP) hushes them
first (``pf_pool_hush``, handed over by ``open_library``): a worker spinning
on a core that kernel's pinned worker needs made the two take turns there
(MobileNetV3-small's classifier right after the last convolution: 215 us,
against 145 hushed).
"""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Callable

PARFOR_C = r"""
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <limits.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#if defined(__x86_64__) || defined(__i386__)
#define pf_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define pf_relax() __asm__ __volatile__("yield")
#else
#define pf_relax() ((void)0)
#endif
#ifndef PF_CHUNKS
#define PF_CHUNKS 8           /* chunks per thread: a late worker leaves at most this share undone by it */
#endif
#ifndef PF_IDLE_S
#define PF_IDLE_S 10          /* a worker asleep this many seconds leaves: a process that loads many libraries */
#endif                        /* (a search's measuring worker) keeps the threads of the recent ones only */
#define PF_MAXW 63
#define PF_CALL(v) ((uint32_t)((v) >> 40))
#define PF_LO(v) ((uint32_t)(((v) >> 20) & 0xFFFFF))
#define PF_HI(v) ((uint32_t)((v) & 0xFFFFF))

typedef void (*pf_fn)(const void *ctx, int lo, int hi);

typedef struct { _Alignas(64) _Atomic uint64_t w; } pf_home;  /* call << 40 | next chunk << 20 | end chunk */

static struct {
    pf_home home[PF_MAXW + 1];           /* thread k's share of the current call: its chunks [next, end) left */
    _Alignas(64) atomic_int done;        /* chunks of the current call finished */
    _Alignas(64) atomic_uint call;       /* the futex the workers sleep on: calls published */
    atomic_int sleepers, limit, homes;   /* workers asleep; the ids below ``limit`` join the call; its threads */
    pf_fn fn; const void *ctx; int n, chunks;
    _Atomic uint64_t ids;                /* the ids of the running workers (bit i: id i) */
    pthread_mutex_t busy, start;
} pf_st = { .busy = PTHREAD_MUTEX_INITIALIZER, .start = PTHREAD_MUTEX_INITIALIZER };

static void pf_chunk(int c) {
    long lo = (long)pf_st.n * c / pf_st.chunks, hi = (long)pf_st.n * (c + 1) / pf_st.chunks;
    if (lo < hi) pf_st.fn(pf_st.ctx, (int)lo, (int)hi);
    atomic_fetch_add_explicit(&pf_st.done, 1, memory_order_release);
}

/* one chunk of call ``call`` from home ``k``: its next (``back`` 0, the owner) or its last (a thief); -1 if none */
static int pf_take(uint32_t call, int k, int back) {
    _Atomic uint64_t *w = &pf_st.home[k].w;
    uint64_t v = atomic_load_explicit(w, memory_order_acquire);
    while (PF_CALL(v) == call && PF_LO(v) < PF_HI(v))
        if (atomic_compare_exchange_weak_explicit(w, &v, back ? v - 1 : v + (1ULL << 20), memory_order_acq_rel,
                                                  memory_order_acquire))
            return back ? (int)PF_HI(v) - 1 : (int)PF_LO(v);
    return -1;
}

/* run chunks of call ``call`` as thread ``me`` of ``homes``: its own share first to last, then the others'
   from their ends */
static void pf_claim(uint32_t call, int me, int homes) {
    int c;
    while ((c = pf_take(call, me, 0)) >= 0) pf_chunk(c);
    for (int d = 1; d < homes; d++)
        while ((c = pf_take(call, (me + d) % homes, 1)) >= 0) pf_chunk(c);
}

static long pf_spin_ns;  /* how long an idle worker spins before it sleeps (the shared pool's; 0 here) */
static atomic_uint pf_hushes;  /* bumped by ``pf_pool_hush``: a spinning worker then sleeps at once */
/* pf_hushes when the latest call (or wake) was published: a hush since then puts a worker to sleep, also one that
   starts spinning only after the hush (a worker late to see the call it spins after, on a loaded machine, missed
   the hush and spun its whole time while the pinned pool that hushed it ran) */
static atomic_uint pf_hush_ref;

/* spin up to pf_spin_ns for the call number to move on from ``seen``: 1 if it did; 0 when the time is up or
   the pool was hushed meanwhile */
static int pf_spin(unsigned seen) {
    if (pf_spin_ns <= 0) return 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const unsigned hushed = atomic_load_explicit(&pf_hush_ref, memory_order_relaxed);
    if (atomic_load_explicit(&pf_hushes, memory_order_relaxed) != hushed) return 0;
    for (unsigned k = 1;; k++) {
        if (atomic_load_explicit(&pf_st.call, memory_order_acquire) != seen) return 1;
        pf_relax();
        if (!(k & 15) && atomic_load_explicit(&pf_hushes, memory_order_relaxed) != hushed) return 0;
        if (!(k & 63)) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if ((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec) > pf_spin_ns) return 0;
        }
    }
}

static void *pf_worker(void *arg) {
    const int id = (int)(intptr_t)arg;  /* thread id + 1 of every call it joins: the same share each call */
    unsigned seen = atomic_load(&pf_st.call);
    for (;;) {
        unsigned c = atomic_load(&pf_st.call);
        if (c == seen && pf_spin(seen)) continue;  /* a call came while it spun */
        if (c == seen) {
            struct timespec idle = { PF_IDLE_S, 0 };
            atomic_fetch_add(&pf_st.sleepers, 1);
            long rc = syscall(SYS_futex, &pf_st.call, FUTEX_WAIT_PRIVATE, seen, &idle, NULL, 0);  /* at once if it moved on */
            int timed_out = rc != 0 && errno == ETIMEDOUT;
            atomic_fetch_sub(&pf_st.sleepers, 1);
            if (timed_out && atomic_load(&pf_st.call) == seen) {  /* idle that long: leave (a call never waits for it) */
                pthread_mutex_lock(&pf_st.start);
                atomic_fetch_and(&pf_st.ids, ~(1ULL << id));
                pthread_mutex_unlock(&pf_st.start);
                return NULL;
            }
            continue;
        }
        seen = c;
        /* the limit and thread count read now may be a later call's: then every take fails on the call number */
        if (id < atomic_load(&pf_st.limit)) pf_claim(c & 0xFFFFFF, id + 1, atomic_load(&pf_st.homes));
    }
    return NULL;
}

static void pf_child(void) {  /* a forked child has none of the parent's workers: it starts its own */
    atomic_store(&pf_st.ids, 0);
    atomic_store(&pf_st.sleepers, 0);
    pthread_mutex_init(&pf_st.busy, NULL);
    pthread_mutex_init(&pf_st.start, NULL);
}

static uint64_t pf_mask(int want) { return want >= 64 ? ~0ULL : (1ULL << want) - 1; }

static void pf_start(int want) {  /* workers with ids [0, want) */
    pthread_mutex_lock(&pf_st.start);
    static int forks_handled;
    if (!forks_handled) forks_handled = pthread_atfork(NULL, NULL, pf_child) == 0;
    for (int id = 0; id < want && id < PF_MAXW; id++) {
        if (atomic_load(&pf_st.ids) >> id & 1) continue;
        pthread_attr_t attr;
        pthread_t tid;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 1 << 20);
        atomic_fetch_or(&pf_st.ids, 1ULL << id);
        int rc = pthread_create(&tid, &attr, pf_worker, (void *)(intptr_t)id);
        pthread_attr_destroy(&attr);
        if (rc != 0) {  /* fewer workers: the others take the missing ones' shares */
            atomic_fetch_and(&pf_st.ids, ~(1ULL << id));
            break;
        }
    }
    pthread_mutex_unlock(&pf_st.start);
}

static void pf_own_parfor(int n, int threads, pf_fn fn, const void *ctx) {
    if (threads > PF_MAXW + 1) threads = PF_MAXW + 1;
    int chunks = threads * PF_CHUNKS < n ? threads * PF_CHUNKS : n;
    if (threads <= 1 || n <= 1 || chunks > 0xFFFFF || pthread_mutex_trylock(&pf_st.busy) != 0) {
        if (n > 0) fn(ctx, 0, n);  /* one thread, or another call of this library in flight: alone */
        return;
    }
    if ((atomic_load(&pf_st.ids) & pf_mask(threads - 1)) != pf_mask(threads - 1)) pf_start(threads - 1);
    unsigned call = (atomic_load(&pf_st.call) + 1) & 0xFFFFFF;
    pf_st.fn = fn; pf_st.ctx = ctx; pf_st.n = n; pf_st.chunks = chunks;
    atomic_store(&pf_st.limit, threads - 1);
    atomic_store(&pf_st.homes, threads);
    atomic_store(&pf_st.done, 0);
    for (int k = 0; k < threads; k++) {  /* thread k's share: the k-th of threads runs of chunks, in order */
        uint64_t lo = (uint64_t)chunks * k / threads, hi = (uint64_t)chunks * (k + 1) / threads;
        atomic_store_explicit(&pf_st.home[k].w, ((uint64_t)call << 40) | (lo << 20) | hi, memory_order_release);
    }
    atomic_store_explicit(&pf_hush_ref, atomic_load_explicit(&pf_hushes, memory_order_relaxed), memory_order_relaxed);
    atomic_store(&pf_st.call, call);
    if (atomic_load(&pf_st.sleepers) > 0)
        syscall(SYS_futex, &pf_st.call, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    pf_claim(call, 0, threads);
    while (atomic_load_explicit(&pf_st.done, memory_order_acquire) < chunks)
        pf_relax();  /* a worker finishing a chunk it claimed */
    pthread_mutex_unlock(&pf_st.busy);
}

typedef void (*pf_parfor_t)(int n, int threads, pf_fn fn, const void *ctx);
static pf_parfor_t pf_shared;  /* the process's pool (``pf_use_pool``), else NULL: this library's own */

__attribute__((visibility("default"))) void pf_use_pool(void *parfor) { pf_shared = (pf_parfor_t)parfor; }

static void pf_parfor(int n, int threads, pf_fn fn, const void *ctx) {
    if (pf_shared && threads > 1 && n > 1) pf_shared(n, threads, fn, ctx);
    else pf_own_parfor(n, threads, fn, ctx);
}
"""

# The shared pool: the same loop, exported, with its idle workers spinning before they sleep.
_POOL_C = PARFOR_C + r"""
__attribute__((visibility("default"))) void pf_pool_parfor(int n, int threads, pf_fn fn, const void *ctx) {
    pf_own_parfor(n, threads, fn, ctx);
}

__attribute__((visibility("default"))) void pf_pool_spin(long ns) { pf_spin_ns = ns; }

/* one scratch buffer per thread for every kernel that takes it (``pf_use_scratch``, ``open_library``): kernels of
   a plan run one after another, so that a call touches one kernel's worth of scratch, warm in the caches, not a
   buffer per kernel (MobileNetV2's inverted-residual kernels held 2 MB between them, beside 14 MB of weights the
   L3 keeps only in part between calls); a kernel must not expect it to keep anything between its calls */
static __thread float *pf_sbuf;
static __thread size_t pf_scap;
__attribute__((visibility("default"))) float *pf_pool_scratch(size_t floats) {
    if (pf_scap < floats) {
        free(pf_sbuf);
        pf_sbuf = aligned_alloc(64, ((floats * sizeof(float) + 63) / 64) * 64);
        pf_scap = pf_sbuf ? floats : 0;
    }
    return pf_sbuf;
}

/* a chain of steps calls this where a part begins: workers asleep wake now (their spin starts again), not at
   the part's first parallel loop, which would otherwise run alone for the tens of microseconds a wake takes */
__attribute__((visibility("default"))) void pf_pool_wake(void *unused) {
    (void)unused;
    atomic_store_explicit(&pf_hush_ref, atomic_load_explicit(&pf_hushes, memory_order_relaxed), memory_order_relaxed);
    if (atomic_load(&pf_st.sleepers) > 0)
        syscall(SYS_futex, &pf_st.call, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* a kernel with a pinned pool of its own (``pool.py``) calls this first: spinning workers go to sleep */
__attribute__((visibility("default"))) void pf_pool_hush(void) {
    atomic_fetch_add_explicit(&pf_hushes, 1, memory_order_relaxed);
}
"""

DEFAULT_SPIN_US = 200
_lock = threading.Lock()
_pool: list = []  # [(library, address of pf_pool_parfor, of pf_pool_hush, ...)]: a forked child keeps it (its workers
# restart)


class PoolError(ValueError):
    """``PLANFORGE_POOL_SPIN_US`` is not a whole number of microseconds >= 0."""


def spin_us() -> int:
    """The shared pool's spin (``PLANFORGE_POOL_SPIN_US``, default ``DEFAULT_SPIN_US``)."""
    raw = os.environ.get("PLANFORGE_POOL_SPIN_US", "").strip()
    if not raw:
        return DEFAULT_SPIN_US
    try:
        v = int(raw)
    except ValueError:
        v = -1
    if v < 0:
        raise PoolError(f"PLANFORGE_POOL_SPIN_US={raw!r}: give a whole number of microseconds >= 0 (0: no spin)")
    return v


def _shared() -> tuple:
    """This process's shared pool: (its library, the address of ``pf_pool_parfor``, of ``pf_pool_hush``, of
    ``pf_pool_scratch``, of ``pf_pool_wake``), built and loaded at the first call."""
    with _lock:
        if not _pool:
            from ..build import build

            lib = ctypes.CDLL(str(build(_POOL_C).path))
            lib.pf_pool_spin.argtypes = [ctypes.c_long]
            lib.pf_pool_spin(spin_us() * 1000)
            _pool.append((lib, *(ctypes.cast(f, ctypes.c_void_p).value for f in (lib.pf_pool_parfor,
                                                                                  lib.pf_pool_hush,
                                                                                  lib.pf_pool_scratch,
                                                                                  lib.pf_pool_wake))))
        return _pool[0]


def shared_pool() -> int:
    """The address of this process's shared ``pf_pool_parfor`` (built and loaded at the first call)."""
    return _shared()[1]


def wake_step() -> Callable[[], None]:
    """A plan step that wakes the shared pool's sleeping workers (``pf_pool_wake``): a callable, with ``native``
    (its C function and argument) for a compiled chain of steps."""
    lib, *_, addr = _shared()
    fn = lib.pf_pool_wake
    fn.argtypes = [ctypes.c_void_p]

    def wake():
        fn(None)
    wake.native = (addr, 0)
    return wake


def open_library(path: str | Path) -> ctypes.CDLL:
    """``ctypes.CDLL(path)``, its parallel loops (if it has ``pf_use_pool``) put on the process's shared pool;
    a library with a pinned pool of its own (``pf_use_hush``, ``pool.py``) hushes the shared pool's spinning
    workers before each of its calls; one that takes the shared per-thread scratch (``pf_use_scratch``) gets it."""
    lib = ctypes.CDLL(str(path))
    for name, addr in (("pf_use_pool", 1), ("pf_use_hush", 2), ("pf_use_scratch", 3)):
        try:
            use = getattr(lib, name)
        except AttributeError:
            continue
        use.argtypes = [ctypes.c_void_p]
        use(_shared()[addr])
    return lib


__all__ = ["PARFOR_C", "open_library", "shared_pool", "spin_us", "PoolError"]


_built: dict[str, ctypes.CDLL | None] = {}


def built_library(source: str) -> ctypes.CDLL | None:
    """``source`` (a compiled pass's C, ``PARFOR_C`` included) built once per process and opened with
    ``open_library``; None where it cannot be built here (no compiler, a build error), and a failed build is not
    tried again: the caller keeps its numpy step."""
    from ..build import BuildError, CompilerMissing, build

    if source not in _built:
        try:
            _built[source] = open_library(build(source).path)
        except (BuildError, CompilerMissing, OSError):
            _built[source] = None
    return _built[source]
