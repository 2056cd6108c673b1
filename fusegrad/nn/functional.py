"""Stateless neural-network functions: transposed convolution, normalizations and losses, as torch.nn.functional.

They are compositions of Tensor ops, so they are lazy and differentiable like any other op. The layers in nn/ hold
parameters and call these; losses check their inputs' shapes and dtypes at the call and say what would be valid.
"""
from __future__ import annotations
from typing import Sequence
from fusegrad.dtype import dtypes
from fusegrad.helpers import make_pair
from fusegrad.tensor import Tensor

REDUCTIONS = ("mean", "sum", "none")

# ***** convolution *****


def _dilate(x: Tensor, stride: tuple[int, int]) -> Tensor:
  """Insert stride-1 zeros between neighbouring pixels: (n, c, h, w) -> (n, c, (h-1)*sh+1, (w-1)*sw+1). Views only."""
  (sh, sw), (n, c, h, w) = stride, x.shape
  if (sh, sw) == (1, 1): return x
  x = x.reshape(n, c, h, 1, w, 1).pad(((0, 0), (0, 0), (0, 0), (0, sh - 1), (0, 0), (0, sw - 1)))
  return x.reshape(n, c, h * sh, w * sw)[:, :, :(h - 1) * sh + 1, :(w - 1) * sw + 1]


def conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | Sequence[int] = 1,
                     padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0, groups: int = 1,
                     dilation: int | Sequence[int] = 1) -> Tensor:
  """The gradient of conv2d with respect to its input, as torch's conv_transpose2d: weight is (cin, cout/groups, kh,
  kw). Computed as a stride-1 conv2d of the zero-dilated, padded input with the flipped, group-transposed weight."""
  stride, padding, output_padding, dilation = (make_pair(v) for v in (stride, padding, output_padding, dilation))
  if x.ndim != 4 or weight.ndim != 4:
    raise ValueError(f"conv_transpose2d: needs a 4-d input (N, C, H, W) and a 4-d weight, got {x.shape} and "
                     f"{weight.shape}")
  cin, cout_g, kh, kw = weight.shape
  if x.shape[1] != cin or cin % groups != 0:
    raise ValueError(f"conv_transpose2d: input {x.shape} has {x.shape[1]} channels; weight {weight.shape} wants "
                     f"{cin}, divisible by groups={groups}")
  if any(op >= max(s, d) for op, s, d in zip(output_padding, stride, dilation)):
    raise ValueError(f"conv_transpose2d: output_padding {output_padding} must be smaller than stride {stride} or "
                     f"dilation {dilation}")
  reach = [d * (k - 1) for d, k in zip(dilation, (kh, kw))]   # negative padding (padding > reach) crops
  x = _dilate(x, stride).pad(((0, 0), (0, 0)) + tuple((r - p, r - p + op) for r, p, op in
                                                      zip(reach, padding, output_padding)))
  w = weight.reshape(groups, cin // groups, cout_g, kh, kw).transpose(1, 2).reshape(groups * cout_g, cin // groups,
                                                                                   kh, kw).flip((2, 3))
  return x.conv2d(w, bias, stride=1, padding=0, dilation=dilation, groups=groups)


# ***** normalization *****


def batch_norm(x: Tensor, mean: Tensor, var: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
  """(x - mean) / sqrt(var + eps) * weight + bias, with per-channel (axis 1) statistics and affine parameters."""
  shape = (1, -1) + (1,) * (x.ndim - 2)
  out = (x - mean.reshape(shape)) * (var.reshape(shape) + eps).rsqrt()
  if weight is not None: out = out * weight.reshape(shape)
  return out + bias.reshape(shape) if bias is not None else out


def layer_norm(x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
  """Normalize over the trailing `normalized_shape` axes (biased variance), then scale and shift elementwise."""
  normalized_shape = tuple(normalized_shape)
  if tuple(x.shape[x.ndim - len(normalized_shape):]) != normalized_shape:
    raise ValueError(f"layer_norm: input {x.shape} does not end in normalized_shape {normalized_shape}")
  axis = tuple(range(x.ndim - len(normalized_shape), x.ndim))
  centered = x - x.mean(axis=axis, keepdim=True)
  out = centered * ((centered * centered).mean(axis=axis, keepdim=True) + eps).rsqrt()
  if weight is not None: out = out * weight
  return out + bias if bias is not None else out


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
  """Normalize each group of channels of each sample (biased variance), then scale and shift per channel."""
  if x.ndim < 2 or x.shape[1] % num_groups != 0:
    raise ValueError(f"group_norm: input {x.shape} needs (N, C, ...) with C divisible by num_groups={num_groups}")
  grouped = x.reshape(x.shape[0], num_groups, -1)
  out = layer_norm(grouped, grouped.shape[2:], eps=eps).reshape(x.shape)
  shape = (1, -1) + (1,) * (x.ndim - 2)
  if weight is not None: out = out * weight.reshape(shape)
  return out + bias.reshape(shape) if bias is not None else out


# ***** losses *****


def _reduce(loss: Tensor, reduction: str) -> Tensor:
  return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def _reduce_kept(loss: Tensor, keep: Tensor, reduction: str, unbatched: bool) -> Tensor:
  """Reduce per-target losses where ignored targets (keep = 0) count for nothing, in the mean's divisor too."""
  loss = loss * keep
  if reduction == "mean": return loss.sum() / keep.sum()
  return _reduce(loss[0] if unbatched else loss, reduction)


def _check_reduction(reduction: str, op: str) -> None:
  if reduction not in REDUCTIONS: raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _check_same_shape(x: Tensor, target: Tensor, op: str) -> None:
  if tuple(x.shape) != tuple(target.shape):
    raise ValueError(f"{op}: input {x.shape} and target {target.shape} must have the same shape")


def check_index_range(idx: Tensor, n: int, what: str, of: str, ignore: int | None = None) -> None:
  """IndexError unless every index is in [0, n) (or equals `ignore`), checked only when idx is already realized:
  then looking costs a copy, not a computation. (A one-hot lookup would silently give 0 for a bad index.)"""
  if idx.lazydata.realized is None: return
  values = idx.numpy()
  bad = values[((values < 0) | (values >= n)) & (values != ignore)]
  if bad.size: raise IndexError(f"{what} {bad[0]} is out of range for {n} {of}")


def _check_class_targets(logits: Tensor, target: Tensor, ignore_index: int, op: str) -> None:
  """Class-index targets: integer dtype, the shape of the logits without the class axis (1), and (when the targets
  are already realized, so looking costs no compute) every index in [0, C) or equal to ignore_index."""
  expected = tuple(logits.shape[:1]) + tuple(logits.shape[2:])
  if not dtypes.is_int(target.dtype):
    raise TypeError(f"{op}: class-index targets must be integers, got {target.dtype} (use a float target of shape "
                    f"{logits.shape} for class probabilities)")
  if tuple(target.shape) != expected:
    raise ValueError(f"{op}: input {logits.shape} (N, C, ...) needs class-index targets of shape {expected}, got "
                     f"{target.shape}")
  check_index_range(target, logits.shape[1], f"{op}: target class", "classes", ignore_index)


def _pick(logprobs: Tensor, target: Tensor) -> Tensor:
  """logprobs[n, target[n, ...], ...]: the class axis (1) indexed by the targets."""
  return logprobs.gather(1, target.unsqueeze(1)).squeeze(1)


def _batched(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor, bool]:
  """An unbatched (C,) input with a scalar (or (C,)) target becomes a batch of one, as torch allows."""
  if logits.ndim != 1: return logits, target, False
  return logits.unsqueeze(0), target.unsqueeze(0), True


def nll_loss(logprobs: Tensor, target: Tensor, *, reduction: str = "mean", ignore_index: int = -100) -> Tensor:
  """-logprobs[n, target[n], ...], averaged over the targets that aren't ignore_index (reduction='mean')."""
  _check_reduction(reduction, "nll_loss")
  logprobs, target, unbatched = _batched(logprobs, target)
  _check_class_targets(logprobs, target, ignore_index, "nll_loss")
  return _reduce_kept(-_pick(logprobs, target), (target != ignore_index).float(), reduction, unbatched)


def cross_entropy(logits: Tensor, target: Tensor, *, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int = -100) -> Tensor:
  """torch.nn.functional.cross_entropy: logits (N, C, ...) and class-index targets (N, ...) or class probabilities
  (N, C, ...). With label_smoothing s the target is (1-s)*target + s/C; 'mean' over index targets averages over the
  ones that aren't ignore_index."""
  _check_reduction(reduction, "cross_entropy")
  if not 0.0 <= label_smoothing <= 1.0:
    raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
  logits, target, unbatched = _batched(logits, target)
  if logits.ndim < 2: raise ValueError(f"cross_entropy: input must be (C,) or (N, C, ...), got {logits.shape}")
  num_classes, logprobs = logits.shape[1], logits.log_softmax(axis=1)
  if dtypes.is_float(target.dtype):
    _check_same_shape(logits, target, "cross_entropy (probability targets)")
    loss = -(logprobs * (target * (1 - label_smoothing) + label_smoothing / num_classes)).sum(axis=1)
    return _reduce(loss[0] if unbatched else loss, reduction)
  _check_class_targets(logits, target, ignore_index, "cross_entropy")
  smoothed = (1 - label_smoothing) * _pick(logprobs, target) + label_smoothing / num_classes * logprobs.sum(axis=1)
  return _reduce_kept(-smoothed, (target != ignore_index).float(), reduction, unbatched)


def sparse_categorical_crossentropy(logits: Tensor, target: Tensor, *, reduction: str = "mean",
                                    label_smoothing: float = 0.0, ignore_index: int = -100) -> Tensor:
  """cross_entropy with class-index targets (the Keras/tinygrad name)."""
  if dtypes.is_float(target.dtype):
    raise TypeError(f"sparse_categorical_crossentropy: targets must be class indices (ints), got {target.dtype}")
  return cross_entropy(logits, target, reduction=reduction, label_smoothing=label_smoothing, ignore_index=ignore_index)


def binary_cross_entropy(probs: Tensor, target: Tensor, *, reduction: str = "mean") -> Tensor:
  """-(y*log(p) + (1-y)*log(1-p)) for probabilities p; each log is clamped at -100 as torch does, so p = 0 or 1 gives
  a finite loss."""
  _check_reduction(reduction, "binary_cross_entropy")
  _check_same_shape(probs, target, "binary_cross_entropy")
  target = target.cast(probs.dtype)
  loss = -(target * probs.log().maximum(-100) + (1 - target) * (1 - probs).log().maximum(-100))
  return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(logits: Tensor, target: Tensor, *, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
  """binary_cross_entropy(sigmoid(x), y) computed stably: (1-y)*x + w*softplus(-x), with w = 1 + (pos_weight-1)*y
  (Tensor.softplus never overflows: it is linear past its threshold)."""
  _check_reduction(reduction, "binary_cross_entropy_with_logits")
  _check_same_shape(logits, target, "binary_cross_entropy_with_logits")
  target = target.cast(logits.dtype)
  weight = 1 + (pos_weight - 1) * target if pos_weight is not None else 1
  return _reduce((1 - target) * logits + weight * (-logits).softplus(), reduction)


def mse_loss(x: Tensor, target: Tensor, *, reduction: str = "mean") -> Tensor:
  """(x - target)^2."""
  _check_reduction(reduction, "mse_loss")
  _check_same_shape(x, target, "mse_loss")
  return _reduce((x - target).square(), reduction)


def l1_loss(x: Tensor, target: Tensor, *, reduction: str = "mean") -> Tensor:
  """|x - target|."""
  _check_reduction(reduction, "l1_loss")
  _check_same_shape(x, target, "l1_loss")
  return _reduce((x - target).abs(), reduction)
