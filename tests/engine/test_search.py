"""BEAM's check of a candidate's output against the unoptimized kernel's (engine/search.py `_matches`).

A long fp16 sum rounds to a different neighbour where the order of its adds differs: the tensor-core kernels the
heuristics pick (which seed the beam) must pass, wrong results must not. Found on the H200 (bench/NOTES.md run 14):
with a plain 1e-3 tolerance BEAM rejected every tensor-core matmul of fp16 8192^3 and kept the unoptimized kernel.
"""
import numpy as np

from fusegrad import Tensor, dtypes
from fusegrad.engine.compile import kernel_for
from fusegrad.engine.realize import compile_kernel, run_kernel, run_schedule
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.search import _matches


def outputs(opts_list, m=128, n=256, k=512):
  """The fp16 output of a @ b (normal inputs: values near zero are cancellations) for each opts list on PYTHON."""
  rng = np.random.default_rng(0)
  a, b = (Tensor(rng.standard_normal(s).astype(np.float32), device="PYTHON").half().realize() for s in [(m, k), (k, n)])
  sched = create_schedule([(a @ b).lazydata])
  run_schedule(sched[:-1])
  si = sched[-1]
  for buf in si.bufs: buf.allocate()
  out = []
  for opts in opts_list:
    kern = kernel_for(si.ast, "PYTHON", opts)
    run_kernel(compile_kernel(kern, "PYTHON"), si.bufs, si.var_vals)
    out.append((kern, si.bufs[0].numpy().copy()))
  return out


def test_heuristic_tensor_cores_match_the_plain_kernel():
  (plain, expected), (heur, got) = outputs([[], None])
  assert heur.tensor_core is not None and plain.tensor_core is None
  assert got.dtype == np.float16 and not np.array_equal(got, expected)   # rounding differs somewhere...
  assert _matches(got, expected, dtypes.float16)                          # ...by an ulp of the scale


def test_wrong_outputs_do_not_match():
  expected = np.linspace(-50, 50, 1000).astype(np.float16)
  assert _matches(expected + np.float16(0.0625), expected, dtypes.float16)      # an ulp at 32..64
  assert not _matches(expected * np.float16(1.05), expected, dtypes.float16)    # 5 % off
  wrong = expected.copy()
  wrong[17] = 3.0
  assert not _matches(wrong, expected, dtypes.float16)
  assert not _matches(expected.astype(np.float32) + 0.1, expected.astype(np.float32), dtypes.float32)   # 2e-3 of 50
  nan = expected.astype(np.float32)
  nan[3] = np.nan
  assert _matches(nan, nan, dtypes.float32) and not _matches(expected.astype(np.float32), nan, dtypes.float32)
