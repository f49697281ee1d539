#!/usr/bin/env bash
# The prepared GPU check (issue 15), for a bare H200 machine: at most 8 minutes.
#   1. the Triton templates' correctness tests, compiled for the GPU (tests/gpu with PLANFORGE_TEST_DEVICE=cuda);
#   2. bench/gpu_check.py: probe the GPU, then tune with the funnel on (budget 64 evaluations or 25 s of search a kernel,
#      20 s for the whole model, so that all six fit the 8 minutes: 120 s of tests at most, 350 s of tuning):
#      GEMM 4096^3 bf16, GEMM 16x4096x4096 bf16, the policy MLP at batch 1 in fp32 and bf16, causal attention
#      (batch 1, 16 heads, sequence 2048, head dim 64), each against its library baselines in the same process,
#      and the policy MLP as a whole-model workload (the graph level's plan lowered to Triton and torch) against
#      torch eager; one JSON of results.
# Wheels: planforge's needs that the GPU image lacks travel in .whl/ (bench/gpu_wheels.sh prepares them; docs/gpu.md).
# Output: $OUT/gpu_check.json, $OUT/gpu_tests.log, $OUT/gpu_check.log (or ./gpu-check-out when OUT is unset).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "error: the wheels in .whl/ did not install" >&2; exit 2; }
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
python3 - <<'PY' || exit 2
import importlib.util, sys
missing = [m for m in ("torch", "triton", "numpy", "scipy", "egglog", "lightgbm", "jsonschema", "rich", "typer", "jinja2")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"error: missing Python packages: {', '.join(missing)} (carry them as wheels in .whl/: docs/gpu.md)")
import torch, triton
print(f"torch {torch.__version__}, triton {triton.__version__}, GPU: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
if not torch.cuda.is_available():
    sys.exit("error: torch sees no CUDA device")
PY
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>/dev/null | tee "$out/nvidia-smi.csv"
echo "--- 1. template correctness on the GPU"
# the tests that prove CPU-side paths (the interpreter, the ahead-of-time compile) already ran in CI: skip them here
skip="not interpreter and not precompile and not compiles_for and not kernel_workload_takes"
# the whole-model tests that start a measuring worker or a whole tune: step 2 measures that path on the GPU itself
skip="$skip and not isolated_worker and not torch_module"
par=()
python3 -c "import xdist" 2>/dev/null && par=(-n 8)  # compiling is most of it: eight processes share the GPU
PLANFORGE_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -x "${par[@]}" -p no:cacheprovider tests/gpu -k "$skip" \
    2>&1 | tee "$out/gpu_tests.log"
tests=${PIPESTATUS[0]}
echo "--- 2. tuning against the libraries"
timeout 350 python3 bench/gpu_check.py --out "$out/gpu_check.json" --work "$out/work" --seconds 25 2>&1 | tee "$out/gpu_check.log"
check=${PIPESTATUS[0]}
rm -rf "$out/work"  # per-workload specs and records: the JSON holds the figures
echo "tests exit $tests, check exit $check"
[ "$tests" -eq 0 ] && [ "$check" -eq 0 ]
