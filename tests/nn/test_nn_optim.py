"""Optimizers of fusegrad.nn.optim against torch.optim, step by step, and the one-schedule-per-step contract.

Raw parameters get the same fixed gradients on both sides for several steps; after every step the parameters must
match. A small model (Linear, BatchNorm2d, Conv2d) is also trained end to end on both sides. step() must run one
schedule that realizes parameters, optimizer state and buffers, and reuse its compiled kernels when lr changes.
"""
import numpy as np
import pytest
import torch

import fusegrad.engine.schedule
import fusegrad.nn as nn
import fusegrad.tensor
from fusegrad import GlobalCounters, Tensor
from fusegrad.nn import optim
from fusegrad.nn.state import get_parameters, get_state_dict

STEPS = 5
SHAPES = [(3, 4), (5,)]


def run_both(make_ours, make_theirs, steps: int = STEPS, lr_schedule=None):
  """Step both optimizers with the same gradients; compare parameters (and optimizer state where named) each step."""
  rng = np.random.default_rng(0)
  init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
  ours_p = [Tensor(x, requires_grad=True) for x in init]
  theirs_p = [torch.tensor(x, requires_grad=True) for x in init]
  ours, theirs = make_ours(ours_p), make_theirs(theirs_p)
  for step in range(steps):
    grads = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    if lr_schedule is not None:
      ours.lr = lr_schedule(step)
      for group in theirs.param_groups: group["lr"] = lr_schedule(step)
    for p, q, g in zip(ours_p, theirs_p, grads):
      p.grad, q.grad = Tensor(g), torch.tensor(g)
    ours.step()
    theirs.step()
    for p, q in zip(ours_p, theirs_p):
      np.testing.assert_allclose(p.numpy(), q.detach().numpy(), atol=1e-6, rtol=1e-5, err_msg=f"step {step}")


SGD_CASES = [dict(), dict(momentum=0.9), dict(momentum=0.9, dampening=0.3), dict(momentum=0.8, nesterov=True),
             dict(weight_decay=0.1), dict(momentum=0.9, nesterov=True, weight_decay=0.05)]


@pytest.mark.parametrize("kw", SGD_CASES, ids=str)
def test_sgd(kw):
  run_both(lambda ps: optim.SGD(ps, lr=0.1, **kw), lambda ps: torch.optim.SGD(ps, lr=0.1, **kw))


ADAM_CASES = [dict(), dict(lr=0.01, betas=(0.8, 0.99)), dict(weight_decay=0.1), dict(eps=1e-3, amsgrad=True)]


@pytest.mark.parametrize("kw", ADAM_CASES, ids=str)
def test_adam(kw):
  run_both(lambda ps: optim.Adam(ps, **kw), lambda ps: torch.optim.Adam(ps, **kw))


@pytest.mark.parametrize("kw", [dict(), dict(lr=0.05, weight_decay=0.3), dict(amsgrad=True)], ids=str)
def test_adamw(kw):
  run_both(lambda ps: optim.AdamW(ps, **kw), lambda ps: torch.optim.AdamW(ps, **kw))


def test_lr_changes_between_steps():
  schedule = [0.1, 0.05, 0.3, 0.01, 0.2].__getitem__
  run_both(lambda ps: optim.SGD(ps, lr=1.0, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=1.0, momentum=0.9),
           lr_schedule=schedule)
  run_both(lambda ps: optim.AdamW(ps), lambda ps: torch.optim.AdamW(ps), lr_schedule=schedule)


SKIP_CASES = [(lambda ps: optim.Adam(ps, lr=0.1), lambda ps: torch.optim.Adam(ps, lr=0.1)),
              (lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))]


@pytest.mark.parametrize("make_ours,make_theirs", SKIP_CASES, ids=["adam", "sgd"])
def test_params_without_grad_are_skipped(make_ours, make_theirs):
  """A parameter without a gradient is left alone, and (as torch) its step count doesn't advance."""
  ours = [Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0, 4.0], requires_grad=True)]
  theirs = [torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([3.0, 4.0], requires_grad=True)]
  opt, torch_opt = make_ours(ours), make_theirs(theirs)
  for step in range(3):
    for p, q, g in zip(ours, theirs, ([1.0, -1.0], [0.5, -2.0] if step else None)):
      p.grad, q.grad = (None, None) if g is None else (Tensor(g), torch.tensor(g))
    opt.step()
    torch_opt.step()
    if step == 0: np.testing.assert_array_equal(ours[1].numpy(), [3.0, 4.0])
    for p, q in zip(ours, theirs): np.testing.assert_allclose(p.numpy(), q.detach().numpy(), rtol=1e-6)
  opt.zero_grad()
  assert all(p.grad is None for p in ours)


def test_params_on_several_devices():
  """Each device gets its own copy of the per-step values; one step updates parameters on CPU and PYTHON."""
  ours = [Tensor([1.0, 2.0], device="PYTHON", requires_grad=True), Tensor([3.0, 4.0], device="CPU", requires_grad=True)]
  theirs = [torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([3.0, 4.0], requires_grad=True)]
  opt, torch_opt = optim.Adam(ours, lr=0.1), torch.optim.Adam(theirs, lr=0.1)
  for step in range(2):
    for p, q, g in zip(ours, theirs, ([1.0, -1.0], [0.5, 2.0 * step])):
      p.grad, q.grad = Tensor(g, device=p.device), torch.tensor(g)
    opt.step()
    torch_opt.step()
  for p, q in zip(ours, theirs): np.testing.assert_allclose(p.numpy(), q.detach().numpy(), rtol=1e-6)
  assert [p.device for p in ours] == ["PYTHON", "CPU"]


class TinyNet:
  def __init__(self):
    self.conv = nn.Conv2d(2, 3, 3, padding=1, bias=False)   # BN cancels a bias: its grad is noise
    self.bn = nn.BatchNorm2d(3)
    self.head = [nn.Linear(3 * 4 * 4, 5)]

  def __call__(self, x: Tensor) -> Tensor:
    return self.head[0](self.bn(self.conv(x)).relu().flatten(1))


class TorchTinyNet(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.conv, self.bn = torch.nn.Conv2d(2, 3, 3, padding=1, bias=False), torch.nn.BatchNorm2d(3)
    self.head = torch.nn.ModuleList([torch.nn.Linear(3 * 4 * 4, 5)])

  def forward(self, x):
    return self.head[0](self.bn(self.conv(x)).relu().flatten(1))


@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
                                  lambda ps: optim.AdamW(ps, lr=0.01)], ids=["sgd", "adamw"])
def test_train_small_model_like_torch(make):
  """get_parameters hands the optimizer the BatchNorm running stats too; step() realizes them with the weights."""
  theirs, ours = TorchTinyNet(), TinyNet()
  for name, value in theirs.state_dict().items(): get_state_dict(ours)[name].assign(Tensor(value.numpy()))
  opt = make(get_parameters(ours))
  torch_opt = (torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9, nesterov=True)
               if isinstance(opt, optim.SGD) else torch.optim.AdamW(theirs.parameters(), lr=0.01))
  assert len(opt.params) == 5 and len(opt.buffers) == 3
  rng = np.random.default_rng(0)
  for step in range(4):
    x, y = rng.standard_normal((6, 2, 4, 4)).astype(np.float32), rng.integers(0, 5, 6)
    with Tensor.train():
      opt.zero_grad()
      loss = nn.functional.cross_entropy(ours(Tensor(x)), Tensor(y))
      loss.backward()
      opt.step()
    torch_opt.zero_grad()
    torch_loss = torch.nn.functional.cross_entropy(theirs(torch.tensor(x)), torch.tensor(y))
    torch_loss.backward()
    torch_opt.step()
    np.testing.assert_allclose(loss.item(), torch_loss.item(), rtol=1e-5, err_msg=f"loss at step {step}")
  for name, value in theirs.state_dict().items():
    np.testing.assert_allclose(get_state_dict(ours)[name].numpy(), value.numpy(), atol=1e-5, rtol=1e-4, err_msg=name)


def test_step_is_one_schedule(monkeypatch):
  """Forward, backward, every parameter update, the optimizer state and the running stats: one create_schedule."""
  model = TinyNet()
  opt = optim.AdamW(get_parameters(model), lr=0.01)   # the kernels of test_train_small_model_like_torch[adamw]
  calls = []
  real = fusegrad.engine.schedule.create_schedule
  monkeypatch.setattr(fusegrad.tensor, "create_schedule", lambda outs: calls.append(len(outs)) or real(outs))
  for _ in range(2):
    calls.clear()
    with Tensor.train():
      nn.functional.cross_entropy(model(Tensor.randn(6, 2, 4, 4)), Tensor(np.arange(6) % 5)).backward()
    assert calls == [], "backward must stay lazy"
    opt.step()
    assert len(calls) == 1, f"step() ran {len(calls)} schedules"
    assert calls[0] == len(opt.params) * 3 + len(opt.buffers)   # params, exp_avg, exp_avg_sq, buffers
    for t in opt.params + opt.buffers + opt.exp_avg + opt.exp_avg_sq:
      lb = t.lazydata
      assert lb.realized is not None or lb.const_value is not None, "everything is realized (or a constant)"


def test_step_reuses_kernels_when_lr_changes():
  p = Tensor.randn(8, 8, requires_grad=True)
  opt = optim.AdamW([p], lr=0.1)
  for step in range(4):
    if step == 2: compiled = GlobalCounters.compile_count
    opt.lr = 0.1 / (step + 1)
    p.grad = Tensor.randn(8, 8)
    opt.step()
  assert GlobalCounters.compile_count == compiled, "a new lr or step count must not compile new kernels"


def test_optimizer_errors():
  p = Tensor([1.0], requires_grad=True)
  with pytest.raises(ValueError, match="nesterov needs momentum > 0"): optim.SGD([p], lr=0.1, nesterov=True)
  with pytest.raises(ValueError, match="lr must be >= 0"): optim.Adam([p], lr=-1)
  with pytest.raises(ValueError, match=r"betas must be in \[0, 1\)"): optim.Adam([p], betas=(0.9, 1.0))
  with pytest.raises(ValueError, match="no tensors that require grad"): optim.SGD([Tensor([1.0], requires_grad=False)])
  with pytest.raises(TypeError, match="params must be Tensors"): optim.SGD([np.ones(2)])
  q, index = Tensor([2.0]), Tensor([1, 2])
  assert q.requires_grad is None and index.requires_grad is None
  opt = optim.SGD([q, index])
  assert q.requires_grad is True, "an unset requires_grad is switched on"
  assert len(opt.params) == len(opt.buffers) == 1 and opt.params[0] is q and opt.buffers[0] is index, "ints: buffers"
