import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, cwd=None, check=False, timeout=120, env=None):
    """Run ``python -m planforge ARGS`` in a subprocess; returns CompletedProcess."""
    e = {**os.environ, "COLUMNS": "200", **(env or {})}
    p = subprocess.run([sys.executable, "-m", "planforge", *map(str, args)], cwd=cwd, capture_output=True,
                       text=True, timeout=timeout, env=e)
    if check and p.returncode != 0:
        raise AssertionError(f"planforge {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture
def cli():
    return run_cli


# kernel workloads in tests (and the CLI subprocesses they start) accept a quick device profile
os.environ.setdefault("PLANFORGE_PROBE", "quick")


@pytest.fixture(scope="session")
def profile():
    from planforge.targets.cpu.probe import get_profile

    return get_profile(quick=True)


@pytest.fixture(scope="session")
def lim(profile):
    from planforge.targets.cpu.templates import limits

    return limits(profile)
