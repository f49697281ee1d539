"""What the whole plan of a workload is judged by: its end-to-end latency, or a chunked control loop's frequency.

For a chunked control policy the manifest's ``objective`` says
``{"kind": "control", "chunk_steps": N, "control_hz": F}``: one call of the
model computes a chunk of N actions, which the robot executes at F Hz, and the
next chunk is computed while the current one executes (double buffering), so
the effective period of a chunk is ``max(chunk compute, N / F)`` and the
effective control frequency ``N / period``; the target holds when the chunk's
compute (its p99) fits in its execution time. (The measurement and the
task-level 95% rule are in ``planforge.endtoend``.)
"""
from __future__ import annotations

from typing import Any
from dataclasses import dataclass

SHARE_THRESHOLD = 0.05


class ObjectiveError(ValueError):
    """A malformed objective in a manifest or on the command line."""


@dataclass(frozen=True)
class Objective:
    """What the whole plan is judged by: ``latency`` (default) or ``control`` (``chunk_steps`` actions per call,
    executed at ``control_hz``); ``share_threshold``: the end-to-end share under which a task slower than its
    library may keep its tuned plan (default 0.05)."""

    kind: str = "latency"
    chunk_steps: int = 1
    control_hz: float = 0.0
    share_threshold: float = SHARE_THRESHOLD

    def __post_init__(self):
        if self.kind not in ("latency", "control"):
            raise ObjectiveError(f"objective kind {self.kind!r}: choose 'latency' or 'control'")
        if self.kind == "control" and not (self.chunk_steps >= 1 and self.control_hz > 0):
            raise ObjectiveError(f"a control objective needs chunk_steps >= 1 and control_hz > 0, got "
                                 f"chunk_steps={self.chunk_steps}, control_hz={self.control_hz}")
        if not 0 <= self.share_threshold < 1:
            raise ObjectiveError(f"share_threshold must be in [0, 1), got {self.share_threshold}")

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        if self.kind == "control":
            d.update(chunk_steps=self.chunk_steps, control_hz=self.control_hz)
        if self.share_threshold != SHARE_THRESHOLD:
            d["share_threshold"] = self.share_threshold
        return d

    @classmethod
    def parse(cls, value: "str | dict | Objective | None") -> "Objective":
        """From a manifest's dict, or a command line's ``control:chunk_steps=8,control_hz=10`` (None: latency)."""
        if value is None or isinstance(value, Objective):
            return value or cls()
        if isinstance(value, str):
            kind, _, rest = value.partition(":")
            d: dict[str, Any] = {"kind": kind.strip() or "latency"}
            for item in filter(None, (x.strip() for x in rest.split(","))):
                k, sep, v = item.partition("=")
                if not sep:
                    raise ObjectiveError(f"objective {value!r}: expected key=value after the kind, got {item!r}")
                d[k.strip()] = v.strip()
            value = d
        if not isinstance(value, dict):
            raise ObjectiveError(f"objective must be a mapping or a string, got {type(value).__name__}")
        known = {"kind", "chunk_steps", "control_hz", "share_threshold"}
        bad = sorted(set(value) - known)
        if bad:
            raise ObjectiveError(f"objective has unknown fields {bad}; known: {', '.join(sorted(known))}")
        try:
            return cls(str(value.get("kind", "latency")), int(value.get("chunk_steps", 1)),
                       float(value.get("control_hz", 0.0)), float(value.get("share_threshold", SHARE_THRESHOLD)))
        except (TypeError, ValueError) as e:
            if isinstance(e, ObjectiveError):
                raise
            raise ObjectiveError(f"objective {value!r}: {e}") from None

    def control(self, compute_s: float, compute_p99_s: float) -> dict[str, Any] | None:
        """The control figures for a chunk computed in ``compute_s`` (median; ``compute_p99_s`` its p99)."""
        if self.kind != "control":
            return None
        execute = self.chunk_steps / self.control_hz
        period = max(compute_p99_s, execute)
        return {"chunk_steps": self.chunk_steps, "control_hz": self.control_hz, "chunk_compute_s": compute_s,
                "chunk_compute_p99_s": compute_p99_s, "chunk_execute_s": execute, "effective_period_s": period,
                "effective_hz": self.chunk_steps / period, "holds": compute_p99_s <= execute,
                "headroom": execute / compute_p99_s if compute_p99_s > 0 else None}


__all__ = ["Objective", "ObjectiveError", "SHARE_THRESHOLD"]
