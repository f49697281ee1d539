"""What each search strategy can be told: declared settings, checked before a strategy is built.

Every strategy class lists its settings (``Strategy.settings``: name, type,
default, allowed range or choices, one line of help). ``check_options``
turns what a user wrote (``--strategy-option key=value``: strings, or
numbers the command line already parsed) into typed values, and refuses an
unknown or ill-typed setting with a ``SettingError`` that lists the valid
ones, instead of the ``TypeError`` a constructor would raise deep inside a run.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


class SettingError(ValueError):
    """A strategy setting that the strategy does not have, or a value of the wrong type or range."""


@dataclass(frozen=True)
class Setting:
    """One setting of a strategy.

    ``kind`` is ``int``, ``float``, ``bool``, ``str`` or ``json`` (a mapping or
    list, given as JSON on the command line); ``low``/``high`` bound a number
    (inclusive), ``choices`` lists the allowed strings."""

    name: str
    kind: str
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None

    def range_text(self) -> str:
        if self.choices:
            return " | ".join(self.choices)
        if self.low is None and self.high is None:
            return ""
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        return f"[{lo}, {hi}]"

    def coerce(self, value: Any, strategy: str) -> Any:
        """``value`` as this setting's type, or a ``SettingError`` saying what was expected."""
        bad = SettingError(f"strategy {strategy!r}: setting {self.name} takes {self.describe_type()}, got {value!r}")
        v = value
        if self.kind == "bool":
            if isinstance(v, str):
                low = v.strip().lower()
                if low not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise bad
                v = low in ("true", "1", "yes", "on")
            elif isinstance(v, (bool, int)) and v in (0, 1):
                v = bool(v)
            else:
                raise bad
        elif self.kind == "int":
            v = _parsed(v, int, bad)
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad
        elif self.kind == "float":
            v = _parsed(v, float, bad)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                raise bad
            v = float(v)
        elif self.kind == "json":
            if isinstance(v, str):
                try:
                    v = json.loads(v)
                except json.JSONDecodeError:
                    raise bad from None
            if not isinstance(v, (dict, list, tuple)):
                raise bad
        elif self.kind == "str":
            if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
                v = "+".join(v)  # e.g. the portfolio's arms given as a list
            if not isinstance(v, str):
                raise bad
            if self.choices and v not in self.choices:
                raise bad
        if self.kind in ("int", "float") and ((self.low is not None and v < self.low)
                                              or (self.high is not None and v > self.high)):
            raise SettingError(f"strategy {strategy!r}: setting {self.name} must be in {self.range_text()}, got {v!r}")
        return v

    def describe_type(self) -> str:
        r = self.range_text()
        kind = {"json": "JSON (a mapping or a list)"}.get(self.kind, self.kind)
        return f"{kind} in {r}" if r and not self.choices else f"one of {r}" if self.choices else kind

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.kind, "default": self.default, "range": self.range_text() or None,
                "help": self.help}


def _parsed(v: Any, kind: type, bad: SettingError) -> Any:
    """A string parsed as ``kind``; anything else as it is."""
    if not isinstance(v, str):
        return v
    try:
        return kind(v)
    except ValueError:
        raise bad from None


def check_options(strategy: str, settings: Sequence[Setting], options: Mapping[str, Any],
                  internal: Sequence[str] = ()) -> dict[str, Any]:
    """``options`` typed by ``settings``; ``internal`` names keyword arguments the library itself passes
    (seed candidates, a cost model, an arm catalog), taken as they are. Raises ``SettingError`` naming
    every valid setting when one is unknown."""
    by_name = {s.name: s for s in settings}
    out: dict[str, Any] = {}
    for k, v in options.items():
        if k in internal:
            out[k] = v
            continue
        s = by_name.get(k)
        if s is None:
            valid = ", ".join(f"{x.name} ({x.kind}, default {x.default!r})" for x in settings) or "none"
            raise SettingError(f"strategy {strategy!r} has no setting {k!r}; its settings: {valid} "
                               "(`planforge strategies` lists every strategy's)")
        out[k] = s.coerce(v, strategy)
    return out
