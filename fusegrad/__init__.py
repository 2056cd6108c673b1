"""fusegrad: a small tensor compiler. Lazy tensors are fused into kernels, lowered to UOps, rendered to C/CUDA and run."""
__version__ = "0.1.0"
