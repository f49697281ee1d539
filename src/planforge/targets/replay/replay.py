"""Replay backend: "measuring" a configuration of a recorded space is a lookup.

A recorded space (a Kernel Tuner cache or a T4 file, see ``formats``) holds
every configuration a tuning run measured on real hardware. Replaying it lets
a search strategy be judged without the hardware: the space is exactly the
set of recorded configurations (one absent from the file was excluded by the
space's restrictions and is rejected, never measured), a recorded failure
comes back as an invalid outcome with its category, and a measured one comes
back with its raw times (seconds), so its metric is their median. Each lookup
is one evaluation, like a real measurement.
"""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ...outcome import Outcome
from ...space import Candidate, Knob, Space, SpaceError
from .formats import Config, FormatError, Recording, read_recording


class ReplaySpace(Space):
    """A space whose valid points are the configurations of a recording.

    Parameters:
        knobs: one per recorded parameter, in the recording's order.
        members: the valid points, as mixed-radix integers (see ``Space.to_int``).
        restrictions: the kernel's restriction expressions (from its T1 file),
            kept for description and for naming what a rejected point breaks;
            validity itself is membership, which already obeys them.
        source: names the recording in rejection messages.
        excluded: reasons for points the recording marks as outside the space.
    """

    def __init__(self, knobs: Sequence[Knob], members: Sequence[int], restrictions: Sequence[str] = (),
                 source: str = "the recording", excluded: Mapping[int, str] | None = None):
        super().__init__(knobs, restrictions)
        self._members = frozenset(members)
        self._valid = sorted(self._members)
        self.source = source
        self._excluded = dict(excluded or {})

    def is_valid_index(self, idx: Sequence[int]) -> bool:
        return self.to_int(idx) in self._members

    def enumerate(self) -> Iterator[Candidate]:
        for n in self._valid:
            yield self.candidate(self.from_int(n))

    def valid_ints(self, limit: int = 5_000_000) -> list[int]:
        return self._valid

    def violations(self, config: Mapping[str, Any]) -> list[str]:
        out = super().violations(config)
        if out:
            return out
        try:
            n = self.to_int(tuple(k.index(config[k.name]) for k in self.knobs))
        except (KeyError, SpaceError):
            return ["not a configuration of this space"]
        if n in self._members:
            return []
        return [self._excluded.get(n, f"not among the configurations recorded in {self.source}")]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "recorded": len(self._members), "source": self.source}


@dataclass
class ReplayBackend:
    """Returns the recorded outcome of each candidate (by fingerprint).

    ``lookups`` counts the candidates measured, i.e. the evaluations spent
    (``remeasure`` reads the recording again without counting: a recorded time
    does not change)."""

    outcomes: Mapping[str, Outcome]
    label: str
    content_hash: str
    device: str = ""
    name: str = "replay"
    fingerprint: str = field(init=False)
    lookups: int = 0
    pin_cores = False  # a lookup takes no core worth pinning

    def __post_init__(self):
        self.fingerprint = f"replay:{self.device or 'recorded'}:{self.label}:{self.content_hash[:16]}"

    def describe(self) -> dict:
        return {"backend": self.name, "fingerprint": self.fingerprint, "entries": len(self.outcomes)}

    def factory(self):
        """A picklable ``f(cpus) -> ReplayBackend`` answering from the same recording (``cpus`` is ignored)."""
        return partial(_copy_replay, dict(self.outcomes), self.label, self.content_hash, self.device)

    def builder(self) -> None:
        """None: a lookup has nothing to build."""
        return None

    def _lookup(self, candidates: Sequence[Candidate]) -> list[Outcome]:
        get = self.outcomes.get
        return [get(c.fingerprint) or Outcome.rejected(f"{c} is not recorded in {self.label}") for c in candidates]

    def measure(self, candidates: Sequence[Candidate]) -> list[Outcome]:
        self.lookups += len(candidates)
        return self._lookup(candidates)

    def measure_built(self, candidate: Candidate, lib=None) -> Outcome:
        """Without a build stage there is nothing built: the lookup itself."""
        return self.measure([candidate])[0]

    def baselines(self, libraries: Sequence[str] | None = None) -> dict[str, Outcome]:
        """{}: a recording holds no library times."""
        return {}

    def remeasure(self, candidates: Sequence[Candidate], libraries: Sequence[str] | None = None,
                  rounds: int = 3) -> tuple[list[Outcome], dict[str, Outcome]]:
        """The recorded outcomes again (a recorded time does not change between rounds); not counted as lookups."""
        return self._lookup(candidates), {}

    def program(self, candidate: Candidate) -> None:
        """None: a recording's entry is no program."""
        return None

    def work(self) -> None:
        """None: a recording holds times, not the work behind them."""
        return None

    def device_profile(self) -> None:
        """None: no device is measured."""
        return None

    def close(self) -> None:
        """Nothing to release."""


def _copy_replay(outcomes: dict, label: str, content_hash: str, device: str, cpus=None) -> ReplayBackend:
    return ReplayBackend(outcomes, label, content_hash, device)


@dataclass
class Replay:
    """A recorded space ready to search: the ``space``, the ``backend`` that
    answers from the recording, and the known ``optimum`` (seconds)."""

    recording: Recording
    space: ReplaySpace
    backend: ReplayBackend
    optimum: float
    metrics: dict[Config, float | None]  # per recorded configuration (recording order): median seconds or None

    @property
    def label(self) -> str:
        return self.recording.label

    @property
    def path(self) -> Path:
        return self.recording.path

    def counts(self) -> Counter:
        """Entries by outcome: ``measured`` and each invalid category."""
        return Counter("measured" if o.ok else o.category for o in self.recording.entries.values())

    def describe(self) -> dict[str, Any]:
        r = self.recording
        return {"file": str(r.path), "format": r.format, "t1": str(r.t1) if r.t1 else None,
                "parameters": len(r.params), "cross_product": self.space.size, "entries": len(r.entries),
                "space": len(self.space.valid_ints()), "counts": dict(sorted(self.counts().items())),
                "optimum_s": self.optimum, **{k: v for k, v in r.meta.items() if k in ("device_name", "kernel_name")}}


def _t1_notes(rec: Recording, space: Space, configs: Sequence[Config]) -> list[str]:
    """How the recording and its T1 restrictions disagree (they should not)."""
    if not rec.restrictions:
        return []
    notes = []
    names = rec.names
    bad = sum(1 for cfg in configs if space.violations(dict(zip(names, cfg))))
    if bad:
        notes.append(f"{bad} recorded configurations break the T1 restrictions of {rec.t1}")
    if space.size <= 2_000_000:
        allowed = Space(space.knobs, rec.restrictions).valid_size()
        absent = allowed - (len(configs) - bad)
        if absent > 0:
            notes.append(f"{absent} configurations allowed by the T1 restrictions are absent from the file; "
                         "they are treated as excluded by restriction")
    return notes


def build_replay(rec: Recording, content_hash: str = "") -> Replay:
    """The replay of an already-read recording."""
    knobs = []
    try:
        for p in rec.params:
            knobs.append(Knob(p.name, p.values, p.kind))
    except SpaceError as e:
        raise FormatError(f"{rec.path}: {e}") from None
    probe = Space(knobs)  # positions only; the real space needs the member list
    radix_index = [{v: i for i, v in enumerate(k.values)} for k in knobs]

    def to_int(cfg: Config) -> int:
        return probe.to_int(tuple(ix[v] for ix, v in zip(radix_index, cfg)))

    members, excluded, inside = [], {}, []
    for cfg, o in rec.entries.items():
        n = to_int(cfg)
        if o.category == "constraints":
            excluded[n] = f"recorded as outside the space (constraints) in {rec.label}"
        else:
            members.append(n)
            inside.append(cfg)
    try:
        space = ReplaySpace(knobs, members, rec.restrictions, rec.label, excluded)
    except (SpaceError, ValueError) as e:
        raise FormatError(f"{rec.path}: {e}") from None
    rec.notes.extend(_t1_notes(rec, space, inside))
    outcomes: dict[str, Outcome] = {}
    metrics: dict[Config, float | None] = {}
    for cfg, o in rec.entries.items():
        metrics[cfg] = o.metric
        if o.category != "constraints":
            outcomes[space.candidate(probe.from_int(to_int(cfg))).fingerprint] = o
    valid = [m for m in metrics.values() if m is not None]
    if not valid:
        raise FormatError(f"{rec.path}: no configuration was measured successfully, so there is no optimum to "
                          f"replay against ({dict(Counter(o.category for o in rec.entries.values()))})")
    backend = ReplayBackend(outcomes, rec.label, content_hash, str(rec.meta.get("device_name") or ""))
    return Replay(rec, space, backend, min(valid), metrics)


def load_replay(path: str | os.PathLike, t1: str | os.PathLike | None | bool = True) -> Replay:
    """Read a Kernel Tuner cache or T4 file (gzipped or not) and build its replay.

    Parameters:
        t1: the kernel's T1 file; ``True`` (default) uses the one found beside
            the recording as the benchmark hub lays it out, if any; ``None``
            or ``False`` uses none.
    Raises ``FormatError`` naming the file and the problem."""
    rec = read_recording(path, t1)
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return build_replay(rec, digest)
