"""The CPU target: C templates built with the system compiler, measured in isolated, pinned worker processes.

``CpuTarget`` (``target.py``) is its ``Target``: callers outside this folder reach the probe, the
templates and the backends through it.

OpenMP's idle threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``) unless the
environment says otherwise: set here, before the first template library
loads libgomp, and inherited by the measuring workers. With the default
(spinning a while after each parallel region) a 2-core machine shared with
other work ran GPT-2's plan at 112 ms a forward against 3.4 ms passive (load
average 4.5; docs/benchmarks.md, issue 13): the spinning thread takes the
core the calling thread needs.
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .target import CpuTarget  # noqa: E402

__all__ = ["CpuTarget"]
