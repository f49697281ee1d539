"""Targets: where candidates run, one folder each. ``cpu`` (compiled C templates), ``replay``
(recorded spaces: Kernel Tuner caches and T4 files), ``table`` (fixed latencies, the drill).

``get_target(name)`` gives a ``Target`` (the protocol in ``target.py``): its device profile and
ceilings, its templates and the makers of its backends (``Backend``, in ``base.py``).
"""
from .base import Backend
from .registry import DEFAULT_TARGET, TARGETS, get_target
from .target import Ceilings, RunnablePlan, Target, TargetError

__all__ = ["Backend", "Ceilings", "DEFAULT_TARGET", "RunnablePlan", "TARGETS", "Target", "TargetError", "get_target"]
