"""ShapeTracker: a stack of Views that records every movement op applied to a buffer, without moving data.

Movement ops act on the last View; a reshape that the last View can't express stacks a new contiguous View on top,
and after every op the last two Views merge when one View can do the work of both. `expr_idxs` turns the stack into
the (index, valid) UOps a kernel reads the buffer with: each View's flat index is unravelled into the shape of the
View below it. Shapes may hold bound variables; `unbind` swaps them for plain variables and returns their values.
"""
from __future__ import annotations
import functools
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from fusegrad.uop import UOp, Ops, Variable
from fusegrad.symbolic import simplify
from fusegrad.shape.view import View, fmt, linear_form, plain_ints, sint, sint_max, unravel_index


_CONTIGUOUS: dict[tuple[int, ...], ShapeTracker] = {}   # shape -> ShapeTracker.from_shape(shape)
_CONTIGUOUS_MAX = 4096


@dataclass(frozen=True)
class ShapeTracker:
  """The Views that map an index in `shape` to a buffer index; views[0] addresses the buffer itself."""
  views: tuple[View, ...]

  @staticmethod
  def from_shape(shape: Sequence[sint]) -> ShapeTracker:
    """The tracker of a contiguous buffer of this shape (remembered for shapes of plain ints: every lazy op asks)."""
    if type(shape) is tuple and plain_ints(shape):
      st = _CONTIGUOUS.get(shape)
      if st is None:
        if len(_CONTIGUOUS) >= _CONTIGUOUS_MAX: _CONTIGUOUS.clear()
        st = _CONTIGUOUS[shape] = ShapeTracker((View.create(shape),))
      return st
    return ShapeTracker((View.create(shape),))

  def __repr__(self) -> str: return f"ShapeTracker({', '.join(map(repr, self.views))})"
  __str__ = __repr__

  def __hash__(self) -> int:   # remembered, as View's (and left behind by pickling, as there)
    h = self.__dict__.get("_hash")
    if h is None: h = self.__dict__["_hash"] = hash(self.views)
    return h

  def __getstate__(self) -> dict: return {k: v for k, v in self.__dict__.items() if k != "_hash"}

  @property
  def shape(self) -> tuple[sint, ...]: return self.views[-1].shape

  @property
  def ndim(self) -> int: return len(self.shape)

  @property
  def contiguous(self) -> bool: return len(self.views) == 1 and self.views[0].contiguous

  @property
  def size(self) -> sint:
    """How many buffer elements this tracker may touch: one past the largest index read at a valid element."""
    if self.contiguous: return self.views[0].size()
    extent = self.views[0].extent()
    if len(self.views) == 1 or not isinstance(extent, int): return extent
    index, valid = self.expr_idxs()
    if valid.op is Ops.CONST and not valid.arg: return 0
    return min(extent, index.vmax + 1)

  # ***** movement ops *****

  def _on_last(self, op: Callable[[View], View]) -> ShapeTracker:
    return ShapeTracker(self.views[:-1] + (op(self.views[-1]),)).simplify()

  def permute(self, order: Sequence[int]) -> ShapeTracker: return self._on_last(lambda v: v.permute(order))
  def expand(self, new_shape: Sequence[sint]) -> ShapeTracker: return self._on_last(lambda v: v.expand(new_shape))
  def pad(self, arg: Sequence[tuple[sint, sint]]) -> ShapeTracker: return self._on_last(lambda v: v.pad(arg))
  def shrink(self, arg: Sequence[tuple[sint, sint]]) -> ShapeTracker: return self._on_last(lambda v: v.shrink(arg))
  def stride(self, mults: Sequence[int]) -> ShapeTracker: return self._on_last(lambda v: v.stride(mults))

  def reshape(self, new_shape: Sequence[sint]) -> ShapeTracker:
    """Reshape the last View, or stack a contiguous View of the new shape when it can't express the reshape."""
    reshaped = self.views[-1].reshape(new_shape)
    if reshaped is not None: return ShapeTracker(self.views[:-1] + (reshaped,)).simplify()
    return ShapeTracker(self.views + (View.create(new_shape),)).simplify()

  def simplify(self) -> ShapeTracker:
    """Merge the last two Views while one View can replace them."""
    views = list(self.views)
    while len(views) >= 2:
      merged = views[-2] + views[-1]
      if merged is None: break
      views[-2:] = [merged]
    return self if len(views) == len(self.views) else ShapeTracker(tuple(views))

  def __add__(self, st: ShapeTracker) -> ShapeTracker:
    """`st` applied on top of this tracker: st's first View addresses this tracker's elements in C order."""
    return _compose(self, st)

  # ***** index expressions *****

  def default_idxs(self) -> list[UOp]:
    """One index variable per axis, idx{i} in [0, shape[i] - 1]."""
    return [Variable(f"idx{i}", 0, max(sint_max(s) - 1, 0)) for i, s in enumerate(self.shape)]

  def expr_idxs(self, idxs: Sequence[UOp] | None = None) -> tuple[UOp, UOp]:
    """The simplified (buffer index, valid) for one index UOp per axis (default: `default_idxs()`)."""
    idxs = self.default_idxs() if idxs is None else list(idxs)
    if len(idxs) != self.ndim:
      raise ValueError(f"expr_idxs: shape {fmt(self.shape)} needs {self.ndim} indices, got {len(idxs)}")
    index, valid = self.views[-1].to_indexed_uops(idxs)
    for view in reversed(self.views[:-1]):
      index, inner_valid = view.to_indexed_uops(unravel_index(simplify(index), view.shape))
      valid = valid & inner_valid
    return simplify(index), simplify(valid)

  def real_strides(self, ignore_valid: bool = False) -> tuple[sint | None, ...]:
    """Per axis, the stride of the buffer index along it, or None where the index is not affine in that axis
    (or, unless ignore_valid, where the axis decides validity)."""
    return _real_strides(self, ignore_valid)

  def _real_strides(self, ignore_valid: bool) -> tuple[sint | None, ...]:
    idxs = self.default_idxs()
    index, valid = self.expr_idxs(idxs)
    strides, _ = linear_form(index, idxs)
    if ignore_valid: return tuple(strides)
    in_valid = set(valid.toposort())
    return tuple(None if idx in in_valid else st for idx, st in zip(idxs, strides))

  def unit_stride_axes(self, ignore_valid: bool = False) -> list[int]:
    """The axes along which the buffer index moves by exactly 1."""
    return [i for i, st in enumerate(self.real_strides(ignore_valid)) if isinstance(st, int) and st == 1]

  # ***** symbolic shapes *****

  @functools.cached_property
  def symbolic(self) -> bool:
    """Whether any view holds a symbolic int (most don't: then vars and unbind have nothing to do)."""
    return any(v.symbolic for v in self.views)

  def vars(self) -> set[UOp]:
    """The DEFINE_VARs the views use (bound or not)."""
    return set().union(*[v.vars() for v in self.views]) if self.symbolic else set()

  def unbind(self) -> tuple[ShapeTracker, dict[UOp, int]]:
    """This tracker with every BIND replaced by its variable, and each variable's bound value."""
    if not self.symbolic: return self, {}
    views, values = [], {}
    for view in self.views:
      unbound, view_values = view.unbind()
      for var, value in view_values.items():
        if values.setdefault(var, value) != value:
          raise ValueError(f"unbind: {var.arg.name} is bound to both {values[var]} and {value}")
      views.append(unbound)
    return ShapeTracker(tuple(views)), values

  @property
  def var_vals(self) -> dict[UOp, int]:
    """Each bound variable's value."""
    return self.unbind()[1]


@functools.lru_cache(maxsize=1 << 14)
def _compose(base: ShapeTracker, top: ShapeTracker) -> ShapeTracker:
  # the scheduler composes the same view pairs over and over (every step of a training loop): remember them
  return functools.reduce(lambda acc, v: ShapeTracker(acc.views + (v,)).simplify(), top.views, base)


@functools.lru_cache(maxsize=1 << 14)
def _real_strides(st: ShapeTracker, ignore_valid: bool) -> tuple:
  return st._real_strides(ignore_valid)
