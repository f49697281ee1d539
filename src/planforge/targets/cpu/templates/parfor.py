"""A parallel loop whose caller never waits for a thread that has not started: chunks are claimed, not assigned.

An OpenMP ``parallel for schedule(static)`` gives each thread its share before
the loop starts and ends with a barrier: the call returns when the slowest
thread has done its share. With idle threads asleep (``OMP_WAIT_POLICY=PASSIVE``)
every call wakes the team, and on a machine whose other core is busy the
woken thread waits for the scheduler: a two-thread GEMV timed at 0.47 ms took
3-3.5 ms in those samples, and whole two-thread CNN plans ran 10-30x their
one-thread time (docs/benchmarks.md, issues 14 and 17).

Here the loop's ``n`` items are cut into chunks (``PF_CHUNKS`` per thread) and
every thread, the caller included, takes the next unclaimed chunk with one
compare-and-swap on a word that holds the call's number, its chunk count and
the next chunk. The caller starts at once; a worker that wakes late finds
fewer chunks left, or none, and the call returns once every claimed chunk is
done. So a call takes about the one-thread time when its workers are late and
less when they come, never the time of a thread waiting for a core.

Each kernel library has its own pool, started at its first parallel call
(threads - 1 workers; a call asking for fewer uses fewer), its workers asleep
on a futex between calls; one asleep for ``PF_IDLE_S`` seconds leaves (the
next call starts another), and a forked child starts workers of its own. One
call runs at a time per library: a second caller meanwhile runs its loop
alone. The word is 64 bits: 24 for the call number, 20
each for the chunk count and the next chunk; a stale worker's compare-and-swap
can only succeed on the very state of the current call, so a claim is always
the current call's (its function and context are read after the claim, and
stay valid until the call's last chunk is done).

``PARFOR_C`` defines ``static void pf_parfor(int n, int threads, pf_fn fn,
const void *ctx)``, which runs ``fn(ctx, lo, hi)`` over ``[0, n)`` in chunks;
a template includes it and calls it instead of an OpenMP loop (and is built
without ``-fopenmp``).
"""
from __future__ import annotations

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
#define PF_N(v) ((uint32_t)(((v) >> 20) & 0xFFFFF))
#define PF_NEXT(v) ((uint32_t)((v) & 0xFFFFF))

typedef void (*pf_fn)(const void *ctx, int lo, int hi);

static struct {
    _Alignas(64) _Atomic uint64_t word;  /* call << 40 | chunks << 20 | next chunk */
    _Alignas(64) atomic_int done;        /* chunks of the current call finished */
    _Alignas(64) atomic_uint call;       /* the futex the workers sleep on: calls published */
    atomic_int sleepers, limit;          /* workers asleep; workers the current call may use */
    atomic_uint joined;                  /* call << 8 | workers that joined it */
    pf_fn fn; const void *ctx; int n, chunks;
    atomic_int workers;
    pthread_mutex_t busy, start;
} pf_st = { .busy = PTHREAD_MUTEX_INITIALIZER, .start = PTHREAD_MUTEX_INITIALIZER };

static void pf_chunk(int c) {
    long lo = (long)pf_st.n * c / pf_st.chunks, hi = (long)pf_st.n * (c + 1) / pf_st.chunks;
    if (lo < hi) pf_st.fn(pf_st.ctx, (int)lo, (int)hi);
}

/* claim and run chunks of call ``call`` until none is left; returns how many this thread ran */
static int pf_claim(uint32_t call) {
    int mine = 0;
    uint64_t v = atomic_load_explicit(&pf_st.word, memory_order_acquire);
    while (PF_CALL(v) == call && PF_NEXT(v) < PF_N(v)) {
        if (atomic_compare_exchange_weak_explicit(&pf_st.word, &v, v + 1, memory_order_acq_rel, memory_order_acquire)) {
            pf_chunk((int)PF_NEXT(v));
            mine++;
            v = atomic_load_explicit(&pf_st.word, memory_order_acquire);
        }
    }
    return mine;
}

/* a seat in call ``call`` (at most ``limit`` workers take one; a worker late for an earlier call takes none) */
static int pf_join(unsigned call) {
    unsigned v = atomic_load(&pf_st.joined);
    while (v >> 8 == (call & 0xFFFFFF) && (int)(v & 0xFF) < atomic_load(&pf_st.limit))
        if (atomic_compare_exchange_weak(&pf_st.joined, &v, v + 1)) return 1;
    return 0;
}

static void *pf_worker(void *arg) {
    (void)arg;
    unsigned seen = atomic_load(&pf_st.call);
    for (;;) {
        unsigned c = atomic_load(&pf_st.call);
        if (c == seen) {
            struct timespec idle = { PF_IDLE_S, 0 };
            atomic_fetch_add(&pf_st.sleepers, 1);
            long rc = syscall(SYS_futex, &pf_st.call, FUTEX_WAIT_PRIVATE, seen, &idle, NULL, 0);  /* at once if it moved on */
            int timed_out = rc != 0 && errno == ETIMEDOUT;
            atomic_fetch_sub(&pf_st.sleepers, 1);
            if (timed_out && atomic_load(&pf_st.call) == seen) {  /* idle that long: leave (a call never waits for it) */
                pthread_mutex_lock(&pf_st.start);
                pf_st.workers--;
                pthread_mutex_unlock(&pf_st.start);
                return NULL;
            }
            continue;
        }
        seen = c;
        if (pf_join(c)) {
            int mine = pf_claim(c & 0xFFFFFF);
            if (mine) atomic_fetch_add_explicit(&pf_st.done, mine, memory_order_release);
        }
    }
    return NULL;
}

static void pf_child(void) {  /* a forked child has none of the parent's workers: it starts its own */
    pf_st.workers = 0;
    atomic_store(&pf_st.sleepers, 0);
    pthread_mutex_init(&pf_st.busy, NULL);
    pthread_mutex_init(&pf_st.start, NULL);
}

static void pf_start(int want) {
    pthread_mutex_lock(&pf_st.start);
    static int forks_handled;
    if (!forks_handled) forks_handled = pthread_atfork(NULL, NULL, pf_child) == 0;
    while (pf_st.workers < want && pf_st.workers < PF_MAXW) {
        pthread_attr_t attr;
        pthread_t tid;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 1 << 20);
        int rc = pthread_create(&tid, &attr, pf_worker, NULL);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;  /* fewer workers: the caller does their chunks */
        pf_st.workers++;
    }
    pthread_mutex_unlock(&pf_st.start);
}

static void pf_parfor(int n, int threads, pf_fn fn, const void *ctx) {
    int chunks = threads * PF_CHUNKS < n ? threads * PF_CHUNKS : n;
    if (threads <= 1 || n <= 1 || chunks > 0xFFFFF || pthread_mutex_trylock(&pf_st.busy) != 0) {
        if (n > 0) fn(ctx, 0, n);  /* one thread, or another call of this library in flight: alone */
        return;
    }
    if (pf_st.workers < threads - 1) pf_start(threads - 1);
    unsigned call = (atomic_load(&pf_st.call) + 1) & 0xFFFFFF;
    pf_st.fn = fn; pf_st.ctx = ctx; pf_st.n = n; pf_st.chunks = chunks;
    atomic_store(&pf_st.limit, threads - 1 < 255 ? threads - 1 : 255);
    atomic_store(&pf_st.joined, call << 8);
    atomic_store(&pf_st.done, 0);
    atomic_store_explicit(&pf_st.word, ((uint64_t)call << 40) | ((uint64_t)chunks << 20), memory_order_release);
    atomic_store(&pf_st.call, call);
    if (atomic_load(&pf_st.sleepers) > 0)
        syscall(SYS_futex, &pf_st.call, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    int mine = pf_claim(call);
    atomic_fetch_add_explicit(&pf_st.done, mine, memory_order_release);
    while (atomic_load_explicit(&pf_st.done, memory_order_acquire) < chunks)
        pf_relax();  /* a worker finishing a chunk it claimed */
    pthread_mutex_unlock(&pf_st.busy);
}
"""

__all__ = ["PARFOR_C"]
