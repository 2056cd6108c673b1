"""Copies that transpose (`x.T.contiguous()`, NCHW -> NHWC): the heuristics give each thread a register tile, the
input's contiguous axis upcast by a 32-byte run and the output's by a vector, so loads and stores both move whole
runs (heuristic._upcast_transposed). Checked: the opts on CPU, CUDA and PYTHON, the results against numpy on CPU and
PYTHON for several dtypes and permutations (including sizes where the tile does not fit), and that copies which do
not transpose keep their opts."""
import numpy as np
import pytest

from fusegrad import Tensor, dtypes
from fusegrad.codegen.heuristic import hand_coded_optimizations
from fusegrad.codegen.kernel import Kernel, Opt, OptOps
from fusegrad.device import Device
from fusegrad.engine.schedule import create_schedule
from fusegrad.renderer.cstyle import CUDARenderer


def heuristic_opts(shape, perm, dtype=dtypes.float32, renderer=None):
  x = Tensor.empty(*shape, device="CPU", dtype=dtype)
  ast = create_schedule([x.permute(*perm).contiguous().lazydata])[-1].ast
  return hand_coded_optimizations(Kernel(ast, renderer or Device["CPU"].renderer)).applied_opts


@pytest.mark.parametrize("renderer", [None, CUDARenderer("sm_90")], ids=["CPU", "CUDA"])
@pytest.mark.parametrize("dtype,run", [(dtypes.float32, 8), (dtypes.float16, 16)])
def test_transpose_gets_a_register_tile(renderer, dtype, run):
  opts = heuristic_opts((256, 512), (1, 0), dtype, renderer)
  assert opts[0] == Opt(OptOps.UPCAST, 0, run), opts    # the input's contiguous axis (the output's rows)
  assert opts[1] == Opt(OptOps.UPCAST, 1, 4), opts      # the output's contiguous axis


def test_transpose_blocks_read_whole_lines_on_gpus():
  """32 threads along the output's contiguous axis, 4 along the input's: 4 x 32 bytes of each input row a block."""
  opts = heuristic_opts((1024, 2048), (1, 0), dtypes.float32, CUDARenderer("sm_90"))
  assert opts[2:] == [Opt(OptOps.LOCAL, 1, 32), Opt(OptOps.LOCAL, 0, 4)], opts


def test_copies_that_do_not_transpose_keep_their_opts():
  assert all(o.op is not OptOps.UPCAST or o.amount == 4 for o in heuristic_opts((64, 128, 12, 64), (0, 2, 1, 3)))
  x = Tensor.empty(256, 512, device="CPU")
  ast = create_schedule([(x * 2).lazydata])[-1].ast
  opts = hand_coded_optimizations(Kernel(ast, Device["CPU"].renderer)).applied_opts
  assert [o for o in opts if o.op is OptOps.UPCAST] == [Opt(OptOps.UPCAST, 0, 4)]   # one merged axis, float4


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
@pytest.mark.parametrize("shape,perm,dtype", [
  ((64, 96), (1, 0), dtypes.float32),
  ((8, 16, 40), (0, 2, 1), dtypes.float16),
  ((4, 6, 8, 24), (0, 3, 1, 2), dtypes.int32),
  ((24, 9), (1, 0), dtypes.float32),       # 9: no run of 8 along the input's contiguous axis
  ((32, 16), (1, 0), dtypes.bfloat16),
])
def test_transposes_are_right(device, shape, perm, dtype):
  a = np.arange(np.prod(shape)).reshape(shape).astype(np.float32) % 251
  got = Tensor(a, device=device).cast(dtype).permute(*perm).contiguous().numpy()
  assert got.shape == a.transpose(perm).shape
  np.testing.assert_array_equal(got.astype(np.float32), a.transpose(perm))
