"""Views: how an N-d index maps to a flat buffer index through shape, strides, offset and an optional valid mask.

A View is one affine map plus a box of valid ranges per axis (reads outside the box yield 0). Movement ops (permute,
expand, pad, shrink, stride, reshape) make new Views without touching data. `reshape` returns None when no single
View can express the result, and `a + b` merges two stacked Views into one when the stack is affine, so shape
trackers stay one View deep in the common cases. Dims, strides and offsets may be symbolic ints (`sint`).
"""
from __future__ import annotations
import functools
import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fusegrad.dtype import dtypes
from fusegrad.helpers import all_int, ceildiv, flatten, prod
from fusegrad.uop import UOp, Ops, Variable, sint_to_uop
from fusegrad.symbolic import simplify, split_terms

sint = int | UOp
Mask = tuple[tuple[sint, sint], ...]


# ***** symbolic int helpers *****

def canon(x: sint) -> sint:
  """The canonical form of a symbolic int: simplified, and a plain int when it is a constant."""
  if not isinstance(x, UOp): return x
  x = simplify(x)
  return x.arg if x.op is Ops.CONST else x


def same(a: sint, b: sint) -> bool:
  """Whether two sints are provably equal (their difference simplifies to 0)."""
  if isinstance(a, int) and isinstance(b, int): return a == b
  return a is b or canon(a - b) == 0


def smax(a: sint, b: sint) -> sint:
  """max(a, b), decided by bounds where possible, else a MAX expression."""
  diff = canon(a - b)
  if isinstance(diff, int): return a if diff >= 0 else b
  if diff.vmin >= 0: return a
  if diff.vmax <= 0: return b
  return canon(sint_to_uop(a).maximum(b))


def smin(a: sint, b: sint) -> sint:
  """min(a, b), decided by bounds where possible, else a MIN expression."""
  diff = canon(a - b)
  if isinstance(diff, int): return a if diff <= 0 else b
  if diff.vmax <= 0: return a
  if diff.vmin >= 0: return b
  return canon(sint_to_uop(a).minimum(b))


def sint_max(x: sint) -> int:
  """The largest value a sint can take."""
  return x if isinstance(x, int) else x.vmax


def plain_ints(xs: tuple) -> bool:
  """Whether every item is exactly an int (not a bool, float, numpy int or UOp): such tuples are their own canonical
  form, so caches may key on them (1.0 == 1 and True == 1 would otherwise share an entry)."""
  for x in xs:
    if type(x) is not int: return False
  return True


def fmt(xs: object) -> str:
  """A shape, stride or mask tuple as Python prints it, with symbolic ints rendered (`(n=3, 4)`)."""
  if isinstance(xs, UOp): return xs.render()
  if not isinstance(xs, tuple): return str(xs)
  parts = [fmt(x) for x in xs]
  return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"


def _as_sint(x: object, op: str) -> sint:
  if isinstance(x, UOp):
    if not dtypes.is_int(x.dtype): raise ValueError(f"{op}: {x.render()} is not an int expression")
    return canon(x)
  try:
    return operator.index(x)
  except TypeError:
    raise ValueError(f"{op}: {x!r} is not an int or a symbolic int") from None


def _check_shape(op: str, shape: Sequence[sint]) -> tuple[sint, ...]:
  out = tuple(_as_sint(s, op) for s in shape)
  if any(isinstance(s, int) and s < 0 for s in out): raise ValueError(f"{op}: shape {fmt(out)} has a negative dim")
  return out


# ***** sizes as monomials (int factor times symbolic factors), to pair up dims in reshape *****

Monomial = tuple[int, Counter]


def _monomial(x: sint) -> Monomial:
  if isinstance(x, int): return x, Counter()
  if x.op is Ops.CONST: return x.arg, Counter()
  if x.op is Ops.MUL: return _mono_mul(_monomial(x.src[0]), _monomial(x.src[1]))
  return 1, Counter({x: 1})


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
  k = a[0] * b[0]
  return (0, Counter()) if k == 0 else (k, a[1] + b[1])


def _size_of(shape: tuple[sint, ...]) -> Monomial:
  return functools.reduce(_mono_mul, map(_monomial, shape), (1, Counter()))


def same_size(a: tuple[sint, ...], b: tuple[sint, ...]) -> bool:
  """Whether two shapes hold the same number of elements."""
  return _size_of(a) == _size_of(b) or same(prod(a), prod(b))


def _grows(a: Monomial, b: Monomial) -> bool | None:
  """Whether the running product a must take more dims to reach b (symbolic factors count as larger than any int);
  None when the two can't be ordered."""
  if a[1] == b[1]: return a[0] < b[0]
  if a[1] <= b[1]: return True
  if b[1] <= a[1]: return False
  return None


def _match_groups(old: list[sint], new: list[sint]) -> list[tuple[range, range]] | None:
  """Pair runs of old and new dims (none of size 1, same total size) with equal products, each run as short as
  possible. When symbolic sizes can't be ordered, all remaining dims form one last run."""
  groups: list[tuple[range, range]] = []
  i = j = 0
  while i < len(old) and j < len(new):
    i0, j0 = i, j
    a, b = _monomial(old[i]), _monomial(new[j])
    i, j = i + 1, j + 1
    while a != b:
      grow_old = _grows(a, b)
      if grow_old is None: return groups + [(range(i0, len(old)), range(j0, len(new)))]
      if i == len(old) if grow_old else j == len(new): return None
      if grow_old:
        a, i = _mono_mul(a, _monomial(old[i])), i + 1
      else:
        b, j = _mono_mul(b, _monomial(new[j])), j + 1
    groups.append((range(i0, i), range(j0, j)))
  return groups if i == len(old) and j == len(new) else None


# ***** merging and splitting axes *****

def _exact_div(x: sint, d: sint) -> sint | None:
  if isinstance(d, int) and d == 1: return x
  if isinstance(x, int) and isinstance(d, int) and d != 0 and x % d == 0: return x // d
  return None


def _is_full(m: tuple[sint, sint], size: sint) -> bool: return same(m[0], 0) and same(m[1], size)


def _single(m: tuple[sint, sint]) -> bool: return isinstance(m[0], int) and isinstance(m[1], int) and m[1] - m[0] == 1


def _merge_masks(sizes: list[sint], masks: list[tuple[sint, sint]]) -> tuple[sint, sint] | None:
  """The valid box of adjacent axes as one interval of their merged index, or None when it isn't an interval.
  That holds when the axes are: some with one valid element, then one arbitrary, then full ones."""
  lo, hi = masks[-1]
  size = sizes[-1]
  for s, (alo, ahi) in zip(reversed(sizes[:-1]), reversed(masks[:-1])):
    if _is_full((lo, hi), size): lo, hi = canon(alo * size), canon(ahi * size)
    elif _single((alo, ahi)): lo, hi = canon(alo * size + lo), canon(alo * size + hi)
    else: return None
    size = canon(size * s)
  return lo, hi


def _merge_axes(sizes: list[sint], strides: list[sint], masks: list[tuple[sint, sint]]) \
    -> tuple[sint, tuple[sint, sint], sint] | None:
  """Adjacent axes as one: (stride, valid interval, offset change), or None when no single axis addresses the same
  elements. An axis with one valid element may have any stride: the difference moves into the offset."""
  inner = [canon(prod(sizes[a + 1:])) for a in range(len(sizes))]
  rigid = [a for a in range(len(sizes)) if not _single(masks[a])]
  stride = _exact_div(strides[rigid[-1]], inner[rigid[-1]]) if rigid else 0
  interval = _merge_masks(sizes, masks)
  if stride is None or interval is None: return None
  offset_change: sint = 0
  for a in range(len(sizes)):
    want = canon(stride * inner[a])
    if same(strides[a], want): continue
    if a in rigid: return None
    offset_change = canon(offset_change + masks[a][0] * (strides[a] - want))
  return stride, interval, offset_change


def _split_mask(lo: sint, hi: sint, sizes: list[sint]) -> list[tuple[sint, sint]] | None:
  """The interval [lo, hi) of a flat index as a box over `sizes`, or None when it isn't a box."""
  if len(sizes) == 1: return [(lo, hi)]
  if _is_full((lo, hi), canon(prod(sizes))): return [(0, s) for s in sizes]
  if not all_int([lo, hi, *sizes]): return None
  out: list[tuple[sint, sint]] = []
  for a, s in enumerate(sizes):
    inner = prod(sizes[a + 1:])
    if lo % inner == 0 and hi % inner == 0: return out + [(lo // inner, hi // inner)] + [(0, t) for t in sizes[a + 1:]]
    if lo // inner != (hi - 1) // inner: return None
    q = lo // inner
    out.append((q, q + 1))
    lo, hi = lo - q * inner, hi - q * inner
  return out


def strides_for_shape(shape: tuple[sint, ...]) -> tuple[sint, ...]:
  """C-contiguous strides, with 0 for size-1 dims (and for every dim of an empty shape)."""
  if 0 in shape: return (0,) * len(shape)
  out: list[sint] = []
  acc: sint = 1
  for s in reversed(shape):
    out.append(0 if s == 1 else acc)
    acc = canon(acc * s)
  return tuple(reversed(out))


def unravel_index(flat: UOp, shape: tuple[sint, ...]) -> list[UOp]:
  """The C-order multi-index of a flat index into `shape` (the outermost axis is not reduced modulo its size)."""
  out: list[UOp] = []
  inner: sint = 1
  for a in reversed(range(len(shape))):
    if shape[a] == 1: out.append(UOp.const(dtypes.index, 0))
    else: out.append(flat // inner if a == 0 else (flat // inner) % shape[a])
    inner = canon(inner * shape[a])
  return out[::-1]


def linear_form(expr: UOp, xs: list[UOp]) -> tuple[list[sint | None], sint]:
  """expr as sum(c_i * xs[i]) + const: each c_i, or None where expr is not affine in xs[i], and const."""
  targets = set(xs)
  coeffs: dict[UOp, sint] = {x: 0 for x in xs}
  bad: set[UOp] = set()
  terms, const = split_terms(expr)
  for term, k in terms.items():
    used = [n for n in term.toposort() if n in targets]
    if not used: const = const + term * k
    elif term in targets: coeffs[term] = coeffs[term] + k
    elif term.op is Ops.MUL and len(used) == 1 and used[0] in term.src:
      other = term.src[1] if term.src[0] is used[0] else term.src[0]
      if used[0] in other.toposort(): bad.add(used[0])
      else: coeffs[used[0]] = coeffs[used[0]] + other * k
    else: bad.update(used)
  return [None if x in bad else canon(coeffs[x]) for x in xs], canon(const)


def _conjuncts(valid: UOp) -> list[UOp]:
  if valid.op is Ops.AND and valid.dtype is dtypes.bool: return _conjuncts(valid.src[0]) + _conjuncts(valid.src[1])
  return [valid]


def _restrict(box: list[tuple[int, int]], clause: UOp, xs: list[UOp]) -> bool:
  """Narrow `box` (one interval per x) to where `clause` holds; False when the clause is not an interval on one x."""
  if clause.op is Ops.CONST:
    if not clause.arg: box[:] = [(0, 0)] * len(box)
    return True
  if clause.op is not Ops.CMPLT: return False
  (left, lconst), (right, rconst) = linear_form(clause.src[0], xs), linear_form(clause.src[1], xs)
  if None in left or None in right: return False
  diff = [canon(a - b) for a, b in zip(left, right)]   # the clause is sum(diff_i * x_i) + c < 0
  c = canon(lconst - rconst)
  used = [i for i, d in enumerate(diff) if not (isinstance(d, int) and d == 0)]
  if len(used) != 1 or not all_int([diff[used[0]], c]): return False
  axis, k = used[0], diff[used[0]]
  lo, hi = box[axis]
  box[axis] = (lo, min(hi, -(c // k))) if k > 0 else (max(lo, c // -k + 1), hi)
  return True


# ***** the View *****

@dataclass(frozen=True)
class View:
  """An affine map from an index in `shape` to a buffer index, valid inside `mask` (None: everywhere).
  Always build Views with View.create, which puts them in canonical form."""
  shape: tuple[sint, ...]
  strides: tuple[sint, ...]
  offset: sint
  mask: Mask | None
  contiguous: bool

  @staticmethod
  def create(shape: Sequence[sint], strides: Sequence[sint] | None = None, offset: sint = 0,
             mask: Sequence[tuple[sint, sint]] | None = None) -> View:
    """The canonical View: size-1 dims have stride 0, a mask covering everything is None, an axis with one valid
    element has stride 0 (the offset reads it), and a view that reads nothing has strides 0, offset 0, masks (0, 0)."""
    shape = _check_shape("View.create", shape)
    strides = strides_for_shape(shape) if strides is None else tuple(_as_sint(s, "View.create") for s in strides)
    if len(strides) != len(shape) or (mask is not None and len(mask) != len(shape)):
      raise ValueError(f"View.create: shape {fmt(shape)} has {len(shape)} dims but strides {fmt(strides)}"
                       f"{'' if mask is None else f' and mask {fmt(tuple(mask))}'} don't match")
    offset = _as_sint(offset, "View.create")
    if 0 in shape: return View(shape, (0,) * len(shape), 0, None, True)
    strides = tuple(0 if s == 1 else st for s, st in zip(shape, strides))
    if mask is not None:
      mask = tuple((smax(_as_sint(lo, "View.create"), 0), smin(_as_sint(hi, "View.create"), s))
                   for (lo, hi), s in zip(mask, shape))
      if any(_is_empty(m) for m in mask): return View(shape, (0,) * len(shape), 0, ((0, 0),) * len(shape), False)
      offset = canon(offset + sum(m[0] * st for m, st in zip(mask, strides) if _single(m)))
      strides = tuple(0 if _single(m) else st for m, st in zip(mask, strides))
      if all(_is_full(m, s) for m, s in zip(mask, shape)): mask = None
    contiguous = offset == 0 and mask is None and strides == strides_for_shape(shape)
    return View(shape, strides, offset, mask, contiguous)

  def __hash__(self) -> int:
    # remembered: views key the UOp cache (as VIEW args), the schedule's memo and the lru caches, again and again
    h = self.__dict__.get("_hash")
    if h is None: h = self.__dict__["_hash"] = hash((self.shape, self.strides, self.offset, self.mask, self.contiguous))
    return h

  def __getstate__(self) -> dict:
    # a pickled view leaves its hash behind: a symbolic int (a UOp) hashes differently in another process
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}

  def __repr__(self) -> str:
    mask = None if self.mask is None else fmt(self.mask)
    return f"View(shape={fmt(self.shape)}, strides={fmt(self.strides)}, offset={fmt(self.offset)}, mask={mask})"

  @property
  def ndim(self) -> int: return len(self.shape)

  def size(self) -> sint:
    """The number of elements in the view's shape."""
    return canon(prod(self.shape))

  def reads_nothing(self) -> bool:
    """True for an empty shape or a mask with no valid element."""
    return 0 in self.shape or (self.mask is not None and any(_is_empty(m) for m in self.mask))

  def extent(self) -> sint:
    """One past the largest buffer index read at a valid element (0 when nothing is read)."""
    if self.reads_nothing(): return 0
    top = self.offset
    for st, (lo, hi) in zip(self.strides, self._box()):
      top = top + smax(canon(st * (hi - 1)), canon(st * lo))
    return canon(top + 1)

  def _box(self) -> Mask: return self.mask if self.mask is not None else tuple((0, s) for s in self.shape)

  # ***** index expressions *****

  def to_indexed_uops(self, idxs: list[UOp] | tuple[UOp, ...]) -> tuple[UOp, UOp]:
    """(buffer index, valid) for one index UOp per axis: offset + sum(idx_i*stride_i), and the mask's bounds."""
    if len(idxs) != self.ndim:
      raise ValueError(f"to_indexed_uops: view of shape {fmt(self.shape)} needs {self.ndim} indices, got {len(idxs)}")
    terms = [idx if _is_int(st, 1) else idx * st for idx, st in zip(idxs, self.strides) if not _is_int(st, 0)]
    if not _is_int(self.offset, 0) or not terms: terms.append(sint_to_uop(self.offset))
    index = functools.reduce(operator.add, terms)
    clauses: list[UOp] = []
    for idx, (lo, hi), s in zip(idxs, self.mask or (), self.shape):
      if not same(lo, 0): clauses.append((lo - 1) < idx)
      if not same(hi, s): clauses.append(idx < hi)
    valid = functools.reduce(operator.and_, clauses) if clauses else UOp.const(dtypes.bool, True)
    return index, valid

  # ***** movement ops *****

  def permute(self, order: Sequence[int]) -> View:
    """Reorder the axes: axis i of the result is axis order[i] of this view."""
    order = tuple(operator.index(o) for o in order)
    if sorted(order) != list(range(self.ndim)):
      raise ValueError(f"permute: {order} is not a permutation of the {self.ndim} axes of shape {fmt(self.shape)}")
    mask = None if self.mask is None else tuple(self.mask[o] for o in order)
    return View.create(tuple(self.shape[o] for o in order), tuple(self.strides[o] for o in order), self.offset, mask)

  def expand(self, new_shape: Sequence[sint]) -> View:
    """Repeat size-1 axes to a larger size (stride 0, no copy)."""
    new_shape = _check_shape("expand", new_shape)
    if len(new_shape) != self.ndim:
      raise ValueError(f"expand: can't expand {fmt(self.shape)} to {fmt(new_shape)}: they have different ranks")
    for axis, (s, ns) in enumerate(zip(self.shape, new_shape)):
      if not (same(s, ns) or s == 1):
        raise ValueError(f"expand: can't expand {fmt(self.shape)} to {fmt(new_shape)}: axis {axis} has size "
                         f"{fmt(s)}; only size-1 axes can grow (reshape or pad first)")
    if new_shape == self.shape: return self
    if self.reads_nothing(): return View.create(new_shape, mask=((0, 0),) * len(new_shape))
    if self.mask is None: return View.create(new_shape, self.strides, self.offset)
    mask = tuple(m if same(s, ns) else (0, ns) for m, s, ns in zip(self.mask, self.shape, new_shape))
    return View.create(new_shape, self.strides, self.offset, mask)

  def pad(self, arg: Sequence[tuple[sint, sint]]) -> View:
    """Add (before, after) invalid elements to each axis; reads there yield 0."""
    arg = self._pairs("pad", arg)
    if any(isinstance(x, int) and x < 0 for x in flatten(arg)):
      raise ValueError(f"pad: {fmt(arg)} on shape {fmt(self.shape)} has a negative amount; use shrink to cut")
    if all(same(b, 0) and same(a, 0) for b, a in arg): return self
    bounds = tuple((-b, canon(s + a)) for (b, a), s in zip(arg, self.shape))
    return self._resize(bounds, tuple((b, canon(s + b)) for (b, _), s in zip(arg, self.shape)))

  def shrink(self, arg: Sequence[tuple[sint, sint]]) -> View:
    """Keep [start, end) of each axis."""
    arg = self._pairs("shrink", arg)
    for axis, ((start, end), s) in enumerate(zip(arg, self.shape)):
      if all_int([start, end, s]) and not 0 <= start <= end <= s:
        raise ValueError(f"shrink: can't shrink {fmt(self.shape)} with {fmt(arg)}: axis {axis} needs "
                         f"0 <= start <= end <= {s}")
    if all(same(start, 0) and same(end, s) for (start, end), s in zip(arg, self.shape)): return self
    return self._resize(arg)

  def stride(self, mults: Sequence[int]) -> View:
    """Take every m-th element of each axis; a negative m walks the axis backwards (-1 flips it)."""
    mults = tuple(operator.index(m) for m in mults)
    if len(mults) != self.ndim or 0 in mults:
      raise ValueError(f"stride: {mults} on shape {fmt(self.shape)} needs one nonzero int per axis")
    for axis, (m, s) in enumerate(zip(mults, self.shape)):
      if abs(m) != 1 and not isinstance(s, int):
        raise ValueError(f"stride: can't take every {abs(m)}-th element of symbolic axis {axis} ({fmt(s)})")
    if all(m == 1 for m in mults): return self
    shape = tuple(s if abs(m) == 1 else ceildiv(s, abs(m)) for m, s in zip(mults, self.shape))
    offset = canon(self.offset + sum((s - 1) * st for m, s, st in zip(mults, self.shape, self.strides) if m < 0))
    strides = tuple(canon(st * m) for m, st in zip(mults, self.strides))
    mask = None if self.mask is None else tuple(_stride_mask(m, s, lo, hi) for m, s, (lo, hi) in
                                                zip(mults, self.shape, self.mask))
    return View.create(shape, strides, offset, mask)

  def reshape(self, new_shape: Sequence[sint]) -> View | None:
    return _reshape_view(self, tuple(new_shape))

  def _reshape(self, new_shape: Sequence[sint]) -> View | None:
    """The same elements in C order under a new shape, or None when no single View can address them so."""
    new_shape = _check_shape("reshape", new_shape)
    if not same_size(self.shape, new_shape):
      raise ValueError(f"reshape: can't reshape {fmt(self.shape)} to {fmt(new_shape)}: sizes "
                       f"{fmt(self.size())} and {fmt(canon(prod(new_shape)))} differ")
    if new_shape == self.shape: return self
    if 0 in self.shape: return View.create(new_shape)
    if self.reads_nothing(): return View.create(new_shape, mask=((0, 0),) * len(new_shape)) if new_shape else None
    if self.contiguous: return View.create(new_shape)
    return self._reshape_groups(new_shape)

  def _reshape_groups(self, new_shape: tuple[sint, ...]) -> View | None:
    # size-1 axes carry nothing (stride 0, full mask); every other run of old axes merges into one, then splits
    old_axes = [a for a, s in enumerate(self.shape) if s != 1]
    new_axes = [a for a, s in enumerate(new_shape) if s != 1]
    groups = _match_groups([self.shape[a] for a in old_axes], [new_shape[a] for a in new_axes])
    if groups is None: return None
    box = self._box()
    strides: list[sint] = [0] * len(new_shape)
    mask: list[tuple[sint, sint]] = [(0, s) for s in new_shape]
    offset = self.offset
    for old_run, new_run in groups:
      axes, dims = [old_axes[i] for i in old_run], [new_axes[j] for j in new_run]
      merged = _merge_axes([self.shape[a] for a in axes], [self.strides[a] for a in axes], [box[a] for a in axes])
      if merged is None: return None
      stride, (lo, hi), offset_change = merged
      sizes = [new_shape[d] for d in dims]
      split = _split_mask(lo, hi, sizes)
      if split is None: return None
      for k, d in enumerate(dims):
        strides[d], mask[d] = canon(stride * prod(sizes[k + 1:])), split[k]
      offset = canon(offset + offset_change)
    return View.create(new_shape, tuple(strides), offset, tuple(mask))

  def minify(self) -> View:
    """The same view with adjacent axes merged wherever a single axis can address them."""
    view, axis = self, 0
    while axis < view.ndim - 1:
      merged_shape = view.shape[:axis] + (canon(view.shape[axis] * view.shape[axis + 1]),) + view.shape[axis + 2:]
      merged = view.reshape(merged_shape)
      if merged is None: axis += 1
      else: view = merged
    return view

  def _pairs(self, op: str, arg: Sequence[tuple[sint, sint]]) -> Mask:
    pairs = tuple(tuple(_as_sint(x, op) for x in pair) for pair in arg)
    if len(pairs) != self.ndim or any(len(p) != 2 for p in pairs):
      raise ValueError(f"{op}: {fmt(pairs)} on shape {fmt(self.shape)} needs one (before, after) pair per axis")
    return pairs  # type: ignore[return-value]

  def _resize(self, bounds: tuple[tuple[sint, sint], ...], new_mask: Mask | None = None) -> View:
    """Keep [start, end) of each axis, where start may be negative and end past the size (pad), and mask to
    `new_mask` intersected with the old mask."""
    offset = canon(self.offset + sum(start * st for (start, _), st in zip(bounds, self.strides)))
    shape = tuple(canon(end - start) for start, end in bounds)
    mask = new_mask
    if self.mask is not None:
      moved = tuple((canon(lo - start), canon(hi - start)) for (lo, hi), (start, _) in zip(self.mask, bounds))
      mask = moved if mask is None else tuple((smax(a, c), smin(b, d)) for (a, b), (c, d) in zip(moved, mask))
    return View.create(shape, self.strides, offset, mask)

  # ***** merging a stack of two views *****

  def __add__(self, vm1: View) -> View | None:
    """One View addressing what `vm1` stacked on this (older, inner) view addresses, or None if there is none."""
    if not isinstance(vm1, View): return NotImplemented
    return _merge_views(self, vm1)

  def _merge(self, vm1: View) -> View | None:
    if vm1.reads_nothing() or self.contiguous: return vm1
    if self.reads_nothing(): return View.create(vm1.shape, mask=((0, 0),) * vm1.ndim) if vm1.ndim else None
    if vm1.contiguous and same_size(self.shape, vm1.shape):
      merged = self.reshape(vm1.shape)
      if merged is not None: return merged
    return self._merge_affine(vm1)

  def _merge_affine(self, vm1: View) -> View | None:
    # index vm1's valid box with variables, run it through both views, and read strides and mask off the result
    if not all_int(vm1.shape + vm1.strides + (vm1.offset,) + tuple(flatten(vm1._box())) + self.shape): return None
    if all_int(self.strides + (self.offset,)) and not _maybe_affine(self, vm1): return None   # cheap, and most fail
    xs = [Variable(f"merge_idx{i}", lo, hi - 1) for i, (lo, hi) in enumerate(vm1._box())]
    flat, _ = vm1.to_indexed_uops(xs)
    index, valid = self.to_indexed_uops(unravel_index(simplify(flat), self.shape))
    strides, offset = linear_form(simplify(index), xs)
    if None in strides: return None
    box = list(vm1._box())
    for clause in _conjuncts(simplify(valid)):
      if not _restrict(box, clause, xs): return None
    return View.create(vm1.shape, tuple(strides), offset, tuple(box))

  # ***** symbolic shapes *****

  def _sints(self) -> list[UOp]:
    fields = self.shape + self.strides + (self.offset,) + tuple(flatten(self.mask or ()))
    return [x for x in fields if isinstance(x, UOp)]

  @functools.cached_property
  def symbolic(self) -> bool:
    """Whether the shape, strides, offset or mask hold a symbolic int."""
    return bool(self._sints())

  def vars(self) -> set[UOp]:
    """The DEFINE_VARs this view's shape, strides, offset and mask use."""
    return set().union(*[x.vars() for x in self._sints()]) if self.symbolic else set()

  def unbind(self) -> tuple[View, dict[UOp, int]]:
    """This view with every BIND replaced by its variable, and the bound values."""
    if not self.symbolic: return self, {}
    binds = {n: n.src[0] for x in self._sints() for n in x.toposort() if n.op is Ops.BIND}
    values: dict[UOp, int] = {}
    for bind, var in binds.items():
      if values.setdefault(var, bind.src[1].arg) != bind.src[1].arg:
        raise ValueError(f"unbind: {var.arg.name} is bound to both {values[var]} and {bind.src[1].arg}")
    if not binds: return self, values

    def sub(x: sint) -> sint: return canon(x.substitute(binds)) if isinstance(x, UOp) else x
    mask = None if self.mask is None else tuple((sub(lo), sub(hi)) for lo, hi in self.mask)
    return View(tuple(map(sub, self.shape)), tuple(map(sub, self.strides)), sub(self.offset), mask,
                self.contiguous), values


@functools.lru_cache(maxsize=1 << 14)
def _reshape_view(view: View, new_shape: tuple) -> View | None: return view._reshape(new_shape)


@functools.lru_cache(maxsize=1 << 14)
def _merge_views(inner: View, outer: View) -> View | None:
  # merging is a pure function of the two views and the same pairs recur every training step: remember them
  return inner._merge(outer)


def _stacked_index(inner: View, outer: View, x: list[int]) -> int:
  """The buffer index `outer` stacked on `inner` reads at index x of outer: the arithmetic of the symbolic merge
  (outer's flat index, unravelled into inner's shape, through inner's strides), on plain ints."""
  flat = outer.offset + sum(xi * st for xi, st in zip(x, outer.strides))
  index, radix = inner.offset, 1
  for a in reversed(range(inner.ndim)):
    n, st = inner.shape[a], inner.strides[a]
    if n != 1 and st != 0: index += (flat // radix if a == 0 else (flat // radix) % n) * st
    radix *= n
  return index


def _maybe_affine(inner: View, outer: View) -> bool:
  """False when the index of `outer` stacked on `inner` is surely not affine over outer's valid box (all ints), so
  no View can merge them: the symbolic merge would find the same after simplifying (its simplifications keep every
  value in the box), only a hundred times slower. Compares the index at sample points (each axis's far end, the far
  corner, a spread of inner points) with the affine map through the box's first corner and its unit steps. True
  means maybe: the symbolic merge decides."""
  lo = [b[0] for b in outer._box()]
  ext = [hi - b for b, (_, hi) in zip(lo, outer._box())]
  if any(e <= 0 for e in ext): return True   # an empty box: nothing to sample
  base = _stacked_index(inner, outer, lo)
  steps = [(_stacked_index(inner, outer, lo[:i] + [lo[i] + 1] + lo[i + 1:]) - base) if e > 1 else 0
           for i, e in enumerate(ext)]
  samples = [[lo[j] + (e - 1 if j == i else 0) for j, e in enumerate(ext)] for i in range(len(ext))]
  samples.append([b + e - 1 for b, e in zip(lo, ext)])
  samples += [[b + (k * (2 * j + 3) + j) % e for j, (b, e) in enumerate(zip(lo, ext))] for k in range(1, 9)]
  for x in samples:
    if _stacked_index(inner, outer, x) != base + sum(st * (xi - b) for st, xi, b in zip(steps, x, lo)): return False
  return True


def _is_int(x: sint, value: int) -> bool: return isinstance(x, int) and x == value


def _is_empty(m: tuple[sint, sint]) -> bool:
  size = canon(m[1] - m[0])
  return size <= 0 if isinstance(size, int) else size.vmax <= 0


def _stride_mask(m: int, s: sint, lo: sint, hi: sint) -> tuple[sint, sint]:
  """The valid interval of an axis after taking every m-th element (m < 0: backwards from the end)."""
  k = abs(m)
  if m > 0: return (lo, hi) if k == 1 else (ceildiv(lo, k), ceildiv(hi, k))
  if k == 1: return canon(s - hi), canon(s - lo)
  return ceildiv(s - hi, k), (s - 1 - lo) // k + 1
