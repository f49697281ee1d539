"""Build C sources into shared libraries, cached by content hash.

The cache key covers the source, the compiler (path and version) and the
flags, so a library is rebuilt exactly when one of them changes. A library is
compiled to a temporary name and renamed into place, so concurrent builds of
the same source (several tuning processes, several workers) never see a half
written file.
"""
from __future__ import annotations

import concurrent.futures as cf
import ctypes
import hashlib
import os
import shutil
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

BASE_FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno")


class CompilerMissing(RuntimeError):
    """No usable C compiler."""


class BuildError(RuntimeError):
    """The compiler rejected a source; ``log`` holds its message."""

    def __init__(self, msg: str, log: str = ""):
        super().__init__(msg)
        self.log = log


def cache_dir() -> Path:
    """``$PLANFORGE_CACHE`` or ``~/.cache/planforge``."""
    root = os.environ.get("PLANFORGE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "planforge")
    return Path(root)


@lru_cache(maxsize=None)
def compiler(cc: str | None = None) -> tuple[str, str]:
    """(path, version line) of ``$CC`` (default ``cc``); ``CompilerMissing`` when absent."""
    name = cc or os.environ.get("CC") or "cc"
    path = shutil.which(name)
    if path is None:
        raise CompilerMissing(f"no C compiler: {name!r} is not on PATH. Install one (Debian/Ubuntu: "
                              f"'apt-get install gcc'; Fedora: 'dnf install gcc') or set CC to a compiler's path")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompilerMissing(f"C compiler {path} does not run: {e}") from None
    return path, (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else "unknown"


@dataclass(frozen=True)
class Built:
    path: Path
    key: str
    cached: bool


def source_key(source: str, flags: Sequence[str], cc: str | None = None) -> str:
    path, version = compiler(cc)
    h = hashlib.sha256()
    for part in (source, path, version, " ".join(flags)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def build(source: str, openmp: bool = False, extra_flags: Sequence[str] = (), cc: str | None = None,
          timeout: float = 120.0) -> Built:
    """Compile ``source`` to a shared library (or reuse the cached one)."""
    flags = _flags(openmp, extra_flags)
    key = source_key(source, flags, cc)
    out_dir = cache_dir() / "build"
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / f"{key}.so"
    if lib.exists():
        if _looks_like_library(lib):
            return Built(lib, key, True)
        lib.unlink(missing_ok=True)  # a truncated or foreign file in the cache: build it again
    path, _ = compiler(cc)
    with tempfile.TemporaryDirectory(prefix="pf-build-") as tmp:
        src = Path(tmp) / f"{key}.c"
        src.write_text(source)
        # a name no other process or thread builds to (two build threads may compile the same source at once)
        tmp_lib = out_dir / f".{key}.{os.getpid()}.{threading.get_ident()}.so"
        cmd = [path, *flags, str(src), "-o", str(tmp_lib), "-lm"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BuildError(f"compiler timed out after {timeout:g} s", "") from None
        if p.returncode != 0:
            tmp_lib.unlink(missing_ok=True)
            log = (p.stderr or p.stdout).strip()
            first = next((ln for ln in log.splitlines() if "error" in ln), log.splitlines()[0] if log else "")
            raise BuildError(f"compile failed: {first}", log)
        os.replace(tmp_lib, lib)
    return Built(lib, key, False)


def artifact(path: str | os.PathLike) -> tuple[str, bytes]:
    """A built library as (its cache file name, its bytes), to ship to another node's build cache (``install``)."""
    p = Path(path)
    return p.name, p.read_bytes()


def install(name: str, data: bytes) -> Path:
    """Put a library built on another node (``artifact``) into this node's build cache under the same
    content-hash name, unless it is already there; returns its path. Written to a temporary name and renamed,
    like a build, so a reader never sees half a file."""
    if not re.fullmatch(r"[0-9a-f]{24}\.so", name):
        raise ValueError(f"not a build cache name: {name!r}")
    out_dir = cache_dir() / "build"
    lib = out_dir / name
    if lib.exists() and _looks_like_library(lib):
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{name}.{os.getpid()}.{threading.get_ident()}.part"
    tmp.write_bytes(data)
    os.replace(tmp, lib)
    return lib


def _looks_like_library(path: Path) -> bool:
    """A cached file worth loading: an ELF (Linux) or Mach-O (macOS) object of plausible size."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        return path.stat().st_size > 256 and (head == b"\x7fELF" or head in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe"))
    except OSError:
        return False


def _build_job(args) -> tuple[Built | None, str | None, str]:
    source, openmp, flags, cc = args
    try:
        return build(source, openmp, flags, cc), None, ""
    except BuildError as e:
        return None, str(e), e.log


def _flags(openmp: bool, extra: Sequence[str]) -> list[str]:
    return [*BASE_FLAGS, *(("-fopenmp",) if openmp else ()), *extra]


def build_many(jobs: Sequence[tuple[str, bool]], workers: int | None = None, extra_flags: Sequence[str] = (),
               cc: str | None = None) -> list[tuple[Built | None, str | None, str]]:
    """Build ``(source, openmp)`` pairs in parallel worker processes.

    Returns per job ``(built, error, log)``: a failed compile is a result, not
    an exception, so one bad candidate never stops the others. Identical
    sources are built once."""
    compiler(cc)  # fail early and clearly when there is no compiler
    job_keys = [source_key(src, _flags(omp, extra_flags), cc) for src, omp in jobs]
    unique: dict[str, tuple] = {}
    for k, (src, omp) in zip(job_keys, jobs):
        unique.setdefault(k, (src, omp, tuple(extra_flags), cc))
    n = min(workers or os.cpu_count() or 1, len(unique))
    if n <= 1:
        done = {k: _build_job(a) for k, a in unique.items()}
    else:
        with cf.ProcessPoolExecutor(max_workers=n) as pool:
            done = dict(zip(unique, pool.map(_build_job, unique.values())))
    return [done[k] for k in job_keys]


def load(built: Built | Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(built.path if isinstance(built, Built) else built))
