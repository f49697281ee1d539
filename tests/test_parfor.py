"""The claimed-chunk parallel loop (templates/parfor.py): every item once per call, whatever the threads."""
from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

from planforge.targets.cpu.build import build
from planforge.targets.cpu.templates.parfor import PARFOR_C

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

int workers(void) { return pf_st.workers; }

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
