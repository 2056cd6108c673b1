"""Kernels with several reduces (one-pass softmax, layernorm): each reduce gets private axes and runs its own loops;
the phases share thread ids and lanes. Checked against numpy on the CPU (vector code) and on PYTHON (the SIMT
interpreter runs the GPU form: thread groups, shared-memory halving tree, barriers)."""
import numpy as np
import pytest
from fusegrad import Tensor, Context
from fusegrad.uop import Ops
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.compile import kernel_for, render_kernel
from fusegrad.engine.realize import compile_kernel, run_kernel
from fusegrad.codegen.kernel import Opt, OptOps


def _np_softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _np_layernorm(x):
  c = x - x.mean(-1, keepdims=True)
  return c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)


CASES = {
  "softmax": (lambda t: t.softmax(-1), _np_softmax),
  "log_softmax": (lambda t: t.log_softmax(-1), lambda x: x - x.max(-1, keepdims=True) -
                  np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))),
  "layernorm": (lambda t: (t - t.mean(-1, keepdim=True)) * ((t - t.mean(-1, keepdim=True)).square().mean(
    -1, keepdim=True) + 1e-5).rsqrt(), _np_layernorm),
  "centered_sum_of_squares": (lambda t: (t - t.mean(-1, keepdim=True)).square().sum(-1),
                              lambda x: ((x - x.mean(-1, keepdims=True)) ** 2).sum(-1)),
  "normalize_by_sum": (lambda t: t / t.abs().sum(-1, keepdim=True), lambda x: x / np.abs(x).sum(-1, keepdims=True)),
}
SHAPES = [(5, 7), (3, 256), (2, 1024), (2, 3, 64)]


def _kernels(t: Tensor) -> list:
  return [si for si in create_schedule([t.lazydata]) if si.ast.op is Ops.SINK]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_one_kernel_matches_numpy(device, shape, name):
  fg, ref = CASES[name]
  x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  t = Tensor(x, device=device).realize()
  out = fg(t)
  assert len(_kernels(out)) == 1
  np.testing.assert_allclose(out.numpy(), ref(x.astype(np.float64)), rtol=2e-5, atol=2e-6)


def test_without_opts(device):
  x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
  with Context(NOOPT=True):
    out = Tensor(x, device=device).softmax(-1).numpy()
  np.testing.assert_allclose(out, _np_softmax(x.astype(np.float64)), rtol=2e-5, atol=2e-6)


def test_nan_and_inf_propagate_like_numpy(device):
  x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
  x[1, 3], x[2, 5] = np.nan, np.inf
  if True:
    got = Tensor(x, device=device).softmax(-1).numpy()
    with np.errstate(invalid="ignore"):
      want = _np_softmax(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[[0, 3]], want[[0, 3]], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("gpu", ["PYTHON", "CUDA"])
def test_gpu_form_groups_every_reduce_and_shares_threads(gpu):
  """On a device with thread blocks, softmax of long rows is one block per row: both reduces grouped over the same
  threads that write the output, partials combined in shared memory with barriers (CUDA: rendered and compiled
  with NVRTC, no GPU needed)."""
  x = Tensor.rand(4, 2048, device="PYTHON").realize()
  si = _kernels(x.softmax(-1))[0]
  k = kernel_for(si.ast, gpu)
  assert [o.op for o in k.applied_opts].count(OptOps.GROUP) == 2
  assert len(k.thread_slots()) == 1
  ks = render_kernel(k, gpu)
  if gpu == "CUDA": assert "__syncthreads" in ks.src and "__shared__" in ks.src
  uops = ks.lin.uops
  assert sum(u.op is Ops.DEFINE_LOCAL for u in uops) == 2 and any(u.op is Ops.BARRIER for u in uops)
  specials = {u.arg.name: u.arg.size for u in uops if u.op is Ops.SPECIAL}
  assert specials["gidx0"] == 4 and list(v for n, v in specials.items() if n.startswith("lidx")) == [256]


def test_cpu_form_runs_each_reduce_inside_the_row_loop_only():
  """On the CPU the reduce loops sit inside the row loop but outside the output's column loop."""
  x = Tensor.rand(8, 512).realize()
  si = _kernels(x.softmax(-1))[0]
  opts = [o for o in kernel_for(si.ast, "CPU").applied_opts if o.op is not OptOps.THREAD]   # (cores vary by machine)
  uops = render_kernel(kernel_for(si.ast, "CPU", opts), "CPU").lin.uops
  depth, loops_at = 0, []
  for u in uops:
    if u.op is Ops.LOOP:
      loops_at.append((depth, u.arg))
      depth += 1
    elif u.op is Ops.END and u.src[0].op is Ops.LOOP:
      depth -= 1
  outer = [name for d, name in loops_at if d == 0]
  assert len(outer) == 1 and len([d for d, _ in loops_at if d == 1]) == 3   # max, sum, output: siblings in the row


def test_reduce_feeding_a_reduce_over_its_rows_is_two_kernels():
  x = Tensor.rand(8, 9).realize()
  out = (x - x.max(1, keepdim=True)).exp().sum(0)
  assert len(_kernels(out)) == 2
  xn = x.numpy().astype(np.float64)
  np.testing.assert_allclose(out.numpy(), np.exp(xn - xn.max(1, keepdims=True)).sum(0), rtol=1e-5)


@pytest.mark.parametrize("opts", [
  [Opt(OptOps.GROUP, 0, 12), Opt(OptOps.GROUP, 1, 12), Opt(OptOps.LOCAL, 1, 12)],   # 12: every thread reads all
  [Opt(OptOps.GROUP, 0, 12), Opt(OptOps.GROUP, 1, 12)],          # output axis a loop, one thread of 12 writes
  [Opt(OptOps.GROUPTOP, 0, 16), Opt(OptOps.GROUP, 1, 16), Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.UPCAST, 0, 2)],
  [Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.GROUP, 1, 4)],
], ids=["group12_shared", "group12_idle_threads", "grouptop_local_upcast", "unroll_upcast_group"])
def test_opt_combinations_on_python(opts):
  """Opt lists BEAM may try on a fused softmax (groups that are not powers of two, threads the output does not use,
  upcasts of rows): the SIMT interpreter's result equals numpy's."""
  x = np.random.default_rng(3).standard_normal((2, 48)).astype(np.float32)
  si = _kernels(Tensor(x, device="PYTHON").realize().softmax(-1))[0]
  for b in si.bufs: b.allocate()
  run_kernel(compile_kernel(kernel_for(si.ast, "PYTHON", opts), "PYTHON"), si.bufs, si.var_vals)
  np.testing.assert_allclose(si.bufs[0].numpy().reshape(2, 48), _np_softmax(x.astype(np.float64)), rtol=1e-5,
                             atol=1e-7)
