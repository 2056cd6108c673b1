"""The CUDA backend: source rendering and NVRTC compilation everywhere (no GPU needed), execution where a GPU is.

The corpus covers what the GPU half of the seed is about: elementwise with float4, a grouped reduce through shared
memory, fp32/fp16/bf16 matmuls (tensor cores for the 16-bit ones) and a convolution.
"""
import numpy as np
import pytest
from fusegrad import Tensor, dtypes
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.compile import kernel_for, render_kernel

nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (the 'cuda' extra) is not installed")
from fusegrad.runtime.cuda import gpu_available  # noqa: E402


def cuda_sources(t: Tensor) -> list[str]:
  out = []
  for si in create_schedule([t.lazydata]):
    if si.ast.op.name != "SINK": continue
    ks = render_kernel(kernel_for(si.ast, "CUDA"), "CUDA")
    assert ks.lib[:4] == b"\x7fELF", "NVRTC must produce a cubin"
    out.append(ks.src)
  return out


def cpu(*shape, dtype=dtypes.float32):
  return Tensor(np.random.default_rng(0).standard_normal(shape).astype(np.float32), device="CPU").cast(dtype).realize()


def test_elementwise_uses_float4():
  a, b, c = cpu(1 << 12), cpu(1 << 12), cpu(1 << 12)
  (src,) = cuda_sources((a * b + c).relu())
  assert "float4" in src and "blockIdx" in src and "threadIdx" in src


def test_grouped_reduce_uses_shared_memory():
  (src,) = cuda_sources(cpu(1 << 14).sum())
  assert "__shared__" in src and "__syncthreads()" in src and "if (" in src


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_half_matmul_uses_tensor_cores(dtype):
  (src,) = cuda_sources((cpu(64, 64, dtype=dtype) @ cpu(64, 64, dtype=dtype)).float())
  assert "mma.sync.aligned.m16n8k16" in src


@pytest.mark.parametrize("dtype,kind", [(dtypes.float16, "f16"), (dtypes.bfloat16, "bf16")])
def test_16_bit_elementwise_moves_vectors(dtype, kind):
  """16-bit buffers are read and written 4 values (8 bytes) at a time: raw words, widened lane by lane into float
  registers (fg_f16_load of each half) and packed back two to a word (fg_pack_f16) for the store."""
  a, b = cpu(1 << 12, dtype=dtype), cpu(1 << 12, dtype=dtype)
  (src,) = cuda_sources((a * b + a).relu())
  body = src.split("__global__")[1]
  assert "uint2 val0 = (*((uint2*)(data1+" in body and f"fg_{kind}_load((unsigned short)(val0.y >> 16))" in body
  assert f"make_uint2(fg_pack_{kind}(" in body and "*((uint2*)(data0+" in body


@pytest.mark.parametrize("dtype,kind", [(dtypes.float16, "f16"), (dtypes.bfloat16, "bf16")])
def test_16_bit_negative_zero_keeps_its_sign(dtype, kind):
  """A vector of -0.0 constants is packed (fg_pack_*), not stored as zero words, which would lose the sign bit
  (1/x would then give +inf). Found in review."""
  (src,) = cuda_sources(Tensor.full((8, 16), -0.0, device="CPU", dtype=dtype).contiguous())
  body = src.split("__global__")[1]
  assert f"fg_pack_{kind}(" in body and "-0.0f" in body and "make_uint2(0u" not in body


def test_corpus_compiles():
  x, w = cpu(2, 8, 12, 12), cpu(16, 8, 3, 3)
  for t in [cpu(64, 64) @ cpu(64, 64), x.conv2d(w, padding=1), cpu(32, 48).softmax(), cpu(16, 16).max(axis=0),
            x.conv2d(w.half().float(), stride=2).relu(), (cpu(30, 17).half() + 1).exp()]:
    assert cuda_sources(t)


gpu = pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU here")


@gpu
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("n", [64, 256])
def test_tensor_core_matmul_on_gpu(dtype, n):
  rng = np.random.default_rng(n)
  a, b = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
  got = (Tensor(a, device="CUDA").cast(dtype) @ Tensor(b, device="CUDA").cast(dtype)).float().numpy()
  ref = a.astype(np.float64) @ b.astype(np.float64)
  assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2


@gpu
def test_reductions_and_softmax_on_gpu():
  x = np.random.default_rng(1).standard_normal((300, 1000)).astype(np.float32)
  t = Tensor(x, device="CUDA")
  np.testing.assert_allclose(t.sum(axis=1).numpy(), x.sum(1), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(t.sum().numpy(), x.sum(), rtol=1e-4)
  e = np.exp(x - x.max(1, keepdims=True))
  np.testing.assert_allclose(t.softmax().numpy(), e / e.sum(1, keepdims=True), rtol=1e-4, atol=1e-6)


@gpu
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_tensor_core_conv2d_on_gpu(dtype):
  rng = np.random.default_rng(3)
  x, w = rng.standard_normal((16, 32, 10, 10)).astype(np.float32), rng.standard_normal((16, 32, 3, 3)).astype(np.float32)
  got = Tensor(x, device="CUDA").cast(dtype).conv2d(Tensor(w, device="CUDA").cast(dtype), padding=1).float().numpy()
  ref = Tensor(x.astype(np.float64), device="CPU").conv2d(Tensor(w.astype(np.float64), device="CPU"), padding=1).numpy()
  assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2
