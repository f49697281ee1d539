"""planforge: find the fastest correct plan for a tensor program on this machine, by measuring."""
import os

__version__ = "0.1.0"

# Idle threads of the runtimes a plan calls sleep at once instead of spinning, unless the environment says
# otherwise: on a machine with few cores a spinning thread takes the core the next step (or the next
# measurement) needs. Set before numpy, torch or a template library loads their runtimes (``import planforge``
# itself loads none of them) and inherited by the measuring workers, which start fresh.
# - OpenMP (``OMP_WAIT_POLICY=PASSIVE``): with the default, spinning a while after each parallel region, a 2-core
#   machine shared with other work ran GPT-2's plan at 112 ms a forward against 3.4 ms passive (load average 4.5;
#   docs/benchmarks.md, issue 13).
# - OpenBLAS, numpy's BLAS (``OPENBLAS_THREAD_TIMEOUT=4``: log2 of the cycles its threads spin after a call, the
#   least it takes; the default, 2**28 cycles, is about 0.1 s): a two-thread int8 GEMV timed right after numpy's
#   fp32 GEMV took 4.3 ms against 2.2 ms a fifth of a second later (docs/benchmarks.md, issue 17).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")


def tune(*args, **kwargs):
    """Tune a workload or a torch module and write its spec: ``planforge.api.tune`` (see there for the
    parameters; the driver underneath is ``planforge.tuning.tune``)."""
    from .api import tune as api_tune

    return api_tune(*args, **kwargs)


def __getattr__(name):  # keep `import planforge` light: the API loads on first use
    if name in ("load", "compile"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'planforge' has no attribute {name!r}")
