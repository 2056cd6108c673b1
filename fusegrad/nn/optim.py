"""Optimizers: SGD, Adam and AdamW with torch.optim's update rules, written in the same order of operations.

`step()` builds every parameter's new value and the optimizer's new state lazily and realizes all of them in one
Tensor.realize_all call, so an update is one schedule (with the forward and backward in it, when nothing realized them
first). Values that change between steps (the learning rate, Adam's bias corrections) reach the kernels through a
small host-filled buffer rather than as literals, so the same compiled kernels serve every step.
"""
from __future__ import annotations
import math
from typing import Iterable
import numpy as np
from fusegrad.dtype import dtypes
from fusegrad.tensor import Tensor


class Optimizer:
  """Holds the parameters and the buffers to realize with each step. Parameters are the tensors that require grad,
  and float tensors whose requires_grad is unset (None, switched on here); the rest are buffers (such as the BatchNorm
  running stats that get_parameters finds). Subclasses give the update of one parameter."""

  def __init__(self, params: Iterable[Tensor], lr: float):
    tensors = list({id(t): t for t in params}.values())
    if not all(isinstance(t, Tensor) for t in tensors):
      raise TypeError(f"{type(self).__name__}: params must be Tensors, got {[type(t).__name__ for t in tensors]}")
    if lr < 0: raise ValueError(f"{type(self).__name__}: lr must be >= 0, got {lr}")
    is_param = [t.requires_grad or (t.requires_grad is None and dtypes.is_float(t.dtype)) for t in tensors]
    self.params = [t.requires_grad_(True) for t, param in zip(tensors, is_param) if param]
    self.buffers = [t for t, param in zip(tensors, is_param) if not param]
    if not self.params: raise ValueError(f"{type(self).__name__}: got no tensors that require grad to optimize")
    self.lr = lr

  def zero_grad(self) -> None:
    """Forget the gradients (set them to None, as torch's default), so the next backward starts from zero."""
    for p in self.params: p.grad = None

  def step(self) -> None:
    """Update every parameter that has a gradient, and realize the parameters, the optimizer state and the buffers
    together, in one schedule."""
    scalars: dict[tuple[str, tuple[float, ...]], Tensor] = {}   # one host-filled tensor per device and values
    with Tensor.no_grad():
      for i, p in enumerate(self.params):
        if p.grad is None: continue
        values = self._step_scalars(i)
        if (p.device, values) not in scalars:
          scalars[(p.device, values)] = Tensor(np.array(values, dtype=np.float32), device=p.device)
        p.assign(self._update(i, p.detach(), p.grad.detach(), scalars[(p.device, values)]).cast(p.dtype))
    Tensor.realize_all(*self.params, *self._state(), *self.buffers)

  def _step_scalars(self, i: int) -> tuple[float, ...]:
    """This step's values for parameter i, computed on the host and handed to _update as a float32 tensor:
    (lr, ...). Called once per step for each parameter that has a gradient."""
    return (self.lr,)

  def _update(self, i: int, p: Tensor, grad: Tensor, scalars: Tensor) -> Tensor: raise NotImplementedError
  def _state(self) -> list[Tensor]: return []


class SGD(Optimizer):
  """Stochastic gradient descent with optional momentum (torch's: the first step's buffer is the gradient itself),
  dampening, Nesterov momentum and L2 weight decay."""

  def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
               weight_decay: float = 0.0, nesterov: bool = False):
    super().__init__(params, lr)
    if momentum < 0 or weight_decay < 0:
      raise ValueError(f"SGD: momentum ({momentum}) and weight_decay ({weight_decay}) must be >= 0")
    if nesterov and (momentum <= 0 or dampening != 0):
      raise ValueError(f"SGD: nesterov needs momentum > 0 and dampening = 0, got {momentum} and {dampening}")
    self.momentum, self.dampening, self.weight_decay, self.nesterov = momentum, dampening, weight_decay, nesterov
    self.momentum_buffers: list[Tensor | None] = [None] * len(self.params)

  def _update(self, i: int, p: Tensor, grad: Tensor, scalars: Tensor) -> Tensor:
    if self.weight_decay: grad = grad + p * self.weight_decay
    if self.momentum:
      buf = self.momentum_buffers[i]
      buf = grad if buf is None else buf * self.momentum + grad * (1 - self.dampening)
      self.momentum_buffers[i] = buf
      grad = grad + buf * self.momentum if self.nesterov else buf
    return p - grad * scalars[0]

  def _state(self) -> list[Tensor]: return [b for b in self.momentum_buffers if b is not None]


class Adam(Optimizer):
  """Adam (Kingma & Ba) with torch's bias correction and L2 weight decay added to the gradient; AdamW decays the
  weights directly instead. amsgrad keeps the running maximum of the second moment."""
  decoupled_weight_decay = False

  def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
               eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False):
    super().__init__(params, lr)
    if not all(0 <= b < 1 for b in betas):
      raise ValueError(f"{type(self).__name__}: betas must be in [0, 1), got {betas}")
    if eps < 0 or weight_decay < 0:
      raise ValueError(f"{type(self).__name__}: eps ({eps}) and weight_decay ({weight_decay}) must be >= 0")
    self.betas, self.eps, self.weight_decay, self.amsgrad = betas, eps, weight_decay, amsgrad
    self.steps = [0] * len(self.params)   # per parameter, as torch: a step without a gradient doesn't count
    self.exp_avg: list[Tensor | None] = [None] * len(self.params)
    self.exp_avg_sq: list[Tensor | None] = [None] * len(self.params)
    self.max_exp_avg_sq: list[Tensor | None] = [None] * len(self.params)

  def _step_scalars(self, i: int) -> tuple[float, ...]:
    """(lr, lr / (1 - beta1^t), sqrt(1 - beta2^t)) for the parameter's step t, in double precision, as torch."""
    self.steps[i] += 1
    beta1, beta2 = self.betas
    return (self.lr, self.lr / (1 - beta1 ** self.steps[i]), math.sqrt(1 - beta2 ** self.steps[i]))

  def _update(self, i: int, p: Tensor, grad: Tensor, scalars: Tensor) -> Tensor:
    beta1, beta2 = self.betas
    if self.weight_decay and self.decoupled_weight_decay: p = p * (1 - scalars[0] * self.weight_decay)
    elif self.weight_decay: grad = grad + p * self.weight_decay
    m = self.exp_avg[i] if self.exp_avg[i] is not None else Tensor.zeros_like(p)
    v = self.exp_avg_sq[i] if self.exp_avg_sq[i] is not None else Tensor.zeros_like(p)
    self.exp_avg[i] = m = m + (grad - m) * (1 - beta1)
    self.exp_avg_sq[i] = v = v * beta2 + grad * grad * (1 - beta2)
    if self.amsgrad:
      self.max_exp_avg_sq[i] = v = v if self.max_exp_avg_sq[i] is None else self.max_exp_avg_sq[i].maximum(v)
    return p - m / (v.sqrt() / scalars[2] + self.eps) * scalars[1]

  def _state(self) -> list[Tensor]:
    return [s for s in self.exp_avg + self.exp_avg_sq + self.max_exp_avg_sq if s is not None]


class AdamW(Adam):
  """Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr*weight_decay before the Adam update."""
  decoupled_weight_decay = True

  def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
               eps: float = 1e-8, weight_decay: float = 0.01, amsgrad: bool = False):
    super().__init__(params, lr, betas, eps, weight_decay, amsgrad)
