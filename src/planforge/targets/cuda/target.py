"""The CUDA Target: a GPU's profile (probed, or published figures offline), the Triton templates,
the GPU analytic model, and the isolated kernel backend.

Without a GPU the target still plans: ``CudaTarget(offline="H200")`` (or
``PLANFORGE_CUDA_OFFLINE=H200``) takes the published figures of that part,
so the knob spaces, the analytic model and the funnel all run
(``planforge probe --target cuda --offline H200``); asking it to measure is
a ``TargetError`` that says so. Without a GPU and without ``offline``, every
request that needs the device fails early with the reason (no torch, no
CUDA device, no triton) instead of deep inside a worker.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ...measure import TimingConfig
from ...space import Space
from ..target import TargetError
from . import templates
from .devices import DeviceError, GpuProfile, offline as published
from .model import GpuCeilings, GpuModel, gpu_ceilings
from .problem import CudaProblem, ProblemError, from_kernel, parse

OFFLINE_ENV = "PLANFORGE_CUDA_OFFLINE"
ENUMERATE_BELOW = 100_000  # knob spaces up to this many raw points have their valid points listed up front


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


@dataclass
class CudaTarget:
    """One CUDA GPU (the first one torch sees), or a published part for planning offline.

    Parameters:
        offline: the name of a part in ``devices.PUBLISHED`` (``H100``, ``H200``, ``A100``, ``L4``) to plan
            for with its published figures, measuring nothing (default None: ``$PLANFORGE_CUDA_OFFLINE``,
            else this machine's GPU).
        pinned: a ``GpuProfile`` to use as is (tests; default None).
        timing: the measurement protocol (default None: ``backend.cuda_timing``, L2 flushed between repeats).
        device: where kernels run: ``"cuda"`` (default) or ``"cpu"`` (Triton's interpreter: the tests
            prove the measuring path on a machine without a GPU; the times mean nothing).
    """

    offline: str | None = None
    pinned: GpuProfile | None = None
    timing: TimingConfig | None = None
    device: str = "cuda"
    name: str = "cuda"
    pin_cores: bool = False  # the host thread waits for the GPU: measuring slots need no cores of their own
    _ceilings: GpuCeilings | None = field(default=None, init=False, repr=False)
    _spaces: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        if self.offline is None:
            self.offline = os.environ.get(OFFLINE_ENV) or None
        if self.offline is not None and self.pinned is None:
            try:
                self.pinned = published(self.offline)
            except DeviceError as e:
                raise TargetError(str(e)) from None

    # -- the device ----------------------------------------------------------------
    @property
    def cold(self) -> bool:
        return self.timing is None or self.timing.flush_bytes > 0

    def _need_gpu(self, what: str) -> None:
        if self.device == "cpu":
            return
        if self.offline is not None:
            raise TargetError(f"the cuda target plans offline for the {self.offline} (published figures): it "
                              f"cannot {what}; run on a machine with that GPU, without --offline")
        from .probe import no_gpu_reason

        why = no_gpu_reason()
        if why:
            raise TargetError(f"the cuda target cannot {what}: {why}. To plan for a GPU without one, use its "
                              f"published figures: --offline H100|H200|A100|L4 (planforge probe, "
                              f"bench/gpu_check.py --plan) or {OFFLINE_ENV}=H200")

    @property
    def fingerprint(self) -> str:
        if self.pinned is not None:
            return self.pinned.fingerprint
        from .probe import driver_facts, no_gpu_reason

        if self.device == "cpu" or no_gpu_reason():
            return "cuda-unavailable"  # nothing is measured under this name: every measuring request fails first

        f = driver_facts()
        return GpuProfile(f["name"], tuple(f["capability"]), f["sms"], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, {},
                          0).fingerprint

    def profile(self, force: bool = False, quick: bool | None = None,
                progress: Callable[[str], None] | None = None) -> GpuProfile:
        """The GPU's profile: the pinned or published one, else probed (cached; ``force`` probes again;
        ``quick`` None follows ``PLANFORGE_PROBE=quick``)."""
        if self.pinned is not None and not (force and self.offline is None and self.device == "cuda"):
            return self.pinned
        self._need_gpu("probe a GPU")
        from .probe import get_profile

        q = os.environ.get("PLANFORGE_PROBE", "") == "quick" if quick is None else quick
        try:
            self.pinned = get_profile(force=force, quick=q, progress=progress)
        except DeviceError as e:
            raise TargetError(str(e)) from None
        self._ceilings, self._spaces = None, {}
        return self.pinned

    def describe(self) -> dict[str, Any]:
        d = {"target": self.name, "templates": sorted(templates_ops()), "libraries": self.libraries()}
        if self.offline is not None:
            d["offline"] = self.offline
        if self.pinned is not None:
            d["fingerprint"] = self.pinned.fingerprint
        return d

    def facts(self, profile: GpuProfile | None) -> list[tuple[str, str]]:
        if profile is None:
            return [("target", "a CUDA GPU: Triton templates measured in isolated workers")]
        p = profile
        rates = ", ".join(f"{dt} {v / 1e12:.1f}" for dt, v in p.flops.items())
        src = "published figures (offline: nothing measured)" if p.source == "published" else \
            f"measured {p.measured_at}{' (quick)' if p.quick else ''}"
        return [
            ("GPU", f"{p.name}, compute capability {p.capability[0]}.{p.capability[1]}, {p.sms} SMs at "
                    f"{p.clock_hz / 1e9:.2f} GHz"),
            ("memory", f"{_size(p.memory_bytes)}; HBM {p.hbm_bw / 1e12:.2f} TB/s, L2 {_size(p.l2_bytes)} at "
                       f"{p.l2_bw / 1e12:.2f} TB/s"),
            ("shared memory", f"{_size(p.smem_per_block)} per block, {_size(p.smem_per_sm)} per SM"),
            ("registers", f"{p.regs_per_sm} per SM; {p.max_threads_per_sm} threads and {p.max_blocks_per_sm} "
                          "blocks resident per SM"),
            ("peak TFLOP/s", rates),
            ("launch overhead", f"{p.launch_s * 1e6:.1f} us"),
            ("source", src),
            *(("note", n) for n in p.notes),
        ]

    def ceilings(self) -> GpuCeilings:
        if self._ceilings is None:
            self._ceilings = gpu_ceilings(self.profile())
        return self._ceilings

    # -- the templates ---------------------------------------------------------------
    def problem(self, op: str, dims: Sequence[int], epilogue: str = "none") -> CudaProblem:
        """A problem for one of the Triton templates, in fp32 unless ``epilogue`` says otherwise: it may
        carry ``+res``, ``+causal`` and ``:DTYPE`` (``bias_gelu+res:bf16``), see ``problem.parse``."""
        return self.gpu_problem(op, dims, epilogue)

    def gpu_problem(self, op: str, dims: Sequence[int], epilogue: str = "none", dtype: str = "fp32",
                    residual: bool = False, causal: bool = False) -> CudaProblem:
        """``problem`` with the GPU's own parameters spelled out: the input ``dtype`` (fp32, tf32, bf16,
        fp16; default fp32), a GEMM's ``residual`` and attention's ``causal`` mask (default False)."""
        try:
            return parse(op, dims, epilogue, dtype, residual, causal)
        except (ProblemError, ValueError) as e:
            raise TargetError(str(e)) from None

    def mlp_problem(self, layers: Sequence[tuple[int, int, str]], dtype: str = "fp32") -> CudaProblem:
        """The batch-1 fused MLP of ``layers`` ((K, N, act), ...) in ``dtype``."""
        try:
            return CudaProblem("mlp", (), "none", dtype, layers=tuple((int(k), int(n), str(a)) for k, n, a in layers))
        except ProblemError as e:
            raise TargetError(str(e)) from None

    def gpu(self, problem) -> CudaProblem:
        """``problem`` as a GPU problem: a ``CudaProblem`` as is, a target-neutral kernel problem (what the
        e-graph analysis makes of a template node: ``ops.kernel.Problem``, ``MlpProblem``) in fp32.
        ``TargetError`` where no Triton template runs it."""
        try:
            return from_kernel(problem)
        except (ProblemError, ValueError) as e:
            what = problem if isinstance(problem, dict) else problem.to_json()
            raise TargetError(f"no Triton template runs {what}: {e}") from None

    def knob_space(self, problem) -> Space:
        """The knob space of ``problem``'s template, its valid points enumerated once (the restrictions leave
        few at a graph's small shapes, where drawing them by rejection would be slow); cached per problem."""
        p = self.gpu(problem)
        sp = self._spaces.get(p)
        if sp is None:
            sp = self._spaces[p] = templates.space(p, self.profile())
            if sp.size <= ENUMERATE_BELOW:
                sp.valid_ints()
        return sp

    def default_knobs(self, problem) -> dict[str, Any]:
        return templates.defaults(self.gpu(problem), self.profile())

    def flops(self, problem) -> float:
        return self.gpu(problem).flops()

    def input_shapes(self, problem) -> dict[str, list[int]]:
        return {k: list(v) for k, v in self.gpu(problem).input_shapes().items()}

    def libraries(self) -> list[str]:
        from .backend import DEFAULT_LIBRARIES

        return list(DEFAULT_LIBRARIES)

    def cost_model(self, problem, space: Space) -> GpuModel:
        """The GPU analytic model of ``problem`` over ``space`` (the funnel's, and the ranker of a graph's
        template nodes), on this target's ceilings."""
        return GpuModel(self.gpu(problem), self.ceilings(), space, cold=self.cold)

    def task_key(self, problem: CudaProblem) -> str:
        """The task key of a kernel workload: op, shape, epilogue, flags and dtype (``gemm_16x4096x4096_none_bf16``)."""
        return problem.label

    def input_dtypes(self, problem: CudaProblem) -> dict[str, str]:
        return {k: problem.dtype for k in problem.input_shapes()}

    # -- the backends ------------------------------------------------------------------
    def kernel_backend(self, problem: CudaProblem, seed: int = 0, constant_weights: bool = False,
                       cold_weights: bool = False):
        """(``constant_weights``: the GPU kernels read every operand as passed, prepared or not: no difference;
        ``cold_weights``: ignored, this target's timing says whether its L2 is flushed.)"""
        self._need_gpu("measure kernels")
        from .backend import CudaBackend

        return CudaBackend(problem, self.profile(), timing=self.timing, seed=seed, device=self.device)

    def graph_backend(self, graph, genome, seed: int = 0, accuracy: dict | None = None, cold_weights: bool = False):
        """Measures whole plans of ``genome`` on the GPU (``graph.CudaGraphBackend``); the timing is this
        target's, else the GPU protocol with hot caches (weights stay in L2 between calls). Its templates read
        fp32 weights only: an ``accuracy`` budget is refused."""
        if accuracy is not None:
            raise TargetError("the cuda target's templates read fp32 weights only: it takes no accuracy budget")
        self._need_gpu("measure whole-model plans")
        from .graph import CudaGraphBackend

        return CudaGraphBackend(graph, genome, self.profile(), timing=self.timing, seed=seed, device=self.device)

    def peak_bytes(self, graph, program: list[dict[str, Any]]) -> int:
        from .plan import peak_bytes_of

        return peak_bytes_of(graph, program)

    def plan(self, graph, program: list[dict[str, Any]] | None, inputs: dict[str, Any] | None = None,
             shared: Any = None):
        """``program`` (a spec's steps) lowered to Triton templates and torch steps on this GPU and bound to
        ``graph``'s weights; None: the torch-eager baseline. ``TargetError`` names the first step that does
        not bind. ``inputs`` (a chain's earlier outputs) and ``shared`` (a host arena) are ignored: the plan
        copies its inputs, and its values live on the GPU."""
        self._need_gpu("run a plan")
        from ..cpu.plan import PlanError
        from .plan import CudaPlan, TorchPlan

        if program is None:
            return TorchPlan(graph, self.device)
        try:
            return CudaPlan(graph, program, self.device)
        except PlanError as e:
            raise TargetError(str(e)) from None


def templates_ops() -> tuple[str, ...]:
    from .problem import OPS

    return tuple(OPS)


__all__ = ["CudaTarget", "OFFLINE_ENV"]
