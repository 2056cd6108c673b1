"""Layers of fusegrad.nn against torch.nn with identical weights: forward values, input grads and weight grads.

Each test builds the torch layer, copies its parameters and buffers into the fusegrad layer (state-dict names match),
runs both on the same input, back-propagates the same random output gradient and compares the output, the input's
gradient and every parameter's gradient. BatchNorm2d is also checked in eval mode and for its running stats.
"""
import math

import numpy as np
import pytest
import torch

import fusegrad.nn as nn
from fusegrad import Tensor, dtypes
from fusegrad.nn.state import get_state_dict

ATOL, RTOL = 1e-5, 1e-4


def copy_torch_state(ours, theirs: torch.nn.Module) -> None:
  own = get_state_dict(ours)
  assert set(own) == set(theirs.state_dict()), f"state dict keys differ: {set(own) ^ set(theirs.state_dict())}"
  for name, value in theirs.state_dict().items():
    own[name].assign(Tensor(value.numpy(), dtype=own[name].dtype))


def check_layer(ours, theirs: torch.nn.Module, x: np.ndarray, seed: int = 0, atol: float = ATOL, rtol: float = RTOL):
  """Forward and backward of both layers on x; returns the two outputs for further checks."""
  copy_torch_state(ours, theirs)
  x_t = torch.tensor(x, requires_grad=x.dtype.kind == "f")
  x_f = Tensor(x, requires_grad=x.dtype.kind == "f")
  out_t, out_f = theirs(x_t), ours(x_f)
  np.testing.assert_allclose(out_f.numpy(), out_t.detach().numpy(), atol=atol, rtol=rtol, err_msg="forward")
  g = np.random.default_rng(seed).standard_normal(out_t.shape).astype(np.float32)
  (out_t * torch.tensor(g)).sum().backward()
  (out_f * Tensor(g)).sum().backward()
  if x_t.requires_grad:
    np.testing.assert_allclose(x_f.grad.numpy(), x_t.grad.numpy(), atol=atol, rtol=rtol, err_msg="input grad")
  own = get_state_dict(ours)
  for name, p in theirs.named_parameters():
    np.testing.assert_allclose(own[name].grad.numpy(), p.grad.numpy(), atol=atol, rtol=rtol, err_msg=f"{name} grad")
  return out_f, out_t


def randn(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("bias,shape", [(True, (2, 3, 6)), (False, (4, 6))])
def test_linear(bias, shape):
  check_layer(nn.Linear(6, 5, bias=bias), torch.nn.Linear(6, 5, bias=bias), randn(*shape))


CONV_CASES = [
  dict(),
  dict(stride=2, padding=1),
  dict(padding=2, dilation=2, groups=2, bias=False),
  dict(stride=(2, 1), padding=(1, 0), kernel_size=(3, 2)),
  dict(padding="same"),
]


@pytest.mark.parametrize("kw", CONV_CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_conv2d(kw):
  kw = {"kernel_size": 3, **kw}
  check_layer(nn.Conv2d(4, 6, **kw), torch.nn.Conv2d(4, 6, **kw), randn(2, 4, 7, 8))


CONV_TRANSPOSE_CASES = [
  dict(),
  dict(stride=2, padding=1, output_padding=1),
  dict(dilation=2, padding=1, groups=2, bias=False),
  dict(stride=3, padding=3),                       # padding beyond the kernel's reach crops
  dict(stride=(2, 1), padding=(0, 1), kernel_size=(2, 3), output_padding=(1, 0)),
]


@pytest.mark.parametrize("kw", CONV_TRANSPOSE_CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or
                         "plain")
def test_conv_transpose2d(kw):
  kw = {"kernel_size": 3, **kw}
  check_layer(nn.ConvTranspose2d(4, 6, **kw), torch.nn.ConvTranspose2d(4, 6, **kw), randn(2, 4, 5, 6))


def test_conv_transpose2d_errors():
  with pytest.raises(ValueError, match="output_padding"):
    nn.functional.conv_transpose2d(Tensor.randn(1, 2, 4, 4), Tensor.randn(2, 3, 3, 3), stride=1, output_padding=1)
  with pytest.raises(ValueError, match="channels"):
    nn.functional.conv_transpose2d(Tensor.randn(1, 3, 4, 4), Tensor.randn(2, 3, 3, 3))
  with pytest.raises(ValueError, match="divisible by groups"):
    nn.ConvTranspose2d(3, 4, 3, groups=2)


def test_batchnorm2d_train_then_eval():
  """Three training steps (batch stats, running stats updated with the unbiased variance), then eval."""
  ours, theirs = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
  copy_torch_state(ours, theirs)
  for step in range(3):
    x = randn(4, 3, 5, 5, seed=step) * (step + 1) + step
    with Tensor.train():
      check_layer(ours, theirs.train(), x, seed=step)
    Tensor.realize_all(*get_state_dict(ours).values())
    for name in ("running_mean", "running_var", "num_batches_tracked"):
      np.testing.assert_allclose(getattr(ours, name).numpy(), getattr(theirs, name).numpy(), atol=1e-5, rtol=1e-5,
                                 err_msg=name)
  x = randn(2, 3, 4, 4, seed=9)
  theirs.eval()
  out_t = theirs(torch.tensor(x)).detach().numpy()
  np.testing.assert_allclose(ours(Tensor(x)).numpy(), out_t, atol=ATOL, rtol=RTOL)
  assert not Tensor.training


@pytest.mark.parametrize("kw", [dict(momentum=None), dict(affine=False), dict(track_running_stats=False),
                                dict(eps=1e-3, momentum=0.5)], ids=str)
def test_batchnorm2d_options(kw):
  ours, theirs = nn.BatchNorm2d(3, **kw), torch.nn.BatchNorm2d(3, **kw)
  for step in range(2):
    with Tensor.train():
      check_layer(ours, theirs.train(), randn(3, 3, 4, 4, seed=step) + step, seed=step)
  theirs.eval()
  x = randn(2, 3, 4, 4, seed=7)
  check_layer(ours, theirs, x)


def test_batchnorm2d_errors():
  bn = nn.BatchNorm2d(3)
  with pytest.raises(ValueError, match=r"expected input \(N, 3, H, W\)"): bn(Tensor.randn(2, 4, 3, 3))
  with Tensor.train(), pytest.raises(ValueError, match="more than 1 value per channel"):
    bn(Tensor.randn(1, 3, 1, 1))


@pytest.mark.parametrize("shape,normalized,affine", [((4, 5), 5, True), ((2, 3, 4, 5), (4, 5), True),
                                                     ((2, 3, 4, 5), (4, 5), False)])
def test_layernorm(shape, normalized, affine):
  ours = nn.LayerNorm(normalized, eps=1e-5, elementwise_affine=affine)
  theirs = torch.nn.LayerNorm(normalized, eps=1e-5, elementwise_affine=affine)
  if affine:
    with torch.no_grad():
      theirs.weight.normal_()
      theirs.bias.normal_()
  check_layer(ours, theirs, randn(*shape) * 3 + 1)


@pytest.mark.parametrize("groups,affine", [(1, True), (2, False), (4, True)])
def test_groupnorm(groups, affine):
  ours, theirs = nn.GroupNorm(groups, 4, affine=affine), torch.nn.GroupNorm(groups, 4, affine=affine)
  if affine:
    with torch.no_grad():
      theirs.weight.normal_()
      theirs.bias.normal_()
  check_layer(ours, theirs, randn(3, 4, 5, 2) * 2 - 1)


def test_norm_errors():
  with pytest.raises(ValueError, match="divisible by num_groups"): nn.GroupNorm(3, 4)
  with pytest.raises(ValueError, match=r"expected input \(N, 4, ...\)"): nn.GroupNorm(2, 4)(Tensor.randn(2, 6, 3))
  with pytest.raises(ValueError, match="does not end in normalized_shape"): nn.LayerNorm(5)(Tensor.randn(2, 4))


def test_embedding():
  ours, theirs = nn.Embedding(10, 4), torch.nn.Embedding(10, 4)
  idx = np.array([[1, 2, 9], [0, 2, 2]], dtype=np.int64)
  check_layer(ours, theirs, idx)


def test_embedding_errors():
  emb = nn.Embedding(10, 4)
  with pytest.raises(TypeError, match="integers"): emb(Tensor([1.0, 2.0]))
  with pytest.raises(IndexError, match="index 10 is out of range for 10"): emb(Tensor([3, 10]))


def test_dropout():
  drop, x = nn.Dropout(0.25), Tensor.ones(100, 100, requires_grad=True)
  np.testing.assert_array_equal(drop(x).numpy(), np.ones((100, 100)), err_msg="eval mode is the identity")
  Tensor.manual_seed(1)
  with Tensor.train():
    out = drop(x)
  values = out.numpy()
  assert set(np.unique(values)) <= {0.0, np.float32(1 / 0.75)}
  assert abs((values == 0).mean() - 0.25) < 0.02
  out.sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), values, err_msg="the gradient is the same mask and scale")
  with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"): nn.Dropout(1.5)


def test_default_init_matches_torch_distributions():
  """Weights and biases are U(-1/sqrt(fan_in), 1/sqrt(fan_in)) as torch's defaults; embeddings N(0, 1); norms 1/0."""
  torch.manual_seed(0)
  layers = [(nn.Linear(50, 40), torch.nn.Linear(50, 40)), (nn.Conv2d(6, 8, 3, groups=2), torch.nn.Conv2d(6, 8, 3,
            groups=2)), (nn.ConvTranspose2d(6, 8, 3, groups=2), torch.nn.ConvTranspose2d(6, 8, 3, groups=2))]
  for ours, theirs in layers:
    bound = 1 / math.sqrt(math.prod(theirs.weight.shape[1:]))
    for name in ("weight", "bias"):
      a, b = getattr(ours, name), getattr(theirs, name).detach().numpy()
      assert a.shape == b.shape and a.requires_grad
      assert np.abs(b).max() <= bound and np.abs(a.numpy()).max() <= bound, f"{name} outside torch's bound"
    w = ours.weight.numpy()
    assert np.abs(w).max() > 0.95 * bound and abs(w.std() / (bound / math.sqrt(3)) - 1) < 0.1, "not U(-b, b)"
  emb = nn.Embedding(200, 50).weight.numpy()
  assert abs(emb.mean()) < 0.03 and abs(emb.std() - 1) < 0.03
  for norm in (nn.BatchNorm2d(3), nn.LayerNorm(3), nn.GroupNorm(1, 3)):
    np.testing.assert_array_equal(norm.weight.numpy(), np.ones(3))
    np.testing.assert_array_equal(norm.bias.numpy(), np.zeros(3))
  bn = nn.BatchNorm2d(3)
  assert bn.num_batches_tracked.dtype is dtypes.int64 and bn.num_batches_tracked.shape == ()
  assert bn.running_mean.requires_grad is False and bn.weight.requires_grad is True


def test_state_dict_keys_match_torch():
  pairs = [(nn.Linear(2, 3), torch.nn.Linear(2, 3)), (nn.Conv2d(2, 3, 1, bias=False), torch.nn.Conv2d(2, 3, 1,
           bias=False)), (nn.BatchNorm2d(2), torch.nn.BatchNorm2d(2)), (nn.LayerNorm(2), torch.nn.LayerNorm(2)),
           (nn.BatchNorm2d(2, track_running_stats=False), torch.nn.BatchNorm2d(2, track_running_stats=False)),
           (nn.GroupNorm(1, 2, affine=False), torch.nn.GroupNorm(1, 2, affine=False)), (nn.Embedding(3, 2),
           torch.nn.Embedding(3, 2)), (nn.ConvTranspose2d(2, 3, 2), torch.nn.ConvTranspose2d(2, 3, 2))]
  for ours, theirs in pairs:
    own = get_state_dict(ours)
    assert list(own) == list(theirs.state_dict()), type(ours).__name__
    for k, v in theirs.state_dict().items(): assert own[k].shape == tuple(v.shape), k
