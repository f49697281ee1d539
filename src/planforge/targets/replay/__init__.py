"""The replay target: recorded tuning spaces (Kernel Tuner caches, T4 files) measured by lookup."""
from .formats import FormatError
from .replay import Replay, ReplayBackend, ReplaySpace, load_replay

__all__ = ["FormatError", "Replay", "ReplayBackend", "ReplaySpace", "load_replay"]
