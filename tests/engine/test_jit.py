"""The JIT's documented semantics: capture on the 2nd call, replay after; Python values baked in; outputs reused;
changed input shapes/dtypes/devices raise instead of returning stale results. Replay through the device's graph
(CPU: prebuilt ctypes calls; CUDA: a CUDA graph) must match eager execution and kernel-by-kernel replay exactly."""
import numpy as np
import pytest
from fusegrad import Tensor, GlobalCounters, Context, Device, Variable
from fusegrad.uop import Ops
from fusegrad.engine.jit import jit, JitError
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.realize import run_schedule


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


# ***** replay through a device graph (CPUGraph / CUDAGraph) and kernel by kernel *****

def _model(a, b, c):
  """Several kernels: a matmul, a reduce, elementwise chains, two outputs, an input read by more than one kernel."""
  h = (a @ b).relu()
  h.realize()
  s = (h * c).sum(axis=1)
  return (h + s.reshape(-1, 1)).exp2() * 0.5, (a * a).max(axis=0)


def _inputs(device, seed):
  rng = np.random.default_rng(seed)
  return [Tensor(rng.standard_normal(shape).astype(np.float32), device=device).realize()
          for shape in [(6, 12), (12, 8), (6, 8)]]


def test_graph_replay_matches_eager(device):
  f = jit(_model)
  for seed in range(6):
    ins = _inputs(device, seed)
    got = [t.numpy() for t in f(*ins)]
    want = [t.numpy() for t in _model(*ins)]
    for g, w in zip(got, want): np.testing.assert_array_equal(g, w)
  assert (f.graph is not None) == (Device[device].graph is not None)
  assert len(f.launches) >= 3


def test_graph_replay_matches_kernel_by_kernel(device):
  f, g = jit(_model), jit(_model)
  for seed in range(5):
    ins = _inputs(device, seed)
    with Context(JIT_GRAPH=False): want = [t.numpy() for t in g(*ins)]
    got = [t.numpy() for t in f(*ins)]
    for a, b in zip(got, want): np.testing.assert_array_equal(a, b)
  assert g.graph is None


def test_inputs_swap_between_live_buffers():
  """Every input stays alive, so each call hands the graph different buffers; going back to an older one works."""
  @jit
  def f(a, b): return a * 2 + b
  xs = [rand(16, seed=i) for i in range(4)]
  ys = [rand(16, seed=10 + i) for i in range(4)]
  for i in [0, 1, 2, 3, 1, 0, 3, 3, 2, 0]:
    np.testing.assert_allclose(f(xs[i], ys[3 - i]).numpy(), xs[i].numpy() * 2 + ys[3 - i].numpy(), rtol=1e-6)
  assert f.graph is not None


def test_same_buffer_reused_with_new_contents():
  @jit
  def f(a): return (a + 1).sum()
  x = rand(8)
  for i in range(5):
    x.lazydata.base.buffer.copyin(np.full(8, i, np.float32))
    assert f(x).numpy() == pytest.approx(8 * (i + 1))


def test_kwargs_inputs_swap():
  @jit
  def f(a, *, scale): return a * scale
  for i in range(4):
    a, s = rand(4, seed=i), rand(4, seed=20 + i)
    np.testing.assert_allclose(f(a, scale=s).numpy(), a.numpy() * s.numpy(), rtol=1e-6)


def test_graph_outputs_are_overwritten():
  @jit
  def f(a): return a * 3
  for i in range(3): f(rand(4, seed=i))
  x, y = rand(4, seed=7), rand(4, seed=8)
  first = f(x)
  np.testing.assert_allclose(first.numpy(), x.numpy() * 3, rtol=1e-6)
  second = f(y)
  assert second is first
  np.testing.assert_allclose(first.numpy(), y.numpy() * 3, rtol=1e-6)


def test_graph_replay_errors_still_raise():
  @jit
  def f(a): return a + 1
  for i in range(4): f(rand(4, seed=i))
  assert f.graph is not None
  with pytest.raises(JitError, match="inputs changed"):
    f(rand(8))
  with pytest.raises(JitError, match="view"):
    f(rand(2, 2).permute(1, 0))
  np.testing.assert_allclose(f(rand(4, seed=3)).numpy(), rand(4, seed=3).numpy() + 1, rtol=1e-6)


def test_graph_replay_counters_match_kernel_by_kernel():
  def run(graph: bool) -> tuple:
    f = jit(_model)
    with Context(JIT_GRAPH=graph):
      for seed in range(3): f(*_inputs(Device.DEFAULT, seed))
      GlobalCounters.reset()
      f(*_inputs(Device.DEFAULT, 9))
    return GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem, len(f.launches)
  fast, slow = run(True), run(False)
  assert fast == slow and fast[0] == fast[3]


def test_debug_replays_kernel_by_kernel(capsys):
  @jit
  def f(a): return (a * 2).sum()
  for i in range(3): f(rand(8, seed=i))
  x = rand(8, seed=5)
  with Context(DEBUG=2): out = f(x).numpy()
  assert "***" in capsys.readouterr().out
  assert out == pytest.approx(x.numpy().sum() * 2, rel=1e-5)
  y = rand(8, seed=6)
  assert f(y).numpy() == pytest.approx(y.numpy().sum() * 2, rel=1e-5)


def test_symbolic_values_are_baked_in():
  """A kernel over a bound Variable takes its value as an int argument; replay passes the captured value."""
  n = Variable("n", 1, 16)

  @jit
  def f(a):
    view = a.lazydata.shrink(((0, n.bind(5)),))
    out = view.alu(Ops.MUL, view).contiguous()
    run_schedule(create_schedule([out]))
    return out
  for i in range(5):
    x = Tensor(np.arange(16, dtype=np.float32) + i).realize()
    np.testing.assert_allclose(f(x).base.buffer.numpy(), (np.arange(5) + i) ** 2.0)
  assert f.graph is not None
