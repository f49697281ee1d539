"""What changed between two specs: for reviewing a committed spec.

``diff_specs(a, b)`` compares two loaded specs field by field and returns the
changes, most important first: the manifest and target (a different workload
or machine makes every other difference moot), then per task the chosen plan,
its knobs, latency and library ratio, fallback, then everything else. Lists
(the ranked top-k, the curve, a graph plan's program) are compared as whole
values, since an element-wise diff of a re-ranked list says nothing useful.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

_MISSING = object()
_TASK_ORDER = ("selected", "plan", "fingerprint", "latency_s", "library_latency_s", "ratio_vs_baseline", "fallback",
               "rank", "baselines", "peak_bytes")
_TOP_ORDER = ("schema_version", "manifest", "target", "planforge_version", "toolchain", "tasks")
_TIMES = ("latency_s", "library_latency_s", "bound_s", "predicted_s")


@dataclass(frozen=True)
class Change:
    """``path``: dotted field path (``tasks.gemm_64x256x256_bias_relu.plan.tile_m``);
    ``kind``: added, removed or changed; ``old``/``new``: the values (None when absent)."""

    path: str
    kind: str
    old: Any = None
    new: Any = None

    def describe(self) -> str:
        if self.kind == "added":
            return f"+ {self.path} = {_short(self.new)}"
        if self.kind == "removed":
            return f"- {self.path} (was {_short(self.old)})"
        extra = ""
        leaf = self.path.rsplit(".", 1)[-1]
        if isinstance(self.old, (int, float)) and isinstance(self.new, (int, float)) and self.old and \
                not isinstance(self.old, bool) and leaf in _TIMES:
            extra = f" ({100 * (self.new / self.old - 1):+.1f}%)"
        return f"~ {self.path}: {_short(self.old)} -> {_short(self.new)}{extra}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "old": self.old, "new": self.new}


def _short(v: Any, limit: int = 120) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list) and len(repr(v)) > limit:
        return f"[{len(v)} entries]"
    text = repr(v) if not isinstance(v, str) else v
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                              and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def _ordered(keys, order) -> list[str]:
    first = [k for k in order if k in keys]
    return first + sorted(k for k in keys if k not in order)


def _walk(a: Any, b: Any, path: str, out: list[Change], order=()) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in _ordered(set(a) | set(b), order):
            p = f"{path}.{k}" if path else str(k)
            if k not in a:
                out.append(Change(p, "added", None, b[k]))
            elif k not in b:
                out.append(Change(p, "removed", a[k], None))
            else:  # a task's fields in review order; elsewhere sorted
                _walk(a[k], b[k], p, out, _TASK_ORDER if path == "tasks" else ())
        return
    if not _same(a, b):
        out.append(Change(path, "changed", a, b))


def diff_specs(a: dict[str, Any], b: dict[str, Any]) -> list[Change]:
    """The changes from spec ``a`` to spec ``b`` (both as ``load_spec`` returns them); empty when equal."""
    out: list[Change] = []
    _walk(a, b, "", out, _TOP_ORDER)
    return out
