"""Measurement: the timing protocol and isolated worker processes."""
from .timing import TimingConfig, time_fn
from .worker import AdaptiveTimeout, JobResult, Worker

__all__ = ["AdaptiveTimeout", "JobResult", "TimingConfig", "Worker", "time_fn"]
