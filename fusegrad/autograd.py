"""Reverse-mode autograd: one Function per primitive op, its forward on LazyBuffers beside its gradient rule.

Every Tensor op in tensor.py is a composition of these primitives, so it is differentiable as soon as each primitive
is. `Function.apply` runs a forward and, when grad mode is on and an input requires grad, keeps the Function on the
output as its tape entry (parents, which of them need grads, what the rule needs); `Tensor.backward` walks the tape.
Rules take and return LazyBuffers of the same shape and dtype as the forward's inputs; None means "no gradient".
"""
from __future__ import annotations
import math
from typing import Any, ClassVar
from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import argsort
from fusegrad.uop import Ops
from fusegrad.lazy import LazyBuffer

Grads = LazyBuffer | tuple[LazyBuffer | None, ...]
LN2 = math.log(2)


class GradMode:
  """Whether ops record the tape: off inside `no_grad()` (Tensor.no_grad). The one piece of autograd state."""
  enabled: ClassVar[bool] = True


class no_grad:
  """Context manager (and decorator) that turns off tape recording inside its block; nestable."""

  def __init__(self) -> None: self._saved: list[bool] = []

  def __enter__(self) -> no_grad:
    self._saved.append(GradMode.enabled)
    GradMode.enabled = False
    return self

  def __exit__(self, *exc: object) -> None: GradMode.enabled = self._saved.pop()

  def __call__(self, fn):
    def wrapped(*args, **kwargs):
      with self: return fn(*args, **kwargs)
    wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
    return wrapped


class Function:
  """A primitive op. Subclasses define `forward(*lazybuffers, **kwargs)` and `backward(grad_output)`; a
  non-differentiable one sets `differentiable = False` (its output never requires grad)."""
  differentiable: ClassVar[bool] = True

  def __init__(self, device: str, *tensors: Any):
    self.device = device
    self.needs_input_grad = tuple([bool(t.requires_grad) for t in tensors])
    self.requires_grad = self.differentiable and GradMode.enabled and True in self.needs_input_grad
    self.parents: tuple[Any, ...] = tensors if self.requires_grad else ()

  def forward(self, *args: LazyBuffer, **kwargs: Any) -> LazyBuffer: raise NotImplementedError
  def backward(self, grad_output: LazyBuffer) -> Grads: raise NotImplementedError(f"{type(self).__name__}: no grad")

  @classmethod
  def apply(cls, *tensors: Any, **kwargs: Any) -> Any:
    """Run the forward on the tensors' LazyBuffers; the output has this Function as its tape entry when it needs
    one. The output is built by the inputs' own class (its `_wrap`), so this module needs no import of tensor.py."""
    ctx = cls(tensors[0].device, *tensors)
    ret = ctx.forward(*[t.lazydata for t in tensors], **kwargs)
    ctx.requires_grad = ctx.requires_grad and dtypes.is_float(ret.dtype)   # integer results never need grads
    if not ctx.requires_grad: ctx.parents = ()
    out = type(tensors[0])._wrap(ret, ctx.requires_grad)
    if ctx.requires_grad: out._attach(ctx)
    return out


def _const(x: LazyBuffer, value: float) -> LazyBuffer: return x.const_like(value)
def _zeros_where(cond: LazyBuffer, x: LazyBuffer) -> LazyBuffer: return cond.alu(Ops.WHERE, x, _const(x, 0))


# ***** unary *****

class Contiguous(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x.contiguous()
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad


class Cast(Function):
  def forward(self, x: LazyBuffer, dtype: DType) -> LazyBuffer:
    self.input_dtype = x.dtype
    return x.cast(dtype)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.cast(self.input_dtype)


class Bitcast(Function):
  differentiable = False
  def forward(self, x: LazyBuffer, dtype: DType) -> LazyBuffer: return x.cast(dtype, bitcast=True)


class Copy(Function):
  """A move to another device; the gradient moves back."""
  def forward(self, x: LazyBuffer, device: str) -> LazyBuffer:
    self.input_device = x.device
    return x.copy_to_device(device)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.copy_to_device(self.input_device)


class Neg(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x.alu(Ops.NEG)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.alu(Ops.NEG)


class Reciprocal(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.alu(Ops.RECIP)
    return self.ret
  def backward(self, grad: LazyBuffer) -> LazyBuffer:   # d(1/x) = -1/x^2
    return grad.alu(Ops.MUL, self.ret).alu(Ops.MUL, self.ret).alu(Ops.NEG)


class Sqrt(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.alu(Ops.SQRT)
    return self.ret
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.alu(Ops.FDIV, self.ret.alu(Ops.MUL, _const(grad, 2)))


class Exp2(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.alu(Ops.EXP2)
    return self.ret
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.alu(Ops.MUL, self.ret).alu(Ops.MUL, _const(grad, LN2))


class Log2(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.x = x
    return x.alu(Ops.LOG2)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.alu(Ops.FDIV, self.x.alu(Ops.MUL, _const(grad, LN2)))


class Sin(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.x = x
    return x.alu(Ops.SIN)
  def backward(self, grad: LazyBuffer) -> LazyBuffer:   # cos(x) = sin(pi/2 - x)
    return grad.alu(Ops.MUL, _const(self.x, math.pi / 2).alu(Ops.SUB, self.x).alu(Ops.SIN))


class Trunc(Function):
  """Rounding toward zero: piecewise constant, so its gradient is zero (as torch's trunc/floor/ceil)."""
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x.alu(Ops.TRUNC)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return _const(grad, 0)


class Relu(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.positive = _const(x, 0).alu(Ops.CMPLT, x)
    return x.alu(Ops.MAX, _const(x, 0))
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return _zeros_where(self.positive, grad)


class Sigmoid(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.alu(Ops.MUL, _const(x, -1 / LN2)).alu(Ops.EXP2).alu(Ops.ADD, _const(x, 1)).alu(Ops.RECIP)
    return self.ret
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    return grad.alu(Ops.MUL, self.ret.alu(Ops.MUL, _const(self.ret, 1).alu(Ops.SUB, self.ret)))


# ***** binary and ternary *****

class Add(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer: return x.alu(Ops.ADD, y)
  def backward(self, grad: LazyBuffer) -> Grads: return grad, grad


class Sub(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer: return x.alu(Ops.SUB, y)
  def backward(self, grad: LazyBuffer) -> Grads: return grad, grad.alu(Ops.NEG) if self.needs_input_grad[1] else None


class Mul(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return x.alu(Ops.MUL, y)
  def backward(self, grad: LazyBuffer) -> Grads:
    return (grad.alu(Ops.MUL, self.y) if self.needs_input_grad[0] else None,
            grad.alu(Ops.MUL, self.x) if self.needs_input_grad[1] else None)


class Div(Function):
  """True division of floats (tensor.py casts ints to float first)."""
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return x.alu(Ops.FDIV, y)
  def backward(self, grad: LazyBuffer) -> Grads:
    dy = grad.alu(Ops.MUL, self.x).alu(Ops.FDIV, self.y.alu(Ops.MUL, self.y)).alu(Ops.NEG)
    return (grad.alu(Ops.FDIV, self.y) if self.needs_input_grad[0] else None, dy if self.needs_input_grad[1] else None)


class Pow(Function):
  """x ** y. As torch: d/dx is 0 where y == 0, and d/dy is 0 where x == 0 and y >= 0 (instead of nan)."""
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y, self.ret = x, y, x.alu(Ops.POW, y)
    return self.ret
  def backward(self, grad: LazyBuffer) -> Grads:
    x, y = self.x, self.y
    dx = dy = None
    if self.needs_input_grad[0]:
      dx = y.alu(Ops.MUL, x.alu(Ops.POW, y.alu(Ops.SUB, _const(y, 1))))
      dx = grad.alu(Ops.MUL, y.alu(Ops.CMPEQ, _const(y, 0)).alu(Ops.WHERE, _const(dx, 0), dx))
    if self.needs_input_grad[1]:
      dy = self.ret.alu(Ops.MUL, x.alu(Ops.LOG2).alu(Ops.MUL, _const(x, LN2)))
      y_negative = y.alu(Ops.CMPLT, _const(y, 0))
      y_nonneg = y_negative.alu(Ops.CMPEQ, LazyBuffer.const(False, dtypes.bool, y.shape, y.device))
      base_zero = x.alu(Ops.CMPEQ, _const(x, 0)).alu(Ops.AND, y_nonneg)
      dy = grad.alu(Ops.MUL, base_zero.alu(Ops.WHERE, _const(dy, 0), dy))
    return dx, dy


class Maximum(Function):
  """Elementwise max; where the two are equal each gets half the gradient (as torch.maximum)."""
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return x.alu(Ops.MAX, y)
  def backward(self, grad: LazyBuffer) -> Grads:
    share = self.x.alu(Ops.CMPEQ, self.y).alu(Ops.WHERE, grad.alu(Ops.MUL, _const(grad, 0.5)), grad)
    dx = self.x.alu(Ops.CMPLT, self.y).alu(Ops.WHERE, _const(grad, 0), share) if self.needs_input_grad[0] else None
    dy = self.y.alu(Ops.CMPLT, self.x).alu(Ops.WHERE, _const(grad, 0), share) if self.needs_input_grad[1] else None
    return dx, dy


class Mod(Function):
  """Remainder with the sign of the divisor (Python's %, torch.remainder). The device's float MOD is C's fmod, so
  floats get the fmod result moved into the divisor's sign. Gradient as torch: (1, -floor(x / y))."""
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    r = x.alu(Ops.MOD, y)
    if not dtypes.is_float(x.dtype): return r
    zero = _const(r, 0)
    wrong_sign = r.alu(Ops.CMPNE, zero).alu(Ops.AND, r.alu(Ops.CMPLT, zero).alu(Ops.CMPNE, y.alu(Ops.CMPLT, zero)))
    return wrong_sign.alu(Ops.WHERE, r.alu(Ops.ADD, y), r)
  def backward(self, grad: LazyBuffer) -> Grads:
    q = self.x.alu(Ops.FDIV, self.y)
    t = q.alu(Ops.TRUNC)
    floor = q.alu(Ops.CMPLT, t).alu(Ops.WHERE, t.alu(Ops.SUB, _const(t, 1)), t)
    return grad if self.needs_input_grad[0] else None, grad.alu(Ops.MUL, floor).alu(Ops.NEG)


class Where(Function):
  def forward(self, cond: LazyBuffer, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.cond = cond
    return cond.alu(Ops.WHERE, x, y)
  def backward(self, grad: LazyBuffer) -> Grads:
    zero = _const(grad, 0)
    return (None, self.cond.alu(Ops.WHERE, grad, zero) if self.needs_input_grad[1] else None,
            self.cond.alu(Ops.WHERE, zero, grad) if self.needs_input_grad[2] else None)


class NoGradALU(Function):
  """A comparison, integer division, bitwise op or shift: piecewise constant or integer-valued, so no gradient."""
  differentiable = False
  def forward(self, x: LazyBuffer, *others: LazyBuffer, op: Ops) -> LazyBuffer: return x.alu(op, *others)


# ***** reduce *****

class Sum(Function):
  def forward(self, x: LazyBuffer, axis: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.r(Ops.ADD, axis)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.expand(self.input_shape)


class Max(Function):
  """Max over axes (kept as size 1). The gradient is split evenly among the elements equal to the max (torch.amax)."""
  def forward(self, x: LazyBuffer, axis: tuple[int, ...]) -> LazyBuffer:
    self.x, self.axis, self.ret = x, axis, x.r(Ops.MAX, axis)
    return self.ret
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    is_max = self.x.alu(Ops.CMPEQ, self.ret.expand(self.x.shape)).cast(grad.dtype)
    count = is_max.r(Ops.ADD, self.axis)
    return is_max.alu(Ops.MUL, grad.alu(Ops.FDIV, count).expand(self.x.shape))


# ***** movement *****

class Reshape(Function):
  def forward(self, x: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.reshape(shape)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.reshape(self.input_shape)


class Permute(Function):
  def forward(self, x: LazyBuffer, order: tuple[int, ...]) -> LazyBuffer:
    self.order = order
    return x.permute(order)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.permute(tuple(argsort(self.order)))


class Expand(Function):
  """Broadcast size-1 axes; the gradient sums over them (half-precision grads accumulate in float32)."""
  def forward(self, x: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.expand(shape)
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    axis = tuple(i for i, (a, b) in enumerate(zip(self.input_shape, grad.shape)) if a != b)
    acc = dtypes.float32 if grad.dtype in (dtypes.float16, dtypes.bfloat16) else None
    return grad.r(Ops.ADD, axis, acc).cast(grad.dtype)


class Pad(Function):
  def forward(self, x: LazyBuffer, arg: tuple[tuple[int, int], ...]) -> LazyBuffer:
    self.window = tuple((before, before + s) for (before, _), s in zip(arg, x.shape))
    return x.pad(arg)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.shrink(self.window)


class Shrink(Function):
  def forward(self, x: LazyBuffer, arg: tuple[tuple[int, int], ...]) -> LazyBuffer:
    self.padding = tuple((start, s - end) for (start, end), s in zip(arg, x.shape))
    return x.shrink(arg)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.pad(self.padding)


class Flip(Function):
  def forward(self, x: LazyBuffer, axis: tuple[int, ...]) -> LazyBuffer:
    self.steps = tuple(-1 if i in axis else 1 for i in range(len(x.shape)))
    return x.stride(self.steps)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return grad.stride(self.steps)


class Stride(Function):
  """Every k-th element of each axis (k >= 1). The gradient spreads back by padding each element with k-1 zeros."""
  def forward(self, x: LazyBuffer, steps: tuple[int, ...]) -> LazyBuffer:
    self.steps, self.input_shape = steps, x.shape
    return x.stride(steps)
  def backward(self, grad: LazyBuffer) -> LazyBuffer:
    for axis, (k, size) in enumerate(zip(self.steps, self.input_shape)):
      if k == 1: continue
      n, before, after = grad.shape[axis], grad.shape[:axis], grad.shape[axis + 1:]
      grad = grad.reshape(before + (n, 1) + after)
      grad = grad.pad(tuple((0, 0) for _ in before) + ((0, 0), (0, k - 1)) + tuple((0, 0) for _ in after))
      grad = grad.reshape(before + (n * k,) + after).shrink(tuple((0, s) for s in before) + ((0, size),) +
                                                            tuple((0, s) for s in after))
    return grad
