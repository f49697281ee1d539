"""The cuda target: Triton templates on a CUDA GPU, with a GPU profile, analytic model and isolated measurement."""
from .target import CudaTarget

__all__ = ["CudaTarget"]
