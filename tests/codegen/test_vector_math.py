"""Vector math in the C prelude (CPU): exp2 on whole vectors, the generic GCC-vector form and the AVX-512 form,
checked against numpy over the whole float32 range, with NaN, +-inf and results that are denormal or 0."""
import numpy as np
import pytest
from fusegrad import Tensor
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.compile import kernel_for, render_kernel
from fusegrad.engine.realize import compile_kernel, run_kernel
from fusegrad.codegen.kernel import Opt, OptOps

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 127.5, 127.99, 128.0, -126.0, -149.0, -149.5, -150.5, 1e-30]


def _inputs(n: int) -> np.ndarray:
  x = np.concatenate([np.linspace(-160, 130, 20000), SPECIAL]).astype(np.float32)
  return np.resize(x, (len(x) + n - 1) // n * n)


@pytest.mark.parametrize("width", [16, 8, 4])
def test_vector_exp2_matches_numpy(width):
  x = _inputs(width)
  t = Tensor(x, device="CPU").realize()
  out = t.exp2()
  si = [s for s in create_schedule([out.lazydata]) if s.ast.op.name == "SINK"][0]
  k = kernel_for(si.ast, "CPU", [Opt(OptOps.UPCAST, 0, width)])
  assert f"fg_exp2_float{'x' if width > 4 else ''}{width}" in render_kernel(k, "CPU").src
  for b in si.bufs: b.allocate()
  run_kernel(compile_kernel(k, "CPU"), si.bufs, si.var_vals)
  got = si.bufs[0].numpy()
  want = np.exp2(x.astype(np.float64))
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  with np.errstate(over="ignore"):
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want.astype(np.float32)))
  normal = np.isfinite(want) & (want > 1e-37) & (want < 3.4e38)
  assert np.max(np.abs(got[normal] / want[normal] - 1)) < 2e-7
  tiny = want < 1e-37
  assert np.max(np.abs(got[tiny] - want[tiny])) < 1e-44
