"""Masked window loads on the CPU: consecutive lanes whose validities differ (a padded row, as a conv reads its image
shifted by each kernel tap) load as one vector, lane i reading index + i only where its valid holds (MaskedLoad,
rendered as fg_maskload_*: an AVX-512 masked load, or a loop of selects elsewhere). Checked against numpy on convs
and padded shifts, and the plain-C fallback on its own (compiled without AVX-512)."""
import ctypes
import subprocess
import numpy as np
import pytest
from fusegrad import Tensor, dtypes
from fusegrad.config import config
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.compile import kernel_for, render_kernel
from fusegrad.renderer.cstyle import masked_load, C_PRELUDE


def cpu_source(out: Tensor) -> str:
  si = [s for s in create_schedule([out.lazydata]) if s.ast.op.name == "SINK"][-1]
  return render_kernel(kernel_for(si.ast, "CPU"), "CPU").src


def conv_ref(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  n, _, h, wd = xp.shape
  co, _, kh, kw = w.shape
  out = np.zeros((n, co, h - kh + 1, wd - kw + 1))
  for i in range(kh):
    for j in range(kw):
      out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + out.shape[2], j:j + out.shape[3]], w[:, :, i, j])
  return out


@pytest.mark.parametrize("pad,k", [(1, 3), (2, 5), (0, 3)])
def test_conv_reads_padded_rows_as_masked_windows(pad, k):
  rng = np.random.default_rng(pad * 10 + k)
  x, w = rng.standard_normal((2, 3, 16, 16)).astype(np.float32), rng.standard_normal((8, 3, k, k)).astype(np.float32)
  out = Tensor(x, device="CPU").conv2d(Tensor(w, device="CPU"), padding=pad)
  if pad: assert "fg_maskload" in cpu_source(out)
  got = out.numpy()
  np.testing.assert_allclose(got, conv_ref(x, w, pad), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lo,hi,start", [(1, 1, 0), (3, 5, 1), (8, 0, 2), (0, 7, 5)])
def test_padded_shifted_rows(lo, hi, start):
  """Windows that hang over either end of a row (and over the start and end of the buffer)."""
  x = np.arange(4 * 16, dtype=np.float32).reshape(4, 16) + 1
  out = Tensor(x, device="CPU").pad(((0, 0), (lo, hi)))[:, start:start + 16] * 2
  ref = np.pad(x, ((0, 0), (lo, hi)))[:, start:start + 16] * 2
  assert "fg_maskload" in cpu_source(out)
  np.testing.assert_array_equal(out.numpy(), ref)


def test_masked_load_fallback_without_avx512(tmp_path):
  """The plain-C form (what machines without AVX-512 compile): lanes with their bit read p[i], the others are 0."""
  src = C_PRELUDE + "\n".join(
    [f"typedef float {n} __attribute__((vector_size({4 * c})));" for n, c in (("float4", 4), ("floatx8", 8))] +
    [masked_load(dtypes.float32.vec(4)), masked_load(dtypes.float32.vec(8))] +
    ["void run(const float* p, unsigned m, float* out) { floatx8 v = fg_maskload_floatx8(p, m); "
     "float4 u = fg_maskload_float4(p + 8, m >> 8); for (int i = 0; i < 8; i++) out[i] = v[i]; "
     "for (int i = 0; i < 4; i++) out[8 + i] = u[i]; }"])
  (tmp_path / "k.c").write_text(src)
  lib = tmp_path / "k.so"
  subprocess.run([config.CC, "-O2", "-mno-avx512f", "-shared", "-fPIC", str(tmp_path / "k.c"), "-o", str(lib)],
                 check=True)
  run = ctypes.CDLL(str(lib)).run
  p = np.arange(1, 13, dtype=np.float32)
  for m in (0, 0b101100111011, 0xFFF, 0b100000000001):
    out = np.zeros(12, np.float32)
    run(p.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint(m), out.ctypes.data_as(ctypes.c_void_p))
    np.testing.assert_array_equal(out, np.where([(m >> i) & 1 for i in range(12)], p, 0))
