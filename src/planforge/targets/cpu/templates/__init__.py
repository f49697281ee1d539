"""CPU kernel templates (C, compiled with the system compiler) and library baselines.

A ``Template`` ties a kernel problem kind (``gemm``, ``gemv``, ``softmax``,
``layernorm``, ``eltwise``, ``mlp``) to its knob space and restrictions, its
first setting, its C source generator and its ctypes binding. Each template
module also holds its problem kind's facts (``FACTS``: inputs, fp64
reference, tolerance, FLOPs, numpy and torch baselines), which ``problem``
looks up by kind. Every template is bound the same way:
``bind(lib, problem, knobs, inputs, out) -> run()``, with ``inputs`` named as
``make_inputs`` names them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ....ops.kernel import MlpProblem, Problem, ProblemError, gemm_residual, problem_from_json
from ....space import Space
from . import attention, conv, gemm, gemv, irb, mlp, qgemv, rowwise
from .problem import LIBRARIES, OPS, available_libraries, check, flops, make_inputs, min_bytes, output_shape, \
    reference, tolerance


@dataclass(frozen=True)
class Limits:
    """What the templates' restrictions need from a DeviceProfile."""

    fingerprint: str
    vector_lanes: int
    vector_registers: int
    physical_cores: int
    caches: dict[str, int]
    # vector widths (int32 lanes) with an exact u8 x s8 dot product of 4: one VNNI instruction, or (AVX2 at 8
    # lanes) int16 widening and multiply-adds of pairs; ``dot_i8_vnni``: whether every one of them is VNNI
    dot_i8_lanes: tuple[int, ...] = ()
    dot_i8_vnni: bool = False


@dataclass(frozen=True)
class Template:
    """A parameterised kernel for one problem kind.

    ``space(problem, limits)``: its knobs and restrictions on this machine;
    ``defaults(problem, limits)``: the setting a careful engineer would try
    first (the search starts there, measurements decide); ``source(problem,
    knobs)``: the C; ``bind(lib, problem, knobs, inputs, out)``: the compiled
    kernel bound to its arrays, as a no-argument call."""

    name: str
    space: Callable[[Any, Limits], Space]
    source: Callable[[Any, dict], str]
    bind: Callable[..., Callable[[], None]]
    defaults: Callable[[Any, Limits], dict[str, Any]] | None = None  # None: each knob's first value
    registry: str = "planforge.targets.cpu.templates"  # module whose TEMPLATES holds it (workers look it up there)
    openmp_threads: bool = True  # threads > 1 means OpenMP (-fopenmp); False: the template runs its own threads
    # (key, make) where make() gives the inputs a candidate really computes with, to check it against (quantised
    # weights dequantised), the key naming them for caching; None: the inputs themselves
    reference_inputs: Callable[[Any, dict, dict], "tuple[str, Callable[[], dict]] | None"] | None = None
    # the quantised variants its candidates may take on a machine (``planforge.quant.variant``); None: fp32 only
    variants: Callable[[Limits], tuple[str, ...]] | None = None
    # a plan step's operands (e-node order) -> the named inputs ``bind`` takes; None: the plan names them by kind
    plan_inputs: Callable[[Any, list], dict] | None = None

    def openmp(self, knobs: dict) -> bool:
        return self.openmp_threads and knobs.get("threads", 1) > 1


def _vec(lim: Limits) -> int:
    return max(x for x in (1, 4, 8, 16) if x <= lim.vector_lanes)


def _gemm_defaults(p: Problem, lim: Limits) -> dict[str, Any]:
    M, N, K = p.dims
    big = M * N * K >= 2**22
    mr = max(x for x in (1, 2, 3, 4, 6, 8) if x <= max(1, M) and x * 2 + 3 <= lim.vector_registers)
    return {"vec": _vec(lim), "mr": mr, "nv": 2, "unroll": 4, "pack_a": int(big), "pack_b": int(big), "order": "ji",
            "mc": 64, "kc": 256, "nc": 1024, "threads": lim.physical_cores if big else 1, "par": "n", "pf": 0}


def _gemv_defaults(p, lim: Limits) -> dict[str, Any]:
    # two column vectors x two K chains: four independent FMA chains, packed panels streamed once
    return {"vec": _vec(lim), "jb": 2, "ksplit": 2, "unroll": 2, "w_layout": "packed", "threads": 1}


def _row_defaults(p: Problem, lim: Limits) -> dict[str, Any]:
    d = {"vec": _vec(lim), "unroll": 2, "threads": 1}
    if p.op == "layernorm":
        d["passes"] = 2
    return d


TEMPLATES: dict[str, Template] = {
    "gemm": Template(
        "gemm",
        space=lambda p, lim: gemm.space(*p.dims, lim),
        defaults=_gemm_defaults,
        source=lambda p, k: gemm.source(k, p.epilogue),
        bind=lambda lib, p, k, i, out: gemm.bind(lib, k, i["A"], i["B"], i.get("bias"), out, i.get("B_const", False),
                                                 i.get("res")),
        reference_inputs=lambda p, k, i: qgemv.reference_inputs(k, i, "B"),
        variants=lambda lim: qgemv.variants(lim, activations=False),  # B widened as it is packed: fp32 A
        openmp_threads=False,  # its threads claim their slices (templates/parfor.py): no OpenMP team to wait for
    ),
    "gemv": Template(
        "gemv",
        space=lambda p, lim: gemv.space(*p.dims, lim),
        defaults=_gemv_defaults,
        source=lambda p, k: (qgemv.source if qgemv.quantised(k) else gemv.source)(k, p.epilogue),
        bind=lambda lib, p, k, i, out: (qgemv.bind if qgemv.quantised(k) else gemv.bind)(
            lib, k, i["x"], i["W"], i.get("bias"), out),
        reference_inputs=lambda p, k, i: qgemv.reference_inputs(k, i, "W"),
        variants=qgemv.variants,
        openmp_threads=False,  # its threads claim panels (templates/parfor.py): no OpenMP team to wait for
    ),
    "mlp": Template(
        "mlp",
        space=lambda p, lim: mlp.space(p.layers, lim, p.shared),
        defaults=lambda p, lim: mlp.defaults(p.layers, lim, p.shared),
        source=lambda p, k: mlp.source(p.layers, k),
        bind=lambda lib, p, k, i, out: mlp.bind(lib, p.layers, k, i["x"], i["weights"], i["biases"], out),
        openmp_threads=False,  # its threads are its own persistent pool (templates/pool.py)
        variants=mlp.variants,
    ),
    **{op: Template(
        op,
        space=lambda p, lim: rowwise.space(p.op, *p.dims, lim),
        defaults=_row_defaults,
        source=lambda p, k: rowwise.source(p.op, k, p.epilogue),
        bind=lambda lib, p, k, i, out: rowwise.bind(
            lib, k, i["x"], out, i.get("gamma", i.get("bias")), i.get("beta", i.get("res"))),
        openmp_threads=False,  # rows claimed in chunks (templates/parfor.py)
    ) for op in ("softmax", "layernorm", "eltwise")},
    "rms": Template("rms", space=lambda p, lim: rowwise.space(p.op, *p.dims, lim), defaults=_row_defaults,
                    source=lambda p, k: rowwise.source(p.op, k),
                    bind=lambda lib, p, k, i, out: rowwise.bind(lib, k, i["x"], out.reshape(p.dims), i["eps"]),
                    plan_inputs=lambda p, ins: {"x": ins[0].reshape(p.dims), "eps": ins[1]},
                    openmp_threads=False),
    **{op: Template(op, space=conv.space, defaults=conv.defaults, source=conv.source, bind=conv.bind,
                    plan_inputs=conv.plan_inputs, openmp_threads=False)  # rows / blocks claimed (parfor)
       for op in ("conv", "dwconv")},
    "irb": Template("irb", space=irb.space, defaults=irb.defaults, source=irb.source, bind=irb.bind,
                    plan_inputs=irb.plan_inputs, openmp_threads=False),  # work items claimed (parfor)
    "attention": Template("attention", space=attention.space, defaults=attention.defaults, source=attention.source,
                          bind=attention.bind, plan_inputs=attention.plan_inputs,
                          openmp_threads=False),  # (head, query block) tasks claimed (templates/parfor.py)
    "rope": Template("rope", space=attention.rope_space, defaults=attention.rope_defaults,
                     source=attention.rope_source, bind=attention.rope_bind, plan_inputs=attention.rope_plan_inputs,
                     openmp_threads=False),  # rows claimed (templates/parfor.py)
    "swap12": Template("swap12", space=attention.swap_space, source=attention.swap_source, bind=attention.swap_bind,
                       plan_inputs=lambda p, ins: {"x": ins[0]}, openmp_threads=False),  # rows claimed (parfor)
    "slab": Template("slab", space=attention.slab_space, source=attention.slab_source, bind=attention.slab_bind,
                     plan_inputs=lambda p, ins: {"x": ins[0]}, openmp_threads=False),  # blocks claimed (parfor)
}


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
    lanes = max(1, profile.vector_lanes_fp32)
    # AVX-512 VNNI at 16 lanes (8 too, with VL), AVX-VNNI at 8: where the view of the ISA has them; else AVX2's
    # int16 multiply-add at 8 (qgemv.DOT)
    vnni = tuple(v for v, flags in ((16, ("avx512_vnni",)), (8, ("avx_vnni", "avx512_vnni")))
                 if v <= lanes and isa & set(flags) and (v == 8 or "avx512f" in isa))
    dot = vnni or ((8,) if lanes >= 8 and "avx2" in isa else ())
    return Limits(profile.fingerprint, lanes, regs, max(1, profile.physical_cores), caches, dot, bool(vnni))


def knob_space(problem, lim: Limits) -> Space:
    """The knob space of a problem (a ``Problem`` or an ``MlpProblem``) on a machine with limits ``lim``."""
    return TEMPLATES[problem.op].space(problem, lim)


def quant_variants(problem, lim: Limits) -> tuple[str, ...]:
    """The quantised variants (fp32, bf16, int8, int8+a8, int4:32...) the template of ``problem`` runs here."""
    t = TEMPLATES[problem.op]
    if t.variants is None or gemm_residual(getattr(problem, "epilogue", ""))[1]:  # a residual GEMM: fp32 only
        return ("fp32",)
    return t.variants(lim)


def quant_space(problem, lim: Limits, variants: tuple[str, ...]) -> Space:
    """The knob space of a problem with the weight format as a gene among ``variants`` (those the accuracy budget
    allows, which its template must run); ``ProblemError`` for a variant its template does not run."""
    extra = [v for v in variants if v not in quant_variants(problem, lim)]
    if extra:
        raise ProblemError(f"the {problem.op} template runs {', '.join(quant_variants(problem, lim))}, not "
                           f"{', '.join(extra)}")
    space = TEMPLATES[problem.op].space(problem, lim)
    if not set(variants) - {"fp32"}:
        return space
    if problem.op == "mlp":  # a format per layer
        return mlp.with_formats(space, problem.layers, tuple(variants), lim.dot_i8_lanes, lim.dot_i8_vnni)
    # a quantised GEMM's B is widened into panels per call, which its micro-kernel reads from the caches: no prefetch
    return qgemv.with_formats(space, tuple(variants), lim.dot_i8_lanes,
                              "pack_b == 1 and pf == 0" if problem.op == "gemm" else "w_layout == 'packed'",
                              lim.dot_i8_vnni)


def default_knobs(problem, lim: Limits) -> dict[str, Any]:
    """The setting a careful engineer would try first (the search starts here, measurements decide)."""
    t = TEMPLATES[problem.op]
    if t.defaults is None:
        return {k.name: k.values[0] for k in t.space(problem, lim).knobs}
    return t.defaults(problem, lim)


__all__ = ["LIBRARIES", "Limits", "MlpProblem", "OPS", "Problem", "ProblemError", "TEMPLATES", "Template",
           "available_libraries", "check", "default_knobs", "flops", "knob_space", "limits", "make_inputs",
           "min_bytes", "output_shape", "problem_from_json", "quant_space", "quant_variants", "reference", "tolerance"]
