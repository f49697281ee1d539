"""Every Triton template is correct on small shapes not divisible by its blocks, in every dtype.

On CI these run in Triton's interpreter (see conftest.py); on a GPU (``PLANFORGE_TEST_DEVICE=cuda``)
the same tests run the compiled kernels. Knob settings are few but chosen to cover each code path:
edge tiles, several K steps, split-K, grouped tile order, one-pass and looped rows.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]'): the GPU "
                                             "templates cannot run, even in its interpreter")

from planforge.targets.cuda import templates  # noqa: E402
from planforge.targets.cuda.devices import offline  # noqa: E402
from planforge.targets.cuda.problem import CudaProblem, check, parse  # noqa: E402

DTYPES = ("fp32", "tf32", "bf16", "fp16")
H200 = offline("H200")


def run(p: CudaProblem, knobs: dict, device: str) -> str | None:
    from planforge.targets.cuda.jit import run as jit

    inputs = p.inputs(seed=1)
    t = jit.tensors(p, inputs, device)
    out = jit.output(p, device)
    jit.launcher(p, knobs, t, out)()
    return check(p, inputs, out.float().cpu().numpy())


GEMM_KNOBS = [
    # edge tiles on both axes, several K steps, grouped order
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 4, "num_warps": 4, "num_stages": 2, "SPLIT_K": 1},
    # split K: two slices summed by the reduce kernel, which applies the epilogue
    {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 2, "num_stages": 1, "SPLIT_K": 2},
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("knobs", GEMM_KNOBS, ids=["grouped", "splitk"])
def test_gemm_every_dtype(dtype, knobs, device):
    p = parse("gemm", (37, 21, 50), "bias_gelu+res", dtype)
    assert run(p, knobs, device) is None


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("knobs", GEMM_KNOBS, ids=["grouped", "splitk"])
def test_gemm_whole_k_steps(dtype, knobs, device):
    # K a multiple of every slice's BLOCK_K steps: the loads drop their K mask (EVEN_K)
    p = parse("gemm", (37, 21, 64), "bias_relu", dtype)
    assert run(p, knobs, device) is None


@pytest.mark.parametrize("epilogue", ["none", "bias", "bias_relu", "bias_sigmoid", "bias_silu", "bias_tanh"])
def test_gemm_epilogues(epilogue, device):
    p = parse("gemm", (19, 33, 24), epilogue, "bf16")
    assert run(p, GEMM_KNOBS[0], device) is None


def test_gemm_one_row(device):
    # the GEMV case a batch-1 layer is: M = 1 in a 16-row tile
    p = parse("gemv", (40, 70), "bias_relu", "fp32")
    assert p.dims == (1, 40, 70)
    assert run(p, {**GEMM_KNOBS[0], "GROUP_M": 1}, device) is None


def test_gemm_sampled_settings_of_its_space(device):
    """Settings the search would propose (sampled from the real space) are correct too."""
    p = parse("gemm", (24, 40, 48), "bias", "fp16")
    sp = templates.space(p, H200)
    rng = random.Random(3)
    small = [c for c in (sp.sample(rng) for _ in range(200))
             if c["BLOCK_M"] * c["BLOCK_N"] * c["BLOCK_K"] <= 32 * 64 * 32]
    assert len({c.fingerprint for c in small}) >= 2
    for c in list({c.fingerprint: c for c in small}.values())[:2]:
        assert run(p, c.as_dict(), device) is None, c


@pytest.mark.parametrize("op", ["softmax", "layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rowwise(op, dtype, device):
    p = CudaProblem(op, (3, 75), dtype=dtype)
    assert run(p, {"BLOCK": 128, "num_warps": 2}, device) is None  # one pass: the row in registers
    assert run(p, {"BLOCK": 32, "num_warps": 1}, device) is None   # looped: 3 chunks, the last one partial


@pytest.mark.parametrize("dtype", DTYPES)
def test_eltwise_chain(dtype, device):
    p = CudaProblem("eltwise", (5, 37), "bias_gelu_add_tanh", dtype=dtype)
    assert run(p, {"BLOCK": 64, "num_warps": 2}, device) is None


@pytest.mark.parametrize("dtype", ["fp32", "tf32", "bf16"])
def test_fused_mlp(dtype, device):
    p = CudaProblem("mlp", dtype=dtype, layers=((40, 24, "relu"), (24, 36, "gelu"), (36, 5, "none")))
    assert run(p, {"BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 2}, device) is None


def test_fused_mlp_one_layer(device):
    p = CudaProblem("mlp", layers=((20, 7, "silu"),))
    assert run(p, {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 1}, device) is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention(dtype, causal, device):
    p = CudaProblem("attention", (1, 2, 37, 16), dtype=dtype, causal=causal)
    assert run(p, {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}, device) is None


def test_the_check_catches_a_wrong_result():
    """The tolerance fails a dropped tile and a scaled result, in bf16 too (it allows a unit of bf16 per
    unfused library step, so it is not tighter than that)."""
    p = parse("gemm", (32, 32, 64), "bias", "bf16")
    inputs = p.inputs()
    ref = p.reference(inputs)
    assert check(p, inputs, ref) is None
    dropped = ref.copy()
    dropped[16:, 16:] = 0.0
    assert "wrong result" in check(p, inputs, dropped)
    off = ref * (1 + 2.0**-3)  # an eighth off everywhere (a lost K slice of eight, say)
    assert "wrong result" in check(p, inputs, off)
    nan = ref.copy()
    nan[0, 0] = np.nan
    assert "non-finite" in check(p, inputs, nan)


def test_every_template_compiles_for_hopper_and_ampere():
    """The interpreter skips the GPU compiler; Triton's ahead-of-time path runs it (to PTX and a cubin)
    for sm_90 and sm_80 without a GPU, so a kernel that only the real compiler refuses fails here."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("aot_compile.py")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert len(rows) == 8, r.stdout + r.stderr[-3000:]
    bad = [row for row in rows if not row["ok"]]
    assert not bad and r.returncode == 0, bad


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_libraries_pass_the_check_and_a_tenth_off_does_not(dtype):
    """torch's unfused formulations (each step rounded to the dtype) are within the tolerance, and a
    result a tenth off is not: the tolerance sits between the two."""
    from planforge.targets.cuda.jit.run import tensors
    from planforge.targets.cuda.job import library_fn

    probs = [parse("gemm", (48, 40, 512), "bias_gelu+res", dtype)]
    if dtype != "fp16":
        probs.append(CudaProblem("mlp", dtype=dtype, layers=((64, 64, "relu"), (64, 64, "relu"), (64, 16, "none"))))
    for p in probs:
        inputs = p.inputs()
        y = library_fn("torch", p, tensors(p, inputs, "cpu"))().float().numpy()
        assert check(p, inputs, y) is None, p.label
        ref = p.reference(inputs)
        if p.op == "gemm" or dtype != "bf16":  # a bf16 MLP's stored layers allow more than a tenth at places
            assert check(p, inputs, ref * 1.1) is not None, p.label
