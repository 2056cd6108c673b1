"""Data types: scalar, vector and pointer dtypes, their numpy equivalents, and torch-compatible promotion.

Every DType is interned (one object per distinct type), so dtypes compare and hash by identity, which keeps
UOp hash-consing cheap. `least_upper_dtype` is the promotion rule used by binary ops; docs/dtypes.md shows its table.
"""
from __future__ import annotations
import math
import functools
from dataclasses import dataclass
import numpy as np


@dataclass(frozen=True, eq=False)
class DType:
  """A scalar (count == 1) or vector (count > 1) type. `priority` orders scalar types for promotion."""
  priority: int
  itemsize: int
  name: str
  fmt: str | None   # numpy/struct format character; None where numpy has no such type (bfloat16, void)
  count: int = 1
  _scalar: DType | None = None

  def __repr__(self) -> str: return f"dtypes.{self.name}"
  def __reduce__(self): return (_vector, (self._scalar, self.count)) if self._scalar is not None else \
      (_dtype_by_name, (self.name,))

  @property
  def scalar(self) -> DType: return self._scalar if self._scalar is not None else self

  def vec(self, n: int) -> DType:
    """The vector type of `n` lanes of this scalar type (`dtypes.float32.vec(4)` is float4)."""
    if self.count != 1: raise TypeError(f"vec: {self} is already a vector type")
    return self if n == 1 else _vector(self, n)

  def ptr(self, local: bool = False) -> PtrDType: return _pointer(self, local)

  @property
  def np(self) -> np.dtype | None: return np.dtype(self.fmt) if self.fmt is not None and self.count == 1 else None


@dataclass(frozen=True, eq=False)
class PtrDType(DType):
  """A pointer to a global (or, with local=True, shared-memory) buffer of `base` elements."""
  base: DType = None  # type: ignore[assignment]
  local: bool = False
  def __repr__(self) -> str: return f"{self.base!r}.ptr({'local=True' if self.local else ''})"
  def __reduce__(self): return (_pointer, (self.base, self.local))


@dataclass(frozen=True, eq=False)
class ImageDType(PtrDType):
  """A 2D image of RGBA pixels (the seed's image buffers): `shape` is (height, width, 4)."""
  shape: tuple[int, ...] = ()
  def __repr__(self) -> str: return f"dtypes.image{self.base.name}({', '.join(map(str, self.shape))})"
  def __reduce__(self): return (image_dtype, (self.base, self.shape))


_VECTOR_NAMES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16_", "float64": "double", "int32": "int",
                 "int8": "char", "uint8": "uchar", "int16": "short", "uint16": "ushort", "uint32": "uint",
                 "int64": "long", "uint64": "ulong", "bool": "bool"}


@functools.cache
def _vector(scalar: DType, n: int) -> DType:
  # up to 4 lanes the CUDA spelling (float4); wider vectors get an `x` (floatx16 is not the scalar float16)
  name = f"{_VECTOR_NAMES[scalar.name]}{n}" if n <= 4 else f"{_VECTOR_NAMES[scalar.name]}x{n}"
  return DType(scalar.priority, scalar.itemsize * n, name, None, n, scalar)


@functools.cache
def _pointer(base: DType, local: bool) -> PtrDType:
  return PtrDType(base.priority, 8, f"{base.name}_ptr", None, 1, None, base, local)


@functools.cache
def image_dtype(base: DType, shape: tuple[int, ...]) -> ImageDType:
  """The image dtype of `shape` (height, width, 4) with pixels of `base` (float16 or float32)."""
  if base not in (dtypes.float16, dtypes.float32) or len(shape) != 3 or shape[2] != 4:
    raise TypeError(f"image_dtype: needs a float16/float32 base and a (height, width, 4) shape, got {base}, {shape}")
  return ImageDType(base.priority, 8, f"image{base.name}", None, 1, None, base, False, shape)


class dtypes:
  """The scalar types, in promotion priority order, and helpers to classify them."""
  void = DType(-1, 0, "void", None)
  bool = DType(0, 1, "bool", "?")
  uint8 = DType(1, 1, "uint8", "B")
  int8 = DType(2, 1, "int8", "b")
  uint16 = DType(3, 2, "uint16", "H")
  int16 = DType(4, 2, "int16", "h")
  uint32 = DType(5, 4, "uint32", "I")
  int32 = DType(6, 4, "int32", "i")
  uint64 = DType(7, 8, "uint64", "Q")
  int64 = DType(8, 8, "int64", "q")
  float16 = DType(9, 2, "float16", "e")
  bfloat16 = DType(10, 2, "bfloat16", None)
  float32 = DType(11, 4, "float32", "f")
  float64 = DType(12, 8, "float64", "d")

  # aliases, as in torch
  half, float, double, int, long, short, char = float16, float32, float64, int32, int64, int16, int8
  # vector types of the seed (float4 loads/stores, half4, int2 image coordinates)
  float2, float4, half4, int2 = float32.vec(2), float32.vec(4), float16.vec(4), int32.vec(2)

  default_float = float32
  default_int = int64   # as torch: integer tensors and arange default to int64
  index = int32         # the type of index arithmetic in kernels

  @staticmethod
  def is_float(dt: DType) -> bool: return dt.scalar in _FLOATS
  @staticmethod
  def is_int(dt: DType) -> bool: return dt.scalar in _INTS
  @staticmethod
  def is_unsigned(dt: DType) -> bool: return dt.scalar in _UNSIGNED
  @staticmethod
  def is_bool(dt: DType) -> bool: return dt.scalar is dtypes.bool

  @staticmethod
  def min(dt: DType) -> int | float:
    dt = dt.scalar
    if dt is dtypes.bool: return False
    if dt in _UNSIGNED: return 0
    if dt in _INTS: return -(1 << (8 * dt.itemsize - 1))
    return -math.inf

  @staticmethod
  def max(dt: DType) -> int | float:
    dt = dt.scalar
    if dt is dtypes.bool: return True
    if dt in _UNSIGNED: return (1 << (8 * dt.itemsize)) - 1
    if dt in _INTS: return (1 << (8 * dt.itemsize - 1)) - 1
    return math.inf

  @staticmethod
  def from_numpy(npdt) -> DType:
    """The DType of a numpy dtype; TypeError for types fusegrad does not have (complex, object, strings)."""
    npdt = np.dtype(npdt)
    for dt in SCALAR_DTYPES:
      if dt.fmt is not None and np.dtype(dt.fmt) == npdt: return dt
    raise TypeError(f"dtype: numpy dtype {npdt} has no fusegrad equivalent; supported: "
                    f"{', '.join(d.name for d in SCALAR_DTYPES)}")

  @staticmethod
  def from_py(x) -> DType:
    """The dtype of a Python scalar or (nested) list, as torch.tensor would choose it."""
    if isinstance(x, (list, tuple)):
      return least_upper_dtype(*[dtypes.from_py(v) for v in x]) if len(x) else dtypes.default_float
    if isinstance(x, bool): return dtypes.bool
    if isinstance(x, int): return dtypes.default_int
    if isinstance(x, float): return dtypes.default_float
    raise TypeError(f"dtype: can't make a tensor from a Python {type(x).__name__}")


SCALAR_DTYPES: tuple[DType, ...] = (dtypes.bool, dtypes.uint8, dtypes.int8, dtypes.uint16, dtypes.int16, dtypes.uint32,
                                    dtypes.int32, dtypes.uint64, dtypes.int64, dtypes.float16, dtypes.bfloat16,
                                    dtypes.float32, dtypes.float64)
_FLOATS = frozenset({dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64})
_UNSIGNED = frozenset({dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64})
_INTS = _UNSIGNED | frozenset({dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64})


def _dtype_by_name(name: str) -> DType:
  for dt in SCALAR_DTYPES + (dtypes.void,):
    if dt.name == name: return dt
  raise TypeError(f"dtype: unknown dtype name {name!r}")


def to_dtype(x) -> DType:
  """Accept a DType, a name ("float32", "half") or a numpy dtype."""
  if isinstance(x, DType): return x
  if isinstance(x, str):
    alias = getattr(dtypes, x, None)
    if isinstance(alias, DType) and alias.count == 1 and alias is not dtypes.void: return alias
    raise TypeError(f"dtype: unknown dtype {x!r}; valid: {', '.join(d.name for d in SCALAR_DTYPES)}")
  # numpy would read None as float64 and fail on other objects with its own message
  if not isinstance(x, (np.dtype, type)):
    raise TypeError(f"dtype: can't make a dtype from {x!r}; give a DType, a dtype name or a numpy dtype")
  return dtypes.from_numpy(x)


def _category(dt: DType) -> int: return 2 if dt in _FLOATS else 1 if dt in _INTS else 0


def _promote2(a: DType, b: DType) -> DType:
  if a is b: return a
  ca, cb = _category(a), _category(b)
  if ca != cb: return a if ca > cb else b
  if ca == 2:
    if {a, b} == {dtypes.float16, dtypes.bfloat16}: return dtypes.float32
    return a if a.itemsize > b.itemsize else b
  if ca == 1:
    ua, ub = a in _UNSIGNED, b in _UNSIGNED
    if ua == ub: return a if a.itemsize > b.itemsize else b
    u, s = (a, b) if ua else (b, a)
    if s.itemsize > u.itemsize: return s
    size = min(2 * u.itemsize, 8)
    return {1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[size]
  return dtypes.bool


def least_upper_dtype(*dts: DType) -> DType:
  """The dtype that a binary op of tensors of these dtypes computes in, as torch.promote_types:
  bool < integers < floats by category; within a category the wider type wins; signed with unsigned goes to
  the signed type that holds both (capped at int64); float16 with bfloat16 goes to float32."""
  if not dts: raise TypeError("least_upper_dtype: needs at least one dtype")
  return functools.reduce(_promote2, [d.scalar for d in dts])


def sum_acc_dtype(dt: DType) -> DType:
  """What sum() returns, as torch: bools and ints (uint64 too) accumulate in int64, floats keep their type."""
  if dt in _INTS or dt is dtypes.bool: return dtypes.int64
  return dt


def truncate(value, dt: DType):
  """Convert a Python number to what `dt` stores: ints wrap around, float32/16 round, bools become bool."""
  dt = dt.scalar
  if dt is dtypes.bool: return bool(value)
  if dt in _INTS:
    if isinstance(value, float):
      if math.isnan(value) or math.isinf(value): return 0
      value = math.trunc(value)
    bits = 8 * dt.itemsize
    value = int(value) & ((1 << bits) - 1)
    return value - (1 << bits) if dt not in _UNSIGNED and value >= 1 << (bits - 1) else value
  if dt is dtypes.float64: return float(value)
  if dt is dtypes.bfloat16: return _round_bf16(float(value))
  with np.errstate(over="ignore"):
    return float(np.array(value, dtype=dt.np))


def _round_bf16(x: float) -> float:
  if math.isnan(x) or math.isinf(x): return x
  with np.errstate(over="ignore"):   # beyond float32's range: inf, which the rounding below keeps
    bits = int(np.array(x, dtype=np.float32).view(np.uint32))
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
  return float(np.array(bits, dtype=np.uint32).view(np.float32))
