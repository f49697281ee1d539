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


def jumps_seen(name, jumps, asks=4):
    """Of ``asks`` proposals of ``name`` around a told point (5, 5), which has 4 one-step neighbours, how many move
    one knob by more than one step."""
    space = Space([int_range("m", 0, 9), int_range("b", 0, 9)])
    s = make_strategy(name, space, 0, jumps=jumps)
    centre = space.make({"m": 5, "b": 5})
    s.tell([(centre, ok(1e-6))])
    out = 0
    for _ in range(asks):
        (c,) = s.ask(1)
        d = [abs(c[k] - 5) for k in ("m", "b")]
        out += sorted(d) == [0, max(d)] and max(d) > 1
        s.tell([(c, ok(1e-3))])  # slower: the walk stays at the centre
    return out


def test_local_searches_jump_along_a_knob_only_with_jumps():
    """A knob numbered 0, 1, 2, ... is ordered only by its numbering: with ``jumps`` hill climbing and annealing
    also try any other value of a random knob, so they can cross a slow value between two fast ones."""
    from planforge.search.strategies import with_jumps

    space = Space([int_range("m", 0, 9), int_range("b", 0, 9)])
    c = space.make({"m": 5, "b": 5})
    import random

    near = {x.fingerprint for x in space.neighbours(c)}
    wide = with_jumps(space, c, random.Random(0), 6)
    assert near <= {x.fingerprint for x in wide} and len(wide) > len(near)
    assert len({x.fingerprint for x in wide}) == len(wide) and c.fingerprint not in {x.fingerprint for x in wide}
    for name in ("hillclimb", "annealing"):
        assert jumps_seen(name, 0) == 0
        assert jumps_seen(name, 6) >= 1
