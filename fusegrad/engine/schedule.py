"""The scheduler: the whole-graph fusion decision that turns lazy graphs into kernel ASTs.

Starting from the buffers to realize, each kernel inlines everything it can: elementwise chains (seen through any
unmasked view, so movement ops cost nothing), at most one REDUCE reached through a plain reshape (elementwise ops
before it fuse into it, and those after it fuse into the same kernel), and constants as literals. A base becomes
its own kernel only when it must: it is an output, a forced realization, a REDUCE read through an expanding or
permuting view or by several consumers, or an op whose padding would not stay zero.
"""
from __future__ import annotations
import sys
from dataclasses import dataclass, field
from fusegrad.helpers import prod, stage, all_int
from fusegrad.dtype import dtypes
from fusegrad.uop import UOp, Ops, GroupOp
from fusegrad.shape.shapetracker import ShapeTracker
from fusegrad.shape.view import View, strides_for_shape
from fusegrad.lazy import LazyBuffer
from fusegrad.device import Buffer

# ops whose output is not 0 where all inputs are 0: they can't be computed under a padding view
UNSAFE_PAD = frozenset({Ops.EXP2, Ops.LOG2, Ops.RECIP, Ops.FDIV, Ops.POW, Ops.CMPEQ})
MAX_NESTED = 4   # reduces one kernel may compute inside itself besides its own
# lazy graphs can be long chains; building a kernel walks them recursively
sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))


@dataclass(frozen=True)
class ScheduleItem:
  """One unit of work: a kernel AST (SINK) with its buffers (output first), or a COPY / EMPTY."""
  ast: UOp
  bufs: tuple[Buffer, ...]
  var_vals: dict[UOp, int] = field(default_factory=dict)
  outputs: tuple[LazyBuffer, ...] = ()


def resolve(x, var_vals: dict[UOp, int] | None = None) -> int:
  """A concrete int for a shape entry: bound variables take their bound values."""
  if isinstance(x, int): return x
  env = {}
  for n in x.toposort():
    if n.op is Ops.BIND: env[n.src[0].arg.name] = n.src[1].arg
  return int(x.evaluate(env))


def _walk_bases(outs: list[LazyBuffer]) -> tuple[list[LazyBuffer], dict[LazyBuffer, int]]:
  """Every unrealized base reachable from `outs`, and how many distinct bases consume each."""
  seen: dict[LazyBuffer, None] = {}
  consumers: dict[LazyBuffer, int] = {}
  stack = [o.base for o in outs]
  while stack:
    b = stack.pop()
    if b in seen: continue
    seen[b] = None
    if b.realized is not None: continue
    for s in dict.fromkeys(src.base for src in b.srcs):
      consumers[s] = consumers.get(s, 0) + 1
      stack.append(s)
  return list(seen), consumers


class _Scheduler:
  def __init__(self, outs: list[LazyBuffer]):
    bases, self.consumers = _walk_bases(outs)
    self.must_realize: set[LazyBuffer] = {o.base for o in outs if o.base.op is not Ops.CONST}
    self.must_realize |= {b for b in bases if getattr(b, "forced_realize", False)}
    self.items: list[ScheduleItem] = []
    self.done: set[LazyBuffer] = set()

  def require(self, b: LazyBuffer) -> None:
    """Schedule the kernel that computes base `b` (after the kernels it depends on)."""
    if b in self.done or b.realized is not None: return
    self.done.add(b)
    self.must_realize.add(b)
    if b.buffer is None: b.buffer = Buffer(b.device, resolve(prod(b.shape)) if b.shape else 1, b.dtype)
    if b.op is Ops.EMPTY:
      self.items.append(ScheduleItem(UOp(Ops.EMPTY), (b.buffer,), outputs=(b,)))
    elif b.op is Ops.COPY:
      src = b.srcs[0].base
      self.require(src)
      self.items.append(ScheduleItem(UOp(Ops.COPY), (b.buffer, src.buffer), outputs=(b,)))
    else:
      self.items.append(_KernelBuilder(self, b).build())


class _KernelBuilder:
  """Builds the AST of the kernel whose output is base `out`."""

  def __init__(self, sched: _Scheduler, out: LazyBuffer):
    self.sched, self.out = sched, out
    self.bufs: list[Buffer] = [out.buffer]
    self.buf_uops: dict[LazyBuffer, UOp] = {out: UOp(Ops.DEFINE_GLOBAL, out.dtype.ptr(), (), 0)}
    self.var_vals: dict[UOp, int] = {}
    self.memo: dict[tuple[LazyBuffer, ShapeTracker], UOp] = {}
    self.fused_reduce = self.find_fusable_reduce()
    self.nested: dict[LazyBuffer, int] = {}   # reduce computed inside this kernel -> first of its private axes

  def view(self, st: ShapeTracker) -> UOp:
    st, var_vals = st.unbind()
    self.var_vals.update(var_vals)
    return UOp(Ops.VIEW, dtypes.void, (), st)

  def build(self) -> ScheduleItem:
    out = self.out
    kernel_shape = self.fused_reduce.shape if self.fused_reduce is not None else out.shape
    top = ShapeTracker.from_shape(out.shape).reshape(kernel_shape) if kernel_shape != out.shape else \
        ShapeTracker.from_shape(out.shape)
    src = out.srcs[0] if out.op is Ops.CONTIGUOUS else out
    # reduces computed inside this kernel get private axes after the kernel's own (size 1 outside their bodies)
    extra = 0
    for b in self.find_nested_reduces(src if src is not out else None):
      self.nested[b] = len(kernel_shape) + extra
      extra += len(b.arg.axis)
    if extra: top = top.reshape(top.shape + (1,) * extra)
    self.reduce_axes = set(range(len(kernel_shape), len(kernel_shape) + extra))
    if self.fused_reduce is not None: self.reduce_axes |= set(self.fused_reduce.arg.axis)
    self.output_axes = frozenset(i for i, n in enumerate(kernel_shape) if i not in self.reduce_axes and n != 1)
    self.nest_axes: frozenset | None = None
    value = self.node(src, top) if src is not out else self.inline(out, top)
    store = UOp(Ops.STORE, dtypes.void, (self.buf_uops[out], self.view(top), value))
    return ScheduleItem(UOp(Ops.SINK, dtypes.void, (store,)), tuple(self.bufs), self.var_vals, (out,))

  def find_fusable_reduce(self) -> LazyBuffer | None:
    """A REDUCE reachable from the output through elementwise ops and plain reshapes, used only here."""
    stack = [self.out.srcs[0] if self.out.op is Ops.CONTIGUOUS else self.out]
    seen = set()
    while stack:
      lb = stack.pop()
      b = lb.base
      if id(b) in seen or (b is not self.out and self.is_realized(b)): continue
      seen.add(id(b))
      if not (lb.st.contiguous or b is lb): continue
      if b.op is Ops.REDUCE:
        if (b is self.out or self.sched.consumers.get(b, 0) <= 1) and prod(b.shape) == prod(self.out.shape):
          return b
        continue
      if b.op in GroupOp.ALU or b.op in (Ops.CAST, Ops.BITCAST): stack.extend(b.srcs)
    return None

  def find_nested_reduces(self, start: LazyBuffer | None) -> list[LazyBuffer]:
    """REDUCEs this kernel can compute itself although their result is broadcast (softmax's max and sum): used by
    nothing else, read through unmasked views, with a non-reduced axis (a full reduction stays its own kernel, so
    that it is not one thread block's work on a GPU)."""
    found: list[LazyBuffer] = []
    stack = [start] if start is not None else list(self.out.srcs)
    if self.fused_reduce is not None: stack = list(self.fused_reduce.srcs) + stack
    seen: set[int] = set()
    while stack:
      lb = stack.pop()
      b = lb.base
      if id(lb) in seen or (b is not self.out and self.is_realized(b)): continue
      seen.add(id(lb))
      if b.op is Ops.REDUCE:
        if b is not self.fused_reduce and b not in found and len(found) < MAX_NESTED and self.nestable(b, lb):
          found.append(b)
          stack.extend(b.srcs)
        continue
      if b.op in GroupOp.ALU or b.op in (Ops.CAST, Ops.BITCAST): stack.extend(b.srcs)
    return found

  def nestable(self, b: LazyBuffer, lb: LazyBuffer) -> bool:
    """A cheap first check; nested_view decides with the view the kernel reads b through."""
    src = b.srcs[0]
    if not (all_int(src.shape) and all_int(lb.shape)) or self.sched.consumers.get(b, 0) > 1: return False
    if any(v.mask is not None for v in lb.st.views): return False
    # inside a kernel that has a reduce of its own, only a reduce over the same input size (layernorm's mean in its
    # variance): a row statistic nested in a matmul would cost the matmul its register tiling
    if self.fused_reduce is not None and prod(src.shape) != prod(self.fused_reduce.srcs[0].shape): return False
    # only reduces over the innermost axes (softmax/layernorm over the last dim): a thread block's threads, or a CPU
    # vector, then read neighbouring elements; over an outer axis they would stride through memory, and on the CPU
    # the output would be written column by column (x - x.mean(0): 2.7 ms fused, 1.2 ms as two kernels)
    if tuple(sorted(b.arg.axis)) != tuple(range(len(src.shape) - len(b.arg.axis), len(src.shape))): return False
    return 1 < prod(b.shape) < prod(src.shape)

  def nested_view(self, b: LazyBuffer, st: ShapeTracker) -> ShapeTracker | None:
    """The view of b's input in kernel space: `st` (kernel -> b) with b's private axes standing for the reduced
    axes. Axes along which b's result is only broadcast become size 1, so the same reduce reached from two places
    is one UOp and the linearizer sees which axes it varies along."""
    src, axes, pos = b.srcs[0], b.arg.axis, self.nested[b]
    last = st.views[-1]
    keep = [not (st_ == 0 and (last.mask is None or last.mask[i] == (0, n)))
            for i, (n, st_) in enumerate(zip(last.shape, last.strides))]
    if any(last.shape[pos + j] != 1 for j in range(len(axes))): return None
    # b must not vary along a reduce axis (its own result would be needed inside another reduce's loop)
    if any(k and i in self.reduce_axes for i, k in enumerate(keep)): return None
    # every reduce of the kernel varies along the same axes (those of the kernel's own reduce, if it has one): then
    # each is computed once per index of them, in the loops or grid ids outside the rest; with different ones (x -
    # x.mean(0) - x.mean(1)) one of them would be recomputed for every index of the other's axes
    varies = frozenset(i for i, k in enumerate(keep) if k and last.shape[i] != 1)
    if self.nest_axes is None: self.nest_axes = self.output_axes if self.fused_reduce is not None else varies
    if varies != self.nest_axes: return None
    squeezed = View.create(tuple(n if k else 1 for n, k in zip(last.shape, keep)), last.strides, last.offset,
                           None if last.mask is None else tuple(m if k else (0, 1) for m, k in zip(last.mask, keep)))
    views = st.views[:-1] + (squeezed,)
    red = tuple(src.shape[a] for a in axes)
    size = prod(red)
    # every view addresses b's elements; b's input laid out as (b's elements, reduced elements) adds a fast index
    wide = tuple(View.create(v.shape + red, tuple(x * size for x in v.strides) + strides_for_shape(red),
                             v.offset * size, None if v.mask is None else v.mask + tuple((0, n) for n in red))
                 for v in views)
    n = len(last.shape)
    order: list[int] = []
    for i in range(n):
      order.append(i)
      if pos <= i < pos + len(red): order.append(n + i - pos)
    placed = ShapeTracker(wide).permute(tuple(order))
    placed = placed.reshape(tuple(red[i - pos] if pos <= i < pos + len(red) else s
                                  for i, s in enumerate(views[-1].shape)))
    layout = ShapeTracker.from_shape(src.shape).permute(tuple(i for i in range(len(src.shape)) if i not in axes) + axes)
    return layout + placed

  def is_realized(self, b: LazyBuffer) -> bool:
    return b.realized is not None or (b in self.sched.must_realize and b is not self.out)

  def load(self, b: LazyBuffer, st: ShapeTracker) -> UOp:
    self.sched.require(b)
    if b not in self.buf_uops:
      self.buf_uops[b] = UOp(Ops.DEFINE_GLOBAL, b.dtype.ptr(), (), len(self.bufs))
      self.bufs.append(b.base.buffer)
    return UOp(Ops.LOAD, b.dtype, (self.buf_uops[b], self.view(st)))

  def node(self, lb: LazyBuffer, top: ShapeTracker) -> UOp:
    """The AST of `lb` as seen through `top` (kernel index space -> lb's shape)."""
    b = lb.base
    st = lb.st + top if lb.is_view else top
    key = (b, st)
    if key not in self.memo: self.memo[key] = self.inline(b, st)
    return self.memo[key]

  def inline(self, b: LazyBuffer, st: ShapeTracker) -> UOp:
    if self.is_realized(b): return self.load(b, st)
    if b.op is Ops.CONST: return UOp(Ops.CONST, b.dtype, (self.view(st),), b.arg)
    masked = any(v.mask is not None for v in st.views)
    if b.op is Ops.REDUCE:
      if b is self.fused_reduce and st.contiguous and st.shape[:len(b.shape)] == b.shape and \
         all(n == 1 for n in st.shape[len(b.shape):]):
        src = b.srcs[0]
        full = ShapeTracker.from_shape(src.shape)
        if len(st.shape) > len(src.shape): full = full.reshape(src.shape + (1,) * (len(st.shape) - len(src.shape)))
        return UOp(Ops.REDUCE, b.dtype, (self.node(src, full),), b.arg)
      if b in self.nested and (inner := self.nested_view(b, st)) is not None:
        return UOp(Ops.REDUCE, b.dtype, (self.node(b.srcs[0], inner),), b.arg)
      return self.load(b, st)
    if b.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.EMPTY, Ops.BUFFER): return self.load(b, st)
    if masked and b.op in UNSAFE_PAD: return self.load(b, st)
    if b.op in GroupOp.ALU or b.op in (Ops.CAST, Ops.BITCAST):
      # under a mask, sources recurse with the same mask, so an unsafe op below is realized on its own
      return UOp(b.op, b.dtype, tuple(self.node(s, st) for s in b.srcs))
    raise NotImplementedError(f"schedule: can't build a kernel for {b.op}")


def create_schedule(outs: list[LazyBuffer]) -> list[ScheduleItem]:
  """The kernels (and copies) that realize `outs`, in an order that respects their dependencies."""
  with stage("schedule"):
    sched = _Scheduler(outs)
    for o in outs:
      if o.base.op is not Ops.CONST: sched.require(o.base)
  return sched.items
