"""Backends build and run candidates for a target: table (fixed latencies), replay (recorded spaces: Kernel
Tuner caches and T4 files), cpu (compiled C templates, ``backends.cpu``)."""
from .base import Backend
from .formats import FormatError
from .replay import Replay, ReplayBackend, ReplaySpace, load_replay
from .table import TableBackend

__all__ = ["Backend", "FormatError", "Replay", "ReplayBackend", "ReplaySpace", "TableBackend", "load_replay"]
