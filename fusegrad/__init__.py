"""fusegrad: a small tensor compiler. Lazy tensors are fused into kernels, lowered to UOps, rendered to C/CUDA and run.

The flag values live in `fusegrad.config.config` (the module `fusegrad.config` is not shadowed here); override them in
code with `fusegrad.Context(DEBUG=2)`.
"""
__version__ = "0.1.0"

from fusegrad.config import Context
from fusegrad.dtype import dtypes
from fusegrad.helpers import GlobalCounters
from fusegrad.uop import Variable
from fusegrad.device import Device
from fusegrad.tensor import Tensor
from fusegrad.engine.jit import TinyJit, jit

__all__ = ["Tensor", "dtypes", "Device", "Context", "GlobalCounters", "Variable", "TinyJit", "jit", "__version__"]
