"""Where warm starts come from: records databases, Kernel Tuner caches and T4 files (``--warm-start``),
and the records database of a run itself (what ``auto`` finds there by itself).

A source is one earlier tuning of a kernel with the same knob names on one
device at one shape (``search.warm.Source``); ``search.warm.WarmStart``
maps sources onto the space being searched. A records database holds many:
one per task and device fingerprint.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterable, Sequence

from .costmodel.learned import task_dims
from .search.warm import Source, WarmError, WarmStart
from .spec.records import Records, RecordsError
from .targets.replay.formats import FormatError, Recording, read_recording

SQLITE_MAGIC = b"SQLite format 3\x00"
NEARBY = 3  # other shapes of the same kernel that auto takes from the records, the closest first


def recording_source(rec: Recording, label: str | None = None) -> Source:
    """A recorded space (Kernel Tuner cache, T4) as a source; configurations outside its space are left out."""
    names = rec.names
    device = rec.meta.get("device_name") or ""
    rows = [(dict(zip(names, cfg)), o.metric) for cfg, o in rec.entries.items() if o.category != "constraints"]
    return Source(label or rec.label, rows, f"recorded on {device}" if device else f"recorded in {rec.path.name}")


def shape_distance(a: str, b: str) -> float:
    """How far apart two task keys' shapes are: the sum of |log2 ratio| over their dimensions (inf when the
    keys carry no comparable shape)."""
    sa, sb = task_dims(a), task_dims(b)
    if sa is None or sb is None or len(sa) != len(sb):
        return math.inf
    return sum(abs(math.log2(x / y)) for x, y in zip(sa, sb) if x > 0 and y > 0)


def records_sources(db: Records, names: Sequence[str], task: str | None = None, exclude_run: str | None = None,
                    exclude: Iterable[tuple[str, str]] = ()) -> list[Source]:
    """Every (task, device fingerprint) of ``db`` whose measurements have exactly the knobs ``names``, as a
    source each; ``task``: only tasks of its op (the key's first part); ``exclude``: (task, fingerprint)
    pairs to leave out; ``exclude_run``: a run to leave out (the one in progress)."""
    want, op = set(names), task.split("_", 1)[0] if task else None
    skip = set(exclude)
    groups: dict[tuple[str, str], list] = {}
    for r in db.records():
        if r.run_id == exclude_run or r.outcome.status == "rejected" or set(r.candidate) != want:
            continue
        if (op is not None and r.task.split("_", 1)[0] != op) or (r.task, r.target) in skip:
            continue
        groups.setdefault((r.task, r.target), []).append((r.candidate, r.outcome.metric))
    # a block that exceeds the target's extent (another shape's) is read as the target's largest (clip)
    return [Source(f"{t} on {fp}", rows, f"task {t} measured on device {fp}", clip=True)
            for (t, fp), rows in groups.items()]


def load_sources(paths: Sequence[str | os.PathLike], names: Sequence[str] | None = None,
                 task: str | None = None) -> list[Source]:
    """The sources in ``paths``: records databases (every task of ``task``'s op with the knobs ``names``),
    Kernel Tuner caches and T4 files (gzipped or not). Raises ``WarmError`` naming a file that is missing
    or cannot be read."""
    out: list[Source] = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise WarmError(f"--warm-start {path}: no such file")
        with path.open("rb") as f:
            head = f.read(16)
        try:
            if head == SQLITE_MAGIC:
                if names is None:
                    raise WarmError(f"--warm-start {path}: a records database needs the space's knob names")
                with Records(path, readonly=True) as db:
                    found = records_sources(db, names, task)
                if not found:
                    raise WarmError(f"--warm-start {path}: the records hold no measurements with this space's "
                                    f"knobs ({', '.join(names)})")
                out.extend(found)
            else:
                out.append(recording_source(read_recording(path, True)))
        except (RecordsError, FormatError) as e:
            raise WarmError(f"--warm-start {path}: {e}") from None
    return out


def auto_warm(db: Records, space, task: str, target: str, run_id: str) -> WarmStart | None:
    """What ``auto`` warm-starts from by itself: the same task measured on other device fingerprints, and
    the ``NEARBY`` closest other shapes of its op on any device; None when the records hold neither, or
    nothing of it fits ``space``."""
    sources = records_sources(db, space.names, task, exclude_run=run_id, exclude=[(task, target)])
    same = [s for s in sources if s.label.startswith(f"{task} on ")]
    other = sorted((s for s in sources if not s.label.startswith(f"{task} on ")),
                   key=lambda s: shape_distance(task, s.label.split(" on ", 1)[0]))
    picked = same + [s for s in other if shape_distance(task, s.label.split(" on ", 1)[0]) < math.inf][:NEARBY]
    if not picked:
        return None
    try:
        return WarmStart(space, picked)
    except WarmError:
        return None


__all__ = ["NEARBY", "auto_warm", "load_sources", "recording_source", "records_sources", "shape_distance"]
