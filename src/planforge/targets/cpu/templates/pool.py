"""A persistent, pinned worker pool in C, for batch-1 kernels that run thousands of times a second.

OpenMP forks and joins a team per call and its barriers sleep and wake
through the runtime; at a few microseconds per call that costs more than the
work. This pool is started once (by a plan's ``create``) and lives as long as
the plan: thread 0 is the caller, threads 1..T-1 are workers pinned one per
physical core (never the caller's core while there are others). A call bumps
a generation counter; workers spin on it for ``SPIN_NS`` nanoseconds after
their last call, then sleep on a condition variable until the next one, so an
idle control loop burns no core and a hot one pays no wake-up.

Synchronisation is by monotonic progress counters, one per thread on its own
cache line: a thread that finished stage ``s`` of call ``c`` stores
``(c - 1) * STAGES + s``, and "every thread finished stage s" is a read of the
others' counters: no shared read-modify-write, no reset between calls, so a
barrier is one cache-line transfer per thread.

Pinning keeps a worker's weight slice in its core's L2, but the caller's
thread is not pinned (that is the application's choice), and on a machine
busy with other work the scheduler may move it onto a worker's core, where
the two then take turns: ``PIN`` 0 leaves the workers to the scheduler too.

The C defines (the including template sets ``PT`` threads, ``STAGES`` per
call, ``SPIN_NS`` and ``PIN`` before it includes this code, and a
``static void pool_work(pool *p, int t)`` that runs thread ``t``'s share of
one call, calling ``pool_barrier(p, t, s)`` after its stage ``s`` when later
stages read what other threads wrote, and ending with ``pool_sync(p, t,
STAGES)``):

``POOL_HEAD`` (before the template's ``struct pool { POOL_FIELDS ... }``) and
``POOL_BODY`` (after it) are the C:

- ``pool_start(p, init)``: start the workers; each runs ``init(p, t)`` first
  (its own allocations, first touched by the core that will read them) and
  the call returns when all have, with 0, or -1 when a thread did not start.
- ``pool_call(p)``: one call on all threads (the caller is thread 0); returns
  when every thread finished its last stage.
- ``pool_stop(p)``: wake, stop and join the workers.
"""
from __future__ import annotations

POOL_HEAD = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <stdio.h>
#include <errno.h>
#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

typedef struct { _Alignas(64) atomic_long v; char pad[64 - sizeof(atomic_long)]; } pool_line;

typedef struct pool pool;
typedef int (*pool_init_fn)(pool *, int);

struct pool_targ { pool *p; int t; };

#define POOL_FIELDS \
    pool_line progress[PT];          /* per thread: last finished stage, monotonic */ \
    _Alignas(64) atomic_long go;     /* calls started */ \
    atomic_int stop, sleepers, ready, failed; \
    long calls; \
    pthread_mutex_t mu; pthread_cond_t cv; \
    pthread_t tid[PT]; int started; \
    int cpu[PT], cpus[PT], ncpu;     /* each worker's pinned CPU (-1: none), the CPUs picked */ \
    struct pool_targ targ[PT]; \
    pool_init_fn init;
"""

POOL_BODY = r"""
static inline long pool_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* wait until every other thread has finished stage `target` (a barrier that only waits) */
static inline void pool_wait_all(pool_line *progress, int self, long target) {
    for (int u = 0; u < PT; u++) {
        if (u == self) continue;
        unsigned spins = 0;
        while (atomic_load_explicit(&progress[u].v, memory_order_acquire) < target) {
            cpu_relax();
            /* a descheduled peer (an oversubscribed machine): give the core away instead of burning it */
            if (++spins > 1024u) sched_yield();
        }
    }
}

/* pin worker threads one per physical core: the CPUs of this process's mask, one per sibling group,
   skipping the caller's core while there are others; returns how many CPUs were picked */
static int pool_cpus(int *out, int cap) {
#ifdef __linux__
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof mask, &mask) != 0) return 0;
    int here = sched_getcpu(), here_core = -1, n = 0, cores[CPU_SETSIZE];
    for (int c = 0; c < CPU_SETSIZE && n < cap; c++) {
        if (!CPU_ISSET(c, &mask)) continue;
        int first = c;  /* the lowest sibling names the physical core */
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
        FILE *f = fopen(path, "r");
        if (f) { if (fscanf(f, "%d", &first) != 1) first = c; fclose(f); }
        if (c == here) here_core = first;
        int dup = 0;
        for (int i = 0; i < n; i++) dup |= cores[i] == first;
        if (!dup) { cores[n] = first; out[n++] = c; }
    }
    if (n > 1) {  /* the caller's core last: workers take the others first */
        for (int i = 0; i < n; i++) if (cores[i] == here_core) {
            int c = out[i];
            for (int j = i; j + 1 < n; j++) { out[j] = out[j + 1]; cores[j] = cores[j + 1]; }
            out[n - 1] = c; cores[n - 1] = here_core;
            break;
        }
    }
    return n;
#else
    (void)out; (void)cap;
    return 0;
#endif
}

static void pool_work(pool *p, int t);

static void *pool_main(void *arg) {
    struct pool_targ *a = (struct pool_targ *)arg;
    pool *p = a->p;
    int t = a->t;
    if (p->init(p, t) != 0) atomic_store(&p->failed, 1);
    atomic_fetch_add(&p->ready, 1);
    long seen = 0;
    for (;;) {
        long deadline = 0;
        unsigned spins = 0;
        long g;
        while ((g = atomic_load_explicit(&p->go, memory_order_acquire)) == seen && !atomic_load(&p->stop)) {
            cpu_relax();
            if ((++spins & 255u) == 0) {
                /* a thread that shares this core (the unpinned caller, moved here because another pool's
                   pinned worker spins on its own core) gets it now, not after the spin bound: two plans' pools
                   pinned to opposite cores made each call of one take 8 ms instead of 8 us */
                sched_yield();
                long now = pool_now_ns();
                if (!deadline) deadline = now + (long)SPIN_NS;
                else if (now >= deadline) {
                    /* idle past the spin bound: sleep until the next call (Dekker with pool_call: both
                       sides store then load, seq_cst, so a call never misses a sleeper) */
                    pthread_mutex_lock(&p->mu);
                    atomic_fetch_add(&p->sleepers, 1);
                    while (atomic_load(&p->go) == seen && !atomic_load(&p->stop))
                        pthread_cond_wait(&p->cv, &p->mu);
                    atomic_fetch_sub(&p->sleepers, 1);
                    pthread_mutex_unlock(&p->mu);
                    deadline = 0;
                }
            }
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        pool_work(p, t);
    }
    return NULL;
}

static int pool_start(pool *p, pool_init_fn init) {
    p->init = init;
    atomic_store(&p->go, 0);
    atomic_store(&p->stop, 0);
    atomic_store(&p->sleepers, 0);
    atomic_store(&p->ready, 0);
    atomic_store(&p->failed, 0);
    p->calls = 0;
    p->started = 0;
    for (int t = 0; t < PT; t++) atomic_store(&p->progress[t].v, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (init(p, 0) != 0) return -1;
    int *cpus = p->cpus, ncpu = PT > 1 && PIN ? pool_cpus(cpus, PT) : 0;
    p->ncpu = ncpu;
    for (int t = 0; t < PT; t++) p->cpu[t] = -1;
    for (int t = 1; t < PT; t++) {
        p->targ[t].p = p;
        p->targ[t].t = t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
#ifdef __linux__
        if (PIN && ncpu > 1) {  /* worker t on the t-th core of the list; the caller keeps its own */
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpus[(t - 1) % ncpu], &one);
            pthread_attr_setaffinity_np(&attr, sizeof one, &one);
            p->cpu[t] = cpus[(t - 1) % ncpu];
        }
#endif
        int rc = pthread_create(&p->tid[t], &attr, pool_main, &p->targ[t]);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        p->started = t;
    }
    while (atomic_load(&p->ready) < p->started) sched_yield();
    if (p->started != PT - 1 || atomic_load(&p->failed)) return -1;
    return 0;
}

static inline void pool_sync(pool *p, int t, int stage) {
    atomic_store_explicit(&p->progress[t].v, (p->calls - 1) * STAGES + stage, memory_order_release);
}

static inline void pool_barrier(pool *p, int t, int stage) {
    pool_sync(p, t, stage);
    pool_wait_all(p->progress, t, (p->calls - 1) * STAGES + stage);
}

/* the unpinned caller may have been moved onto a pinned worker's CPU (another pool's worker spinning on the
   caller's old one): that worker moves to a picked CPU no thread of this call is on, so the two do not take
   turns on one core through every barrier of the call (two plans' pools, pinned to opposite cores, made a call
   take 8 ms instead of 8 us). A CPU id compare per call; the move is a syscall, only when they collide. */
static void pool_unclash(pool *p) {
#ifdef __linux__
    if (!PIN || p->ncpu < 2) return;
    int here = sched_getcpu();
    for (int t = 1; t <= p->started; t++) {
        if (p->cpu[t] != here) continue;
        for (int i = 0; i < p->ncpu; i++) {
            int c = p->cpus[i], used = c == here;
            for (int u = 1; u <= p->started; u++) used |= p->cpu[u] == c;
            if (used) continue;
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            if (pthread_setaffinity_np(p->tid[t], sizeof one, &one) == 0) p->cpu[t] = c;
            break;
        }
    }
#else
    (void)p;
#endif
}

/* the process's shared loop pool's hush (``parfor.open_library`` hands it over): its idle workers stop spinning
   and sleep, so that they do not take turns with this pool's pinned workers on their cores for the rest of their
   spin (MobileNetV3-small's classifier MLP ran 215 us right after the network's last convolution, 140 alone) */
static void (*pool_hush)(void);

__attribute__((visibility("default"))) void pf_use_hush(void *hush) { pool_hush = (void (*)(void))hush; }

static void pool_call(pool *p) {
    p->calls++;
    if (PT > 1) {
        if (pool_hush) pool_hush();
        pool_unclash(p);
        atomic_store(&p->go, p->calls);  /* seq_cst: ordered before the sleepers load (see pool_main) */
        if (atomic_load(&p->sleepers) > 0) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
    pool_work(p, 0);
    if (PT > 1) pool_wait_all(p->progress, 0, p->calls * STAGES);
}

static void pool_stop(pool *p) {
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t <= p->started; t++) pthread_join(p->tid[t], NULL);
    p->started = 0;
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
}
"""
