"""Tests for fusegrad.tensor and fusegrad.autograd basics: creation, properties, running the graph, randomness,
devices, and backward on small graphs whose gradients are worked out by hand.

The per-op differential suite against PyTorch is tests/test_ops.py; here each test pins down one piece of the Tensor
contract (dtype inference, laziness, one-schedule realize, seeding, tape bookkeeping) on every backend.
"""
import math

import numpy as np

from fusegrad import Device, GlobalCounters, Tensor, dtypes
from fusegrad.engine.schedule import create_schedule


def kernels(*tensors: Tensor) -> int:
  """How many kernels realizing these tensors takes (copies and allocations not counted)."""
  return sum(si.ast.op.name == "SINK" for si in create_schedule([t.lazydata for t in tensors]))


# ***** creation *****

def test_from_python_scalars_and_lists(device):
  assert Tensor(3.5, device=device).dtype is dtypes.float32 and Tensor(3.5, device=device).shape == ()
  assert Tensor(3, device=device).dtype is dtypes.int64
  assert Tensor(True, device=device).dtype is dtypes.bool
  t = Tensor([[1, 2, 3], [4, 5, 6]], device=device)
  assert t.shape == (2, 3) and t.dtype is dtypes.int64 and t.tolist() == [[1, 2, 3], [4, 5, 6]]
  assert Tensor([1, 2.5], device=device).dtype is dtypes.float32
  assert Tensor([True, 2], device=device).dtype is dtypes.int64
  assert Tensor((1.0, 2.0), device=device).tolist() == [1.0, 2.0]


def test_from_numpy_keeps_dtype(device):
  for np_dt, dt in [(np.float64, dtypes.float64), (np.float16, dtypes.float16), (np.int32, dtypes.int32),
                    (np.uint8, dtypes.uint8), (np.bool_, dtypes.bool)]:
    arr = np.arange(6).reshape(2, 3).astype(np_dt)
    t = Tensor(arr, device=device)
    assert t.dtype is dt and t.shape == (2, 3)
    np.testing.assert_array_equal(t.numpy(), arr)
  strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
  np.testing.assert_array_equal(Tensor(strided, device=device).numpy(), strided)


def test_explicit_dtype(device):
  assert Tensor([1, 2], dtype=dtypes.float16, device=device).numpy().dtype == np.float16
  assert Tensor([1.7, -1.7], dtype="int32", device=device).tolist() == [1, -1]
  assert Tensor(np.ones(2), dtype=np.float32, device=device).dtype is dtypes.float32
  assert Tensor([1.0, 3.14159], dtype="bfloat16", device=device).tolist() == [1.0, 3.140625]


def test_empty_data():
  t = Tensor([])
  assert t.shape == (0,) and t.dtype is dtypes.float32 and t.numpy().shape == (0,)
  assert Tensor.zeros(0, 3).sum(0).tolist() == [0.0, 0.0, 0.0]


def test_full_zeros_ones(device):
  assert Tensor.zeros(2, 3, device=device).tolist() == [[0.0] * 3] * 2
  assert Tensor.ones((2,), device=device).dtype is dtypes.float32
  assert Tensor.ones(2, dtype="int8", device=device).tolist() == [1, 1]
  assert Tensor.full((2, 2), 7, device=device).dtype is dtypes.int64
  assert Tensor.full(3, 2.5, device=device).tolist() == [2.5] * 3
  assert Tensor.full((1,), True, device=device).dtype is dtypes.bool
  assert Tensor.empty(2, 2, device=device).shape == (2, 2)
  assert Tensor.zeros(3).device == Device.DEFAULT


def test_arange_linspace_eye(device):
  assert Tensor.arange(5, device=device).tolist() == [0, 1, 2, 3, 4]
  assert Tensor.arange(5).dtype is dtypes.int64 and Tensor.arange(0, 2, 0.5).dtype is dtypes.float32
  assert Tensor.arange(1, 2, 0.25, device=device).tolist() == [1.0, 1.25, 1.5, 1.75]
  assert Tensor.arange(5, 0, -2, device=device).tolist() == [5, 3, 1]
  assert Tensor.arange(3, 3).shape == (0,)
  assert Tensor.linspace(0, 1, 5, device=device).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
  np.testing.assert_array_equal(Tensor.eye(3, device=device).numpy(), np.eye(3))
  np.testing.assert_array_equal(Tensor.eye(2, 4, device=device).numpy(), np.eye(2, 4))
  np.testing.assert_array_equal(Tensor.eye(4, 2, device=device).numpy(), np.eye(4, 2))


def test_like_constructors(device):
  x = Tensor([[1, 2], [3, 4]], dtype="int32", device=device)
  for fn, value in [(Tensor.zeros_like, 0), (Tensor.ones_like, 1)]:
    y = fn(x)
    assert y.shape == x.shape and y.dtype is dtypes.int32 and y.device == device and y.tolist() == [[value] * 2] * 2
  assert Tensor.full_like(x, 9).tolist() == [[9, 9], [9, 9]] and x.ones_like().tolist() == [[1, 1], [1, 1]]
  assert Tensor.zeros_like(x, dtype="float32").dtype is dtypes.float32
  assert Tensor.empty_like(x).shape == (2, 2)
  f = Tensor.rand(2, 3, device=device)
  assert Tensor.rand_like(f).shape == (2, 3) and Tensor.randn_like(f).dtype is dtypes.float32


# ***** properties *****

def test_properties(device):
  t = Tensor(np.zeros((2, 3, 4), np.float32), device=device)
  assert t.shape == (2, 3, 4) and t.ndim == 3 and t.numel() == 24 and t.device == device
  assert t.size() == (2, 3, 4) and t.size(-1) == 4 and len(t) == 2
  assert t.T.shape == (4, 3, 2) and t.element_size() == 4 and t.nbytes() == 96
  assert t.requires_grad is None and t.grad is None and t.is_leaf
  assert isinstance(t.lazydata.shape, tuple)


def test_repr_shows_data_only_when_realized():
  t = Tensor([1, 2])
  assert repr(t) == f"<Tensor [1, 2] shape=(2,) device={Device.DEFAULT} dtype=int64>"
  lazy = t + 1
  assert "[" not in repr(lazy) and "shape=(2,)" in repr(lazy) and "int64" in repr(lazy)
  assert "requires_grad=True" in repr(Tensor([1.0], requires_grad=True))


def test_hash_is_identity_and_eq_builds_a_tensor():
  a, b = Tensor([1, 2]), Tensor([1, 2])
  assert len({a, b}) == 2 and {a: 1}[a] == 1
  eq = a == b
  assert isinstance(eq, Tensor) and eq.dtype is dtypes.bool and eq.tolist() == [True, True]
  assert (a == None) is False  # noqa: E711  (not a tensor: falls back to identity)


def test_iter_and_scalars(device):
  t = Tensor([[1, 2], [3, 4]], device=device)
  assert [row.tolist() for row in t] == [[1, 2], [3, 4]]
  assert float(Tensor([2.5], device=device)) == 2.5 and int(Tensor(7, device=device)) == 7
  assert bool(Tensor([1], device=device)) and not bool(Tensor(0.0, device=device))


def test_promotion_of_scalars_and_0d_tensors():
  i32, f16 = Tensor([1, 2], dtype="int32"), Tensor([1.0], dtype="float16")
  assert (i32 + 1).dtype is dtypes.int32 and (i32 + 1.5).dtype is dtypes.float32 and (i32 / 2).dtype is dtypes.float32
  assert (Tensor([True]) + 1).dtype is dtypes.int64 and (Tensor([True]) * True).dtype is dtypes.bool
  assert (f16 * 3.0).dtype is dtypes.float16 and (i32 + Tensor([1], dtype="int64")).dtype is dtypes.int64
  assert (i32 + Tensor(1)).dtype is dtypes.int32                      # a 0-d tensor only raises the category
  assert (i32 + Tensor(1.0, dtype="float64")).dtype is dtypes.float64
  assert (f16 + Tensor(1.0)).dtype is dtypes.float16 and (Tensor(1) + Tensor(1.0)).dtype is dtypes.float32
  assert (np.float32(2.0) * Tensor([1.0, 2.0])).tolist() == [2.0, 4.0]   # numpy scalars defer to Tensor
  assert (Tensor([1, 2]) < np.int64(2)).tolist() == [True, False]


# ***** running the graph *****

def test_graph_is_lazy(device):
  x = Tensor([1.0, 2.0, 3.0], device=device)
  before = GlobalCounters.kernel_count
  y = ((x + 1) * 2).exp().sum()
  z = x.reshape(3, 1).expand(3, 4).permute(1, 0)[1:, ::2]
  assert GlobalCounters.kernel_count == before
  assert y.lazydata.realized is None and z.shape == (3, 2)
  assert math.isclose(y.item(), sum(math.exp((v + 1) * 2) for v in (1, 2, 3)), rel_tol=1e-5)
  assert GlobalCounters.kernel_count > before


def test_realize_returns_self_and_keeps_values(device):
  x = Tensor([1.0, 2.0], device=device)
  y = x * 3
  assert y.realize() is y and y.lazydata.realized is not None
  assert y.tolist() == [3.0, 6.0]


def test_realize_several_in_one_schedule(device):
  x = Tensor(np.arange(6, dtype=np.float32), device=device)
  total = x.sum()
  a, b = x - total, x * total
  GlobalCounters.reset()
  a.realize(b)
  assert GlobalCounters.kernel_count == 3   # the shared sum once, then a and b
  assert a.lazydata.realized is not None and b.lazydata.realized is not None
  assert a.tolist() == [-15.0, -14.0, -13.0, -12.0, -11.0, -10.0] and b.tolist()[-1] == 75.0
  Tensor.realize_all(a, b)
  assert GlobalCounters.kernel_count == 3


def test_numpy_of_views_and_constants(device):
  x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=device).realize()
  np.testing.assert_array_equal(x.T.numpy(), np.arange(12).reshape(3, 4).T)
  np.testing.assert_array_equal(x[1:, ::-2].numpy(), np.arange(12).reshape(3, 4)[1:, ::-2])
  assert Tensor.full((2, 2), 4.0, device=device).numpy().tolist() == [[4.0, 4.0], [4.0, 4.0]]
  assert Tensor.ones(2, 2, device=device).pad(((1, 0), None)).tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]


def test_item_and_tolist(device):
  assert Tensor([[5]], device=device).item() == 5 and isinstance(Tensor([[5]]).item(), int)
  assert isinstance(Tensor(1.5, device=device).item(), float)
  assert Tensor(True, device=device).item() is True
  assert Tensor(2.0, device=device).tolist() == 2.0


def test_fusion_kernel_counts():
  a, b = Tensor.rand(8, 16).realize(), Tensor.rand(16, 4).realize()
  x, w, bias = Tensor.rand(2, 3, 8, 8).realize(), Tensor.rand(4, 3, 3, 3).realize(), Tensor.rand(4).realize()
  assert kernels(a @ b) == 1 and kernels((a @ b).relu() + 1) == 1
  assert kernels(x.conv2d(w, bias, stride=2, padding=1)) == 1
  assert kernels(x.max_pool2d(3, 2, 1)) == 1 and kernels(x.avg_pool2d(2)) == 1
  assert kernels(a.cat(a * 2, dim=1)) == 1 and kernels(a[Tensor([1, 2, 0])]) == 1
  assert kernels(((a - 1).exp() * 2).sum(1)) == 1


# ***** randomness *****

def test_manual_seed_is_deterministic():
  Tensor.manual_seed(42)
  first = [Tensor.rand(5).tolist(), Tensor.randn(3).tolist(), Tensor.randint(4, low=0, high=100).tolist()]
  Tensor.manual_seed(42)
  again = [Tensor.rand(5).tolist(), Tensor.randn(3).tolist(), Tensor.randint(4, low=0, high=100).tolist()]
  assert first == again
  Tensor.manual_seed(42)
  a, b = Tensor.rand(5).tolist(), Tensor.rand(5).tolist()
  assert a != b   # each call draws new numbers
  Tensor.manual_seed(7)
  assert Tensor.rand(5).tolist() != a


def test_random_ranges_and_statistics(device):
  Tensor.manual_seed(0)
  u = Tensor.rand(20000, device=device).numpy()
  assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
  n = Tensor.randn(20000, device=device).numpy()
  assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03
  v = Tensor.uniform(1000, low=-3, high=-1, device=device).numpy()
  assert v.min() >= -3 and v.max() < -1
  r = Tensor.randint(1000, low=2, high=5, device=device)
  assert r.dtype is dtypes.int64 and set(r.numpy().tolist()) == {2, 3, 4}
  assert Tensor.rand(2, 3, dtype="float16").dtype is dtypes.float16
  assert Tensor.rand(3, requires_grad=True).requires_grad and Tensor.kaiming_uniform(4, 3).shape == (4, 3)


def test_random_is_the_same_on_every_device():
  Tensor.manual_seed(3)
  a = Tensor.rand(4, device="CPU").tolist()
  Tensor.manual_seed(3)
  assert Tensor.rand(4, device="PYTHON").tolist() == a


# ***** devices *****

def test_to_moves_between_cpu_and_python():
  x = Tensor([[1.0, 2.0], [3.0, 4.0]], device="CPU")
  y = x.to("PYTHON")
  assert y.device == "PYTHON" and y.tolist() == x.tolist()
  z = ((y * 2).T + 1).to("cpu")
  assert z.device == "CPU" and z.tolist() == [[3.0, 7.0], [5.0, 9.0]]
  assert x.to("CPU") is x
  assert Tensor([1, 2], device="python").device == "PYTHON"


def test_gradient_flows_back_across_devices():
  x = Tensor([1.0, -2.0], device="CPU", requires_grad=True)
  (x.to("PYTHON") * Tensor([3.0, 4.0], device="PYTHON")).sum().backward()
  assert x.grad.device == "CPU" and x.grad.tolist() == [3.0, 4.0]


# ***** autograd *****

def test_backward_square_sum(device):
  x = Tensor([1.0, -2.0, 3.0], device=device, requires_grad=True)
  y = (x * x).sum()
  assert not y.is_leaf and y.requires_grad
  y.backward()
  assert x.grad.tolist() == [2.0, -4.0, 6.0]


def test_backward_product_rule_and_reuse(device):
  a = Tensor([2.0, 3.0], device=device, requires_grad=True)
  b = Tensor([5.0, 7.0], device=device, requires_grad=True)
  ((a * b + a) / 2).sum().backward()    # d/da = (b + 1) / 2, d/db = a / 2
  assert a.grad.tolist() == [3.0, 4.0] and b.grad.tolist() == [1.0, 1.5]


def test_backward_through_broadcast_and_matmul(device):
  w = Tensor([[1.0, 2.0], [3.0, 4.0]], device=device, requires_grad=True)
  x = Tensor([[1.0, 1.0], [0.0, 2.0], [1.0, -1.0]], device=device)
  bias = Tensor([0.5, -0.5], device=device, requires_grad=True)
  (x @ w + bias).sum().backward()
  # d/dw[i][j] = sum over rows of x[:, i]; d/dbias = number of rows
  assert w.grad.tolist() == [[2.0, 2.0], [2.0, 2.0]] and bias.grad.tolist() == [3.0, 3.0]


def test_backward_mean_exp_log(device):
  x = Tensor([1.0, 2.0], device=device, requires_grad=True)
  (x.exp().mean() + x.log().sum()).backward()
  np.testing.assert_allclose(x.grad.numpy(), np.exp([1.0, 2.0]) / 2 + 1 / np.array([1.0, 2.0]), rtol=1e-5)


def test_backward_max_splits_ties(device):
  x = Tensor([1.0, 3.0, 3.0, 2.0], device=device, requires_grad=True)
  x.max().backward()
  assert x.grad.tolist() == [0.0, 0.5, 0.5, 0.0]


def test_backward_movement_and_indexing(device):
  x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device, requires_grad=True)
  y = x.T.reshape(6)[::2] * Tensor([1.0, 2.0, 3.0], device=device)
  z = x[Tensor([1, 1])].sum() + y.sum() + x.pad(((1, 0), (0, 2))).sum()
  z.backward()
  # x.T.reshape(6) is [x00, x10, x01, x11, x02, x12]; [::2] takes x00, x01, x02 with weights 1, 2, 3
  assert x.grad.tolist() == [[2.0, 3.0, 4.0], [3.0, 3.0, 3.0]]


def test_backward_with_explicit_gradient(device):
  x = Tensor([1.0, 2.0], device=device, requires_grad=True)
  (x * 3).backward(Tensor([1.0, -1.0], device=device))
  assert x.grad.tolist() == [3.0, -3.0]


def test_grads_accumulate_and_tape_is_freed(device):
  x = Tensor([1.0, 2.0], device=device, requires_grad=True)
  y = (x * 2).sum()
  y.backward()
  assert y._ctx is None
  (x * x).sum().backward()
  assert x.grad.tolist() == [4.0, 6.0]   # 2 + 2x
  z = (x * 5).sum()
  z.backward(retain_graph=True)
  z.backward()
  assert x.grad.tolist() == [14.0, 16.0]


def test_only_leaves_that_require_grad_get_grads(device):
  a = Tensor([1.0], device=device, requires_grad=True)
  b = Tensor([2.0], device=device)
  mid = a * b
  (mid * mid).sum().backward()
  assert a.grad.tolist() == [8.0] and b.grad is None and mid.grad is None


def test_no_grad_and_detach(device):
  x = Tensor([1.0, 2.0], device=device, requires_grad=True)
  with Tensor.no_grad():
    assert not Tensor.is_grad_enabled()
    y = x * 2
  assert Tensor.is_grad_enabled() and not y.requires_grad and y._ctx is None
  d = x.detach()
  assert not d.requires_grad and d.lazydata is x.lazydata
  ((x.detach() * x) + (x * 0).detach()).sum().backward()
  assert x.grad.tolist() == [1.0, 2.0]

  @Tensor.no_grad()
  def f(t: Tensor) -> Tensor: return t * 3
  assert not f(x).requires_grad


def test_requires_grad_flags():
  t = Tensor([1.0])
  assert t.requires_grad_() is t and t.requires_grad
  assert not Tensor([1.0], requires_grad=False).requires_grad
  assert not (Tensor([1.0], requires_grad=True) > 0).requires_grad      # comparisons have no gradient
  assert not Tensor([1.5], requires_grad=True).int().requires_grad       # nor do integer results


def test_train_context():
  assert not Tensor.training
  with Tensor.train():
    assert Tensor.training
    with Tensor.train(False):
      assert not Tensor.training
    assert Tensor.training
  assert not Tensor.training
  x = Tensor.ones(1000)
  assert x.dropout(0.5) is x
  with Tensor.train():
    kept = x.dropout(0.5).numpy()
  assert set(np.unique(kept).tolist()) <= {0.0, 2.0} and 300 < (kept > 0).sum() < 700


def test_deep_chain_backward():
  x = Tensor([1.0], requires_grad=True)
  y = x
  for _ in range(3000): y = y * 1.0001
  y.sum().backward()
  assert math.isclose(x.grad.item(), 1.0001 ** 3000, rel_tol=1e-3)
