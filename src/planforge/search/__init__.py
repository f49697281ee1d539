"""Search: strategies (ask/tell), the tuning loop, ranked top-k and the finalist walk."""
from .loop import Budget, SearchResult, Trial, search, search_async, search_on
from .ranked import Entry, Finalist, NoValidFinalist, Ranked, Walk, rank_insert, walk_finalists
from .registry import STRATEGIES, make_strategy
from .strategies import Strategy

__all__ = [
    "Budget", "Entry", "Finalist", "NoValidFinalist", "Ranked", "STRATEGIES", "SearchResult",
    "Strategy", "Trial", "Walk", "make_strategy", "rank_insert", "search", "search_async", "search_on",
    "walk_finalists",
]
