"""Tests for fusegrad.rewrite: what a UPat matches (op, dtype, arg, consistent names, commutative source lists,
nesting), how a PatternMatcher dispatches and composes, `ctx` passing, and graph_rewrite's fixed point, deep graphs
and memo reuse.
"""
from fusegrad.dtype import dtypes
from fusegrad.rewrite import PatternMatcher, UPat, graph_rewrite
from fusegrad.uop import Ops, UOp, VarArg, Variable

a, b = Variable("a", 0, 7), Variable("b", 0, 3)
x, y, c = UPat.var("x"), UPat.var("y"), UPat.cvar("c")


def i32(v: int) -> UOp: return UOp.const(dtypes.int32, v)
def matches(pat: UPat, u: UOp) -> list[dict[str, UOp]]: return pat.match(u, {})


class Calls:
  """A rewrite function that records the nodes it was called on, then returns `result(**bound)`."""
  def __init__(self, result=lambda **kw: None) -> None:
    self.seen: list[UOp] = []
    self.result = result

  def __call__(self, x: UOp, **kw) -> UOp | None:
    self.seen.append(x)
    return self.result(x=x, **kw)


# ***** UPat *****

def test_match_by_op() -> None:
  assert matches(UPat(Ops.ADD), a + b) == [{}]
  assert matches(UPat(Ops.MUL), a + b) == []
  assert matches(UPat((Ops.ADD, Ops.MUL)), a * b) == [{}]
  assert matches(UPat(), a) == [{}] and matches(UPat(name="u"), a) == [{"u": a}]


def test_match_by_dtype() -> None:
  assert matches(UPat(dtype=dtypes.int32), a) == [{}]
  assert matches(UPat(dtype=dtypes.float32), a) == []
  assert matches(UPat(dtype=(dtypes.int64, dtypes.int32)), a) == [{}]
  assert matches(UPat(Ops.CMPLT, dtype=dtypes.bool), a < 3) == [{}]


def test_match_by_arg() -> None:
  assert matches(UPat.const(3), i32(3)) == [{}] and matches(UPat.const(3), i32(4)) == []
  assert matches(UPat(Ops.DEFINE_VAR, arg=VarArg("a", 0, 7)), a) == [{}]
  assert matches(UPat(Ops.DEFINE_VAR, arg=VarArg("a", 0, 8)), a) == []


def test_const_arg_matches_type_too() -> None:
  """UPat.const(1) is an int 1: it does not match 1.0 or True, which compare equal in Python."""
  assert matches(UPat.const(1), UOp.const(dtypes.float32, 1.0)) == []
  assert matches(UPat.const(1), UOp.const(dtypes.bool, True)) == []
  assert matches(UPat.const(1.0), UOp.const(dtypes.float32, 1.0)) == [{}]


def test_custom_predicate() -> None:
  even = UPat(Ops.CONST, name="k", custom=lambda u: u.arg % 2 == 0)
  assert matches(even, i32(4)) == [{"k": i32(4)}] and matches(even, i32(3)) == []


def test_src_tuple_matches_in_order() -> None:
  pat = UPat(Ops.SUB, src=(x, c))
  assert matches(pat, a - 3) == [{"x": a, "c": i32(3)}]
  assert matches(pat, 3 - a) == []
  assert matches(UPat(Ops.SUB, src=(x,)), a - 3) == []        # source count must agree


def test_src_list_matches_in_any_order() -> None:
  pat = UPat(Ops.ADD, src=[x, c])
  assert matches(pat, a + 3) == [{"x": a, "c": i32(3)}]
  assert matches(pat, 3 + a) == [{"x": a, "c": i32(3)}]
  assert matches(x + c, 3 + a) == [{"x": a, "c": i32(3)}]     # + on UPats of a commutative op builds a list
  assert matches(x - c, 3 - a) == []                          # and of a non-commutative op a tuple


def test_names_bind_consistently() -> None:
  assert matches(x + x, a + a) == [{"x": a}, {"x": a}]        # both orders of the list match
  assert matches(x + x, a + b) == []
  assert matches(UPat(Ops.ADD, src=[x * c, x]), a * 4 + a) == [{"x": a, "c": i32(4)}]
  assert matches(UPat(Ops.ADD, src=[x * c, x]), a * 4 + b) == []
  assert UPat.var("x").match(b, {"x": a}) == [] and UPat.var("x").match(a, {"x": a}) == [{"x": a}]


def test_nested_patterns() -> None:
  pat = (x * c) // UPat.cvar("d")
  assert matches(pat, (a * 4) // 2) == [{"x": a, "c": i32(4), "d": i32(2)}]
  assert matches(pat, (4 * a) // 2) == [{"x": a, "c": i32(4), "d": i32(2)}]
  assert matches(pat, (a + 4) // 2) == [] and matches(pat, (a * 4) // b) == []
  inner = UPat(Ops.XOR, src=[UPat(Ops.XOR, src=[x, UPat.const(True)]), UPat.const(True)])
  assert matches(inner, ~~(a < 3)) == [{"x": a < 3}]


def test_upat_operators_build_alu_patterns() -> None:
  assert (x < c).ops == frozenset({Ops.CMPLT}) and isinstance((x < c).src, tuple)
  assert (x & y).ops == frozenset({Ops.AND}) and isinstance((x & y).src, list)
  assert x.ne(y).ops == frozenset({Ops.CMPNE}) and x.maximum(y).ops == frozenset({Ops.MAX})
  assert (x % 4).src[1].arg == 4 and (x // 4).ops == frozenset({Ops.IDIV})


# ***** PatternMatcher *****

def test_rewrite_dispatches_by_op() -> None:
  on_add, on_mul = Calls(), Calls()
  pm = PatternMatcher([(UPat(Ops.ADD, name="x"), on_add), (UPat(Ops.MUL, name="x"), on_mul)])
  assert pm.rewrite(a + b) is None
  assert on_add.seen == [a + b] and on_mul.seen == []          # the MUL rule is not even tried on an ADD
  assert pm.rewrite(a - b) is None and on_add.seen == [a + b]


def test_wildcard_rule_sees_every_op() -> None:
  any_node = Calls()
  pm = PatternMatcher([(UPat(name="x"), any_node)])
  for u in (a, i32(1), a + b, a < 3, (a < 3).where(a, b)): pm.rewrite(u)
  assert any_node.seen == [a, i32(1), a + b, a < 3, (a < 3).where(a, b)]


def test_first_rule_that_returns_wins() -> None:
  pm = PatternMatcher([
    (UPat(Ops.ADD, name="x"), lambda x: None),                 # None: try the next rule
    (UPat(Ops.ADD, name="x"), lambda x: x),                    # returning the node itself is no rewrite either
    (x + 0, lambda x: x),
    (UPat(Ops.ADD, name="x"), lambda x: i32(99)),
  ])
  assert pm.rewrite(a + 0) is a
  assert pm.rewrite(a + 1) is i32(99)
  assert pm.rewrite(a * 1) is None


def test_compose_with_plus() -> None:
  first = PatternMatcher([(x + 0, lambda x: x)])
  second = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: i32(99)), (x * 1, lambda x: x)])
  both = first + second
  assert both.rules == first.rules + second.rules
  assert both.rewrite(a + 0) is a and both.rewrite(a + 1) is i32(99) and both.rewrite(a * 1) is a
  assert (second + first).rewrite(a + 0) is i32(99)         # order decides which rule is tried first
  assert first.rewrite(a * 1) is None                        # the operands are unchanged


def test_ctx_is_passed_to_functions_that_ask() -> None:
  values = {a: i32(5)}
  pm = PatternMatcher([
    (UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: ctx.get(v)),
    (UPat(Ops.CONST, name="k"), lambda k: None),              # no ctx parameter: called without it
  ])
  assert pm.rewrite(a, ctx=values) is i32(5) and pm.rewrite(b, ctx=values) is None
  assert pm.rewrite(i32(1), ctx=values) is None


# ***** graph_rewrite *****

def reassociate(x: UOp, c1: UOp, c2: UOp) -> UOp:
  """(x + c1) + c2 -> x + (c1 + c2), leaving the inner sum for another rule to fold."""
  return UOp(Ops.ADD, x.dtype, (x, UOp(Ops.ADD, c1.dtype, (c1, c2))))


fold_sums = PatternMatcher([
  (UPat(Ops.ADD, src=(UPat.cvar("c1"), UPat.cvar("c2"))), lambda c1, c2: UOp.const(c1.dtype, c1.arg + c2.arg)),
  (UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(x, UPat.cvar("c1"))), UPat.cvar("c2"))), reassociate),
])


def test_graph_rewrite_reaches_fixed_point() -> None:
  """((a+1)+2)+3 -> a+6: a rewrite's result and its new sources are rewritten again until nothing applies."""
  assert graph_rewrite(((a + 1) + 2) + 3, fold_sums) is a + 6
  assert graph_rewrite((a + 1) * ((b + 2) + 3), fold_sums) is (a + 1) * (b + 5)
  assert graph_rewrite(a * b, fold_sums) is a * b


def test_graph_rewrite_is_bottom_up() -> None:
  order = Calls()
  graph_rewrite((a + b) * (a - b), PatternMatcher([(UPat(name="x"), order)]))
  seen = order.seen
  assert seen[-1] is (a + b) * (a - b) and seen.index(a + b) < len(seen) - 1 and seen.index(a) < seen.index(a + b)


def test_graph_rewrite_passes_ctx() -> None:
  substitute = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: ctx.get(v))])
  assert graph_rewrite(a * 4 + b, substitute, ctx={a: i32(2)}) is i32(2) * 4 + b


def test_graph_rewrite_deep_chain() -> None:
  """5000 nested ADDs rewrite without RecursionError."""
  e = a
  for _ in range(5000): e = e + 1
  assert graph_rewrite(e, fold_sums) is a + 5000
  e = a
  for i in range(5000): e = (e + b) if i % 2 else (e * 1)
  drop_mul_one = PatternMatcher([(x * 1, lambda x: x)])
  expected = a
  for _ in range(2500): expected = expected + b
  assert graph_rewrite(e, drop_mul_one) is expected


def test_graph_rewrite_rewrites_shared_nodes_once() -> None:
  drop = Calls(lambda x, **kw: x.src[0] if x.src[1].op is Ops.CONST and x.src[1].arg == 0 else None)
  pm = PatternMatcher([(UPat(Ops.ADD, name="x"), drop)])
  shared = a + 0
  assert graph_rewrite(shared * shared + shared, pm) is a * a + a
  assert drop.seen.count(shared) == 1


def test_graph_rewrite_memo_reuse() -> None:
  """A memo shared between calls with the same table skips work done before."""
  count = Calls(lambda x, **kw: None)
  pm = PatternMatcher([(UPat(name="x"), count)])
  memo: dict[UOp, UOp] = {}
  e = (a * 4 + b) // 3
  assert graph_rewrite(e, pm, memo=memo) is e
  first = len(count.seen)
  assert first == len(e.toposort())
  assert graph_rewrite(e, pm, memo=memo) is e and len(count.seen) == first
  assert graph_rewrite(e + 1, pm, memo=memo) is e + 1 and len(count.seen) == first + 2   # e+1 and the const 1
  assert memo[e] is e
