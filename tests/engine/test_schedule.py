"""Fusion decisions of the scheduler, counted in kernels: what a user writes and how many kernels it becomes.

Inputs are realized first, so only the expression's own kernels are counted.
"""
import io
import contextlib
import numpy as np
import pytest
from fusegrad import Tensor, GlobalCounters, Context
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.realize import get_program


def kernels(t: Tensor) -> int:
  return sum(si.ast.op.name == "SINK" for si in create_schedule([t.lazydata]))


def inputs(*shapes):
  rng = np.random.default_rng(0)
  return [Tensor(rng.standard_normal(s).astype(np.float32)).realize() for s in shapes]


def test_elementwise_chain_into_reduce_is_one_kernel():
  a, b, c = inputs((16, 32), (16, 32), (16, 32))
  out = ((a + b) * c).relu().sum(axis=1)
  assert kernels(out) == 1
  np.testing.assert_allclose(out.numpy(), np.maximum((a.numpy() + b.numpy()) * c.numpy(), 0).sum(1), rtol=1e-5)


def test_elementwise_after_reduce_fuses():
  a, = inputs((16, 32))
  assert kernels(a.sum(axis=1) * 2 + 1) == 1
  assert kernels((a.max(axis=1, keepdim=True) + 3).exp()) == 1


def test_softmax_is_one_kernel():
  a, = inputs((8, 64))
  out = a.softmax(axis=-1)
  assert kernels(out) == 1
  e = np.exp(a.numpy() - a.numpy().max(-1, keepdims=True))
  np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_matmul_is_one_kernel():
  a, b = inputs((16, 24), (24, 8))
  assert kernels(a @ b) == 1


def test_conv2d_is_one_kernel():
  x, w = inputs((2, 3, 10, 10), (4, 3, 3, 3))
  assert kernels(x.conv2d(w, padding=1)) == 1
  assert kernels(x.conv2d(w, stride=2)) == 1


def test_movement_ops_cost_no_kernel():
  a, = inputs((4, 6))
  v = a.permute(1, 0).reshape(2, 12)[:, ::2].flip(0)
  assert kernels(v.contiguous()) == 1
  assert kernels(a.reshape(24)) == 0 or kernels(a.reshape(24)) == 1


def test_constants_are_literals_not_buffers():
  a, = inputs((32,))
  sched = create_schedule([(a * 2 + 1).lazydata])
  assert len(sched) == 1 and len(sched[0].bufs) == 2


def test_reduces_broadcast_back_fuse_into_one_kernel():
  """A reduce whose result is broadcast back along its own axes runs inside the consumer's kernel (its own loops)."""
  a, = inputs((8, 16))
  out = a - a.mean(axis=1, keepdim=True)
  assert kernels(out) == 1
  np.testing.assert_allclose(out.numpy(), a.numpy() - a.numpy().mean(1, keepdims=True), rtol=1e-5, atol=1e-6)
  c = a - a.mean(axis=1, keepdim=True)
  norm = c * (c * c).mean(axis=1, keepdim=True).add(1e-5).rsqrt()   # layernorm: mean, variance, output
  assert kernels(norm) == 1
  x = a.numpy() - a.numpy().mean(1, keepdims=True)
  np.testing.assert_allclose(norm.numpy(), x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-5), rtol=1e-4, atol=1e-5)
  # a reduce of rows feeding a reduce over those rows, and a full reduction, stay separate kernels
  assert kernels(a.sum(1).sum(0)) == 2
  assert kernels((a - a.amax(1, keepdim=True)).exp().sum(0)) == 2
  assert kernels(a - a.sum()) == 2


def test_global_counters_and_debug_line():
  a, b = inputs((64, 64), (64, 64))
  GlobalCounters.reset()
  buf = io.StringIO()
  with Context(DEBUG=2), contextlib.redirect_stdout(buf):
    (a @ b).realize()
  assert GlobalCounters.kernel_count == 1
  assert GlobalCounters.global_ops >= 2 * 64 ** 3 * 0.9
  assert GlobalCounters.global_mem >= 3 * 64 * 64 * 4
  assert GlobalCounters.time_sum_s > 0
  line = buf.getvalue()
  assert "r_" in line and "GFLOP/s" in line and "GB/s" in line
  GlobalCounters.reset()
  assert GlobalCounters.kernel_count == 0 and GlobalCounters.time_sum_s == 0


@pytest.mark.parametrize("level, needle", [(3, "opts"), (4, "void "), (5, "LOAD")])
def test_debug_levels_print_opts_source_and_uops(level, needle):
  a, = inputs((33 + level, 7))
  buf = io.StringIO()
  with Context(DEBUG=level, NOCACHE=True), contextlib.redirect_stdout(buf):
    (a * 3 - 1).sum(0).realize()
  assert needle in buf.getvalue()


def test_noopt_turns_the_heuristics_off():
  """NOOPT=1 compiles the kernel with no opts; by default the heuristics apply some (and results agree)."""
  a, b = inputs((64, 64), (64, 64))
  si = create_schedule([(a @ b).lazydata])[0]
  with Context(NOOPT=True):
    plain = get_program(si.ast, "CPU", si)
  tuned = get_program(si.ast, "CPU", si)
  assert plain.opts == [] and tuned.opts != []
  with Context(NOOPT=True):
    want = (a @ b).numpy()
  np.testing.assert_allclose((a @ b).numpy(), want, rtol=1e-5, atol=1e-5)
