"""A GPU's device profile, and the offline table of published figures (H100, H200, A100, L4).

``GpuProfile`` is what the CUDA target knows of a GPU: the driver's facts (SM
count, shared memory per block and per SM, registers, L2 size, clocks) and
the measured ceilings (HBM and L2 bandwidth, peak FLOP/s per input dtype,
kernel launch overhead). On a machine with a GPU the probe (``probe.py``)
fills it in; without one, ``offline(name)`` gives the published figures of
a known part, so that the analytic model and the funnel can plan for it
(``planforge probe --target cuda --offline H200``).

The published figures are the vendors' datasheets (dense tensor-core rates,
no sparsity; boost clocks). Two figures are not on any datasheet and are
marked as estimates in ``notes``: the L2 bandwidth (from public
microbenchmarks: about 3.5x the HBM's on the H100, the same on-chip figure
for the H200, about 3x on the A100 and 4x on the L4) and the launch overhead (a
Triton launch from Python, host side included).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

DTYPES = ("fp32", "tf32", "bf16", "fp16")


class DeviceError(ValueError):
    """No GPU where one is needed, or an unknown offline device name."""


@dataclass(frozen=True)
class GpuProfile:
    """One GPU's facts and ceilings.

    Parameters:
        name: the device name as the driver reports it (``NVIDIA H200``).
        capability: compute capability as ``(major, minor)``.
        sms: streaming multiprocessors.
        clock_hz: the SM boost clock.
        smem_per_block: shared memory one block may use (the opt-in maximum), bytes.
        smem_per_sm: shared memory of one SM, bytes.
        regs_per_sm: 32-bit registers of one SM.
        max_threads_per_sm: resident threads one SM can hold.
        max_blocks_per_sm: resident blocks one SM can hold.
        l2_bytes: the L2 cache.
        memory_bytes: device memory.
        hbm_bw: device memory bandwidth, bytes/s (measured: a device-to-device copy, bytes read + written).
        l2_bw: L2 bandwidth, bytes/s.
        flops: peak FLOP/s per input dtype (``DTYPES``; fp32: the SIMT FMA rate, the others the tensor cores').
        launch_s: seconds between two back-to-back kernel launches (host side included).
        source: ``"published"`` (the offline table) or ``"measured"`` (the probe on this GPU).
        measured_at: when it was measured ("" for published figures).
        quick: whether the microbenchmarks ran in quick mode.
        notes: what is estimated or odd about these figures.
    """

    name: str
    capability: tuple[int, int]
    sms: int
    clock_hz: float
    smem_per_block: int
    smem_per_sm: int
    regs_per_sm: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    l2_bytes: int
    memory_bytes: int
    hbm_bw: float
    l2_bw: float
    flops: dict[str, float]
    launch_s: float
    source: str = "published"
    measured_at: str = ""
    quick: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fingerprint(self) -> str:
        """Identifies the part (no measurement): times on different parts are never compared."""
        short = self.name.replace("NVIDIA ", "").replace(" ", "-")
        return f"cuda-sm{self.capability[0]}{self.capability[1]}-{short}-{self.sms}sm"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["capability"] = list(self.capability)
        d["notes"] = list(self.notes)
        d["fingerprint"] = self.fingerprint
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GpuProfile":
        d = {k: v for k, v in d.items() if k != "fingerprint"}
        d["capability"] = tuple(d["capability"])
        d["notes"] = tuple(d.get("notes", ()))
        d["flops"] = {str(k): float(v) for k, v in d["flops"].items()}
        return cls(**d)


_KIB, _MIB, _GB = 1024, 1024 * 1024, 10**9
_ESTIMATES = ("L2 bandwidth: an estimate (from public microbenchmarks; the H100 and H200 share one L2 design, "
              "so one figure); no datasheet gives it",
              "launch overhead: an estimate of one Triton launch from Python; the probe measures it on a GPU")

# Datasheet figures: SXM parts for H100/H200/A100 (80 GB), the PCIe L4. Dense tensor-core rates.
PUBLISHED: dict[str, GpuProfile] = {
    "H100": GpuProfile("NVIDIA H100 80GB HBM3", (9, 0), 132, 1.98e9, 227 * _KIB, 228 * _KIB, 65536, 2048, 32,
                       50 * _MIB, 80 * _GB, 3.35e12, 11.7e12,
                       {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12}, 5e-6,
                       notes=_ESTIMATES),
    "H200": GpuProfile("NVIDIA H200", (9, 0), 132, 1.98e9, 227 * _KIB, 228 * _KIB, 65536, 2048, 32,
                       # the H200's driver reports a 60 MiB L2 (the H100's 50 MiB on its datasheet)
                       60 * _MIB, 141 * _GB, 4.8e12, 11.7e12,
                       {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12}, 5e-6,
                       notes=_ESTIMATES),
    "A100": GpuProfile("NVIDIA A100-SXM4-80GB", (8, 0), 108, 1.41e9, 163 * _KIB, 164 * _KIB, 65536, 2048, 32,
                       40 * _MIB, 80 * _GB, 2.039e12, 6.0e12,
                       {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12}, 5e-6,
                       notes=_ESTIMATES),
    "L4": GpuProfile("NVIDIA L4", (8, 9), 58, 2.04e9, 99 * _KIB, 100 * _KIB, 65536, 1536, 24,
                     48 * _MIB, 24 * _GB, 300e9, 1.2e12,
                     {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12}, 5e-6,
                     notes=("L2 bandwidth: an estimate (the L4's GDDR6 is slow next to its L2, about four times "
                            "the memory bandwidth); no datasheet gives it", _ESTIMATES[1])),
}


def offline(name: str) -> GpuProfile:
    """The published figures of the GPU ``name`` (``H100``, ``H200``, ``A100``, ``L4``; any case).

    Raises ``DeviceError`` naming the known parts for any other name."""
    key = str(name).strip().upper()
    if key not in PUBLISHED:
        raise DeviceError(f"no published figures for GPU {name!r}; known: {', '.join(PUBLISHED)}")
    return PUBLISHED[key]


__all__ = ["DTYPES", "DeviceError", "GpuProfile", "PUBLISHED", "offline"]
