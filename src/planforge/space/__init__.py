"""Plan spaces: genes, knobs, restrictions, candidates, fingerprints."""
from .restrict import Restriction, RestrictionError, parse
from .space import Candidate, Knob, Space, SpaceError, categorical, fingerprint_of, gene, int_range, pow2

__all__ = [
    "Candidate", "Knob", "Restriction", "RestrictionError", "Space", "SpaceError",
    "categorical", "fingerprint_of", "gene", "int_range", "parse", "pow2",
]
