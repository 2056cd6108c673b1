"""Tests for fusegrad.uop: hash-consing and immutability of UOp, the operator builders, value bounds for each op,
printing (one-line `render()` and the multi-line graph `pretty`), evaluate, substitute, and symbolic Variables.

A property test checks that `render()` of random int expressions reads back as Python with the value `evaluate` gives.
"""
import itertools
import math
import operator
import pickle

import pytest
from hypothesis import given, settings, strategies as st

from fusegrad.dtype import dtypes
from fusegrad.uop import GroupOp, Ops, SpecialArg, UOp, Variable, pretty

a, b, c, n = Variable("a", 0, 7), Variable("b", 0, 3), Variable("c", 0, 100), Variable("n", -8, 8)
buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(), (), 0)
gidx = UOp(Ops.SPECIAL, dtypes.int32, (), SpecialArg("gidx0", 0, 16))


def i32(v: int) -> UOp: return UOp.const(dtypes.int32, v)
def f32(v: float) -> UOp: return UOp.const(dtypes.float32, v)
def loop(name: str, start: int, end: int) -> UOp: return UOp(Ops.LOOP, dtypes.int32, (i32(start), i32(end)), name)


# ***** hash-consing and immutability *****

def test_same_structure_is_same_object() -> None:
  assert a * 4 + b is a * 4 + b
  assert UOp(Ops.ADD, dtypes.int32, (a, i32(1))) is a + 1
  assert Variable("a", 0, 7) is a and Variable("a", 0, 8) is not a
  assert UOp.const(dtypes.float32, 1.5) is f32(1.5)


def test_consts_distinct_by_value_sign_and_dtype() -> None:
  assert f32(-0.0) is not f32(0.0) and math.copysign(1.0, f32(-0.0).arg) == -1.0
  assert f32(math.nan) is f32(math.nan)
  assert i32(1) is not UOp.const(dtypes.int64, 1) and i32(1) is not f32(1.0)
  assert UOp.const(dtypes.bool, True) is not i32(1)
  assert a + 1 is not UOp(Ops.ADD, dtypes.int64, (a, i32(1)))


def test_const_truncates_to_dtype() -> None:
  assert i32(2**31).arg == -2**31 and UOp.const(dtypes.uint8, 300).arg == 44
  assert f32(0.1).arg == 0.10000000149011612 and UOp.const(dtypes.bool, 2).arg is True


def test_uop_is_immutable() -> None:
  u = a + b
  with pytest.raises(AttributeError, match="immutable"): u.op = Ops.SUB
  with pytest.raises(AttributeError, match="immutable"): u.arg = 3
  with pytest.raises(AttributeError, match="immutable"): del u.src
  assert u.op is Ops.ADD and u.src == (a, b)
  assert u.replace(op=Ops.SUB) is a - b and u.op is Ops.ADD


def test_uop_has_no_truth_value() -> None:
  with pytest.raises(TypeError, match="no truth value.*a<3"): bool(a < 3)


def test_pickle_round_trip_keeps_identity() -> None:
  e = (a * 4 + b) // 3
  assert pickle.loads(pickle.dumps(e)) is e
  st = UOp(Ops.STORE, dtypes.void, (buf, gidx, f32(1.0)))
  assert pickle.loads(pickle.dumps(st)) is st


def test_group_op_sets() -> None:
  assert GroupOp.ALU == GroupOp.Unary | GroupOp.Binary | GroupOp.Ternary
  assert GroupOp.Comparison <= GroupOp.Binary and GroupOp.Commutative <= GroupOp.Binary
  assert Ops.SUB not in GroupOp.Commutative and Ops.IDIV not in GroupOp.Commutative
  assert not GroupOp.Unary & GroupOp.Binary and Ops.WHERE in GroupOp.Ternary


# ***** operator builders *****

@pytest.mark.parametrize("build, op, srcs", [
  (lambda: a + 1, Ops.ADD, lambda: (a, i32(1))), (lambda: 1 + a, Ops.ADD, lambda: (i32(1), a)),
  (lambda: a - b, Ops.SUB, lambda: (a, b)), (lambda: 1 - a, Ops.SUB, lambda: (i32(1), a)),
  (lambda: a * 2, Ops.MUL, lambda: (a, i32(2))), (lambda: 2 * a, Ops.MUL, lambda: (i32(2), a)),
  (lambda: a // 2, Ops.IDIV, lambda: (a, i32(2))), (lambda: 7 // a, Ops.IDIV, lambda: (i32(7), a)),
  (lambda: a % 2, Ops.MOD, lambda: (a, i32(2))), (lambda: 7 % a, Ops.MOD, lambda: (i32(7), a)),
  (lambda: -a, Ops.NEG, lambda: (a,)), (lambda: a.maximum(b), Ops.MAX, lambda: (a, b)),
  (lambda: a ^ 3, Ops.XOR, lambda: (a, i32(3))), (lambda: ~a, Ops.XOR, lambda: (a, i32(-1))),
])
def test_int_operators(build, op, srcs) -> None:
  u = build()
  assert u.op is op and u.dtype is dtypes.int32 and u.src == srcs()


def test_comparison_and_logic_operators() -> None:
  assert (a < 3).op is Ops.CMPLT and (a < 3).dtype is dtypes.bool and (a < 3).src == (a, i32(3))
  assert (a > 3) is (i32(3) < a) and (3 < a) is (i32(3) < a)
  assert a.eq(b).op is Ops.CMPEQ and a.ne(b).op is Ops.CMPNE and a.ne(b).dtype is dtypes.bool
  p, q = a < 3, b < 2
  assert (p & q).op is Ops.AND and (p | q).op is Ops.OR and (p & q).dtype is dtypes.bool
  assert (p & True).src[1] is UOp.const(dtypes.bool, True) and (True & p).src[0] is UOp.const(dtypes.bool, True)
  assert ~p is p ^ True


def test_float_operators_and_consts() -> None:
  x = UOp(Ops.LOAD, dtypes.float32, (buf, gidx))
  assert (x * 2).dtype is dtypes.float32 and (x * 2).src[1] is f32(2.0)
  assert (x / 2).op is Ops.FDIV and (1.0 / x).src[0] is f32(1.0)
  assert (x < 0.5).dtype is dtypes.bool


def test_minimum_where_cast() -> None:
  assert a.minimum(b) is -((-a).maximum(-b))
  w = (a < 3).where(a, b)
  assert w.op is Ops.WHERE and w.dtype is dtypes.int32 and w.src == (a < 3, a, b)
  assert a.cast(dtypes.int32) is a and a.cast(dtypes.float32).op is Ops.CAST
  assert a.cast(dtypes.float32).dtype is dtypes.float32


def test_where_with_python_numbers() -> None:
  """A number takes the other branch's dtype; two numbers make an index WHERE (float32 if either is a float)."""
  assert (a < 3).where(a, 5).src == (a < 3, a, i32(5)) and (a < 3).where(a, 5).dtype is dtypes.int32
  assert (a < 3).where(5, a).src == (a < 3, i32(5), a)
  assert (a < 3).where(1, 2).dtype is dtypes.int32
  assert (a < 3).where(1.5, 2).src == (a < 3, f32(1.5), f32(2.0))
  assert (a < 3).where(1, 2).evaluate({"a": 5}) == 2 and (a < 3).where(1.5, 2.5).evaluate({"a": 0}) == 1.5


# ***** value bounds *****

def bounds(u: UOp) -> tuple: return u.vmin, u.vmax


def test_bounds_of_leaves() -> None:
  assert bounds(i32(5)) == (5, 5) and bounds(f32(1.5)) == (1.5, 1.5) and bounds(n) == (-8, 8)
  assert bounds(a.bind(3)) == (0, 7)                 # a bound variable still stands for its whole range
  assert bounds(gidx) == (0, 15) and bounds(loop("ridx0", 2, 10)) == (2, 9)
  assert bounds(UOp(Ops.LOAD, dtypes.float32, (buf, gidx))) == (-math.inf, math.inf)
  assert bounds(UOp(Ops.LOAD, dtypes.uint8, (buf, gidx))) == (0, 255)


def test_bounds_of_arithmetic() -> None:
  assert bounds(a + b) == (0, 10) and bounds(a - b) == (-3, 7) and bounds(-n) == (-8, 8) and bounds(-a) == (-7, 0)
  assert bounds(n * a) == (-56, 56) and bounds(n * -2) == (-16, 16) and bounds(a * b) == (0, 21)
  assert bounds(a.maximum(b)) == (0, 7) and bounds((a + 5).maximum(b)) == (5, 12)


def test_bounds_of_div_and_mod() -> None:
  assert bounds(a // 2) == (0, 3) and bounds(n // 3) == (-3, 2) and bounds(c // (b + 1)) == (0, 100)
  assert bounds(n % 3) == (0, 2) and bounds(a % 8) == (0, 7) and bounds((a + 8) % 4) == (0, 3)
  assert bounds((b + 9) % 4) == (0, 3) and bounds((b + 8) % 12) == (8, 11) and bounds((b + 4) % 4) == (0, 3)
  assert bounds(c % (b + 1)) == (0, 3)
  assert bounds(a // b) == (dtypes.min(dtypes.int32), dtypes.max(dtypes.int32))   # b may be 0


def test_bounds_of_comparisons_and_logic() -> None:
  assert bounds(a < 3) == (False, True) and bounds(a < 8) == (True, True) and bounds(a < 0) == (False, False)
  assert bounds(a.ne(9)) == (True, True) and bounds(a.eq(9)) == (False, False) and bounds(i32(3).eq(3)) == (True, True)
  assert bounds(a.eq(b)) == (False, True)
  assert bounds((a < 3) & (b < 8)) == (False, True) and bounds((a < 3) | (b < 8)) == (True, True)
  assert bounds((a < 8) ^ (b < 8)) == (False, False) and bounds((a < 3) ^ (b < 8)) == (False, True)


def test_bounds_of_where_and_cast() -> None:
  assert bounds((a < 3).where(a, b + 10)) == (0, 13)
  assert bounds(UOp.const(dtypes.bool, True).where(a, b + 10)) == (0, 7)
  assert bounds(a.cast(dtypes.int8)) == (0, 7) and bounds(n.cast(dtypes.uint8)) == (0, 255)
  assert bounds((a < 3).cast(dtypes.int32)) == (0, 1)
  assert bounds(a.cast(dtypes.float32)) == (-math.inf, math.inf)
  assert bounds(a.alu(Ops.SHL, 1)) == (dtypes.min(dtypes.int32), dtypes.max(dtypes.int32))


# ***** printing *****

def test_render_forms() -> None:
  assert (a * 4 + b).render() == "a*4+b"
  assert ((a < 3) & (b < 2)).render() == "(a<3)&(b<2)"
  assert ((a // 4) % 3).render() == "(a//4)%3"
  assert (a - (b - c)).render() == "a-(b-c)" and ((a - b) - c).render() == "a-b-c"
  assert (a * (b + c)).render() == "a*(b+c)" and (a // (b * c)).render() == "a//(b*c)"
  assert ((a // 2) // 3).render() == "(a//2)//3" and (a + -3).render() == "a-3"
  assert (-(a + b)).render() == "-(a+b)" and a.maximum(b).render() == "max(a, b)"
  assert ((a < 3).where(a, b)).render() == "(a<3 ? a : b)" and a.cast(dtypes.float32).render() == "(float32)a"
  assert (gidx * 4 + loop("ridx0", 0, 4)).render() == "gidx0*4+ridx0" and a.bind(3).render() == "a=3"


def test_render_keeps_floor_division_of_negatives() -> None:
  """a + (-b)//2 is not a - b//2: the minus only folds into + when the term is a product."""
  assert (a + (-b) // 2).render() == "a+-b//2" and (a + (-b) % 3).render() == "a+-b%3"
  assert (a + (-b) * 3).render() == "a-b*3" and (a + -b).render() == "a-b"
  assert ((a < b) < c).render() == "(a<b)<c"


def test_render_non_scalar() -> None:
  assert UOp.const(dtypes.float4, (1.0, 2.0, 3.0, 4.0)).render() == "float4((1.0, 2.0, 3.0, 4.0))"
  assert UOp(Ops.STORE, dtypes.void, (buf, gidx, f32(1.0))).render() == "<STORE>"


def test_repr_of_scalar_expression_is_one_line() -> None:
  assert repr(a * 4 + b) == "UOp(a*4+b)"


def test_pretty_prints_graph_one_node_per_line() -> None:
  x = UOp(Ops.LOAD, dtypes.float32, (buf, gidx))
  store = UOp(Ops.STORE, dtypes.void, (buf, gidx, x * 2.0))
  lines = repr(store).splitlines()
  assert len(lines) == 6 and repr(store) == pretty(store)
  assert lines[0].split() == ["%0", "=", "DEFINE_GLOBAL", "float32_ptr", "[]", "0"]
  assert lines[2].split()[:5] == ["%2", "=", "LOAD", "float32", "[%0,"]
  assert lines[-1].split()[:4] == ["%5", "=", "STORE", "void"] and "[%0, %1, %4]" in lines[-1]


def test_pretty_prints_large_scalar_graph_as_lines() -> None:
  big = a
  for i in range(50): big = big * 3 + i
  assert len(pretty(big).splitlines()) == len(big.toposort())


VARS = (Variable("x", -2, 2), Variable("y", 0, 3))
BINARY = (operator.add, operator.sub, operator.mul, UOp.maximum)


@st.composite
def int_exprs(draw, depth: int = 3) -> UOp:
  """Unsimplified int expressions over x, y and small constants, with // and % by nonzero constants of either sign."""
  kind = draw(st.sampled_from(("leaf",) if depth == 0 else ("leaf", "binary", "divmod", "neg")))
  if kind == "leaf": return draw(st.sampled_from(VARS) | st.integers(-5, 5).map(i32))
  x = draw(int_exprs(depth - 1))
  if kind == "binary": return draw(st.sampled_from(BINARY))(x, draw(int_exprs(depth - 1)))
  if kind == "divmod":
    return draw(st.sampled_from((operator.floordiv, operator.mod)))(x, draw(st.integers(-4, 4).filter(bool)))
  return -x


@settings(max_examples=500, deadline=None)
@given(int_exprs(), st.booleans())
def test_render_reads_back_as_python(e: UOp, compare: bool) -> None:
  if compare: e = e < VARS[1] + 1
  printed = compile(e.render(), "<render>", "eval")
  for x, y in itertools.product(range(-2, 3), range(0, 4)):
    assert eval(printed, {"max": max}, {"x": x, "y": y}) == e.evaluate({"x": x, "y": y}), e.render()


# ***** evaluate, substitute, toposort *****

def test_evaluate() -> None:
  assert (a * 4 + b).evaluate({"a": 2, "b": 3}) == 11
  assert ((n // 3) * 3 + n % 3).evaluate({"n": -7}) == -7 and (n // 3).evaluate({"n": -7}) == -3
  assert ((a < 3) & (b < 2)).evaluate({"a": 1, "b": 1}) is True
  assert (gidx * 4 + loop("ridx0", 0, 4)).evaluate({"gidx0": 3, "ridx0": 2}) == 14
  assert (a * 100).cast(dtypes.int8).evaluate({"a": 2}) == -56
  assert (a.cast(dtypes.float32) / 2).evaluate({"a": 7}) == 3.5
  assert i32(5).evaluate() == 5


def test_evaluate_bound_variable() -> None:
  assert a.bind(3).evaluate() == 3 and (a.bind(3) * 4 + b).evaluate({"b": 1}) == 13


def test_evaluate_errors() -> None:
  with pytest.raises(KeyError, match="no value given for b"): (a + b).evaluate({"a": 1})
  with pytest.raises(TypeError, match="can't evaluate Ops.DEFINE_GLOBAL"):
    UOp(Ops.LOAD, dtypes.float32, (buf, gidx)).evaluate()


def test_substitute() -> None:
  e = a * 4 + b
  assert e.substitute({a: i32(2)}) is i32(2) * 4 + b         # no simplification
  assert e.substitute({a: i32(2)}).render() == "2*4+b"
  assert e.substitute({a * 4: c}) is c + b and e.substitute({b: b}) is e and e.substitute({}) is e
  assert e.substitute({a: b, b: a}) is b * 4 + a


def test_toposort_and_vars() -> None:
  e = (a * 4 + b) * (a * 4 + b)
  order = e.toposort()
  assert order[-1] is e and len(order) == len(set(order)) == 6
  assert all(order.index(s) < order.index(u) for u in order for s in u.src)
  assert e.vars() == {a, b} and (a.bind(3) + b).vars() == {a, b} and i32(1).vars() == set()


def test_deep_chain_needs_no_recursion() -> None:
  e = a
  for i in range(5000): e = e + b if i % 2 else e - 1
  assert len(e.toposort()) == 5003
  assert e.vmin == -2500 and e.vmax == 7 + 2500 * 3 - 2500
  assert e.evaluate({"a": 1, "b": 2}) == 1 + 2500 * 2 - 2500
  assert e.substitute({b: i32(1)}).evaluate({"a": 0}) == 0


# ***** Variables *****

def test_variable() -> None:
  assert a.op is Ops.DEFINE_VAR and a.dtype is dtypes.index and (a.arg.name, a.arg.min, a.arg.max) == ("a", 0, 7)
  assert a.expr == "a" and a.bind(3).expr == "a"
  assert Variable("i", 0, 10, dtypes.int64).dtype is dtypes.int64


def test_variable_validation() -> None:
  with pytest.raises(ValueError, match="'v'.*min <= max.*\\[3, 2\\]"): Variable("v", 3, 2)
  with pytest.raises(ValueError, match="int bounds"): Variable("v", 0, 2.5)
  with pytest.raises(ValueError, match="int bounds"): Variable("v", 0.0, 2)
  with pytest.raises(TypeError, match="not a variable"): (a + 1).expr


def test_bind_and_unbind() -> None:
  bound = a.bind(3)
  assert bound.op is Ops.BIND and bound.src == (a, i32(3)) and bound is a.bind(3)
  assert bound.unbind() == (a, 3)
  assert a.bind(0).unbind() == (a, 0) and a.bind(7).unbind() == (a, 7)


def test_bind_errors() -> None:
  with pytest.raises(ValueError, match="a=8 is outside its range \\[0, 7\\]"): a.bind(8)
  with pytest.raises(ValueError, match="a=-1 is outside"): a.bind(-1)
  with pytest.raises(TypeError, match="only a Variable can be bound"): (a + 1).bind(3)
  with pytest.raises(TypeError, match="not a bound variable"): a.unbind()
