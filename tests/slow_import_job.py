"""Jobs for tests/test_worker.py, in a module that takes a while to import
(as numpy and a kernel's job module do on a busy machine)."""
import time

time.sleep(1.5)


def answer() -> int:
    return 42


def hang() -> None:
    time.sleep(60)


def segfault() -> None:
    import ctypes

    ctypes.string_at(0)
