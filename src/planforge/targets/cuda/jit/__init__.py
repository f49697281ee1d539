"""The Triton kernels of the CUDA target and their launchers.

Every module here imports ``triton`` at its top, so this package is imported
only where a kernel runs (the measuring worker, the tests), never by the
target's planning side. Under ``TRITON_INTERPRET=1`` (set before the first
import) the same kernels run on the CPU through Triton's interpreter, which
is how the tests prove them without a GPU.
"""
