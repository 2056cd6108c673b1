"""The Kernel: one scheduled AST plus its iteration space, and the Opts that reshape that space.

Every memory access of the AST (each LOAD, STORE and CONST view) has a ShapeTracker; all of them share one axis
list, `full_shape`. Axes are ordered `[global | local | group-for-reduce | reduce loops | upcast]`, where the upcast
tail holds both upcast output axes and unrolled reduce axes. An `Opt` splits an axis (`shift_to`) and moves the new
inner part into one of those regions; the linearizer turns the final layout into loops, thread indices and unrolls.
"""
from __future__ import annotations
from dataclasses import dataclass
from enum import Enum, auto
from fusegrad.helpers import prod, dedup
from fusegrad.uop import UOp, Ops, WGMMAArg
from fusegrad.shape.shapetracker import ShapeTracker
from fusegrad.renderer.cstyle import Renderer
from fusegrad.codegen.tensor_cores import TCPlan, match_matmul, M as TC_M, N as TC_N, K as TC_K, WGMMA, PANEL, WG_M


class OptOps(Enum):
  UPCAST = auto(); UNROLL = auto(); LOCAL = auto(); LASTLOCAL = auto(); GROUP = auto(); GROUPTOP = auto()  # noqa: E702
  NOLOCALS = auto(); PADTO = auto(); TC = auto(); THREAD = auto(); STAGE = auto(); RASTER = auto()  # noqa: E702

  def __repr__(self) -> str: return f"OptOps.{self.name}"


@dataclass(frozen=True)
class Opt:
  """One optimization step: `op` applied to `axis` (counted in the region the op acts on) with `amount`."""
  op: OptOps
  axis: int | None = None
  amount: int | None = None

  def __repr__(self) -> str: return f"Opt({self.op.name}, {self.axis}, {self.amount})"


@dataclass(frozen=True)
class StagedLoad:
  """A load the threads of a block share, read through shared memory (STAGE): in each iteration of the reduce
  loops the block copies the tile its threads and lanes read into a shared array, then computes from there.
  `axes` are the tile's axes in the buffer's own order, slowest first (so the copy reads whole rows of the
  buffer); `strides` their strides in the shared array, whose rows (the part contiguous in the buffer) are padded
  by 16 bytes so that threads reading different rows hit different banks."""
  access: int                  # position in Kernel.accesses
  axes: tuple[int, ...]
  strides: tuple[int, ...]
  row: int                     # how many of the last axes make the contiguous run (0: the last one is gathered)
  elements: int                # elements one tile copies
  size: int                    # elements of one tile's array, padding included (a multiple of 16 bytes)
  swizzled: bool = False       # STAGE 1 (wgmma): no padding; `strides` are of the plain [rows][run] matrix, which
                               # is stored in panels of 64 columns, 128-byte swizzled (tensor_cores.panel_offset)

  @property
  def run(self) -> int:
    """Columns of the tile: the elements of its contiguous run."""
    return self.elements if self.row == len(self.axes) else self.strides[len(self.axes) - self.row - 1]


@dataclass(frozen=True)
class WGMMAPlan:
  """STAGE 1: the TC kernel's two staged tiles feed warpgroup MMAs (wgmma), which read them straight from shared
  memory. One wgmma covers the warpgroup's 64 rows of M (the first LOCAL after TC is the warp within the group)
  and N = 8 x the upcast `n_axes` (N tiles, fastest first); each lane of the other upcast axes (M tiles, unrolled
  K) is one more wgmma."""
  n_axes: tuple[int, ...]
  arg: WGMMAArg


class KernelOptError(ValueError):
  """An Opt that does not fit this kernel (bad axis, amount not dividing the axis, no locals on this device...)."""


def _check(cond: bool, msg: str) -> None:
  if not cond: raise KernelOptError(msg)


class Kernel:
  """The iteration space of one kernel AST and the opts applied to it."""

  def __init__(self, ast: UOp, opts: Renderer):
    if ast.op is not Ops.SINK: raise TypeError(f"Kernel: expected a SINK ast, got {ast.op}")
    self.ast, self.opts = ast, opts
    nodes = ast.toposort()
    self.bufs: list[UOp] = sorted(dedup(n for n in nodes if n.op is Ops.DEFINE_GLOBAL), key=lambda b: b.arg)
    stores = [n for n in nodes if n.op is Ops.STORE]
    others = [n for n in nodes if n.op in (Ops.LOAD, Ops.CONST) and n.src]
    # access 0 is the (first) store: its shape is the output shape
    self.accesses: list[UOp] = stores + others
    self.sts: list[ShapeTracker] = [a.src[1].arg if a.op is not Ops.CONST else a.src[0].arg for a in self.accesses]
    # reduces in dependency order (one that feeds another comes first); `reduceop` is the last one
    self.reduceops: list[UOp] = [n for n in nodes if n.op is Ops.REDUCE]
    self.reduceop: UOp | None = self.reduceops[-1] if self.reduceops else None
    self.phases = self._phases()
    self.vars: list[UOp] = sorted({v for st in self.sts for v in st.vars()}, key=lambda v: v.arg.name)
    self.local_dims = 0
    self.group_for_reduces = 0
    self.upcasted = 0
    self.dont_use_locals = not opts.has_local
    self.applied_opts: list[Opt] = []
    self.tensor_core: TCPlan | None = None
    self.threads = 1   # CPU: axis 0 is split across this many cores (THREAD)
    self.staged: list[StagedLoad] = []   # loads read through shared memory (STAGE), in a ring of `stages` tiles
    self.stages = 0
    self.wgmma: WGMMAPlan | None = None   # STAGE 1: the tensor cores read the staged tiles themselves
    self.raster = 0   # launch order of the blocks: groups of this many rows of the grid (RASTER)
    # reduce axes last, then drop size-1 axes and merge what can be merged
    reduce_axes = [i for i in range(self.shape_len) if self._is_reduce_axis(i)]
    self.reshape_and_permute(None, [i for i in range(self.shape_len) if i not in reduce_axes] + reduce_axes)
    self.simplify_ones()
    self.simplify_merge_adjacent()
    # a property of the AST: opts split and move axes but never change which axes a phase varies along
    self.multireduce: bool = self._is_multireduce()

  # ***** phases: the parts of a kernel with several reduces *****
  def _phases(self) -> dict[UOp | None, tuple[list[int], list[UOp]]]:
    """For each reduce (and None: the code outside every reduce, ending in the store): the accesses it reads
    directly, and the reduces whose results it uses."""
    out: dict[UOp | None, tuple[list[int], list[UOp]]] = {}
    position = {a: i for i, a in enumerate(self.accesses)}
    for owner, root in [(r, r.src[0]) for r in self.reduceops] + [(None, self.ast)]:
      accesses, inner, stack, seen = [], [], [root], set()
      while stack:
        n = stack.pop()
        if n in seen: continue
        seen.add(n)
        if n.op is Ops.REDUCE: inner.append(n); continue  # noqa: E702
        if n in position: accesses.append(position[n])
        stack.extend(n.src)
      out[owner] = (sorted(accesses), inner)
    return out

  def phase_axes(self, owner: UOp | None) -> set[int]:
    """Axes a phase's values vary along: those its accesses span, and those of the reduce results it uses (less
    their own reduce axes)."""
    accesses, inner = self.phases[owner]
    axes = {i for a in accesses for i, s in enumerate(self.sts[a].shape) if not (isinstance(s, int) and s == 1)}
    for r in inner: axes |= self.phase_axes(r) - self.own_axes(r)
    return axes

  def own_axes(self, r: UOp) -> set[int]:
    """The reduce axes a reduce sums (maxes) over: the reduce axes its own accesses span."""
    accesses, _ = self.phases[r]
    return {i for a in accesses for i, s in enumerate(self.sts[a].shape)
            if self._is_reduce_axis(i) and not (isinstance(s, int) and s == 1)}

  def phase_uses(self, owner: UOp | None) -> set[int]:
    """Every axis a phase's loops or lanes run over: the axes it varies along, and a reduce's own axes."""
    return self.phase_axes(owner) | (self.own_axes(owner) if owner is not None else set())

  def _is_multireduce(self) -> bool:
    """Several reduces in one kernel, or one whose result is broadcast along an axis it does not vary along (the
    fused softmax: max, sum and the elementwise output in one kernel, each reduce on axes of its own)."""
    if len(self.reduceops) > 1: return True
    if not self.reduceops: return False
    used = self.phase_axes(self.reduceops[0])
    return any(i not in used for i in range(self.shape_len) if not self._is_reduce_axis(i) and self.full_shape[i] != 1)

  def _slots(self, axes: list[int]) -> list[list[int]]:
    """Group axes into shared slots: in a multireduce kernel, axes of equal size that no phase uses together can
    share one index (one thread id, one lane), since the phases run one after another. Otherwise one slot each."""
    if not self.multireduce: return [[a] for a in axes]
    uses = [self.phase_uses(p) for p in self.phases]
    slots: list[list[int]] = []
    for a in axes:
      for slot in slots:
        if self.full_shape[slot[0]] == self.full_shape[a] and \
           not any(a in u and any(b in u for b in slot) for u in uses):
          slot.append(a)
          break
      else:
        slots.append([a])
    return slots

  def lane_slots(self) -> list[list[int]]: return self._slots(self.upcasted_axes())
  def thread_slots(self) -> list[list[int]]:
    return self._slots(list(range(self.global_dims, self.first_reduce + self.group_for_reduces)))

  def lane_count(self) -> int: return int(prod(self.full_shape[s[0]] for s in self.lane_slots()))
  @property
  def copy_ahead(self) -> int:
    """Tiles a STAGE ring copies ahead of the one being read: all but one slot, less the slots of wgmma batches
    still running (WGMMAArg.in_flight)."""
    return self.stages - 1 - (self.wgmma.arg.in_flight if self.wgmma is not None else 0)
  def accumulator_count(self) -> int:
    """Lanes of the upcast output axes (a reduce's accumulators per thread; K's unrolled lanes add none)."""
    return int(prod(self.full_shape[ax] for ax in self.upcasted_axes() if not self._is_reduce_axis(ax)))
  def thread_count(self) -> int: return int(prod(self.full_shape[s[0]] for s in self.thread_slots()))

  # ***** the layout *****
  @property
  def shape_len(self) -> int: return len(self.sts[0].shape)
  @property
  def output_shape(self) -> tuple: return self.sts[0].shape

  @property
  def full_shape(self) -> tuple:
    # remembered per list of views (every change to the layout assigns a new list)
    if getattr(self, "_full_shape_of", None) is not self.sts:
      out = []
      for i in range(self.shape_len):
        sizes = [st.shape[i] for st in self.sts if not (isinstance(st.shape[i], int) and st.shape[i] == 1)]
        out.append(sizes[0] if sizes else 1)
      self._full_shape, self._full_shape_of = tuple(out), self.sts
    return self._full_shape

  def _is_reduce_axis(self, i: int) -> bool:
    return self.output_shape[i] == 1 and not (isinstance(self.full_shape[i], int) and self.full_shape[i] == 1)

  @property
  def first_reduce(self) -> int:
    for i in range(self.shape_len - self.upcasted):
      if self._is_reduce_axis(i): return i
    return self.shape_len - self.upcasted

  @property
  def global_dims(self) -> int: return self.first_reduce - self.local_dims
  @property
  def first_upcast(self) -> int: return self.shape_len - self.upcasted

  def upcasted_axes(self) -> list[int]: return list(range(self.first_upcast, self.shape_len))
  def unrolled_axes(self) -> list[int]: return [i for i in self.upcasted_axes() if self._is_reduce_axis(i)]

  def colors(self) -> list[str]:
    """One color per axis, as DEBUG prints it: blue global, cyan local, green group, red reduce, yellow upcast,
    magenta unrolled reduce."""
    out = ["blue"] * self.global_dims + ["cyan"] * self.local_dims + ["green"] * self.group_for_reduces
    out += ["red"] * (self.first_upcast - self.first_reduce - self.group_for_reduces)
    out += ["magenta" if self._is_reduce_axis(i) else "yellow" for i in self.upcasted_axes()]
    return out

  @property
  def name(self) -> str:
    return ("r_" if self.reduceop is not None else "E_") + "_".join(
      str(s) if isinstance(s, int) else s.render() for s in self.full_shape)

  # ***** reshaping every access together *****
  def reshape_and_permute(self, new_shape_fn, axis: list[int] | None) -> None:
    new_sts = []
    for st in self.sts:
      if new_shape_fn is not None: st = st.reshape(tuple(new_shape_fn(st.shape)))
      if axis is not None: st = st.permute(tuple(axis))
      new_sts.append(st)
    self.sts = new_sts

  def shift_to(self, axis: int, amount: int, top: bool = False, insert_before: int | None = None) -> None:
    """Split `axis` into (size/amount, amount) (or (amount, size/amount) when top) and move the `amount` part
    before `insert_before` (the end when None)."""
    if insert_before is None: insert_before = self.shape_len
    move_axis = axis if top else axis + 1
    if move_axis < insert_before: insert_before += 1

    def split(shape):
      s = shape[axis]
      parts = (1, 1) if s == 1 else ((amount, s // amount) if top else (s // amount, amount))
      return shape[:axis] + parts + shape[axis + 1:]
    # insert_before counts axes after the split; removing move_axis first shifts later positions down by one
    order = [i for i in range(self.shape_len + 1) if i != move_axis]
    order.insert(insert_before - 1 if move_axis < insert_before else insert_before, move_axis)
    self.reshape_and_permute(split, order)

  def simplify_ones(self) -> None:
    """Drop axes that are 1 in every access (the leftovers of opts that consumed a whole axis)."""
    full = self.full_shape
    ones = [i for i, s in enumerate(full) if isinstance(s, int) and s == 1]
    if not ones: return
    # no region count changes: local, group and upcast axes are created with sizes > 1, so a size-1 axis is always a
    # global or reduce leftover (and a reduce axis of size 1 no longer looks like one, so shapes can't tell regions)
    self.reshape_and_permute(lambda shape: tuple(s for i, s in enumerate(shape) if i not in ones), None)

  def simplify_merge_adjacent(self) -> None:
    """Merge neighbouring axes of the same kind when every access can be reshaped without a new view."""
    i = 0
    while i < self.first_upcast - 1:
      # same kind, and read by the same accesses (two reduces' private axes never merge)
      same_kind = self._is_reduce_axis(i) == self._is_reduce_axis(i + 1) and \
          all((st.shape[i] == 1) == (st.shape[i + 1] == 1) for st in self.sts)
      if same_kind and (i + 1 != self.first_reduce) and self._try_merge(i):
        continue
      i += 1

  def _try_merge(self, i: int) -> bool:
    new_sts = []
    for st in self.sts:
      shape = st.shape
      merged = st.reshape(shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2:])
      if len(merged.views) > len(st.views): return False
      new_sts.append(merged)
    self.sts = new_sts
    return True

  # ***** opts *****
  def apply_opt(self, opt: Opt) -> None:
    """Apply one Opt; raise KernelOptError (and leave the kernel unchanged) when it does not fit."""
    _check(not self.staged, f"{opt}: STAGE must be the last opt (its tiles are laid out for the final layout)")
    _check(not self.raster or opt.op is OptOps.STAGE, f"{opt}: only STAGE may follow RASTER (it fixes the grid)")
    saved = (list(self.sts), self.local_dims, self.group_for_reduces, self.upcasted, self.dont_use_locals)
    try:
      self._apply_opt(opt)
    except KernelOptError:
      self.sts, self.local_dims, self.group_for_reduces, self.upcasted, self.dont_use_locals = saved
      raise
    self.applied_opts.append(opt)

  def _real_axis(self, opt: Opt) -> int:
    if opt.op in (OptOps.UNROLL, OptOps.GROUP, OptOps.GROUPTOP):   # the reduce loops after any group axes
      base = self.first_reduce + self.group_for_reduces
      count = self.first_upcast - base
    elif opt.op in (OptOps.LOCAL, OptOps.LASTLOCAL): base, count = 0, self.global_dims
    else: base, count = 0, self.first_reduce
    _check(opt.axis is not None and 0 <= opt.axis < count,
           f"{opt}: axis must be in [0, {count}) for {opt.op.name} on a kernel of shape {self.full_shape}")
    return base + opt.axis

  def _apply_opt(self, opt: Opt) -> None:
    if opt.op is OptOps.TC: return self.apply_tensor_cores(opt.axis or 0)
    if opt.op is OptOps.STAGE: return self.apply_stage(opt)
    if opt.op is OptOps.RASTER: return self.apply_raster(opt)
    _check(self.tensor_core is None or opt.op in (OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL),
           f"{opt}: after TC only UPCAST, UNROLL and LOCAL may follow (the warp layout is fixed)")
    if opt.op is OptOps.THREAD: return self.apply_threads(opt)
    if opt.op is OptOps.NOLOCALS:
      _check(self.local_dims == 0 and self.group_for_reduces == 0, f"{opt}: locals are already in use")
      self.dont_use_locals = True
      return
    axis = self._real_axis(opt)
    size = self.full_shape[axis]
    _check(isinstance(size, int), f"{opt}: axis {axis} has symbolic size {size}")
    amount = opt.amount if opt.amount else size
    _check(amount > 1 and size % amount == 0, f"{opt}: amount {amount} must be > 1 and divide axis size {size}")
    if opt.op in (OptOps.LOCAL, OptOps.LASTLOCAL, OptOps.GROUP, OptOps.GROUPTOP):
      _check(self.opts.has_local and not self.dont_use_locals, f"{opt}: this kernel/device has no thread blocks")
    if opt.op in (OptOps.UPCAST, OptOps.UNROLL):
      _check(amount <= 32, f"{opt}: upcast amount {amount} is too large (at most 32)")
      _check(self.tensor_core is None or axis < self.first_reduce - 2 or axis >= self.first_reduce,
             f"{opt}: axis {axis} is one of the tensor cores' thread axes (g, t), which the warp layout fixes")
      self.shift_to(axis, amount, insert_before=None)
      self.upcasted += 1
      # tensor-core kernels lower fragments, not lanes: the 16 K lanes of each mma do not count against the limit,
      # nor does an unrolled K (wgmma's 64 x 256 per warpgroup, 64 deep: 8192 lanes); the accumulators (one register
      # each) must fit a thread's 255 registers
      limit = 256 * (32 if self.tensor_core is not None else 1)
      _check(self.lane_count() <= limit, f"{opt}: more than {limit} upcasted elements")
      _check(self.tensor_core is None or self.accumulator_count() <= 256,
             f"{opt}: more than 256 accumulators a thread ({self.accumulator_count()})")
    elif opt.op in (OptOps.LOCAL, OptOps.LASTLOCAL):
      # after TC the warp's own ids (g, t) stay the last two local axes: new ones (warps per block) go before them
      self.shift_to(axis, amount, top=opt.op is OptOps.LASTLOCAL,
                    insert_before=self.global_dims if self.tensor_core is not None else self.first_reduce)
      self.local_dims += 1
      _check(self.thread_count() <= self.opts.local_max_threads,
             f"{opt}: more than {self.opts.local_max_threads} threads per block")
    elif opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
      _check(self.reduceop is not None and (self.group_for_reduces == 0 or self.multireduce),
             f"{opt}: needs a reduce, grouped once")
      self.shift_to(axis, amount, top=opt.op is OptOps.GROUPTOP,
                    insert_before=self.first_reduce + self.group_for_reduces)
      self.group_for_reduces += 1
      _check(self.thread_count() <= self.opts.local_max_threads,
             f"{opt}: more than {self.opts.local_max_threads} threads per block")
    else:
      raise KernelOptError(f"{opt}: {opt.op.name} is not supported on this kernel")
    self.simplify_ones()

  def apply_threads(self, opt: Opt) -> None:
    """Split global axis 0 so its outer `amount` part runs on that many CPU cores (each takes a contiguous chunk)."""
    _check(self.opts.max_threads > 1, f"{opt}: the {self.opts.device} device does not run kernels on several cores")
    _check(self.threads == 1 and not self.opts.has_local, f"{opt}: already threaded, or a device with thread blocks")
    _check(self.global_dims > 0 and opt.axis == 0, f"{opt}: needs global axis 0")
    amount, size = opt.amount, self.full_shape[0]
    _check(isinstance(size, int) and amount is not None and 1 < amount <= self.opts.max_threads and size % amount == 0,
           f"{opt}: {amount} threads must divide axis 0 of size {size} (at most {self.opts.max_threads} threads)")
    if amount < size: self.shift_to(0, amount, top=True, insert_before=0)
    self.threads = amount

  def apply_tensor_cores(self, choice: int = 0) -> None:
    """Map SUM(A*B) of fp16/bf16 loads onto mma m16n8k16: M splits into (.., mh 2 upcast, g 8 local), N into
    (.., t 4 local, nl 2 upcast) and K into (.., 16 unrolled). `choice` (the opt's axis) picks which load is A
    when both fit (0: the first that fits; a conv can take the image or the weights as A)."""
    _check("m16n8k16" in self.opts.tensor_cores, f"TC: the {self.opts.device} device has no tensor cores")
    _check(not self.applied_opts and not self.dont_use_locals, "TC: must be the first opt, on a kernel with locals")
    loads = match_matmul(self.reduceop)
    _check(loads is not None, "TC: the reduce is not a sum of products of two float16/bfloat16 loads")
    a, b, dtype_in = loads
    fits = [x for x in (self._tc_axes(a, b), self._tc_axes(b, a)) if x is not None]
    _check(bool(fits), f"TC: no M/N axes divisible by {TC_M}/{TC_N} in {self.full_shape}")
    _check(0 <= choice < len(fits), f"TC: choice {choice} of {len(fits)} ways to map the operands")
    axes = fits[choice]
    # K: a reduce axis along which both operands move, a multiple of 16 (the rest stay reduce loops, as in a conv)
    sa, sb = (self.sts[self.accesses.index(x)].real_strides() for x in axes[2:])
    fs = self.full_shape
    ks = [r for r in range(self.first_reduce, self.first_upcast)
          if isinstance(fs[r], int) and fs[r] % TC_K == 0 and sa[r] != 0 and sb[r] != 0]
    _check(bool(ks), f"TC: no reduce axis of {fs} is a multiple of 16 along which both operands move")
    k_rel = ks[-1] - self.first_reduce
    m_axis, n_axis, a, b = axes
    self.shift_to(m_axis, 8, insert_before=self.first_reduce)      # g: 8 threads
    self.local_dims += 1
    self.shift_to(n_axis, 2)                                        # nl: 2 lanes
    self.upcasted += 1
    self.shift_to(n_axis, 4, insert_before=self.first_reduce)      # t: 4 threads
    self.local_dims += 1
    self.shift_to(m_axis, 2)                                        # mh: 2 lanes, after nl
    self.upcasted += 1
    self.shift_to(self.first_reduce + k_rel, TC_K)                  # k: 16, unrolled
    self.upcasted += 1
    self.simplify_ones()
    self.tensor_core = TCPlan(a, b, dtype_in)

  def apply_stage(self, opt: Opt) -> None:
    """Read the reduce's loads that several threads of a block share (matmul: a row of A for every thread of a
    column of the block) from shared memory, filled by the whole block once per iteration of the reduce loops.
    `amount` tiles per load (default 2) form a ring: the copies run that many iterations minus one ahead of the
    compute. `axis` is the tiles' reader: 0 the threads (rows padded against bank conflicts), 1 the tensor cores
    through wgmma (a TC kernel's two operands, 128-byte swizzled: WGMMAPlan), 2 wgmma with one iteration's batch
    still running while the next is issued (the copies then run one tile less ahead). The last opt of a kernel."""
    _check(opt.axis in (None, 0, 1, 2), f"{opt}: axis picks the tiles' reader: 0 (the threads), 1 (wgmma) or 2 "
                                        f"(wgmma, one batch in flight)")
    wgmma = opt.axis in (1, 2)
    _check(self.opts.has_shared and self.opts.has_local and not self.dont_use_locals and self.local_dims > 0,
           "STAGE: needs thread blocks with shared memory (and a LOCAL axis)")
    _check(self.reduceop is not None and not self.multireduce and self.group_for_reduces == 0,
           "STAGE: needs one reduce that is not grouped")
    _check(not wgmma or WGMMA in self.opts.tensor_cores,
           f"{opt}: wgmma needs a device with warpgroup MMAs (sm_90), not {self.opts.device} {self.opts.arch}")
    _check(not wgmma or self.tensor_core is not None, f"{opt}: wgmma needs a TC kernel (TC as the first opt)")
    fs = self.full_shape
    _check(all(isinstance(s, int) for s in fs[self.global_dims:]), f"STAGE: the block's shape {fs} is symbolic")
    block, lanes = list(range(self.global_dims, self.first_reduce)), self.upcasted_axes()
    looped = self.first_upcast > self.first_reduce
    stages = (opt.amount or 2) if looped else 1
    _check(not looped or 2 <= stages <= 8, f"{opt}: 2 to 8 tiles per load in a reduce loop (one is being read "
                                           f"while the next arrives)")
    _check(opt.axis != 2 or (looped and stages >= 3), f"{opt}: a batch in flight needs a reduce loop and a ring of "
                                                      f"at least 3 tiles (one read, one being read, one arriving)")
    threads = self.thread_count()
    operands = (self.tensor_core.a, self.tensor_core.b) if wgmma else ()
    staged, total = [], 0
    for i in self.phases[self.reduceop][0]:
      if self.accesses[i].op is not Ops.LOAD or (wgmma and self.accesses[i] not in operands): continue
      st = self.sts[i]
      strides = st.real_strides()
      def varies(ax: int) -> bool: return fs[ax] > 1 and st.shape[ax] != 1 and strides[ax] != 0  # noqa: B023
      if all(varies(ax) for ax in block if fs[ax] > 1): continue   # no other thread reads what this one does
      # the buffer's order, slowest first: None (a gathered axis) counts as slowest; ties keep the layout's order
      axes = sorted((ax for ax in block + lanes if varies(ax)),
                    key=lambda ax: -strides[ax] if isinstance(strides[ax], int) else -(1 << 62))
      item = self.accesses[i].src[0].dtype.base.itemsize
      smem: dict[int, int] = {}
      running, row = 1, None
      fastest = self._is_reduce_axis(axes[-1]) if axes else False
      for n, ax in enumerate(reversed(axes)):
        # past the run of axes contiguous in the buffer: pad the row (wgmma: a row holds k only, or m or n only)
        if row is None and (strides[ax] != running or (wgmma and self._is_reduce_axis(ax) != fastest)):
          row = n
          if running > 1 and not wgmma: running += 16 // item
        smem[ax] = running
        running *= fs[ax]
      elements = int(prod(fs[ax] for ax in axes))
      size = -(-running // (16 // item)) * (16 // item)
      _check(elements % threads == 0 and elements // threads <= 1024,
             f"STAGE: a tile of {elements} elements does not split evenly over {threads} threads")
      staged.append(StagedLoad(i, tuple(axes), tuple(smem[ax] for ax in axes), len(axes) if row is None else row,
                               elements, size, swizzled=wgmma))
      total += size * item * stages
    _check(bool(staged), "STAGE: no load of the reduce is shared by the threads of a block")
    _check(total <= self.opts.shared_max, f"STAGE: tiles need {total} bytes of shared memory, more than "
                                          f"{self.opts.shared_max}")
    self.wgmma = self._wgmma_plan(opt, staged, 1 if opt.axis == 2 else 0) if wgmma else None
    self.staged, self.stages = staged, stages

  def _wgmma_plan(self, opt: Opt, staged: list[StagedLoad], in_flight: int) -> WGMMAPlan:
    """Check that the staged tiles and the warp layout fit wgmma (KernelOptError naming what does not), and plan
    the instruction: the warpgroup is the first LOCAL after TC (4 warps along M); N is 8 x the upcast axes of N
    tiles; each operand's tile is K-major (a row holds k) or MN-major (a row holds m or n), in 64-column panels of
    8-row groups, and every other axis moves an instruction's origin by whole groups and panels."""
    tc, fs = self.tensor_core, self.full_shape
    ax_w, ax_g, ax_t = self.first_reduce - 3, self.first_reduce - 2, self.first_reduce - 1
    ax_nl, ax_mh, ax_k = self.first_upcast, self.first_upcast + 1, self.first_upcast + 2
    sa, sb = (self.sts[self.accesses.index(x)].real_strides() for x in (tc.a, tc.b))
    _check(ax_w >= self.global_dims and fs[ax_w] == 4 and sa[ax_w] != 0 and sb[ax_w] == 0,
           f"{opt}: wgmma needs the first LOCAL after TC to put 4 warps along M (the warpgroup)")
    plans = {self.accesses[p.access]: p for p in staged}
    _check(set(plans) == {tc.a, tc.b}, f"{opt}: wgmma needs both tensor-core operands staged")
    _check(all(x.src[0].dtype.base is tc.dtype_in for x in (tc.a, tc.b)),
           f"{opt}: wgmma reads {tc.dtype_in.name} tiles; an operand is cast from another dtype in the kernel")
    b_stride = dict(zip(plans[tc.b].axes, plans[tc.b].strides))
    n_axes = sorted((ax for ax in self.upcasted_axes()[3:] if sb[ax] != 0 and sa[ax] == 0),
                    key=lambda ax: b_stride.get(ax, 0))
    n = 8 * int(prod(fs[ax] for ax in n_axes))
    _check(n <= 256, f"{opt}: a wgmma covers at most 256 columns of N, not {n}")
    def operand(p: StagedLoad, mn: list[tuple[int, int]], extent: int, name: str) -> tuple[bool, int]:
      """(MN-major, leading byte offset in elements) of one operand, whose `mn` axes must sit at the given
      positions of the instruction's M or N."""
      stride, cols = dict(zip(p.axes, p.strides)), p.run
      rows = p.elements // cols
      _check(cols % PANEL == 0 and rows % 8 == 0, f"{opt}: {name}'s tile of {rows} x {cols} is not made of 64-column "
                                                   f"panels of 8-row groups")
      def place(ax: int) -> tuple[bool, int]:   # (along a row, by how much) or (down the rows, by how many)
        s = stride.get(ax, 0)
        return (True, s) if s < cols else (False, s // cols)
      along_k, step = place(ax_k)
      _check(step == 1, f"{opt}: {name}'s tile does not hold the 16 k of a wgmma side by side or row by row")
      trans = not along_k
      _check(all(place(ax) == (trans, unit) for ax, unit in mn),
             f"{opt}: {name}'s tile does not hold the wgmma's {'M' if name == 'A' else 'N'} in order (a LOCAL or "
             f"UPCAST between its parts: UPCAST the N tiles before any LOCAL along N)")
      _check(not trans or extent <= PANEL or extent % PANEL == 0, f"{opt}: {name} spans part of a panel")
      for ax in stride:
        if ax == ax_k or ax in dict(mn): continue
        col, amount = place(ax)
        _check(amount % ((PANEL if trans else 16) if col else 8) == 0,
               f"{opt}: axis {ax} moves {name}'s wgmma origin off a panel or an 8-row group")
      return trans, rows * PANEL if trans else 8
    trans_a, lbo_a = operand(plans[tc.a], [(ax_w, 16), (ax_mh, 8), (ax_g, 1)], WG_M, "A")
    mn_b, unit = [(ax_nl, 1), (ax_t, 2)], 8
    for ax in n_axes:
      mn_b.append((ax, unit))
      unit *= fs[ax]
    trans_b, lbo_b = operand(plans[tc.b], mn_b, n, "B")
    return WGMMAPlan(tuple(n_axes), WGMMAArg(tc.dtype_in, n, trans_a, trans_b, lbo_a, lbo_b, in_flight))

  def apply_raster(self, opt: Opt) -> None:
    """Launch the blocks of the last two grid axes in groups of `amount` rows: consecutive blocks then cover an
    amount x (wave / amount) patch of the output, so the rows of A and columns of B a wave of blocks reads stay in
    the L2 cache together (row-major order would stream all of B once per row of blocks)."""
    _check(self.opts.has_local and not self.dont_use_locals and 2 <= self.global_dims <= 3 and not self.multireduce,
           f"{opt}: needs a grid of two or three axes")
    rows = self.full_shape[self.global_dims - 2]
    _check(isinstance(rows, int) and opt.amount is not None and opt.amount > 1 and rows % opt.amount == 0,
           f"{opt}: {opt.amount} must divide the grid's {rows} rows")
    self.raster = opt.amount

  def _tc_axes(self, a: UOp, b: UOp):
    sa, sb = self.sts[self.accesses.index(a)].real_strides(), self.sts[self.accesses.index(b)].real_strides()
    fs = self.full_shape
    fits = [isinstance(s, int) for s in fs]
    ms = [i for i in range(self.first_reduce) if sa[i] != 0 and sb[i] == 0 and fits[i] and fs[i] % TC_M == 0]
    ns = [i for i in range(self.first_reduce) if sa[i] == 0 and sb[i] != 0 and fits[i] and fs[i] % TC_N == 0]
    return (ms[-1], ns[-1], a, b) if ms and ns else None

  # ***** helpers for heuristics *****
  def load_sts(self) -> list[ShapeTracker]:
    """The views of the buffer loads (constants have views too, but no memory behind them)."""
    return [st for a, st in zip(self.accesses, self.sts) if a.op is Ops.LOAD]

  def upcast_size(self) -> int: return int(prod(self.full_shape[i] for i in self.upcasted_axes()))

  def __repr__(self) -> str:
    return f"<Kernel {self.name} full_shape={self.full_shape} opts={self.applied_opts}>"
