"""Pattern matching and graph rewriting over UOps.

A pass is a `PatternMatcher`: a table of (UPat, function) pairs. A UPat matches a node by op, dtype, arg and sources,
binding names; the function gets the bound nodes as keyword arguments and returns a replacement or None. Tables
compose with `+`. `graph_rewrite` applies a table bottom-up until nothing changes, memoized within the call.
Operators on UPats build ALU patterns, so rules read like math: `(x * c1) * c2` -> `x * (c1 * c2)`.
"""
from __future__ import annotations
import inspect
import itertools
from typing import Any, Callable, Iterable
from fusegrad.dtype import DType
from fusegrad.uop import UOp, Ops, GroupOp

_ANY = object()


class UPat:
  """A pattern over UOps. `src` as a tuple matches in order, as a list in any order; `name` binds the match."""
  __slots__ = ("ops", "dtypes", "src", "arg", "name", "custom")

  def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
               src: tuple[UPat, ...] | list[UPat] | None = None, arg: Any = _ANY, name: str | None = None,
               custom: Callable[[UOp], bool] | None = None):
    self.ops = None if op is None else frozenset([op]) if isinstance(op, Ops) else frozenset(op)
    self.dtypes = None if dtype is None else frozenset([dtype]) if isinstance(dtype, DType) else frozenset(dtype)
    self.src = src
    self.arg = arg
    self.name = name
    self.custom = custom

  @staticmethod
  def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
    return UPat(dtype=dtype, name=name)

  @staticmethod
  def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
    return UPat(Ops.CONST, dtype=dtype, name=name)

  @staticmethod
  def const(value: Any, dtype: DType | Iterable[DType] | None = None) -> UPat:
    return UPat(Ops.CONST, dtype=dtype, arg=value)

  def _alu(self, op: Ops, other: UPat | Any) -> UPat:
    other = other if isinstance(other, UPat) else UPat.const(other)
    srcs = [self, other] if op in GroupOp.Commutative else (self, other)
    return UPat(op, src=srcs)

  def __add__(self, x): return self._alu(Ops.ADD, x)
  def __mul__(self, x): return self._alu(Ops.MUL, x)
  def __sub__(self, x): return self._alu(Ops.SUB, x)
  def __floordiv__(self, x): return self._alu(Ops.IDIV, x)
  def __mod__(self, x): return self._alu(Ops.MOD, x)
  def __lt__(self, x): return self._alu(Ops.CMPLT, x)
  def __and__(self, x): return self._alu(Ops.AND, x)
  def __or__(self, x): return self._alu(Ops.OR, x)
  def ne(self, x): return self._alu(Ops.CMPNE, x)
  def maximum(self, x): return self._alu(Ops.MAX, x)

  def __repr__(self) -> str:
    ops = "/".join(sorted(o.name for o in self.ops)) if self.ops else "any"
    return f"UPat({ops}{' ' + self.name if self.name else ''}{' src=' + repr(self.src) if self.src else ''})"

  def match(self, uop: UOp, bound: dict[str, UOp]) -> list[dict[str, UOp]]:
    """All ways this pattern matches `uop` consistently with names already in `bound`."""
    if self.ops is not None and uop.op not in self.ops: return []
    if self.dtypes is not None and uop.dtype not in self.dtypes: return []
    if self.arg is not _ANY and not (uop.arg == self.arg and type(uop.arg) is type(self.arg)): return []
    if self.custom is not None and not self.custom(uop): return []
    if self.name is not None:
      if self.name in bound:
        if bound[self.name] is not uop: return []
      else:
        bound = {**bound, self.name: uop}
    if self.src is None: return [bound]
    if len(self.src) != len(uop.src): return []
    orders = itertools.permutations(self.src) if isinstance(self.src, list) else [self.src]
    results: list[dict[str, UOp]] = []
    for order in orders:
      partial = [bound]
      for pat, child in zip(order, uop.src):
        partial = [b2 for b in partial for b2 in pat.match(child, b)]
        if not partial: break
      results.extend(partial)
    return results


class PatternMatcher:
  """A rewrite table. Functions receive the bound names as keyword arguments (and `ctx` if they ask for it)."""

  def __init__(self, rules: list[tuple[UPat, Callable]]):
    self.rules = list(rules)
    self._by_op: dict[Ops | None, list[tuple[UPat, Callable, bool]]] = {}
    for pat, fn in self.rules:
      wants_ctx = "ctx" in inspect.signature(fn).parameters
      for op in (pat.ops if pat.ops is not None else [None]):
        self._by_op.setdefault(op, []).append((pat, fn, wants_ctx))
    wildcard = self._by_op.get(None, [])
    if wildcard:
      for op in Ops: self._by_op[op] = self._by_op.get(op, []) + wildcard

  def __add__(self, other: PatternMatcher) -> PatternMatcher: return PatternMatcher(self.rules + other.rules)

  def rewrite(self, uop: UOp, ctx: Any = None) -> UOp | None:
    """Apply the first rule that matches `uop` and returns something; None when none does."""
    for pat, fn, wants_ctx in self._by_op.get(uop.op, ()):
      for bound in pat.match(uop, {}):
        ret = fn(ctx=ctx, **bound) if wants_ctx else fn(**bound)
        if ret is not None and ret is not uop: return ret
    return None


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx: Any = None, memo: dict[UOp, UOp] | None = None) -> UOp:
  """Rewrite every node below `root` bottom-up with `pm` until no rule applies. Iterative, so deep graphs are fine.
  `memo` may be shared between calls with the same table (and ctx) to reuse earlier results."""
  done: dict[UOp, UOp] = {} if memo is None else memo
  # stack entries: (node, stage, replacement); stage 0 visits sources, 1 rewrites, 2 takes the replacement's result
  stack: list[tuple[UOp, int, UOp | None]] = [(root, 0, None)]
  while stack:
    node, stage, replacement = stack.pop()
    if stage == 2:
      done[node] = done[replacement]
      continue
    if node in done: continue
    if stage == 0:
      stack.append((node, 1, None))
      stack.extend((s, 0, None) for s in node.src if s not in done)
      continue
    new_src = tuple(done[s] for s in node.src)
    current = node if new_src == node.src else node.replace(src=new_src)
    replaced = pm.rewrite(current, ctx)
    if replaced is None:
      done[node] = done[current] = current
    elif replaced in done:
      done[node] = done[replaced]
    else:
      stack.append((node, 2, replaced))
      stack.append((replaced, 0, None))
  return done[root]
