"""Losses of fusegrad.nn.functional against torch.nn.functional: values and gradients for every reduction.

Cross entropy is checked with class-index targets (2-d and spatial, unbatched, ignore_index) and with probability
targets, each with and without label smoothing; the binary losses also at saturated inputs (probabilities 0 and 1,
logits of +-100), where a naive formula overflows. Bad inputs must raise errors that name the loss and the shapes.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import fusegrad.nn.functional as F
from fusegrad import Tensor

REDUCTIONS = ["mean", "sum", "none"]


def compare(our_fn, torch_fn, inputs: list[np.ndarray], grad_of: tuple[int, ...] = (0,), atol: float = 1e-5):
  """Apply both losses to the same inputs; compare the values and the grads of the inputs listed in grad_of."""
  ts = [torch.tensor(x, requires_grad=i in grad_of) for i, x in enumerate(inputs)]
  fs = [Tensor(x, requires_grad=True if i in grad_of else None) for i, x in enumerate(inputs)]
  out_t, out_f = torch_fn(*ts), our_fn(*fs)
  assert out_f.shape == tuple(out_t.shape)
  np.testing.assert_allclose(out_f.numpy(), out_t.detach().numpy(), atol=atol, rtol=1e-4, err_msg="value")
  g = np.random.default_rng(1).standard_normal(out_t.shape).astype(np.float32)
  (out_t * torch.tensor(g)).sum().backward()
  (out_f * Tensor(g)).sum().backward()
  for i in grad_of:
    np.testing.assert_allclose(fs[i].grad.numpy(), ts[i].grad.numpy(), atol=atol, rtol=1e-4, err_msg=f"grad {i}")


rng = np.random.default_rng(0)
LOGITS_2D = (rng.standard_normal((6, 5)) * 3).astype(np.float32)
TARGET_2D = np.array([0, 4, 2, 2, 1, 3], dtype=np.int64)
LOGITS_4D = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
TARGET_4D = rng.integers(0, 4, (2, 3, 3)).astype(np.int64)


CLASS_TARGET_CASES = [(name, reduction, smoothing) for name in ("2d", "spatial") for reduction in REDUCTIONS
                      for smoothing in (0.0, 0.1) if name == "2d" or reduction != "sum"]


@pytest.mark.parametrize("name,reduction,smoothing", CLASS_TARGET_CASES)
def test_cross_entropy_class_targets(name, reduction, smoothing):
  logits, target = (LOGITS_2D, TARGET_2D) if name == "2d" else (LOGITS_4D, TARGET_4D)
  compare(lambda x, y: F.cross_entropy(x, y, reduction=reduction, label_smoothing=smoothing),
          lambda x, y: TF.cross_entropy(x, y, reduction=reduction, label_smoothing=smoothing), [logits, target])


@pytest.mark.parametrize("reduction,smoothing", [("mean", 0.0), ("mean", 0.2), ("sum", 0.2), ("none", 0.0)])
def test_cross_entropy_ignore_index(reduction, smoothing):
  target = TARGET_2D.copy()
  target[[1, 4]] = -100
  compare(lambda x, y: F.cross_entropy(x, y, reduction=reduction, label_smoothing=smoothing),
          lambda x, y: TF.cross_entropy(x, y, reduction=reduction, label_smoothing=smoothing), [LOGITS_2D, target])
  target[[1, 4]] = 3   # a valid class as ignore_index
  compare(lambda x, y: F.cross_entropy(x, y, reduction=reduction, ignore_index=3),
          lambda x, y: TF.cross_entropy(x, y, reduction=reduction, ignore_index=3), [LOGITS_2D, target])


@pytest.mark.parametrize("reduction,smoothing", [("mean", 0.0), ("sum", 0.3), ("none", 0.3)])
def test_cross_entropy_probability_targets(reduction, smoothing):
  probs = np.random.default_rng(2).dirichlet(np.ones(5), size=6).astype(np.float32)
  compare(lambda x, y: F.cross_entropy(x, y, reduction=reduction, label_smoothing=smoothing),
          lambda x, y: TF.cross_entropy(x, y, reduction=reduction, label_smoothing=smoothing), [LOGITS_2D, probs],
          grad_of=(0, 1))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_unbatched(reduction):
  compare(lambda x, y: F.cross_entropy(x, y, reduction=reduction, label_smoothing=0.1),
          lambda x, y: TF.cross_entropy(x, y, reduction=reduction, label_smoothing=0.1), [LOGITS_2D[0], np.array(3)])


def test_sparse_categorical_crossentropy_is_cross_entropy():
  compare(lambda x, y: F.sparse_categorical_crossentropy(x, y, label_smoothing=0.1),
          lambda x, y: TF.cross_entropy(x, y, label_smoothing=0.1), [LOGITS_2D, TARGET_2D])
  with pytest.raises(TypeError, match="class indices"):
    F.sparse_categorical_crossentropy(Tensor(LOGITS_2D), Tensor(LOGITS_2D))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss(reduction):
  logprobs = torch.tensor(LOGITS_2D).log_softmax(1).numpy()
  target = TARGET_2D.copy()
  target[2] = -100
  compare(lambda x, y: F.nll_loss(x, y, reduction=reduction), lambda x, y: TF.nll_loss(x, y, reduction=reduction),
          [logprobs, target])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy(reduction):
  p = np.array([[0.1, 0.5, 0.9], [0.3, 1e-4, 0.999]], dtype=np.float32)
  y = np.array([[0.0, 1.0, 1.0], [0.5, 0.0, 1.0]], dtype=np.float32)
  compare(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction),
          lambda a, b: TF.binary_cross_entropy(a, b, reduction=reduction), [p, y])


def test_binary_cross_entropy_saturated():
  """p = 0 or 1 gives torch's clamped log (-100), not inf or nan."""
  p, y = np.array([0.0, 1.0, 0.0, 1.0], np.float32), np.array([1.0, 0.0, 0.0, 1.0], np.float32)
  out = F.binary_cross_entropy(Tensor(p), Tensor(y), reduction="none").numpy()
  np.testing.assert_allclose(out, TF.binary_cross_entropy(torch.tensor(p), torch.tensor(y), reduction="none").numpy())


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("pos_weight", [None, np.array([0.5, 2.0, 3.0], np.float32)], ids=["plain", "pos_weight"])
def test_binary_cross_entropy_with_logits(reduction, pos_weight):
  x = np.array([[-100.0, -3.0, 0.0], [2.0, 50.0, 100.0], [-0.5, 0.5, 88.0]], dtype=np.float32)
  y = np.array([[1.0, 0.0, 1.0], [0.5, 1.0, 0.0], [0.0, 1.0, 1.0]], dtype=np.float32)
  pw_t = None if pos_weight is None else torch.tensor(pos_weight)
  pw_f = None if pos_weight is None else Tensor(pos_weight)
  compare(lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction, pos_weight=pw_f),
          lambda a, b: TF.binary_cross_entropy_with_logits(a, b, reduction=reduction, pos_weight=pw_t), [x, y],
          grad_of=(0, 1), atol=1e-4)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_mse_and_l1(reduction):
  a, b = LOGITS_2D, np.random.default_rng(3).standard_normal(LOGITS_2D.shape).astype(np.float32)
  compare(lambda x, y: F.mse_loss(x, y, reduction=reduction), lambda x, y: TF.mse_loss(x, y, reduction=reduction),
          [a, b], grad_of=(0, 1))
  compare(lambda x, y: F.l1_loss(x, y, reduction=reduction), lambda x, y: TF.l1_loss(x, y, reduction=reduction),
          [a, b], grad_of=(0, 1))


def test_loss_errors():
  logits = Tensor(LOGITS_2D)
  with pytest.raises(ValueError, match=r"cross_entropy: input \(6, 5\) \(N, C, ...\) needs class-index targets of "
                                       r"shape \(6,\), got \(5,\)"):
    F.cross_entropy(logits, Tensor(TARGET_2D[:5]))
  with pytest.raises(ValueError, match=r"probability targets.*\(6, 5\) and target \(6, 4\)"):
    F.cross_entropy(logits, Tensor(np.zeros((6, 4), np.float32)))
  with pytest.raises(IndexError, match="target class 5 is out of range for 5 classes"):
    F.cross_entropy(logits, Tensor(np.array([0, 1, 2, 3, 4, 5])))
  with pytest.raises(ValueError, match="reduction must be one of"): F.cross_entropy(logits, Tensor(TARGET_2D),
                                                                                    reduction="avg")
  with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\]"):
    F.cross_entropy(logits, Tensor(TARGET_2D), label_smoothing=1.5)
  with pytest.raises(ValueError, match=r"mse_loss: input \(6, 5\) and target \(5, 6\) must have the same shape"):
    F.mse_loss(logits, logits.T)
  with pytest.raises(ValueError, match="binary_cross_entropy: input"):
    F.binary_cross_entropy(logits.sigmoid(), Tensor.ones(6))
  with pytest.raises(TypeError, match="nll_loss: class-index targets must be integers"):
    F.nll_loss(logits, Tensor.ones(6))
