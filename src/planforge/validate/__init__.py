"""Validators applied to finalists: numerics and memory."""
from .memory import MemoryBudget, fmt_bytes
from .numerics import UNIT_ROUNDOFF, AccumulationCheck, accumulation_bound

__all__ = ["AccumulationCheck", "MemoryBudget", "UNIT_ROUNDOFF", "accumulation_bound", "fmt_bytes"]
