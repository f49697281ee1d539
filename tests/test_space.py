import random
import subprocess
import sys
from collections import Counter

import pytest

from planforge.space import Space, SpaceError, categorical, fingerprint_of, gene, int_range, pow2


def small_space():
    return Space([gene("impl", ["a", "b", "c"]), pow2("bm", 1, 64), int_range("bk", 1, 10, 3),
                  categorical("order", ["mk", "km"])],
                 ["bm * bk * 4 <= 64", "impl != 'c' or bm >= 8", "order == 'mk' or bk > 1"])


def brute(space):
    return [space.candidate(space.from_int(n)) for n in range(space.size) if space.is_valid_index(space.from_int(n))]


def test_knob_values():
    assert pow2("x", 4, 64).values == (4, 8, 16, 32, 64)
    assert int_range("x", 1, 10, 3).values == (1, 4, 7, 10)
    with pytest.raises(SpaceError):
        pow2("x", 3, 8)
    with pytest.raises(SpaceError):
        categorical("x", [])
    with pytest.raises(SpaceError):
        categorical("x", ["a", "a"])
    with pytest.raises(SpaceError):
        Space([pow2("x", 1, 2), pow2("x", 1, 4)])


def test_size_and_lazy_enumeration_match_brute_force():
    s = small_space()
    assert s.size == 3 * 7 * 4 * 2
    listed = list(s.enumerate())
    assert [c.fingerprint for c in listed] == [c.fingerprint for c in brute(s)]
    assert s.valid_size() == len(listed) > 0
    it = s.enumerate()
    assert next(it).index == listed[0].index  # lazy: a generator


def test_sample_is_uniform_over_valid_points():
    s = small_space()
    rng = random.Random(1)
    n = s.valid_size()
    counts = Counter(s.sample(rng).fingerprint for _ in range(n * 400))
    assert len(counts) == n
    from scipy import stats
    assert stats.chisquare(list(counts.values())).pvalue > 1e-4


def test_sample_falls_back_when_rejection_fails():
    s = Space([int_range("a", 0, 999), int_range("b", 0, 999)], ["a == 3 and b == 7"])
    c = s.sample(random.Random(0))
    assert c.as_dict() == {"a": 3, "b": 7}
    empty = Space([int_range("a", 0, 3)], ["a > 10"])
    with pytest.raises(SpaceError, match="no valid point"):
        empty.sample(random.Random(0))


def test_mutate_and_neighbours_stay_valid():
    s = small_space()
    rng = random.Random(2)
    for c in s.enumerate():
        m = s.mutate(c, rng)
        if m is not None:
            assert s.is_valid(m) and m.fingerprint != c.fingerprint
            assert sum(a != b for a, b in zip(m.index, c.index)) == 1
        for nb in s.neighbours(c):
            assert s.is_valid(nb)
            diff = [i for i, (a, b) in enumerate(zip(nb.index, c.index)) if a != b]
            assert len(diff) == 1
            k = s.knobs[diff[0]]
            if k.ordered:
                assert abs(nb.index[diff[0]] - c.index[diff[0]]) == 1


def test_fingerprint_is_stable_across_processes():
    s = small_space()
    c = s.make({"impl": "b", "bm": 4, "bk": 4, "order": "km"})
    code = ("from planforge.space import *; s=Space([gene('impl',['a','b','c']),pow2('bm',1,64),"
            "int_range('bk',1,10,3),categorical('order',['mk','km'])]);"
            "print(s.make({'impl':'b','bm':4,'bk':4,'order':'km'}).fingerprint)")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == c.fingerprint == fingerprint_of({"impl": "b", "bm": 4, "bk": 4, "order": "km"})


def test_canon_merges_equivalent_points():
    # two genomes that extract the same program share a fingerprint
    s = Space([gene("x", ["a", "b"]), gene("y", ["p", "q"])], canon=lambda d: d["x"])
    fps = {c.fingerprint for c in s.enumerate()}
    assert len(fps) == 2


def test_make_rejects_unknown_values():
    s = small_space()
    with pytest.raises(SpaceError, match="not a value"):
        s.make({"impl": "z", "bm": 4, "bk": 4, "order": "km"})
    with pytest.raises(SpaceError, match="missing"):
        s.make({"impl": "a"})


def test_nearest_valid_snaps_a_default_that_breaks_the_rules():
    from planforge.space import Space, categorical

    sp = Space([categorical("vec", (4, 8, 16)), categorical("jb", (1, 2, 4, 8))], ["jb * vec <= max(vec, n)"],
               constants={"n": 16})
    assert sp.nearest_valid({"vec": 16, "jb": 1}).as_dict() == {"vec": 16, "jb": 1}   # valid: itself
    snapped = sp.nearest_valid({"vec": 16, "jb": 4})                                   # 64 > 16: one knob moves
    assert sp.is_valid(snapped) and sum(a != b for a, b in zip(snapped.index, (2, 2))) == 1
    tight = Space([categorical("a", (1, 2, 3)), categorical("b", (1, 2, 3))], ["a + b <= 2"])
    assert tight.nearest_valid({"a": 3, "b": 3}, max_changes=1) is None               # needs both to move
    assert tight.nearest_valid({"a": 3, "b": 3}).as_dict() == {"a": 1, "b": 1}
    # knobs named in keep never move: vec=16 stays, so jb must fall to 1
    assert sp.nearest_valid({"vec": 16, "jb": 4}, keep=("vec",)).as_dict() == {"vec": 16, "jb": 1}
    assert sp.nearest_valid({"vec": 16, "jb": 4}, keep=("vec", "jb")) is None
    with pytest.raises(KeyError, match="nope"):
        sp.nearest_valid({"vec": 16, "jb": 4}, keep=("nope",))


def test_sampling_a_space_too_large_to_enumerate_whose_rules_reject_nearly_every_draw():
    # 10^8 points, one in 10^4 valid: rejection sampling's 256 draws almost always miss, and the space is past the
    # enumeration limit (a GEMM's space on 4 cores was, and tuning crashed with "too large to enumerate")
    sp = Space([int_range(n, 0, 9) for n in "abcdefgh"], ["a == 3 and b == 7", "c + d == 1", "h != 0"])
    assert sp.size > 5_000_000
    rng = random.Random(0)
    got = [sp.sample(rng) for _ in range(40)]
    assert all(sp.is_valid(c) and c["a"] == 3 and c["b"] == 7 and c["c"] + c["d"] == 1 for c in got)
    assert len({c.fingerprint for c in got}) > 30  # random, not one point again and again
    again = random.Random(0)
    assert [c.fingerprint for c in got] == [sp.sample(again).fingerprint for _ in range(40)]  # seeded
    empty = Space([int_range(n, 0, 9) for n in "abcdefgh"], ["a + b > 30"])
    with pytest.raises(SpaceError, match="no valid point"):
        empty.sample(random.Random(0))
