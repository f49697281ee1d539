#!/usr/bin/env bash
# Prepare, on a machine with network access, the wheels bench/gpu_check.sh installs on a bare GPU machine whose
# python3 (3.12) has torch, triton, numpy, scipy, rich, typer, jinja2 and matplotlib but not planforge's other
# needs. They go to .whl/ (ignored by git: add `/.whl/` to .git/info/exclude); carry that folder to the machine.
# Usage: bash bench/gpu_wheels.sh [PYTHON_VERSION]   (default 3.12, the GPU image's)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
# egglog and what it imports at import time (graphviz, black and black's platformdirs, opentelemetry-api);
# lightgbm (the learned ranker); jsonschema and its parts (the spec schema)
wheels=(egglog==13.2.0 graphviz black platformdirs opentelemetry-api lightgbm jsonschema jsonschema-specifications
        referencing rpds-py)
mkdir -p .whl
plats=()
for n in 17 24 27 28 31 34 35; do plats+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    "${plats[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "${wheels[@]}"
ls -la .whl
du -sh .whl
