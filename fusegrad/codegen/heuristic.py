"""Hand-coded optimizations: good default Opts for a kernel without any search.

The rules, in order: matmul-shaped fp16/bf16 reduces go to tensor cores (with register tiling; wgmma on sm_90);
split a big reduce across a thread block when the output is small or the reduce axis is contiguous (GROUP, devices
with thread blocks); upcast axes that some input broadcasts (stride 0: the register tiling of matmul and conv);
unroll a short or divisible reduce; in a copy that transposes, upcast the input's unit-stride axis by a 32-byte run;
upcast the output's unit-stride axis by 4 so loads and stores become float4; and on devices with thread blocks, give
each block up to 256 threads along the global axes (a transposing copy: 32 x 4 threads along the two axes).
"""
from __future__ import annotations
from fusegrad.helpers import prod
from fusegrad.uop import Ops
from fusegrad.codegen.kernel import Kernel, Opt, OptOps, KernelOptError
from fusegrad.codegen.tensor_cores import match_matmul, WGMMA


def _try(k: Kernel, opt: Opt) -> bool:
  try:
    k.apply_opt(opt)
    return True
  except KernelOptError:
    return False


def _int(x) -> int | None: return x if isinstance(x, int) else None


def hand_coded_optimizations(k: Kernel) -> Kernel:
  if k.multireduce:
    _multireduce(k)
    if k.opts.max_threads > 1: _use_cores(k)
    return k
  if k.opts.tensor_cores and (choice := _tc_choice(k)) is not None and _try(k, Opt(OptOps.TC, choice, 0)):
    _tile_tensor_cores(k)
    return k
  if k.opts.has_local and k.reduceop is not None: _group_reduce(k)
  if k.reduceop is not None and k.group_for_reduces == 0: _upcast_broadcast_axes(k)
  if k.reduceop is not None and k.group_for_reduces == 0: _unroll_reduce(k)
  transposed = _upcast_transposed(k) if k.reduceop is None else None
  _upcast_output(k)
  if k.opts.has_local and not k.dont_use_locals and not (transposed is not None and _transpose_block(k, transposed)):
    _add_locals(k)
  if _stages_matmul(k): _try(k, Opt(OptOps.STAGE, 0, _ring(k, 4)))
  if k.opts.max_threads > 1: _use_cores(k)
  return k


def _stages_matmul(k: Kernel) -> bool:
  """A matmul with a register tile on a device with shared memory: its inputs go through shared memory (STAGE).
  fp32 4096^3 on the H200: 4.65 -> 3.7-3.9 ms with K unrolled by 4 and a ring of 4 tiles (bench/NOTES.md run 11).
  Convs (several reduce loops, gathered images) are left as they are."""
  return k.opts.has_shared and k.opts.has_local and k.reduceop is not None and k.group_for_reduces == 0 and \
      k.first_upcast - k.first_reduce == 1 and k.upcast_size() >= 64 and not k.multireduce


def _multireduce(k: Kernel) -> None:
  """A kernel of several reduces (fused softmax/layernorm): each reduce's contiguous axis and the output's contiguous
  axis are unrolled by one vector, and on devices with thread blocks split across the same T threads (they share
  thread ids and lanes: the phases run one after another), so a block handles a row in every phase."""
  width = next((w for w in k.opts.vector_widths if w >= 4), 0) if k.opts.supports_float4 else 0
  loop_start = lambda: k.first_reduce + k.group_for_reduces  # noqa: E731
  def reduce_axis(r, stride=1):   # the reduce's innermost loop axis, if its own loads read it with this stride
    accesses, _ = k.phases[r]
    own = [a for a in sorted(k.own_axes(r)) if loop_start() <= a < k.first_upcast and _int(k.full_shape[a])]
    if not own or not any(k.sts[i].real_strides()[own[-1]] == stride for i in accesses): return None
    return own[-1]
  def output_axis(stride=1):    # the output's contiguous axis that no reduce varies along
    deps = set().union(*[k.phase_axes(r) for r in k.reduceops])
    strides = k.sts[0].real_strides()
    cands = [a for a in range(k.global_dims) if strides[a] == stride and a not in deps and _int(k.full_shape[a])]
    return cands[-1] if cands else None
  if width:
    for r in k.reduceops:
      if (a := reduce_axis(r)) is not None and k.full_shape[a] % width == 0:
        _try(k, Opt(OptOps.UNROLL, a - loop_start(), width))
    if (a := output_axis()) is not None and k.full_shape[a] % width == 0:
      _try(k, Opt(OptOps.UPCAST, a, width))
  if not k.opts.has_local or k.dont_use_locals: return
  step = width if k.upcasted else 1   # neighbouring threads read neighbouring vectors
  sizes = [k.full_shape[a] for a in [reduce_axis(r, step) for r in k.reduceops] + [output_axis(step)] if a is not None]
  threads = next((t for t in (256, 128, 64, 32) if all(s % t == 0 for s in sizes)), None)
  if threads is None: return
  for r in k.reduceops:
    if (a := reduce_axis(r, step)) is not None: _try(k, Opt(OptOps.GROUP, a - loop_start(), threads))
  if (a := output_axis(step)) is not None: _try(k, Opt(OptOps.LOCAL, a, threads))


def _tc_choice(k: Kernel) -> int | None:
  """Which way to map an fp16/bf16 matmul-shaped reduce onto tensor cores (the TC opt's axis), or None for FMAs. A
  matmul takes the first fit. A conv takes a mapping whose M (in A) or N (in B) axis is contiguous: with the
  weights as A, M = output channels and N = image columns (bench conv fp16 on the H200: 0.28 -> 0.11 ms, NOTES run
  11); M = the batch gathers every fragment element from another image (7x slower than FMAs, NOTES run 8)."""
  loads = match_matmul(k.reduceop)
  if loads is None: return None
  fits = [x for x in (k._tc_axes(loads[0], loads[1]), k._tc_axes(loads[1], loads[0])) if x is not None]
  if not fits: return None
  if k.first_upcast - k.first_reduce == 1: return 0   # one reduce axis: a matmul
  for i, (m_axis, n_axis, a, b) in enumerate(fits):
    sa, sb = (k.sts[k.accesses.index(x)].real_strides(ignore_valid=True) for x in (a, b))  # padding masks edges
    if sa[m_axis] == 1 or sb[n_axis] == 1: return i
  return None


def _use_cores(k: Kernel) -> None:
  """Split the outer axis across the cores when there is enough work (>= 256K element-steps) to pay for it."""
  if k.multireduce:   # phases run one after another: the biggest phase is the work, not the product of all axes
    work = max(prod(_int(k.full_shape[a]) or 1 for a in k.phase_uses(p)) for p in k.phases)
  else:
    work = prod(_int(s) or 1 for s in k.full_shape)
  if work < (1 << 18) or k.global_dims == 0: return
  for n in range(k.opts.max_threads, 1, -1):
    if _try(k, Opt(OptOps.THREAD, 0, n)): return


def _tc_global_axes(k: Kernel) -> tuple[list[int], list[int]]:
  """The global M and N axes of a TC kernel (A moves along M, B along N)."""
  plan = k.tensor_core
  sa, sb = (k.sts[k.accesses.index(x)].real_strides() for x in (plan.a, plan.b))
  return [i for i in range(k.global_dims) if sa[i] != 0 and sb[i] == 0], \
      [i for i in range(k.global_dims) if sb[i] != 0 and sa[i] == 0]


def _split(k: Kernel, op: OptOps, which: int, amounts: tuple[int, ...], nth: int = -1) -> bool:
  """Apply `op` to the TC kernel's M (which 0) or N (1) global axis with the first amount that fits."""
  found = _tc_global_axes(k)[which]
  axis = found[nth] if len(found) >= abs(nth) else None
  if axis is None or not isinstance(k.full_shape[axis], int): return False
  return any(k.full_shape[axis] % amount == 0 and _try(k, Opt(op, axis, amount)) for amount in amounts)


def _unroll_k(k: Kernel, amounts: tuple[int, ...]) -> bool:
  """Unroll what is left of K after the TC's 16 (the one reduce loop of a matmul) by the first amount that fits."""
  loop = k.first_upcast - 1 - k.first_reduce
  if loop < 0 or not isinstance(k.full_shape[k.first_upcast - 1], int): return False
  return any(k.full_shape[k.first_upcast - 1] % amount == 0 and _try(k, Opt(OptOps.UNROLL, loop, amount))
             for amount in amounts)


def _tile_tensor_cores(k: Kernel) -> None:
  """Several m16n8k16 tiles per warp (register tiling: each loaded fragment feeds more than one WMMA), and on
  devices with shared memory several warps per block sharing staged tiles, read by wgmma where the device has it
  (_wgmma_tiles). Timed on the H200 (bench/NOTES.md run 11, fp16 8192^3) without wgmma: 4 N x 4 M tiles per warp,
  2 x 4 warps (a 128 x 128 block), K unrolled by 4 (a 64-deep tile), blocks rastered in groups of 16 rows and a
  ring of 3 tiles: 3.1 ms; 8 N x 4 M tiles per warp in one-warp blocks without staging (the old default) 10.8 ms.
  Each step falls back to smaller amounts where the matrix is too small."""
  if k.first_upcast - k.first_reduce > 1:   # a conv: tiles of 4 M x (up to 8) N x 2 rows; no staging (padding)
    _split(k, OptOps.UPCAST, 0, (4, 2))
    before = len(_tc_global_axes(k)[1])
    _split(k, OptOps.UPCAST, 1, (8, 7, 6, 5, 4, 3, 2))
    _split(k, OptOps.UPCAST, 1, (2,), nth=-1 if len(_tc_global_axes(k)[1]) < before else -2)   # the next N axis
    return
  if not k.opts.has_shared:
    _split(k, OptOps.UPCAST, 1, (8, 4, 2))
    _split(k, OptOps.UPCAST, 0, (4, 2))
    return
  if _wgmma_tiles(k): return
  _split(k, OptOps.UPCAST, 1, (4, 2))
  _split(k, OptOps.UPCAST, 0, (4, 2))
  _split(k, OptOps.LOCAL, 0, (2,))
  _split(k, OptOps.LOCAL, 1, (4, 2))
  _unroll_k(k, (4, 2))
  _raster(k)
  if not _try(k, Opt(OptOps.STAGE, 0, _ring(k, 3))): _try(k, Opt(OptOps.STAGE, 0, 2))


def _wgmma_tiles(k: Kernel) -> bool:
  """On a device with warpgroup MMAs (sm_90): 2 warpgroups along M, each 64 x 256 (one wgmma m64n256k16 per
  k-step; 64 x 128 where N is not a multiple of 256), 64-deep tiles in a ring of 4
  read by wgmma straight from shared memory, one batch in flight past each barrier (STAGE 2). fp16 8192^3 on the
  H200 (bench/NOTES.md runs 13-15): 1.60-1.62 ms, 680 TFLOP/s (64 x 128 per warpgroup, ring of 3, waiting each
  batch: 1.89 ms; the mma.sync tiles: 3.1 ms). Planned on a trial copy of the kernel and applied only when every
  step fits: M and N multiples of 128, K of 64, 16-bit buffers (else the mma.sync tiles are used)."""
  if WGMMA not in k.opts.tensor_cores: return False
  trial = Kernel(k.ast, k.opts)
  for opt in k.applied_opts: trial.apply_opt(opt)
  if not (_split(trial, OptOps.LOCAL, 0, (4,)) and _split(trial, OptOps.LOCAL, 0, (2,)) and
          _split(trial, OptOps.UPCAST, 1, (32, 16)) and _unroll_k(trial, (4,))): return False
  _raster(trial)
  ring = _ring(trial, 4)
  if not ((ring >= 3 and _try(trial, Opt(OptOps.STAGE, 2, ring))) or _try(trial, Opt(OptOps.STAGE, 1, ring)) or
          _try(trial, Opt(OptOps.STAGE, 1, 2))): return False
  for opt in trial.applied_opts[len(k.applied_opts):]: k.apply_opt(opt)
  return True


def _ring(k: Kernel, stages: int) -> int:
  """Tiles in a STAGE ring: at most one per iteration of the reduce loops (a longer ring would copy the first tiles
  again, as it wraps, without hiding anything more), at least 2."""
  trips = prod(_int(k.full_shape[a]) or stages for a in range(k.first_reduce + k.group_for_reduces, k.first_upcast))
  return max(2, min(stages, trips))


def _raster(k: Kernel) -> None:
  """Blocks in groups of 16 grid rows (fewer where the grid is smaller): a wave of blocks shares its rows of A and
  columns of B in L2 (fp16 8192^3 on the H200: 3.34 -> 3.22 ms, bench/NOTES.md run 11)."""
  if k.global_dims < 2 or not isinstance(k.full_shape[k.global_dims - 2], int): return
  for amount in (16, 8, 4, 2):
    if k.full_shape[k.global_dims - 2] % amount == 0 and _try(k, Opt(OptOps.RASTER, 0, amount)): return


def _group_reduce(k: Kernel) -> None:
  """Split the reduce across up to 256 threads of a block, neighbours reading neighbours (GROUP): when there are few
  outputs (little parallelism otherwise), or when the reduce axis is contiguous in memory (so a warp's loads are
  coalesced, where one thread per output would stride through memory)."""
  out_size = prod(_int(s) or 1 << 20 for s in k.full_shape[:k.first_reduce])
  reduce_axis = k.first_upcast - 1
  if reduce_axis < k.first_reduce: return
  size = _int(k.full_shape[reduce_axis])
  contiguous = any(st.real_strides()[reduce_axis] == 1 for st in k.load_sts())
  # an input broadcast along an output axis (matmul, conv) is reused across outputs: tile the outputs instead
  reused = any(0 in st.real_strides()[:k.first_reduce] for st in k.load_sts())
  if size is None or size < 128 or (out_size > 2048 and (not contiguous or reused)): return
  # a contiguous reduce axis: each thread reads float4s (unrolled by 4), neighbouring threads neighbouring float4s
  amounts = (256, 128, 64, 32, 16)
  if contiguous and size % 512 == 0 and _try(k, Opt(OptOps.UNROLL, reduce_axis - k.first_reduce, 4)):
    size //= 4
    # float4 per thread: 128 threads cover 2 KB per step (timed best, NOTES run 8); one block for the whole reduce
    # (the second kernel of a split sum) takes 256, so more loads are in flight in its few steps
    amounts = (256, 128, 64, 32, 16) if out_size == 1 else (128, 64, 32, 16)
  for amount in amounts:
    if size % amount == 0 and _try(k, Opt(OptOps.GROUP, reduce_axis - k.first_reduce, amount)): return


def _broadcast_axes(k: Kernel) -> list[int]:
  """Output axes that some input reads with stride 0: upcasting them reuses each loaded value across the lanes."""
  return [axis for axis in range(k.first_reduce)
          if any(st.real_strides()[axis] == 0 for st in k.load_sts()) and _int(k.full_shape[axis]) is not None]


def _vector_tile(k: Kernel) -> bool:
  """Devices with vector arithmetic (the CPU): a register tile of whole vectors, e.g. 8 rows x 32 columns of a
  matmul (16 AVX-512 accumulators): the output's contiguous axis by one or two vectors, another reused axis by 8.
  Returns False (and changes nothing) when the kernel has no such axis."""
  width = next((w for w in k.opts.vector_widths if w >= 4), 0)
  strides = k.sts[0].real_strides()
  # the inner axis: contiguous in the output, and every load along it is a plain vector or a broadcast (a padded
  # input, as in a conv, would be gathered lane by lane)
  inner = [a for a in _broadcast_axes(k) if strides[a] == 1 and
           all(st.real_strides()[a] in (0, 1) and all(v.mask is None for v in st.views) for st in k.load_sts())]
  if not width or not inner: return False
  axis = inner[-1]
  size = k.full_shape[axis]
  amount = next((a for a in (2 * width, width, 8, 4) if size % a == 0 and a <= size), None)
  if amount is None or not _try(k, Opt(OptOps.UPCAST, axis, amount)): return False
  # the second axis reuses the loads the first one does not (matmul: rows of A after columns of B)
  reused = [i for i, st in enumerate(k.load_sts()) if st.real_strides()[axis] == 0]
  others = [a for a in _broadcast_axes(k) if a != axis]
  others.sort(key=lambda a: any(st.real_strides()[a] == 0 for i, st in enumerate(k.load_sts()) if i not in reused))
  for axis in reversed(others):
    for amt in (8, 4, 2):
      if k.full_shape[axis] % amt == 0 and k.upcast_size() * amt <= 256 and _try(k, Opt(OptOps.UPCAST, axis, amt)):
        return True
  return True


def _upcast_broadcast_axes(k: Kernel) -> None:
  """Upcast output axes that an input reads with stride 0 (each loaded value is reused across the upcast), a
  different axis each time where there is one: a 4x4 register tile of a matmul reuses each load 4 times."""
  if k.opts.vector_alu and _vector_tile(k): return
  if (k.opts.has_local or k.opts.vector_alu) and _reuse_tile(k): return
  used: set[int] = set()
  for _ in range(2):
    if k.upcast_size() >= 16: return
    candidates = []
    for axis in range(k.first_reduce):
      size = _int(k.full_shape[axis])
      if size is None or size % 4 != 0: continue
      if any(st.real_strides()[axis] == 0 for st in k.load_sts()): candidates.append(axis)
    fresh = [a for a in candidates if a not in used]
    if not candidates: return
    axis = (fresh or candidates)[-1]
    if not _try(k, Opt(OptOps.UPCAST, axis, 4)): return
    used.add(axis)


def _reuse_tile(k: Kernel) -> bool:
  """A register tile over two output axes that reuse different inputs (matmul: columns reuse A, rows reuse B; conv:
  the image row reuses the weights, output channels reuse the image). GPUs: 8x8 for a matmul, 4x8 (plus 2 image
  rows) for a conv, the shapes that timed best on the H200 (bench/NOTES.md runs 8 and 10); a vector CPU's conv
  takes 8x8 (both cores: 40 -> 19 ms for the CPU bench conv). Matmuls on a vector CPU go through _vector_tile."""
  def broadcast(axis: int) -> set[int]:
    return {i for i, st in enumerate(k.load_sts()) if st.real_strides()[axis] == 0}
  axes = [a for a in range(k.first_reduce) if _int(k.full_shape[a]) and k.full_shape[a] % 4 == 0 and broadcast(a)]
  if not axes: return False
  first = axes[-1]
  second = next((a for a in reversed(axes) if a != first and broadcast(a) - broadcast(first)), None)
  amounts = ((8, 8) if k.opts.vector_alu else (4, 8)) if len(axes) > 2 else (8, 8)
  done = False
  for axis, amount in ((first, amounts[0]), (second, amounts[1])):
    if axis is None: continue
    for amt in (amount, 4):
      if k.full_shape[axis] % amt == 0 and _try(k, Opt(OptOps.UPCAST, axis, amt)):
        done = True
        break
  # a conv on a GPU also takes 2 image rows (0.39 -> 0.33 ms, NOTES run 10)
  third = next((a for a in reversed(axes) if a not in (first, second)), None)
  if done and k.opts.has_local and len(axes) > 2 and third is not None and k.full_shape[third] % 2 == 0:
    _try(k, Opt(OptOps.UPCAST, third, 2))
  return done


def _unroll_reduce(k: Kernel) -> None:
  """Unroll the innermost reduce loop: fully when short, else by 4."""
  if k.first_upcast - k.first_reduce <= 0: return
  axis = k.first_upcast - 1 - k.first_reduce
  size = _int(k.full_shape[k.first_upcast - 1])
  if size is None: return
  width = next((w for w in k.opts.vector_widths if w >= 4), 0) if k.opts.vector_alu else 0
  contiguous = any(st.real_strides()[k.first_upcast - 1] == 1 for st in k.load_sts())
  if width and contiguous and size % width == 0 and size > width and k.upcast_size() * width <= 64:
    _try(k, Opt(OptOps.UNROLL, axis, width))   # vector devices: one whole vector of the contiguous input per step
  elif size <= 8 and k.upcast_size() * size <= (192 if k.opts.has_local or k.opts.vector_alu else 64):
    _try(k, Opt(OptOps.UNROLL, axis, size))
  elif size % 4 == 0 and k.upcast_size() <= (64 if k.opts.has_local else 16):
    # an 8x8 FMA tile on a GPU keeps 64 accumulators: unrolling by 2 left more registers (4.6 vs 5.7 ms, NOTES run
    # 10), unless the tiles are staged through shared memory (then 4: a tile of 4 k per barrier, NOTES run 11)
    by_two = k.opts.has_local and k.upcast_size() >= 64 and not _stages_matmul(k)
    _try(k, Opt(OptOps.UNROLL, axis, 2 if by_two else 4))


def _upcast_transposed(k: Kernel) -> int | None:
  """A copy that transposes (an input contiguous along another axis than the output, as `x.T.contiguous()`): a
  register tile, the input's contiguous axis upcast by one 32-byte run (a sector on GPUs, a vector on the CPU), so
  both the loads and the stores (_upcast_output) move whole runs. Returns the access of that input. fp32 4096²
  transpose on the CPU: 64.6 -> 7.9 ms (numpy 131 ms)."""
  out = k.sts[0].real_strides()
  if not any(out[a] == 1 for a in range(k.global_dims)): return None
  for i, (access, st) in enumerate(zip(k.accesses, k.sts)):
    if access.op is not Ops.LOAD: continue
    strides = st.real_strides()
    axis = next((a for a in range(k.global_dims - 1, -1, -1) if strides[a] == 1 and out[a] != 1), None)
    run = 32 // access.src[0].dtype.base.itemsize
    if axis is not None and _int(k.full_shape[axis]) and k.full_shape[axis] % run == 0 and k.full_shape[axis] > run \
        and _try(k, Opt(OptOps.UPCAST, axis, run)):
      return i
  return None


def _transpose_block(k: Kernel, access: int) -> bool:
  """Blocks of a transposing copy: 32 threads (or 16, 8) along the output's contiguous axis, 4 along the input's,
  so a block reads whole 128-byte lines of each input row. fp32 8192² on the H200 (bench/NOTES.md run 18): 0.50 ms
  without the register tile, 0.18 ms with it in 256-thread rows, 0.146 ms (3.7 TB/s; torch 0.47 ms) in these
  blocks. The axes are found again after the upcasts (the finest global axis of the output and of the input)."""
  def finest(st) -> int | None:
    strides = st.real_strides()
    cands = [a for a in range(k.global_dims) if isinstance(strides[a], int) and strides[a] > 0]
    return min(cands, key=lambda a: strides[a]) if cands else None
  out_axis, axis = finest(k.sts[0]), finest(k.sts[access])
  if out_axis is None or axis is None or out_axis == axis: return False
  sizes = k.full_shape
  width = next((w for w in (32, 16, 8) if _int(sizes[out_axis]) and sizes[out_axis] % w == 0), None)
  if width is None or not (_int(sizes[axis]) and sizes[axis] % 4 == 0): return False
  return _try(k, Opt(OptOps.LOCAL, out_axis, width)) and _try(k, Opt(OptOps.LOCAL, axis, 4))


def _upcast_output(k: Kernel) -> None:
  """Upcast the axis along which the output is contiguous by 4 (float4 stores); not when a grouped reduce would be
  left with fewer than 2048 blocks (the first kernel of a split sum has 4096 outputs: a block each fills the GPU)."""
  if k.upcast_size() >= 32 or k.first_reduce == 0: return
  if k.group_for_reduces and prod(_int(s) or 1 << 20 for s in k.full_shape[:k.global_dims]) < 4 * 2048: return
  strides = k.sts[0].real_strides()
  for axis in range(k.first_reduce - 1, -1, -1):
    size = _int(k.full_shape[axis])
    if strides[axis] == 1 and size is not None and size % 4 == 0 and size > 4:
      _try(k, Opt(OptOps.UPCAST, axis, 4))
      return


def _add_locals(k: Kernel) -> None:
  """Threads per block along the global axes, innermost first, up to 256 in total (enough warps per block that
  the multiprocessors stay full without hitting the per-SM block limit)."""
  # reduce kernels (matmul, conv) want a 2-d block tile, so that neighbouring threads share the rows and columns
  # they load; elementwise kernels want long rows of threads
  total, widest = (128, 32) if k.reduceop is not None else (256, 256)
  if k.reduceop is not None and k.upcast_size() >= 128: total = 64   # big register tiles: more, smaller blocks
  budget = total // max(1, prod(_int(s) or 1 for s in k.full_shape[k.global_dims:k.first_reduce + k.group_for_reduces]))
  for axis in range(k.global_dims - 1, -1, -1):
    size = _int(k.full_shape[axis])
    if size is None: continue
    for amount in (a for a in (size, 256, 128, 64, 32, 16, 8, 4, 2) if a <= widest):
      if amount <= budget and size % amount == 0 and amount > 1 and _try(k, Opt(OptOps.LOCAL, axis, amount)):
        budget //= amount
        break
    if budget < 2: return
