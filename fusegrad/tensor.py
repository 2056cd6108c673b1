"""Tensor: the user API, with PyTorch's (and tinygrad's) method names and semantics, built on the lazy graph.

Every op checks its input at this boundary and raises a ValueError/IndexError/TypeError that names the op, the shapes
and dtypes, and what would be valid; then it composes autograd primitives (autograd.py), so nothing runs until
`realize()`/`numpy()`/`item()`/`tolist()`, elementwise chains fuse into their reduce, and every op is differentiable.
Dtype promotion follows torch (see `_operands`): Python scalars are weak, 0-d tensors count only by category.
"""
from __future__ import annotations
import math
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar
import numpy as np
from fusegrad.helpers import argfix, prod, make_pair, flatten, all_int, toposort
from fusegrad.dtype import DType, dtypes, least_upper_dtype, sum_acc_dtype, to_dtype
from fusegrad.device import Device
from fusegrad.uop import Ops
from fusegrad.lazy import LazyBuffer
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.realize import run_schedule
from fusegrad import autograd as F

Scalar = bool | int | float
TensorOrScalar = Any   # a Tensor or a Python number
LOG2_E = 1 / math.log(2)
HALF_FLOATS = (dtypes.float16, dtypes.bfloat16)


# ***** argument checking shared by the ops *****

def _fmt(shape: Sequence[Any]) -> str: return str(tuple(shape))


def _keyword(op: str, kw: dict, name: str) -> Any:
  """The one keyword a torch-style call may pass instead of positional arguments (`permute(dims=...)`)."""
  if set(kw) != {name}: raise TypeError(f"{op}: expected positional arguments or {name}=, got keywords {sorted(kw)}")
  return kw[name]


def _device_arg(op: str, device: str | None) -> str | None:
  if device is None: return None
  try:
    return Device.canonicalize(device)
  except (ValueError, TypeError) as e:
    raise type(e)(f"{op}: {str(e).removeprefix('device: ')}") from None


def _dtype_arg(op: str, dtype: Any) -> DType | None:
  if dtype is None: return None
  try:
    return to_dtype(dtype)
  except TypeError as e:
    raise TypeError(f"{op}: {str(e).removeprefix('dtype: ')}") from None


def _shape_arg(op: str, shape: tuple[Any, ...]) -> tuple[int, ...]:
  shape = argfix(*shape)
  if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in shape):
    raise TypeError(f"{op}: a shape is ints, got {shape!r}")
  if any(s < 0 for s in shape): raise ValueError(f"{op}: shape {_fmt(shape)} has a negative dim")
  return tuple(int(s) for s in shape)


def _axis(op: str, axis: Any, ndim: int) -> int:
  """A dim index in [-ndim, ndim) made nonnegative. A 0-d tensor accepts -1 and 0, as in torch."""
  if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
    raise TypeError(f"{op}: a dim is an int, got {axis!r}")
  n = max(ndim, 1)
  if not -n <= axis < n:
    raise ValueError(f"{op}: axis {axis} out of range for a {ndim}-d tensor (valid: {-n}..{n - 1})")
  return int(axis) % n


def _broadcast_shape(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
  """The shape all `shapes` broadcast to, aligning them from the right (numpy/torch rules)."""
  ndim = max(len(s) for s in shapes)
  out = []
  for k in range(-ndim, 0):
    sizes = [s[k] for s in shapes if len(s) >= -k]
    big = {s for s in sizes if s != 1}
    if len(big) > 1:
      listed = ", ".join(map(_fmt, shapes[:-1])) + f" and {_fmt(shapes[-1])}"
      raise ValueError(f"{op}: shapes {listed} can't broadcast: dim {k} is {' vs '.join(map(str, sizes))}")
    out.append(big.pop() if big else 1)
  return tuple(out)


def _weak_dtype(dt: DType, x: Scalar) -> DType:
  """The dtype of (tensor of dt) op (Python scalar x), as torch: the scalar only raises the category
  (bool < int < float) to the default dtype of its own category; otherwise the tensor's dtype wins."""
  if isinstance(x, bool): return dt
  if isinstance(x, int): return dtypes.default_int if dt is dtypes.bool else dt
  return dt if dtypes.is_float(dt) else dtypes.default_float


def _combine_categories(higher: DType, lower: DType) -> DType:
  """torch's rule for a dimensioned operand (higher) with a 0-d one (lower): the 0-d dtype only counts when it is
  of a higher category."""
  if dtypes.is_float(higher): return higher
  if higher is dtypes.bool or dtypes.is_float(lower): return least_upper_dtype(higher, lower)
  return higher


def _tensor_pair_dtype(a: Tensor, b: Tensor) -> DType:
  if (a.ndim == 0) == (b.ndim == 0): return least_upper_dtype(a.dtype, b.dtype)
  return _combine_categories(a.dtype, b.dtype) if b.ndim == 0 else _combine_categories(b.dtype, a.dtype)


def _np_dtype(dt: DType) -> np.dtype: return dt.np if dt.np is not None else np.dtype(np.float32)


def _host_array(op: str, data: Any, dtype: DType | None) -> tuple[np.ndarray, DType]:
  """Python scalars, nested lists and numpy arrays as a host array and the dtype the tensor will have."""
  try:
    if isinstance(data, (np.ndarray, np.generic)):
      arr = np.asarray(data)
      dt = dtype if dtype is not None else dtypes.from_numpy(arr.dtype)
    else:
      dt = dtype if dtype is not None else dtypes.from_py(data)
      arr = np.array(data)
    with np.errstate(invalid="ignore", over="ignore"):
      return arr.astype(_np_dtype(dt)) if arr.dtype != _np_dtype(dt) else arr, dt
  except TypeError as e:
    raise TypeError(f"{op}: {str(e).removeprefix('dtype: ')}") from None
  except (ValueError, OverflowError) as e:
    raise ValueError(f"{op}: can't make a tensor from this data ({e}); nested lists must be rectangular lists of "
                     "numbers") from None


def _window_last(x: Tensor, k: int, s: int, d: int) -> Tensor:
  """Sliding windows over the last dim: (..., i) -> (..., o, k) with window c holding x[c*s + a*d] for a < k.
  Only views: the input is repeated, viewed with a row length W = d (mod i) so each row starts d further on, and
  every s-th column kept; kernels read the windows straight from the input."""
  i, lead = x.shape[-1], x.shape[:-1]
  o = (i - d * (k - 1) - 1) // s + 1
  keep = tuple((0, n) for n in lead)
  if d == 1 and k <= s:   # windows don't overlap: cut the axis into rows of s and keep the first k of each
    x = x.pad((None,) * len(lead) + ((0, o * s - i),)) if o * s > i else x.shrink(keep + ((0, o * s),))
    return x.reshape(*lead, o, s).shrink(keep + ((0, o), (0, k)))
  width = d + i * max(1, -(-(o * s - d) // i))
  reps = -(-(k * width) // i)
  x = x.reshape(*lead, 1, i).expand(*lead, reps, i).reshape(*lead, reps * i)
  x = x.shrink(keep + ((0, k * width),)).reshape(*lead, k, width)
  x = x.shrink(keep + ((0, k), (0, o * s))).reshape(*lead, k, o, s).shrink(keep + ((0, k), (0, o), (0, 1)))
  return x.reshape(*lead, k, o).transpose(-1, -2)


_CONSTS: dict[tuple, LazyBuffer] = {}   # (value, dtype, shape, device) -> its const LazyBuffer, see _const_lb
_CONSTS_MAX = 4096


def _const_lb(value: Scalar, dtype: DType, shape: tuple[int, ...], device: str) -> LazyBuffer:
  """LazyBuffer.const, remembered: the scalar operands of elementwise ops (`x * 2.0`) repeat. Sharing one is safe:
  scheduling and realizing never change a constant's LazyBuffer (kernels inline constants as literals)."""
  if type(value) is float:
    if value != value: return LazyBuffer.const(value, dtype, shape, device)   # nan: not a usable dict key
    key: tuple = (float, value.hex(), dtype, shape, device)   # hex keeps 0.0 and -0.0 apart
  else:
    key = (type(value), value, dtype, shape, device)
  lb = _CONSTS.get(key)
  if lb is None:
    if len(_CONSTS) >= _CONSTS_MAX: _CONSTS.clear()
    lb = _CONSTS[key] = LazyBuffer.const(value, dtype, shape, device)
  return lb


class Tensor:
  """A lazily computed n-d array with reverse-mode autograd. `lazydata` is its LazyBuffer; `requires_grad` is True,
  False, or None (unset: treated as False, so an optimizer may turn it on)."""
  __slots__ = ("lazydata", "requires_grad", "grad", "_ctx", "_is_leaf", "__weakref__")
  training: ClassVar[bool] = False
  _seed: ClassVar[int] = 0
  _rng_counter: ClassVar[int] = 0

  def __init__(self, data: Any, device: str | None = None, dtype: Any = None, requires_grad: bool | None = None):
    dev, dt = _device_arg("Tensor", device), _dtype_arg("Tensor", dtype)
    if isinstance(data, LazyBuffer): lb = data
    elif isinstance(data, Tensor): lb = data.lazydata
    elif isinstance(data, (bool, int, float, list, tuple, np.ndarray, np.generic)):
      arr, dt = _host_array("Tensor", data, dt)
      shape, target = tuple(int(s) for s in arr.shape), dev or Device.DEFAULT
      lb = LazyBuffer.from_numpy(arr, dt, target) if arr.size else LazyBuffer.const(0, dt, shape, target)
    else:
      raise TypeError(f"Tensor: can't make a tensor from a {type(data).__name__}; give a Python number, a (nested) "
                      "list, a numpy array or a LazyBuffer")
    if dt is not None and lb.dtype is not dt: lb = lb.cast(dt)
    if dev is not None and lb.device != dev: lb = lb.copy_to_device(dev)
    self._leaf(lb, None)
    if requires_grad is not None: self.requires_grad_(requires_grad)

  def _leaf(self, lb: LazyBuffer, requires_grad: bool | None) -> None:
    """Every field of a fresh tensor: no gradient, no tape entry yet."""
    self.lazydata: LazyBuffer = lb
    self.grad: Tensor | None = None
    self._ctx: F.Function | None = None
    self._is_leaf = True
    self.requires_grad: bool | None = requires_grad

  @classmethod
  def _wrap(cls, lb: LazyBuffer, requires_grad: bool | None = None) -> Tensor:
    """A tensor of a LazyBuffer, without Tensor()'s argument checks (for ops whose output needs none; a True
    requires_grad must be on a float dtype)."""
    t = object.__new__(cls)
    t._leaf(lb, requires_grad)
    return t

  def _attach(self, ctx: F.Function) -> None:
    """Record the Function that made this tensor (its tape entry)."""
    self._ctx, self._is_leaf = ctx, False

  # ***** properties *****
  @property
  def shape(self) -> tuple[int, ...]: return self.lazydata.shape
  @property
  def dtype(self) -> DType: return self.lazydata.dtype
  @property
  def device(self) -> str: return self.lazydata.device
  @property
  def ndim(self) -> int: return len(self.shape)
  @property
  def is_leaf(self) -> bool: return self._is_leaf
  @property
  def T(self) -> Tensor: return self.permute(*reversed(range(self.ndim)))

  def numel(self) -> int: return int(prod(self.shape))
  def element_size(self) -> int: return self.dtype.itemsize
  def nbytes(self) -> int: return self.numel() * self.dtype.itemsize
  def size(self, dim: int | None = None) -> tuple[int, ...] | int:
    return self.shape if dim is None else self.shape[_axis("size", dim, self.ndim)]

  def __len__(self) -> int:
    if self.ndim == 0: raise TypeError("len: a 0-d tensor has no length")
    return self.shape[0]

  def __iter__(self) -> Iterator[Tensor]: return (self[i] for i in range(len(self)))

  def __repr__(self) -> str:
    lb = self.lazydata
    data = ""
    if not lb.is_view and lb.realized is not None and self.numel() <= 16: data = f" {self.tolist()}"
    grad = f" requires_grad={self.requires_grad}" if self.requires_grad else ""
    return f"<Tensor{data} shape={self.shape} device={self.device} dtype={self.dtype.name}{grad}>"

  __hash__ = object.__hash__   # __eq__ builds a tensor, so hash (and dict keys) go by identity
  __array_ufunc__ = None       # numpy scalars and arrays defer to Tensor's reflected operators

  # ***** running the graph *****
  def realize(self, *others: Tensor) -> Tensor:
    """Compute this tensor (and `others`, in the same schedule) into device buffers; returns self."""
    Tensor.realize_all(self, *others)
    return self

  @staticmethod
  def realize_all(*tensors: Tensor) -> None:
    """Realize several tensors with one schedule, so kernels they share run once."""
    lbs = [t.lazydata for t in tensors if t.numel() > 0 and t.lazydata.realized is None]
    if lbs: run_schedule(create_schedule(lbs))

  def numpy(self) -> np.ndarray:
    """A host copy (bfloat16 comes back as float32)."""
    dt = _np_dtype(self.dtype)
    if self.numel() == 0: return np.zeros(self.shape, dtype=dt)
    if self.lazydata.const_value is not None: return np.full(self.shape, self.lazydata.const_value, dtype=dt)
    self.realize()
    lb = self.lazydata
    if not (lb.st.contiguous and lb.size == lb.base.size): lb = lb.contiguous()
    Tensor(lb).realize()
    return lb.base.buffer.numpy().reshape(self.shape).astype(dt, copy=False)

  def tolist(self) -> Any: return self.numpy().tolist()

  def item(self) -> Scalar:
    if self.numel() != 1:
      raise ValueError(f"item: a tensor of shape {_fmt(self.shape)} has {self.numel()} elements, not one; "
                       "use tolist() or numpy()")
    return self.numpy().reshape(-1)[0].item()

  def __bool__(self) -> bool:
    if self.numel() != 1:
      raise ValueError(f"bool: the truth value of a tensor of shape {_fmt(self.shape)} is ambiguous; use any() "
                       "or all()")
    return bool(self.item())

  def __float__(self) -> float: return float(self.item())
  def __int__(self) -> int: return int(self.item())

  def to(self, device: Any = None, dtype: Any = None) -> Tensor:
    """This tensor on `device` and/or as `dtype` (`x.to("CPU")`, `x.to(dtypes.half)`, `x.to("CPU", dtypes.half)`),
    as torch's `to`; differentiable: the gradient moves back."""
    if device is not None and not isinstance(device, str): device, dtype = None, device
    out = self if dtype is None else self.cast(dtype)
    return out if device is None else out._to_device(device)

  @property
  def mT(self) -> Tensor:
    """The last two dims swapped (batched transpose), as torch's `mT`."""
    if self.ndim < 2: raise ValueError(f"mT: needs at least 2 dims, got a {self.ndim}-d tensor")
    return self.transpose(-2, -1)

  def _to_device(self, device: str) -> Tensor:
    dev = _device_arg("to", device)
    return self if dev == self.device else F.Copy.apply(self, device=dev)

  def cpu(self) -> Tensor: return self.to("CPU")

  def assign(self, x: TensorOrScalar) -> Tensor:
    """Replace this tensor's value by x (same shape, dtype and device); used by optimizers for in-place updates."""
    if not isinstance(x, Tensor): x = Tensor(x, device=self.device, dtype=self.dtype)
    if x.shape != self.shape or x.dtype is not self.dtype or x.device != self.device:
      raise ValueError(f"assign: a {_fmt(x.shape)} {x.dtype.name} tensor on {x.device} can't replace a "
                       f"{_fmt(self.shape)} {self.dtype.name} tensor on {self.device}")
    self.lazydata = x.lazydata
    return self

  # ***** autograd *****
  def requires_grad_(self, requires_grad: bool = True) -> Tensor:
    if requires_grad and not dtypes.is_float(self.dtype):
      raise TypeError(f"requires_grad: only floating point tensors can require gradients, not {self.dtype.name}")
    self.requires_grad = requires_grad
    return self

  def detach(self) -> Tensor:
    """The same values, cut from the tape."""
    return Tensor(self.lazydata, requires_grad=False)

  @staticmethod
  def no_grad() -> F.no_grad:
    """`with Tensor.no_grad():` ops inside record no tape (also usable as a decorator)."""
    return F.no_grad()

  @staticmethod
  def is_grad_enabled() -> bool: return F.GradMode.enabled

  @staticmethod
  @contextlib.contextmanager
  def train(mode: bool = True) -> Iterator[None]:
    """`with Tensor.train():` sets the class flag Tensor.training (dropout uses it) for the block."""
    saved = Tensor.training
    Tensor.training = mode
    try:
      yield
    finally:
      Tensor.training = saved

  def _toposort(self) -> list[Tensor]:
    """Tensors on the tape that lead to self, each after its parents."""
    return toposort(self, lambda t: t._ctx.parents if t._ctx is not None else ())

  def backward(self, gradient: Tensor | None = None, retain_graph: bool = False) -> Tensor:
    """Accumulate d(self)/d(leaf) into `.grad` of every leaf that requires grad. A non-scalar needs `gradient`
    (the vector in the vector-Jacobian product). The tape is freed unless retain_graph."""
    if self._ctx is None:
      if not self._is_leaf:
        raise ValueError("backward: this graph was already freed by an earlier backward(); pass retain_graph=True "
                         "to the first call to backward through it twice")
      if not self.requires_grad:
        raise ValueError("backward: this tensor doesn't require grad and no op on the tape made it; mark a leaf with "
                         "requires_grad=True before computing it")
    if gradient is None:
      if self.numel() != 1:
        raise ValueError(f"backward: a gradient can only be implied for a one-element output, not one of shape "
                         f"{_fmt(self.shape)}; pass gradient=")
      seed = self.lazydata.const_like(1)
    else:
      if not isinstance(gradient, Tensor) or gradient.shape != self.shape:
        got = _fmt(gradient.shape) if isinstance(gradient, Tensor) else type(gradient).__name__
        raise ValueError(f"backward: gradient must be a tensor of the output's shape {_fmt(self.shape)}, got {got}")
      seed = gradient.lazydata.cast(self.dtype)
    grads: dict[int, LazyBuffer] = {id(self): seed}   # by id: Tensor.__eq__ builds tensors
    for t in reversed(self._toposort()):
      g = grads.pop(id(t), None)
      if g is None: continue
      if t._ctx is None:
        if t.requires_grad: t.grad = Tensor(g) if t.grad is None else Tensor(t.grad.lazydata.alu(Ops.ADD, g))
        continue
      self._push_grads(t._ctx, g, grads)
      if not retain_graph: t._ctx = None
    return self

  @staticmethod
  def _push_grads(ctx: F.Function, g: LazyBuffer, grads: dict[int, LazyBuffer]) -> None:
    results = ctx.backward(g)
    results = results if isinstance(results, tuple) else (results,)
    for parent, needs, pg in zip(ctx.parents, ctx.needs_input_grad, results):
      if not needs or pg is None: continue
      if pg.shape != parent.shape:
        raise RuntimeError(f"backward: {type(ctx).__name__} gave a {pg.shape} gradient for a {parent.shape} input")
      pg = pg.cast(parent.dtype)
      grads[id(parent)] = grads[id(parent)].alu(Ops.ADD, pg) if id(parent) in grads else pg

  # ***** creation *****
  @staticmethod
  def _const(value: Scalar, shape: tuple[int, ...], dtype: DType, device: str | None) -> Tensor:
    return Tensor(LazyBuffer.const(value, dtype, shape, _device_arg("full", device) or Device.DEFAULT))

  @staticmethod
  def full(shape: tuple[int, ...] | int = None, fill_value: Scalar = None, dtype: Any = None, device: str | None = None,
           requires_grad: bool | None = None, *, size: tuple[int, ...] | int = None) -> Tensor:
    """A tensor of one value (a constant in kernels, no memory). The dtype defaults to fill_value's, as torch.
    `size=` names the shape too, as in torch."""
    shape = _shape_arg("full", (size if shape is None else shape,))
    if not isinstance(fill_value, (bool, int, float)):
      raise TypeError(f"full: fill_value must be a Python number, got {type(fill_value).__name__}")
    dt = _dtype_arg("full", dtype) or dtypes.from_py(fill_value)
    out = Tensor._const(fill_value, shape, dt, device)
    return out.requires_grad_(requires_grad) if requires_grad is not None else out

  @staticmethod
  def zeros(*shape: Any, dtype: Any = None, device: str | None = None, requires_grad: bool | None = None,
            size: Any = None) -> Tensor:
    shape = _shape_arg("zeros", (size,) if size is not None else shape)
    return Tensor.full(shape, 0.0, _dtype_arg("zeros", dtype) or dtypes.default_float, device,
                       requires_grad)

  @staticmethod
  def ones(*shape: Any, dtype: Any = None, device: str | None = None, requires_grad: bool | None = None,
           size: Any = None) -> Tensor:
    shape = _shape_arg("ones", (size,) if size is not None else shape)
    return Tensor.full(shape, 1.0, _dtype_arg("ones", dtype) or dtypes.default_float, device,
                       requires_grad)

  @staticmethod
  def empty(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    """Uninitialised memory of this shape."""
    dt = _dtype_arg("empty", dtype) or dtypes.default_float
    return Tensor(LazyBuffer.empty(_shape_arg("empty", shape), dt, _device_arg("empty", device) or Device.DEFAULT))

  @staticmethod
  def arange(start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: Any = None,
             device: str | None = None, *, end: Scalar | None = None) -> Tensor:
    """start, start+step, ... below stop (torch's `end=` works too). int64 when every argument is an int, else
    float32, as torch."""
    stop = end if stop is None else stop
    if stop is None: start, stop = 0, start
    if not all(isinstance(v, (int, float)) for v in (start, stop, step)):
      raise TypeError(f"arange: start, stop and step must be Python numbers, got {start!r}, {stop!r}, {step!r}")
    if step == 0: raise ValueError("arange: step must be nonzero")
    if not all(math.isfinite(v) for v in (start, stop, step)):
      raise ValueError(f"arange: start, stop and step must be finite, got {start}, {stop}, {step}")
    dt = _dtype_arg("arange", dtype) or (dtypes.default_int if all_int((start, stop, step)) else dtypes.default_float)
    n = max(0, math.ceil((stop - start) / step))
    values = start + np.arange(n, dtype=np.int64 if all_int((start, stop, step)) else np.float64) * step
    return Tensor(values, device=device, dtype=dt)

  @staticmethod
  def linspace(start: float, end: float, steps: int, dtype: Any = None, device: str | None = None) -> Tensor:
    if not isinstance(steps, int) or steps < 0: raise ValueError(f"linspace: steps must be an int >= 0, got {steps!r}")
    return Tensor(np.linspace(start, end, steps), device=device, dtype=_dtype_arg("linspace", dtype) or
                  dtypes.default_float)

  @staticmethod
  def eye(n: int, m: int | None = None, dtype: Any = None, device: str | None = None) -> Tensor:
    """The n x m identity, built from views of a constant (a 1 followed by m zeros, repeated), so it costs nothing."""
    m = n if m is None else m
    _shape_arg("eye", (n, m))
    if n > m: return Tensor.eye(m, n, dtype, device).T
    dt = _dtype_arg("eye", dtype) or dtypes.default_float
    ones = Tensor.full((n, 1), 1, dt, device)
    return ones.pad(((0, 0), (0, m))).reshape(n * (m + 1)).shrink(((0, n * m),)).reshape(n, m)

  # the *_like constructors work as `Tensor.zeros_like(t)` (torch) and as `t.zeros_like()` (tinygrad)
  def _like(self, dtype: Any, device: str | None) -> tuple[DType, str]:
    return _dtype_arg("like", dtype) or self.dtype, device or self.device

  def full_like(self, fill_value: Scalar, dtype: Any = None, device: str | None = None, **kw: Any) -> Tensor:
    return Tensor.full(self.shape, fill_value, *self._like(dtype, device), **kw)
  def zeros_like(self, dtype: Any = None, device: str | None = None, **kw: Any) -> Tensor:
    return Tensor.full(self.shape, 0, *self._like(dtype, device), **kw)
  def ones_like(self, dtype: Any = None, device: str | None = None, **kw: Any) -> Tensor:
    return Tensor.full(self.shape, 1, *self._like(dtype, device), **kw)
  def empty_like(self, dtype: Any = None, device: str | None = None) -> Tensor:
    dt, dev = self._like(dtype, device)
    return Tensor.empty(*self.shape, dtype=dt, device=dev)
  def rand_like(self, dtype: Any = None, device: str | None = None, **kw: Any) -> Tensor:
    dt, dev = self._like(dtype, device)
    return Tensor.rand(*self.shape, dtype=dt, device=dev, **kw)
  def randn_like(self, dtype: Any = None, device: str | None = None, **kw: Any) -> Tensor:
    dt, dev = self._like(dtype, device)
    return Tensor.randn(*self.shape, dtype=dt, device=dev, **kw)

  # ***** random *****
  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    """Restart the random stream: the same seed gives the same sequence of rand/randn/randint calls."""
    if not isinstance(seed, int): raise TypeError(f"manual_seed: seed must be an int, got {type(seed).__name__}")
    Tensor._seed, Tensor._rng_counter = seed, 0

  @staticmethod
  def _rng() -> np.random.Generator:
    """A counter-based generator for the next call: Philox keyed by the seed, at a block counter that each call
    advances, so a call's numbers depend only on the seed and how many calls came before."""
    gen = np.random.Generator(np.random.Philox(key=Tensor._seed % (1 << 64), counter=[0, Tensor._rng_counter, 0, 0]))
    Tensor._rng_counter += 1
    return gen

  @staticmethod
  def _random(op: str, shape: tuple[Any, ...], dtype: Any, device: str | None, requires_grad: bool | None,
              draw: Any) -> Tensor:
    shape, dt = _shape_arg(op, shape), _dtype_arg(op, dtype) or dtypes.default_float
    if not dtypes.is_float(dt): raise TypeError(f"{op}: makes floating point tensors, not {dt.name}")
    host = draw(Tensor._rng(), shape, np.float64 if dt is dtypes.float64 else np.float32)
    return Tensor(host, device=device, dtype=dt, requires_grad=requires_grad)

  @staticmethod
  def rand(*shape: Any, dtype: Any = None, device: str | None = None, requires_grad: bool | None = None) -> Tensor:
    """Uniform in [0, 1)."""
    return Tensor._random("rand", shape, dtype, device, requires_grad, lambda g, s, d: g.random(s, dtype=d))

  @staticmethod
  def randn(*shape: Any, dtype: Any = None, device: str | None = None, requires_grad: bool | None = None) -> Tensor:
    """Standard normal."""
    return Tensor._random("randn", shape, dtype, device, requires_grad, lambda g, s, d: g.standard_normal(s, dtype=d))

  @staticmethod
  def uniform(*shape: Any, low: float = 0.0, high: float = 1.0, dtype: Any = None, device: str | None = None,
              requires_grad: bool | None = None) -> Tensor:
    """Uniform in [low, high)."""
    return Tensor._random("uniform", shape, dtype, device, requires_grad,
                          lambda g, s, d: g.uniform(low, high, s).astype(d))

  @staticmethod
  def normal(*shape: Any, mean: float = 0.0, std: float = 1.0, dtype: Any = None, device: str | None = None,
             requires_grad: bool | None = None) -> Tensor:
    return Tensor._random("normal", shape, dtype, device, requires_grad,
                          lambda g, s, d: g.normal(mean, std, s).astype(d))

  @staticmethod
  def randint(*shape: Any, low: int = 0, high: int = 10, dtype: Any = None, device: str | None = None) -> Tensor:
    """Integers uniform in [low, high)."""
    shape, dt = _shape_arg("randint", shape), _dtype_arg("randint", dtype) or dtypes.default_int
    if not (isinstance(low, int) and isinstance(high, int)) or low >= high:
      raise ValueError(f"randint: needs ints low < high, got low={low!r} high={high!r}")
    return Tensor(Tensor._rng().integers(low, high, size=shape, dtype=np.int64), device=device, dtype=dt)

  @staticmethod
  def kaiming_uniform(*shape: Any, a: float = 0.01, **kw: Any) -> Tensor:
    """torch.nn.init.kaiming_uniform_: U(-b, b) with b = sqrt(6 / ((1 + a^2) * fan_in)), fan_in = prod(shape[1:])."""
    shape = _shape_arg("kaiming_uniform", shape)
    bound = math.sqrt(6 / ((1 + a * a) * max(1, prod(shape[1:]))))
    return Tensor.uniform(*shape, low=-bound, high=bound, **kw)

  @staticmethod
  def glorot_uniform(*shape: Any, **kw: Any) -> Tensor:
    """U(-b, b) with b = sqrt(6 / (fan_in + fan_out)) (xavier_uniform_)."""
    shape = _shape_arg("glorot_uniform", shape)
    field = prod(shape[2:])
    bound = math.sqrt(6 / max(1, (shape[0] + (shape[1] if len(shape) > 1 else 1)) * field))
    return Tensor.uniform(*shape, low=-bound, high=bound, **kw)

  # ***** broadcasting and promotion *****
  def _scalar(self, value: Scalar, dtype: DType) -> Tensor:
    return Tensor(LazyBuffer.const(value, dtype, (), self.device))

  def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
    if self.shape == shape: return self
    if not self.requires_grad:
      # a constant with no tape is the same constant at the new shape: skip the reshape and expand steps
      value = self.lazydata.const_value
      if value is not None: return Tensor._wrap(_const_lb(value, self.dtype, shape, self.device), False)
    return self.reshape((1,) * (len(shape) - self.ndim) + self.shape).expand(shape)

  def _to_tensor(self, op: str, x: TensorOrScalar) -> tuple[Tensor, DType]:
    """x as a tensor on self's device, and the dtype `self op x` computes in."""
    if isinstance(x, np.generic): x = x.item()
    if isinstance(x, Tensor):
      if x.device != self.device:
        raise ValueError(f"{op}: tensors are on different devices, {self.device} and {x.device}; move one with .to()")
      return x, _tensor_pair_dtype(self, x)
    if isinstance(x, (bool, int, float)):
      dt = _weak_dtype(self.dtype, x)
      return self._scalar(x, dt), dt
    raise TypeError(f"{op}: can't combine a Tensor with a {type(x).__name__}; use a Tensor or a Python number")

  def _operands(self, op: str, x: TensorOrScalar, reverse: bool = False) -> tuple[Tensor, Tensor]:
    """Both operands of a binary op, promoted to one dtype and broadcast to one shape. Promotion as torch: two
    tensors meet at least_upper_dtype, except that a 0-d tensor with a dimensioned one only raises the category
    (bool < int < float); a Python scalar is weak (a float with an int/bool tensor gives float32, an int with a bool
    tensor gives int64, otherwise the tensor's dtype wins)."""
    if type(x) is float or type(x) is int or type(x) is bool:
      # the common `x * 2.0`: the scalar is made as a constant of self's shape right away (no 0-d tensor to broadcast)
      dt = _weak_dtype(self.dtype, x)
      me = self if dt is self.dtype else self.cast(dt)
      y = Tensor._wrap(_const_lb(x, dt, me.shape, me.device), False)
      return (y, me) if reverse else (me, y)
    y, dt = self._to_tensor(op, x)
    a, b = (y, self) if reverse else (self, y)
    shape = _broadcast_shape(op, a.shape, b.shape)
    return a.cast(dt)._broadcast_to(shape), b.cast(dt)._broadcast_to(shape)

  def _float(self) -> Tensor: return self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)

  # ***** elementwise: arithmetic *****
  def add(self, x: TensorOrScalar, reverse: bool = False) -> Tensor:
    return F.Add.apply(*self._operands("add", x, reverse))

  def sub(self, x: TensorOrScalar, reverse: bool = False) -> Tensor:
    a, b = self._operands("sub", x, reverse)
    if a.dtype is dtypes.bool: raise TypeError("sub: subtracting bool tensors is not supported; use ^ or logical_not")
    return F.Sub.apply(a, b)

  def mul(self, x: TensorOrScalar, reverse: bool = False) -> Tensor:
    return F.Mul.apply(*self._operands("mul", x, reverse))

  def div(self, x: TensorOrScalar, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
    """True division (ints give float32, as torch); rounding_mode 'floor' or 'trunc' rounds the quotient."""
    if rounding_mode == "floor": return self.floor_divide(x, reverse)
    if rounding_mode == "trunc": return self._trunc_divide(x, reverse)
    if rounding_mode is not None:
      raise ValueError(f"div: rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")
    a, b = self._operands("div", x, reverse)
    return F.Div.apply(a._float(), b._float())

  def floor_divide(self, x: TensorOrScalar, reverse: bool = False) -> Tensor:
    """Quotient rounded down (`//`). Not differentiable (as torch)."""
    a, b = self._operands("floor_divide", x, reverse)
    if not dtypes.is_float(a.dtype): return F.NoGradALU.apply(a, b, op=Ops.IDIV)
    return _float_floor_divide(a.detach(), b.detach())

  def _trunc_divide(self, x: TensorOrScalar, reverse: bool) -> Tensor:
    a, b = self._operands("div", x, reverse)
    if dtypes.is_float(a.dtype): return F.Div.apply(a, b).trunc()
    q, r = F.NoGradALU.apply(a, b, op=Ops.IDIV), F.Mod.apply(a, b)
    return ((r != 0) & ((a < 0) != (b < 0))).where(q + 1, q)

  def mod(self, x: TensorOrScalar, reverse: bool = False) -> Tensor:
    """Remainder with the sign of the divisor (`%`, torch.remainder)."""
    a, b = self._operands("mod", x, reverse)
    if a.dtype is dtypes.bool: raise TypeError("mod: not supported for bool tensors")
    return F.Mod.apply(a, b)

  def pow(self, x: TensorOrScalar = None, reverse: bool = False, *, exponent: TensorOrScalar = None) -> Tensor:
    """self ** x. Scalar exponents 2, 0.5, -0.5, -1 take cheaper paths; an int tensor to a nonnegative int power is
    exact (repeated squaring); a negative base to an integer power works, as in torch."""
    x = exponent if x is None else x
    if not reverse and isinstance(x, (int, float)) and not isinstance(x, bool):
      fast = self._pow_scalar(x)
      if fast is not None: return fast
    a, b = self._operands("pow", x, reverse)
    return F.Pow.apply(a, b)

  def _pow_scalar(self, x: int | float) -> Tensor | None:
    if not dtypes.is_float(self.dtype) and isinstance(x, int):
      if x < 0: raise ValueError(f"pow: integers to negative integer powers are not allowed ({self.dtype.name} ** {x})")
      return self._int_pow(x)
    if not dtypes.is_float(self.dtype): return None
    fast = {1: lambda t: t, 2: lambda t: t * t, 0.5: Tensor.sqrt, -0.5: Tensor.rsqrt, -1: Tensor.reciprocal,
            -2: lambda t: (t * t).reciprocal()}
    return fast[x](self) if x in fast else None

  def _int_pow(self, n: int) -> Tensor:
    out, base = Tensor.ones_like(self), self
    while n:
      if n & 1: out = out * base
      n >>= 1
      if n: base = base * base
    return out

  def neg(self) -> Tensor:
    if self.dtype is dtypes.bool: raise TypeError("neg: negating a bool tensor is not supported; use ~ or logical_not")
    return F.Neg.apply(self)

  def __add__(self, x): return self.add(x)
  def __radd__(self, x): return self.add(x, True)
  def __sub__(self, x): return self.sub(x)
  def __rsub__(self, x): return self.sub(x, True)
  def __mul__(self, x): return self.mul(x)
  def __rmul__(self, x): return self.mul(x, True)
  def __truediv__(self, x): return self.div(x)
  def __rtruediv__(self, x): return self.div(x, True)
  def __floordiv__(self, x): return self.floor_divide(x)
  def __rfloordiv__(self, x): return self.floor_divide(x, True)
  def __mod__(self, x): return self.mod(x)
  def __rmod__(self, x): return self.mod(x, True)
  def __pow__(self, x): return self.pow(x)
  def __rpow__(self, x): return self.pow(x, True)
  def __matmul__(self, x): return self.matmul(x)
  def __rmatmul__(self, x): return self.matmul(x, True)
  def __neg__(self): return self.neg()
  def __abs__(self): return self.abs()
  def __pos__(self): return self

  # ***** elementwise: comparisons and logic *****
  def _compare(self, op: str, x: TensorOrScalar, alu: Ops, reverse: bool = False) -> Tensor:
    return F.NoGradALU.apply(*self._operands(op, x, reverse), op=alu)

  def __lt__(self, x): return self._compare("lt", x, Ops.CMPLT)
  def __gt__(self, x): return self._compare("gt", x, Ops.CMPLT, reverse=True)
  def __le__(self, x): return self._compare("le", x, Ops.CMPLT) | self._compare("le", x, Ops.CMPEQ)
  def __ge__(self, x): return self._compare("ge", x, Ops.CMPLT, reverse=True) | self._compare("ge", x, Ops.CMPEQ)

  def __eq__(self, x):  # type: ignore[override]
    return self._compare("eq", x, Ops.CMPEQ) if isinstance(x, (Tensor, bool, int, float, np.generic)) else \
        NotImplemented

  def __ne__(self, x):  # type: ignore[override]
    return self._compare("ne", x, Ops.CMPNE) if isinstance(x, (Tensor, bool, int, float, np.generic)) else \
        NotImplemented

  def lt(self, x): return self < x
  def le(self, x): return self <= x
  def gt(self, x): return self > x
  def ge(self, x): return self >= x
  def eq(self, x): return self == x
  def ne(self, x): return self != x

  def _bitwise(self, op: str, x: TensorOrScalar, alu: Ops, reverse: bool = False, ints_only: bool = False) -> Tensor:
    a, b = self._operands(op, x, reverse)
    if dtypes.is_float(a.dtype) or (ints_only and a.dtype is dtypes.bool):
      kinds = "integer" if ints_only else "bool or integer"
      raise TypeError(f"{op}: bitwise ops need {kinds} tensors, got {a.dtype.name}")
    return F.NoGradALU.apply(a, b, op=alu)

  def bitwise_and(self, x, reverse=False): return self._bitwise("and", x, Ops.AND, reverse)
  def bitwise_or(self, x, reverse=False): return self._bitwise("or", x, Ops.OR, reverse)
  def bitwise_xor(self, x, reverse=False): return self._bitwise("xor", x, Ops.XOR, reverse)
  def lshift(self, x, reverse=False): return self._bitwise("lshift", x, Ops.SHL, reverse, ints_only=True)
  def rshift(self, x, reverse=False): return self._bitwise("rshift", x, Ops.SHR, reverse, ints_only=True)
  __and__, __or__, __xor__, __lshift__, __rshift__ = bitwise_and, bitwise_or, bitwise_xor, lshift, rshift
  def __rand__(self, x): return self.bitwise_and(x, True)
  def __ror__(self, x): return self.bitwise_or(x, True)
  def __rxor__(self, x): return self.bitwise_xor(x, True)
  def __rlshift__(self, x): return self.lshift(x, True)
  def __rrshift__(self, x): return self.rshift(x, True)

  def bitwise_not(self) -> Tensor:
    """`~`: logical not for bool, flipping every bit for ints."""
    if dtypes.is_float(self.dtype): raise TypeError(f"invert: bitwise ops need bool or integer tensors, got "
                                                    f"{self.dtype.name}")
    return F.NoGradALU.apply(self, self._scalar(True if self.dtype is dtypes.bool else -1, self.dtype)
                             ._broadcast_to(self.shape), op=Ops.XOR)
  __invert__ = bitwise_not

  def logical_not(self) -> Tensor: return self.cast(dtypes.bool).bitwise_not()
  def logical_and(self, x: Tensor) -> Tensor: return self.cast(dtypes.bool) & x.cast(dtypes.bool)
  def logical_or(self, x: Tensor) -> Tensor: return self.cast(dtypes.bool) | x.cast(dtypes.bool)
  def logical_xor(self, x: Tensor) -> Tensor: return self.cast(dtypes.bool) ^ x.cast(dtypes.bool)

  def where(self, x: TensorOrScalar, y: TensorOrScalar) -> Tensor:
    """x where self (the condition) is true, else y; `Tensor.where(cond, x, y)` or `cond.where(x, y)`.
    x and y promote like a binary op's operands; all three broadcast."""
    cond = self if self.dtype is dtypes.bool else self != 0
    if isinstance(x, Tensor): xt, (yt, dt) = x, x._to_tensor("where", y)
    elif isinstance(y, Tensor): yt, (xt, dt) = y, y._to_tensor("where", x)
    else: xt, yt, dt = cond._where_scalar(x), cond._where_scalar(y), least_upper_dtype(_py_dtype(x), _py_dtype(y))
    for t in (xt, yt):
      if t.device != cond.device:
        raise ValueError(f"where: tensors are on different devices, {cond.device} and {t.device}; move one with .to()")
    shape = _broadcast_shape("where", cond.shape, xt.shape, yt.shape)
    return F.Where.apply(cond._broadcast_to(shape), xt.cast(dt)._broadcast_to(shape), yt.cast(dt)._broadcast_to(shape))

  def _where_scalar(self, x: Any) -> Tensor:
    if isinstance(x, np.generic): x = x.item()
    if not isinstance(x, (bool, int, float)):
      raise TypeError(f"where: x and y are Tensors or Python numbers, got a {type(x).__name__}")
    return self._scalar(x, dtypes.from_py(x))

  def maximum(self, x: TensorOrScalar = None, *, other: TensorOrScalar = None) -> Tensor:
    """Elementwise max; equal elements share the gradient (as torch). `other=` works too."""
    a, b = self._operands("maximum", other if x is None else x)
    return F.Maximum.apply(a, b)

  def minimum(self, x: TensorOrScalar) -> Tensor:
    a, b = self._operands("minimum", x)
    return a._order_flip().maximum(b._order_flip())._order_flip()

  def _order_flip(self) -> Tensor:
    """An order-reversing map that is its own inverse: -x for floats, ~x for ints and bools (exact, no overflow)."""
    return -self if dtypes.is_float(self.dtype) else ~self

  def clip(self, min_: TensorOrScalar | None = None, max_: TensorOrScalar | None = None, *,
           min: TensorOrScalar | None = None, max: TensorOrScalar | None = None) -> Tensor:  # noqa: A002
    """Values limited to [min_, max_] (either may be None; torch's min=/max= keywords work too); nan stays nan;
    the gradient is 1 inside, 0 outside."""
    min_, max_ = min if min is not None else min_, max if max is not None else max_
    if min_ is None and max_ is None: raise ValueError("clip: give min_, max_ or both")
    x = self
    if min_ is not None: x = (x < min_).where(min_, x)
    if max_ is not None: x = (x > max_).where(max_, x)
    return x
  clamp = clip

  # ***** elementwise: math *****
  def exp(self) -> Tensor: return F.Exp2.apply(self._float() * LOG2_E)
  def exp2(self) -> Tensor: return F.Exp2.apply(self._float())
  def log(self) -> Tensor: return F.Log2.apply(self._float()) * math.log(2)
  def log2(self) -> Tensor: return F.Log2.apply(self._float())
  def log1p(self) -> Tensor: return (self + 1).log()
  def expm1(self) -> Tensor: return self.exp() - 1
  def sqrt(self) -> Tensor: return F.Sqrt.apply(self._float())
  def rsqrt(self) -> Tensor: return self.sqrt().reciprocal()
  def reciprocal(self) -> Tensor: return F.Reciprocal.apply(self._float())
  def square(self) -> Tensor: return self * self
  def sin(self) -> Tensor: return F.Sin.apply(self._float())
  def cos(self) -> Tensor: return ((math.pi / 2) - self._float()).sin()
  def tan(self) -> Tensor: return self.sin() / self.cos()

  def abs(self) -> Tensor:
    """|x|, with gradient sign(x) (0 at 0, as torch)."""
    if self.dtype is dtypes.bool or dtypes.is_unsigned(self.dtype): return self
    return self.relu() + (-self).relu()

  def sign(self) -> Tensor:
    """-1, 0 or 1 in self's dtype (bools stay bools); not differentiable."""
    if self.dtype is dtypes.bool: return self
    return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)

  def trunc(self) -> Tensor: return F.Trunc.apply(self) if dtypes.is_float(self.dtype) else self

  def floor(self) -> Tensor:
    t = self.trunc()
    return (self < t).where(t - 1, t) if dtypes.is_float(self.dtype) else t

  def ceil(self) -> Tensor:
    t = self.trunc()
    return (self > t).where(t + 1, t) if dtypes.is_float(self.dtype) else t

  def round(self) -> Tensor:
    """Round half to even, as torch."""
    if not dtypes.is_float(self.dtype): return self
    f = self.floor()
    frac = self - f
    return (frac > 0.5).where(f + 1, (frac < 0.5).where(f, f + f % 2))

  def erf(self) -> Tensor:
    """Abramowitz & Stegun 7.1.26 (abs error < 2e-7): erf(|x|) = 1 - t*P(t)*exp(-x^2), t = 1/(1 + 0.3275911|x|)."""
    x = self._float()
    ax = (x < 0).where(-x, x)
    t = 1 / (1 + 0.3275911 * ax)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    e = 1 - poly * (-(ax * ax)).exp()
    return (x < 0).where(-e, e)

  # ***** activations *****
  def relu(self) -> Tensor: return F.Relu.apply(self)
  def sigmoid(self) -> Tensor: return F.Sigmoid.apply(self._float())
  def tanh(self) -> Tensor: return 2.0 * (2.0 * self._float()).sigmoid() - 1.0
  def silu(self) -> Tensor: return self * self.sigmoid()
  swish = silu
  def relu6(self) -> Tensor: return self.hardtanh(0, 6)
  def hardsigmoid(self) -> Tensor: return self.hardtanh(-3, 3) / 6 + 0.5
  def hardswish(self) -> Tensor:
    """x * relu6(x + 3) / 6, with torch's gradient at the kinks (0 at -3, 1 at 3)."""
    return (self <= -3).where(0, (self >= 3).where(self, self * (self + 3) / 6))
  def leakyrelu(self, neg_slope: float = 0.01) -> Tensor: return (self > 0).where(self, self * neg_slope)
  leaky_relu = leakyrelu
  def softsign(self) -> Tensor: return self / (1 + self.abs())
  def mish(self) -> Tensor: return self * self.softplus().tanh()
  def logsigmoid(self) -> Tensor: return -(-self).softplus()

  def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """Clip whose gradient is 0 at the limits too (as torch's hardtanh and relu6)."""
    return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))

  def elu(self, alpha: float = 1.0) -> Tensor:
    # exp sees only x <= 0, so large x can't make an inf that poisons the gradient
    return (self > 0).where(self, alpha * ((self > 0).where(0.0, self).exp() - 1))

  def celu(self, alpha: float = 1.0) -> Tensor:
    return (self > 0).where(self, alpha * ((self > 0).where(0.0, self / alpha).exp() - 1))

  def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta*x)) / beta, and x itself where beta*x > threshold (as torch)."""
    bx = self._float() * beta
    linear = bx > threshold
    return linear.where(self._float(), (1 + linear.where(0.0, bx).exp()).log() / beta)

  def gelu(self, approximate: str = "none") -> Tensor:
    """x * Phi(x) with the exact erf (torch's default), or the tanh approximation with approximate='tanh'."""
    if approximate == "tanh":
      return 0.5 * self * (1 + (math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).tanh())
    if approximate != "none": raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * self * (1 + (self * (1 / math.sqrt(2))).erf())

  def quick_gelu(self) -> Tensor: return self * (self * 1.702).sigmoid()

  def dropout(self, p: float = 0.5) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p), only while Tensor.training."""
    if not 0 <= p <= 1: raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not Tensor.training or p == 0: return self
    if p == 1: return self * 0
    keep = Tensor.rand(*self.shape, device=self.device) >= p
    return keep.where(self * (1 / (1 - p)), 0.0)

  # ***** reductions *****
  def _axes(self, op: str, axis: Any) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    axes = tuple(_axis(op, a, self.ndim) for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
    if len(set(axes)) != len(axes): raise ValueError(f"{op}: axis {axis} names a dim more than once")
    return axes if self.ndim else ()

  def _reduce(self, fn: type[F.Function], op: str, axis: Any, keepdim: bool) -> Tensor:
    axes = self._axes(op, axis)
    out = fn.apply(self, axis=axes) if axes else self
    return out if keepdim else out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def sum(self, axis: Any = None, keepdim: bool = False, dtype: Any = None, *, dim: Any = None) -> Tensor:
    """Sum over axis (int, tuple, None for all). Bools and ints sum to int64 (sum_acc_dtype, as torch); float16 and
    bfloat16 accumulate in float32 and come back in their own dtype."""
    axis = dim if dim is not None else axis
    out_dt = _dtype_arg("sum", dtype) or sum_acc_dtype(self.dtype)
    acc = dtypes.float32 if out_dt in HALF_FLOATS else out_dt
    return self.cast(acc)._reduce(F.Sum, "sum", axis, keepdim).cast(out_dt)

  def max(self, axis: Any = None, keepdim: bool = False, *, dim: Any = None) -> Tensor:
    """Max over axis (torch.amax: values only; the gradient is split evenly among ties)."""
    axis = dim if dim is not None else axis
    for a in self._axes("max", axis):
      if self.shape[a] == 0: raise ValueError(f"max: can't reduce dim {a} of size 0 of a {_fmt(self.shape)} tensor")
    return self._reduce(F.Max, "max", axis, keepdim)

  def min(self, axis: Any = None, keepdim: bool = False, *, dim: Any = None) -> Tensor:
    self._axes("min", dim if dim is not None else axis)
    return self._order_flip().max(axis, keepdim, dim=dim)._order_flip()

  amax, amin = max, min

  def _count(self, op: str, axis: Any) -> int: return int(prod(self.shape[a] for a in self._axes(op, axis)))

  def mean(self, axis: Any = None, keepdim: bool = False, *, dim: Any = None) -> Tensor:
    """Mean over axis. Integer and bool tensors are promoted to float32 first (torch would raise)."""
    axis = dim if dim is not None else axis
    self._axes("mean", axis)
    x = self._float()
    acc = dtypes.float32 if x.dtype in HALF_FLOATS else x.dtype
    return (x.sum(axis, keepdim, dtype=acc) / self._count("mean", axis)).cast(x.dtype)

  def var(self, axis: Any = None, keepdim: bool = False, correction: int = 1, *, dim: Any = None,
          unbiased: bool | None = None) -> Tensor:
    """Variance with Bessel's correction by default (divides by N - correction, as torch)."""
    axis = dim if dim is not None else axis
    correction = correction if unbiased is None else int(unbiased)
    self._axes("var", axis)
    x = self._float()
    sq = (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim)
    return sq / max(0, self._count("var", axis) - correction)

  def std(self, axis: Any = None, keepdim: bool = False, correction: int = 1, *, dim: Any = None,
          unbiased: bool | None = None) -> Tensor:
    var = self.var(axis, keepdim, correction, dim=dim, unbiased=unbiased)
    # where the variance is 0 the sqrt's gradient is infinite; torch's std gradient is 0 there, not NaN
    zero = var == 0
    return zero.where(0, zero.where(1, var).sqrt())

  def prod(self, axis: Any = None, keepdim: bool = False, *, dim: Any = None) -> Tensor:
    """Product over axis, by halving the axis with elementwise multiplies (log2(n) steps, exact for ints)."""
    axis = dim if dim is not None else axis
    out = self.cast(sum_acc_dtype(self.dtype))
    for a in sorted(self._axes("prod", axis), reverse=True):
      while out.shape[a] > 1:
        n = out.shape[a]
        half = (n + 1) // 2
        lo = out.shrink(tuple((0, half) if i == a else None for i in range(out.ndim)))
        hi = out.shrink(tuple((half, n) if i == a else None for i in range(out.ndim)))
        out = lo * hi.pad(tuple((0, half - (n - half)) if i == a else None for i in range(out.ndim)), value=1)
      if out.shape[a] == 0: out = Tensor.ones(*[1 if i == a else s for i, s in enumerate(out.shape)],
                                              dtype=out.dtype, device=out.device)
    return out if keepdim else out.reshape(tuple(s for i, s in enumerate(out.shape) if i not in
                                                 self._axes("prod", axis)))

  def any(self, axis: Any = None, keepdim: bool = False, *, dim: Any = None) -> Tensor:
    return (self != 0)._reduce(F.Max, "any", dim if dim is not None else axis, keepdim)

  def all(self, axis: Any = None, keepdim: bool = False, *, dim: Any = None) -> Tensor:
    return ~(self == 0)._reduce(F.Max, "all", dim if dim is not None else axis, keepdim)

  def argmax(self, axis: int | None = None, keepdim: bool = False, *, dim: int | None = None) -> Tensor:
    """Index of the first max along axis (of the flattened tensor when None), as int64."""
    axis = dim if dim is not None else axis
    if axis is None: return self.flatten().argmax(0).reshape((1,) * self.ndim if keepdim else ())
    a = _axis("argmax", axis, self.ndim)
    x = self.detach() if self.ndim else self.detach().reshape(1)
    n = x.shape[a]
    if n == 0: raise ValueError(f"argmax: can't reduce dim {a} of size 0 of a {_fmt(self.shape)} tensor")
    countdown = Tensor.arange(n, 0, -1, device=self.device).reshape(*[n if i == a else 1 for i in range(x.ndim)])
    is_max = x == x.max(a, keepdim=True)
    if dtypes.is_float(x.dtype): is_max = is_max | (x != x)   # a nan is the max, as in torch
    first = is_max.where(countdown, 0).max(a, keepdim=keepdim)
    return (n - first).reshape(()) if self.ndim == 0 else n - first

  def argmin(self, axis: int | None = None, keepdim: bool = False, *, dim: int | None = None) -> Tensor:
    self._axes("argmin", dim if dim is not None else axis)
    return self._order_flip().argmax(axis, keepdim, dim=dim)

  def logsumexp(self, axis: Any = None, keepdim: bool = False, *, dim: Any = None) -> Tensor:
    axis = dim if dim is not None else axis
    self._axes("logsumexp", axis)
    x = self._float()
    m = x.max(axis, keepdim=True)
    m = (m.abs() == math.inf).where(0.0, m).detach()
    out = (x - m).exp().sum(axis, keepdim=True).log() + m
    return out if keepdim else out.reshape(tuple(s for i, s in enumerate(x.shape) if i not in self._axes("", axis)))

  def softmax(self, axis: int = -1, *, dim: int | None = None) -> Tensor:
    axis = dim if dim is not None else axis
    self._axes("softmax", axis)
    x = self._float()
    e = (x - x.max(axis, keepdim=True).detach()).exp()
    return e * e.sum(axis, keepdim=True).reciprocal()   # one division per row, as torch does, not one per element

  def log_softmax(self, axis: int = -1, *, dim: int | None = None) -> Tensor:
    axis = dim if dim is not None else axis
    self._axes("log_softmax", axis)
    x = self._float()
    shifted = x - x.max(axis, keepdim=True).detach()
    return shifted - shifted.exp().sum(axis, keepdim=True).log()

  def cumsum(self, axis: int = 0, *, dim: int | None = None) -> Tensor:
    """Running sum along axis. Each output is a window sum over a padded view of the input; axes longer than 256
    are split into blocks, whose running totals are added back, so the work stays near n*sqrt(n)."""
    axis = dim if dim is not None else axis
    if self.ndim == 0: return self.sum()
    a = _axis("cumsum", axis, self.ndim)
    x = self.cast(sum_acc_dtype(self.dtype)).transpose(a, -1)
    return x._cumsum_last().transpose(a, -1)

  def _cumsum_last(self) -> Tensor:
    n, lead = self.shape[-1], self.shape[:-1]
    keep, unpadded = tuple((0, s) for s in lead), (None,) * len(lead)
    if n <= 256:
      if n == 0: return self
      return _window_last(self.pad(unpadded + ((n - 1, 0),)), n, 1, 1).sum(-1, dtype=self.dtype)
    block = math.isqrt(n - 1) + 1
    nb = -(-n // block)
    blocks = self.pad(unpadded + ((0, nb * block - n),)).reshape(*lead, nb, block)
    inner = blocks._cumsum_last()
    before = blocks.sum(-1, dtype=self.dtype)._cumsum_last().pad(unpadded + ((1, 0),)).shrink(keep + ((0, nb),))
    return (inner + before.unsqueeze(-1)).reshape(*lead, nb * block).shrink(keep + ((0, n),))

  # ***** movement *****
  def reshape(self, *shape: Any, **kw: Any) -> Tensor:
    """A view of the same elements in a new shape; one dim may be -1 (inferred). `shape=` works too, as torch."""
    new = argfix(_keyword("reshape", kw, "shape")) if kw else argfix(*shape)
    if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in new):
      raise TypeError(f"reshape: a shape is ints, got {new!r}")
    new = tuple(int(s) for s in new)
    if new.count(-1) > 1 or any(s < -1 for s in new):
      raise ValueError(f"reshape: {_fmt(new)} may have one -1 and no other negative sizes")
    numel = self.numel()
    if -1 in new:
      known = prod(s for s in new if s != -1)
      if known == 0 or numel % known:
        raise ValueError(f"reshape: can't reshape {_fmt(self.shape)} ({numel} elements) to {_fmt(new)}")
      new = tuple(numel // known if s == -1 else s for s in new)
    if prod(new) != numel:
      raise ValueError(f"reshape: can't reshape {_fmt(self.shape)} ({numel} elements) to {_fmt(new)} "
                       f"({prod(new)} elements)")
    return self if new == self.shape else F.Reshape.apply(self, shape=new)

  view = reshape

  def permute(self, *order: Any, **kw: Any) -> Tensor:
    order = argfix(_keyword("permute", kw, "dims")) if kw else argfix(*order)
    if len(order) != self.ndim:
      raise ValueError(f"permute: {_fmt(order)} is not a permutation of the {self.ndim} dims of a "
                       f"{_fmt(self.shape)} tensor")
    norm = tuple(_axis("permute", o, self.ndim) for o in order)
    if sorted(norm) != list(range(self.ndim)):
      raise ValueError(f"permute: {_fmt(order)} is not a permutation of the {self.ndim} dims of a "
                       f"{_fmt(self.shape)} tensor")
    return self if norm == tuple(range(self.ndim)) else F.Permute.apply(self, order=norm)

  def expand(self, *shape: Any, **kw: Any) -> Tensor:
    """Repeat size-1 dims (no copy); -1 keeps a dim; new dims may be added in front, as torch."""
    new = argfix(_keyword("expand", kw, "size")) if kw else argfix(*shape)
    if len(new) < self.ndim:
      raise ValueError(f"expand: can't expand {_fmt(self.shape)} to {_fmt(new)}: fewer dims than the tensor")
    lead = len(new) - self.ndim
    out = []
    for i, n in enumerate(new):
      s = self.shape[i - lead] if i >= lead else 1
      if n == -1 and i >= lead: n = s
      if not isinstance(n, int) or n < 0 or not (s == n or s == 1):
        raise ValueError(f"expand: can't expand {_fmt(self.shape)} to {_fmt(new)}: dim {i} has size {s}; only "
                         "size-1 dims can grow")
      out.append(n)
    x = self.reshape((1,) * lead + self.shape) if lead else self
    return x if tuple(out) == x.shape else F.Expand.apply(x, shape=tuple(out))

  def _pad_pairs(self, padding: Any) -> tuple[tuple[int, int], ...]:
    """((before, after) or None per dim from the first), or a flat torch F.pad list (last dim first)."""
    padding = tuple(padding)
    if all(isinstance(p, int) for p in padding):
      if len(padding) % 2 or len(padding) > 2 * self.ndim:
        raise ValueError(f"pad: a flat padding has (before, after) pairs for up to {self.ndim} dims, got "
                         f"{padding}")
      pairs = [(padding[2 * i], padding[2 * i + 1]) for i in range(len(padding) // 2)][::-1]
      return ((0, 0),) * (self.ndim - len(pairs)) + tuple(pairs)
    if len(padding) != self.ndim or not all(p is None or (len(p) == 2 and all_int(p)) for p in padding):
      raise ValueError(f"pad: padding {padding} needs one (before, after) pair or None for each of the {self.ndim} "
                       f"dims of a {_fmt(self.shape)} tensor")
    return tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)

  def pad(self, padding: Any, mode: str = "constant", value: Scalar = 0.0) -> Tensor:
    """Pad with `value`. `padding` is ((before, after) or None, ...) per dim from the first (tinygrad), or a flat
    (last_before, last_after, ...) as torch's F.pad. Negative amounts cut, as in F.pad."""
    if mode != "constant": raise ValueError(f"pad: mode {mode!r} is not supported; valid: 'constant'")
    pairs = self._pad_pairs(padding)
    x = self
    if any(b < 0 or a < 0 for b, a in pairs):
      cut = tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pairs, self.shape))
      if any(lo > hi for lo, hi in cut):
        raise ValueError(f"pad: padding {pairs} cuts more than the {_fmt(self.shape)} tensor has")
      x, pairs = x.shrink(cut), tuple((max(0, b), max(0, a)) for b, a in pairs)
    if all(p == (0, 0) for p in pairs): return x
    out = F.Pad.apply(x, arg=pairs)
    if value == 0: return out
    inside = Tensor.full(x.shape, True, dtypes.bool, x.device).pad(pairs)
    return inside.where(out, out._scalar(value, out.dtype))

  def pad2d(self, padding: Sequence[int], value: Scalar = 0.0) -> Tensor:
    """Pad the last two dims: padding = (left, right, top, bottom), as torch's F.pad."""
    if len(padding) != 4: raise ValueError(f"pad2d: padding is (left, right, top, bottom), got {tuple(padding)}")
    return self.pad(tuple(padding), value=value)

  def shrink(self, arg: Any) -> Tensor:
    """Keep [start, end) of each dim (None keeps a dim whole)."""
    if len(arg) != self.ndim:
      raise ValueError(f"shrink: {arg} needs one (start, end) or None per dim of a {_fmt(self.shape)} tensor")
    pairs = tuple((0, s) if p is None else (int(p[0]), int(p[1])) for p, s in zip(arg, self.shape))
    for i, ((lo, hi), s) in enumerate(zip(pairs, self.shape)):
      if not 0 <= lo <= hi <= s:
        raise ValueError(f"shrink: can't keep [{lo}, {hi}) of dim {i} of a {_fmt(self.shape)} tensor (need "
                         f"0 <= start <= end <= {s})")
    return self if all(p == (0, s) for p, s in zip(pairs, self.shape)) else F.Shrink.apply(self, arg=pairs)

  def flip(self, *dims: Any, **kw: Any) -> Tensor:
    dims = argfix(_keyword("flip", kw, "dims")) if kw else argfix(*dims)
    axes = tuple(_axis("flip", d, self.ndim) for d in dims)
    if len(set(axes)) != len(axes): raise ValueError(f"flip: dims {dims} name a dim more than once")
    return F.Flip.apply(self, axis=axes) if axes and self.ndim else self

  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    a, b = _axis("transpose", dim0, self.ndim), _axis("transpose", dim1, self.ndim)
    if self.ndim < 2: return self
    order = list(range(self.ndim))
    order[a], order[b] = order[b], order[a]
    return self.permute(order)

  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    s, e = _axis("flatten", start_dim, self.ndim), _axis("flatten", end_dim, self.ndim)
    if s > e: raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    return self.reshape(*self.shape[:s], prod(self.shape[s:e + 1]), *self.shape[e + 1:])

  def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
    d = _axis("unflatten", dim, self.ndim)
    return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1:])

  def squeeze(self, dim: Any = None) -> Tensor:
    """Drop size-1 dims (all of them, or those in dim; others are left alone, as torch)."""
    axes = range(self.ndim) if dim is None else self._axes("squeeze", dim)
    drop = {a for a in axes if self.shape[a] == 1}
    return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in drop))

  def unsqueeze(self, dim: int) -> Tensor:
    d = _axis("unsqueeze", dim, self.ndim + 1)
    return self.reshape(*self.shape[:d], 1, *self.shape[d:])

  def repeat(self, *repeats: Any) -> Tensor:
    """Tile the tensor: dim i grows repeats[i] times (torch.Tensor.repeat; extra leading repeats add dims)."""
    reps = argfix(*repeats)
    if len(reps) < self.ndim or not all(isinstance(r, int) and r >= 0 for r in reps):
      raise ValueError(f"repeat: needs at least {self.ndim} repeat counts >= 0 for a {_fmt(self.shape)} tensor, got "
                       f"{reps}")
    shape = (1,) * (len(reps) - self.ndim) + self.shape
    paired = flatten([(1, s) for s in shape])
    tiled = flatten([(r, s) for r, s in zip(reps, shape)])
    return self.reshape(paired).expand(tiled).reshape(*[r * s for r, s in zip(reps, shape)])

  def cat(*tensors: Any, dim: int = 0) -> Tensor:
    """Join along dim: `x.cat(y, z, dim=1)` or `Tensor.cat([x, y], dim=1)`. Each input is padded to the full size
    and the pads are added, so the whole concat is one elementwise kernel."""
    ts = list(tensors[0]) + list(tensors[1:]) if tensors and isinstance(tensors[0], (list, tuple)) else list(tensors)
    if not ts or not all(isinstance(t, Tensor) for t in ts): raise TypeError("cat: needs a non-empty list of Tensors")
    first = ts[0]
    if first.ndim == 0: raise ValueError("cat: zero-dimensional tensors can't be concatenated; use stack")
    d = _axis("cat", dim, first.ndim)
    for i, t in enumerate(ts):
      if t.ndim != first.ndim or any(a != b for j, (a, b) in enumerate(zip(t.shape, first.shape)) if j != d):
        raise ValueError(f"cat: tensor {i} has shape {_fmt(t.shape)} but tensor 0 has {_fmt(first.shape)}; all "
                         f"sizes but dim {d} must match")
      if t.device != first.device:
        raise ValueError(f"cat: tensor {i} is on {t.device} but tensor 0 is on {first.device}; move one with .to()")
    dt = least_upper_dtype(*[t.dtype for t in ts])
    total, offset, out = sum(t.shape[d] for t in ts), 0, None
    for t in ts:
      padded = t.cast(dt).pad(tuple((offset, total - offset - t.shape[d]) if i == d else None
                                    for i in range(t.ndim)))
      out = padded if out is None else out + padded
      offset += t.shape[d]
    return out

  def stack(*tensors: Any, dim: int = 0) -> Tensor:
    """Join along a new dim: `x.stack(y, dim=0)` or `Tensor.stack([x, y])`."""
    ts = list(tensors[0]) + list(tensors[1:]) if tensors and isinstance(tensors[0], (list, tuple)) else list(tensors)
    if not ts or not all(isinstance(t, Tensor) for t in ts): raise TypeError("stack: needs a non-empty list of Tensors")
    for i, t in enumerate(ts):
      if t.shape != ts[0].shape:
        raise ValueError(f"stack: tensor {i} has shape {_fmt(t.shape)} but tensor 0 has {_fmt(ts[0].shape)}; all "
                         "must match")
    d = _axis("stack", dim, ts[0].ndim + 1)
    return Tensor.cat([t.unsqueeze(d) for t in ts], dim=d)

  def split(self, sizes: int | Sequence[int], dim: int = 0) -> list[Tensor]:
    """Pieces along dim of `sizes` each (an int: equal pieces, the last maybe smaller), as torch.split."""
    d = _axis("split", dim, self.ndim)
    n = self.shape[d]
    if isinstance(sizes, int):
      if sizes <= 0: raise ValueError(f"split: split size must be positive, got {sizes}")
      sizes = [min(sizes, n - i) for i in range(0, n, sizes)] or [0]
    if sum(sizes) != n or any(s < 0 for s in sizes):
      raise ValueError(f"split: sizes {list(sizes)} don't add up to {n}, the size of dim {d}")
    out, start = [], 0
    for s in sizes:
      out.append(self.shrink(tuple((start, start + s) if i == d else None for i in range(self.ndim))))
      start += s
    return out

  def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
    """At most `chunks` pieces of ceil(n / chunks) along dim, as torch.chunk."""
    if not isinstance(chunks, int) or chunks <= 0:
      raise ValueError(f"chunk: chunks must be a positive int, got {chunks}")
    n = self.shape[_axis("chunk", dim, self.ndim)]
    return self.split(max(1, -(-n // chunks)), dim)

  def contiguous(self) -> Tensor: return F.Contiguous.apply(self)

  # ***** indexing *****
  def __getitem__(self, index: Any) -> Tensor:
    """Ints, slices (any step), None, Ellipsis, and int tensors/lists (numpy advanced indexing; bool masks are turned
    into index tensors, which realizes the mask). Basic indices are views; tensor indices are a one-hot compare
    and a sum, so they stay lazy and fuse. Out-of-range values inside index tensors select nothing (give 0)."""
    items = self._index_items(index)
    x, adv = self._basic_index(items)
    return x._advanced_index(adv) if adv else x

  def _index_items(self, index: Any) -> list[Any]:
    items = list(index) if isinstance(index, tuple) else [index]
    out: list[Any] = []
    for it in items:
      if isinstance(it, (list, np.ndarray)): it = Tensor(it, device=self.device)
      if isinstance(it, Tensor) and it.dtype is dtypes.bool:
        out.extend(Tensor(ix, device=self.device) for ix in np.nonzero(it.numpy()))
        continue
      if isinstance(it, Tensor) and not dtypes.is_int(it.dtype):
        raise IndexError(f"getitem: tensors used as indices must be integer or bool, not {it.dtype.name}")
      if isinstance(it, np.integer): it = int(it)
      if not (it is None or it is Ellipsis or isinstance(it, (int, slice, Tensor))) or isinstance(it, bool):
        raise TypeError(f"getitem: can't index with a {type(it).__name__}; use ints, slices, None, ..., or int "
                        "tensors/lists")
      out.append(it)
    if sum(it is Ellipsis for it in out) > 1: raise IndexError("getitem: an index can have only one ellipsis (...)")
    used = sum(it is not None and it is not Ellipsis for it in out)
    if used > self.ndim: raise IndexError(f"getitem: too many indices for a {self.ndim}-d tensor: {used} given")
    fill = [slice(None)] * (self.ndim - used)
    if Ellipsis in out:
      at = out.index(Ellipsis)
      return out[:at] + fill + out[at + 1:]
    return out + fill

  def _basic_index(self, items: list[Any]) -> tuple[Tensor, list[tuple[int, Tensor]]]:
    """Apply ints, slices and None as shrink + flip + stride + reshape; return the tensor indices with the dim of
    the result they index."""
    cut, flips, steps, shape, adv = [], [], [], [], []
    dim = 0
    for it in items:
      if it is None:
        shape.append(1)
        continue
      size = self.shape[dim]
      if isinstance(it, int):
        i = it + size if it < 0 else it
        if not 0 <= i < size:
          raise IndexError(f"getitem: index {it} is out of range for dim {dim} of size {size}")
        cut.append((i, i + 1))
        steps.append(1)
      elif isinstance(it, slice):
        lo, hi, n, step = _slice_window(it, size)
        cut.append((lo, hi))
        steps.append(abs(step))
        if step < 0: flips.append(dim)
        shape.append(n)
      else:
        cut.append((0, size))
        steps.append(1)
        adv.append((len(shape), it))
        shape.append(size)
      dim += 1
    x = self.shrink(tuple(cut)).flip(*flips)
    if any(s != 1 for s in steps): x = F.Stride.apply(x, steps=tuple(steps))
    return x.reshape(*shape), adv

  def _advanced_index(self, adv: list[tuple[int, Tensor]]) -> Tensor:
    """Numpy advanced indexing by one-hot: the index tensors broadcast to B; result[b..., rest...] is the sum over
    the indexed dims of x where every index equals its position. B goes where the indexed dims were when they
    are adjacent, else in front."""
    adv = [(d, idx.to(self.device)) for d, idx in adv]   # as torch, index tensors may live on another device
    dims = [d for d, _ in adv]
    bshape = _broadcast_shape("getitem", *[idx.shape for _, idx in adv])
    rest = [d for d in range(self.ndim) if d not in dims]
    nb, nr, k = len(bshape), len(rest), len(adv)
    x = self.permute(rest + dims).reshape((1,) * nb + tuple(self.shape[d] for d in rest + dims))
    hit = None
    for j, (d, idx) in enumerate(adv):
      n = self.shape[d]
      idx = (idx < 0).where(idx + n, idx)._broadcast_to(bshape).reshape(bshape + (1,) * (nr + k))
      where_j = Tensor.arange(n, device=self.device).reshape((1,) * (nb + nr + j) + (n,) + (1,) * (k - j - 1))
      hit = (idx == where_j) if hit is None else hit & (idx == where_j)
    out = hit.where(x, x._scalar(0, x.dtype)).sum(tuple(range(nb + nr, nb + nr + k)), dtype=x.dtype)
    if dims != list(range(dims[0], dims[0] + k)) or dims[0] == 0: return out
    at = dims[0]
    order = list(range(nb, nb + at)) + list(range(nb)) + list(range(nb + at, nb + nr))
    return out.permute(order)

  def gather(self, dim: int, index: Tensor) -> Tensor:
    """out[i][j] = self[index[i][j]][j] for dim 0 (torch.gather): index has self's ndim and no larger size in
    the other dims."""
    d = _axis("gather", dim, self.ndim)
    if not isinstance(index, Tensor) or not dtypes.is_int(index.dtype):
      raise TypeError(f"gather: index must be an integer tensor, got {getattr(index, 'dtype', type(index).__name__)}")
    if index.ndim != self.ndim or any(i > s for j, (i, s) in enumerate(zip(index.shape, self.shape)) if j != d):
      raise ValueError(f"gather: index of shape {_fmt(index.shape)} doesn't fit a {_fmt(self.shape)} tensor along dim "
                       f"{d}: it needs {self.ndim} dims, each no larger than the tensor's except dim {d}")
    n = self.shape[d]
    x = self.shrink(tuple(None if j == d else (0, i) for j, i in enumerate(index.shape)))
    x = x.unsqueeze(-1).transpose(d, -1)
    idx = (index < 0).where(index + n, index).unsqueeze(-1)
    hit = idx == Tensor.arange(n, device=self.device).reshape((1,) * self.ndim + (n,))
    return hit.where(x, x._scalar(0, x.dtype)).sum(-1, dtype=x.dtype)

  def one_hot(self, num_classes: int) -> Tensor:
    """int64 one-hot vectors along a new last dim."""
    if not dtypes.is_int(self.dtype): raise TypeError(f"one_hot: needs an integer tensor, not {self.dtype.name}")
    classes = Tensor.arange(num_classes, device=self.device).reshape((1,) * self.ndim + (num_classes,))
    return (self.unsqueeze(-1) == classes).cast(dtypes.int64)

  # ***** matmul and convolution *****
  def matmul(self, x: Tensor, reverse: bool = False) -> Tensor:
    """torch.matmul: 1-d operands gain (and lose) a dim, batch dims broadcast. One broadcasted multiply and a sum
    over the last axis, so it is one kernel."""
    a, b = (x, self) if reverse else (self, x)
    if not isinstance(a, Tensor) or not isinstance(b, Tensor): raise TypeError("matmul: both operands must be Tensors")
    if a.ndim == 0 or b.ndim == 0:
      raise ValueError(f"matmul: both operands need at least 1 dim, got {_fmt(a.shape)} @ {_fmt(b.shape)}")
    k_a, k_b = a.shape[-1], b.shape[-2] if b.ndim > 1 else b.shape[0]
    if k_a != k_b:
      raise ValueError(f"matmul: {_fmt(a.shape)} @ {_fmt(b.shape)}: inner dims {k_a} and {k_b} differ")
    a2 = a.reshape(1, k_a) if a.ndim == 1 else a
    b2 = b.reshape(k_b, 1) if b.ndim == 1 else b
    _broadcast_shape("matmul", a2.shape[:-2], b2.shape[:-2])
    n, m = a2.shape[-2], b2.shape[-1]
    out_dt = least_upper_dtype(a.dtype, b.dtype)
    prod_ = a2.reshape(*a2.shape[:-2], n, 1, k_a) * b2.transpose(-1, -2).reshape(*b2.shape[:-2], 1, m, k_b)
    out = prod_.sum(-1, dtype=out_dt)
    if a.ndim == 1: out = out.squeeze(-2)
    if b.ndim == 1: out = out.squeeze(-1)
    return out

  dot = matmul

  def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """torch's F.linear: self @ weight.T + bias, weight of shape (out_features, in_features)."""
    out = self @ weight.T
    return out if bias is None else out + bias

  def _pool(self, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
    """Sliding windows over the last len(kernel) dims: (..., i1, i2) -> (..., o1, o2, k1, k2), all views."""
    n, lead = len(kernel), self.ndim - len(kernel)
    x = self
    for k, s, d in zip(kernel, stride, dilation):
      x = _window_last(x.permute(*[i for i in range(x.ndim) if i != lead], lead), k, s, d)
    return x.permute(*range(lead), *[lead + 2 * j for j in range(n)], *[lead + 2 * j + 1 for j in range(n)])

  def _pool_args(self, op: str, kernel_size: Any, stride: Any, padding: Any, dilation: Any, n: int = 2):
    k = make_pair(kernel_size, n)
    s = k if stride is None else make_pair(stride, n)
    p, d = make_pair(padding, n), make_pair(dilation, n)
    if any(len(t) != n for t in (k, s, p, d)):
      raise ValueError(f"{op}: kernel_size, stride, padding and dilation are ints or {n}-tuples, got {k}, {s}, {p}, "
                       f"{d}")
    if any(v <= 0 for v in k + s + d) or any(v < 0 for v in p):
      raise ValueError(f"{op}: kernel_size, stride and dilation must be positive and padding >= 0, got {k}, {s}, "
                       f"{p}, {d}")
    if self.ndim < n + 1:
      raise ValueError(f"{op}: input of shape {_fmt(self.shape)} needs at least {n + 1} dims ((N,) C, H, W)")
    spatial = self.shape[-n:]
    for i, kk, pp, dd in zip(spatial, k, p, d):
      if i + 2 * pp < dd * (kk - 1) + 1:
        raise ValueError(f"{op}: kernel {k} (dilation {d}) is larger than the padded input {spatial} "
                         f"(padding {p})")
    return k, s, p, d

  def _spatial_pad(self, p: tuple[int, ...], value: Scalar = 0.0) -> Tensor:
    return self.pad(((0, 0),) * (self.ndim - len(p)) + tuple((q, q) for q in p), value=value)

  def avg_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, padding: Any = 0,
                 count_include_pad: bool = True) -> Tensor:
    """Mean over windows of the last two dims; padded zeros count toward the mean unless count_include_pad=False."""
    k, s, p, d = self._pool_args("avg_pool2d", kernel_size, stride, padding, 1)
    windows = self._float()._spatial_pad(p)._pool(k, s, d)
    if count_include_pad or not any(p): return windows.mean((-1, -2))
    ones = Tensor.ones(*self.shape[-2:], device=self.device)._spatial_pad(p)._pool(k, s, d)
    return windows.sum((-1, -2)) / ones.sum((-1, -2))

  def max_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, padding: Any = 0, dilation: Any = 1) -> Tensor:
    """Max over windows of the last two dims; padding never wins (it is -inf, or the dtype's minimum for ints)."""
    k, s, p, d = self._pool_args("max_pool2d", kernel_size, stride, padding, dilation)
    if any(pp > kk // 2 for pp, kk in zip(p, k)):
      raise ValueError(f"max_pool2d: padding {p} must be at most half the kernel {k}")
    low = -math.inf if dtypes.is_float(self.dtype) else dtypes.min(self.dtype)
    return self._spatial_pad(p, low)._pool(k, s, d).max((-1, -2))

  def conv2d(self, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
             groups: int = 1) -> Tensor:
    """torch's conv2d (and conv1d/conv3d: the spatial rank comes from weight): input (N, Cin, *spatial) or
    (Cin, *spatial), weight (Cout, Cin/groups, *kernel). Windows of the padded input are views, so the product
    with the weight, its sum and the bias make one kernel."""
    if weight.ndim < 3:
      raise ValueError(f"conv2d: weight of shape {_fmt(weight.shape)} needs (Cout, Cin/groups, *kernel)")
    cout, cin_g, *ks = weight.shape
    n = len(ks)
    if self.ndim == n + 1: return self.unsqueeze(0).conv2d(weight, bias, stride, padding, dilation, groups).squeeze(0)
    if self.ndim != n + 2:
      raise ValueError(f"conv2d: input of shape {_fmt(self.shape)} doesn't fit weight {_fmt(weight.shape)}: needs "
                       f"{n + 2} dims (N, C, *spatial)")
    bs, cin = self.shape[:2]
    if not isinstance(groups, int) or groups <= 0 or cout % groups:
      raise ValueError(f"conv2d: groups={groups} must be a positive int dividing the {cout} output channels")
    if cin != cin_g * groups:
      raise ValueError(f"conv2d: input of shape {_fmt(self.shape)} has {cin} channels but weight "
                       f"{_fmt(weight.shape)} with groups={groups} expects {cin_g * groups}")
    if bias is not None and bias.shape != (cout,):
      raise ValueError(f"conv2d: bias of shape {_fmt(bias.shape)} should be ({cout},)")
    pads = _conv_padding(padding, tuple(ks), make_pair(dilation, n))
    x = self.pad(((0, 0), (0, 0)) + pads) if any(p != (0, 0) for p in pads) else self
    k, s, _, d = x._pool_args("conv2d", tuple(ks), stride, 0, dilation, n)
    win = x._pool(k, s, d)
    outsp = win.shape[2:2 + n]
    win = win.reshape(bs, groups, 1, cin_g, *outsp, *k)
    w = weight.reshape(1, groups, cout // groups, cin_g, *[1] * n, *k)
    out = (win * w).sum((3, *range(4 + n, 4 + 2 * n))).reshape(bs, cout, *outsp)
    return out if bias is None else out + bias.reshape(1, cout, *[1] * n)

  # ***** dtypes *****
  def cast(self, dtype: Any) -> Tensor:
    dt = _dtype_arg("cast", dtype)
    return self if dt is self.dtype else F.Cast.apply(self, dtype=dt)

  def bitcast(self, dtype: Any) -> Tensor:
    """Reinterpret the bits as another dtype of the same itemsize."""
    dt = _dtype_arg("bitcast", dtype)
    if dt.itemsize != self.dtype.itemsize:
      raise TypeError(f"bitcast: {self.dtype.name} ({self.dtype.itemsize} bytes) and {dt.name} ({dt.itemsize} bytes) "
                      "differ in size; bitcast needs equal itemsizes")
    return self if dt is self.dtype else F.Bitcast.apply(self, dtype=dt)

  def float(self) -> Tensor: return self.cast(dtypes.float32)
  def half(self) -> Tensor: return self.cast(dtypes.float16)
  def double(self) -> Tensor: return self.cast(dtypes.float64)
  def bfloat16(self) -> Tensor: return self.cast(dtypes.bfloat16)
  def int(self) -> Tensor: return self.cast(dtypes.int32)
  def long(self) -> Tensor: return self.cast(dtypes.int64)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)


# ***** helpers that need Tensor *****

def _py_dtype(x: Any) -> DType: return dtypes.from_py(x.item() if isinstance(x, np.generic) else x)


def _slice_window(s: slice, size: int) -> tuple[int, int, int, int]:
  """(lo, hi, n, step) of a slice on a dim: the elements are in [lo, hi) (flipped when step < 0, then every |step|)."""
  if s.step == 0: raise ValueError("getitem: slice step cannot be zero")
  start, stop, step = s.indices(size)
  n = max(0, -(-(stop - start) // step))
  if n == 0: return 0, 0, 0, step
  last = start + (n - 1) * step
  return (start, last + 1, n, step) if step > 0 else (last, start + 1, n, step)


def _float_floor_divide(a: Tensor, b: Tensor) -> Tensor:
  """floor(a / b) for floats as torch computes it: from fmod, so 1 // 0.1 is 9 (the exact quotient is 9.99...)."""
  mod = F.NoGradALU.apply(a, b, op=Ops.MOD)
  div = (a - mod) / b
  div = ((mod != 0) & ((b < 0) != (mod < 0))).where(div - 1, div)
  floor = div.floor()
  floor = (div - floor > 0.5).where(floor + 1, floor)
  return (b == 0).where(a / b, floor)


def _conv_padding(padding: Any, kernel: tuple[int, ...], dilation: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  """Per spatial dim (before, after): an int, one int per dim, or 'valid' / 'same' (stride 1) as torch."""
  if padding == "valid": return ((0, 0),) * len(kernel)
  if padding == "same":
    total = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return tuple((t // 2, t - t // 2) for t in total)
  pads = make_pair(padding, len(kernel)) if not isinstance(padding, str) else ()
  if len(pads) != len(kernel) or not all(isinstance(p, int) and p >= 0 for p in pads):
    raise ValueError(f"conv2d: padding {padding!r} should be an int >= 0, one per spatial dim, 'valid' or 'same'")
  return tuple((p, p) for p in pads)
