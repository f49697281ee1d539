"""Build C sources into shared libraries, cached by content hash.

The cache key covers the source, the compiler (path and version) and the
flags, so a library is rebuilt exactly when one of them changes. A library is
compiled to a temporary name and renamed into place, so concurrent builds of
the same source (several tuning processes, several workers) never see a half
written file.

``PLANFORGE_ISA`` (or the ``isa`` argument of ``build``/``build_many``) picks
the instruction set the code is compiled for: ``native`` (the default: all
that ``-march=native`` enables), ``avx2`` (``-march=native`` with AVX-512,
AMX and AVX-VNNI turned off, so that no AVX-512 or VNNI instruction is ever
emitted: what an AVX2-only CPU such as Zen 3 runs) or ``avx512`` (native, checked to have
AVX-512). An ISA the CPU lacks is an ``IsaError``, never a silent fallback.
The flags are part of the cache key, so the views never share a library.
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


# The ISA views PLANFORGE_ISA may name.
ISAS = ("native", "avx2", "avx512")

# Turned off for the avx2 view. -mno-avx512f alone disables the AVX-512 family in GCC and clang, but
# naming each sub-feature keeps that true whatever a compiler version chains; AVX10 implies AVX-512
# (Granite Rapids), and AMX exists only on AVX-512 parts. AVX-VNNI and its kin are AVX2-encoded but newer
# than Zen 3, which the view stands for. Flags the compiler does not know are dropped.
_NOT_AVX2 = ("-mno-avx512f", "-mno-avx512cd", "-mno-avx512bw", "-mno-avx512dq", "-mno-avx512vl",
             "-mno-avx512ifma", "-mno-avx512vbmi", "-mno-avx512vbmi2", "-mno-avx512vnni", "-mno-avx512bitalg",
             "-mno-avx512vpopcntdq", "-mno-avx512bf16", "-mno-avx512fp16", "-mno-avx512vp2intersect",
             "-mno-avx512er", "-mno-avx512pf", "-mno-avx5124fmaps", "-mno-avx5124vnniw", "-mno-avx10.1",
             "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16", "-mno-amx-fp16", "-mno-amx-complex",
             # the VEX-encoded extensions later than AVX2 (Alder Lake, Sapphire Rapids, Zen 5), which Zen 3 lacks
             "-mno-avxvnni", "-mno-avxifma", "-mno-avxvnniint8", "-mno-avxneconvert", "-mno-avxvnniint16")


class IsaError(ValueError):
    """``PLANFORGE_ISA`` names an unknown ISA, or one this CPU (as the compiler sees it) lacks."""


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


def isa_choice(isa: str | None = None) -> str:
    """The ISA view to compile for and to probe: ``isa`` when given, else ``$PLANFORGE_ISA``, else
    ``"native"`` (an empty variable counts as unset). ``IsaError`` when it is not one of ``ISAS``."""
    raw = isa if isa is not None else os.environ.get("PLANFORGE_ISA", "")
    choice = raw.strip().lower() or "native"
    if choice not in ISAS:
        src = "isa" if isa is not None else "PLANFORGE_ISA"
        raise IsaError(f"{src}={raw!r} is not an ISA planforge can force: use one of {', '.join(ISAS)}")
    return choice


def isa_flags(isa: str | None = None, cc: str | None = None) -> tuple[str, ...]:
    """Compiler flags (added after ``-march=native``) for the ISA view ``isa`` (default: ``isa_choice()``).

    ``native``: none, and no compiler is run. ``avx2``: the AVX-512/AMX-off flags the compiler accepts,
    checked by preprocessing: the result defines ``__AVX2__`` and ``__FMA__`` and no ``__AVX512*``,
    ``__AVX10*`` or ``__AMX*`` macro. ``avx512``: none, checked to define ``__AVX512F__``.
    ``IsaError`` when the CPU lacks the ISA or the compiler cannot turn AVX-512 off."""
    choice = isa_choice(isa)
    if choice == "native":
        return ()
    return _isa_flags(choice, compiler(cc)[0])


def _macros(cc: str, flags: Sequence[str]) -> set[str] | None:
    """The macros ``cc -march=native FLAGS`` predefines; None when the compiler refuses the flags."""
    try:
        p = subprocess.run([cc, "-march=native", *flags, "-dM", "-E", "-x", "c", os.devnull],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    return {ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("#define ") and len(ln.split()) > 1}


@lru_cache(maxsize=None)
def _isa_flags(choice: str, cc: str) -> tuple[str, ...]:
    native = _macros(cc, ())
    if native is None:
        raise IsaError(f"PLANFORGE_ISA={choice}: the C compiler {cc} does not accept -march=native")
    if choice == "avx512":
        if "__AVX512F__" not in native:
            raise IsaError("PLANFORGE_ISA=avx512, but this CPU has no AVX-512 (the compiler's -march=native "
                           "does not define __AVX512F__); use avx2 or leave PLANFORGE_ISA unset")
        return ()
    if not {"__AVX2__", "__FMA__"} <= native:
        raise IsaError("PLANFORGE_ISA=avx2, but this CPU has no AVX2 and FMA (the compiler's -march=native "
                       "does not define __AVX2__ and __FMA__); leave PLANFORGE_ISA unset")
    flags = _NOT_AVX2
    got = _macros(cc, flags)
    if got is None:  # some flag unknown to this compiler version: keep the ones it accepts
        flags = tuple(f for f in _NOT_AVX2 if _macros(cc, (f,)) is not None)
        got = _macros(cc, flags)
    left = sorted(m for m in got or () if m.startswith(("__AVX512", "__AVX10", "__AMX", "__AVXVNNI")))
    if got is None or left or not {"__AVX2__", "__FMA__"} <= got:
        raise IsaError(f"PLANFORGE_ISA=avx2: the C compiler {cc} cannot turn AVX-512 off while keeping AVX2 "
                       f"(with {' '.join(flags)} it still defines {', '.join(left) or 'no __AVX2__/__FMA__'})")
    return flags


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
          timeout: float = 120.0, isa: str | None = None) -> Built:
    """Compile ``source`` to a shared library (or reuse the cached one).

    Parameters:
        openmp: add ``-fopenmp`` (default False).
        extra_flags: more compiler flags, after the base and ISA ones (default none).
        cc: the compiler (default ``$CC``, else ``cc``).
        timeout: seconds the compiler may take (default 120) before a ``BuildError``.
        isa: the ISA view (see ``isa_choice``; default ``$PLANFORGE_ISA``, else native).
    """
    flags = _flags(openmp, extra_flags, isa, cc)
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
    source, openmp, flags, cc, isa = args
    try:
        return build(source, openmp, flags, cc, isa=isa), None, ""
    except BuildError as e:
        return None, str(e), e.log


def _flags(openmp: bool, extra: Sequence[str], isa: str | None = None, cc: str | None = None) -> list[str]:
    # the ISA flags follow -march=native (in BASE_FLAGS): the last -m flag for a feature wins
    return [*BASE_FLAGS, *isa_flags(isa, cc), *(("-fopenmp",) if openmp else ()), *extra]


def build_many(jobs: Sequence[tuple[str, bool]], workers: int | None = None, extra_flags: Sequence[str] = (),
               cc: str | None = None, isa: str | None = None) -> list[tuple[Built | None, str | None, str]]:
    """Build ``(source, openmp)`` pairs in parallel, one compiler process per worker thread.

    Returns per job ``(built, error, log)``: a failed compile is a result, not
    an exception, so one bad candidate never stops the others. Identical
    sources are built once. ``workers``: threads (default: one per CPU);
    ``extra_flags``, ``cc``, ``isa``: as for ``build``. Threads, not forked
    processes: the work is the compiler's, in its own process, and a fork of
    the tuner would inherit its state (an egglog e-graph that the child's
    garbage collector frees waits forever for egglog's thread pool, which a
    fork does not copy: a build that never returned)."""
    compiler(cc)  # fail early and clearly when there is no compiler
    isa = isa_choice(isa)  # resolved here, so the workers build for the view this process has
    job_keys = [source_key(src, _flags(omp, extra_flags, isa, cc), cc) for src, omp in jobs]
    unique: dict[str, tuple] = {}
    for k, (src, omp) in zip(job_keys, jobs):
        unique.setdefault(k, (src, omp, tuple(extra_flags), cc, isa))
    n = min(workers or os.cpu_count() or 1, len(unique))
    if n <= 1:
        done = {k: _build_job(a) for k, a in unique.items()}
    else:
        with cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="planforge-build") as pool:
            done = dict(zip(unique, pool.map(_build_job, unique.values())))
    return [done[k] for k in job_keys]


def load(built: Built | Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(built.path if isinstance(built, Built) else built))
