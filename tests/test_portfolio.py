"""Scoring helpers, the AUC bandit's credit assignment and the search portfolio."""
import math
import random

import pytest

from planforge.targets.table import TableBackend
from planforge.search import STRATEGIES, Budget, make_strategy, search
from planforge.search.portfolio import AUCBandit, Portfolio
from planforge.search.scoring import best_so_far, evals_to_within, score
from planforge.search.strategies import Strategy
from planforge.space import Space, int_range


def test_evals_to_within_and_scores():
    assert evals_to_within([None, 3.0, 1.06, 1.04], 1.0) == 4
    assert evals_to_within([2.0, 1.05], 1.0) == 2  # exactly 5% counts
    assert evals_to_within([2.0, None], 1.0) is None
    s = score([[1.0], [2.0, 1.5, 1.0], [3.0, 2.0]], optimum=1.0, budget=3)
    assert s.evals == [1, 3, 4]  # the run that never got there counts budget + 1
    assert s.median == 3 and s.success_rate == pytest.approx(2 / 3)
    assert s.p90 == pytest.approx(3.8)
    # the curve carries a run's last best to the end; NaN only before any valid measurement
    assert list(best_so_far([None, 2.0, 3.0], 5)[1:]) == [2.0, 2.0, 2.0, 2.0]
    assert math.isnan(best_so_far([None, 2.0], 3)[0])
    assert list(s.curve) == pytest.approx([(1 + 2 + 3) / 3, (1 + 1.5 + 2) / 3, (1 + 1 + 2) / 3])


def auc_slow(history, key):
    """OpenTuner's definition, computed from scratch over the window."""
    pos = score_ = 0
    for k, hit in history:
        if k == key:
            pos += 1
            score_ += pos if hit else 0
    return score_ * 2.0 / (pos * (pos + 1.0)) if pos else 0.0


def test_auc_bandit_matches_its_definition_over_a_sliding_window():
    rng = random.Random(0)
    b = AUCBandit(["a", "b", "c"], c=0.05, window=20)
    for _ in range(300):
        key = rng.choice("abc")
        b.credit(key, rng.random() < {"a": 0.6, "b": 0.2, "c": 0.0}[key])
        assert len(b.history) <= 20
        for k in "abc":
            assert b.exploitation(k) == pytest.approx(auc_slow(b.history, k))
            assert b.uses[k] == sum(1 for x, _ in b.history if x == k)


def test_bandit_credit_favours_recent_improvement():
    b = AUCBandit(["old", "new"], c=0.0, window=100)
    for i in range(10):
        b.credit("old", i < 3)  # improved early, then stopped improving
        b.credit("new", i >= 7)  # improves now
    assert b.exploitation("new") > b.exploitation("old")
    assert b.order(random.Random(1))[0] == "new"
    unused = AUCBandit(["x", "y"])
    unused.credit("x", True)
    assert unused.score("y") == math.inf  # an arm never tried is tried next


class Descender(Strategy):
    """Walks the fast half of the line towards the fastest point: every proposal is a new best."""

    name = "descender"

    def __init__(self, space, seed=0, **kw):
        super().__init__(space, seed, **kw)
        self.order = sorted((c for c in space.enumerate() if c["x"] >= 200), key=lambda c: c["x"])

    def ask(self, n=1):
        out = []
        while len(out) < n and self.order and not self.done:
            self._offer(self.order.pop(0), out)
        if not self.order:
            self._stop("line walked")
        return out


class Climber(Descender):
    """Walks the slow half of the line away from the fast one: never a new best after its first step."""

    name = "climber"

    def __init__(self, space, seed=0, **kw):
        super().__init__(space, seed, **kw)
        self.order = sorted((c for c in space.enumerate() if c["x"] < 200), key=lambda c: -c["x"])


def test_portfolio_gives_its_proposals_to_the_arm_that_improves(monkeypatch):
    monkeypatch.setitem(STRATEGIES, "descender", Descender)
    monkeypatch.setitem(STRATEGIES, "climber", Climber)
    space = Space([int_range("x", 0, 399)])
    table = {c.fingerprint: 1e-6 * (1 + (399 - c["x"]) / 10) for c in space.enumerate()}  # fastest at x = 399
    # the descender improves at every step; the climber walks away from the fast end
    p = make_strategy("bandit", space, 0, arms=["climber", "descender"], c=0.05, window=500)
    search(space, p, TableBackend(table), Budget(evals=120))
    assert p.uses["descender"] > 5 * p.uses["climber"], p.uses
    assert p.bandit.exploitation("descender") > p.bandit.exploitation("climber")


def test_portfolio_arms_share_results_and_duplicates_are_not_paid_twice():
    space = Space([int_range("a", 0, 9), int_range("b", 0, 9)])
    table = {c.fingerprint: 1e-6 * (1 + (c["a"] - 3) ** 2 + (c["b"] - 7) ** 2) for c in space.enumerate()}
    p = Portfolio(space, 4)
    res = search(space, p, TableBackend(table), Budget(evals=100))
    fps = [t.candidate.fingerprint for t in res.trials]
    assert len(fps) == len(set(fps)) == res.evaluations
    assert res.ranked.best.metric == min(table.values())
    for arm in p.arms.values():  # every arm saw every result
        assert set(p.results) <= arm.proposed
    assert sum(p.uses.values()) >= res.evaluations
    assert p.describe()["arms"] == ["genetic", "annealing", "hillclimb"]


def test_portfolio_rejects_bad_arms():
    space = Space([int_range("a", 0, 3)])
    for arms, msg in [(["nope"], "unknown or unusable: nope"), ([], "at least one arm"),
                      (["genetic", "genetic"], "arms repeat"), (["bandit"], "unusable: bandit")]:
        with pytest.raises(ValueError, match=msg):
            Portfolio(space, 0, arms=arms)


def test_thompson_bins_large_knobs_and_samples_spaces_too_large_to_enumerate():
    space = Space([int_range("a", 0, 999), int_range("b", 0, 999), int_range("c", 0, 9)], ["(a + b) % 7 != 0"])
    table = {}

    class Bowl:
        name, fingerprint = "bowl", "bowl"

        def measure(self, cands):
            from planforge.outcome import Outcome

            return [Outcome.measured([1e-6 * (1 + ((c["a"] - 600) / 100) ** 2 + ((c["b"] - 200) / 100) ** 2
                                              + (c["c"] - 4) ** 2)]) for c in cands]

    t = make_strategy("thompson", space, 0, n_init=8, pool=512)  # 10M points: sampled, not enumerated
    assert t.n_features <= 1000 and max(t._levels) < 1000  # 1000-value knobs are binned
    res = search(space, t, Bowl(), Budget(evals=40))
    fps = [x.candidate.fingerprint for x in res.trials]
    assert res.evaluations == 40 and len(set(fps)) == 40 and not table
    assert res.ranked.best.metric < 3.0e-6  # well inside the bowl (a random point averages ~ 25e-6)


def test_thompson_value_features_see_alignment_and_trust_region_stays_near_the_best():
    from planforge.outcome import Outcome
    from planforge.space import categorical

    space = Space([categorical("bx", [16, 32, 48, 64, 80, 96, 112, 128]), categorical("ty", [1, 2, 4, 8]),
                   categorical("mode", ["a", "b"])])
    t = make_strategy("thompson", space, 3, n_init=6, global_every=4, top=1, radius=1)
    knob_of = [i for i, _ in t._value_tables]
    assert knob_of == [0, 0, 1]  # bx: log2 and alignment; ty: log2 only (its alignment is log2 again); mode: none
    align = t._value_tables[1][1]
    assert align[7] == 0.5 and align[6] == -0.5  # 128 is aligned to 2^7, 112 only to 2^4

    def time_of(c):  # aligned blocks are fast; 128 with ty = 8 and mode b is best
        return 1e-6 * (1 + 2.0 * ((c["bx"] & -c["bx"]) < 32) + abs(c["ty"] - 8) / 4 + (c["mode"] == "a")
                       + 0.5 * (c["bx"] != 128))

    table = {c.fingerprint: time_of(c) for c in space.enumerate()}
    seen: list = []
    for step in range(30):
        (c,) = t.ask(1)
        if step >= 6 and (step - 5) % 4:  # a trust-region step: one knob from the best, while any is left
            best = min(seen, key=lambda x: table[x.fingerprint])
            near = {x.fingerprint for x in space.neighbours(best)} - {x.fingerprint for x in seen}
            assert c.fingerprint in near or not near
        seen.append(c)
        t.tell([(c, Outcome.measured([table[c.fingerprint]]))])
    assert min(table[c.fingerprint] for c in seen) == min(table.values())
    assert len({c.fingerprint for c in seen}) == 30


def test_thompson_rejects_an_empty_trust_region_setting():
    space = Space([int_range("a", 0, 9)])
    for bad in ({"global_every": 0}, {"top": 0}, {"radius": 0}):
        with pytest.raises(ValueError, match=r"setting \w+ must be in \[1, inf\], got 0"):  # checked by its settings
            make_strategy("thompson", space, 0, **bad)


def test_auto_portfolio_sets_thompson_global_step_only_where_it_runs():
    """auto's bandit runs thompson with its global step every 6th proposal (issue 20, chosen leave one family out
    on fresh seeds); a user's arms without thompson get no stray thompson setting, and a user's own arm_options
    replace auto's."""
    from planforge.search.registry import AUTO_PORTFOLIO

    space = Space([int_range("a", 0, 40), int_range("b", 0, 40)])
    auto = make_strategy("auto", space, budget=10)
    assert auto.arms["thompson"].global_every == AUTO_PORTFOLIO["arm_options"]["thompson"]["global_every"] == 6
    assert make_strategy("auto", space, budget=10, arms="genetic+annealing").name == "bandit"
    own = make_strategy("auto", space, budget=10, arm_options={"thompson": {"global_every": 2}})
    assert own.arms["thompson"].global_every == 2
