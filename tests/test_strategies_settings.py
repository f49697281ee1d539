"""Every strategy declares its settings; a bad one is a clear error, never a TypeError from a constructor."""
import inspect
import json

import pytest

from planforge.search import STRATEGIES, make_strategy
from planforge.search.registry import INTERNAL, settings_of
from planforge.search.settings import SettingError
from planforge.space import Space, int_range, pow2


def small():
    return Space([pow2("a", 1, 64), int_range("b", 0, 20)], ["a * b <= 400"])


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_declared_settings_match_the_constructor(name):
    cls = STRATEGIES[name]
    declared = {s.name: s for s in cls.all_settings()}
    params = {}
    for klass in cls.__mro__:  # the strategy's own keyword arguments and those of its bases (max_duplicates)
        if "__init__" in vars(klass):
            for p in list(inspect.signature(klass.__init__).parameters.values())[1:]:
                params.setdefault(p.name, p)
    taken = {n for n, p in params.items() if n not in ("space", "seed", *INTERNAL)
             and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    assert taken == set(declared), f"{name}: undeclared {taken - set(declared)}, stale {set(declared) - taken}"
    for n in taken:
        if n == "max_duplicates":
            continue  # None in the signature: the class's duplicate_limit, which the declaration gives
        d = params[n].default
        assert (d if d is None else declared[n].coerce(d, name)) == declared[n].default, (name, n)
        assert declared[n].help and declared[n].kind in ("int", "float", "bool", "str", "json")


def test_unknown_setting_lists_the_valid_ones():
    with pytest.raises(SettingError) as e:
        make_strategy("genetic", small(), 0, x=1)
    msg = str(e.value)
    assert "has no setting 'x'" in msg and "population (int, default 8)" in msg and "mutation" in msg


@pytest.mark.parametrize("name,options,needle", [
    ("genetic", {"population": "many"}, "population takes int"),
    ("genetic", {"mutation": 2}, "mutation must be in [0, 1]"),
    ("thompson", {"interactions": "perhaps"}, "interactions takes bool"),
    ("bandit", {"arms": 3}, "arms takes str"),
    ("bandit", {"arm_options": {"tpe": {}}}, "not an arm"),
    ("bandit", {"arm_options": {"genetic": {"colour": 1}}}, "'genetic' has no setting 'colour'"),
])
def test_ill_typed_settings_are_refused(name, options, needle):
    with pytest.raises(SettingError) as e:
        make_strategy(name, small(), 0, **options)
    assert needle in str(e.value)


def test_settings_given_as_strings_are_typed():
    s = make_strategy("genetic", small(), 0, population="5", mutation="0.5")
    assert (s.population, s.mutation) == (5, 0.5)
    t = make_strategy("thompson", small(), 0, interactions="false", n_init=3.0)
    assert t.interactions is False and t.n_init == 3
    b = make_strategy("bandit", small(), 0, arms=["genetic", "hillclimb"], arm_options='{"genetic": {"parents": 3}}')
    assert list(b.arms) == ["genetic", "hillclimb"] and b.arms["genetic"].parents.k == 3


def test_auto_names_the_strategy_it_chose():
    with pytest.raises(SettingError, match="auto chose bandit"):
        make_strategy("auto", small(), 0, budget=5, x=1)
    assert {s.name: s.default for s in settings_of("auto")}["c"] == 0.2


def test_cli_strategy_option_errors_and_listing(cli, tmp_path):
    r = cli("tune", "-w", "drill", "--strategy", "genetic", "--strategy-option", "x=1", "--out", tmp_path)
    assert r.returncode == 2 and "has no setting 'x'" in r.stderr and "population" in r.stderr
    assert "Traceback" not in r.stderr
    r = cli("strategies", "--json", check=True)
    doc = json.loads(r.stdout)
    assert {"auto", *STRATEGIES} == set(doc)
    assert {"name": "population", "type": "int", "default": 8, "range": "[1, inf]"}.items() <= \
        next(s for s in doc["genetic"] if s["name"] == "population").items()
    r = cli("strategies", "nope")
    assert r.returncode == 2 and "unknown strategy 'nope'" in r.stderr
