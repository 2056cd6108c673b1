"""fusegrad: a small tensor compiler. Lazy tensors are fused into kernels, lowered to UOps, rendered to C/CUDA and run."""
__version__ = "0.1.0"

from fusegrad.config import Context, config
from fusegrad.dtype import dtypes
from fusegrad.helpers import GlobalCounters
from fusegrad.uop import Variable
from fusegrad.device import Device
from fusegrad.tensor import Tensor

__all__ = ["Tensor", "dtypes", "Device", "Context", "config", "GlobalCounters", "Variable", "__version__"]
