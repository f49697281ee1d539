"""Weight formats (fp32, bf16, int8, int4), their quantisation and packing, and the accuracy budget.

The format is a gene of a linear task's plan, searched together with the tile
knobs; a plan in any format but fp32 is only offered when the manifest states an
accuracy budget (``accuracy=max_rel_err:0.01``), and the finalist walk measures
each such plan's error against fp64 and rejects it when over budget.
"""
from .accuracy import DEFAULT, METRICS, Accuracy, AccuracyError, Budgets, cosine, max_rel_err, parse_budget
from .formats import FORMATS, INT4_BLOCKS, QWeights, QuantError, bytes_per_weight, check_format, dequantise, \
    error_bound, quantise, quantise_activations, variant, variant_knobs
from .pack import Packed, pack, packed
from .target import QuantTarget

__all__ = ["Accuracy", "AccuracyError", "Budgets", "DEFAULT", "FORMATS", "INT4_BLOCKS", "METRICS", "Packed",
           "QWeights", "QuantError", "QuantTarget", "bytes_per_weight", "check_format", "cosine", "dequantise", "error_bound",
           "max_rel_err", "pack", "packed", "parse_budget", "quantise", "quantise_activations", "variant", "variant_knobs"]
