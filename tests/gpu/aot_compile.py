"""Compile every Triton template for real GPUs (sm_90: H100/H200, sm_80: A100) without one: Triton's
ahead-of-time path (``triton.compile`` with a ``GPUTarget``) runs the whole GPU pipeline (TTIR, TTGIR,
LLVM IR, PTX and ptxas's cubin), which the interpreter does not. Run as a script, in a process without
``TRITON_INTERPRET`` (under it ``triton.jit`` makes interpreted functions, which do not compile).
Prints one JSON line per kernel: its name, target, shared memory and whether a cubin came out."""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from planforge.targets.cuda.jit import attention, eltwise, gemm, mlp, rowwise  # noqa: E402


def sig(ptrs: dict, ints: list[str], floats: list[str], const: dict) -> dict:
    s = {k: f"*{v}" for k, v in ptrs.items()}
    s.update({k: "i32" for k in ints})
    s.update({k: "fp32" for k in floats})
    s.update({k: "constexpr" for k in const})
    return s


GEMM_INTS = ["M", "N", "K", "sam", "sak", "sbk", "sbn", "scm", "scn", "srm", "srn", "k_per_split"]


def cases():
    bf = {"A": "bf16", "B": "bf16", "C": "bf16", "bias": "bf16", "R": "bf16"}
    c = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, SPLIT=False, HAS_BIAS=True, ACT=2, HAS_RES=True,
             PRECISION="tf32", WIDEN=False, EVEN_K=True)
    yield "gemm bf16 bias_gelu+res", gemm._gemm, sig(bf, GEMM_INTS, [], c), c, 90, {"num_warps": 8, "num_stages": 3}
    f32 = {k: "fp32" for k in bf}
    c = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=1, SPLIT=True, HAS_BIAS=False, ACT=0, HAS_RES=False,
             PRECISION="ieee", WIDEN=False, EVEN_K=False)
    yield "gemm fp32 split-K partials", gemm._gemm, sig(f32, GEMM_INTS, [], c), c, 80, {"num_warps": 4, "num_stages": 4}
    c = dict(SPLIT_K=4, BLOCK=1024, HAS_BIAS=True, ACT=1, HAS_RES=False)
    yield "gemm split-K reduce", gemm._reduce, sig({"W": "fp32", "C": "fp32", "bias": "fp32", "R": "fp32"},
                                                   ["M", "N", "scm", "scn", "srm", "srn"], [], c), c, 80, {"num_warps": 4}
    c = dict(KIND=1, BLOCK=1024, ONE_PASS=False)
    yield "layernorm looped bf16", rowwise._row, sig({"X": "bf16", "Y": "bf16", "G": "bf16", "Bt": "bf16"},
                                                     ["cols", "sx", "sy"], ["eps"], c), c, 90, {"num_warps": 4}
    c = dict(KIND=0, BLOCK=4096, ONE_PASS=True)
    yield "softmax one pass fp16", rowwise._row, sig({"X": "fp16", "Y": "fp16", "G": "fp16", "Bt": "fp16"},
                                                     ["cols", "sx", "sy"], ["eps"], c), c, 80, {"num_warps": 8}
    c = dict(S0=100, S1=2, S2=101, S3=0, S4=0, S5=0, BLOCK=1024)
    yield "eltwise bias_gelu_add", eltwise._eltwise, sig({"X": "bf16", "Y": "bf16", "bias": "bf16", "R": "bf16"},
                                                        ["n", "cols"], [], c), c, 90, {"num_warps": 4}
    c = dict(NL=3, HMAX=256, BLOCK_N=64, BLOCK_K=64)
    yield "fused mlp fp32", mlp._mlp, sig({"X": "fp32", "Y": "fp32", "H": "fp32", "Wcat": "fp32", "Bcat": "fp32",
                                           "meta": "i32"}, [], [], c), c, 90, {"num_warps": 4}
    c = dict(H=16, D=64, BLOCK_M=128, BLOCK_N=64, CAUSAL=True, PRECISION="tf32", WIDEN=False)
    yield "attention causal bf16", attention._attn, sig({"Q": "bf16", "K": "bf16", "V": "bf16", "O": "bf16"},
                                                        ["S", "sb", "sh", "ss"], ["qk_scale"], c), c, 90, \
        {"num_warps": 4, "num_stages": 3}


def main() -> int:
    bad = 0
    only = sys.argv[1:]
    for name, fn, signature, const, cap, opts in cases():
        if only and not any(o in name for o in only):
            continue
        t0 = time.perf_counter()
        try:
            k = triton.compile(ASTSource(fn, signature, const), target=GPUTarget("cuda", cap, 32), options=opts)
            row = {"kernel": name, "sm": cap, "ok": "cubin" in k.asm, "shared": k.metadata.shared,
                   "seconds": round(time.perf_counter() - t0, 1)}
        except Exception as e:  # noqa: BLE001 - reported, and the exit status says so
            row = {"kernel": name, "sm": cap, "ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        bad += not row["ok"]
        print(json.dumps(row), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
