"""Validators applied to finalists: numerics, accuracy (quantised weights) and memory."""
from .accuracy import AccuracyBudget, PlanAccuracy
from .memory import MemoryBudget, fmt_bytes
from .numerics import UNIT_ROUNDOFF, AccumulationCheck, accumulation_bound

__all__ = ["AccumulationCheck", "AccuracyBudget", "MemoryBudget", "PlanAccuracy", "UNIT_ROUNDOFF", "accumulation_bound", "fmt_bytes"]
