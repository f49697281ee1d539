"""The finalists' re-measurement: the search's starting point is re-measured beside the top-k, so that a seed
measured in a slow stretch of a shared host is not lost to plans measured later in a fast one."""
from functools import partial

from planforge.outcome import Outcome
from planforge.search import Budget
from planforge.space import Space, int_range
from planforge.targets.table import TableBackend
from planforge.tuning import tune
from planforge.workloads import Manifest, Task, Workload

SPACE = Space([int_range("x", 0, 9)])
# plan 0 (the seed) runs fastest; the others 1.1 to 1.9 ms
TRUE = {SPACE.make({"x": i}).fingerprint: 1e-3 * (1 + 0.1 * i) for i in range(10)}


class SlowStart(TableBackend):
    """The search measured ``slow`` (a fingerprint) at twice its time, as in a slow stretch of the host; the
    interleaved re-measurement sees every candidate at its true time."""

    def __init__(self, table, slow: str):
        super().__init__(table, label="slow-start")
        self.slow = slow

    def factory(self):
        return partial(_copy, dict(self.table), self.slow)

    def measure(self, candidates):
        return [Outcome.measured([2 * self.table[c.fingerprint]]) if c.fingerprint == self.slow else o
                for c, o in zip(candidates, super().measure(candidates))]

    def remeasure(self, candidates, libraries=None, rounds=3):
        return TableBackend.measure(self, candidates), {}


def _copy(table, slow, cpus=None):
    return SlowStart(table, slow)


def _workload(seeded: bool) -> Workload:
    seed = SPACE.make({"x": 0})
    task = Task(key="t", space=SPACE, backend=SlowStart(TRUE, seed.fingerprint),
                seeds=[seed] if seeded else (), lead_seeds=1 if seeded else 0)
    return Workload(Manifest("slow-start"), [task])


def test_a_seed_measured_in_a_slow_stretch_wins_the_finalists_re_measurement(tmp_path):
    res = tune(_workload(True), strategy="genetic", budget=Budget(evals=8), keep=3, out=tmp_path)
    (tr,) = res.tasks
    # the search measured the seed at 2 ms, behind every other plan it measured, so it was no finalist
    assert tr.result.trials[0].candidate["x"] == 0 and tr.result.trials[0].outcome.metric == 2e-3
    assert all(e.candidate["x"] != 0 for e in tr.result.ranked)
    # re-measured beside the finalists, it is chosen
    assert tr.walk.accepted.candidate["x"] == 0
    assert abs(tr.walk.accepted.metric - 1e-3) < 1e-12
    assert len(tr.ranked) == 3  # it took a finalist's place, and the top-k stayed k
