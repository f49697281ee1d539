"""The fault-injection suite's fixtures: one local Ray cluster per test module, and the summary lines."""
import os
import shutil
import sys
import tempfile

import pytest

from .faultkit import SUMMARY, TESTS


def pytest_terminal_summary(terminalreporter):
    if SUMMARY:
        terminalreporter.section("fault injection: injected, survived, records lost")
        for line in SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def ray_address():
    """A Ray cluster of this machine (2 CPUs), started for the module and shut down after it."""
    try:
        import ray
    except ImportError:
        print("\nray is not installed: the Ray fault tests are skipped (pip install 'planforge[ray]')", file=sys.stderr)
        pytest.skip("ray is not installed (pip install 'planforge[ray]')")
    env = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           # actors and the measurement workers they start must import planforge and the test templates
           "PYTHONPATH": os.pathsep.join([str(TESTS)] + [p for p in sys.path if p])}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    tmp = tempfile.mkdtemp(prefix="pfray-")  # short: Ray's socket paths must fit in 107 bytes
    try:
        ctx = ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
        yield ctx.address_info["address"]
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
