"""Tests for fusegrad.shape.shapetracker: movement-op chains against numpy, exact index forms, view merging,
real strides, size, composition and symbolic shapes.

The property test applies the same random chain of movement ops to a ShapeTracker and to `np.arange` (padding with a
-1 sentinel), then checks every element: the index expression must give numpy's value and valid must be False
exactly at the sentinels. Index expressions are evaluated over all elements at once by a small numpy interpreter.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fusegrad.helpers import prod
from fusegrad.shape import ShapeTracker, View
from fusegrad.uop import Ops, UOp, Variable

PAD = -1
_NP_ALU = {Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.IDIV: np.floor_divide, Ops.MOD: np.mod,
           Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal, Ops.AND: np.logical_and,
           Ops.OR: np.logical_or, Ops.XOR: np.logical_xor, Ops.MAX: np.maximum, Ops.NEG: np.negative,
           Ops.WHERE: np.where}


def np_eval(u: UOp, env: dict[str, np.ndarray | int]) -> np.ndarray:
  """Evaluate an int/bool expression with numpy arrays for its variables (Python's floor division and modulo)."""
  vals: dict[UOp, np.ndarray] = {}
  for n in u.toposort():
    if n.op is Ops.CONST: vals[n] = np.asarray(n.arg)
    elif n.op is Ops.DEFINE_VAR: vals[n] = np.asarray(env[n.arg.name])
    elif n.op is Ops.BIND: vals[n] = vals[n.src[1]]
    else: vals[n] = _NP_ALU[n.op](*[vals[s] for s in n.src])
  return vals[u]


def check_against(tracker: ShapeTracker, expected: np.ndarray, var_env: dict[str, int] | None = None) -> None:
  """Every element of `expected` (PAD where invalid) must be what tracker's (index, valid) give."""
  assert tuple(expected.shape) == tuple(int(np_eval(s, var_env or {})) if isinstance(s, UOp) else s
                                        for s in tracker.shape)
  grid = np.indices(expected.shape) if expected.ndim else []
  env = {**(var_env or {}), **{f"idx{i}": g for i, g in enumerate(grid)}}
  index, valid = tracker.expr_idxs()
  index = np.broadcast_to(np_eval(index, env), expected.shape)
  valid = np.broadcast_to(np_eval(valid, env), expected.shape).astype(bool)
  np.testing.assert_array_equal(valid, expected != PAD, err_msg=f"valid is wrong for {tracker}")
  np.testing.assert_array_equal(np.where(valid, index, PAD), expected, err_msg=f"index is wrong for {tracker}")
  size = int(np_eval(tracker.size, env)) if isinstance(tracker.size, UOp) else tracker.size
  if valid.any():
    assert index[valid].min() >= 0 and index[valid].max() < size, f"size {tracker.size} of {tracker}"


# ***** random movement-op chains *****

def _divisors(n: int) -> list[int]: return [d for d in range(1, n + 1) if n % d == 0]


def draw_reshape(data, shape: tuple[int, ...]) -> tuple[int, ...]:
  kind = data.draw(st.sampled_from(["factorize", "merge", "split", "add_one"]))
  if 0 in shape and kind in ("factorize", "split"): return data.draw(st.sampled_from([(0,), (2, 0), (0, 3, 1)]))
  if kind == "merge" and len(shape) >= 2:
    i = data.draw(st.integers(0, len(shape) - 2))
    return shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2:]
  if kind == "split" and shape:
    i = data.draw(st.integers(0, len(shape) - 1))
    d = data.draw(st.sampled_from(_divisors(shape[i])))
    return shape[:i] + (d, shape[i] // d) + shape[i + 1:]
  if kind == "add_one":
    i = data.draw(st.integers(0, len(shape)))
    return shape[:i] + (1,) + shape[i:]
  rest, out = prod(shape), []
  while len(out) < 3 and rest > 1:
    d = data.draw(st.sampled_from(_divisors(rest)))
    out.append(d)
    rest //= d
  return tuple(out) + (rest,)


NUMPY_OPS = {
  "reshape": lambda a, shape: a.reshape(shape),
  "permute": lambda a, order: a.transpose(order),
  "expand": np.broadcast_to,
  "pad": lambda a, arg: np.pad(a, arg, constant_values=PAD),
  "shrink": lambda a, arg: a[tuple(slice(b, e) for b, e in arg)],
  "stride": lambda a, mults: a[tuple(slice(None, None, m) for m in mults)],
}


def apply_ops(tracker: ShapeTracker, arr: np.ndarray, *steps: tuple[str, tuple]) -> tuple[ShapeTracker, np.ndarray]:
  """Apply (op name, argument) steps to both the tracker and the numpy array."""
  for op, arg in steps:
    tracker, arr = getattr(tracker, op)(arg), NUMPY_OPS[op](arr, arg)
  return tracker, arr


def draw_op(data, shape: tuple[int, ...]) -> tuple[str, tuple] | None:
  """A random movement op valid on `shape`, or None when it would grow the array past 400 elements."""
  op = data.draw(st.sampled_from(["reshape", "permute", "expand", "pad", "shrink", "flip", "stride"]))
  if op == "reshape": return op, draw_reshape(data, shape)
  if op == "permute": return op, tuple(data.draw(st.permutations(range(len(shape)))))
  if op == "expand":
    new_shape = tuple(data.draw(st.integers(1, 3)) if s == 1 else s for s in shape)
    return (op, new_shape) if prod(new_shape) <= 400 else None
  if op == "pad":
    arg = tuple(data.draw(st.tuples(st.integers(0, 2), st.integers(0, 2))) for _ in shape)
    return (op, arg) if prod(s + b + a for s, (b, a) in zip(shape, arg)) <= 400 else None
  if op == "shrink":
    starts = [data.draw(st.integers(0, s)) for s in shape]
    return op, tuple((b, data.draw(st.integers(b, s))) for b, s in zip(starts, shape))
  return "stride", tuple(data.draw(st.sampled_from([1, -1] if op == "flip" else [1, 2, -2])) for _ in shape)


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_random_movement_chains_match_numpy(data) -> None:
  shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
  tracker, arr = ShapeTracker.from_shape(shape), np.arange(prod(shape)).reshape(shape)
  for _ in range(data.draw(st.integers(1, 6))):
    step = draw_op(data, arr.shape)
    if step is not None: tracker, arr = apply_ops(tracker, arr, step)
  check_against(tracker, arr)


def test_np_eval_agrees_with_evaluate() -> None:
  tracker = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((12,)).pad(((1, 2),))
  index, valid = tracker.expr_idxs()
  for i in range(15):
    assert np_eval(index, {"idx0": i}) == index.evaluate({"idx0": i})
    assert np_eval(valid, {"idx0": i}) == valid.evaluate({"idx0": i})


# ***** exact index forms and view counts *****

def test_contiguous() -> None:
  tracker = ShapeTracker.from_shape((2, 3, 4))
  assert tracker.contiguous and tracker.size == 24 and tracker.shape == (2, 3, 4)
  assert tracker.expr_idxs()[0].render() == "idx0*12+idx1*4+idx2"
  assert tracker.expr_idxs()[1].render() == "True"


def test_permute_renders_affine() -> None:
  tracker = ShapeTracker.from_shape((3, 4)).permute((1, 0))
  assert tracker.expr_idxs()[0].render() == "idx0+idx1*4"
  assert not tracker.contiguous


def test_permute_then_split_stays_one_view() -> None:
  tracker = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((2, 2, 3))
  assert len(tracker.views) == 1
  assert tracker.expr_idxs()[0].render() == "idx0*2+idx1+idx2*4"
  check_against(tracker, np.arange(12).reshape(3, 4).T.reshape(2, 2, 3))


def test_unmergeable_reshape_stacks_two_views() -> None:
  tracker = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((12,))
  assert len(tracker.views) == 2
  assert tracker.expr_idxs()[0].render() == "(idx0%3)*4+idx0//3"
  check_against(tracker, np.arange(12).reshape(3, 4).T.reshape(12))


def test_stacked_views_merge_back() -> None:
  """Reshaping back to the permuted shape makes the top view contiguous, and the two views merge."""
  tracker = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((12,)).reshape((4, 3))
  assert tracker == ShapeTracker.from_shape((3, 4)).permute((1, 0))


def test_stacked_views_merge_when_affine() -> None:
  tracker = ShapeTracker.from_shape((4, 4)).permute((1, 0)).reshape((16,)).reshape((2, 8)).shrink(((0, 2), (0, 4)))
  assert len(tracker.views) == 1
  check_against(tracker, np.arange(16).reshape(4, 4).T.reshape(2, 8)[:, :4])


@pytest.mark.parametrize("steps", [
  [("reshape", (4, 6))],
  [("reshape", (1, 24, 1))],
  [("permute", (2, 0, 1)), ("reshape", (4, 6))],
  [("permute", (2, 0, 1)), ("reshape", (2, 2, 2, 3))],
  [("shrink", ((0, 2), (1, 3), (0, 4))), ("reshape", (2, 8))],
  [("shrink", ((0, 2), (0, 3), (1, 3))), ("reshape", (3, 2, 2))],
  [("stride", (1, -1, 1)), ("reshape", (2, 3, 2, 2))],
  [("pad", ((1, 1), (0, 0), (0, 0))), ("reshape", (4, 12))],
  [("pad", ((1, 1), (0, 0), (0, 0))), ("reshape", (8, 3, 2))],
  [("reshape", (6, 4)), ("permute", (1, 0)), ("reshape", (2, 2, 3, 2)), ("permute", (2, 3, 0, 1)), ("reshape", (6, 4))],
], ids=["contiguous", "size-1 axes", "merge permuted", "split permuted", "shrink merge", "shrink split", "flip split",
        "pad merge", "pad split", "transpose back"])
def test_reshape_stays_one_view(steps) -> None:
  tracker, arr = apply_ops(ShapeTracker.from_shape((2, 3, 4)), np.arange(24).reshape(2, 3, 4), *steps)
  assert len(tracker.views) == 1, tracker
  check_against(tracker, arr)


def test_reshape_after_expand() -> None:
  tracker = ShapeTracker.from_shape((1, 4)).expand((3, 4)).reshape((3, 2, 2))
  assert tracker.views == (View.create((3, 2, 2), (0, 2, 1)),)
  assert tracker.expr_idxs()[0].render() == "idx1*2+idx2"
  merged = ShapeTracker.from_shape((4, 1)).expand((4, 3)).reshape((2, 2, 3))
  assert merged.views == (View.create((2, 2, 3), (2, 1, 0)),)


def test_contiguous_after_round_trip() -> None:
  tracker = ShapeTracker.from_shape((2, 3, 4)).permute((1, 0, 2)).permute((1, 0, 2)).reshape((6, 4))
  assert tracker.contiguous and tracker == ShapeTracker.from_shape((6, 4))


# ***** strides, size, composition *****

def test_real_strides() -> None:
  base = ShapeTracker.from_shape((2, 3, 4))
  assert base.real_strides() == (12, 4, 1) and base.unit_stride_axes() == [2]
  assert base.permute((2, 0, 1)).real_strides() == (1, 12, 4) and base.permute((2, 0, 1)).unit_stride_axes() == [0]
  expanded = ShapeTracker.from_shape((1, 4)).expand((5, 4))
  assert expanded.real_strides() == (0, 1) and expanded.unit_stride_axes() == [1]
  padded = ShapeTracker.from_shape((3, 4)).pad(((0, 0), (1, 0)))
  assert padded.real_strides() == (4, None) and padded.unit_stride_axes() == []
  assert padded.real_strides(ignore_valid=True) == (4, 1) and padded.unit_stride_axes(ignore_valid=True) == [1]


def test_real_strides_of_stacked_views() -> None:
  tracker = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((12,)).reshape((2, 6))
  assert len(tracker.views) == 2
  assert tracker.real_strides() == (2, None)  # index: idx0*2 + idx1//3 + (idx1%3)*4
  split = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((12,)).reshape((4, 3))
  assert split.real_strides() == (1, 4)


def test_size() -> None:
  assert ShapeTracker.from_shape((3, 4)).shrink(((1, 2), (1, 3))).size == 7
  assert ShapeTracker.from_shape((5,)).stride((-1,)).size == 5
  assert ShapeTracker.from_shape((3, 4)).pad(((2, 2), (1, 1))).size == 12
  assert ShapeTracker.from_shape((1, 4)).expand((100, 4)).size == 4
  assert ShapeTracker.from_shape((3, 4)).shrink(((1, 1), (0, 4))).size == 0
  assert ShapeTracker.from_shape((3, 4)).pad(((1, 1), (0, 0))).shrink(((0, 1), (0, 4))).size == 0


def test_compose() -> None:
  top = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((12,)).shrink(((2, 10),))
  assert ShapeTracker.from_shape((3, 4)) + top == top
  inner = ShapeTracker.from_shape((4, 3)).permute((1, 0)).pad(((0, 0), (1, 1)))
  outer = ShapeTracker.from_shape((3, 6)).stride((-1, 2)).permute((1, 0))
  base = NUMPY_OPS["pad"](np.arange(12).reshape(4, 3).T, ((0, 0), (1, 1)))
  check_against(inner + outer, base[::-1, ::2].T)


def test_expr_idxs_with_given_idxs() -> None:
  row, col = Variable("row", 0, 3), Variable("col", 0, 2)
  index, valid = ShapeTracker.from_shape((3, 4)).permute((1, 0)).pad(((0, 0), (1, 0))).expr_idxs([row, col])
  assert index.render() == "col*4+row-4" and valid.render() == "0<col"


def test_repr() -> None:
  assert repr(ShapeTracker.from_shape((3, 4)).permute((1, 0))) == \
    "ShapeTracker(View(shape=(4, 3), strides=(1, 4), offset=0, mask=None))"
  assert str(ShapeTracker.from_shape((3,)).pad(((1, 0),))) == \
    "ShapeTracker(View(shape=(4,), strides=(1,), offset=-1, mask=((1, 4),)))"


def test_errors() -> None:
  tracker = ShapeTracker.from_shape((2, 3))
  with pytest.raises(ValueError, match=r"reshape: can't reshape \(2, 3\) to \(4, 2\): sizes 6 and 8 differ"):
    tracker.reshape((4, 2))
  with pytest.raises(ValueError, match=r"expr_idxs: shape \(2, 3\) needs 2 indices, got 1"):
    tracker.expr_idxs([Variable("i", 0, 5)])


# ***** symbolic shapes *****

N = Variable("n", 1, 10)


@pytest.mark.parametrize("start, steps, n_views", [
  (lambda n: (n, 4), lambda n: [("reshape", (n, 2, 2)), ("permute", (1, 0, 2))], 1),
  (lambda n: (1, 6), lambda n: [("expand", (n, 6)), ("reshape", (n, 2, 3)), ("permute", (2, 1, 0))], 1),
  (lambda n: (n, 3), lambda n: [("pad", ((1, 0), (0, 0))), ("stride", (-1, 1)), ("shrink", ((0, 2), (1, 3)))], 1),
  (lambda n: (n, 4), lambda n: [("permute", (1, 0)), ("reshape", (4 * n,))], 2),
  (lambda n: (n, 4), lambda n: [("pad", ((1, 1), (0, 0))), ("reshape", ((n + 2) * 4,))], 1),
  (lambda n: (n, 4), lambda n: [("pad", ((1, 1), (0, 0))), ("reshape", (n + 2, 2, 2))], 1),
  (lambda n: (4, n), lambda n: [("reshape", (2, 2, n)), ("permute", (2, 0, 1)), ("reshape", (n, 4))], 1),
  (lambda n: (n, 2), lambda n: [("permute", (1, 0)), ("reshape", (2 * n,)), ("reshape", (2, n))], 1),
], ids=["split permute", "expand split", "pad flip shrink", "stacked", "pad merge", "pad split", "permute merge",
        "merge back"])
def test_symbolic_chains(start, steps, n_views) -> None:
  """Build with n bound to 3, then check the unbound tracker at several values of n against numpy."""
  bound = N.bind(3)
  tracker = ShapeTracker.from_shape(start(bound))
  for op, arg in steps(bound):
    tracker = getattr(tracker, op)(arg)
  assert len(tracker.views) == n_views, tracker
  assert tracker.vars() == {N} and tracker.var_vals == {N: 3}
  unbound, values = tracker.unbind()
  assert values == {N: 3} and unbound.var_vals == {} and unbound.vars() == {N}
  for value in (1, 3, 7, 10):
    shape = start(value)
    _, expected = apply_ops(ShapeTracker.from_shape(shape), np.arange(prod(shape)).reshape(shape), *steps(value))
    check_against(unbound, expected, {"n": value})


def test_symbolic_shape_fields() -> None:
  n = N.bind(3)
  tracker = ShapeTracker.from_shape((n, 4)).reshape((n, 2, 2)).permute((1, 0, 2))
  assert tracker.shape == (2, n, 2) and tracker.unbind()[0].shape == (2, N, 2)
  assert tracker.real_strides() == (2, 4, 1) and tracker.unit_stride_axes() == [2]
  merged = ShapeTracker.from_shape((n, 2, 3)).reshape((n * 6,))
  assert merged.contiguous and merged.size is merged.shape[0]
  expanded = ShapeTracker.from_shape((1, 6)).expand((n, 6))
  assert expanded.real_strides() == (0, 1) and expanded.size == 6
