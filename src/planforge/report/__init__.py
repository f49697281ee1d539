"""Reports: the terminal summary now; the HTML report later."""
from .summary import fmt_time, print_summary, summary_json

__all__ = ["fmt_time", "print_summary", "summary_json"]
