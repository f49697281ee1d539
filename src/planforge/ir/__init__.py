"""Graph IR, shapes and dtypes, the model zoo; torch and ONNX import."""
from .graph import OPS, Graph, GraphBuilder, GraphError, Node, apply_op, interpret, validate
from .zoo import ZOO

__all__ = ["Graph", "GraphBuilder", "GraphError", "Node", "OPS", "ZOO", "apply_op", "interpret", "validate"]
