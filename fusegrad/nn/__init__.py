"""Neural-network layers as plain classes: attributes hold the Tensors, `__call__` runs the layer.

State-dict keys follow attribute names (nested layers with dots, lists with indices: `layers.0.weight`), as in
PyTorch, so weights move between the two; parameters start as PyTorch's defaults would. Layers that behave
differently when training (BatchNorm2d, Dropout) follow `Tensor.training`. Optimizers live in nn.optim, state
dicts and weights files in nn.state, the stateless functions in nn.functional.
"""
from __future__ import annotations
import math
from typing import Sequence
from fusegrad.dtype import dtypes
from fusegrad.helpers import make_pair, prod
from fusegrad.tensor import Tensor
from fusegrad.nn import functional, optim, state

__all__ = ["Linear", "Conv2d", "ConvTranspose2d", "BatchNorm2d", "LayerNorm", "GroupNorm", "Embedding", "Dropout",
           "functional", "optim", "state"]


def _weight(*shape: int) -> Tensor:
  """PyTorch's default for Linear and conv weights: kaiming_uniform with a=sqrt(5), i.e. U(-b, b) with
  b = 1/sqrt(fan_in), fan_in = prod(shape[1:])."""
  return Tensor.kaiming_uniform(*shape, a=math.sqrt(5), requires_grad=True)


def _bias(n: int, fan_in: int) -> Tensor:
  """PyTorch's default bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with the weight's fan_in."""
  bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
  return Tensor.uniform(n, low=-bound, high=bound, requires_grad=True)


class Linear:
  """y = x @ weight.T + bias, weight (out_features, in_features)."""

  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    self.weight = _weight(out_features, in_features)
    self.bias = _bias(out_features, in_features) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    if x.shape[-1:] != self.weight.shape[1:]:
      raise ValueError(f"Linear: input {x.shape} must end in in_features={self.weight.shape[1]}")
    return x.linear(self.weight, self.bias)


class Conv2d:
  """2-d convolution of (N, in_channels, H, W) inputs; weight (out_channels, in_channels/groups, kh, kw)."""

  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride: int | Sequence[int]
               = 1, padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1,
               bias: bool = True):
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"Conv2d: in_channels={in_channels} and out_channels={out_channels} must be divisible by "
                       f"groups={groups}")
    self.kernel_size, self.stride, self.padding = make_pair(kernel_size), stride, padding
    self.dilation, self.groups = dilation, groups
    self.weight = _weight(out_channels, in_channels // groups, *self.kernel_size)
    self.bias = _bias(out_channels, prod(self.weight.shape[1:])) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, stride=self.stride, padding=self.padding, dilation=self.dilation,
                    groups=self.groups)


class ConvTranspose2d:
  """Transposed 2-d convolution (the gradient of Conv2d with respect to its input); weight (in_channels,
  out_channels/groups, kh, kw), output size (H-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1."""

  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride: int | Sequence[int]
               = 1, padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0, groups: int = 1,
               bias: bool = True, dilation: int | Sequence[int] = 1):
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"ConvTranspose2d: in_channels={in_channels} and out_channels={out_channels} must be divisible "
                       f"by groups={groups}")
    self.kernel_size, self.stride, self.padding = make_pair(kernel_size), stride, padding
    self.output_padding, self.dilation, self.groups = output_padding, dilation, groups
    self.weight = _weight(in_channels, out_channels // groups, *self.kernel_size)   # fan_in from shape[1:], as torch
    self.bias = _bias(out_channels, prod(self.weight.shape[1:])) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    return functional.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                       self.groups, self.dilation)


class BatchNorm2d:
  """Per-channel normalization of (N, C, H, W). Training (Tensor.training) uses the batch's mean and biased variance
  and moves the running stats toward the batch's mean and unbiased variance by `momentum` (None: a cumulative
  average); evaluation uses the running stats. Running stats update lazily: an optimizer given them (as
  get_parameters returns them) realizes them with its step."""

  def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
               track_running_stats: bool = True):
    self.num_features, self.eps, self.momentum = num_features, eps, momentum
    self.weight = Tensor.ones(num_features, requires_grad=True) if affine else None
    self.bias = Tensor.zeros(num_features, requires_grad=True) if affine else None
    self.running_mean = Tensor.zeros(num_features, requires_grad=False) if track_running_stats else None
    self.running_var = Tensor.ones(num_features, requires_grad=False) if track_running_stats else None
    self.num_batches_tracked = Tensor.zeros(dtype=dtypes.int64, requires_grad=False) if track_running_stats else None

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim != 4 or x.shape[1] != self.num_features:
      raise ValueError(f"BatchNorm2d: expected input (N, {self.num_features}, H, W), got {x.shape}")
    if not Tensor.training and self.running_mean is not None:
      return functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.eps)
    count = x.shape[0] * x.shape[2] * x.shape[3]
    if count < 2: raise ValueError(f"BatchNorm2d: training needs more than 1 value per channel, got input {x.shape}")
    mean = x.mean(axis=(0, 2, 3))
    var = (x - mean.reshape(1, -1, 1, 1)).square().mean(axis=(0, 2, 3))
    if Tensor.training and self.running_mean is not None: self._track(mean.detach(), var.detach(), count)
    return functional.batch_norm(x, mean, var, self.weight, self.bias, self.eps)

  def _track(self, mean: Tensor, var: Tensor, count: int) -> None:
    self.num_batches_tracked.assign(self.num_batches_tracked + 1)
    factor = self.momentum if self.momentum is not None else 1 / self.num_batches_tracked.float()
    unbiased = var * (count / (count - 1))
    self.running_mean.assign(self.running_mean * (1 - factor) + mean.cast(self.running_mean.dtype) * factor)
    self.running_var.assign(self.running_var * (1 - factor) + unbiased.cast(self.running_var.dtype) * factor)


class LayerNorm:
  """Normalization over the trailing normalized_shape axes of each sample, with elementwise scale and shift."""

  def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
               bias: bool = True):
    self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    self.eps = eps
    self.weight = Tensor.ones(*self.normalized_shape, requires_grad=True) if elementwise_affine else None
    self.bias = Tensor.zeros(*self.normalized_shape, requires_grad=True) if elementwise_affine and bias else None

  def __call__(self, x: Tensor) -> Tensor:
    return functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class GroupNorm:
  """Normalization over groups of channels of each sample, with a per-channel scale and shift."""

  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    if num_channels % num_groups:
      raise ValueError(f"GroupNorm: num_channels={num_channels} must be divisible by num_groups={num_groups}")
    self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
    self.weight = Tensor.ones(num_channels, requires_grad=True) if affine else None
    self.bias = Tensor.zeros(num_channels, requires_grad=True) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 2 or x.shape[1] != self.num_channels:
      raise ValueError(f"GroupNorm: expected input (N, {self.num_channels}, ...), got {x.shape}")
    return functional.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class Embedding:
  """A lookup table: integer indices of any shape -> rows of weight (num_embeddings, embedding_dim), from N(0, 1)."""

  def __init__(self, num_embeddings: int, embedding_dim: int):
    self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
    self.weight = Tensor.randn(num_embeddings, embedding_dim, requires_grad=True)

  def __call__(self, idx: Tensor) -> Tensor:
    if not dtypes.is_int(idx.dtype): raise TypeError(f"Embedding: indices must be integers, got {idx.dtype}")
    functional.check_index_range(idx, self.num_embeddings, "Embedding: index", "embeddings")
    return self.weight[idx]


class Dropout:
  """Zeroes elements with probability p (scaling the rest by 1/(1-p)) while Tensor.training; identity otherwise."""

  def __init__(self, p: float = 0.5):
    if not 0 <= p <= 1: raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
    self.p = p

  def __call__(self, x: Tensor) -> Tensor: return x.dropout(self.p)
