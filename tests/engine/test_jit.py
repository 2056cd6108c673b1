"""The JIT's documented semantics: capture on the 2nd call, replay after; Python values baked in; outputs reused;
changed input shapes/dtypes/devices raise instead of returning stale results."""
import numpy as np
import pytest
from fusegrad import Tensor, GlobalCounters
from fusegrad.engine.jit import jit, JitError


def rand(*shape, seed=0):
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).realize()


def test_replay_computes_with_new_inputs():
  @jit
  def f(a, b): return (a @ b).relu() + 1
  for seed in range(5):
    a, b = rand(8, 16, seed=seed), rand(16, 4, seed=seed + 100)
    np.testing.assert_allclose(f(a, b).numpy(), np.maximum(a.numpy() @ b.numpy(), 0) + 1, rtol=1e-5, atol=1e-5)


def test_replay_runs_captured_kernels_only():
  @jit
  def f(a): return (a * 2).sum(axis=1)
  for i in range(3): f(rand(32, 32, seed=i))
  GlobalCounters.reset()
  f(rand(32, 32, seed=9))
  assert GlobalCounters.kernel_count == 1


def test_python_values_are_baked_in():
  scale = [2.0]

  @jit
  def f(a): return a * scale[0]
  for _ in range(3): f(rand(4))
  scale[0] = 100.0
  x = rand(4, seed=5)
  np.testing.assert_allclose(f(x).numpy(), x.numpy() * 2.0, rtol=1e-6)


def test_outputs_are_reused_between_calls():
  @jit
  def f(a): return a + 1
  for i in range(3): f(rand(4, seed=i))
  first = f(rand(4, seed=10))
  second = f(rand(4, seed=11))
  assert first is second


def test_changed_shape_raises():
  @jit
  def f(a): return a + 1
  for i in range(3): f(rand(4, seed=i))
  with pytest.raises(JitError, match="inputs changed"):
    f(rand(5))
  with pytest.raises(JitError, match="inputs changed"):
    f(rand(4).cast("int32").realize())


def test_view_inputs_are_refused():
  @jit
  def f(a): return a + 1
  with pytest.raises(JitError, match="view"):
    f(rand(4, 4).permute(1, 0))
