"""planforge: find the fastest correct plan for a tensor program on this machine, by measuring."""
__version__ = "0.1.0"


def __getattr__(name):  # keep `import planforge` light: the API loads on first use
    if name == "load":
        from .api import load

        return load
    raise AttributeError(f"module 'planforge' has no attribute {name!r}")
