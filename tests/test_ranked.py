import pytest

from planforge.search import Entry, NoValidFinalist, Ranked, rank_insert, walk_finalists
from planforge.space import Space, gene


@pytest.fixture
def cands():
    s = Space([gene("g", list("abcdefgh"))])
    return list(s.enumerate())


def test_rank_insert_ties_go_after_and_truncate(cands):
    entries = []
    for metric, c in zip([5, 3, 5, 1, 3, 9], cands):
        rank_insert(entries, Entry(metric, c), 4)
    assert [(e.metric, e.candidate["g"]) for e in entries] == [(1, "d"), (3, "b"), (3, "e"), (5, "a")]


def test_rank_insert_reports_position(cands):
    r = Ranked(2)
    assert r.insert(5, cands[0]) == 0
    assert r.insert(5, cands[1]) == 1
    assert r.insert(5, cands[2]) is None  # tie with the last: goes after, falls off
    assert r.insert(1, cands[3]) == 0
    assert [e.candidate["g"] for e in r] == ["d", "a"]


def test_walk_accepts_first_passing_and_is_lazy(cands):
    r = Ranked(4)
    for m, c in zip([1, 2, 3, 4], cands):
        r.insert(m, c)
    seen = []

    def only_c(c):
        seen.append(c["g"])
        return None if c["g"] == "c" else f"{c['g']} is not c"

    w = walk_finalists(r, [only_c])
    assert w.accepted.rank == 3 and w.accepted.candidate["g"] == "c"
    assert [(f.rank, f.reasons) for f in w.rejected] == [(1, ("a is not c",)), (2, ("b is not c",))]
    assert seen == ["a", "b", "c"]  # rank 4 never validated


def test_walk_all_rejected_names_every_reason(cands):
    r = Ranked(2)
    r.insert(1, cands[0])
    r.insert(2, cands[1])
    with pytest.raises(NoValidFinalist) as e:
        walk_finalists(r, [lambda c: "too slow to trust", lambda c: None])
    assert "rank 1" in str(e.value) and "rank 2" in str(e.value) and "too slow to trust" in str(e.value)
    assert len(e.value.rejected) == 2
    with pytest.raises(NoValidFinalist, match="nothing was measured"):
        walk_finalists(Ranked(2), [])
