"""The registry of targets: a name, and where its ``Target`` class lives.

Adding a target is one folder of ``targets/`` and one line of ``TARGETS``.
Entries are imported on first use, so naming a target costs nothing until it
is asked for, and the CPU's probe and compiler are never touched by a run
that measures a table.
"""
from __future__ import annotations

from importlib import import_module

from .target import Target, TargetError

# name -> "module:class" (relative to this package); the class takes no arguments
TARGETS: dict[str, str] = {
    "cpu": ".cpu.target:CpuTarget",
    "cuda": ".cuda.target:CudaTarget",
    "replay": ".replay.target:ReplayTarget",
    "table": ".table.target:TableTarget",
}
DEFAULT_TARGET = "cpu"


def get_target(target: str | Target | None = None) -> Target:
    """The target named ``target`` (default None: ``DEFAULT_TARGET``, the CPU), or ``target`` itself
    when it is already a Target. An unknown name is a ``TargetError`` listing the known ones.

    Each call makes a fresh object: a target reads its device profile once, on first use."""
    if target is None:
        target = DEFAULT_TARGET
    if not isinstance(target, str):
        return target
    where = TARGETS.get(target)
    if where is None:
        raise TargetError(f"target {target!r} is not available; known targets: {', '.join(TARGETS)}")
    module, _, cls = where.partition(":")
    return getattr(import_module(module, __package__), cls)()


__all__ = ["DEFAULT_TARGET", "TARGETS", "get_target"]
