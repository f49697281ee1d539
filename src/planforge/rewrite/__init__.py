"""Rewrites with egglog: the language and rule sets, saturation with limits, extraction."""
from .egraph import EClassGraph, ENode, Limits, RewriteError, release_egraphs, saturate

__all__ = ["EClassGraph", "ENode", "Limits", "RewriteError", "release_egraphs", "saturate"]
