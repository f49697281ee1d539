"""CPU kernel templates (C, compiled with the system compiler) and library baselines.

A ``Template`` ties an op to its knob space, its C source generator and its
ctypes binding, and declares the FLOPs, bytes and features cost models use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ....space import Space
from . import gemm, gemv, mlp, rowwise
from .problem import LIBRARIES, OPS, Problem, ProblemError, available_libraries, check, flops, make_inputs, min_bytes, \
    output_shape, reference, tolerance


@dataclass(frozen=True)
class Template:
    """A parameterised kernel: ``space(problem, profile)``, ``source(problem, knobs)``,
    ``bind(lib, problem, knobs, inputs, out) -> run()``, and its cost-model features."""

    name: str
    op: str
    compile_knobs: tuple[str, ...]
    space: Callable[[Problem, Any], Space]
    source: Callable[[Problem, dict], str]
    bind: Callable[..., Callable[[], None]]
    features: Callable[[Problem, dict], dict[str, float]]
    registry: str = "planforge.targets.cpu.templates"  # module whose TEMPLATES holds it (workers look it up there)

    def openmp(self, knobs: dict) -> bool:
        return knobs.get("threads", 1) > 1

    def compile_part(self, knobs: dict) -> dict:
        return {k: knobs[k] for k in self.compile_knobs if k in knobs}


def _row_features(p: Problem, k: dict) -> dict[str, float]:
    return {"vec": k["vec"], "unroll": k["unroll"], "threads": k["threads"], "passes": k.get("passes", 0),
            "cols_tail": p.dims[1] % k["vec"]}


TEMPLATES: dict[str, Template] = {
    "gemm": Template(
        "gemm", "gemm", gemm.COMPILE_KNOBS,
        space=lambda p, prof: gemm.space(*p.dims, prof),
        source=lambda p, k: gemm.source(k, p.epilogue),
        bind=lambda lib, p, k, i, out: gemm.bind(lib, k, i["A"], i["B"], i.get("bias"), out),
        features=lambda p, k: gemm.features(*p.dims, k),
    ),
    "gemv": Template(
        "gemv", "gemv", gemv.COMPILE_KNOBS,
        space=lambda p, prof: gemv.space(*p.dims, prof),
        source=lambda p, k: gemv.source(k, p.epilogue),
        bind=lambda lib, p, k, i, out: gemv.bind(lib, k, i["x"], i["W"], i.get("bias"), out),
        features=lambda p, k: gemv.features(*p.dims, k),
    ),
}
for _op in ("softmax", "layernorm", "eltwise"):
    TEMPLATES[_op] = Template(
        _op, _op, rowwise.COMPILE_KNOBS,
        space=lambda p, prof: rowwise.space(p.op, *p.dims, prof),
        source=lambda p, k: rowwise.source(p.op, k, p.epilogue),
        bind=lambda lib, p, k, i, out: rowwise.bind(
            lib, k, i["x"], out, i.get("gamma", i.get("bias")), i.get("beta", i.get("res"))),
        features=_row_features,
    )


def template_for(p: Problem) -> Template:
    return TEMPLATES[p.op]


__all__ = ["LIBRARIES", "OPS", "Problem", "ProblemError", "TEMPLATES", "Template", "available_libraries", "check",
           "flops", "Limits", "default_knobs", "knob_space", "limits", "make_inputs", "min_bytes", "output_shape", "reference", "template_for", "tolerance"]


@dataclass(frozen=True)
class Limits:
    """What the templates' restrictions need from a DeviceProfile."""

    fingerprint: str
    vector_lanes: int
    vector_registers: int
    physical_cores: int
    caches: dict[str, int]


def limits(profile) -> Limits:
    """The template-facing view of a ``DeviceProfile`` (cache bytes per level, register file)."""
    isa = set(profile.isa)
    if profile.arch in ("x86_64", "amd64", "i686"):
        regs = 32 if "avx512f" in isa else 16
    else:
        regs = 32  # AArch64 NEON/SVE, and a safe guess elsewhere
    caches = {name: lvl.bytes for name, lvl in profile.caches.items()}
    caches.setdefault("L1d", 32 * 1024)
    caches.setdefault("L2", max(caches["L1d"] * 8, 256 * 1024))
    caches.setdefault("L3", caches["L2"])
    return Limits(profile.fingerprint, max(1, profile.vector_lanes_fp32), regs, max(1, profile.physical_cores), caches)


def knob_space(problem, lim) -> Space:
    """The knob space of a template node: a ``Problem``, or a fused MLP's layer tuple."""
    if isinstance(problem, tuple):
        return mlp.space(problem, lim)
    return TEMPLATES[problem.op].space(problem, lim)


def default_knobs(problem, lim) -> dict[str, Any]:
    """The setting a careful engineer would try first (the search starts here, measurements decide)."""
    v = max(x for x in (1, 4, 8, 16) if x <= lim.vector_lanes)
    if isinstance(problem, tuple):  # fused MLP layers
        # two column vectors x two K chains: four independent FMA chains, packed panels streamed once
        return {"vec": v, "jb": 2, "ksplit": 2, "unroll": 2, "w_layout": "packed", "threads": 1}
    op = problem.op
    if op == "gemv":
        return {"vec": v, "jb": 2, "ksplit": 2, "unroll": 2, "w_layout": "packed", "threads": 1}
    if op == "gemm":
        M, N, K = problem.dims
        big = M * N * K >= 2**22
        mr = max(x for x in (1, 2, 3, 4, 6, 8) if x <= max(1, M) and x * 2 + 3 <= lim.vector_registers)
        return {"vec": v, "mr": mr, "nv": 2, "unroll": 4, "pack_a": int(big), "pack_b": int(big), "order": "ji",
                "mc": 64, "kc": 256, "nc": 1024, "threads": lim.physical_cores if big else 1, "par": "n"}
    d = {"vec": v, "unroll": 2, "threads": 1}
    if op == "layernorm":
        d["passes"] = 2
    return d
