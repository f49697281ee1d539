"""Device probe: what this machine is, and what it can do, measured.

``get_profile()`` returns the DeviceProfile of the machine it runs on: facts
read from the OS (CPU model, ISA flags, cores, cache sizes, memory) and
ceilings measured by small C kernels built with ``targets.cpu.build`` (peak fp32
FLOP/s, read and copy bandwidth per memory level, the cost of one call into a
compiled kernel). Roofline ceilings elsewhere in planforge come from here,
never from constants.

A profile is cached as JSON under ``cache_dir()/profiles/<fingerprint>.json``.
The fingerprint hashes the hardware identity only (not the hostname, not the
measured numbers), so the same machine finds its profile again and a different
one never borrows it. Measuring takes 10-30 s (``quick``: about a second, for
tests); a corrupt or outdated cache file is measured again, with a warning.

Other processes loading the CPUs while the probe runs make its figures low.
``measure()`` records how much of the machine they used (``other_load``, from
/proc/stat on Linux) and warns above ``BUSY_LOAD``; ``get_profile()`` measures
a cached profile taken that busy again once a short sample finds the machine
quiet (under ``QUIET_LOAD``), and otherwise uses it with a warning.

``PLANFORGE_ISA`` forces the view of the ISA (``hardware(isa=...)`` does the
same for one call): ``avx2`` makes an AVX-512 machine look and compile like an
AVX2-only one (no ``avx512*``, ``amx*`` or ``avx_vnni`` flags, 8 fp32 lanes, so 16 vector
registers in the templates' limits; every C build gets AVX-512 turned off, see
``build.isa_flags``), ``avx512`` insists on AVX-512, ``native`` (the default)
takes the machine as it is. A forced view has a fingerprint of its own
(``isa_view`` is hashed in), so it never shares a cached profile or recorded
times with the native one; naming an ISA this CPU lacks is an ``IsaError``.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from .build import ISAS, BuildError, IsaError, build, cache_dir, compiler, isa_choice, load
from ...space import fingerprint_of

# 2: bandwidth has a "read4" kind (four streams per thread), which the cost model reads for kernels that keep
# several streams in flight; a version 1 profile is measured again
PROBE_VERSION = 2

# ISA flags worth knowing for kernel choice (names as /proc/cpuinfo spells them).
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "neon", "asimd", "asimdhp", "asimddp", "sve")

LEVELS = ("L1", "L2", "L3", "DRAM")  # bandwidth levels; L1..L3 measure the caches named L1d, L2, L3
BW_KINDS = ("read", "copy", "read4")  # pf_bw's kinds 0, 1, 2
_CACHE_OF = {"L1": "L1d", "L2": "L2", "L3": "L3"}

# Share of all CPUs' time that other processes may use while the probe measures
# before its figures count as possibly low (a warning; a cached profile measured
# busier is measured again once the machine is quiet).
BUSY_LOAD = 0.25
# ... and what a short sample must stay under for the machine to count as quiet
# enough to measure such a profile again; QUIET_SAMPLE_S is that sample's length.
QUIET_LOAD = 0.10
QUIET_SAMPLE_S = 0.3


class ProbeError(RuntimeError):
    """The probe could not measure (no memory for its buffers, a kernel that misbehaved)."""


class ProfileError(ValueError):
    """A stored profile that cannot be used: malformed, or from another probe version."""


@dataclass(frozen=True)
class CacheLevel:
    """One cache level as the first CPU of this process sees it.

    bytes: size of one instance. shared_by: logical CPUs sharing an instance
    (1: private per core, without SMT). instances: distinct instances among
    the CPUs this process may run on (total capacity = bytes * instances).
    """

    bytes: int
    shared_by: int
    instances: int


@dataclass(frozen=True)
class Hardware:
    """Facts read from the OS; ``notes`` says what could not be read."""

    arch: str
    cpu_model: str
    isa: tuple[str, ...]
    vector_lanes_fp32: int
    logical_cores: int
    physical_cores: int
    caches: dict[str, CacheLevel]
    memory_bytes: int | None
    nominal_clock_hz: float | None
    notes: tuple[str, ...] = ()
    isa_view: str = "native"  # "native", or the ISA that PLANFORGE_ISA forced (``isa`` is then that view's)

    @property
    def fingerprint(self) -> str:
        """Hash of the hardware identity (and of a forced ISA view); the clock (it drifts) and the notes
        are left out."""
        ident = {
            "arch": self.arch, "cpu_model": self.cpu_model, "isa": sorted(self.isa),
            "logical_cores": self.logical_cores, "physical_cores": self.physical_cores,
            "caches": {k: [c.bytes, c.shared_by, c.instances] for k, c in sorted(self.caches.items())},
            # whole GiB: MemTotal moves by a few MB between kernels on the same machine
            "memory_gib": round(self.memory_bytes / 2**30) if self.memory_bytes else None,
        }
        if self.isa_view != "native":  # only when forced: native fingerprints stay what they always were
            ident["isa_view"] = self.isa_view
        return fingerprint_of(ident)


@dataclass
class DeviceProfile:
    """A machine and its measured ceilings.

    Hardware facts: see ``Hardware``; ``nominal_clock_hz`` (the clock the OS
    reports: the maximum where cpufreq says, else the current one, often the
    base clock in a VM) is informational and never a ceiling.
    ``threads``: the threads of the all-thread numbers (every CPU this process
    may use; 1 when OpenMP is unavailable, see ``notes``).
    Measured (fp32, best of several repeats; a repeat in which another
    process took a CPU from a probe thread counts only when no repeat was
    free of that, and then ``notes`` says so):
        peak_flops_1t / peak_flops_all: FLOP/s of an FMA kernel on one thread /
            with up to ``threads`` threads, at the vector width (``peak_bits``)
            that was fastest on one thread. "Up to": every all-thread number
            is at least its one-thread one, as a ceiling should be.
        peak_flops_1t_by_bits: one-thread FLOP/s per vector width built ("128",
            "256", "512" bits); kernels that use narrower vectors see these.
        bandwidth / bandwidth_1t: bytes/s per level ("L1", "L2", "L3", "DRAM";
            a level whose cache size is unknown is absent) and kind ("read": sum
            of a buffer; "copy": bytes read + bytes written, as STREAM counts;
            "read4": the same sum over the buffer's four quarters at once, four
            sequential streams per thread),
            summed over up to ``threads`` threads / on one thread. Buffers:
            half of one cache instance (split between the threads sharing it;
            the last level at its ``held_bytes`` where the probe found them);
            DRAM 8x the last-level cache, at least 256 MiB.
        call_overhead_s: one ctypes call from Python into a compiled no-op
            kernel with four arguments.
    Provenance: ``compiler`` (version line), ``openmp``, ``measured_at`` (UTC,
    ISO 8601), ``probe_seconds``, ``quick`` (short runs), ``notes`` (what
    could not be read or measured), ``version`` (of the probe's format).
    ``isa_view``: "native", or the ISA ``PLANFORGE_ISA`` forced ("avx2",
    "avx512"); ``isa``, ``vector_lanes_fp32`` and every measured number are
    then those of that view.
    ``held_bytes``: per level (the last-level cache only), the bytes of it that an
    all-thread read keeps hitting, where the probe found that under half of its
    size (a VM's share of a shared cache); the level's bandwidth is measured
    within that, and the cost model counts it as the level's capacity. Empty
    where the level holds what it reports.
    ``other_load``: the share (0..1) of all CPUs' time that other processes
    used while this profile was measured (the aggregate /proc/stat counters
    less this process's own CPU time); None where unknown (not Linux, or a
    profile stored before it was recorded). Above ``BUSY_LOAD`` the figures
    may be low (``measured_busy``). ``busy_figures``: the figures another
    process took a CPU from in every run (e.g. "L2 read on 2 threads"), which
    may be low whatever ``other_load`` says; the report marks them.
    """

    fingerprint: str
    arch: str
    cpu_model: str
    isa: list[str]
    vector_lanes_fp32: int
    logical_cores: int
    physical_cores: int
    caches: dict[str, CacheLevel]
    memory_bytes: int | None
    nominal_clock_hz: float | None
    threads: int
    peak_flops_1t: float
    peak_flops_all: float
    peak_bits: int
    peak_flops_1t_by_bits: dict[str, float]
    bandwidth: dict[str, dict[str, float]]
    bandwidth_1t: dict[str, dict[str, float]]
    call_overhead_s: float
    compiler: str
    openmp: bool
    measured_at: str
    probe_seconds: float
    quick: bool
    other_load: float | None = None
    busy_figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    version: int = PROBE_VERSION
    isa_view: str = "native"
    held_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def measured_busy(self) -> bool:
        """Whether other processes used more than ``BUSY_LOAD`` of the CPUs while this was measured."""
        return self.other_load is not None and self.other_load > BUSY_LOAD

    def bw(self, level: str, kind: str = "read", all_threads: bool = True) -> float | None:
        """Bandwidth in bytes/s of ``level`` ("L1", "L2", "L3", "DRAM") for ``kind`` ("read", "copy" or
        "read4"); None when that level was not measured."""
        if level not in LEVELS or kind not in BW_KINDS:
            raise ValueError(f"unknown bandwidth {level!r}/{kind!r}: levels are {', '.join(LEVELS)}, "
                             f"kinds {', '.join(BW_KINDS)}")
        return (self.bandwidth if all_threads else self.bandwidth_1t).get(level, {}).get(kind)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, d: Any) -> "DeviceProfile":
        """Check and convert a parsed profile; ``ProfileError`` says what is wrong."""
        if not isinstance(d, dict):
            raise ProfileError(f"expected a JSON object, got {type(d).__name__}")
        if d.get("version") != PROBE_VERSION:
            raise ProfileError(f"profile version {d.get('version')!r}, this planforge writes {PROBE_VERSION}")
        d = {**_ADDED_FIELDS, **d}  # profiles stored before these fields existed are still valid
        names = {f.name for f in fields(cls)}
        missing, extra = sorted(names - d.keys()), sorted(d.keys() - names)
        if missing or extra:
            raise ProfileError("fields " + ", ".join(f"missing {m}" for m in missing) +
                               (", " if missing and extra else "") + ", ".join(f"unexpected {e}" for e in extra))
        for name, (kinds, nullable) in _FIELD_TYPES.items():
            v = d[name]
            if v is None and nullable:
                continue
            if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
                raise ProfileError(f"field {name}: expected {'/'.join(k.__name__ for k in kinds)}, got {v!r}")
        if d["isa_view"] not in ISAS:
            raise ProfileError(f"field isa_view: expected one of {', '.join(ISAS)}, got {d['isa_view']!r}")
        if d["other_load"] is not None and not 0 <= d["other_load"] <= 1:
            raise ProfileError(f"field other_load: expected a share from 0 to 1, got {d['other_load']!r}")
        try:
            caches = {str(k): CacheLevel(**{f: int(c[f]) for f in ("bytes", "shared_by", "instances")})
                      for k, c in d["caches"].items()}
            rates = {k: {lvl: {kind: float(x) for kind, x in per.items()} for lvl, per in d[k].items()}
                     for k in ("bandwidth", "bandwidth_1t")}
            by_bits = {str(k): float(x) for k, x in d["peak_flops_1t_by_bits"].items()}
            held = {str(k): int(x) for k, x in d["held_bytes"].items()}
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise ProfileError(f"malformed caches, bandwidth or peak table: {e}") from None
        return cls(**{**d, "caches": caches, **rates, "peak_flops_1t_by_bits": by_bits, "held_bytes": held,
                      "isa": [str(x) for x in d["isa"]], "notes": [str(x) for x in d["notes"]],
                      "busy_figures": [str(x) for x in d["busy_figures"]]})

    @classmethod
    def from_json(cls, text: str) -> "DeviceProfile":
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ProfileError(f"not JSON: {e}") from None
        return cls.from_dict(d)


_NUM = (int, float)
_FIELD_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "fingerprint": ((str,), False), "arch": ((str,), False), "cpu_model": ((str,), False),
    "isa": ((list,), False), "vector_lanes_fp32": ((int,), False), "logical_cores": ((int,), False),
    "physical_cores": ((int,), False), "caches": ((dict,), False), "memory_bytes": ((int,), True),
    "nominal_clock_hz": (_NUM, True), "threads": ((int,), False), "peak_flops_1t": (_NUM, False),
    "peak_flops_all": (_NUM, False), "peak_bits": ((int,), False), "peak_flops_1t_by_bits": ((dict,), False),
    "bandwidth": ((dict,), False), "bandwidth_1t": ((dict,), False), "call_overhead_s": (_NUM, False),
    "compiler": ((str,), False), "openmp": ((bool,), False), "measured_at": ((str,), False),
    "probe_seconds": (_NUM, False), "quick": ((bool,), False), "notes": ((list,), False), "version": ((int,), False),
    "other_load": (_NUM, True), "isa_view": ((str,), False), "busy_figures": ((list,), False),
    "held_bytes": ((dict,), False),
}
# Fields added within a probe version, with the value a profile stored without them gets.
_ADDED_FIELDS: dict[str, Any] = {"other_load": None, "isa_view": "native", "busy_figures": [], "held_bytes": {}}


# ---------------------------------------------------------------- hardware facts

def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _cpu_list(text: str) -> set[int]:
    """"0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _size(text: str) -> int:
    """"48K" / "1024K" / "32M" / "512" -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.I)
    if not m:
        raise ValueError(f"cache size {text!r}")
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()]


def _cpuinfo(root: Path) -> list[dict[str, str]]:
    text = _read(root / "proc" / "cpuinfo")
    if not text:
        return []
    blocks, cur = [], {}
    for line in text.splitlines() + [""]:
        if not line.strip():
            if cur:
                blocks.append(cur)
            cur = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            cur.setdefault(key.strip(), value.strip())
    return blocks


def _sysctl(name: str) -> str | None:
    """macOS and BSD: ``sysctl -n name``, None when unknown."""
    try:
        p = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() or None if p.returncode == 0 else None


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def hardware(root: str | Path = "/", isa: str | None = None) -> Hardware:
    """Read this machine's facts; every source is optional and ``notes`` names the missing ones.

    ``root`` prefixes the /proc and /sys paths (tests point it at a fake tree);
    the CPU affinity and the page-count fallback for memory always come from
    this process. ``isa``: the ISA view ("native", "avx2", "avx512"; default
    ``$PLANFORGE_ISA``, else native), see the module's docstring; ``IsaError``
    when the flags read show that this CPU lacks it.
    """
    view = isa_choice(isa)
    root = Path(root)
    notes: list[str] = []
    cpus = _affinity()
    arch = platform.machine().lower() or "unknown"
    darwin = sys.platform == "darwin"
    info = _cpuinfo(root)
    first = info[0] if info else {}
    if not info and not darwin:
        notes.append("/proc/cpuinfo unreadable: CPU model and ISA flags unknown")

    model = (first.get("model name") or first.get("Processor") or first.get("Hardware")
             or (_sysctl("machdep.cpu.brand_string") if darwin else None))
    if not model and "CPU implementer" in first:
        model = f"implementer {first['CPU implementer']} part {first.get('CPU part', '?')}"
    model = re.sub(r"\s+", " ", model or platform.processor() or arch).strip()

    flags = set((first.get("flags") or first.get("Features") or "").split())
    if darwin and arch in ("arm64", "aarch64"):
        flags |= {"asimd"} | ({"asimdhp"} if _sysctl("hw.optional.arm.FEAT_FP16") == "1" else set())
    if "asimd" in flags:
        flags.add("neon")
    flags = _forced_flags(view, flags, arch)
    isa = tuple(f for f in ISA_FLAGS if f in flags)
    if "avx512f" in flags:
        lanes = 16
    elif "avx" in flags:
        lanes = 8
    elif flags & {"sse", "sse2", "neon", "asimd"} or arch in ("x86_64", "amd64", "aarch64", "arm64"):
        lanes = 4
    else:
        lanes = 1

    caches = _caches(root, cpus)
    if not caches and darwin:
        for name, key in (("L1d", "hw.l1dcachesize"), ("L2", "hw.l2cachesize"), ("L3", "hw.l3cachesize")):
            v = _sysctl(key)
            if v and v.isdigit() and int(v) > 0:
                caches[name] = CacheLevel(int(v), 1 if name != "L3" else len(cpus), 1)
        if caches:
            notes.append("caches from sysctl; sharing between cores assumed (L1d/L2 private, L3 shared)")
    if not caches:
        notes.append("cache sizes unknown (no /sys/devices/system/cpu/*/cache): cache bandwidths not measured")

    physical = _physical_cores(root, cpus, info)
    if physical is None and darwin:
        v = _sysctl("hw.physicalcpu")
        physical = min(int(v), len(cpus)) if v and v.isdigit() else None
    if physical is None:
        notes.append("core topology unknown: physical cores taken as logical cores")
        physical = len(cpus)

    memory = None
    meminfo = _read(root / "proc" / "meminfo")
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", meminfo or "", re.M)
    if m:
        memory = int(m.group(1)) * 1024
    else:
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            notes.append("total memory unknown")

    clock = None
    cpu0 = cpus[0] if cpus else 0
    mx = _read(root / "sys" / "devices" / "system" / "cpu" / f"cpu{cpu0}" / "cpufreq" / "cpuinfo_max_freq")
    if mx and mx.strip().isdigit():
        clock = int(mx) * 1e3
    elif first.get("cpu MHz"):
        try:
            clock = float(first["cpu MHz"]) * 1e6
        except ValueError:
            pass
    return Hardware(arch, model, isa, lanes, len(cpus), physical, caches, memory, clock, tuple(notes), view)


def _forced_flags(view: str, flags: set[str], arch: str) -> set[str]:
    """The ISA flags as the view ``view`` shows them: avx2 drops AVX-512, AMX (AMX exists only on
    AVX-512 parts, and no AVX2-only CPU reports it) and AVX-VNNI (Zen 3, which the view stands for, has
    none); ``IsaError`` when the CPU lacks the view's ISA."""
    if view == "native":
        return flags
    if arch not in ("x86_64", "amd64"):
        raise IsaError(f"PLANFORGE_ISA={view} is for x86-64 CPUs; this one is {arch}: leave it unset")
    need = {"avx2": ("avx2", "fma"), "avx512": ("avx512f",)}[view]
    lacking = [f for f in need if f not in flags]
    if lacking:
        raise IsaError(f"PLANFORGE_ISA={view}, but this CPU does not report {' and '.join(lacking)} in "
                       f"/proc/cpuinfo; " + ("use avx2 or " if view == "avx512" else "") + "leave it unset")
    if view == "avx2":
        return {f for f in flags if not f.startswith(("avx512", "amx", "avx_vnni", "avx_ifma", "avx_ne_convert"))}
    return flags


def _caches(root: Path, cpus: list[int]) -> dict[str, CacheLevel]:
    base = root / "sys" / "devices" / "system" / "cpu"
    found: dict[str, tuple[int, set[int]]] = {}
    instances: dict[str, set[frozenset[int]]] = {}
    for i, cpu in enumerate(cpus):
        d = base / f"cpu{cpu}" / "cache"
        try:
            entries = sorted(p for p in d.iterdir() if p.name.startswith("index"))
        except OSError:
            entries = []
        for idx in entries:
            level, kind = _read(idx / "level"), _read(idx / "type")
            size, shared = _read(idx / "size"), _read(idx / "shared_cpu_list")
            if not (level and kind and size) or kind.strip() == "Instruction":
                continue
            name = "L1d" if level.strip() == "1" else f"L{level.strip()}"
            try:
                share = _cpu_list(shared) if shared else {cpu}
                if i == 0:
                    found[name] = (_size(size), share)
            except ValueError:
                continue
            instances.setdefault(name, set()).add(frozenset(share))
    return {name: CacheLevel(size, len(share), len(instances.get(name, ())) or 1)
            for name, (size, share) in sorted(found.items())}


def _physical_cores(root: Path, cpus: list[int], info: list[dict[str, str]]) -> int | None:
    base = root / "sys" / "devices" / "system" / "cpu"
    cores = set()
    for cpu in cpus:
        t = base / f"cpu{cpu}" / "topology"
        text = _read(t / "core_cpus_list") or _read(t / "thread_siblings_list")
        if text is None:
            cores = None
            break
        try:
            cores.add(frozenset(_cpu_list(text)))
        except ValueError:
            cores = None
            break
    if cores:
        return len(cores)
    pairs = {(b.get("physical id"), b.get("core id")) for b in info
             if b.get("processor", "").isdigit() and int(b["processor"]) in cpus and "core id" in b}
    return len(pairs) or None


# ---------------------------------------------------------------- other processes' load

class CpuTicks(NamedTuple):
    """CPU time so far, in clock ticks: all CPUs busy and in total (/proc/stat), and this process's own."""

    busy: float
    total: float
    own: float


def _cpu_snapshot(stat: str | Path = "/proc/stat") -> CpuTicks | None:
    """Read the aggregate ``cpu`` line of ``stat`` and this process's CPU time; None where unreadable.

    busy = user + nice + system + irq + softirq + steal (guest time is already
    in user and nice); total adds idle and iowait. Own time is ``os.times()``:
    user + system of this process (all its threads) and of its waited-for
    children (the compiler), converted to the same clock ticks.
    """
    text = _read(Path(stat))
    if not text or not text.startswith("cpu "):
        return None
    try:
        v = [int(x) for x in text.split("\n", 1)[0].split()[1:9]]
        tick = os.sysconf("SC_CLK_TCK")
    except (ValueError, AttributeError, OSError):
        return None
    if len(v) < 4 or tick <= 0:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = v + [0] * (8 - len(v))
    busy = user + nice + system + irq + softirq + steal
    t = os.times()
    own = (t.user + t.system + t.children_user + t.children_system) * tick
    return CpuTicks(busy, busy + idle + iowait, own)


def _other_load(before: CpuTicks | None, after: CpuTicks | None) -> float | None:
    """Share (0..1) of all CPUs' time between two snapshots that other processes used; None when unknown."""
    if before is None or after is None or after.total <= before.total:
        return None
    others = (after.busy - before.busy) - (after.own - before.own)
    return min(1.0, max(0.0, others / (after.total - before.total)))


def sample_other_load(seconds: float = QUIET_SAMPLE_S) -> float | None:
    """How busy other processes keep this machine now: their share of all CPUs over ``seconds``;
    None where /proc/stat cannot be read."""
    before = _cpu_snapshot()
    if before is None:
        return None
    time.sleep(seconds)
    return _other_load(before, _cpu_snapshot())


# ---------------------------------------------------------------- measuring

_SOURCE = r"""
/* planforge device probe: FMA peak, read/copy bandwidth, call overhead. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#define TID() omp_get_thread_num()
#else
#define TID() 0
#define omp_get_num_threads() 1
#endif
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#ifdef __linux__
#include <sys/mman.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the calling thread: below the wall time exactly when the
   thread was preempted (a shared machine), which makes that run suspect. */
static double cpu_now(void) {
#ifdef CLOCK_THREAD_CPUTIME_ID
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#else
    return now();
#endif
}

#define MAXT 1024
/* min over threads of (CPU time / wall time) of each thread's timed work */
static double pf_clean_min(const double *share, int threads) {
    double m = 1e300;
    for (int t = 0; t < threads; t++) m = share[t] < m ? share[t] : m;
    return m;
}

/* Results land here so the compiler cannot drop the work; padded per thread. */
volatile float pf_sink[MAXT * 16];

int pf_max_threads(void) { return MAXT; }

int pf_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* The team OpenMP really gives when asked for ``threads`` (OMP_THREAD_LIMIT,
   OMP_DYNAMIC and the like can give fewer). */
int pf_team(int threads) {
    int n = 1;
#pragma omp parallel num_threads(threads)
    {
#pragma omp master
        n = omp_get_num_threads();
    }
    return n;
}

/* ---- FMA peak: NACC independent chains a = a*b + c, enough to cover FMA
   latency x FMA pipes; b < 1 keeps values near c/(1-b), far from denormals.
   b and c are read from volatiles: with constants the compiler can prove a
   chain stuck at a floating-point fixed point and drop its FMAs. */
volatile float pf_fma_in[2] = {0.999999f, 1e-6f};
/* One kernel per vector width: T the vector type, L its fp32 lanes, NACC chains. */
#define FMA_KERNEL(name, T, L, NACC, SET1, ADD, FMADD, STORE)                                    \
    static float name(long iters) {                                                             \
        T a[NACC], b = SET1(pf_fma_in[0]), c = SET1(pf_fma_in[1]);                              \
        for (int k = 0; k < NACC; k++) a[k] = ADD(b, SET1(0.001f * k));                          \
        for (long i = 0; i < iters; i++) {                                                      \
            _Pragma("GCC unroll 32") for (int k = 0; k < NACC; k++) a[k] = FMADD(a[k], b, c);   \
        }                                                                                       \
        T s = a[0];                                                                             \
        for (int k = 1; k < NACC; k++) s = ADD(s, a[k]);                                        \
        float out[L], r = 0;                                                                    \
        STORE(out, s);                                                                          \
        for (int k = 0; k < L; k++) r += out[k];                                                \
        return r;                                                                               \
    }

/* Portable 128-bit kernel (GCC vector extensions); a*b+c is contracted to an
   FMA where the ISA has one (NEON, x86 with FMA). */
typedef float v4f __attribute__((vector_size(16)));
static inline v4f v4_set1(float x) { return (v4f){x, x, x, x}; }
static inline v4f v4_add(v4f x, v4f y) { return x + y; }
static inline v4f v4_fmadd(v4f x, v4f y, v4f z) { return x * y + z; }
static inline void v4_store(float *p, v4f x) { memcpy(p, &x, sizeof x); }
#define NACC128 12
FMA_KERNEL(fma128, v4f, 4, NACC128, v4_set1, v4_add, v4_fmadd, v4_store)

#if defined(__AVX2__) && defined(__FMA__)
#define NACC256 12 /* of 16 registers; 2 pipes x 4-5 cycles latency needs 8-10 */
FMA_KERNEL(fma256, __m256, 8, NACC256, _mm256_set1_ps, _mm256_add_ps, _mm256_fmadd_ps, _mm256_storeu_ps)
#endif

#ifdef __AVX512F__
#define NACC512 16 /* of 32 registers */
FMA_KERNEL(fma512, __m512, 16, NACC512, _mm512_set1_ps, _mm512_add_ps, _mm512_fmadd_ps, _mm512_storeu_ps)
#endif

typedef float (*fma_fn)(long);

/* FLOPs per iteration of the kernel of this vector width; 0 when not compiled in. */
static fma_fn fma_pick(int bits, double *flops_per_iter) {
    switch (bits) {
    case 128: *flops_per_iter = 2.0 * 4 * NACC128; return fma128;
#if defined(__AVX2__) && defined(__FMA__)
    case 256: *flops_per_iter = 2.0 * 8 * NACC256; return fma256;
#endif
#ifdef __AVX512F__
    case 512: *flops_per_iter = 2.0 * 16 * NACC512; return fma512;
#endif
    default: *flops_per_iter = 0; return 0;
    }
}

int pf_fma_has(int bits) {
    double f;
    return fma_pick(bits, &f) != 0;
}

/* Seconds for ``iters`` iterations on each of ``threads`` threads (timed between
   barriers, after a warm-up); ``*flops`` gets the FLOPs done, ``*clean`` the
   least CPU/wall ratio of a thread (1: no thread was preempted). -1: width not
   built or too many threads. */
double pf_fma(int bits, long iters, int threads, double *flops, double *clean) {
    double per, share[MAXT];
    fma_fn f = fma_pick(bits, &per);
    if (!f || threads < 1 || threads > MAXT) return -1.0;
    double t0 = 0, t1 = 0;
    int team = 1;
#pragma omp parallel num_threads(threads)
    {
        int t = TID();
        pf_sink[t * 16] = f(iters / 8 + 1);
#pragma omp barrier
#pragma omp master
        {
            team = omp_get_num_threads();
            t0 = now();
        }
#pragma omp barrier
        double w0 = now(), c0 = cpu_now();
        pf_sink[t * 16] += f(iters);
        double c1 = cpu_now(), w1 = now();
        share[t] = w1 > w0 ? (c1 - c0) / (w1 - w0) : 1.0;
#pragma omp barrier
#pragma omp master
        t1 = now();
    }
    *flops = per * (double)iters * team;
    *clean = pf_clean_min(share, team);
    return t1 - t0;
}

/* ---- bandwidth: per thread a private slice of ``bytes`` at buf + t*bytes.
   read sums the slice; copy copies about half of it to the other half,
   counting bytes read + bytes written (as STREAM does). The copy's target is
   skewed by a few vectors: source and target a multiple of 4 KiB apart make
   loads falsely wait on stores (4K aliasing) and understate the bandwidth. */
#if defined(__AVX512F__)
#define VB 64
#elif defined(__AVX__)
#define VB 32
#else
#define VB 16
#endif
typedef float vec __attribute__((vector_size(VB)));
#define UNR 8 /* independent adds: covers add latency x add pipes */
#define PF_BLOCK (2 * UNR * VB) /* slice sizes are multiples of this */
#define SKEW 5                  /* vectors */

int pf_block(void) { return PF_BLOCK; }

static float read_pass(const vec *restrict p, size_t n) {
    vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (size_t i = 0; i < n; i += UNR) {
        a0 += p[i]; a1 += p[i + 1]; a2 += p[i + 2]; a3 += p[i + 3];
        a4 += p[i + 4]; a5 += p[i + 5]; a6 += p[i + 6]; a7 += p[i + 7];
    }
    vec s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
    float r = 0;
    for (int k = 0; k < VB / 4; k++) r += s[k];
    return r;
}

/* The same sum over four quarters of the slice at once: four sequential streams in flight, as a kernel
   that walks several regions together has (a GEMV's K split, a GEMM's panels). One stream per core
   can leave memory-level parallelism unused: the prefetchers track each stream on its own. */
static float read_pass4(const vec *restrict p, size_t n) {
    vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    const size_t q = n / 4; /* n is a multiple of 2 * UNR vectors: each quarter of 2 */
    const vec *restrict p0 = p, *restrict p1 = p + q, *restrict p2 = p + 2 * q, *restrict p3 = p + 3 * q;
    for (size_t i = 0; i < q; i += 2) {
        a0 += p0[i]; a1 += p0[i + 1]; a2 += p1[i]; a3 += p1[i + 1];
        a4 += p2[i]; a5 += p2[i + 1]; a6 += p3[i]; a7 += p3[i + 1];
    }
    vec s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
    float r = 0;
    for (int k = 0; k < VB / 4; k++) r += s[k];
    return r;
}

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns"))) /* keep our loop, not a libc memcpy */
#endif
static void copy_pass(vec *restrict d, const vec *restrict s, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = s[i];
}

/* kind 0: read, 1: copy, 2: read as four streams. Seconds for ``reps`` passes over every slice;
   ``*moved`` gets the bytes moved by all threads, ``*clean`` as for pf_fma. */
double pf_bw(int kind, float *buf, long bytes, long reps, int threads, double *moved, double *clean) {
    double t0 = 0, t1 = 0, share[MAXT];
    if (threads < 1 || threads > MAXT) return -1.0;
    int team = 1;
    size_t nvec = (size_t)bytes / VB;
    size_t half = nvec / 2, ncopy = half > 2 * SKEW ? half - SKEW : half;
    size_t off = half + (ncopy < half ? SKEW : 0);
#pragma omp parallel num_threads(threads)
    {
        int t = TID();
        vec *p = (vec *)((char *)buf + (size_t)t * (size_t)bytes);
        float acc = 0;
        if (kind != 1) acc += read_pass(p, nvec); /* warm: bring the slice into its cache level */
        else copy_pass(p + off, p, ncopy);
#pragma omp barrier
#pragma omp master
        {
            team = omp_get_num_threads();
            t0 = now();
        }
#pragma omp barrier
        double w0 = now(), c0 = cpu_now();
        if (kind == 0)
            for (long r = 0; r < reps; r++) {
                acc += read_pass(p, nvec);
                __asm__ __volatile__("" ::: "memory"); /* each pass really loads: no hoisting */
            }
        else if (kind == 2)
            for (long r = 0; r < reps; r++) {
                acc += read_pass4(p, nvec);
                __asm__ __volatile__("" ::: "memory");
            }
        else
            for (long r = 0; r < reps; r++) {
                copy_pass(p + off, p, ncopy);
                __asm__ __volatile__("" ::: "memory"); /* each pass really stores */
            }
        double c1 = cpu_now(), w1 = now();
        share[t] = w1 > w0 ? (c1 - c0) / (w1 - w0) : 1.0;
#pragma omp barrier
#pragma omp master
        t1 = now();
        pf_sink[t * 16] = acc;
    }
    *moved = (double)VB * (double)(kind != 1 ? nvec : 2 * ncopy) * (double)reps * team;
    *clean = pf_clean_min(share, team);
    return t1 - t0;
}

/* Page-aligned (2 MiB where possible, so huge pages can back it) buffer,
   first touched by the threads that will use each part. */
float *pf_alloc(long bytes, int threads) {
    void *p = 0;
    if (posix_memalign(&p, (size_t)2 << 20, (size_t)bytes) != 0) return 0;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(p, (size_t)bytes, MADV_HUGEPAGE);
#endif
    float *f = (float *)p;
    long n = bytes / (long)sizeof(float);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long i = 0; i < n; i++) f[i] = 1.0f;
    return f;
}

void pf_free(float *p) { free(p); }

/* The cheapest kernel there is: what calling any kernel costs. */
void pf_noop(float *a, float *b, float *c, long n) {
    (void)a; (void)b; (void)c; (void)n;
}
"""


@dataclass(frozen=True)
class _Effort:
    target_s: float   # seconds per timed run
    repeats: int      # timed runs per number; the best clean one counts
    calls: int        # ctypes calls per call-overhead run


FULL = _Effort(target_s=0.1, repeats=5, calls=20000)
QUICK = _Effort(target_s=0.003, repeats=5, calls=2000)
_PAGE = 4096
# A run counts as clean when every thread had the CPU for at least this share
# of its wall time; below it another process took a core mid-run.
CLEAN = 0.95
# Runs = (seconds, work, clean ratio) for a work size n.
Run = Callable[[int], tuple[float, float, float]]


def _calibrate(run: Run, target: float) -> int:
    """An ``n`` for which ``run(n)`` takes about ``target`` seconds.

    Each size is timed three times and the fastest counts: on a shared
    machine one run can lose milliseconds to another process, and a size
    judged by that run would be far too small to time the work itself.
    """
    n = 1
    while n < 2**40:
        t = min(run(n)[0] for _ in range(3))
        if t >= target / 2:
            return max(1, round(n * target / t))
        n = int(n * min(100.0, max(2.0, target / t))) if t > 0 else n * 100
    return n


def _best_rate(run: Run, effort: _Effort, n: int | None = None) -> tuple[float, int, bool]:
    """(best work/second over the repeats, n, whether that run was clean).

    ``n`` defaults to one calibrated to take ``effort.target_s``; all-thread
    runs pass the one-thread ``n`` instead (same work per thread), since
    calibrating while threads wait on each other is at the mercy of every
    other process on the machine. Only clean runs count while there is one:
    when none of the repeats is clean, more are tried for up to three times
    the repeats' nominal time. When even the best run is under a third of
    the target, ``n`` is scaled up and the repeats are run again.
    """
    target = effort.target_s
    n = n or _calibrate(run, target)
    best, clean_ok = 0.0, False
    for _attempt in range(4):
        best_clean = best_any = best_t = 0.0
        tries, deadline = 0, time.perf_counter() + 4 * effort.repeats * target
        while tries < effort.repeats or (not best_clean and time.perf_counter() < deadline):
            t, work, clean = run(n)
            tries += 1
            if t <= 0:
                continue
            if clean >= CLEAN and work / t > best_clean:
                best_clean = work / t
            if work / t > best_any:
                best_any, best_t = work / t, t
        best, clean_ok = (best_clean, True) if best_clean else (best_any, False)
        if best_t >= target / 3 or n >= 2**40:
            break
        n = int(n * target / best_t) if best_t > 0 else n * 100
    if not best > 0 or not math.isfinite(best):
        raise ProbeError("a probe kernel reported no elapsed time; the clock may be broken")
    return best, n, clean_ok


def _lib(notes: list[str], isa: str) -> tuple[ctypes.CDLL, bool]:
    try:
        lib, openmp = load(build(_SOURCE, openmp=True, isa=isa)), True
    except BuildError as e:
        notes.append(f"OpenMP build failed ({e}): measured on 1 thread only, all-thread numbers are 1-thread ones")
        lib, openmp = load(build(_SOURCE, openmp=False, isa=isa)), False
    c = ctypes
    dp = c.POINTER(c.c_double)
    lib.pf_fma.restype, lib.pf_fma.argtypes = c.c_double, [c.c_int, c.c_long, c.c_int, dp, dp]
    lib.pf_fma_has.restype, lib.pf_fma_has.argtypes = c.c_int, [c.c_int]
    lib.pf_bw.restype, lib.pf_bw.argtypes = c.c_double, [c.c_int, c.c_void_p, c.c_long, c.c_long, c.c_int, dp, dp]
    lib.pf_alloc.restype, lib.pf_alloc.argtypes = c.c_void_p, [c.c_long, c.c_int]
    lib.pf_free.restype, lib.pf_free.argtypes = None, [c.c_void_p]
    lib.pf_noop.restype, lib.pf_noop.argtypes = None, [c.c_void_p, c.c_void_p, c.c_void_p, c.c_long]
    lib.pf_block.restype = lib.pf_openmp.restype = lib.pf_max_threads.restype = c.c_int
    lib.pf_team.restype, lib.pf_team.argtypes = c.c_int, [c.c_int]
    return lib, openmp and bool(lib.pf_openmp())


def _fma_run(lib: ctypes.CDLL, bits: int, threads: int) -> Run:
    flops, clean = ctypes.c_double(), ctypes.c_double()

    def run(n: int) -> tuple[float, float, float]:
        t = lib.pf_fma(bits, n, threads, ctypes.byref(flops), ctypes.byref(clean))
        if t < 0:
            raise ProbeError(f"FMA kernel refused {bits} bits on {threads} threads")
        return t, flops.value, clean.value

    return run


def _bw_run(lib: ctypes.CDLL, kind: int, buf: int, nbytes: int, threads: int) -> Run:
    moved, clean = ctypes.c_double(), ctypes.c_double()

    def run(n: int) -> tuple[float, float, float]:
        t = lib.pf_bw(kind, buf, nbytes, n, threads, ctypes.byref(moved), ctypes.byref(clean))
        if t < 0:
            raise ProbeError(f"bandwidth kernel refused {threads} threads")
        return t, moved.value, clean.value

    return run


def _slices(hw: Hardware, threads: int) -> dict[str, tuple[int, int]]:
    """Per level (bytes per thread on all threads, bytes on one thread): half of one cache instance,
    split between the threads that share it; DRAM 8x the last-level cache (at least 256 MiB) in all,
    since a victim or non-LRU last-level cache still hits on part of a buffer only 4x its size."""
    out = {}
    for level, name in _CACHE_OF.items():
        c = hw.caches.get(name)
        if c:
            per_instance = math.ceil(threads / c.instances)
            out[level] = (c.bytes // 2 // per_instance, c.bytes // 2)
    last = max(((c.bytes * c.instances) for c in hw.caches.values()), default=0)
    total = max(8 * last, 256 * 2**20)
    if hw.memory_bytes:
        total = min(total, hw.memory_bytes // 8)
    total = min(total, 4 * 2**30)
    out["DRAM"] = (total // threads, total)
    return out


def _bandwidths(lib: ctypes.CDLL, hw: Hardware, threads: int, effort: _Effort, notes: list[str],
                contended: list[str], progress: Callable[[str], None]) -> tuple[dict, dict]:
    block = max(lib.pf_block(), _PAGE)
    slices = {lvl: (max(block, a // block * block), max(block, b // block * block))
              for lvl, (a, b) in _slices(hw, threads).items()}
    last = max(((c.bytes * c.instances) for c in hw.caches.values()), default=0)
    if last and slices["DRAM"][1] < 2 * last:
        notes.append(f"DRAM buffer ({slices['DRAM'][1] / 2**20:.0f} MiB) under twice the last-level cache "
                     f"({last / 2**20:.0f} MiB): DRAM bandwidth may be overstated")
    size = max(max(a * threads, b) for a, b in slices.values())
    buf = lib.pf_alloc(size, threads)
    if not buf:
        raise ProbeError(f"could not allocate {size / 2**20:.0f} MiB for the bandwidth probe")
    out_all: dict[str, dict[str, float]] = {}
    out_1t: dict[str, dict[str, float]] = {}
    held_by_level: dict[str, int] = {}
    try:
        llc = _last_level(hw)
        if llc is not None and threads > 0:
            progress(f"{llc} capacity in use")
            held = _held_bytes(lib, hw, llc, buf, block, threads, effort)
            if held is not None:
                held_by_level[llc] = held
                # the level's figures are measured at the held size itself, not half of it: the ladder starts at
                # twice what the faster levels hold, so half of its first size could still hit in them
                per_thread = max(block, held // threads // block * block)
                slices[llc] = (per_thread, max(block, held // block * block))
                notes.append(f"{llc} holds about {held / 2**20:.0f} MiB of a buffer read over and over, not its "
                             f"{_cache_total(hw, llc) / 2**20:.0f} MiB (shared with other machines or processes, "
                             f"or a replacement policy that keeps less): its figures are measured within that "
                             f"and the cost model counts that capacity")
        def measure_level(level: str, again: bool = False) -> None:
            per_thread, single = slices[level]
            progress(f"bandwidth {level}" + (" again" if again else ""))
            for kind_id, kind in enumerate(BW_KINDS):
                rate, n1, ok = _best_rate(_bw_run(lib, kind_id, buf, single, 1), effort)
                out_1t.setdefault(level, {})[kind] = max(rate, out_1t.get(level, {}).get(kind, 0.0))
                if not ok and not again:
                    contended.append(f"{level} {kind} on 1 thread")
                if threads > 1:
                    n_all = max(1, round(n1 * single / per_thread))  # same bytes per thread as on one
                    r_all, _, ok = _best_rate(_bw_run(lib, kind_id, buf, per_thread, threads), effort, n_all)
                    if not ok and not again:
                        contended.append(f"{level} {kind} on {threads} threads")
                    rate = max(rate, r_all)  # a ceiling with up to ``threads`` threads: one is an option
                out_all.setdefault(level, {})[kind] = max(rate, out_all.get(level, {}).get(kind, 0.0))

        measured = [level for level in LEVELS if level in slices]
        for level in measured:
            measure_level(level)
        # a cache level read slower than the level below it was measured in a slow stretch of a shared machine (the
        # levels run one after another, seconds apart): it is measured again, best kept (a quick probe once read a
        # Zen 4's L2 at 118 GB/s and its L3 at 187, then 250 and 190 a minute later)
        for hi, lo in zip(measured, measured[1:]):
            for _ in range(REMEASURE):
                if lo == "DRAM" or all(out[hi].get("read", 0.0) >= out[lo].get("read", 0.0)
                                       for out in (out_all, out_1t)):
                    break
                measure_level(hi, again=True)
    finally:
        lib.pf_free(buf)
    return out_all, out_1t, held_by_level


# times a cache level read slower than the level below it is measured again
REMEASURE = 2

# A last-level cache "holds" a buffer while an all-thread read of it stays within this share of the rate of the
# smallest size measured above the level below (a cache's rate is a plateau, then a cliff once it no longer fits)
HELD_SHARE = 0.6


def _last_level(hw: Hardware) -> str | None:
    """The bandwidth level of the largest cache (``L3`` where there is one)."""
    known = [lvl for lvl, name in _CACHE_OF.items() if name in hw.caches]
    return known[-1] if len(known) >= 2 else None


def _cache_total(hw: Hardware, level: str) -> int:
    c = hw.caches[_CACHE_OF[level]]
    return c.bytes * c.instances


def _held_bytes(lib: ctypes.CDLL, hw: Hardware, level: str, buf: int, block: int, threads: int,
                effort: _Effort) -> int | None:
    """Bytes of ``level`` (all its instances) that an all-thread read keeps hitting, where that is under half of
    its size; None where it holds at least half (the usual slice then lies inside it) or nothing is measurable.

    Reads buffers from twice what the levels above hold, in steps of sqrt(2) up to half of ``level``'s size, and
    keeps the largest whose rate stays within ``HELD_SHARE`` of the first's. A virtual machine's share of a shared
    last-level cache can be a fraction of what the CPU reports (on a 2-CPU Sapphire Rapids VM, 33 MiB of
    105 MiB when the host was quiet, 8-16 MiB while other guests ran)."""
    names = list(_CACHE_OF)
    above = 0  # what the faster levels hold between the threads
    for lvl in names[:names.index(level)]:
        c = hw.caches.get(_CACHE_OF[lvl])
        if c is not None:
            above += c.bytes * min(c.instances, math.ceil(threads / c.shared_by))
    start, half = 2 * above, _cache_total(hw, level) // 2
    sizes = []
    while start * 2 ** (len(sizes) / 2) < half:  # steps of sqrt(2): a capacity within 1.41x of its figure
        sizes.append(int(start * 2 ** (len(sizes) / 2)) // block * block)

    def rate(t: int) -> float:
        return _best_rate(_bw_run(lib, 0, buf, max(block, t // threads // block * block), threads), effort)[0]

    return held_size(sizes, rate)


def held_size(sizes: Sequence[int], rate: Callable[[int], float]) -> int | None:
    """The largest of ``sizes`` (ascending) read at ``rate(size)`` within ``HELD_SHARE`` of the first's, up to the
    first that falls off and stays off at the next size too (one slow run of a busy machine is not a capacity;
    a size back on the plateau after two that fell off is noise); None where none falls off or there are fewer
    than two sizes."""
    if len(sizes) < 2:
        return None
    first, held, off = rate(sizes[0]), sizes[0], None
    for t in sizes[1:]:
        if rate(t) >= HELD_SHARE * first:
            held, off = t, None
        elif off is not None:
            return int(held)
        else:
            off = t
    return int(held) if off is not None else None


def _call_overhead(lib: ctypes.CDLL, effort: _Effort) -> float:
    f = lib.pf_noop
    a, b, c = 4096, 8192, 12288  # never dereferenced
    best = math.inf
    for _ in range(effort.repeats):
        t0 = time.perf_counter()
        for _ in range(effort.calls):
            f(a, b, c, 1024)
        best = min(best, (time.perf_counter() - t0) / effort.calls)
    return best


def measure(hw: Hardware | None = None, quick: bool = False,
            progress: Callable[[str], None] | None = None) -> DeviceProfile:
    """Measure a fresh profile of this machine (no cache involved).

    Parameters:
        hw: the facts to measure against (default: ``hardware()``); the probe's
            kernels are built for its ``isa_view``.
        quick: short runs (about a second in all) instead of 10-30 s; the
            numbers are noisier but ordered the same. Default False.
        progress: called with a short label before each step (default: nothing).
    Raises ``CompilerMissing`` without a C compiler, ``BuildError`` when the
    probe's C source does not compile, ``ProbeError`` when a kernel cannot run.
    Warns (``RuntimeWarning``) when other processes used more than
    ``BUSY_LOAD`` of the CPUs meanwhile (the profile's ``other_load``).
    """
    t_start = time.perf_counter()
    ticks0 = _cpu_snapshot()
    hw = hw or hardware()
    say = progress or (lambda _msg: None)
    effort = QUICK if quick else FULL
    notes = list(hw.notes)
    say("building probe kernels")
    lib, openmp = _lib(notes, hw.isa_view)
    threads = lib.pf_team(min(hw.logical_cores, lib.pf_max_threads())) if openmp else 1
    if threads < hw.logical_cores and openmp:
        notes.append(f"all-thread numbers use {threads} of {hw.logical_cores} CPUs (OpenMP gave no more)")
    contended: list[str] = []

    widths = [bits for bits in (512, 256, 128) if lib.pf_fma_has(bits)]
    if len(widths) > 1:
        widths.remove(128)  # the portable kernel only matters where nothing wider is built
    by_bits, iters = {}, {}
    for bits in widths:
        say(f"peak FLOP/s, {bits}-bit vectors, 1 thread")
        by_bits[str(bits)], iters[bits], ok = _best_rate(_fma_run(lib, bits, 1), effort)
        if not ok:
            contended.append(f"peak {bits}-bit on 1 thread")
    peak_bits = max(widths, key=lambda b: by_bits[str(b)])
    peak_1t = by_bits[str(peak_bits)]
    peak_all = peak_1t
    if threads > 1:
        say(f"peak FLOP/s, {peak_bits}-bit vectors, {threads} threads")
        p_all, _, ok = _best_rate(_fma_run(lib, peak_bits, threads), effort, iters[peak_bits])
        if not ok:
            contended.append(f"peak on {threads} threads")
        peak_all = max(peak_all, p_all)

    bw_all, bw_1t, held = _bandwidths(lib, hw, threads, effort, notes, contended, say)
    if contended:
        notes.append("another process took a CPU from the probe in every run of: " + ", ".join(contended) +
                     "; those numbers may be low, all-thread ones no lower than their 1-thread ones "
                     "(measure again with --force when the machine is quieter)")
    say("call overhead")
    overhead = _call_overhead(lib, effort)
    load = _other_load(ticks0, _cpu_snapshot())
    if load is not None and load > BUSY_LOAD:
        warnings.warn(f"other processes used {load:.0%} of all CPUs while this machine was measured, so its "
                      f"peak FLOP/s and bandwidth figures may be low; measure again when it is quieter "
                      f"(planforge probe --force), or let the next use of the cached profile do so once the "
                      f"machine is quiet", RuntimeWarning, stacklevel=2)
    return DeviceProfile(
        fingerprint=hw.fingerprint, arch=hw.arch, cpu_model=hw.cpu_model, isa=list(hw.isa),
        vector_lanes_fp32=hw.vector_lanes_fp32, logical_cores=hw.logical_cores, physical_cores=hw.physical_cores,
        caches=dict(hw.caches), memory_bytes=hw.memory_bytes, nominal_clock_hz=hw.nominal_clock_hz,
        threads=threads, peak_flops_1t=peak_1t, peak_flops_all=peak_all, peak_bits=peak_bits,
        peak_flops_1t_by_bits=by_bits, bandwidth=bw_all, bandwidth_1t=bw_1t, call_overhead_s=overhead,
        compiler=compiler()[1], openmp=openmp,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        probe_seconds=round(time.perf_counter() - t_start, 3), quick=quick,
        other_load=None if load is None else round(load, 3), busy_figures=contended, notes=notes,
        isa_view=hw.isa_view, held_bytes=held)


# ---------------------------------------------------------------- cache

def profile_path(fingerprint: str) -> Path:
    return cache_dir() / "profiles" / f"{fingerprint}.json"


def load_profile(path: str | Path) -> DeviceProfile:
    """Read a stored profile; ``ProfileError`` when it is unreadable or malformed."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"cannot read {path}: {e}") from None
    return DeviceProfile.from_json(text)


def get_profile(force: bool = False, quick: bool = False,
                progress: Callable[[str], None] | None = None) -> DeviceProfile:
    """This machine's DeviceProfile: the cached one, or measured and cached.

    Parameters:
        force: measure again even when a profile is cached (default False).
        quick: accept a cached quick or full profile, and measure in quick mode
            when none is cached (default False: only a full profile is reused,
            a cached quick one is measured again in full).
        progress: passed to ``measure`` (default: nothing).
    A cached file that is corrupt, from another probe version or for other
    hardware is measured again and replaced, with a ``RuntimeWarning``.
    A cached profile measured while other processes used more than
    ``BUSY_LOAD`` of the CPUs is measured again (with a ``RuntimeWarning``
    saying why) when a ``QUIET_SAMPLE_S`` sample finds them under
    ``QUIET_LOAD`` now; otherwise it is used, with a ``RuntimeWarning``.
    """
    hw = hardware()
    path = profile_path(hw.fingerprint)
    if not force and path.exists():
        try:
            cached = load_profile(path)
            if cached.fingerprint != hw.fingerprint:
                raise ProfileError(f"it belongs to machine {cached.fingerprint}")
            if quick or not cached.quick:
                if not cached.measured_busy:
                    return cached
                now = sample_other_load(QUIET_SAMPLE_S)
                busy = (f"cached device profile {path} was measured while other processes used "
                        f"{cached.other_load:.0%} of all CPUs, so its figures may be low")
                if now is None or now >= QUIET_LOAD:
                    state = "of unknown load" if now is None else f"still busy ({now:.0%})"
                    warnings.warn(f"{busy}; the machine is {state} now, so it is used as it is "
                                  f"(planforge probe --force measures again)", RuntimeWarning, stacklevel=2)
                    return cached
                warnings.warn(f"{busy}; the machine is quiet now ({now:.0%}): measuring again", RuntimeWarning,
                              stacklevel=2)
        except ProfileError as e:
            warnings.warn(f"cached device profile {path} is unusable ({e}); measuring again", RuntimeWarning,
                          stacklevel=2)
    prof = measure(hw, quick=quick, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(prof.to_json())
    os.replace(tmp, path)  # readers never see half a file
    return prof
