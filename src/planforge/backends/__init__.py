"""Backends build and run candidates for a target: table (fixed latencies); cpu and replay come later."""
from .base import Backend
from .table import TableBackend

__all__ = ["Backend", "TableBackend"]
