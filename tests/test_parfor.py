"""The claimed-chunk parallel loop (templates/parfor.py): every item once per call, whatever the threads; each
thread's share the same run of items in every call; libraries opened with ``open_library`` on one shared pool."""
from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

from planforge.targets.cpu.build import build
from planforge.targets.cpu.templates import parfor
from planforge.targets.cpu.templates.parfor import PARFOR_C, PoolError, open_library, spin_us

SOURCE = PARFOR_C + r"""
typedef struct { int *hits; int *who; int stamp; } ctx_t;
static pthread_t pf_test_caller;  /* not thread-safe across callers: only read by a test that calls from one */

static void body(const void *c, int lo, int hi) {
    const ctx_t *x = (const ctx_t *)c;
    for (int i = lo; i < hi; i++) {
        __atomic_fetch_add(&x->hits[i], x->stamp, __ATOMIC_RELAXED);
        x->who[i] = !pthread_equal(pthread_self(), pf_test_caller);
    }
}

int workers(void) { return __builtin_popcountll(pf_st.ids); }

void run(int *hits, int *who, int n, int threads, int stamp, int calls) {
    ctx_t c = { hits, who, stamp };
    pf_test_caller = pthread_self();
    for (int k = 0; k < calls; k++) pf_parfor(n, threads, body, &c);
}
"""


@pytest.fixture(scope="module")
def lib():
    lib = ctypes.CDLL(str(build(SOURCE).path))
    P = ctypes.POINTER(ctypes.c_int)
    lib.run.argtypes = [P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return lib


def _run(lib, n, threads, stamp=1, calls=1):
    hits, who = np.zeros(max(n, 1), np.int32), np.zeros(max(n, 1), np.int32)
    P = ctypes.POINTER(ctypes.c_int)
    lib.run(hits.ctypes.data_as(P), who.ctypes.data_as(P), n, threads, stamp, calls)
    return hits[:n], who[:n]


@pytest.mark.parametrize("n", [0, 1, 2, 7, 16, 17, 1000])
@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_every_item_exactly_once_per_call(lib, n, threads):
    hits, _ = _run(lib, n, threads, calls=50)
    assert (hits == 50).all()  # 50 calls: each item 50 times, never skipped or run twice


def test_one_thread_runs_on_the_caller(lib):
    _, who = _run(lib, 1000, 1, calls=3)
    assert not who.any()


def test_workers_take_chunks(lib):
    # over many calls with plenty of work a worker claims some chunks (it may be late for any one call)
    for _ in range(20):
        _, who = _run(lib, 1 << 16, 2, calls=20)
        if who.any():
            return
    pytest.fail("no worker ever claimed a chunk in 400 two-thread calls")


def test_concurrent_callers_each_get_every_item(lib):
    # a second caller while a call is in flight runs its own loop alone: no item lost or taken from the other
    out = {}

    def go(stamp):
        out[stamp] = _run(lib, 5000, 2, stamp=stamp, calls=200)[0]

    ts = [threading.Thread(target=go, args=(s,)) for s in (1, 1000)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert (out[1] == 200).all() and (out[1000] == 200 * 1000).all()


def test_a_forked_child_gets_workers_of_its_own(lib):
    import os

    _run(lib, 1 << 12, 2, calls=5)  # the parent's pool is started
    pid = os.fork()
    if pid == 0:  # the child: every item once per call, and (over enough calls) a worker of its own helps
        ok = (_run(lib, 1000, 2, calls=20)[0] == 20).all()
        helped = any(_run(lib, 1 << 16, 2, calls=20)[1].any() for _ in range(20))
        os._exit(0 if ok and helped else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_idle_workers_leave_and_come_back():
    import time

    lib = ctypes.CDLL(str(build("#define PF_IDLE_S 1\n" + SOURCE).path))
    P = ctypes.POINTER(ctypes.c_int)
    lib.run.argtypes = [P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    assert lib.workers() == 0
    assert (_run(lib, 1000, 3, calls=5)[0] == 5).all()
    assert lib.workers() == 2  # two workers started
    time.sleep(2.5)
    assert lib.workers() == 0  # asleep over a second: gone
    assert (_run(lib, 1000, 3, calls=5)[0] == 5).all() and lib.workers() == 2  # and back at the next call


def test_a_worker_takes_its_own_share_first(lib):
    """Thread 1 of 2 owns the second half of the chunks: whenever the worker ran any items they are one run that
    holds the middle item (its share from the front, then, if it is done first, the caller's share from its end;
    the caller takes the worker's share from the end while it is late), never items scattered over the range."""
    n = 1 << 14
    helped = 0
    for _ in range(200):
        hits, who = _run(lib, n, 2)
        assert (hits == 1).all()
        idx = np.flatnonzero(who)
        if idx.size:
            helped += 1
            assert idx[0] <= n // 2 <= idx[-1] and idx[-1] - idx[0] + 1 == idx.size, (idx[0], idx[-1], idx.size)
    assert helped, "no worker ever claimed a chunk in 200 two-thread calls"


def test_opened_libraries_share_the_process_pool(tmp_path):
    """``open_library`` puts a library's loops on the shared pool: its own pool never starts, every item is still
    run once per call, and the shared pool's worker helps; a library opened with a plain CDLL starts its own."""
    # sources of their own: a library the other tests loaded with CDLL would be that same handle
    shared = [open_library(build(SOURCE + f"\n/* library {k} on the shared pool */\n").path) for k in (1, 2)]
    P = ctypes.POINTER(ctypes.c_int)
    for lib in shared:
        lib.run.argtypes = [P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    helped = False
    for _ in range(50):
        for lib in shared:
            hits, who = _run(lib, 1 << 14, 2, calls=4)
            assert (hits == 4).all()
            helped = helped or who.any()
    assert helped
    assert [lib.workers() for lib in shared] == [0, 0]
    assert parfor._pool, "the shared pool was built and loaded"


def test_pool_spin_setting(monkeypatch):
    monkeypatch.delenv("PLANFORGE_POOL_SPIN_US", raising=False)
    assert spin_us() == parfor.DEFAULT_SPIN_US
    monkeypatch.setenv("PLANFORGE_POOL_SPIN_US", "0")
    assert spin_us() == 0
    for bad in ("-5", "1.5", "fast"):
        monkeypatch.setenv("PLANFORGE_POOL_SPIN_US", bad)
        with pytest.raises(PoolError, match=r"PLANFORGE_POOL_SPIN_US=.*whole number of microseconds"):
            spin_us()
    # refused when the CPU target is made, before anything is measured (not as every kernel's failure)
    from planforge.targets import TargetError
    from planforge.targets.cpu.target import CpuTarget

    with pytest.raises(TargetError, match="PLANFORGE_POOL_SPIN_US='fast'"):
        CpuTarget()


HUSH_SOURCE = SOURCE + r"""
/* what pool.py's pinned pools do: take the shared pool's hush from open_library and call it */
static void (*hush)(void);
__attribute__((visibility("default"))) void pf_use_hush(void *h) { hush = (void (*)(void))h; }
int call_hush(void) { if (!hush) return 0; hush(); return 1; }
"""


def test_a_library_with_its_own_pool_hushes_the_shared_pools_spinning_worker():
    """After a loop the shared pool's worker spins (here for 2 s) before it sleeps, taking a core that a kernel
    with a pinned pool of its own (the fused MLP) needs; that kernel hushes it first and the worker sleeps at
    once: the process's CPU time over the next 0.3 s (its worker's spin) drops to nearly nothing."""
    import time

    lib = open_library(build(HUSH_SOURCE).path)
    P = ctypes.POINTER(ctypes.c_int)
    lib.run.argtypes = [P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    pool = parfor._shared()[0]
    pool.pf_pool_spin(2_000_000_000)
    used = {}
    try:
        for hushed in (False, True, False, True):
            hits, _ = _run(lib, 1 << 14, 2, calls=4)
            assert (hits == 4).all()
            if hushed:
                assert lib.call_hush() == 1, "open_library handed over the shared pool's hush"
            t0 = time.process_time()
            time.sleep(0.3)
            used.setdefault(hushed, []).append(time.process_time() - t0)
    finally:
        pool.pf_pool_spin(spin_us() * 1000)  # read on every check of the spin: it holds at once
    spun, slept = max(used[False]), max(used[True])
    assert spun > 0.1, f"the worker did not spin after its call ({used})"
    assert slept < 0.5 * spun, f"the hushed worker kept spinning ({used})"


def test_a_wake_step_wakes_the_shared_pools_sleeping_worker():
    """Where a part of a chained plan begins, ``wake_step`` wakes the shared pool's sleeping workers so that they
    are spinning by the part's first parallel loop: a worker asleep (hushed) burns no CPU time; woken, it spins."""
    import time

    from planforge.targets.cpu.templates.parfor import wake_step

    lib = open_library(build(HUSH_SOURCE).path)
    P = ctypes.POINTER(ctypes.c_int)
    lib.run.argtypes = [P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    pool = parfor._shared()[0]
    wake = wake_step()
    assert wake.native == (parfor._shared()[-1], 0)
    used = {}
    pool.pf_pool_spin(2_000_000_000)
    try:
        for _ in range(2):
            _run(lib, 1 << 14, 2, calls=4)
            lib.call_hush()
            time.sleep(0.05)  # the worker is asleep now
            for woken in (False, True):
                if woken:
                    wake()
                t0 = time.process_time()
                time.sleep(0.3)
                used.setdefault(woken, []).append(time.process_time() - t0)
    finally:
        pool.pf_pool_spin(spin_us() * 1000)
        lib.call_hush()
    assert max(used[True]) > 0.1, f"the woken worker did not spin ({used})"
    assert max(used[False]) < 0.5 * max(used[True]), f"the hushed worker did not sleep ({used})"
