import math
from collections import Counter

import pytest

from planforge.targets.table import TableBackend
from planforge.costmodel import TableProxy
from planforge.outcome import Outcome
from planforge.search import STRATEGIES, Budget, make_strategy, search
from planforge.space import Space, int_range, pow2


def bowl():
    """A synthetic space with a known structure: a smooth bowl with its minimum at (8, 12, 3)."""
    s = Space([pow2("a", 1, 64), int_range("b", 0, 20), int_range("c", 0, 6)], ["a * b <= 400"])
    table = {c.fingerprint: 1e-6 * (1 + (math.log2(c["a"]) - 3) ** 2 + 0.1 * (c["b"] - 12) ** 2 + (c["c"] - 3) ** 2)
             for c in s.enumerate()}
    return s, table


class CountingBackend(TableBackend):
    def __post_init__(self):
        super().__post_init__()
        self.calls = Counter()

    def measure(self, candidates):
        for c in candidates:
            self.calls[c.fingerprint] += 1
        return super().measure(candidates)


def run(name, seed, evals=60, **kw):
    s, table = bowl()
    be = CountingBackend(table)
    cm = TableProxy(table) if name == "proxy-topk" else None
    strat = make_strategy(name, s, seed, budget=evals, cost_model=cm, **kw)
    return search(s, strat, be, Budget(evals=evals), keep=5, batch=3), be, s, table


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_reproducible_from_seed_and_never_remeasures(name):
    a, be_a, _, _ = run(name, seed=7)
    b, _, _, _ = run(name, seed=7)
    assert [t.candidate.fingerprint for t in a.trials] == [t.candidate.fingerprint for t in b.trials]
    assert max(be_a.calls.values()) == 1  # no fingerprint measured twice
    assert a.evaluations == len(be_a.calls)


@pytest.mark.parametrize("name", ["random", "genetic", "annealing", "hillclimb"])
def test_different_seeds_differ(name):
    a, *_ = run(name, seed=1)
    b, *_ = run(name, seed=2)
    assert [t.candidate.fingerprint for t in a.trials] != [t.candidate.fingerprint for t in b.trials]


def test_random_never_repeats_and_exhausts():
    s, table = bowl()
    be = CountingBackend(table)
    res = search(s, make_strategy("random", s, 3), be, Budget(evals=10_000))
    assert res.evaluations == s.valid_size() and res.stop_reason == "space exhausted"
    assert max(be.calls.values()) == 1


def test_random_without_replacement_on_a_space_too_big_to_enumerate():
    s = Space([int_range("a", 0, 2999), int_range("b", 0, 2999)], ["(a + b) % 7 != 0"])
    strat = make_strategy("random", s, 0, enumerate_limit=1000)
    seen = set()
    for _ in range(50):
        for c in strat.ask(20):
            assert c.fingerprint not in seen and s.is_valid(c)
            seen.add(c.fingerprint)


@pytest.mark.parametrize("name", ["genetic", "annealing", "hillclimb"])
def test_local_strategies_find_the_bowl_minimum(name):
    s, table = bowl()
    best = min(table.values())
    hits = 0
    for seed in range(5):
        res = search(s, make_strategy(name, s, seed), TableBackend(table), Budget(evals=150))
        hits += res.ranked.best.metric == best
    assert hits >= 3


def test_exhaustive_finds_true_best():
    s, table = bowl()
    res = search(s, make_strategy("exhaustive", s), TableBackend(table), Budget(evals=10_000))
    assert res.ranked.best.metric == min(table.values())


def test_auto_picks_exhaustive_when_space_fits_budget():
    s, _ = bowl()
    assert make_strategy("auto", s, budget=10_000).name == "exhaustive"
    assert make_strategy("auto", s, budget=10).name == "bandit"  # the tuned portfolio (see AUTO_PORTFOLIO)
    assert list(make_strategy("auto", s, budget=10).arms) == ["thompson", "genetic", "annealing", "hillclimb"]


def test_unknown_strategy_is_a_clear_error():
    s, _ = bowl()
    with pytest.raises(ValueError, match="unknown strategy 'nope'; choose one of"):
        make_strategy("nope", s)
    with pytest.raises(ValueError, match="needs a cost model"):
        make_strategy("proxy-topk", s)


def test_loop_guards_against_a_strategy_that_repeats_itself():
    s, table = bowl()

    class Stuck:
        total_duplicates = 0
        stop_reason = ""

        def __init__(self):
            self.c = next(s.enumerate())

        def ask(self, n):
            return [self.c]

        def tell(self, results):
            pass

    be = CountingBackend(table)
    res = search(s, Stuck(), be, Budget(evals=10), max_idle=100)
    assert res.evaluations == 1 and be.calls[next(s.enumerate()).fingerprint] == 1
    assert "no new evaluation" in res.stop_reason


def test_failures_are_counted_by_category_and_rejections_apart():
    s, table = bowl()
    cands = list(s.enumerate())

    class Flaky:
        name, fingerprint = "flaky", "flaky:0"

        def measure(self, cs):
            out = []
            for c in cs:
                k = cands.index(c) % 4
                out.append([Outcome.measured([1e-6]), Outcome.invalid("runtime", "segfault"),
                            Outcome.invalid("timeout"), Outcome.rejected("not in table")][k])
            return out

    res = search(s, make_strategy("exhaustive", s), Flaky(), Budget(evals=30))
    assert res.evaluations == 30
    assert res.counts["measured"] == 10 and res.counts["runtime"] == 10 and res.counts["timeout"] == 10
    assert res.counts["rejected"] == 9
    assert all(t.n == 0 for t in res.trials if t.outcome.status == "rejected")


def test_time_budget_stops_the_loop():
    s, table = bowl()
    res = search(s, make_strategy("random", s, 0), TableBackend(table, delay_s=0.01), Budget(seconds=0.2))
    assert "time budget" in res.stop_reason and 3 <= res.evaluations <= 25
