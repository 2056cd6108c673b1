"""Tests for fusegrad.shape.view: View.create's canonical form, each movement op, error messages, merging of stacked
Views (`__add__`), minify, extent and symbolic dims.

`read(view)` is the oracle: the buffer index of every element computed in numpy straight from the View's fields
(-1 where the mask says invalid), so a movement op is checked against the same op on that numpy array.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fusegrad.helpers import prod
from fusegrad.shape import View
from fusegrad.shape.view import linear_form
from fusegrad.uop import Variable

PAD = -1


def read(view: View) -> np.ndarray:
  """The buffer index each element of `view` reads, PAD where it is masked out."""
  grid = np.indices(view.shape, dtype=np.int64)
  index = view.offset + sum((g * s for g, s in zip(grid, view.strides)), np.zeros(view.shape, dtype=np.int64))
  valid = np.ones(view.shape, dtype=bool)
  for g, (lo, hi) in zip(grid, view.mask or ()):
    valid &= (lo <= g) & (g < hi)
  return np.where(valid, index, PAD)


def read_stack(inner: View, outer: View) -> np.ndarray:
  """What `outer` stacked on `inner` reads: outer indexes inner's elements in C order."""
  flat, inner_read = read(outer), read(inner).reshape(-1)
  if inner_read.size == 0: return np.full(flat.shape, PAD)
  return np.where(flat == PAD, PAD, inner_read[np.clip(flat, 0, inner_read.size - 1)])


# ***** View.create *****

def test_create_default_strides() -> None:
  assert View.create((2, 3, 4)) == View((2, 3, 4), (12, 4, 1), 0, None, True)
  assert View.create((2, 1, 4)).strides == (4, 0, 1)
  assert View.create(()).strides == () and View.create(()).contiguous


def test_create_zeroes_strides_of_size_one_dims() -> None:
  view = View.create((3, 1), (5, 7))
  assert view.strides == (5, 0) and not view.contiguous
  assert View.create((1, 4), (4, 1)).contiguous


def test_create_mask_canonical() -> None:
  assert View.create((3, 4), mask=((0, 3), (0, 4))).mask is None
  assert View.create((3, 4), mask=((-2, 5), (0, 9))).mask is None      # clamped to the shape, then full
  assert View.create((3, 4), mask=((1, 3), (0, 4))).mask == ((1, 3), (0, 4))


def test_create_empty_mask_reads_nothing() -> None:
  view = View.create((3, 4), (4, 1), 7, ((0, 3), (2, 2)))
  assert view == View((3, 4), (0, 0), 0, ((0, 0), (0, 0)), False)
  assert view.reads_nothing() and view.extent() == 0
  assert View.create((3, 4), mask=((3, 1), (0, 4))).reads_nothing()


def test_create_one_valid_element_moves_into_offset() -> None:
  view = View.create((3, 4), (4, 1), 0, ((0, 3), (2, 3)))
  assert view.strides == (4, 0) and view.offset == 2 and view.mask == ((0, 3), (2, 3))
  np.testing.assert_array_equal(read(view), read(View((3, 4), (4, 1), 0, ((0, 3), (2, 3)), False)))


def test_create_empty_shape() -> None:
  view = View.create((2, 0, 3), (5, 5, 5), 3, ((0, 1), (0, 0), (0, 3)))
  assert view == View((2, 0, 3), (0, 0, 0), 0, None, True) and view.extent() == 0 and view.size() == 0


def test_contiguous_flag() -> None:
  assert View.create((2, 3)).contiguous
  assert not View.create((2, 3), offset=1).contiguous
  assert not View.create((2, 3), mask=((0, 1), (0, 3))).contiguous
  assert not View.create((2, 3), (1, 2)).contiguous


def test_create_errors() -> None:
  with pytest.raises(ValueError, match=r"View.create: shape \(2, -1\) has a negative dim"):
    View.create((2, -1))
  with pytest.raises(ValueError, match=r"View.create: shape \(2, 3\) has 2 dims but strides \(1,\)"):
    View.create((2, 3), (1,))
  with pytest.raises(ValueError, match=r"View.create: 2.5 is not an int"):
    View.create((2, 2.5))


def test_repr() -> None:
  assert repr(View.create((3,)).pad(((1, 1),))) == "View(shape=(5,), strides=(1,), offset=-1, mask=((1, 4),))"


# ***** movement ops *****

BASE = View.create((2, 3, 4))
ARANGE = np.arange(24).reshape(2, 3, 4)


def test_permute() -> None:
  view = BASE.permute((2, 0, 1))
  assert view.shape == (4, 2, 3) and view.strides == (1, 12, 4)
  np.testing.assert_array_equal(read(view), ARANGE.transpose(2, 0, 1))
  padded = BASE.pad(((0, 0), (1, 0), (0, 0))).permute((1, 2, 0))
  assert padded.mask == ((1, 4), (0, 4), (0, 2))
  with pytest.raises(ValueError, match=r"permute: \(0, 0, 1\) is not a permutation of the 3 axes of shape \(2, 3, 4\)"):
    BASE.permute((0, 0, 1))


def test_expand() -> None:
  view = View.create((1, 4)).expand((3, 4))
  assert view == View.create((3, 4), (0, 1))
  np.testing.assert_array_equal(read(view), np.broadcast_to(np.arange(4), (3, 4)))
  masked = View.create((1, 4)).pad(((0, 0), (1, 0))).expand((2, 5))
  assert masked.mask == ((0, 2), (1, 5))
  assert View.create((1, 4)).shrink(((0, 1), (2, 2))).expand((3, 0)).size() == 0
  empty = View.create((1,), mask=((1, 1),)).expand((5,))
  assert empty.reads_nothing()


def test_expand_errors() -> None:
  with pytest.raises(ValueError, match=r"expand: can't expand \(2, 3\) to \(4, 3\): axis 0 has size 2; only size-1"):
    View.create((2, 3)).expand((4, 3))
  with pytest.raises(ValueError, match=r"expand: can't expand \(2, 3\) to \(2, 3, 1\): they have different ranks"):
    View.create((2, 3)).expand((2, 3, 1))


def test_pad() -> None:
  view = BASE.pad(((1, 0), (0, 2), (1, 1)))
  assert view.shape == (3, 5, 6) and view.offset == -13 and view.mask == ((1, 3), (0, 3), (1, 5))
  np.testing.assert_array_equal(read(view), np.pad(ARANGE, ((1, 0), (0, 2), (1, 1)), constant_values=PAD))
  assert BASE.pad(((0, 0),) * 3) is BASE
  twice = view.pad(((0, 1), (1, 0), (0, 0)))
  np.testing.assert_array_equal(read(twice), np.pad(read(view), ((0, 1), (1, 0), (0, 0)), constant_values=PAD))
  with pytest.raises(ValueError, match=r"pad: \(\(0, -1\),\) on shape \(3,\) has a negative amount; use shrink"):
    View.create((3,)).pad(((0, -1),))
  with pytest.raises(ValueError, match=r"pad: \(\(0, 1\),\) on shape \(3, 2\) needs one \(before, after\) pair"):
    View.create((3, 2)).pad(((0, 1),))


def test_shrink() -> None:
  view = BASE.shrink(((1, 2), (0, 2), (1, 4)))
  assert view.shape == (1, 2, 3) and view.offset == 13 and view.strides == (0, 4, 1)
  np.testing.assert_array_equal(read(view), ARANGE[1:2, 0:2, 1:4])
  padded = BASE.pad(((0, 0), (2, 2), (0, 0)))
  np.testing.assert_array_equal(read(padded.shrink(((0, 2), (1, 6), (1, 3)))), read(padded)[:, 1:6, 1:3])
  assert padded.shrink(((0, 2), (2, 5), (0, 4))).mask is None
  assert padded.shrink(((0, 2), (0, 2), (0, 4))).reads_nothing()
  assert BASE.shrink(((0, 2), (0, 3), (0, 4))) is BASE
  with pytest.raises(ValueError, match=r"shrink: can't shrink \(2, 3, 4\) with \(\(0, 2\), \(2, 1\), \(0, 4\)\): "
                                       r"axis 1 needs 0 <= start <= end <= 3"):
    BASE.shrink(((0, 2), (2, 1), (0, 4)))


@pytest.mark.parametrize("mults", [(1, -1, 1), (-1, -1, -1), (1, 2, 3), (2, -2, -3), (-1, 3, 1)])
def test_stride(mults) -> None:
  view = BASE.stride(mults)
  np.testing.assert_array_equal(read(view), ARANGE[tuple(slice(None, None, m) for m in mults)])
  padded = BASE.pad(((1, 2), (0, 3), (2, 1)))
  np.testing.assert_array_equal(read(padded.stride(mults)), read(padded)[tuple(slice(None, None, m) for m in mults)])


def test_stride_flip_fields() -> None:
  view = View.create((5,)).stride((-1,))
  assert view == View.create((5,), (-1,), 4) and view.extent() == 5
  assert View.create((5,)).pad(((1, 0),)).stride((-2,)).mask is None       # reads 4, 2, 0
  assert View.create((5,)).pad(((0, 1),)).stride((-2,)).mask == ((1, 3),)  # reads pad, 3, 1
  with pytest.raises(ValueError, match=r"stride: \(0,\) on shape \(5,\) needs one nonzero int per axis"):
    View.create((5,)).stride((0,))


# ***** reshape *****

@pytest.mark.parametrize("view, new_shape", [
  (BASE, (6, 4)),
  (BASE.permute((2, 0, 1)), (4, 6)),
  (BASE.permute((2, 0, 1)), (2, 2, 2, 3)),
  (BASE.permute((1, 0, 2)), (3, 1, 2, 2, 2, 1)),
  (View.create((1, 4)).expand((6, 4)), (2, 3, 2, 2)),
  (View.create((6, 1)).expand((6, 4)), (2, 3, 2, 2)),
  (BASE.shrink(((0, 2), (0, 3), (1, 3))), (6, 2)),
  (BASE.shrink(((0, 2), (1, 2), (0, 4))), (2, 2, 2)),
  (BASE.pad(((1, 1), (0, 0), (0, 0))), (4, 12)),
  (BASE.pad(((1, 1), (0, 0), (0, 0))), (48,)),
  (BASE.pad(((0, 0), (0, 0), (2, 2))), (2, 3, 4, 2)),
  (BASE.pad(((1, 0), (0, 0), (1, 1))).shrink(((0, 2), (1, 2), (0, 6))), (12,)),
  (BASE.pad(((0, 0), (0, 0), (2, 0))).shrink(((0, 2), (1, 2), (0, 2))), (4,)),
  (BASE.stride((1, 1, -1)), (3, 2, 4)),
  (View.create((1, 1)).pad(((1, 0), (0, 2))), (6,)),
  (View.create((1, 1)).pad(((1, 0), (0, 2))), (3, 2)),
  (View.create((4, 1)).shrink(((2, 3), (0, 1))), ()),
])
def test_reshape_in_one_view(view: View, new_shape: tuple[int, ...]) -> None:
  reshaped = view.reshape(new_shape)
  assert reshaped is not None, f"{view} to {new_shape}"
  assert reshaped.shape == new_shape
  np.testing.assert_array_equal(read(reshaped), read(view).reshape(new_shape))


@pytest.mark.parametrize("view, new_shape", [
  (BASE.permute((2, 0, 1)), (24,)),
  (BASE.permute((0, 2, 1)), (2, 12)),
  (View.create((1, 4)).expand((3, 4)), (12,)),
  (BASE.pad(((0, 0), (1, 1), (0, 0))), (40,)),
  (BASE.shrink(((0, 2), (0, 3), (0, 3))), (18,)),
])
def test_reshape_needs_two_views(view: View, new_shape: tuple[int, ...]) -> None:
  assert view.reshape(new_shape) is None


def test_reshape_shortcuts() -> None:
  assert BASE.reshape((2, 3, 4)) is BASE
  assert BASE.reshape((24,)) == View.create((24,))
  assert View.create((2, 0)).reshape((0, 5)) == View.create((0, 5))
  empty = View.create((4, 3), mask=((0, 0), (0, 3)))
  assert empty.reshape((2, 6)).reads_nothing()


def test_reshape_errors() -> None:
  with pytest.raises(ValueError, match=r"reshape: can't reshape \(2, 3\) to \(4, 2\): sizes 6 and 8 differ"):
    View.create((2, 3)).reshape((4, 2))
  with pytest.raises(ValueError, match=r"reshape: shape \(-1, 6\) has a negative dim"):
    View.create((2, 3)).reshape((-1, 6))


# ***** index expressions *****

def test_to_indexed_uops() -> None:
  a, b = Variable("a", 0, 3), Variable("b", 0, 5)
  index, valid = View.create((4, 6), (1, 4), 2, ((1, 3), (0, 6))).to_indexed_uops([a, b])
  assert index.render() == "a+b*4+2" and valid.render() == "(0<a)&(a<3)"
  index, valid = View.create((4, 6)).to_indexed_uops([a, b])
  assert index.render() == "a*6+b" and valid.render() == "True"
  with pytest.raises(ValueError, match=r"to_indexed_uops: view of shape \(4, 6\) needs 2 indices, got 1"):
    View.create((4, 6)).to_indexed_uops([a])


def test_linear_form() -> None:
  a, b, n = Variable("a", 0, 3), Variable("b", 0, 5), Variable("n", 1, 8)
  assert linear_form(a * 3 + b * n + 7, [a, b]) == ([3, n], 7)
  assert linear_form(a * a + b * 2, [a, b]) == ([None, 2], 0)
  assert linear_form(a // 2 + (a + b) % 3 + n, [a, b]) == ([None, None], n)


# ***** merging stacked views *****

def test_add_contiguous_inner_is_outer() -> None:
  outer = View.create((4, 3), (1, 4), 0, None)
  assert View.create((3, 4)) + outer == outer


def test_add_contiguous_outer_is_reshape() -> None:
  inner = BASE.permute((2, 0, 1))
  assert inner + View.create((2, 2, 6)) == inner.reshape((2, 2, 6))


def test_add_affine() -> None:
  inner = BASE.permute((2, 0, 1)).reshape((4, 6))
  outer = View.create((24,)).reshape((4, 6)).shrink(((1, 3), (2, 5)))
  merged = inner + outer
  assert merged is not None and merged.shape == (2, 3)
  np.testing.assert_array_equal(read(merged), read_stack(inner, outer))


def test_add_keeps_masks() -> None:
  inner = View.create((4, 3)).pad(((1, 1), (0, 0)))            # (6, 3), rows 0 and 5 invalid
  outer = View.create((6, 3)).permute((1, 0)).stride((1, -1))
  merged = inner + outer
  assert merged is not None and merged.mask == ((0, 3), (1, 5))
  np.testing.assert_array_equal(read(merged), read_stack(inner, outer))


def test_add_not_expressible() -> None:
  inner = View.create((3, 4)).permute((1, 0))
  assert inner + View.create((12,)) is None


def test_add_reads_nothing() -> None:
  outer = View.create((4,), mask=((2, 2),))
  assert View.create((2, 2)).permute((1, 0)) + outer == outer
  assert (View.create((4,), mask=((0, 0),)) + View.create((2, 2), (1, 2))).reads_nothing()


def _random_view(data, shape: tuple[int, ...]) -> View:
  """A view of `shape` after up to three random permutes, pads, shrinks, strides and expands."""
  view = View.create(shape)
  for _ in range(data.draw(st.integers(0, 3))):
    op = data.draw(st.sampled_from(["permute", "pad", "shrink", "stride", "expand"]))
    if op == "permute":
      view = view.permute(data.draw(st.permutations(range(view.ndim))))
    elif op == "pad":
      view = view.pad(tuple(data.draw(st.tuples(st.integers(0, 1), st.integers(0, 1))) for _ in view.shape))
    elif op == "shrink":
      starts = [data.draw(st.integers(0, max(s - 1, 0))) for s in view.shape]
      view = view.shrink(tuple((b, data.draw(st.integers(b, s))) for b, s in zip(starts, view.shape)))
    elif op == "stride":
      view = view.stride(tuple(data.draw(st.sampled_from([1, -1, 2, -2])) for _ in view.shape))
    else:
      view = view.expand(tuple(data.draw(st.integers(1, 3)) if s == 1 else s for s in view.shape))
  return view


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_add_matches_stacked_views(data) -> None:
  """Whenever two stacked views merge, the merged view reads exactly what the stack reads."""
  inner = _random_view(data, tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))))
  size = prod(inner.shape)
  dims = [d for d in range(1, size + 1) if size % d == 0]
  first = data.draw(st.sampled_from(dims)) if size else 0
  outer = _random_view(data, (first, size // first) if size else (0,))
  merged = inner + outer
  if merged is not None:
    assert merged.shape == outer.shape
    np.testing.assert_array_equal(read(merged), read_stack(inner, outer))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_reshape_matches_numpy(data) -> None:
  view = _random_view(data, tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))))
  size = prod(view.shape)
  new_shape = tuple(data.draw(st.permutations([d for d in (size // 2, 2) if size % 2 == 0] or [size])))
  if view.size() == 0: return
  reshaped = view.reshape(new_shape)
  if reshaped is not None:
    np.testing.assert_array_equal(read(reshaped), read(view).reshape(new_shape))


# ***** helpers *****

def test_minify() -> None:
  assert View.create((2, 3, 4)).minify() == View.create((24,))
  assert BASE.permute((1, 0, 2)).minify() == View.create((3, 2, 4), (4, 12, 1))
  assert BASE.permute((2, 0, 1)).minify() == View.create((4, 6), (1, 4))


def test_extent() -> None:
  assert BASE.extent() == 24 and BASE.size() == 24
  assert BASE.shrink(((0, 1), (1, 2), (0, 4))).extent() == 8
  assert BASE.stride((-1, 1, -1)).extent() == 24
  assert BASE.pad(((3, 3), (0, 0), (0, 0))).extent() == 24


# ***** symbolic dims *****

N = Variable("n", 1, 8)


def test_symbolic_view() -> None:
  n = N.bind(3)
  view = View.create((n, 4))
  assert view.contiguous and view.strides == (4, 1) and view.vars() == {N}
  reshaped = view.reshape((n, 2, 2))
  assert reshaped is not None and reshaped.contiguous
  merged = View.create((1, 4)).expand((n, 4)).reshape((n, 2, 2))
  assert merged is not None and merged.strides == (0, 2, 1)
  unbound, values = merged.unbind()
  assert values == {N: 3} and unbound.shape == (N, 2, 2) and unbound.vars() == {N}


def test_unbind_conflicting_values() -> None:
  view = View.create((N.bind(3), N.bind(4)))
  with pytest.raises(ValueError, match=r"unbind: n is bound to both 3 and 4"):
    view.unbind()


def test_symbolic_errors() -> None:
  n = N.bind(3)
  with pytest.raises(ValueError, match=r"reshape: can't reshape \(n=3, 4\) to \(n=3, 3\): sizes"):
    View.create((n, 4)).reshape((n, 3))
  with pytest.raises(ValueError, match=r"stride: can't take every 2-th element of symbolic axis 0"):
    View.create((n, 4)).stride((2, 1))
