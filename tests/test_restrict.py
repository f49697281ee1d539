import pytest

from planforge.space import Restriction, RestrictionError, Space, categorical, int_range, pow2

KNOWN = {"block_m", "block_k", "order"}


@pytest.mark.parametrize("src, env, expected", [
    ("block_m * block_k * 4 <= 32768", {"block_m": 64, "block_k": 128}, True),
    ("block_m * block_k * 4 <= 32768", {"block_m": 128, "block_k": 128}, False),
    ("block_m % 16 == 0 and not block_k < 8", {"block_m": 32, "block_k": 8}, True),
    ("block_m // 3 == 2 or block_k == 1", {"block_m": 7, "block_k": 2}, True),
    ("min(block_m, block_k) >= 16 and max(block_m, block_k) <= 64", {"block_m": 16, "block_k": 64}, True),
    ("8 <= block_m < 64", {"block_m": 64, "block_k": 1}, False),
    ("order in ('mnk', 'nmk')", {"order": "nmk"}, True),
    ("order not in ['mnk']", {"order": "mnk"}, False),
    ("block_m / block_k > 1", {"block_m": 4, "block_k": 0}, False),  # x/0 counts as violated
    ("(block_m if order == 'mnk' else block_k) == 2", {"block_m": 2, "block_k": 3, "order": "mnk"}, True),
    ("-block_m + 2 ** 3 == abs(-4)", {"block_m": 4}, True),
])
def test_restrictions_evaluate(src, env, expected):
    assert Restriction.parse(src, KNOWN)(env) is expected


@pytest.mark.parametrize("src, fragment", [
    ("__import__('os')", "call of '__import__' is not allowed"),
    ("block_m.__class__", "attribute access is not allowed"),
    ("(1).real == 1", "attribute access"),
    ("open('x')", "call of 'open'"),
    ("eval('1')", "call of 'eval'"),
    ("len(order) > 1", "call of 'len'"),
    ("min(block_m, key=abs) > 1", "keyword"),
    ("block_n > 1", "unknown name 'block_n'"),
    ("[x for x in block_m]", "ListComp is not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
    ("block_m[0] > 1", "subscripts are not allowed"),
    ("block_m +", "syntax error"),
    ("", "non-empty"),
    ("min", "can only be called"),
    ("b'x' == order", "constant of type bytes"),
])
def test_restrictions_reject_unsafe_or_unknown(src, fragment):
    with pytest.raises(RestrictionError) as e:
        Restriction.parse(src, KNOWN)
    assert fragment in str(e.value)


def test_error_names_offending_part():
    with pytest.raises(RestrictionError) as e:
        Restriction.parse("block_m > 1 and os.system('ls')", KNOWN)
    assert "os.system" in str(e.value)


def test_space_rejects_bad_restriction_with_clear_message():
    with pytest.raises(RestrictionError, match="unknown name 'tile'"):
        Space([pow2("block_m", 1, 8)], ["tile > 2"])


def test_huge_power_is_a_violation_not_a_hang():
    r = Restriction.parse("block_m ** block_k > 0", KNOWN)
    assert r({"block_m": 10, "block_k": 10**9}) is False


def test_constants_are_usable():
    s = Space([pow2("block_m", 1, 64), int_range("block_k", 1, 4), categorical("order", ["a", "b"])],
              ["block_m * block_k * 4 <= l1_bytes"], constants={"l1_bytes": 64})
    assert all(c["block_m"] * c["block_k"] * 4 <= 64 for c in s.enumerate())
