"""The CPU target: C templates built with the system compiler, measured in isolated, pinned worker processes.

``CpuTarget`` (``target.py``) is its ``Target``: callers outside this folder reach the probe, the
templates and the backends through it.
"""
from .target import CpuTarget

__all__ = ["CpuTarget"]
