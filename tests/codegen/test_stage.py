"""STAGE: the loads of a reduce that the threads of a block share, read through shared memory in a ring of S tiles.

Covered here:
- correctness on the PYTHON device (the SIMT emulator: thread blocks, shared memory, ldmatrix, mma.sync) against
  numpy float64: staged fp16/bf16 tensor-core matmuls in all four layouts (A, A.T) x (B, B.T) with S = 2 and 3, a
  reduce fully unrolled (one tile, no loop), many reduce-loop iterations, rings longer than the loop, an epilogue
  (relu + bias), a batched matmul, fp32 buffers cast to half in the kernel (fp32 tiles, no ldmatrix), staged fp32 FMA
  matmuls (S = 2, 3, 4, all layouts) and a padded conv (several reduce loops, masked copies);
- the tensor-core fragments of staged tiles come from ldmatrix (x4 for A; x4 for B over two N tiles, else x2),
  transposed exactly where the shared tile is m/n-contiguous, feeding packed WMMAs; LOCAL after TC adds warps;
- the KernelOptErrors of STAGE (CPU, opts after it, no LOCAL axis, multireduce and grouped reduces, nothing shared,
  uneven split, too many tiles or too much shared memory), each naming STAGE;
- CUDA source (rendered and compiled by NVRTC, no GPU needed): cp.async copies whose global loads are not rendered
  on their own, the prologue's cp.async.wait_all and the ring's cp.async.wait_group S-2, ldmatrix helpers, mma.sync,
  and dynamic shared memory (extern fg_smem, fg_dynamic_shared) exactly above 48 KB per block;
- the heuristics: STAGE for fp16 (with TC) and fp32 matmuls on CUDA, none for a conv or on the CPU, and the heuristic
  kernels of small shapes (where every tiling step falls back) correct on PYTHON.
Two tests pin down bugs found while writing this file (now fixed): a ring of one tile in a reduce loop, and UPCAST
after TC splitting the warp's thread axes.
"""
import copy
import itertools
import re

import numpy as np
import pytest

from fusegrad import Tensor, dtypes
from fusegrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from fusegrad.codegen.linearizer import linearize
from fusegrad.codegen.heuristic import hand_coded_optimizations
from fusegrad.engine.compile import kernel_for, render_kernel
from fusegrad.engine.realize import compile_kernel, run_kernel, run_schedule
from fusegrad.engine.schedule import create_schedule
from fusegrad.uop import MatrixLoad, Ops

from fusegrad.device import Device, cuda_usable
from fusegrad.renderer.cstyle import CUDARenderer, arch_number, shared_per_block

try:
  from fusegrad.runtime.cuda import NVRTCCompiler
  HAVE_NVRTC = True
except ImportError:   # cuda-bindings (the 'cuda' extra) is not installed
  HAVE_NVRTC = False

TOL = {dtypes.float16: 2e-3, dtypes.bfloat16: 1e-2, dtypes.float32: 1e-5}
STATIC_SHARED = 48 * 1024

# the four layouts: (build from two operands, input shapes for M, N, K); the builds work on Tensors and numpy arrays
LAYOUTS = {
  "A@B": (lambda a, b: a @ b, lambda m, n, k: [(m, k), (k, n)]),
  "A.T@B": (lambda a, b: a.T @ b, lambda m, n, k: [(k, m), (k, n)]),
  "A@B.T": (lambda a, b: a @ b.T, lambda m, n, k: [(m, k), (n, k)]),
  "A.T@B.T": (lambda a, b: a.T @ b.T, lambda m, n, k: [(k, m), (n, k)]),
}

# tensor cores, 2 x 2 tiles per warp, 2 x 2 warps per block (LOCAL after TC), K unrolled by 2 (a 32-deep tile)
TC_OPTS = [Opt(OptOps.TC), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LOCAL, 0, 2),
           Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.UNROLL, 0, 2)]
# fp32 FMAs: a 4 x 4 register tile per thread, 4 x 8 threads per block, K unrolled by 4
FMA_OPTS = [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.LOCAL, 1, 8),
            Opt(OptOps.UNROLL, 0, 4)]
# what the heuristics pick on CUDA for a big fp16 matmul, less its STAGE
TC_BIG_OPTS = [Opt(OptOps.TC), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 0, 2),
               Opt(OptOps.LOCAL, 1, 4), Opt(OptOps.UNROLL, 0, 4)]


def round_to(x: np.ndarray, dtype) -> np.ndarray:
  """float32 values rounded to `dtype` (round to nearest even), as float64."""
  if dtype is dtypes.float16: return x.astype(np.float16).astype(np.float64)
  if dtype is dtypes.bfloat16:
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)).astype(np.float64)
  return x.astype(np.float64)


def randn(shapes, seed=0) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def run_python(build, arrays, dtype, opts, device="PYTHON"):
  """Realize the inputs (cast to dtype) on `device`, run the one kernel of build(*inputs) with `opts` (None: the
  heuristics); returns the Kernel and the output as float64."""
  ts = [Tensor(a, device=device).cast(dtype).realize() for a in arrays]
  out = build(*ts)
  sched = create_schedule([out.lazydata])
  assert len(sched) == 1, f"expected one kernel, got {len(sched)}"
  run_schedule(sched[:-1])
  si = sched[-1]
  for b in si.bufs: b.allocate()
  k = kernel_for(si.ast, device, opts)
  run_kernel(compile_kernel(k, device), si.bufs, si.var_vals)
  return k, si.bufs[0].numpy().astype(np.float64).reshape(out.shape)


def check_close(got, ref, dtype):
  err = np.abs(got - ref).max() / np.abs(ref).max()
  assert err < TOL[dtype], f"relative error {err:.3g} (tolerance {TOL[dtype]})"


def check_staged(k, stages, loads=2):
  assert k.applied_opts[-1].op is OptOps.STAGE
  assert len(k.staged) == loads and k.stages == stages, (k.staged, k.stages)


def ast_of(build, shapes, dtype):
  """The AST of the (last) kernel of build(*empty inputs): kernel ASTs do not depend on the device or the data."""
  sched = [si for si in create_schedule([build(*[Tensor.empty(*s, device="CPU", dtype=dtype) for s in shapes])
                                         .lazydata]) if si.ast.op is Ops.SINK]
  return sched[-1].ast


def packed_wmmas(k) -> list[bool]: return [u.arg.packed for u in linearize(k).uops if u.op is Ops.WMMA]


# ***** 1. staged tensor-core matmuls on PYTHON *****

@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["fp16", "bf16"])
def test_tc_staged_layouts(dtype, layout, stages):
  """128x128 @ K=64: 2 iterations of a 32-deep tile, both operands staged, ring of S tiles."""
  build, shapes = LAYOUTS[layout]
  arrays = randn(shapes(128, 128, 64))
  k, got = run_python(build, arrays, dtype, TC_OPTS + [Opt(OptOps.STAGE, 0, stages)])
  check_staged(k, stages)
  assert k.tensor_core is not None and k.first_upcast - k.first_reduce == 1   # one reduce loop
  check_close(got, build(*[round_to(a, dtype) for a in arrays]), dtype)


def ldmatrix_reads(k) -> dict[str, set[tuple[int, bool]]]:
  """(count, trans) of the ldmatrix loads of each TC operand ("a", "b"), told apart by the staged array they read."""
  operand = {f"stage{n}": "a" if k.accesses[p.access] is k.tensor_core.a else "b" for n, p in enumerate(k.staged)}
  out: dict[str, set[tuple[int, bool]]] = {"a": set(), "b": set()}
  for u in linearize(k).uops:
    if u.op is Ops.LOAD and isinstance(u.arg, MatrixLoad):
      out[operand[u.src[0].arg.name]].add((u.arg.count, u.arg.trans))
  return out


# (A trans, B trans) of the ldmatrix reads: A's tile is k-contiguous in A@B, B's tile is n-contiguous in A@B
LDMATRIX = {"A@B": (False, True), "A.T@B": (True, True), "A@B.T": (False, False), "A.T@B.T": (True, False)}


@pytest.mark.parametrize("mapping", [0, 1], ids=["A-is-a", "B-is-a"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_tc_staged_fragments_use_ldmatrix(layout, mapping):
  """Every WMMA of a staged fp16 kernel takes packed registers from ldmatrix: x4 for A, x4 for B too where two N
  tiles of a warp pair up (UPCAST N 2 here), transposed where the shared tile is m- (A) or n-contiguous (B). TC's
  axis 1 maps the operands the other way round (the matrix B as the mma's A), which swaps the transposes."""
  build, shapes = LAYOUTS[layout]
  arrays = randn(shapes(128, 128, 64), seed=15)
  k, got = run_python(build, arrays, dtypes.float16, [Opt(OptOps.TC, mapping)] + TC_OPTS[1:] + [Opt(OptOps.STAGE)])
  a_trans, b_trans = LDMATRIX[layout] if mapping == 0 else LDMATRIX[layout][::-1]
  assert ldmatrix_reads(k) == {"a": {(4, a_trans)}, "b": {(4, b_trans)}}
  wmmas = packed_wmmas(k)
  assert len(wmmas) == 8 and all(wmmas)   # 2 x 2 tiles per warp, 2 k-steps of 16
  check_close(got, build(*[round_to(a, dtypes.float16) for a in arrays]), dtypes.float16)


@pytest.mark.parametrize("n_tiles,b_count", [(1, 2), (3, 2), (4, 4)])
@pytest.mark.parametrize("layout", ["A@B", "A@B.T"])
def test_tc_staged_b_fragment_pairs(layout, n_tiles, b_count):
  """B's ldmatrix: x4 over two neighbouring N tiles of a warp when their count is even, else x2 per tile."""
  build, shapes = LAYOUTS[layout]
  arrays = randn(shapes(128, 8 * n_tiles * 2, 64), seed=14)
  n_upcast = [Opt(OptOps.UPCAST, 1, n_tiles)] if n_tiles > 1 else []
  opts = [Opt(OptOps.TC)] + n_upcast + [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.LOCAL, 1, 2),
                                        Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.STAGE, 0, 3)]
  k, got = run_python(build, arrays, dtypes.float16, opts)
  check_staged(k, 3)
  assert ldmatrix_reads(k)["b"] == {(b_count, LDMATRIX[layout][1])} and all(packed_wmmas(k))
  check_close(got, build(*[round_to(a, dtypes.float16) for a in arrays]), dtypes.float16)


def test_local_after_tc_adds_warps():
  """LOCAL after TC puts warps side by side: the warp's own g (8) and t (4) stay the last local axes."""
  ast = ast_of(lambda a, b: a @ b, [(128, 64), (64, 128)], dtypes.float16)
  k = kernel_for(ast, "PYTHON", [Opt(OptOps.TC)])
  assert k.thread_count() == 32
  k = kernel_for(ast, "PYTHON", TC_OPTS)
  assert k.thread_count() == 128 and k.full_shape[k.first_reduce - 2:k.first_reduce] == (8, 4)
  with pytest.raises(KernelOptError, match="more than 1024 threads per block"):
    kernel_for(ast, "PYTHON", [Opt(OptOps.TC), Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.LOCAL, 0, 4)])


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["fp16", "bf16"])
def test_tc_staged_single_tile(dtype):
  """K = 32 unrolled by 2: no reduce loop, so the one tile is copied before the math (S is then 1 whatever asked)."""
  arrays = randn([(128, 32), (32, 128)], seed=1)
  for stages in (2, 3):
    k, got = run_python(lambda a, b: a @ b, arrays, dtype, TC_OPTS + [Opt(OptOps.STAGE, 0, stages)])
    assert k.first_upcast == k.first_reduce   # no reduce loop
    check_staged(k, 1)
    check_close(got, round_to(arrays[0], dtype) @ round_to(arrays[1], dtype), dtype)


@pytest.mark.parametrize("stages", [2, 3, 5])
@pytest.mark.parametrize("layout", ["A@B", "A.T@B.T"])
def test_tc_staged_many_iterations(layout, stages):
  """K = 256: 8 iterations of the reduce loop, so every slot of the ring is refilled (and the last S-1 copies wrap)."""
  build, shapes = LAYOUTS[layout]
  arrays = randn(shapes(64, 64, 256), seed=2)
  opts = [Opt(OptOps.TC), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.LOCAL, 1, 2),
          Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.STAGE, 0, stages)]
  k, got = run_python(build, arrays, dtypes.float16, opts)
  check_staged(k, stages)
  assert k.full_shape[k.first_reduce] == 8
  check_close(got, build(*[round_to(a, dtypes.float16) for a in arrays]), dtypes.float16)


@pytest.mark.parametrize("stages", [4, 8])
def test_tc_ring_longer_than_loop(stages):
  """S - 1 >= the 2 iterations of the loop: the prologue's copies wrap around the loop, and so do the ring's."""
  arrays = randn([(128, 64), (64, 128)], seed=3)
  k, got = run_python(lambda a, b: a @ b, arrays, dtypes.float16, TC_OPTS + [Opt(OptOps.STAGE, 0, stages)])
  check_staged(k, stages)
  assert k.full_shape[k.first_reduce] == 2
  check_close(got, round_to(arrays[0], dtypes.float16) @ round_to(arrays[1], dtypes.float16), dtypes.float16)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["fp16", "bf16"])
def test_tc_staged_epilogue(dtype):
  """relu + bias after the staged matmul: the bias is read from global memory after the reduce."""
  arrays = randn([(128, 64), (64, 128), (128,)], seed=4)
  k, got = run_python(lambda a, b, c: (a @ b).relu() + c, arrays, dtype, TC_OPTS + [Opt(OptOps.STAGE)])
  check_staged(k, 2)
  a, b, c = (round_to(x, dtype) for x in arrays)
  check_close(got, np.maximum(round_to((a @ b).astype(np.float32), dtype), 0) + c, dtype)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["fp16", "bf16"])
def test_tc_staged_batched(dtype):
  """A batched matmul: the batch is a global axis, tiles are per batch."""
  arrays = randn([(3, 64, 64), (3, 64, 64)], seed=5)
  # global axes after TC: batch, M/16, N/8
  opts = [Opt(OptOps.TC), Opt(OptOps.UPCAST, 2, 2), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.LOCAL, 2, 2),
          Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.STAGE, 0, 3)]
  k, got = run_python(lambda a, b: a @ b, arrays, dtype, opts)
  check_staged(k, 3)
  check_close(got, round_to(arrays[0], dtype) @ round_to(arrays[1], dtype), dtype)


@pytest.mark.parametrize("stages", [2, 3])
def test_tc_staged_fp32_tiles(stages):
  """fp32 buffers cast to half in the kernel: the staged tiles are fp32, so fragments are read element by element
  from shared memory (no ldmatrix, unpacked WMMAs)."""
  arrays = randn([(128, 64), (64, 128)], seed=6)
  k, got = run_python(lambda a, b: (a.half() @ b.half()).float(), arrays, dtypes.float32,
                      TC_OPTS + [Opt(OptOps.STAGE, 0, stages)])
  check_staged(k, stages)
  assert k.tensor_core is not None and ldmatrix_reads(k) == {"a": set(), "b": set()}
  assert not any(packed_wmmas(k))
  check_close(got, round_to(arrays[0], dtypes.float16) @ round_to(arrays[1], dtypes.float16), dtypes.float16)


# ***** 2. staged fp32 FMA matmuls on PYTHON *****

@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fma_staged_layouts(layout, stages):
  build, shapes = LAYOUTS[layout]
  arrays = randn(shapes(64, 64, 64), seed=7)
  k, got = run_python(build, arrays, dtypes.float32, FMA_OPTS + [Opt(OptOps.STAGE, 0, stages)])
  check_staged(k, stages)
  check_close(got, build(*[a.astype(np.float64) for a in arrays]), dtypes.float32)


@pytest.mark.parametrize("stages", [None, 0, 2])
def test_stage_default_amount(stages):
  """No amount (None or 0) means a ring of 2 tiles."""
  k = kernel_for(ast_of(lambda a, b: a @ b, [(64, 64), (64, 64)], dtypes.float32), "PYTHON",
                 FMA_OPTS + [Opt(OptOps.STAGE, 0, stages)])
  check_staged(k, 2)


def test_fma_staged_odd_sizes():
  """Sizes that are not powers of two: 48 x 40 @ K=36, tiles of 24 rows by 3 k."""
  arrays = randn([(48, 36), (36, 40)], seed=8)
  opts = [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.LOCAL, 1, 2),
          Opt(OptOps.UNROLL, 0, 3), Opt(OptOps.STAGE, 0, 3)]
  k, got = run_python(lambda a, b: a @ b, arrays, dtypes.float32, opts)
  check_staged(k, 3)
  check_close(got, arrays[0].astype(np.float64) @ arrays[1].astype(np.float64), dtypes.float32)


def conv_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  """conv2d, 3x3, padding 1, stride 1, in float64."""
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  h, wd = x.shape[2:]
  return sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j].astype(np.float64))
             for i, j in itertools.product(range(3), range(3)))


@pytest.mark.parametrize("opts", [
  [Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.UNROLL, 0, 16), Opt(OptOps.STAGE, 0, 4)],
  [Opt(OptOps.UPCAST, 3, 2), Opt(OptOps.LOCAL, 1, 8), Opt(OptOps.UNROLL, 0, 8), Opt(OptOps.UNROLL, 1, 3),
    Opt(OptOps.STAGE, 0, 3)],
], ids=["c16-S4", "c8ky3-S3"])
def test_conv_staged(opts):
  """A padded conv (the heuristics never stage one): two or three reduce loops, the image tile shared by the output
  channels of a block, copied element by element because of the padding masks."""
  x, w = randn([(2, 16, 14, 14), (16, 16, 3, 3)], seed=9)
  k, got = run_python(lambda a, b: a.conv2d(b, padding=1), [x, w], dtypes.float32, opts)
  check_staged(k, opts[-1].amount, loads=1)
  check_close(got, conv_ref(x, w), dtypes.float32)


# ***** 3. errors *****

@pytest.fixture(scope="module")
def fp32_matmul():
  return ast_of(lambda a, b: a @ b, [(64, 64), (64, 64)], dtypes.float32)


def test_stage_on_cpu_raises(fp32_matmul):
  for opts in ([Opt(OptOps.STAGE)], [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.STAGE, 0, 2)]):
    with pytest.raises(KernelOptError, match="STAGE: needs thread blocks with shared memory"):
      kernel_for(fp32_matmul, "CPU", opts)


@pytest.mark.parametrize("after", [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.LOCAL, 0, 2),
                                   Opt(OptOps.STAGE), Opt(OptOps.NOLOCALS)])
def test_opt_after_stage_raises(fp32_matmul, after):
  k = kernel_for(fp32_matmul, "PYTHON", FMA_OPTS + [Opt(OptOps.STAGE)])
  shape = k.full_shape
  with pytest.raises(KernelOptError, match="STAGE must be the last opt"):
    k.apply_opt(after)
  assert k.full_shape == shape and k.applied_opts[-1] == Opt(OptOps.STAGE)


def test_opt_after_stage_raises_on_tc():
  ast = ast_of(lambda a, b: a @ b, [(128, 64), (64, 128)], dtypes.float16)
  with pytest.raises(KernelOptError, match="STAGE must be the last opt"):
    kernel_for(ast, "PYTHON", TC_OPTS[:-1] + [Opt(OptOps.STAGE), TC_OPTS[-1]])


@pytest.mark.parametrize("opts", [
  [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4)],
  [Opt(OptOps.NOLOCALS), Opt(OptOps.UPCAST, 0, 4)],
  [],
], ids=["upcasts", "nolocals", "none"])
def test_stage_without_locals_raises(fp32_matmul, opts):
  with pytest.raises(KernelOptError, match=r"STAGE: .*LOCAL axis"):
    kernel_for(fp32_matmul, "PYTHON", opts + [Opt(OptOps.STAGE)])


def test_stage_after_failed_stage_still_allowed(fp32_matmul):
  """A STAGE that does not fit leaves the kernel as it was: other opts (and a STAGE that fits) may follow."""
  k = kernel_for(fp32_matmul, "PYTHON", [Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.LOCAL, 1, 16)])
  with pytest.raises(KernelOptError, match="STAGE"):
    k.apply_opt(Opt(OptOps.STAGE))
  assert not k.staged and k.stages == 0
  k.apply_opt(Opt(OptOps.UNROLL, 0, 16))   # a 16 x 16 tile of A: one element per thread
  k.apply_opt(Opt(OptOps.STAGE))
  check_staged(k, 2)


def test_stage_multireduce_raises():
  """The fused softmax (max, sum and the output in one kernel) is not staged."""
  ast = ast_of(lambda x: x.softmax(), [(32, 256)], dtypes.float32)
  k = kernel_for(ast, "PYTHON")
  assert k.multireduce and k.local_dims > 0
  with pytest.raises(KernelOptError, match="STAGE: needs one reduce that is not grouped"):
    k.apply_opt(Opt(OptOps.STAGE))
  with pytest.raises(KernelOptError, match="STAGE: needs one reduce that is not grouped"):
    kernel_for(ast, "PYTHON", [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.STAGE)])


def test_stage_grouped_or_unshared_raises():
  ast = ast_of(lambda x: x.sum(axis=1), [(64, 256)], dtypes.float32)
  with pytest.raises(KernelOptError, match="STAGE: needs one reduce that is not grouped"):
    kernel_for(ast, "PYTHON", [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 0, 16), Opt(OptOps.STAGE)])
  # every thread of the block reads its own row: nothing to share
  with pytest.raises(KernelOptError, match="STAGE: no load of the reduce is shared"):
    kernel_for(ast, "PYTHON", [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.STAGE)])


def test_stage_uneven_split_raises(fp32_matmul):
  # 256 threads, tiles of 16 x 1 elements
  with pytest.raises(KernelOptError, match="STAGE: a tile of 16 elements does not split evenly over 256 threads"):
    kernel_for(fp32_matmul, "PYTHON", [Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.STAGE)])
  # the heuristic conv opts: an image tile of 168 elements over a block of 112 threads
  x = ast_of(lambda a, b: a.conv2d(b, padding=1), [(2, 16, 14, 14), (16, 16, 3, 3)], dtypes.float32)
  with pytest.raises(KernelOptError, match="STAGE: a tile of .* does not split evenly"):
    kernel_for(x, "PYTHON", [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UNROLL, 2, 3), Opt(OptOps.LOCAL, 3, 14),
                             Opt(OptOps.LOCAL, 2, 2), Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.LOCAL, 0, 2),
                             Opt(OptOps.STAGE)])


def test_stage_too_many_tiles_raises(fp32_matmul):
  with pytest.raises(KernelOptError, match="STAGE, 0, 9.*2 to 8 tiles"):
    kernel_for(fp32_matmul, "PYTHON", FMA_OPTS + [Opt(OptOps.STAGE, 0, 9)])


def test_stage_too_much_shared_memory_raises():
  """The heuristic 8192^3 fp16 tiles: 35840 bytes a ring slot, so 6 slots fit in 227 KB and 7 do not."""
  ast = ast_of(lambda a, b: a @ b, [(8192, 8192), (8192, 8192)], dtypes.float16)
  k = kernel_for(ast, "PYTHON", TC_BIG_OPTS + [Opt(OptOps.STAGE, 0, 6)])
  assert k.opts.shared_max == 227 * 1024 and sum(p.size * 2 for p in k.staged) == 35840
  for stages in (7, 8):
    with pytest.raises(KernelOptError, match=f"STAGE: tiles need {35840 * stages} bytes of shared memory, more than "
                                             f"{227 * 1024}"):
      kernel_for(ast, "PYTHON", TC_BIG_OPTS + [Opt(OptOps.STAGE, 0, stages)])
  # the limit is the renderer's: on a device with 16 bytes less than a ring of 4 needs, 4 fail and 3 fit
  small = ast_of(lambda a, b: a @ b, [(64, 64), (64, 64)], dtypes.float32)
  k = kernel_for(small, "PYTHON", FMA_OPTS + [Opt(OptOps.STAGE, 0, 4)])
  need = sum(p.size * 4 for p in k.staged) * 4
  renderer = copy.copy(k.opts)
  object.__setattr__(renderer, "shared_max", need - 16)   # a frozen dataclass: a device with less shared memory
  k = Kernel(small, renderer)
  for o in FMA_OPTS: k.apply_opt(o)
  with pytest.raises(KernelOptError, match=f"STAGE: tiles need {need} bytes of shared memory, more than {need - 16}"):
    k.apply_opt(Opt(OptOps.STAGE, 0, 4))
  k.apply_opt(Opt(OptOps.STAGE, 0, 3))   # three slots still fit
  check_staged(k, 3)


# ***** 4. CUDA source *****

def cuda_kernel(ast, opts=None):
  k = kernel_for(ast, "CUDA", opts)
  ks = render_kernel(k, "CUDA")   # NVRTC compiles it: the source must be valid
  assert ks.lib[:4] == b"\x7fELF", "NVRTC must produce a cubin"
  return k, ks


def loop_body(src: str) -> tuple[str, str]:
  """(the source before the first `for (`, the rest)."""
  head, sep, tail = src.partition("for (")
  assert sep, "expected a reduce loop"
  return head, tail


def check_no_plain_input_loads(src: str, inputs=("data1", "data2")):
  """The inputs are read only by cp.async (the global loads feeding the copies are not rendered on their own)."""
  for line in src.splitlines():
    if "__global__" in line: continue
    if any(re.search(rf"\b{name}\b", line) for name in inputs):
      assert "cp.async" in line and "shared.global" in line, f"input read outside cp.async: {line.strip()}"


@pytest.fixture(scope="module")
def cuda_arch():
  if not HAVE_NVRTC: pytest.skip("cuda-bindings (the 'cuda' extra) is not installed")
  arch = Device["CUDA"].renderer.arch
  if arch_number(arch) < 80: pytest.skip(f"{arch}: no cp.async or mma.sync")
  return arch


def sm80_kernel(ast):
  """The heuristics' kernel for an Ampere GPU (sm_80: ldmatrix + mma.sync; sm_90 takes wgmma, test_wgmma.py), its
  CUDA source and NVRTC's cubin of it."""
  k = hand_coded_optimizations(Kernel(ast, CUDARenderer("sm_80")))
  src = CUDARenderer("sm_80").render("k", linearize(k).uops)
  assert NVRTCCompiler("sm_80").compile(src)[:4] == b"\x7fELF"
  return k, src


@pytest.fixture(scope="module")
def fp16_1024(cuda_arch):
  return sm80_kernel(ast_of(lambda a, b: a @ b, [(1024, 1024), (1024, 1024)], dtypes.float16))


def barrier_wait(stages: int) -> str:
  """The barrier that ends an iteration of a ring of `stages` tiles."""
  wait = f"cp.async.commit_group; cp.async.wait_group {stages - 2};" if stages > 2 else "cp.async.wait_all;"
  return f'asm volatile("{wait}" ::: "memory"); __syncthreads();'


def test_cuda_heuristic_fp16_matmul_source(fp16_1024):
  k, src = fp16_1024
  assert k.applied_opts[0].op is OptOps.TC and k.applied_opts[-1].op is OptOps.STAGE and k.stages in (2, 3)
  head, body = loop_body(src)
  assert "cp.async.cg.shared.global" in head and "cp.async.cg.shared.global" in body   # prologue and ring
  assert 'asm volatile("cp.async.wait_all;" ::: "memory"); __syncthreads();' in head   # the prologue's barrier
  assert "wait_group" not in head and barrier_wait(k.stages) in body
  assert "fg_ldmatrix_x4(" in body and "fg_ldmatrix_x4_trans(" in body   # A k-contiguous, B n-contiguous
  assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in body
  check_no_plain_input_loads(src)


@pytest.mark.parametrize("stages", [3, 4])
def test_cuda_ring_waits_for_one_tile(cuda_arch, stages):
  """A ring of S tiles: each iteration's barrier commits its copies and waits for all but the S - 2 newest groups."""
  ast = ast_of(lambda a, b: a @ b, [(128, 64), (64, 128)], dtypes.float16)
  _, ks = cuda_kernel(ast, TC_OPTS + [Opt(OptOps.STAGE, 0, stages)])
  head, body = loop_body(ks.src)
  assert "cp.async.wait_all;" in head and "wait_group" not in head
  assert barrier_wait(stages) in body and "cp.async.wait_all" not in body
  check_no_plain_input_loads(ks.src)


def test_cuda_fp32_matmul_source(cuda_arch):
  """fp32 FMAs: the heuristics' STAGE 4 gives wait_group 2; 16-byte rows go cp.async.cg, lone floats cp.async.ca."""
  k, ks = cuda_kernel(ast_of(lambda a, b: a @ b, [(1024, 1024), (1024, 1024)], dtypes.float32))
  assert k.applied_opts[-1] == Opt(OptOps.STAGE, 0, 4) and k.tensor_core is None
  head, body = loop_body(ks.src)
  assert "cp.async.wait_all;" in head and "cp.async.commit_group; cp.async.wait_group 2;" in body
  assert re.search(r"cp\.async\.(cg|ca)\.shared\.global \[%0\], \[%1\], (16|4);", body)
  assert "mma.sync" not in ks.src and "fg_ldmatrix_x4(" not in ks.src
  check_no_plain_input_loads(ks.src)


def test_cuda_single_tile_has_one_barrier(cuda_arch):
  """No reduce loop: the tile is copied once, then one wait_all barrier, no ring."""
  ast = ast_of(lambda a, b: a @ b, [(128, 32), (32, 128)], dtypes.float16)
  _, ks = cuda_kernel(ast, TC_OPTS + [Opt(OptOps.STAGE)])
  assert "for (" not in ks.src and ks.src.count("__syncthreads();") == 1 and "cp.async.wait_all;" in ks.src
  check_no_plain_input_loads(ks.src)


def test_cuda_masked_copies_are_synchronous(cuda_arch):
  """A padded conv's copies are gated loads: plain loads and stores, plain barriers, no cp.async."""
  ast = ast_of(lambda a, b: a.conv2d(b, padding=1), [(2, 16, 14, 14), (16, 16, 3, 3)], dtypes.float32)
  _, ks = cuda_kernel(ast, [Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.UNROLL, 0, 16), Opt(OptOps.STAGE, 0, 3)])
  assert "cp.async" not in ks.src and "__syncthreads();" in ks.src and "__shared__" in ks.src


def shared_arrays(ks) -> list[int]:
  """Bytes of each shared array of the kernel, as the block-wide layout rounds them (16-byte aligned)."""
  return [-(-u.arg.size * u.dtype.base.itemsize // 16) * 16 for u in ks.lin.uops if u.op is Ops.DEFINE_LOCAL]


def check_dynamic_shared(k, ks):
  src = ks.src
  m = re.search(r'extern "C" __device__ const unsigned int fg_dynamic_shared = (\d+);', src)
  assert m, "fg_dynamic_shared must be declared for runtime/cuda.py to read"
  total = int(m.group(1))
  sizes = shared_arrays(ks)
  assert total > STATIC_SHARED and total % 16 == 0 and total == sum(sizes)
  itemsize = {p.access: k.accesses[p.access].src[0].dtype.base.itemsize for p in k.staged}
  assert total == sum(p.size * itemsize[p.access] * k.stages for p in k.staged)
  align = 1024 if k.wgmma is not None else 16   # wgmma's swizzled tiles start at 1024-byte boundaries
  assert src.count(f"extern __shared__ __align__({align}) unsigned char fg_smem[];") == 1
  offsets = [int(x) for x in re.findall(r"\(fg_smem \+ (\d+)\)", src)]
  assert offsets == [sum(sizes[:i]) for i in range(len(sizes))]
  assert not [line for line in src.splitlines() if "__shared__" in line and "extern" not in line]   # no static arrays


def check_static_shared(ks):
  assert sum(shared_arrays(ks)) <= STATIC_SHARED
  assert "fg_dynamic_shared" not in ks.src and "extern __shared__" not in ks.src and "fg_smem" not in ks.src
  assert len(re.findall(r"__shared__ __align__\(16\) unsigned short stage\d\[\d+\];", ks.src)) == 2


def test_cuda_dynamic_shared_above_48k(cuda_arch):
  """The heuristic 8192^3 fp16 opts with a ring of 4: 140 KB of tiles, as slices of one extern array."""
  from fusegrad.device import Device
  if Device["CUDA"].renderer.shared_max < 4 * 35840: pytest.skip(f"{cuda_arch} has too little shared memory")
  ast = ast_of(lambda a, b: a @ b, [(8192, 8192), (8192, 8192)], dtypes.float16)
  k, ks = cuda_kernel(ast, TC_BIG_OPTS + [Opt(OptOps.STAGE, 0, 4)])
  check_dynamic_shared(k, ks)
  assert "fg_dynamic_shared = 143360;" in ks.src
  # the heuristics' own ring is over 48 KB too (sm_90: wgmma's 128 x 64 and 64 x 256 tiles, unpadded)
  k, ks = cuda_kernel(ast)
  assert k.applied_opts[0].op is OptOps.TC and k.applied_opts[-1].op is OptOps.STAGE
  check_dynamic_shared(k, ks)
  tile = 35840 if k.wgmma is None else (128 * 64 + 64 * 256) * 2
  assert f"fg_dynamic_shared = {tile * k.stages};" in ks.src


@pytest.mark.parametrize("stages,dynamic", [(2, False), (6, False), (7, True), (8, True)])
def test_cuda_static_dynamic_boundary(cuda_arch, stages, dynamic):
  """Tiles of 128 x 32 (A) and 32 x 128 (B) halves, rows padded: 7680 bytes a ring slot, so 6 slots (46080 bytes)
  stay static shared memory and 7 (53760) do not."""
  ast = ast_of(lambda a, b: a @ b, [(128, 64), (64, 128)], dtypes.float16)
  k, ks = cuda_kernel(ast, TC_OPTS + [Opt(OptOps.STAGE, 0, stages)])
  assert sum(shared_arrays(ks)) == 7680 * stages
  if dynamic: check_dynamic_shared(k, ks)
  else: check_static_shared(ks)


# ***** 5. heuristics *****

CONVS = {"14x14": [(2, 16, 14, 14), (16, 16, 3, 3)], "8x8": [(4, 64, 8, 8), (64, 64, 3, 3)]}


def conv_ast(shapes):
  return ast_of(lambda a, b: a.conv2d(b, padding=1), shapes, dtypes.float32)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["fp16", "bf16"])
def test_heuristics_stage_tc_matmul_on_cuda(cuda_arch, dtype):
  ast = ast_of(lambda a, b: a @ b, [(1024, 1024), (1024, 1024)], dtype)
  k, _ = sm80_kernel(ast)
  ops = [o.op for o in k.applied_opts]
  assert ops[0] is OptOps.TC and ops[-1] is OptOps.STAGE and ops.count(OptOps.STAGE) == 1
  assert OptOps.LOCAL in ops and k.thread_count() == 32 * 8   # 2 x 4 warps sharing the staged tiles
  check_staged(k, k.applied_opts[-1].amount)
  assert k.stages in (2, 3)


def test_heuristics_stage_fp32_matmul_on_cuda(cuda_arch):
  k = kernel_for(ast_of(lambda a, b: a @ b, [(1024, 1024), (1024, 1024)], dtypes.float32), "CUDA")
  assert k.tensor_core is None
  check_staged(k, 4)


@pytest.mark.parametrize("conv", list(CONVS))
def test_heuristics_do_not_stage_conv_on_cuda(cuda_arch, conv):
  k = kernel_for(conv_ast(CONVS[conv]), "CUDA")
  assert OptOps.STAGE not in [o.op for o in k.applied_opts] and not k.staged
  if conv == "8x8":   # a choice of the heuristics, not a misfit: the tiles of its opts could be staged
    k.apply_opt(Opt(OptOps.STAGE, 0, 4))
    assert k.staged


@pytest.mark.parametrize("case", ["fp16", "fp32", "conv"])
def test_heuristics_never_stage_on_cpu(case):
  ast = conv_ast(CONVS["14x14"]) if case == "conv" else \
      ast_of(lambda a, b: a @ b, [(1024, 1024), (1024, 1024)], dtypes.float16 if case == "fp16" else dtypes.float32)
  k = kernel_for(ast, "CPU")
  assert k.applied_opts and OptOps.STAGE not in [o.op for o in k.applied_opts] and not k.staged


# ***** 6. the heuristic kernels of small shapes on PYTHON *****

@pytest.mark.parametrize("shapes", [
  [(16, 32), (32, 8)],      # one warp, one tile: no UPCAST, no LOCAL, K fully unrolled
  [(64, 48), (48, 80)],     # N / 8 = 10: UPCAST N by 2, not 4; K = 48: no UNROLL
  [(48, 128), (128, 24)],   # M / 16 = 3 and N / 8 = 3: no UPCAST or LOCAL at all, a loop of 2
  [(16, 16), (16, 16)],     # K = 16: nothing left of K after the TC
  [(2, 64, 64), (2, 64, 64)],
], ids=lambda s: "x".join(map(str, s[0])) + "@" + "x".join(map(str, s[1])))
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["fp16", "bf16"])
def test_heuristic_tc_small_shapes(dtype, shapes):
  arrays = randn(shapes, seed=10)
  k, got = run_python(lambda a, b: a @ b, arrays, dtype, None)
  ops = [o.op for o in k.applied_opts]
  assert ops[0] is OptOps.TC and ops[-1] is OptOps.STAGE and k.staged
  check_close(got, round_to(arrays[0], dtype) @ round_to(arrays[1], dtype), dtype)


@pytest.mark.parametrize("shapes,staged", [
  ([(33, 17), (17, 5)], False),     # nothing divides: no register tile, no STAGE
  ([(100, 60), (60, 36)], False),   # a 4 x 4 tile: too small to stage
  ([(64, 8), (8, 128)], True),      # K = 8 unrolled by 4: a loop of 2, so a ring of 2 (not 4)
  ([(3, 64, 32), (3, 32, 64)], True),
  ([(128, 96), (96, 64)], True),
], ids=["33x17@17x5", "100x60@60x36", "64x8@8x128", "3x64x32@3x32x64", "128x96@96x64"])
def test_heuristic_fp32_small_shapes(shapes, staged):
  arrays = randn(shapes, seed=11)
  k, got = run_python(lambda a, b: a @ b, arrays, dtypes.float32, None)
  assert bool(k.staged) == staged, k.applied_opts
  if staged:   # a ring of 4, or one tile per iteration where the reduce loop is shorter
    trips = int(np.prod(k.full_shape[k.first_reduce:k.first_upcast]))
    check_staged(k, max(2, min(4, trips)))
  check_close(got, arrays[0].astype(np.float64) @ arrays[1].astype(np.float64), dtypes.float32)


# ***** bugs found while writing this file (fixed) *****

def test_stage_one_tile_ring_is_refused_or_correct():
  arrays = randn([(64, 64), (64, 64)], seed=12)
  try:
    _, got = run_python(lambda a, b: a @ b, arrays, dtypes.float32, FMA_OPTS + [Opt(OptOps.STAGE, 0, 1)])
  except KernelOptError as e:
    assert "STAGE" in str(e)
    return
  check_close(got, arrays[0].astype(np.float64) @ arrays[1].astype(np.float64), dtypes.float32)


@pytest.mark.parametrize("axis", [2, 3])
def test_upcast_after_tc_keeps_warp_layout(axis):
  """fp16 32x32 @ 32x32: after TC the axes are (M/16, N/8 | g 8, t 4 | ...): UPCAST 2 or 3 would split g or t."""
  arrays = randn([(32, 32), (32, 32)], seed=13)
  try:
    _, got = run_python(lambda a, b: a @ b, arrays, dtypes.float16, [Opt(OptOps.TC), Opt(OptOps.UPCAST, axis, 2)])
  except KernelOptError:
    return
  check_close(got, round_to(arrays[0], dtypes.float16) @ round_to(arrays[1], dtypes.float16), dtypes.float16)


# ***** on a GPU: the staged kernels the heuristics pick, cp.async and ldmatrix included *****

gpu = pytest.mark.skipif(not cuda_usable(), reason="no CUDA GPU here")


@gpu
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_staged_tc_matmul_on_the_gpu(dtype, ta, tb):
  """256 x 384 @ 384 x 512 with the heuristics: TC, 2x4 warps, RASTER, a ring of 3 tiles (K = 6 x 64)."""
  a, b = randn([(384, 256) if ta else (256, 384), (512, 384) if tb else (384, 512)], seed=21)
  k, got = run_python(lambda x, y: (x.T if ta else x) @ (y.T if tb else y), [a, b], dtype, None, device="CUDA")
  assert k.staged and k.tensor_core is not None, k.applied_opts
  ref = round_to(a.T if ta else a, dtype) @ round_to(b.T if tb else b, dtype)
  check_close(got, ref, dtype)


@gpu
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_staged_fp32_matmul_on_the_gpu(stages):
  a, b = randn([(256, 128), (128, 512)], seed=22)
  opts = [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.LOCAL, 1, 32),
          Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.RASTER, 0, 2), Opt(OptOps.STAGE, 0, stages)]
  _, got = run_python(lambda x, y: x @ y, [a, b], dtypes.float32, opts, device="CUDA")
  check_close(got, a.astype(np.float64) @ b.astype(np.float64), dtypes.float32)


# ***** found in review: raw copies of padding and of other dtypes, arch names *****

@pytest.mark.parametrize("build,opts", [
  (lambda a, b: a.pad(((0, 48), (0, 0))) @ b, [Opt(OptOps.TC), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.STAGE)]),
  (lambda a, b: a.pad(((0, 48), (0, 0))).float() @ b,
   [Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, 8), Opt(OptOps.LOCAL, 0, 8),
    Opt(OptOps.STAGE, 0, 2)]),
])
def test_copied_vectors_of_padding_are_zero_words(cuda_arch, build, opts):
  """A copied 16-bit vector that lies wholly in padding is a literal of zero words (there is no make_half2)."""
  _, ks = cuda_kernel(ast_of(build, [(16, 32), (32, 32)], dtypes.float16), opts)
  assert "make_half" not in ks.src and re.search(r"(unsigned vec\d+ = 0u;|uint\d vec\d+ = make_uint\d\(0u)", ks.src)


def test_raw_copies_of_any_dtype_compile_without_cp_async():
  """Before sm_80 the copies are plain loads and stores: uint8 tiles move as unsigned words."""
  if not HAVE_NVRTC: pytest.skip("cuda-bindings (the 'cuda' extra) is not installed")
  ast = ast_of(lambda a, b: a.float() @ b, [(64, 64), (64, 64)], dtypes.uint8)
  k = Kernel(ast, CUDARenderer("sm_75"))
  for o in [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.LOCAL, 1, 8),
            Opt(OptOps.UNROLL, 0, 16), Opt(OptOps.STAGE, 0, 3)]: k.apply_opt(o)
  src = CUDARenderer("sm_75").render("k", linearize(k).uops)
  assert "cp.async" not in src and re.search(r"\buint4 val", src) and "charx" not in src
  assert NVRTCCompiler("sm_75").compile(src)[:4] == b"\x7fELF"


def test_arch_names_compare_as_numbers():
  names = ("sm_75", "sm_90", "sm_90a", "sm_100", "sm_120", "bogus")
  assert [arch_number(a) for a in names] == [75, 90, 90, 100, 120, 0]
  assert CUDARenderer("sm_120").tensor_cores and not CUDARenderer("sm_75").tensor_cores
  assert shared_per_block("sm_100") == 227 * 1024 and shared_per_block("sm_75") == 48 * 1024
