"""A plan's large arrays in huge pages (``targets/cpu/templates/scratch.py``: ``Pages``, ``huge_pages``)."""
import gc
import mmap
import re
from pathlib import Path

import numpy as np
import pytest

from planforge.targets.cpu.templates.scratch import HUGE_PAGE, SMALL, Pages, aligned_zeros, huge_pages

linux_only = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE here")


def _chunk_of(a: np.ndarray) -> int:
    return (a.ctypes.data // HUGE_PAGE) * HUGE_PAGE


@linux_only
def test_large_arrays_come_from_aligned_chunks_and_small_ones_from_the_heap():
    pages = Pages()
    with huge_pages(pages):
        big = aligned_zeros((SMALL // 4 + 3,))
        other = aligned_zeros((5, SMALL // 20 + 1), align=128)
        small = aligned_zeros((SMALL // 8,))
        huge = aligned_zeros((HUGE_PAGE // 4 + 7,))  # more than one chunk's room: a chunk of its own
    outside = aligned_zeros((SMALL,))
    assert pages.mapped == 3 * HUGE_PAGE  # one chunk for the first two, two pages for the last
    assert big.ctypes.data % HUGE_PAGE == 0 and other.ctypes.data % 128 == 0
    assert _chunk_of(other) == _chunk_of(big) and other.ctypes.data >= big.ctypes.data + big.nbytes
    assert huge.ctypes.data % HUGE_PAGE == 0 and _chunk_of(huge) != _chunk_of(big)
    assert small.ctypes.data % 64 == 0 and outside.ctypes.data % 64 == 0
    for a in (big, other, small, huge, outside):
        assert a.dtype == np.float32 and not a.any()
    assert pages.mapped == 3 * HUGE_PAGE and not hasattr(outside.base, "madvise")


@linux_only
def test_the_arrays_outlive_their_pages_and_the_context_nests():
    outer, inner = Pages(), Pages()
    with huge_pages(outer):
        with huge_pages(inner):
            a = aligned_zeros((SMALL,))
        with huge_pages(None):
            b = aligned_zeros((SMALL,))
        c = aligned_zeros((SMALL,))
    assert inner.mapped == outer.mapped == HUGE_PAGE
    assert _chunk_of(a) != _chunk_of(c)  # each from its own Pages; b from the heap (neither mapped more)
    assert a.ctypes.data % HUGE_PAGE == 0 and c.ctypes.data % HUGE_PAGE == 0
    del outer, inner
    gc.collect()
    a[:] = 1.5  # still mapped: the arrays hold their chunk
    c[-1] = 2.0
    assert a.sum() == 1.5 * a.size and c[-1] == 2.0


def _thp_mode() -> str:
    p = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    m = re.search(r"\[(\w+)\]", p.read_text()) if p.exists() else None
    return m.group(1) if m else "never"


@linux_only
@pytest.mark.skipif(_thp_mode() == "never", reason="transparent huge pages are off on this machine")
def test_a_plan_chunk_is_backed_by_huge_pages_where_the_kernel_offers_them():
    """Where transparent huge pages are on (``madvise`` or ``always``), a chunk's touched pages are huge ones, which
    /proc/self/smaps reports for its mapping (the kernel may still decline under memory pressure: at least one of
    four chunks counts)."""
    arrays = []
    with huge_pages(Pages()):
        for _ in range(4):
            a = aligned_zeros((HUGE_PAGE // 4,))
            a[:] = 1.0
            arrays.append(a)
    smaps = Path("/proc/self/smaps").read_text().split("\n")
    huge_kb = 0
    starts = {_chunk_of(a) for a in arrays}
    for i, line in enumerate(smaps):
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if not m:
            continue
        lo, hi = int(m.group(1), 16), int(m.group(2), 16)
        if any(lo <= s < hi for s in starts):
            for rest in smaps[i + 1:]:
                if re.match(r"[0-9a-f]+-[0-9a-f]+ ", rest):
                    break
                if rest.startswith("AnonHugePages:"):
                    huge_kb += int(rest.split()[1])
    assert huge_kb >= HUGE_PAGE // 1024


@linux_only
def test_a_plan_binds_its_weights_in_pages_and_runs_as_before(monkeypatch):
    """A small CNN's seed plan built with its large arrays in huge pages (they are taken from ``Pages``) and
    without: the same outputs, torch's."""
    import torch

    from planforge.ir import from_torch
    from planforge.targets.cpu import plan as plan_mod
    from planforge.targets.cpu.templates import scratch
    from planforge.targets.registry import get_target
    from planforge.workloads.models import graph_workload

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(16, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
                            torch.nn.Conv2d(64, 64, 3, padding=1)).eval()
    x = torch.randn(1, 16, 10, 10)
    g = from_torch(m, (x,))
    (task,) = graph_workload(g, "pages", whole_below=10_000, kernel_trials=1).tasks
    prog = task.backend.genome.program(task.seeds[0].as_dict())
    taken = []
    real = scratch.Pages.take

    def take(self, nbytes, align):
        got = real(self, nbytes, align)
        taken.append(nbytes if got is not None else 0)
        return got

    monkeypatch.setattr(scratch.Pages, "take", take)
    outs = []
    for on in (True, False):
        monkeypatch.setattr(plan_mod, "HUGE_PAGES", on)
        before = len(taken)
        outs.append(np.array(get_target("cpu").plan(g, prog)(x.numpy())[0]))
        assert (sum(taken[before:]) >= 64 * 64 * 9 * 4) == on  # the second convolution's weights at least
    want = m(x).detach().numpy()
    assert np.abs(outs[0] - want).max() < 1e-4 * (1 + np.abs(want).max())
    np.testing.assert_array_equal(outs[0], outs[1])
