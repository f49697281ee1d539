"""planforge: find the fastest correct plan for a tensor program on this machine, by measuring."""
__version__ = "0.1.0"


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
