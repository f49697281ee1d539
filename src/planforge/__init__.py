"""planforge: find the fastest correct plan for a tensor program on this machine, by measuring."""
__version__ = "0.1.0"
