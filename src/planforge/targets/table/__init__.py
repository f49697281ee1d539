"""The table target: a measurement is a lookup in a fixed latency table (the drill)."""
from .table import TableBackend

__all__ = ["TableBackend"]
