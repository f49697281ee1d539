"""The Backend protocol: build and run candidates for one target.

Every backend (``cpu`` kernels, ``cpu`` graph plans, ``table``, ``replay``)
implements all of it, so the tuning loop, the executors and the report call
its members directly and never ask which ones a backend has.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

from ..measure.executor import BuildStage
from ..outcome import Outcome
from ..space import Candidate


class Backend(Protocol):
    """Measures candidates on a target.

    ``fingerprint`` identifies the device (and for a table, its contents):
    times with different fingerprints are never compared. ``measure`` returns
    one Outcome per candidate, in order, and never raises for a bad candidate:
    a crash, a hang or a wrong result is an Outcome.

    ``pin_cores`` is a hint to the executors: True when measurements run on
    this node's CPU cores, so that each measuring slot pins its worker to
    cores of its own (two measurements never share a core); False for a
    lookup, which takes no core worth pinning.
    """

    name: str
    fingerprint: str
    pin_cores: bool

    def describe(self) -> dict:
        """What the backend measures and how, for the records and the report."""
        ...

    def measure(self, candidates: Sequence[Candidate]) -> list[Outcome]:
        """Build (where there is a build step) and measure each candidate; one Outcome each, in order."""
        ...

    def factory(self) -> Callable[[tuple[int, ...] | None], "Backend"]:
        """A picklable ``f(cpus) -> Backend`` that makes an equivalent backend in
        another thread, process or node, its measurements pinned to ``cpus``
        (None: not pinned). On another kind of machine the copy carries that
        machine's fingerprint, so its times are never ranked with these."""
        ...

    def builder(self) -> BuildStage | None:
        """The build stage an executor runs apart from the measuring slots (see
        ``planforge.measure.executor.BuildStage``), or None when the backend has
        no build step to split off (its slots build and measure in ``measure``)."""
        ...

    def measure_built(self, candidate: Candidate, lib) -> Outcome:
        """Measure ``candidate`` from ``lib``, what the build stage gave for it
        (installed on this node); a backend without a build stage measures the
        candidate as ``measure`` does."""
        ...

    def baselines(self, libraries: Sequence[str] | None = None) -> dict[str, Outcome]:
        """Each library implementation of the same work, measured the same way
        (``libraries``: names to measure, default all there are); ``{}`` where
        there is nothing to compare with."""
        ...

    def remeasure(self, candidates: Sequence[Candidate], libraries: Sequence[str] | None = None,
                  rounds: int = 3) -> tuple[list[Outcome], dict[str, Outcome]]:
        """Measure the finalists and the baselines again, interleaved for
        ``rounds`` rounds (default 3), so that a slow phase of a noisy machine
        hits them all alike: an Outcome per candidate and per library."""
        ...

    def program(self, candidate: Candidate) -> list[dict] | None:
        """The runnable program of a whole-graph plan (what the spec records and
        ``planforge run`` executes); None where a candidate is a kernel's knobs
        or a table's entry."""
        ...

    def work(self) -> dict[str, float] | None:
        """Useful work of one execution, ``{"flops", "bytes"}`` (compulsory bytes
        moved), for the report's rates; None where planforge cannot count it."""
        ...

    def device_profile(self) -> dict | None:
        """The measured profile of the device (as JSON) for the report; None
        where there is no device (a table, a recording)."""
        ...

    def close(self) -> None:
        """Release what the backend holds (worker processes); it is not used after."""
        ...
