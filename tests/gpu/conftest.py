"""The GPU templates' tests: on a machine without a GPU (CI) they run in Triton's CPU interpreter.

``TRITON_INTERPRET=1`` must be set before a Triton kernel is defined, so it is set here, at
collection, unless ``PLANFORGE_TEST_DEVICE=cuda`` asks for the real GPU (``bench/gpu_check.sh``
sets it on the H200). Every test module skips itself, with the reason, only where triton is not
installed (``pip install -e '.[test]'`` installs it).
"""
from __future__ import annotations

import os

import pytest

DEVICE = "cuda" if os.environ.get("PLANFORGE_TEST_DEVICE") == "cuda" else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

NO_TRITON = "triton is not installed (pip install -e '.[test]'): the GPU templates cannot run, even in its interpreter"


@pytest.fixture
def device() -> str:
    """Where the kernels run: "cuda" on a GPU, "cpu" through Triton's interpreter."""
    return DEVICE
