"""Thompson's diversification once the search stalls (issue 20, fourth round): after ``stall`` results in a row
(whoever proposed them) without a new best, every proposal is taken from the whole pool and the posterior draws
spread wider, until the best improves."""
from planforge.outcome import Outcome
from planforge.search import make_strategy
from planforge.space import Space, int_range


def space3():
    return Space([int_range("a", 0, 9), int_range("b", 0, 9), int_range("c", 0, 9)])


def ok(t):
    return Outcome.measured([t])


def test_stall_counts_every_result_without_a_new_best_and_resets_on_one():
    space = space3()
    t = make_strategy("thompson", space, 0, stall=3)
    pts = [space.candidate(space.from_int(i)) for i in (0, 111, 222, 333, 444, 555)]
    t.tell([(pts[0], ok(1e-3))])
    t.tell([(pts[1], ok(2e-3)), (pts[2], Outcome.invalid("runtime"))])
    assert not t._stalled()  # two results without a new best, a failure among them
    t.tell([(pts[3], ok(3e-3))])
    assert t._stalled()
    t.tell([(pts[4], ok(0.5e-3))])  # a new best ends the stall
    assert not t._stalled()
    t.tell([(pts[5], ok(0.6e-3))])
    assert not t._stalled()
    assert not make_strategy("thompson", space, 0)._stalled()  # stall 0 (the default): never


def run_around_an_isolated_best(stall, steps=20):
    """Thompson told one isolated fast point, then asked ``steps`` times (each answer slower than it): how many
    proposals left the trust region (more than one knob from that point)."""
    space = space3()
    best = space.candidate(space.from_int(555))
    t = make_strategy("thompson", space, 1, n_init=0, top=1, radius=1, global_every=10_000, stall=stall,
                      stall_explore=10.0)
    t.tell([(best, ok(1e-6))])
    far = 0
    for _ in range(steps):
        (c,) = t.ask(1)
        far += sum(x != y for x, y in zip(c.index, best.index)) > 1
        t.tell([(c, ok(1e-3 * (1 + sum(c.index))))])
    return far


def test_a_stalled_search_leaves_the_trust_region():
    assert run_around_an_isolated_best(stall=0) == 0  # 27 neighbours: every step stays near the best
    assert run_around_an_isolated_best(stall=5) >= 5  # after 5 results without a new best it goes global
