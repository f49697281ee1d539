"""Targets: where candidates run. ``cpu`` (compiled C templates), ``replay`` (recorded spaces: Kernel Tuner
caches and T4 files), ``table`` (fixed latencies, the drill). Each is one folder."""
from .base import Backend

__all__ = ["Backend"]
