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
from fusegrad.helpers import prod, stage
from fusegrad.dtype import dtypes
from fusegrad.uop import UOp, Ops, GroupOp
from fusegrad.shape.shapetracker import ShapeTracker
from fusegrad.lazy import LazyBuffer
from fusegrad.device import Buffer

# ops whose output is not 0 where all inputs are 0: they can't be computed under a padding view
UNSAFE_PAD = frozenset({Ops.EXP2, Ops.LOG2, Ops.RECIP, Ops.FDIV, Ops.POW, Ops.CMPEQ})
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
      if b is self.fused_reduce and st.contiguous and st.shape == b.shape:
        src = b.srcs[0]
        return UOp(Ops.REDUCE, b.dtype, (self.node(src, ShapeTracker.from_shape(src.shape)),), b.arg)
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
