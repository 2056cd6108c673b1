"""Simplification of UOp expressions: the rewrite tables that keep index arithmetic small.

Ints are kept in a canonical sum-of-terms form (`a*4+b+3`): sums are flattened and like terms collected; `//` and `%`
by constants are folded using value bounds (`(a*4+b)//4 -> a` when 0 <= b < 4); comparisons and anything else whose
bounds pin it to one value become constants. Division is floor division and `%` takes the divisor's sign (Python's
and torch's semantics); the renderers emit cheaper C division where bounds prove operands non-negative.
"""
from __future__ import annotations
import math
from fusegrad.dtype import dtypes
from fusegrad.uop import UOp, Ops, GroupOp, exec_alu, render_expr
from fusegrad.rewrite import UPat, PatternMatcher, graph_rewrite


def _is_int(u: UOp) -> bool: return u.dtype.count == 1 and dtypes.is_int(u.dtype)


# ***** the canonical sum form *****

def split_terms(u: UOp) -> tuple[dict[UOp, int], int]:
  """Write an int expression as {term: coefficient} + constant, looking through +, -, negation and * by constants."""
  terms: dict[UOp, int] = {}
  const = 0
  stack: list[tuple[UOp, int]] = [(u, 1)]
  while stack:
    node, k = stack.pop()
    if node.op is Ops.CONST: const += k * node.arg
    # push right before left, so terms come out left to right: with a stable sort, rebuilding a canonical sum
    # gives the same node back even when two terms print alike (two LOADs), and the rewrite reaches a fixed point
    elif node.op is Ops.ADD: stack.extend([(node.src[1], k), (node.src[0], k)])
    elif node.op is Ops.SUB: stack.extend([(node.src[1], -k), (node.src[0], k)])
    elif node.op is Ops.NEG: stack.append((node.src[0], -k))
    elif node.op is Ops.MUL and node.src[1].op is Ops.CONST: stack.append((node.src[0], k * node.src[1].arg))
    elif node.op is Ops.MUL and node.src[0].op is Ops.CONST: stack.append((node.src[1], k * node.src[0].arg))
    else: terms[node] = terms.get(node, 0) + k
  return {t: k for t, k in terms.items() if k != 0}, const


def _recombine_divmod(terms: dict[UOp, int]) -> dict[UOp, int]:
  """(x//c)*c*k + (x%c)*k -> x*k, the identity that undoes an index split."""
  changed = True
  while changed:
    changed = False
    for m, k in list(terms.items()):
      if m.op is not Ops.MOD or m.src[1].op is not Ops.CONST or m not in terms: continue
      d = UOp(Ops.IDIV, m.dtype, m.src)
      if terms.get(d) == k * m.src[1].arg:
        del terms[m], terms[d]
        inner, inner_const = split_terms(m.src[0])
        for t, kk in inner.items(): terms[t] = terms.get(t, 0) + kk * k
        if inner_const: terms[m.src[0].const_like(1)] = terms.get(m.src[0].const_like(1), 0) + inner_const * k
        changed = True
        break
  return {t: k for t, k in terms.items() if k != 0}


_LEAVES = (Ops.DEFINE_VAR, Ops.SPECIAL, Ops.LOOP)


def _term_order(t: UOp) -> tuple[bool, str]: return (t.op not in _LEAVES, render_expr(t))


def build_sum(terms: dict[UOp, int], const: int, like: UOp) -> UOp:
  """The canonical form of sum(term*coefficient) + const: terms ordered by their printed form, constant last."""
  ones = [t for t in terms if t.op is Ops.CONST]
  for t in ones: const += terms.pop(t) * t.arg
  ret: UOp | None = None
  for t in sorted(terms, key=_term_order):
    k = terms[t]
    x = t if k == 1 else UOp(Ops.MUL, t.dtype, (t, t.const_like(k)))
    ret = x if ret is None else UOp(Ops.ADD, like.dtype, (ret, x))
  if ret is None: return like.const_like(const)
  return ret if const == 0 else UOp(Ops.ADD, like.dtype, (ret, like.const_like(const)))


def canonical_sum(x: UOp) -> UOp | None:
  """Flatten sums and collect like terms: x*2 + x*3 -> x*5, (a+b)*4 -> a*4+b*4."""
  if not _is_int(x): return None
  terms, const = split_terms(x)
  return build_sum(_recombine_divmod(terms), const, x)


# ***** division and modulo by constants *****

def fold_div(x: UOp, c: UOp) -> UOp | None:
  """(q*c + r) // c -> q + r//c, and r//c -> a constant when bounds put r in one multiple of c."""
  if not _is_int(x) or c.arg <= 0: return None
  if c.arg == 1: return x
  if x.op is Ops.IDIV and x.src[1].op is Ops.CONST and x.src[1].arg > 0:
    return UOp(Ops.IDIV, x.dtype, (x.src[0], c.const_like(x.src[1].arg * c.arg)))
  terms, const = split_terms(x)
  quot = {t: k // c.arg for t, k in terms.items() if k % c.arg == 0}
  rest = {t: k for t, k in terms.items() if k % c.arg != 0}
  qconst, rconst = divmod(const, c.arg)
  rem = build_sum(dict(rest), rconst, x)
  if rem.vmin // c.arg == rem.vmax // c.arg: return build_sum(quot, qconst + rem.vmin // c.arg, x)
  g = math.gcd(c.arg, rconst, *rest.values())
  if g > 1: rem_div = UOp(Ops.IDIV, x.dtype, (build_sum({t: k // g for t, k in rest.items()}, rconst // g, x),
                                                c.const_like(c.arg // g)))
  else: rem_div = UOp(Ops.IDIV, x.dtype, (rem, c))
  if not quot and qconst == 0: return rem_div
  # rem//c may already be a quotient term: ((b//3)*6 + b)//3 -> (b//3)*2 + b//3 = (b//3)*3
  return build_sum({**quot, rem_div: quot.get(rem_div, 0) + 1}, qconst, x)


def fold_mod(x: UOp, c: UOp) -> UOp | None:
  """(q*c + r) % c -> r % c, and r % c -> r - k*c when bounds put r in one multiple of c."""
  if not _is_int(x) or c.arg <= 0: return None
  if c.arg == 1: return x.const_like(0)
  if x.op is Ops.MOD and x.src[1].op is Ops.CONST and x.src[1].arg > 0 and x.src[1].arg % c.arg == 0:
    return UOp(Ops.MOD, x.dtype, (x.src[0], c))
  terms, const = split_terms(x)
  # first with the signed coefficients: (3 - a) % 4 with 0 <= a <= 3 is 3 - a
  signed = {t: k for t, k in terms.items() if k % c.arg != 0}
  signed_rem = build_sum(dict(signed), const % c.arg, x)
  if signed_rem.vmin // c.arg == signed_rem.vmax // c.arg:
    return build_sum(signed, const % c.arg - (signed_rem.vmin // c.arg) * c.arg, x)
  rest = {t: k % c.arg for t, k in terms.items() if k % c.arg != 0}
  rem = build_sum(dict(rest), const % c.arg, x)
  if rem.vmin // c.arg == rem.vmax // c.arg: return build_sum(rest, const % c.arg - (rem.vmin // c.arg) * c.arg, x)
  g = math.gcd(c.arg, const % c.arg, *rest.values())
  if g > 1:
    inner = build_sum({t: k // g for t, k in rest.items()}, (const % c.arg) // g, x)
    return UOp(Ops.MUL, x.dtype, (UOp(Ops.MOD, x.dtype, (inner, c.const_like(c.arg // g))), c.const_like(g)))
  return UOp(Ops.MOD, x.dtype, (rem, c))


# ***** comparisons *****

def fold_lt(x: UOp, c: UOp) -> UOp | None:
  """sum + k < d -> sum < d-k; g*s + r < d -> s < d/g when g divides d and 0 <= r < g (r may be empty)."""
  if not _is_int(x): return None
  terms, const = split_terms(x)
  if not terms: return None
  d = c.arg - const
  big = [k for k in terms.values() if abs(k) > 1]
  g = math.gcd(*big) if big else 1
  small = {t: k for t, k in terms.items() if k % g != 0}
  if g > 1:
    small_sum = build_sum(dict(small), 0, x)
    if not small: return UOp(Ops.CMPLT, dtypes.bool, (build_sum({t: k // g for t, k in terms.items()}, 0, x),
                                                      c.const_like(-(-d // g))))
    if small_sum.vmin >= 0 and small_sum.vmax < g and d % g == 0:
      big_terms = {t: k // g for t, k in terms.items() if k % g == 0}
      return UOp(Ops.CMPLT, dtypes.bool, (build_sum(big_terms, 0, x), c.const_like(d // g)))
  if const != 0: return UOp(Ops.CMPLT, dtypes.bool, (build_sum(terms, 0, x), c.const_like(d)))
  return None


# ***** the tables *****

def fold_consts(x: UOp) -> UOp | None:
  """An ALU op over constants is a constant."""
  if x.dtype.count != 1 or not all(s.op is Ops.CONST for s in x.src): return None
  return UOp.const(x.dtype, exec_alu(x.op, x.dtype, [s.arg for s in x.src]))


def fold_by_bounds(x: UOp) -> UOp | None:
  """An int or bool expression whose bounds pin it to one value is that constant."""
  if x.dtype.count != 1 or not (dtypes.is_int(x.dtype) or x.dtype is dtypes.bool): return None
  return UOp.const(x.dtype, x.vmin) if x.vmin == x.vmax else None


x, y, c = UPat.var("x"), UPat.var("y"), UPat.cvar("c")
ints = tuple(d for d in (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16,
                         dtypes.uint32, dtypes.uint64))

constant_folding = PatternMatcher([
  (UPat(GroupOp.ALU, name="x"), fold_consts),
  (UPat(Ops.CAST, src=(UPat.cvar("c"),), name="x"), lambda x, c: UOp.const(x.dtype, c.arg) if x.dtype.count == 1
   else None),
  (UPat(GroupOp.ALU, name="x"), fold_by_bounds),
])

identities = PatternMatcher([
  (x + 0, lambda x: x),                      # x + 0 -> x
  (x - 0, lambda x: x),                      # x - 0 -> x
  (x * 1, lambda x: x),                      # x * 1 -> x
  (UPat(Ops.MUL, src=[x, UPat.const(1.0)]), lambda x: x),  # x * 1.0 -> x: exact for floats, unlike x + 0.0
  (UPat(Ops.MUL, dtype=ints + (dtypes.bool,), src=[x, UPat.const(0)]), lambda x: x.const_like(0)),  # x*0 -> 0
  (UPat(Ops.MUL, dtype=ints + (dtypes.bool,), src=[x, UPat.const(False)]), lambda x: x.const_like(0)),
  (x // 1, lambda x: x),                     # x // 1 -> x
  (x % 1, lambda x: x.const_like(0)),        # x % 1 -> 0
  (UPat(Ops.FDIV, src=(x, UPat.const(1.0))), lambda x: x),  # x / 1.0 -> x
  (UPat(Ops.WHERE, src=(UPat.var(), x, x)), lambda x: x),   # where(c, x, x) -> x
  (UPat(Ops.WHERE, src=(UPat.cvar("c"), x, y)), lambda c, x, y: x if c.arg else y),
  (UPat(Ops.MAX, src=[x, y]), lambda x, y: x if _is_int(x) and x.vmin >= y.vmax else None),
])

logic = PatternMatcher([
  (UPat(Ops.AND, dtype=dtypes.bool, src=[x, UPat.const(True)]), lambda x: x),         # x & True -> x
  (UPat(Ops.AND, dtype=dtypes.bool, src=[x, UPat.const(False)]), lambda x: x.const_like(False)),
  (UPat(Ops.OR, dtype=dtypes.bool, src=[x, UPat.const(False)]), lambda x: x),         # x | False -> x
  (UPat(Ops.OR, dtype=dtypes.bool, src=[x, UPat.const(True)]), lambda x: x.const_like(True)),
  (UPat((Ops.AND, Ops.OR), dtype=dtypes.bool, src=(x, x)), lambda x: x),              # x & x -> x, x | x -> x
  (UPat(Ops.XOR, dtype=dtypes.bool, src=[x, UPat.const(False)]), lambda x: x),        # x ^ False -> x
  (UPat(Ops.XOR, dtype=dtypes.bool, src=[UPat(Ops.XOR, src=[x, UPat.const(True)]), UPat.const(True)]),
   lambda x: x),                                                                      # not not x -> x
  (UPat(Ops.CMPNE, dtype=dtypes.bool, src=[x, UPat.const(False)]), lambda x: x if x.dtype is dtypes.bool else None),
])

def order_product(x: UOp, y: UOp) -> UOp | None:
  """a*b and b*a are one node: operands of an int product of two non-constants in printed order."""
  if not _is_int(x) or x.op is Ops.CONST or y.op is Ops.CONST: return None
  return UOp(Ops.MUL, x.dtype, (y, x)) if _term_order(y) < _term_order(x) else None


int_algebra = PatternMatcher([
  (UPat(Ops.MUL, src=(x, y)), order_product),
  (UPat((Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG), name="x"), canonical_sum),
  (UPat(Ops.IDIV, src=(x, c)), fold_div),
  (UPat(Ops.MOD, src=(x, c)), fold_mod),
  (UPat(Ops.CMPLT, src=(x, c)), fold_lt),
])

symbolic = constant_folding + identities + logic + int_algebra

_MEMO: dict[UOp, UOp] = {}


def simplify(u: UOp) -> UOp:
  """Simplify an expression with the `symbolic` table. Results are remembered across calls."""
  if len(_MEMO) > 1 << 18: _MEMO.clear()
  return graph_rewrite(u, symbolic, memo=_MEMO)
