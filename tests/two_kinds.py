"""A fake heterogeneous cluster: a table backend whose copies are two kinds of machine.

Each copy made by ``factory()`` (one per executor slot, in a thread or a Ray
actor) claims the first free of two kind locks in ``lock_dir``, held while
it lives: the first slot is kind 0, the second kind 1. Kind 0 measures the
drill's table; kind 1 the same table with the library matmul (cublaslt) 10x
slower, so the best valid plans of the two kinds differ and a search that
mixed their times would pick the wrong plan for one of them.
"""
from __future__ import annotations

import fcntl
import os
from functools import partial
from pathlib import Path

from planforge.targets.table.table import TableBackend
from planforge.workloads import Workload, load_workload


def kind_table(table: dict, kind: int) -> dict:
    if kind == 0:
        return dict(table)
    space = load_workload("drill").tasks[0].space
    slow = {c.fingerprint for c in space.enumerate() if c["matmul"] == "cublaslt"}
    return {fp: t * 10 if fp in slow else t for fp, t in table.items()}


class TwoKinds(TableBackend):
    """The drill table measured as machine kind ``kind``; copies claim their kind from ``lock_dir``."""

    lock_dir: str = ""
    kind: int = 0
    _fd: int | None = None

    def factory(self):
        return partial(_claim_kind, dict(self.table), self.lock_dir, self.delay_s)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _claim_kind(base: dict, lock_dir: str, delay_s: float, cpus=None) -> TwoKinds:
    Path(lock_dir).mkdir(parents=True, exist_ok=True)
    for kind in (0, 1):
        fd = os.open(Path(lock_dir) / f"kind-{kind}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        be = _kind(base, kind, lock_dir, delay_s)
        be._fd = fd
        return be
    raise RuntimeError(f"both machine kinds of {lock_dir} are taken: only two slots fit this fake cluster")


def _kind(base: dict, kind: int, lock_dir: str, delay_s: float) -> TwoKinds:
    be = TwoKinds(kind_table(base, kind), label=f"kind{kind}", delay_s=delay_s)
    be.lock_dir, be.kind = lock_dir, kind
    return be


def two_kinds_drill(lock_dir, delay_s: float = 0.0) -> Workload:
    """The drill workload measured on the fake two-kind cluster; the driver is kind 0."""
    wl = load_workload("drill")
    task = wl.tasks[0]
    task.backend = _kind(task.backend.table, 0, str(lock_dir), delay_s)
    return wl
