"""The lazy graph: LazyBuffers record ops instead of running them.

A LazyBuffer is either a *base* (an op with sources; it owns a Buffer once realized) or a *view* of a base (a
ShapeTracker over the base's contiguous output). Movement ops only make views, so they cost nothing; constants are
0-d CONST bases seen through an expanding view, so they become literals in kernels. Deciding what becomes a kernel
happens on the whole graph at realize time (engine/schedule.py).
"""
from __future__ import annotations
import math
from typing import Any
import numpy as np
from fusegrad.helpers import prod, all_int
from fusegrad.dtype import DType, dtypes, truncate
from fusegrad.uop import UOp, Ops, GroupOp, ReduceArg, exec_alu
from fusegrad.shape.shapetracker import ShapeTracker
from fusegrad.device import Buffer, numpy_to_storage

sint = int | UOp


class LazyBuffer:
  """A node of the lazy graph. `base` is self for a base; views share their base's op, sources and Buffer."""

  def __init__(self, device: str, st: ShapeTracker, dtype: DType, op: Ops | None = None, arg: Any = None,
               srcs: tuple[LazyBuffer, ...] = (), base: LazyBuffer | None = None, buffer: Buffer | None = None):
    self.device, self.st, self.dtype = device, st, dtype
    self.shape: tuple[sint, ...] = st.shape
    self._base = base
    if base is None:
      self.op, self.arg, self.srcs = op, arg, srcs
      self.buffer: Buffer | None = buffer
      self.forced_realize = op in (Ops.CONTIGUOUS, Ops.COPY, Ops.EMPTY)

  @property
  def base(self) -> LazyBuffer: return self._base if self._base is not None else self
  @property
  def is_view(self) -> bool: return self._base is not None
  @property
  def realized(self) -> Buffer | None:
    b = self.base
    return b.buffer if b.buffer is not None and b.buffer.is_allocated and b.op in (Ops.BUFFER, None) else None
  @property
  def size(self) -> int: return prod(self.shape)

  def __repr__(self) -> str:
    kind = f"view of {self.base.op}" if self.is_view else str(self.op)
    return f"<LB {self.device} {self.shape} {self.dtype.name} {kind}>"

  # ***** creation *****
  @staticmethod
  def from_numpy(arr: np.ndarray, dtype: DType, device: str) -> LazyBuffer:
    shape = tuple(int(s) for s in arr.shape)
    buf = Buffer(device, int(prod(shape)), dtype).copyin(numpy_to_storage(arr, dtype))
    return LazyBuffer(device, ShapeTracker.from_shape(shape), dtype, Ops.BUFFER, None, (), buffer=buf)

  @staticmethod
  def const(value, dtype: DType, shape: tuple[sint, ...], device: str) -> LazyBuffer:
    base = LazyBuffer(device, ShapeTracker.from_shape(()), dtype, Ops.CONST, truncate(value, dtype))
    return base.reshape((1,) * len(shape)).expand(shape) if shape else base

  @staticmethod
  def empty(shape: tuple[sint, ...], dtype: DType, device: str) -> LazyBuffer:
    return LazyBuffer(device, ShapeTracker.from_shape(shape), dtype, Ops.EMPTY)

  def const_like(self, value) -> LazyBuffer: return LazyBuffer.const(value, self.dtype, self.shape, self.device)

  @property
  def const_value(self):
    """The value if this is an unmasked view of a constant, else None."""
    b = self.base
    if b.op is not Ops.CONST: return None
    return b.arg if all(v.mask is None for v in self.st.views) else None

  # ***** compute *****
  def alu(self, op: Ops, *others: LazyBuffer) -> LazyBuffer:
    srcs = (self,) + others
    for s in srcs[1:]:
      if s.shape != self.shape: raise ValueError(f"{op.name}: shapes {self.shape} and {s.shape} differ (internal)")
    out_dtype = dtypes.bool if op in GroupOp.Comparison else srcs[-1].dtype if op is Ops.WHERE else self.dtype
    folded = _fold_consts(op, out_dtype, srcs)
    if folded is not None: return folded
    return LazyBuffer(self.device, ShapeTracker.from_shape(self.shape), out_dtype, op, None, srcs)

  def cast(self, dtype: DType, bitcast: bool = False) -> LazyBuffer:
    if dtype is self.dtype: return self
    if not bitcast and self.const_value is not None: return LazyBuffer.const(self.const_value, dtype, self.shape,
                                                                              self.device)
    return LazyBuffer(self.device, ShapeTracker.from_shape(self.shape), dtype, Ops.BITCAST if bitcast else Ops.CAST,
                      None, (self,))

  def r(self, op: Ops, axis: tuple[int, ...], dtype: DType | None = None) -> LazyBuffer:
    """Reduce over `axis` (kept as size-1 dims) with ADD or MAX."""
    new_shape = tuple(1 if i in axis else s for i, s in enumerate(self.shape))
    if not axis or all(self.shape[i] == 1 for i in axis): return self if dtype is None else self.cast(dtype)
    src = self if dtype is None else self.cast(dtype)
    if 0 in [self.shape[i] for i in axis] or self.size == 0:
      return LazyBuffer.const(0 if op is Ops.ADD else -math.inf if dtypes.is_float(src.dtype)
                              else dtypes.min(src.dtype), src.dtype, new_shape, self.device)
    split = _split_reduce(src, op, axis)
    if split is not None: return split
    return LazyBuffer(self.device, ShapeTracker.from_shape(new_shape), src.dtype, Ops.REDUCE,
                      ReduceArg(op, tuple(sorted(axis))), (src,))

  def contiguous(self) -> LazyBuffer:
    if not self.is_view and self.op is not Ops.CONST: return self
    if self.is_view and self.st.contiguous and self.base.op is not Ops.CONST and self.shape == self.base.shape:
      return self.base
    return LazyBuffer(self.device, ShapeTracker.from_shape(self.shape), self.dtype, Ops.CONTIGUOUS, None, (self,))

  def copy_to_device(self, device: str) -> LazyBuffer:
    if device == self.device: return self
    if self.const_value is not None: return LazyBuffer.const(self.const_value, self.dtype, self.shape, device)
    return LazyBuffer(device, ShapeTracker.from_shape(self.shape), self.dtype, Ops.COPY, None, (self.contiguous(),))

  # ***** movement: views of the base *****
  def _view(self, st: ShapeTracker) -> LazyBuffer:
    base = self.base
    if st.contiguous and st.shape == base.shape and base.op is not Ops.CONST: return base
    return LazyBuffer(self.device, st, self.dtype, base=base)

  def reshape(self, shape: tuple[sint, ...]) -> LazyBuffer:
    return self if shape == self.shape else self._view(self.st.reshape(shape))
  def permute(self, order: tuple[int, ...]) -> LazyBuffer:
    return self if tuple(order) == tuple(range(len(order))) else self._view(self.st.permute(order))
  def expand(self, shape: tuple[sint, ...]) -> LazyBuffer:
    return self if shape == self.shape else self._view(self.st.expand(shape))
  def pad(self, arg: tuple[tuple[sint, sint], ...]) -> LazyBuffer:
    return self if all(a == (0, 0) for a in arg) else self._view(self.st.pad(arg))
  def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> LazyBuffer:
    return self if all(a == (0, s) for a, s in zip(arg, self.shape)) else self._view(self.st.shrink(arg))
  def stride(self, arg: tuple[int, ...]) -> LazyBuffer:
    return self if all(a == 1 for a in arg) else self._view(self.st.stride(arg))


SPLIT_MIN_REDUCE = 1 << 16   # a reduce this long with few outputs becomes two kernels
SPLIT_MAX_OUTPUTS = 64


def _split_reduce(x: LazyBuffer, op: Ops, axis: tuple[int, ...]) -> LazyBuffer | None:
  """Reduce a long axis with few outputs in two steps, (n, size/n) then n, so the first kernel has n-fold parallel
  work (a GPU grid, several CPU cores) instead of one thread block or one core walking everything."""
  if not all_int(x.shape): return None
  reduce_size, out_size = prod(x.shape[i] for i in axis), prod(s for i, s in enumerate(x.shape) if i not in axis)
  if reduce_size < SPLIT_MIN_REDUCE or out_size > SPLIT_MAX_OUTPUTS: return None
  ax = max(axis, key=lambda a: x.shape[a])
  size = x.shape[ax]
  # enough first-stage outputs to fill a GPU (a thread block each), each still reducing a long run
  n = next((n for n in (4096, 2048, 1024, 512, 256, 128, 64, 32, 16) if size % n == 0 and size // n >= 4096), None)
  n = n or next((n for n in (256, 128, 64, 32, 16) if size % n == 0 and size // n >= 256), None)
  if n is None: return None
  split = x.reshape(x.shape[:ax] + (n, size // n) + x.shape[ax + 1:])
  inner_axes = tuple(a + (a > ax) for a in axis if a != ax) + (ax + 1,)
  first = split.r(op, inner_axes)
  second = first.r(op, (ax,))
  return second.reshape(tuple(1 if i in axis else s for i, s in enumerate(x.shape)))


def _fold_consts(op: Ops, dtype: DType, srcs: tuple[LazyBuffer, ...]) -> LazyBuffer | None:
  """An ALU over constants is a constant; x+0, x*1, x-0 and x/1 are x (identities that hold for every float)."""
  values = [s.const_value for s in srcs]
  if all(v is not None for v in values) and all_int(srcs[0].shape):
    return LazyBuffer.const(exec_alu(op, dtype, values), dtype, srcs[0].shape, srcs[0].device)
  if len(srcs) == 2 and values[1] is not None and srcs[0].dtype is dtype:
    if (op in (Ops.ADD, Ops.SUB) and values[1] == 0) or (op in (Ops.MUL, Ops.FDIV) and values[1] == 1):
      return srcs[0]
  if len(srcs) == 2 and op in (Ops.ADD, Ops.MUL) and values[0] is not None and srcs[1].dtype is dtype:
    if (op is Ops.ADD and values[0] == 0) or (op is Ops.MUL and values[0] == 1): return srcs[1]
  return None
