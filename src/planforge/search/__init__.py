"""Search: strategies (ask/tell), the tuning loop, ranked top-k and the finalist walk."""
from .loop import Budget, SearchResult, Trial, search
from .ranked import Entry, Finalist, NoValidFinalist, Ranked, Walk, rank_insert, walk_finalists
from .strategies import STRATEGIES, Strategy, make_strategy
from . import mcts, portfolio, surrogate, tpe  # noqa: E402,F401  (register their strategies)

__all__ = [
    "Budget", "Entry", "Finalist", "NoValidFinalist", "Ranked", "STRATEGIES", "SearchResult",
    "Strategy", "Trial", "Walk", "make_strategy", "rank_insert", "search", "walk_finalists",
]
