"""The cuda target: offline planning, clear errors without a GPU, the GPU model and the measuring path."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from planforge.costmodel.funnel import Analytic, Funnel
from planforge.targets import get_target
from planforge.targets.cuda import CudaTarget
from planforge.targets.cuda.devices import PUBLISHED, offline
from planforge.targets.cuda.problem import CudaProblem
from planforge.targets.cuda.templates import space
from planforge.targets.target import TargetError


def _no_gpu() -> bool:
    from planforge.targets.cuda.probe import no_gpu_reason

    return no_gpu_reason() is not None


@pytest.mark.skipif(not _no_gpu(), reason="this machine has a GPU: the no-GPU errors cannot show")
def test_without_a_gpu_the_target_fails_early_and_names_offline():
    t = get_target("cuda")
    p = t.problem("gemm", (64, 64, 64), "bias")
    with pytest.raises(TargetError, match="--offline"):
        t.kernel_backend(p)
    with pytest.raises(TargetError, match="--offline"):
        t.knob_space(p)


def test_offline_plans_with_published_figures():
    t = CudaTarget(offline="h200")
    prof = t.profile()
    assert prof.source == "published" and prof.sms == 132 and prof.hbm_bw == 4.8e12
    c = t.ceilings()
    assert c.kind == "gpu" and c.sms == 132
    assert c.flops_by_dtype["bf16"] > c.flops_by_dtype["tf32"] > c.flops_by_dtype["fp32"]
    assert c.peak_flops == pytest.approx(prof.flops["fp32"])  # the Ceilings view: SIMT fp32 over all SMs
    with pytest.raises(TargetError, match="offline"):
        t.kernel_backend(t.problem("gemm", (64, 64, 64)))
    with pytest.raises(TargetError, match="known: H100, H200, A100, L4"):
        CudaTarget(offline="X100")
    assert set(PUBLISHED) == {"H100", "H200", "A100", "L4"}


def test_problems_refuse_bad_input_clearly():
    t = CudaTarget(offline="H100")
    for args, msg in [(("conv", (1, 2)), "no template"), (("gemm", (4, 4)), "3 positive"),
                      (("gemm", (4, 4, 4), "bias_swish"), "unknown GEMM epilogue"),
                      (("gemm", (4, 4, 4), "bias:int8"), "unknown dtype"),
                      (("attention", (1, 1, 8, 48)), "head_dim"),
                      (("softmax", (4, 4), "bias"), "takes no epilogue")]:
        with pytest.raises(TargetError, match=msg):
            t.problem(*args)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shared_memory_restriction_follows_the_device(name):
    prof = offline(name)
    p = CudaProblem("gemm", (4096, 4096, 4096), dtype="bf16")
    sp = space(p, prof)
    ok = [c.as_dict() for c in sp.enumerate()]
    assert ok
    use = [k["num_stages"] * (k["BLOCK_M"] * k["BLOCK_K"] + k["BLOCK_K"] * k["BLOCK_N"]) * 2 for k in ok]
    assert max(use) <= prof.smem_per_block
    # a bigger shared memory admits deeper pipelines of big tiles
    assert any(u > offline("L4").smem_per_block for u in use) == (prof.smem_per_block > offline("L4").smem_per_block)


def test_default_knobs_are_valid_everywhere():
    for name in PUBLISHED:
        t = CudaTarget(offline=name)
        for p in [t.problem("gemm", (4096, 4096, 4096), "none:bf16"), t.problem("gemm", (16, 4096, 4096), "none:bf16"),
                  t.problem("gemm", (7, 9, 5)), t.problem("softmax", (8, 50)), t.problem("rmsnorm", (4, 8192), ":bf16"),
                  t.problem("eltwise", (3, 5), "relu"), t.mlp_problem([(256, 256, "relu"), (256, 32, "none")]),
                  t.problem("attention", (1, 16, 2048, 64), "none+causal:bf16")]:
            sp = t.knob_space(p)
            d = t.default_knobs(p)
            assert not sp.violations(d), (name, p.label, d, sp.violations(d))


def _model(t, p):
    sp = t.knob_space(p)
    return sp, t.cost_model(p, sp)


@pytest.mark.parametrize("problem", [
    ("gemm", (4096, 4096, 4096), "none:bf16"), ("gemm", (16, 4096, 4096), "bias_relu:bf16"),
    ("gemm", (300, 200, 100), "bias:fp32"), ("attention", (1, 16, 2048, 64), "none+causal:bf16"),
    ("softmax", (4096, 4096), "none:fp16"), ("eltwise", (64, 1024), "bias_gelu:bf16"),
])
def test_model_bound_stays_below_its_prediction_and_the_funnel_cuts(problem):
    t = CudaTarget(offline="H200")
    p = t.problem(*problem)
    sp, m = _model(t, p)
    assert isinstance(m, Analytic)
    screen = Funnel(m, top_k=0.1).screen(sp)
    n = screen.counts["restrictions"]
    assert screen.counts["top-k"] <= max(1, math.ceil(0.1 * n))
    cands = list(sp.enumerate())[:3000]
    e = m.estimate(cands)
    assert np.all(e.bound_s <= e.predicted_s)
    # the bound is the compulsory work at the whole GPU's peaks
    c = t.ceilings()
    floor = max(p.flops() / c.flops_by_dtype[p.dtype], p.min_bytes() / c.hbm_bw)
    assert np.allclose(e.bound_s, floor)
    assert e.row(0)["limiter"] in ("compute", "L1", "L2", "DRAM")


def test_model_sees_wave_quantisation_and_small_tiles():
    t = CudaTarget(offline="H100")
    sms = t.profile().sms
    rows = next(r for r in range(int(math.sqrt(sms)), 0, -1) if sms % r == 0)
    knobs = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 8, "num_stages": 3,
             "SPLIT_K": 1}
    # one wave of compute-bound (fp32) tiles, then a row of tiles more: the busiest SM runs two
    full = t.gpu_problem("gemm", (128 * rows, 128 * (sms // rows), 8192), "none", "fp32")
    more = t.gpu_problem("gemm", (128 * rows + 1, 128 * (sms // rows), 8192), "none", "fp32")
    (sa, ma), (sb, mb) = _model(t, full), _model(t, more)
    ta = ma.predict([sa.make(knobs)])[0]
    tb = mb.predict([sb.make(knobs)])[0]
    assert tb > 1.6 * ta
    # at 4096^3 bf16, 16x16 tiles stream operands far more often than 128x128 ones
    p = t.gpu_problem("gemm", (4096, 4096, 4096), "none", "bf16")
    sp, m = _model(t, p)
    knobs = {**knobs, "BLOCK_K": 64}
    small = {**knobs, "BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 2}
    assert m.predict([sp.make(small)])[0] > 3 * m.predict([sp.make(knobs)])[0]


def test_kernel_workload_takes_the_gpu_model_and_a_dtype_key():
    from planforge.workloads.kernels import kernel_workload

    pytest.importorskip("triton", reason="triton is not installed: the interpreter backend cannot start")
    t = CudaTarget(pinned=offline("H200"), device="cpu")
    wl = kernel_workload(t.gpu_problem("gemm", (20, 24, 40), "bias_relu", "bf16"), target=t)
    (task,) = wl.tasks
    assert task.key == "gemm_20x24x40_bias_relu_bf16"
    assert task.cost_model.name == "gpu-roofline"
    assert wl.manifest.dtypes["A"] == "bf16"
    task.backend.close()


def test_classify_launch_errors():
    from planforge.targets.cuda.job import _classify

    class OutOfResources(Exception):
        pass

    class CompilationError(Exception):
        pass

    assert _classify(OutOfResources("out of resource: shared memory, Required: 300000")) == ("constraints", False)
    assert _classify(CompilationError("at 12:4: unsupported")) == ("compile", False)
    assert _classify(RuntimeError("CUDA error: an illegal memory access was encountered")) == ("runtime", True)
    assert _classify(ValueError("something else")) == ("runtime", False)


def test_measuring_path_in_the_interpreter_with_a_library_baseline():
    """The whole measuring path but the GPU: isolated worker, correctness check, times, torch baseline, a
    wrong-result outcome. Times under the interpreter mean nothing."""
    pytest.importorskip("triton", reason="triton is not installed: the interpreter backend cannot start")
    from planforge.targets.cuda.backend import CudaBackend

    prof = offline("H200")
    p = CudaProblem("softmax", (3, 40), dtype="bf16")
    b = CudaBackend(p, prof, device="cpu")
    try:
        sp = space(p, prof)
        c = sp.make({"BLOCK": 64, "num_warps": 1})
        (o,) = b.measure([c])
        assert o.ok and len(o.times) >= 1, o.message
        libs = b.baselines()
        assert set(libs) == {"torch"} and libs["torch"].ok, libs["torch"].message
        outs, libs2 = b.remeasure([c], rounds=2)
        assert outs[0].ok and len(outs[0].times) >= 2  # both rounds' raw times pooled (at least one each)
        assert libs2["torch"].ok
        # a template job on a problem its knobs do not fit: the block misses most of the row
        bad = b._job("triton", {"BLOCK": 64, "num_warps": 1})
        bad["problem"] = CudaProblem("softmax", (3, 40), dtype="bf16").to_json()
        bad["knobs"] = {"BLOCK": 16, "num_warps": 1}
        o2 = b._run(bad)
        assert o2.ok  # a looped row is still right: the check passes
        prof_d = b.device_profile()
        assert prof_d["peak_flops_all"] == prof.flops["bf16"] and prof_d["cpu_model"] == prof.name
    finally:
        b.close()
    with pytest.raises(ValueError, match="known: torch, torch.compile"):
        CudaBackend(p, prof, device="cpu").baselines(["cublas"])


def test_probe_offline_on_the_command_line(cli):
    r = cli("probe", "--target", "cuda", "--offline", "H200")
    assert r.returncode == 0, r.stderr
    assert "NVIDIA H200" in r.stdout and "4.80 TB/s" in r.stdout and "published figures" in r.stdout
    r = cli("probe", "--target", "cpu", "--offline", "H200")
    assert r.returncode != 0 and "--target cuda" in r.stderr


def test_precompile_in_parallel_processes_reports_what_fails():
    pytest.importorskip("triton", reason="triton is not installed: the interpreter backend cannot start")
    from planforge.space import Space, categorical
    from planforge.targets.cuda.backend import CudaBackend

    p = CudaProblem("eltwise", (2, 40), "relu", dtype="fp16")
    b = CudaBackend(p, offline("L4"), device="cpu")
    # BLOCK 48 is no power of two: tl.arange refuses it, as the GPU compiler does
    sp = Space([categorical("BLOCK", (64, 48)), categorical("num_warps", (1,))])
    good, bad = sp.make({"BLOCK": 64, "num_warps": 1}), sp.make({"BLOCK": 48, "num_warps": 1})
    failed = b.precompile([good, bad], workers=1)  # one process: each one imports torch, slow on a small CI box
    assert set(failed) == {bad.fingerprint} and "power of 2" in failed[bad.fingerprint]
    b.close()
