"""The one IR of fusegrad: the `Ops` enum and the immutable, hash-consed `UOp`.

The same node type carries the kernel AST handed from the scheduler to codegen, the index arithmetic of views and
loops, and the final linear program. Identical nodes are the same object, so CSE is free and rewrites memoize.
Arithmetic operators on UOps build ALU nodes (`gidx*4 + ridx`); `vmin`/`vmax` give value bounds of int expressions,
which the simplifier in symbolic.py uses to fold div, mod and comparisons.
"""
from __future__ import annotations
import math
import weakref
import itertools
import operator
import functools
from enum import Enum, auto
from dataclasses import dataclass
from typing import Any, Callable, Iterator
from fusegrad.dtype import DType, dtypes, truncate
from fusegrad.helpers import toposort


class Ops(Enum):
  # program structure
  SINK = auto(); DEFINE_GLOBAL = auto(); DEFINE_VAR = auto(); DEFINE_LOCAL = auto(); DEFINE_ACC = auto()  # noqa: E702
  SPECIAL = auto(); LOOP = auto(); END = auto(); IF = auto(); BARRIER = auto(); BIND = auto()  # noqa: E702
  # memory and values
  LOAD = auto(); STORE = auto(); CONST = auto(); PHI = auto(); CAST = auto(); BITCAST = auto()  # noqa: E702
  GEP = auto(); VECTORIZE = auto(); WMMA = auto(); REDUCE = auto(); VIEW = auto()  # noqa: E702
  # lazy graph only: a realized buffer, a device copy, a forced realization, uninitialised memory
  BUFFER = auto(); COPY = auto(); CONTIGUOUS = auto(); EMPTY = auto()  # noqa: E702
  # ALU: unary
  NEG = auto(); EXP2 = auto(); LOG2 = auto(); SIN = auto(); SQRT = auto(); RECIP = auto(); TRUNC = auto()  # noqa: E702
  # ALU: binary
  ADD = auto(); SUB = auto(); MUL = auto(); FDIV = auto(); IDIV = auto(); MOD = auto(); MAX = auto()  # noqa: E702
  CMPLT = auto(); CMPNE = auto(); CMPEQ = auto(); AND = auto(); OR = auto(); XOR = auto()  # noqa: E702
  SHL = auto(); SHR = auto(); POW = auto()  # noqa: E702
  # ALU: ternary
  WHERE = auto(); MULACC = auto()  # noqa: E702

  def __repr__(self) -> str: return f"Ops.{self.name}"


class GroupOp:
  Unary = frozenset({Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC})
  Binary = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE,
                      Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.POW})
  Ternary = frozenset({Ops.WHERE, Ops.MULACC})
  ALU = Unary | Binary | Ternary
  Comparison = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
  Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR})
  Reduce = frozenset({Ops.ADD, Ops.MAX})   # the ALU ops a REDUCE may combine with
  Buffer = frozenset({Ops.LOAD, Ops.STORE, Ops.CONST})
  # kept by dead-code removal even without a consumer
  SideEffect = frozenset({Ops.STORE, Ops.WMMA, Ops.END, Ops.BARRIER, Ops.DEFINE_GLOBAL, Ops.SINK})


# ***** typed args *****

@dataclass(frozen=True)
class VarArg:
  """DEFINE_VAR: a named int in [min, max] (a symbolic shape or a kernel's int parameter)."""
  name: str
  min: int
  max: int


@dataclass(frozen=True)
class SpecialArg:
  """SPECIAL: a hardware index, `name` like gidx0 / lidx1, taking values in [0, size)."""
  name: str
  dim: int
  size: int


@dataclass(frozen=True)
class MatrixLoad:
  """The arg of a LOAD that is ldmatrix: `count` 8x8 matrices of 16-bit values from shared memory, loaded by the
  whole warp; the LOAD's index is this lane's row address (lane l: row l % 8 of matrix l // 8); lane l receives,
  per matrix, the register holding row l // 4, columns 2 (l % 4) and 2 (l % 4) + 1 (of the transposed matrix when
  `trans`). Its dtype is uint32 x count."""
  count: int
  trans: bool


@dataclass(frozen=True)
class WGMMAArg:
  """The arg of a WMMA that is one wgmma.mma_async m64nNk16 of a warpgroup (4 warps; sm_90a), fp32 accumulation:
  src = (A's shared array, A's origin, B's shared array, B's origin, this thread's N/2 accumulators[, the barrier
  after which the tiles are ready]); dtype float.vec(N/2). Thread (w, g, t) of the warpgroup holds
  D[16 w + g + 8 (i // 2 % 2), 8 (i // 4) + 2 t + i % 2] in accumulator i: the m16n8 C fragments of N / 8 tiles
  side by side. The tiles are 128-byte swizzled (codegen/tensor_cores.py); an operand is K-major (`trans` False: a
  row of its tile holds 64 k of one m or n) or MN-major (True: a row holds 64 m or n of one k); `lbo_*` are the
  descriptors' leading byte offsets, in elements (MN-major: from one 64-column panel to the next); 8-row groups are
  SBO elements apart. `in_flight`: batches (one reduce-loop iteration's wgmmas) that may still run when the
  iteration's barrier passes (the ring then refills the slot read two iterations back)."""
  NAME = "m64nNk16"   # in Renderer.tensor_cores: the device has wgmma
  SBO = 512
  dtype_in: DType
  n: int
  trans_a: bool
  trans_b: bool
  lbo_a: int
  lbo_b: int
  in_flight: int = 0

  @property
  def dims(self) -> tuple[int, int, int]: return (64, self.n, 16)


@dataclass(frozen=True)
class MaskedLoad:
  """The arg of a vector LOAD whose lanes have validities of their own (a window of a padded row, as a conv reads):
  src = (buffer, index of lane 0, one bool per lane, alternative); lane i reads index + i where its bool holds, else
  0. The index need not be aligned to the vector."""


@dataclass(frozen=True)
class LocalArg:
  """DEFINE_LOCAL: a shared-memory array `name` of `size` elements, its start aligned to `align` bytes."""
  name: str
  size: int
  align: int = 16


@dataclass(frozen=True)
class ReduceArg:
  """REDUCE in the kernel AST: combine with `op` (ADD or MAX) over `axis` of the input shape."""
  op: Ops
  axis: tuple[int, ...]


# ***** the node *****

_UOP_CACHE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _const_key(v):
  # 0.0 and -0.0 (and nan) are different constants, though Python compares 0.0 == -0.0
  return ("f", v.hex()) if isinstance(v, float) else v


class UOp:
  """An immutable IR node (op, dtype, src, arg). Constructing an existing node returns that node."""
  __slots__ = ("op", "dtype", "src", "arg", "_bounds", "__weakref__")
  op: Ops
  dtype: DType
  src: tuple[UOp, ...]
  arg: Any

  def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None):
    key = (op, dtype, src, _const_key(arg) if op is Ops.CONST else arg)
    ret = _UOP_CACHE.get(key)
    if ret is not None: return ret
    ret = object.__new__(cls)
    object.__setattr__(ret, "op", op)
    object.__setattr__(ret, "dtype", dtype)
    object.__setattr__(ret, "src", src)
    object.__setattr__(ret, "arg", arg)
    object.__setattr__(ret, "_bounds", None)
    _UOP_CACHE[key] = ret
    return ret

  def __setattr__(self, name, value): raise AttributeError(f"UOp is immutable (tried to set {name})")
  def __delattr__(self, name): raise AttributeError(f"UOp is immutable (tried to delete {name})")
  def __reduce__(self): return (UOp, (self.op, self.dtype, self.src, self.arg))
  def __bool__(self): raise TypeError(f"a UOp has no truth value (it is an expression: {self.render()})")
  def __repr__(self) -> str: return pretty(self)

  def replace(self, **kw) -> UOp:
    return UOp(kw.get("op", self.op), kw.get("dtype", self.dtype), kw.get("src", self.src), kw.get("arg", self.arg))

  # ***** graph helpers *****
  def toposort(self) -> list[UOp]:
    """All nodes this one depends on (itself included), each after its sources."""
    return toposort(self, lambda u: u.src)

  def substitute(self, mapping: dict[UOp, UOp]) -> UOp:
    """Replace nodes by others everywhere below this one (no simplification)."""
    done: dict[UOp, UOp] = {}
    for node in self.toposort():
      if node in mapping: done[node] = mapping[node]
      elif node.src: done[node] = node.replace(src=tuple(done[s] for s in node.src))
      else: done[node] = node
    return done[self]

  def vars(self) -> set[UOp]:
    """The DEFINE_VARs (unbound) this expression uses; BINDs count as their variable."""
    out = set()
    for n in self.toposort():
      if n.op is Ops.DEFINE_VAR: out.add(n)
    return out

  # ***** constants *****
  @staticmethod
  def const(dtype: DType, value) -> UOp:
    return UOp(Ops.CONST, dtype, (), truncate(value, dtype.scalar) if dtype.count == 1 else value)

  def const_like(self, value) -> UOp: return UOp.const(self.dtype, value)

  @property
  def is_const(self) -> bool: return self.op is Ops.CONST

  # ***** arithmetic builders *****
  def alu(self, op: Ops, *src: UOp | int | float | bool) -> UOp:
    srcs = (self,) + tuple(s if isinstance(s, UOp) else self.const_like(s) for s in src)
    out_dtype = dtypes.bool if op in GroupOp.Comparison else srcs[-1].dtype if op is Ops.WHERE else self.dtype
    return UOp(op, out_dtype, srcs)

  def _rconst(self, x) -> UOp: return x if isinstance(x, UOp) else self.const_like(x)
  def __add__(self, x): return self.alu(Ops.ADD, x)
  def __radd__(self, x): return self._rconst(x).alu(Ops.ADD, self)
  def __sub__(self, x): return self.alu(Ops.SUB, x)
  def __rsub__(self, x): return self._rconst(x).alu(Ops.SUB, self)
  def __mul__(self, x): return self.alu(Ops.MUL, x)
  def __rmul__(self, x): return self._rconst(x).alu(Ops.MUL, self)
  def __floordiv__(self, x): return self.alu(Ops.IDIV, x)
  def __rfloordiv__(self, x): return self._rconst(x).alu(Ops.IDIV, self)
  def __truediv__(self, x): return self.alu(Ops.FDIV, x)
  def __rtruediv__(self, x): return self._rconst(x).alu(Ops.FDIV, self)
  def __mod__(self, x): return self.alu(Ops.MOD, x)
  def __rmod__(self, x): return self._rconst(x).alu(Ops.MOD, self)
  def __neg__(self): return self.alu(Ops.NEG)
  def __lt__(self, x): return self.alu(Ops.CMPLT, x)
  def __gt__(self, x): return self._rconst(x).alu(Ops.CMPLT, self)
  def __and__(self, x): return self.alu(Ops.AND, x)
  def __rand__(self, x): return self._rconst(x).alu(Ops.AND, self)
  def __or__(self, x): return self.alu(Ops.OR, x)
  def __ror__(self, x): return self._rconst(x).alu(Ops.OR, self)
  def __xor__(self, x): return self.alu(Ops.XOR, x)
  def __invert__(self): return self.alu(Ops.XOR, True) if self.dtype is dtypes.bool else self.alu(Ops.XOR, -1)
  __hash__ = object.__hash__
  __eq__ = object.__eq__
  def eq(self, x): return self.alu(Ops.CMPEQ, x)
  def ne(self, x): return self.alu(Ops.CMPNE, x)
  def maximum(self, x): return self.alu(Ops.MAX, x)
  def minimum(self, x): return -((-self).maximum(-self._rconst(x)))
  def where(self, x, y):
    """x where this bool is true, else y. A Python number takes the other branch's dtype; two numbers make an index
    WHERE, or a default-float one if either is a float."""
    if not isinstance(x, UOp) and not isinstance(y, UOp):
      x = UOp.const(dtypes.default_float if isinstance(x, float) or isinstance(y, float) else dtypes.index, x)
    x = x if isinstance(x, UOp) else y.const_like(x)
    return self.alu(Ops.WHERE, x, y if isinstance(y, UOp) else x.const_like(y))
  def cast(self, dtype: DType) -> UOp: return self if self.dtype is dtype else UOp(Ops.CAST, dtype, (self,))

  # ***** symbolic variables *****
  def bind(self, value: int) -> UOp:
    """Bind a DEFINE_VAR to a value: a shape dim that compiles once for every value in range."""
    if self.op is not Ops.DEFINE_VAR: raise TypeError(f"bind: only a Variable can be bound, not {self.op}")
    if not self.arg.min <= value <= self.arg.max:
      raise ValueError(f"bind: {self.arg.name}={value} is outside its range [{self.arg.min}, {self.arg.max}]")
    return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, value)))

  def unbind(self) -> tuple[UOp, int]:
    if self.op is not Ops.BIND: raise TypeError(f"unbind: {self.render()} is not a bound variable")
    return self.src[0], self.src[1].arg

  @property
  def expr(self) -> str:
    if self.op is Ops.DEFINE_VAR: return self.arg.name
    if self.op is Ops.BIND: return self.src[0].arg.name
    raise TypeError(f"expr: {self.op} is not a variable")

  # ***** value bounds *****
  @property
  def vmin(self): return self._get_bounds()[0]
  @property
  def vmax(self): return self._get_bounds()[1]

  def _get_bounds(self) -> tuple:
    if self._bounds is None:
      # compute sources first without recursion, so long chains don't hit the recursion limit
      for node in self.toposort():
        if node._bounds is None: object.__setattr__(node, "_bounds", _bounds(node))
    return self._bounds

  # ***** evaluation and printing *****
  def evaluate(self, env: dict[str, int] | None = None):
    """The value of a scalar int/bool/float expression, with DEFINE_VAR/SPECIAL/LOOP names given in `env`.
    A bound variable (`Variable("n", 1, 9).bind(3)`) needs no entry: its value comes from the BIND."""
    nodes = self.toposort()
    env = {**{n.src[0].arg.name: n.src[1].arg for n in nodes if n.op is Ops.BIND}, **(env or {})}
    vals: dict[UOp, Any] = {}
    for n in nodes:
      if n.op is Ops.CONST: vals[n] = n.arg
      elif n.op in (Ops.DEFINE_VAR, Ops.SPECIAL, Ops.LOOP):
        name = n.arg.name if n.op is not Ops.LOOP else n.arg
        if name not in env: raise KeyError(f"evaluate: no value given for {name}")
        vals[n] = env[name]
      elif n.op is Ops.BIND: vals[n] = vals[n.src[1]]
      elif n.op is Ops.CAST: vals[n] = truncate(vals[n.src[0]], n.dtype)
      elif n.op in GroupOp.ALU: vals[n] = exec_alu(n.op, n.dtype, [vals[s] for s in n.src])
      else: raise TypeError(f"evaluate: can't evaluate {n.op}")
    return vals[self]

  def render(self) -> str: return render_expr(self)


def Variable(name: str, vmin: int, vmax: int, dtype: DType = dtypes.index) -> UOp:
  """A named int in [vmin, vmax]: `Variable("n", 1, 1024).bind(7)` is a shape dim that compiles once for all n."""
  if not isinstance(vmin, int) or not isinstance(vmax, int) or vmin > vmax:
    raise ValueError(f"Variable {name!r}: needs int bounds with min <= max, got [{vmin}, {vmax}]")
  return UOp(Ops.DEFINE_VAR, dtype, (), VarArg(name, vmin, vmax))


def sint_to_uop(x: int | UOp, dtype: DType = dtypes.index) -> UOp:
  return x if isinstance(x, UOp) else UOp.const(dtype, x)


# ***** ALU semantics (constant folding, the PYTHON backend, evaluate) *****

def _idiv(a, b): return 0 if b == 0 else a // b            # floor division, as Python and torch
def _mod(a, b):
  # ints: Python's (and torch's) sign-of-divisor remainder; floats: C's fmod, which kernels compute
  if isinstance(a, float) or isinstance(b, float): return math.nan if b == 0 else math.fmod(a, b)
  return 0 if b == 0 else a % b
def _fdiv(a, b):
  if b == 0: return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
  return a / b
def _exp2(a):
  try: return 2.0 ** a
  except OverflowError: return math.inf
def _log2(a): return math.log2(a) if a > 0 else (-math.inf if a == 0 else math.nan)
def _sqrt(a): return math.sqrt(a) if a >= 0 else math.nan
def _recip(a): return _fdiv(1.0, a)
def _sin(a): return math.sin(a) if math.isfinite(a) else math.nan
def _trunc(a): return float(math.trunc(a)) if math.isfinite(a) else a
def _pow(a, b):
  try: return a ** b if not (a < 0 and not float(b).is_integer()) else math.nan
  except (OverflowError, ZeroDivisionError): return math.inf


PYTHON_ALU: dict[Ops, Callable] = {
  Ops.NEG: operator.neg, Ops.EXP2: _exp2, Ops.LOG2: _log2, Ops.SIN: _sin, Ops.SQRT: _sqrt, Ops.RECIP: _recip,
  Ops.TRUNC: _trunc, Ops.ADD: operator.add, Ops.SUB: operator.sub, Ops.MUL: operator.mul, Ops.FDIV: _fdiv,
  Ops.IDIV: _idiv, Ops.MOD: _mod, Ops.MAX: max, Ops.CMPLT: operator.lt, Ops.CMPNE: operator.ne,
  Ops.CMPEQ: operator.eq, Ops.AND: operator.and_, Ops.OR: operator.or_, Ops.XOR: operator.xor,
  Ops.SHL: operator.lshift, Ops.SHR: operator.rshift, Ops.POW: _pow,
  Ops.WHERE: lambda c, a, b: a if c else b, Ops.MULACC: lambda a, b, c: a * b + c,
}


def exec_alu(op: Ops, dtype: DType, operands: list):
  """Apply an ALU op to Python values and wrap/round the result to `dtype`."""
  if op is Ops.MAX and any(isinstance(x, float) and math.isnan(x) for x in operands): return math.nan
  try:
    out = PYTHON_ALU[op](*operands)
  except OverflowError:
    out = math.inf
  return truncate(out, dtype)


# ***** bounds *****

def _dtype_bounds(dt: DType) -> tuple: return dtypes.min(dt), dtypes.max(dt)


def _bounds(u: UOp) -> tuple:
  op, s = u.op, u.src
  if u.dtype.count != 1 or not (dtypes.is_int(u.dtype) or dtypes.is_bool(u.dtype)):
    if op is Ops.CONST and isinstance(u.arg, (int, float)): return u.arg, u.arg
    return _dtype_bounds(u.dtype) if u.dtype.count == 1 and u.dtype is not dtypes.void else (-math.inf, math.inf)
  if op is Ops.CONST: return u.arg, u.arg
  if op is Ops.DEFINE_VAR: return u.arg.min, u.arg.max
  if op is Ops.BIND: return s[0].vmin, s[0].vmax
  if op is Ops.SPECIAL:
    size = u.arg.size
    return 0, (size.vmax if isinstance(size, UOp) else size) - 1
  if op is Ops.LOOP: return s[0].vmin, s[1].vmax - 1
  if op is Ops.ADD: return s[0].vmin + s[1].vmin, s[0].vmax + s[1].vmax
  if op is Ops.SUB: return s[0].vmin - s[1].vmax, s[0].vmax - s[1].vmin
  if op is Ops.NEG: return -s[0].vmax, -s[0].vmin
  if op is Ops.MUL:
    corners = [a * b for a in (s[0].vmin, s[0].vmax) for b in (s[1].vmin, s[1].vmax)]
    return min(corners), max(corners)
  if op is Ops.IDIV and s[1].vmin > 0:
    return min(s[0].vmin // s[1].vmin, s[0].vmin // s[1].vmax), max(s[0].vmax // s[1].vmin, s[0].vmax // s[1].vmax)
  if op is Ops.MOD and s[1].vmin > 0:
    if s[0].vmin >= 0 and s[0].vmax < s[1].vmin: return s[0].vmin, s[0].vmax
    if s[1].op is Ops.CONST and s[0].vmin // s[1].arg == s[0].vmax // s[1].arg:
      return s[0].vmin % s[1].arg, s[0].vmax % s[1].arg
    return 0, s[1].vmax - 1
  if op is Ops.MAX: return max(s[0].vmin, s[1].vmin), max(s[0].vmax, s[1].vmax)
  if op is Ops.CMPLT:
    if s[0].vmax < s[1].vmin: return True, True
    if s[0].vmin >= s[1].vmax: return False, False
    return False, True
  if op in (Ops.CMPNE, Ops.CMPEQ):
    disjoint = s[0].vmax < s[1].vmin or s[1].vmax < s[0].vmin
    same = s[0].vmin == s[0].vmax == s[1].vmin == s[1].vmax
    if disjoint or same: return (same != (op is Ops.CMPNE),) * 2
    return False, True
  if u.dtype is dtypes.bool and op in (Ops.AND, Ops.OR, Ops.XOR):
    a, b = (s[0].vmin, s[0].vmax), (s[1].vmin, s[1].vmax)
    if op is Ops.AND: return a[0] and b[0], a[1] and b[1]
    if op is Ops.OR: return a[0] or b[0], a[1] or b[1]
    if a[0] == a[1] and b[0] == b[1]: return (a[0] != b[0],) * 2
    return False, True
  if op is Ops.WHERE:
    if s[0].vmin == s[0].vmax: return (s[1].vmin, s[1].vmax) if s[0].vmin else (s[2].vmin, s[2].vmax)
    return min(s[1].vmin, s[2].vmin), max(s[1].vmax, s[2].vmax)
  if op is Ops.CAST and (dtypes.is_int(s[0].dtype) or dtypes.is_bool(s[0].dtype)):
    lo, hi = _dtype_bounds(u.dtype)
    if lo <= s[0].vmin and s[0].vmax <= hi: return int(s[0].vmin), int(s[0].vmax)
  return _dtype_bounds(u.dtype)


# ***** printing *****

_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.FDIV: "/", Ops.CMPLT: "<",
          Ops.CMPNE: "!=", Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}
# comparisons bind loosest, so `(x<3)&(y<2)` prints with the parentheses Python and C readers both need
_PREC = {Ops.CMPLT: 1, Ops.CMPNE: 1, Ops.CMPEQ: 1, Ops.OR: 2, Ops.XOR: 3, Ops.AND: 4, Ops.SHL: 5, Ops.SHR: 5,
         Ops.ADD: 6, Ops.SUB: 6, Ops.MUL: 7, Ops.IDIV: 7, Ops.MOD: 7, Ops.FDIV: 7}


@functools.lru_cache(maxsize=1 << 16)
def render_expr(u: UOp) -> str:
  """A readable one-line form of a scalar expression: `gidx0*4+ridx0`, `(a//4)%3`, `(x<3)&(y<2)`."""
  return _render(u, 0)


def _negation_factors_out(u: UOp) -> bool:
  """Whether `a+` and the printed `-...` of u may print as `a-...`: true when u's first term is a product or
  quotient of its leading factor, false for a floor division or modulo (`a+(-b)//2` is not `a-b//2`)."""
  while u.op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV): u = u.src[0]
  return u.op not in (Ops.IDIV, Ops.MOD)


def _render(u: UOp, parent_prec: int) -> str:
  if u.op is Ops.CONST: return str(u.arg) if u.dtype.count == 1 else f"{u.dtype.name}({u.arg})"
  if u.op is Ops.DEFINE_VAR: return u.arg.name
  if u.op is Ops.BIND: return f"{u.src[0].arg.name}={u.src[1].arg}"
  if u.op is Ops.SPECIAL: return u.arg.name
  if u.op is Ops.LOOP: return str(u.arg)
  if u.op in _INFIX:
    prec = _PREC[u.op]
    a = _render(u.src[0], prec)
    # right operand of a non-associative op binds tighter
    right_prec = prec if u.op in (Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR) else prec + 1
    b = _render(u.src[1], right_prec)
    if u.op is Ops.ADD and b.startswith("-") and _negation_factors_out(u.src[1]): text = f"{a}{b}"
    else: text = f"{a}{_INFIX[u.op]}{b}"
    if u.op is Ops.ADD and u.src[1].op is Ops.CONST and isinstance(u.src[1].arg, int) and u.src[1].arg < 0:
      text = f"{a}-{-u.src[1].arg}"
    # `(a//4)%3` and `(a<b)<c`: floor division, modulo and comparisons are not associative (and Python chains `<`)
    nonassoc = u.op in (Ops.IDIV, Ops.MOD) or u.op in GroupOp.Comparison
    return f"({text})" if prec < parent_prec or (prec == parent_prec and nonassoc) else text
  if u.op is Ops.NEG: return f"-{_render(u.src[0], 8)}"
  if u.op is Ops.MAX: return f"max({_render(u.src[0], 0)}, {_render(u.src[1], 0)})"
  if u.op is Ops.WHERE: return f"({_render(u.src[0], 0)} ? {_render(u.src[1], 0)} : {_render(u.src[2], 0)})"
  if u.op is Ops.CAST: return f"({u.dtype.name}){_render(u.src[0], 8)}"
  if u.op in GroupOp.ALU: return f"{u.op.name.lower()}({', '.join(_render(s, 0) for s in u.src)})"
  return f"<{u.op.name}>"


def pretty(u: UOp, max_nodes: int = 40) -> str:
  """A multi-line tree print for graphs; a one-line expression for small scalar ones."""
  if u.op in GroupOp.ALU | {Ops.CONST, Ops.DEFINE_VAR, Ops.BIND, Ops.SPECIAL, Ops.LOOP} and u.dtype.count == 1:
    nodes = u.toposort()
    if len(nodes) <= max_nodes and all(n.op in GroupOp.ALU | {Ops.CONST, Ops.DEFINE_VAR, Ops.BIND, Ops.SPECIAL,
                                                             Ops.LOOP, Ops.CAST} for n in nodes):
      return f"UOp({render_expr(u)})"
  lines: list[str] = []
  names: dict[UOp, str] = {}
  for i, n in enumerate(u.toposort()):
    names[n] = f"%{i}"
    arg = "" if n.arg is None else f" {n.arg!r}"
    lines.append(f"{names[n]:>5} = {n.op.name:<14} {n.dtype.name:<12} [{', '.join(names[s] for s in n.src)}]{arg}")
  return "\n".join(lines)


def iter_values(u: UOp) -> Iterator[int]:
  """Every value an int expression takes as its LOOP/SPECIAL/DEFINE_VAR leaves range over (for tests)."""
  leaves = sorted({n for n in u.toposort() if n.op in (Ops.DEFINE_VAR, Ops.SPECIAL, Ops.LOOP)}, key=render_expr)
  names = [n.arg.name if n.op is not Ops.LOOP else n.arg for n in leaves]
  for combo in itertools.product(*[range(n.vmin, n.vmax + 1) for n in leaves]):
    yield u.evaluate(dict(zip(names, combo)))
