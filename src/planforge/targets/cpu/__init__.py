"""The CPU target: C templates built with the system compiler, measured in isolated, pinned worker processes.

``CpuTarget`` (``target.py``) is its ``Target``: callers outside this folder reach the probe, the
templates and the backends through it.

OpenMP's and OpenBLAS's idle threads sleep at once unless the environment
says otherwise (``OMP_WAIT_POLICY``, ``OPENBLAS_THREAD_TIMEOUT``: set by
``planforge/__init__.py`` before any runtime loads, and inherited by the
measuring workers).
"""
from .target import CpuTarget

__all__ = ["CpuTarget"]
