"""The op registry: one module per op (or small op family), each owning everything planforge knows about it.

See ``planforge.ops.base.Op`` for the facts an op declares and
``docs/architecture.md`` ("add an op") for the checklist.
"""
from .base import Emitter, Epilogue, Library, Op, ShapeError
from .kernel import MlpProblem, Problem, ProblemError, problem_from_json
from .registry import LIBRARIES, ONNX, REGISTRY, TORCH, get, ir_ops

__all__ = ["Emitter", "Epilogue", "LIBRARIES", "Library", "MlpProblem", "ONNX", "Op", "Problem", "ProblemError", "REGISTRY",
           "ShapeError", "TORCH", "get", "ir_ops", "problem_from_json"]
