"""Tests for fusegrad.symbolic: a property test that simplification keeps every value and bound, then one
before/after test per rule of the `constant_folding`, `identities`, `logic` and `int_algebra` tables.

The property test draws random int and bool expressions over small Variables (some of them negative) and compares the
simplified form with the original by brute force over every point of the variables' ranges.
"""
import itertools
import math

import numpy as np
import torch
from hypothesis import given, settings, strategies as st

from fusegrad.dtype import dtypes
from fusegrad.symbolic import simplify
from fusegrad.uop import Ops, UOp, Variable, exec_alu

a, b, c, n = Variable("a", 0, 7), Variable("b", 0, 3), Variable("c", 0, 100), Variable("n", -8, 8)
p, q = a < 3, b < 2                       # bool conditions that bounds don't decide
TRUE, FALSE = UOp.const(dtypes.bool, True), UOp.const(dtypes.bool, False)
ld = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), 0), a))  # an opaque float


def i32(v: int) -> UOp: return UOp.const(dtypes.int32, v)
def f32(v: float) -> UOp: return UOp.const(dtypes.float32, v)
def simple(e: UOp) -> str: return simplify(e).render()


# ***** property: simplify keeps values and bounds *****

# "split" reuses a subexpression the way index code does: (x//4)*m + x%k
INT_KINDS = ("var", "const", "add", "sub", "mul_const", "mul_var", "idiv", "mod", "maximum", "neg", "split")


def _int_expr(draw, vs: list[UOp], depth: int) -> UOp:
  kind = draw(st.sampled_from(INT_KINDS[:2] if depth == 0 else INT_KINDS))
  if kind == "var": return draw(st.sampled_from(vs))
  if kind == "const": return i32(draw(st.integers(-6, 6)))
  x = _int_expr(draw, vs, depth - 1)
  if kind == "add": return x + _int_expr(draw, vs, depth - 1)
  if kind == "sub": return x - _int_expr(draw, vs, depth - 1)
  if kind == "mul_const": return x * draw(st.integers(-4, 6))
  if kind == "mul_var": return x * draw(st.sampled_from(vs))
  if kind == "idiv": return x // draw(st.integers(1, 6))
  if kind == "mod": return x % draw(st.integers(1, 6))
  if kind == "maximum": return x.maximum(_int_expr(draw, vs, depth - 1))
  if kind == "split": return (x // draw(st.integers(1, 6))) * draw(st.integers(1, 6)) + x % draw(st.integers(1, 6))
  return -x


def _bool_expr(draw, vs: list[UOp], depth: int) -> UOp:
  kind = draw(st.sampled_from(("lt_const", "lt") if depth <= 1 else ("lt_const", "lt", "and", "or")))
  if kind == "lt_const": return _int_expr(draw, vs, max(depth - 1, 0)) < draw(st.integers(-6, 12))
  if kind == "lt": return _int_expr(draw, vs, max(depth - 1, 0)) < _int_expr(draw, vs, max(depth - 2, 0))
  x, y = _bool_expr(draw, vs, depth - 1), _bool_expr(draw, vs, depth - 1)
  return x & y if kind == "and" else x | y


@st.composite
def expressions(draw) -> tuple[UOp, list[UOp]]:
  """An int or bool expression of depth <= 4 over 2-3 Variables; `a` and `c` may be negative, `b` is not."""
  vs = []
  for name, lows in (("a", (-3, 3)), ("b", (0, 5)), ("c", (-3, 3))):
    low = draw(st.integers(*lows))
    vs.append(Variable(name, low, low + draw(st.integers(0, 6))))
  vs = vs[:draw(st.integers(2, 3))]
  depth = draw(st.integers(1, 4))
  return (_bool_expr(draw, vs, depth) if draw(st.booleans()) else _int_expr(draw, vs, depth)), vs


@settings(max_examples=400, deadline=None)
@given(expressions())
def test_simplify_keeps_values_and_bounds(case: tuple[UOp, list[UOp]]) -> None:
  e, vs = case
  s = simplify(e)
  printed = compile(s.render(), "<render>", "eval")   # the printed form reads as Python with the same value
  for point in itertools.product(*[range(v.vmin, v.vmax + 1) for v in vs]):
    env = {v.arg.name: x for v, x in zip(vs, point)}
    value = e.evaluate(env)
    assert s.evaluate(env) == value, f"{e.render()} -> {s.render()} at {env}"
    assert e.vmin <= value <= e.vmax, f"bounds of {e.render()}: [{e.vmin}, {e.vmax}] miss {value} at {env}"
    assert s.vmin <= value <= s.vmax, f"bounds of {s.render()}: [{s.vmin}, {s.vmax}] miss {value} at {env}"
    assert eval(printed, {"max": max}, env) == value, f"{s.render()} read as Python at {env}"


@st.composite
def index_splits(draw) -> tuple[UOp, list[UOp]]:
  """((x//k1)*m + x%k2) // k3 or % k3: the split-and-regroup index code of reshapes, where one term recurs."""
  low = draw(st.integers(-3, 3))
  vs = [Variable("a", low, low + draw(st.integers(0, 8))), Variable("b", 0, 3)]
  x = _int_expr(draw, vs, draw(st.integers(0, 1)))
  k1 = draw(st.integers(1, 6))
  m = k1 * draw(st.integers(1, 3)) if draw(st.booleans()) else draw(st.integers(1, 12))
  low_part = x if draw(st.booleans()) else x % draw(st.integers(1, 12))
  k3 = k1 if draw(st.booleans()) else draw(st.integers(1, 6))
  split = (x // k1) * m + low_part + draw(st.integers(-4, 4))
  return (split // k3 if draw(st.booleans()) else split % k3), vs


@settings(max_examples=500, deadline=None)
@given(index_splits())
def test_simplify_keeps_values_of_index_splits(case: tuple[UOp, list[UOp]]) -> None:
  e, vs = case
  s = simplify(e)
  for point in itertools.product(*[range(v.vmin, v.vmax + 1) for v in vs]):
    env = {v.arg.name: x for v, x in zip(vs, point)}
    assert s.evaluate(env) == e.evaluate(env), f"{e.render()} -> {s.render()} at {env}"


def test_simplify_is_idempotent_and_memoized() -> None:
  e = (c // 4) * 4 + c % 4 + (a * 4 + b) // 4
  assert simplify(e) is simplify(e) and simplify(simplify(e)) is simplify(e)


# ***** division semantics *****

def test_exec_alu_floor_division_and_python_modulo() -> None:
  """IDIV floors and MOD takes the divisor's sign, as Python and torch (not C's truncation)."""
  for x, y in itertools.product(range(-9, 10), [d for d in range(-4, 5) if d != 0]):
    assert exec_alu(Ops.IDIV, dtypes.int32, [x, y]) == x // y
    assert exec_alu(Ops.MOD, dtypes.int32, [x, y]) == x % y
  xs, ys = np.repeat(np.arange(-9, 10), 8), np.tile([-4, -3, -2, -1, 1, 2, 3, 4], 19)
  assert [exec_alu(Ops.IDIV, dtypes.int64, [int(x), int(y)]) for x, y in zip(xs, ys)] == \
    torch.div(torch.tensor(xs), torch.tensor(ys), rounding_mode="floor").tolist()
  assert [exec_alu(Ops.MOD, dtypes.int64, [int(x), int(y)]) for x, y in zip(xs, ys)] == \
    torch.remainder(torch.tensor(xs), torch.tensor(ys)).tolist()


def test_exec_alu_division_by_zero_and_wraparound() -> None:
  assert exec_alu(Ops.IDIV, dtypes.int32, [7, 0]) == 0 and exec_alu(Ops.MOD, dtypes.int32, [7, 0]) == 0
  assert exec_alu(Ops.FDIV, dtypes.float32, [1.0, 0.0]) == math.inf
  assert exec_alu(Ops.FDIV, dtypes.float32, [-1.0, 0.0]) == -math.inf
  assert math.isnan(exec_alu(Ops.FDIV, dtypes.float32, [0.0, 0.0]))
  assert exec_alu(Ops.ADD, dtypes.int8, [127, 1]) == -128 and exec_alu(Ops.MUL, dtypes.uint8, [16, 17]) == 16
  assert exec_alu(Ops.MUL, dtypes.int32, [1 << 20, 1 << 12]) == torch.tensor(1 << 20, dtype=torch.int32).mul(1 << 12)


def test_simplified_negative_division_floors() -> None:
  """(n*4 - 1)//4 -> n - 1 and (n*4 - 1)%4 -> 3 for negative n too"""
  assert simple((n * 4 - 1) // 4) == "n-1"
  assert simple((n * 4 - 1) % 4) == "3"
  assert simple((n * 4 + b) // 4) == "n" and simple((n * 4 + b) % 4) == "b"


def test_division_by_non_positive_const_not_folded() -> None:
  """x // c and x % c are only rewritten for c > 0 (c == 0 yields 0, c < 0 flips the remainder's sign)"""
  assert simple((a * 4 + b) // -4) == "(a*4+b)//-4"
  assert simple((a * 4 + b) % -4) == "(a*4+b)%-4"
  assert simple((a * 4 + b) // 0) == "(a*4+b)//0"


# ***** constant_folding *****

def test_fold_int_consts() -> None:
  """op(c1, c2) -> its value: floor division, Python modulo, wraparound at the dtype's width"""
  assert simplify(i32(3) + 4) is i32(7)
  assert simplify(i32(-7) // 2) is i32(-4) and simplify(i32(-7) % 2) is i32(1)
  assert simplify(i32(7) // -2) is i32(-4) and simplify(i32(7) % -2) is i32(-1)
  assert simplify(i32(2**31 - 1) + 1) is i32(-2**31)
  assert simplify(i32(5).maximum(9)) is i32(9) and simplify(-i32(5)) is i32(-5)


def test_fold_float_consts() -> None:
  """op(c1, c2) -> its value rounded to the dtype; inf*0 -> nan"""
  assert simplify(f32(0.1) + f32(0.2)).arg == float(np.float32(0.1) + np.float32(0.2))
  assert simplify(f32(1.0) / 0.0) is f32(math.inf)
  assert math.isnan(simplify(f32(math.inf) * 0.0).arg)
  assert simplify(UOp.const(dtypes.float16, 1000.0) * 100.0) is UOp.const(dtypes.float16, math.inf)


def test_fold_bool_consts() -> None:
  """logic and comparisons of constants -> True/False"""
  assert simplify(TRUE & FALSE) is FALSE and simplify(TRUE | FALSE) is TRUE and simplify(TRUE ^ TRUE) is FALSE
  assert simplify(~FALSE) is TRUE
  assert simplify(i32(3) < 4) is TRUE and simplify(i32(3).ne(3)) is FALSE and simplify(i32(3).eq(3)) is TRUE
  assert simplify(f32(math.nan) < 1.0) is FALSE


def test_fold_cast_of_const() -> None:
  """cast(c) -> c converted: floats truncate toward zero, ints wrap, bools become 0/1"""
  assert simplify(f32(2.7).cast(dtypes.int32)) is i32(2) and simplify(f32(-2.7).cast(dtypes.int32)) is i32(-2)
  assert simplify(i32(300).cast(dtypes.uint8)) is UOp.const(dtypes.uint8, 44)
  assert simplify(i32(-1).cast(dtypes.uint32)) is UOp.const(dtypes.uint32, 2**32 - 1)
  assert simplify(TRUE.cast(dtypes.float32)) is f32(1.0)
  assert simplify(i32(2**24 + 1).cast(dtypes.float32)) is f32(2.0**24)


def test_fold_by_bounds() -> None:
  """an int expression whose bounds pin it to one value -> that value"""
  z = Variable("z", 5, 5)
  assert simplify(z * 2 + 1) is i32(11)
  assert simplify(a * b * 0 + 3) is i32(3)


def test_comparisons_decided_by_bounds() -> None:
  """x < y -> True when x.vmax < y.vmin, False when x.vmin >= y.vmax; likewise != and =="""
  assert simplify(a < 8) is TRUE and simplify(a < 0) is FALSE and simplify(a * b < 22) is TRUE
  assert simplify(a < b + 8) is TRUE and simplify(b + 7 < a) is FALSE
  assert simplify(a.ne(-1)) is TRUE and simplify(a.eq(8)) is FALSE
  assert simple(a < 7) == "a<7" and simple(a * b < 21) == "a*b<21"


# ***** identities *****

def test_add_zero() -> None:
  """x + 0 -> x"""
  assert simplify(a + 0) is a and simplify(0 + a) is a


def test_sub_zero() -> None:
  """x - 0 -> x"""
  assert simplify(a - 0) is a


def test_mul_one() -> None:
  """x * 1 -> x, for ints and (exactly) for floats"""
  assert simplify(a * 1) is a and simplify(1 * a) is a
  assert simplify(ld * 1.0) is ld and simplify(1.0 * ld) is ld


def test_mul_zero_int() -> None:
  """x * 0 -> 0 for ints and bools"""
  assert simplify(a * 0) is i32(0) and simplify(0 * (a + b)) is i32(0)
  assert simplify(p * False) is FALSE


def test_mul_zero_float_not_folded() -> None:
  """x * 0.0 stays for floats: inf*0.0 and nan*0.0 are nan, -1.0*0.0 is -0.0"""
  assert simplify(ld * 0.0) is ld * 0.0
  assert math.isnan(exec_alu(Ops.MUL, dtypes.float32, [math.inf, 0.0]))


def test_add_float_zero_not_folded() -> None:
  """x + 0.0 stays for floats: -0.0 + 0.0 is 0.0"""
  assert simplify(ld + 0.0) is ld + 0.0


def test_idiv_one() -> None:
  """x // 1 -> x"""
  assert simplify(a // 1) is a and simplify(n // 1) is n


def test_mod_one() -> None:
  """x % 1 -> 0"""
  assert simplify(a % 1) is i32(0) and simplify(n % 1) is i32(0)


def test_fdiv_one() -> None:
  """x / 1.0 -> x"""
  assert simplify(ld / 1.0) is ld


def test_where_same_branches() -> None:
  """where(c, x, x) -> x"""
  assert simplify(p.where(a, a)) is a
  assert simplify(p.where(ld, ld)) is ld


def test_where_const_condition() -> None:
  """where(True, x, y) -> x; where(False, x, y) -> y"""
  assert simplify(TRUE.where(a, b)) is a and simplify(FALSE.where(a, b)) is b
  assert simplify(p.where(a, b)) is p.where(a, b)


def test_max_decided_by_bounds() -> None:
  """max(x, y) -> x when x.vmin >= y.vmax (either order)"""
  assert simplify(a.maximum(0)) is a and simplify(i32(0).maximum(a)) is a
  assert simple((b + 7).maximum(a)) == "b+7" and simple(a.maximum(b + 7)) == "b+7"
  assert simple(a.maximum(b)) == "max(a, b)"


# ***** logic *****

def test_and_true() -> None:
  """x & True -> x"""
  assert simplify(p & True) is p and simplify(TRUE & p) is p


def test_and_false() -> None:
  """x & False -> False"""
  assert simplify(p & False) is FALSE and simplify(FALSE & p) is FALSE


def test_or_false() -> None:
  """x | False -> x"""
  assert simplify(p | False) is p and simplify(FALSE | p) is p


def test_or_true() -> None:
  """x | True -> True"""
  assert simplify(p | True) is TRUE and simplify(TRUE | p) is TRUE


def test_and_or_self() -> None:
  """x & x -> x; x | x -> x"""
  assert simplify(p & p) is p and simplify(p | p) is p


def test_xor_false() -> None:
  """x ^ False -> x"""
  assert simplify(p ^ False) is p and simplify(FALSE ^ p) is p


def test_not_not() -> None:
  """not not x -> x (not x is x ^ True)"""
  assert simplify(~~p) is p
  assert simple(~p) == "(a<3)^True"


def test_ne_false() -> None:
  """x != False -> x for a bool x"""
  assert simplify(p.ne(False)) is p


def test_and_or_of_conditions() -> None:
  """(x<3) & (x<8) -> x<3 when bounds make x<8 True; (x<3) | (x<0) -> x<3; (x<3) & (x<0) -> False"""
  assert simple(p & q) == "(a<3)&(b<2)" and simple(p | q) == "(a<3)|(b<2)"
  assert simplify(p & (a < 8)) is p and simplify((a < 0) | p) is p
  assert simplify(p & (a < 0)) is FALSE and simplify(p | (b < 4)) is TRUE


# ***** int_algebra: the canonical sum *****

def test_collect_like_terms() -> None:
  """x*2 + x*3 -> x*5"""
  assert simple(a * 2 + a * 3) == "a*5"
  assert simple(a * 2 + b + a * 3 - b * 3) == "a*5+b*-2"


def test_flatten_sums() -> None:
  """(a+b) + (c+d) -> a+b+c+d, leaves in name order, constants summed last"""
  assert simple((a + b) + (c + n)) == "a+b+c+n"
  assert simple((b + 4) + (a + 3)) == "a+b+7"
  assert simple(a - (b - c)) == "a+b*-1+c"


def test_distribute_const() -> None:
  """(a+b)*4 -> a*4 + b*4; (a+2)*3 -> a*3 + 6"""
  assert simple((a + b) * 4) == "a*4+b*4"
  assert simple(3 * (a + 2)) == "a*3+6"


def test_sub_self() -> None:
  """x - x -> 0"""
  assert simplify(a - a) is i32(0)
  assert simplify((a + b) - (b + a)) is i32(0) and simplify(a * b - a * b) is i32(0)


def test_recombine_div_mod() -> None:
  """(x//c)*c + x%c -> x"""
  assert simplify((c // 4) * 4 + c % 4) is c
  assert simple((c // 4) * 4 + c % 4 + a) == "a+c"
  assert simple(((c + 1) // 4) * 8 + ((c + 1) % 4) * 2) == "c*2+2"


# ***** int_algebra: // and % by constants *****

def test_div_drops_small_remainder() -> None:
  """(a*4 + b) // 4 -> a when 0 <= b < 4"""
  assert simplify((a * 4 + b) // 4) is a
  assert simple((a * 8 + b * 4 + 3) // 4) == "a*2+b"


def test_div_splits_off_multiples() -> None:
  """(a*4 + b + 5) // 4 -> a + (b+1)//4 + 1"""
  assert simple((a * 4 + b + 5) // 4) == "a+(b+1)//4+1"
  assert simple((a * 4 + c) // 4) == "a+c//4"


def test_div_by_bounds() -> None:
  """x // c -> k when bounds put x in [k*c, (k+1)*c)"""
  assert simplify(a // 8) is i32(0) and simplify((b + 4) // 4) is i32(1)
  assert simple(a // 4) == "a//4"


def test_nested_div() -> None:
  """(x // 4) // 3 -> x // 12"""
  assert simple((c // 4) // 3) == "c//12"
  assert simple((n // 2) // 2) == "n//4"


def test_div_gcd() -> None:
  """(a*4 + 2) // 8 -> (a*2 + 1) // 4: a common factor of the terms and the divisor cancels"""
  assert simple((a * 4 + 2) // 8) == "(a*2+1)//4"
  assert simple((a * 6 + c * 4) // 8) == "(a*3+c*2)//4"


def test_div_collects_quotient_term() -> None:
  """((b//3)*6 + b) // 3 -> (b//3)*3: a remainder's quotient that equals a quotient term adds to it"""
  v = Variable("v", 2, 5)
  assert simple(((v // 3) * 6 + v) // 3) == "(v//3)*3"


def test_mod_drops_multiples() -> None:
  """(a*4 + b) % 4 -> b when 0 <= b < 4"""
  assert simplify((a * 4 + b) % 4) is b
  assert simple((a * 4 + b + 5) % 4) == "(b+1)%4"
  assert simple((a * 4 + c) % 4) == "c%4"


def test_mod_by_bounds() -> None:
  """x % c -> x - k*c when bounds put x in [k*c, (k+1)*c)"""
  assert simplify(a % 8) is a and simplify((b + 4) % 4) is b
  assert simple(a % 4) == "a%4"


def test_nested_mod() -> None:
  """(x % 12) % 4 -> x % 4 when 4 divides 12"""
  assert simple((c % 12) % 4) == "c%4"
  assert simple((c % 12) % 5) == "(c%12)%5"


def test_mod_gcd() -> None:
  """(a*4 + 2) % 8 -> ((a*2 + 1) % 4) * 2"""
  assert simple((a * 4 + 2) % 8) == "((a*2+1)%4)*2"
  assert simple((a * 6 + 4) % 4) == "(a%2)*2"


# ***** int_algebra: comparisons with constants *****

def test_lt_moves_constant() -> None:
  """a + 3 < 5 -> a < 2"""
  assert simple(a + 3 < 5) == "a<2"
  assert simple(a + b - 2 < 3) == "a+b<5"


def test_lt_divides_by_gcd() -> None:
  """a*4 + b < 8 -> a < 2 when 0 <= b < 4; a*4 < 7 -> a < 2 (rounding up)"""
  assert simple(a * 4 + b < 8) == "a<2"
  assert simple(a * 4 < 7) == "a<2"
  assert simple(a * 4 + b * 6 < 12) == "a*2+b*3<6"
  assert simple(n * 4 + b < -4) == "n<-1"


def test_lt_keeps_remainder_when_unsafe() -> None:
  """a*4 + b < 7 stays: 7 is not a multiple of 4, so b still matters"""
  assert simple(a * 4 + b < 7) == "a*4+b<7"
  assert simple(a * 4 - b < 8) == "a*4+b*-1<8"

