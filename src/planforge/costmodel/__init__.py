"""Cost models (proxy tables now; analytic roofline and learned rankers later) and their metrics."""
from .base import CostModel, TableProxy
from .metrics import break_even_runs, kendall, spearman, top_k, top_k_recall

__all__ = ["CostModel", "TableProxy", "break_even_runs", "kendall", "spearman", "top_k", "top_k_recall"]
