"""Graph IR, shapes and dtypes, the model zoo; torch and ONNX import (driven by the op registry, ``planforge.ops``).

The importers need their extras (``torch``, ``onnx``) only when called: importing this package does not.
"""
from .frontend import ModelError, UnsupportedOp, UnsupportedOps
from .graph import Graph, GraphBuilder, GraphError, Node, apply_op, interpret, node_shape, validate
from .load import load_model
from .onnx_import import from_onnx
from .torch_import import from_exported, from_torch
from .zoo import ZOO

__all__ = ["Graph", "GraphBuilder", "GraphError", "ModelError", "Node", "UnsupportedOp", "UnsupportedOps", "ZOO",
           "apply_op",
           "from_exported", "from_onnx", "from_torch", "interpret", "load_model", "node_shape", "validate"]
