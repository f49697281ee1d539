"""planforge: find the fastest correct plan for a tensor program on this machine, by measuring."""
__version__ = "0.1.0"


def __getattr__(name):  # keep `import planforge` light: the API loads on first use
    if name in ("load", "compile"):
        from . import api

        return getattr(api, name)
    if name == "tune":  # the module planforge.tune, callable as planforge.api.tune
        import importlib

        return importlib.import_module(f"{__name__}.tune")
    raise AttributeError(f"module 'planforge' has no attribute {name!r}")
