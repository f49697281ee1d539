"""The replay Target: recorded tuning spaces (Kernel Tuner caches, T4 files) measured by lookup."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..target import Lookup
from .replay import Replay, load_replay


@dataclass
class ReplayTarget(Lookup):
    """Recordings of spaces measured elsewhere (often on a GPU): each recording carries its own
    space, optimum and device, so the target itself has no device, templates or ceilings
    (``Lookup`` refuses those); ``load`` reads a recording into a ``Replay`` whose
    ``backend`` answers from it."""

    name: str = "replay"
    pin_cores: bool = False  # a lookup takes no core worth pinning
    does: str = ("measures by looking candidates up in a recorded space (a Kernel Tuner cache or a T4 file); "
                 "`planforge replay FILE` searches one")

    def describe(self) -> dict[str, Any]:
        return {"target": self.name, "measures": self.does}

    def load(self, path: str | os.PathLike, t1: str | os.PathLike | None | bool = True) -> Replay:
        """The recording at ``path`` (gzipped or not) ready to search; ``t1``: the kernel's T1 file
        (default True: the one beside the recording, if any; None or False: none). ``FormatError``
        names the file and the problem."""
        return load_replay(path, t1)


__all__ = ["ReplayTarget"]
