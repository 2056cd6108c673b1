"""UOp-level tests of the linearizer: what the flat program contains for a given kernel and set of opts.

Kernels are built straight from the lazy graph (no Tensor frontend), so these tests pin down codegen alone: vector
loads, grouped reduces with shared memory and barriers, load CSE, constant folding, and the invariants checked by
verify_uops. Each Opt is also checked, alone and in combinations, against the unoptimized kernel's output.
"""
import itertools
import numpy as np
import pytest
import torch
from fusegrad import Tensor
from fusegrad.dtype import dtypes
from fusegrad.uop import Ops, Variable
from fusegrad.lazy import LazyBuffer
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.realize import kernel_for, compile_kernel, run_kernel
from fusegrad.codegen.kernel import Opt, OptOps, KernelOptError, Kernel
from fusegrad.renderer.cstyle import CRenderer
from fusegrad.runtime.cpu import CCompiler, CPUProgram, openmp_works
from fusegrad.codegen.linearizer import linearize, verify_uops

rng = np.random.default_rng(0)


def lb(shape, device="CPU", dtype=dtypes.float32):
  return LazyBuffer.from_numpy(rng.standard_normal(shape).astype(dtype.np), dtype, device)


def one_kernel(out: LazyBuffer):
  sched = create_schedule([out])
  assert len(sched) == 1, f"expected one kernel, got {len(sched)}"
  return sched[0]


def run_with(si, device, opts):
  k = kernel_for(si.ast, device, opts)
  ck = compile_kernel(k, device)
  run_kernel(ck, si.bufs, si.var_vals)
  return si.bufs[0].numpy().copy(), ck


def uops_of(si, device, opts):
  k = kernel_for(si.ast, device, opts)
  lin = linearize(k)
  verify_uops(lin.uops)
  return lin.uops


def matmul(a: LazyBuffer, b: LazyBuffer) -> LazyBuffer:
  n, k = a.shape
  _, m = b.shape
  x = a.reshape((n, 1, k)).expand((n, m, k))
  y = b.permute((1, 0)).reshape((1, m, k)).expand((n, m, k))
  return x.alu(Ops.MUL, y).r(Ops.ADD, (2,))


def test_unit_stride_upcast_gives_one_vector_load():
  """A unit-stride axis upcast by 4 loads with one float4 LOAD and four GEPs instead of four scalar LOADs."""
  a = lb((8, 16))
  si = one_kernel(a.alu(Ops.ADD, a.const_like(1.0)))
  uops = uops_of(si, "CPU", [Opt(OptOps.UPCAST, 0, 4)])
  loads = [u for u in uops if u.op is Ops.LOAD]
  assert len(loads) == 1 and loads[0].dtype is dtypes.float4
  # the CPU adds whole vectors: the loaded float4 flows into one float4 ADD and is stored as is
  assert sum(u.op is Ops.GEP for u in uops) == 0
  assert [u.dtype for u in uops if u.op is Ops.ADD and dtypes.is_float(u.dtype)] == [dtypes.float4]
  # a device without vector arithmetic splits the vector into four lanes
  uops = uops_of(si, "PYTHON", [Opt(OptOps.UPCAST, 0, 4)])
  assert sum(u.op is Ops.GEP for u in uops) == 4
  stores = [u for u in uops if u.op is Ops.STORE]
  assert len(stores) == 1 and stores[0].src[2].dtype is dtypes.float4


def test_strided_upcast_stays_scalar():
  """An upcast axis with stride != 1 (a transposed read) is loaded lane by lane."""
  a = lb((16, 8))
  si = one_kernel(a.permute((1, 0)).alu(Ops.ADD, a.permute((1, 0)).const_like(1.0)).contiguous())
  uops = uops_of(si, "CPU", [Opt(OptOps.UPCAST, 1, 4)])
  loads = [u for u in uops if u.op is Ops.LOAD]
  assert all(u.dtype is dtypes.float32 for u in loads) and len(loads) == 4
  assert next(u for u in uops if u.op is Ops.STORE).src[2].dtype is dtypes.float4


def test_grouped_reduce_emits_local_buffer_and_barrier():
  """GROUP splits a reduce across threads: partials go to a DEFINE_LOCAL; a group of 16 combines them in a halving
  tree (4 steps: a gated step and a BARRIER each, after the first BARRIER), then one thread (IF) stores."""
  a = lb((4, 256), "PYTHON")
  si = one_kernel(a.r(Ops.ADD, (1,)))
  uops = uops_of(si, "PYTHON", [Opt(OptOps.GROUP, 0, 16)])
  ops = [u.op for u in uops]
  assert ops.count(Ops.DEFINE_LOCAL) == 1 and ops.count(Ops.BARRIER) == 5 and ops.count(Ops.IF) == 5
  out, _ = run_with(si, "PYTHON", [Opt(OptOps.GROUP, 0, 16)])
  np.testing.assert_allclose(out, a.base.buffer.numpy().reshape(4, 256).sum(1), rtol=1e-5)


def test_grouptop_with_locals_and_upcast_on_python():
  """GROUPTOP combined with LOCAL and UPCAST still gives the unoptimized result."""
  a = lb((32, 64), "PYTHON")
  si = one_kernel(a.r(Ops.MAX, (1,)))
  want, _ = run_with(si, "PYTHON", [])
  got, _ = run_with(si, "PYTHON", [Opt(OptOps.GROUPTOP, 0, 8), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.UPCAST, 0, 2)])
  np.testing.assert_allclose(got, want)


def test_load_cse():
  """A buffer read twice through the same view is loaded once."""
  a = lb((64,))
  si = one_kernel(a.alu(Ops.MUL, a).alu(Ops.ADD, a))
  uops = uops_of(si, "CPU", [])
  assert sum(u.op is Ops.LOAD for u in uops) == 1


def test_zero_folding_in_index():
  """Index math folds away: a contiguous elementwise kernel stores at exactly the loop index."""
  a = lb((64,))
  si = one_kernel(a.alu(Ops.ADD, a.const_like(2.0)))
  uops = uops_of(si, "CPU", [])
  store = next(u for u in uops if u.op is Ops.STORE)
  assert store.src[1].op is Ops.LOOP


def test_constants_are_literals():
  """Constants do not become buffers: x*2+1 has one input buffer."""
  a = lb((32,))
  si = one_kernel(a.alu(Ops.MUL, a.const_like(2.0)).alu(Ops.ADD, a.const_like(1.0)))
  assert len(si.bufs) == 2
  assert sum(u.op is Ops.DEFINE_GLOBAL for u in uops_of(si, "CPU", [])) == 2


def test_masked_view_gives_gated_load():
  """A padded read is a LOAD with a valid gate and an alternative value."""
  a = lb((8,))
  si = one_kernel(a.pad(((2, 2),)).contiguous())
  uops = uops_of(si, "CPU", [])
  load = next(u for u in uops if u.op is Ops.LOAD)
  assert len(load.src) == 4 and load.src[2].dtype is dtypes.bool


def test_accumulator_updated_by_phi():
  """A reduce keeps its running value in a DEFINE_ACC that only PHI updates."""
  a = lb((8, 32))
  si = one_kernel(a.r(Ops.ADD, (1,)))
  uops = uops_of(si, "CPU", [])
  acc = [u for u in uops if u.op is Ops.DEFINE_ACC]
  assert len(acc) == 1
  users = [u for u in uops if acc[0] in u.src]
  assert {u.op for u in users} <= {Ops.PHI, Ops.ADD}


def test_loop_invariant_code_leaves_the_reduce_loop():
  """Values that don't depend on the reduce loop are computed before it."""
  a, b = lb((8, 32)), lb((8, 1))
  si = one_kernel(a.alu(Ops.ADD, b.expand((8, 32))).r(Ops.ADD, (1,)))
  uops = uops_of(si, "CPU", [])
  loop = next(i for i, u in enumerate(uops) if u.op is Ops.LOOP and u.arg.startswith("ridx"))
  b_load = next(i for i, u in enumerate(uops) if u.op is Ops.LOAD and u.src[0].arg == 2)
  assert b_load < loop


OPT_CASES = [
  [Opt(OptOps.UPCAST, 0, 4)], [Opt(OptOps.UPCAST, 1, 4)], [Opt(OptOps.UNROLL, 0, 4)], [Opt(OptOps.UNROLL, 0, 0)],
  [Opt(OptOps.LOCAL, 0, 4)], [Opt(OptOps.LOCAL, 1, 8)], [Opt(OptOps.GROUP, 0, 8)], [Opt(OptOps.GROUPTOP, 0, 16)],
  [Opt(OptOps.NOLOCALS)],
]


@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
@pytest.mark.parametrize("opts", OPT_CASES + [list(c) for c in itertools.combinations(
  [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.LOCAL, 1, 4), Opt(OptOps.GROUPTOP, 0, 4)], 2)],
  ids=str)
def test_each_opt_matches_unoptimized(device, opts):
  """Every Opt, alone and in pairs, computes what the unoptimized matmul kernel computes."""
  a, b = lb((16, 32), device), lb((32, 24), device)
  si = one_kernel(matmul(a, b))
  want, _ = run_with(si, device, [])
  try:
    got, _ = run_with(si, device, opts)
  except KernelOptError:
    assert device == "CPU" and any(o.op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP) for o in opts)
    return
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bad_opts_raise():
  """Opts that don't fit the kernel raise KernelOptError naming the problem."""
  a = lb((16, 32))
  si = one_kernel(a.r(Ops.ADD, (1,)))
  with pytest.raises(KernelOptError, match="divide"):
    kernel_for(si.ast, "CPU", [Opt(OptOps.UPCAST, 0, 5)])
  with pytest.raises(KernelOptError, match="axis"):
    kernel_for(si.ast, "CPU", [Opt(OptOps.UPCAST, 3, 2)])
  with pytest.raises(KernelOptError, match="thread blocks"):
    kernel_for(si.ast, "CPU", [Opt(OptOps.LOCAL, 0, 4)])


def test_symbolic_shape_compiles_once():
  """A kernel over a bound Variable takes it as an int parameter; the same program serves every value."""
  n = Variable("n", 1, 64)
  programs = set()
  for val in (3, 17, 40):
    data = rng.standard_normal(64).astype(np.float32)
    full = LazyBuffer.from_numpy(data, dtypes.float32, "CPU")
    view = full.shrink(((0, n.bind(val)),))
    si = one_kernel(view.alu(Ops.MUL, view).contiguous())
    k = kernel_for(si.ast, "CPU", [])
    ck = compile_kernel(k, "CPU")
    programs.add(ck.src)
    assert [v.arg.name for v in ck.lin.vars] == ["n"]
    out = np.zeros(val, np.float32)
    si.bufs[0].allocate()
    run_kernel(ck, si.bufs, si.var_vals)
    out = si.bufs[0].numpy()
    np.testing.assert_allclose(out, data[:val] ** 2, rtol=1e-6)
  assert len(programs) == 1


def test_verify_uops_catches_broken_lists():
  """verify_uops rejects a list where a value is used before it is defined."""
  a = lb((8,))
  uops = uops_of(one_kernel(a.alu(Ops.ADD, a.const_like(1.0))), "CPU", [])
  broken = [uops[0]] + uops[2:] + [uops[1]]
  with pytest.raises(AssertionError):
    verify_uops(broken)


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
@pytest.mark.parametrize("n", [8, 100])
def test_reduce_of_a_value_invariant_in_the_loop(device, n):
  """sum over r of x, x not depending on r, is n*x: the accumulator update stays inside the reduce loop."""
  b = LazyBuffer.from_numpy(np.arange(4, dtype=np.float32).reshape(4, 1), dtypes.float32, device)
  si = one_kernel(b.expand((4, n)).r(Ops.ADD, (1,)))
  for opts in ([], None):
    out, _ = run_with(si, device, opts)
    np.testing.assert_allclose(out.reshape(4), np.arange(4) * n)
  c = LazyBuffer.from_numpy(np.arange(12, dtype=np.float32).reshape(4, 3, 1), dtypes.float32, device)
  si = one_kernel(c.expand((4, 3, n)).r(Ops.ADD, (1, 2)))
  out, _ = run_with(si, device, [])
  np.testing.assert_allclose(out.reshape(4), np.arange(12).reshape(4, 3).sum(1) * n)


def test_zero_size_buffer_upload():
  """An empty array uploads without error."""
  e = LazyBuffer.from_numpy(np.zeros(0, np.float32), dtypes.float32, "CPU")
  assert e.base.buffer.numpy().shape == (0,)


def test_thread_opt_runs_an_openmp_region():
  """THREAD splits axis 0 across cores: a SPECIAL core index, rendered as an OpenMP parallel region."""
  if not openmp_works("cc"): pytest.skip("the C compiler has no OpenMP")
  a, b = lb((64, 32)), lb((32, 48))
  si = one_kernel(matmul(a, b))
  want, _ = run_with(si, "CPU", [])
  k = Kernel(si.ast, CRenderer(max_threads=2))
  k.apply_opt(Opt(OptOps.THREAD, 0, 2))
  lin = linearize(k)
  assert any(u.op is Ops.SPECIAL and u.arg.name == "core0" for u in lin.uops)
  src = k.opts.render("mm", lin.uops)
  assert "#pragma omp parallel num_threads(2)" in src
  prog = CPUProgram("mm", CCompiler(openmp=True).compile(src))
  prog([b_.allocate()._handle for b_ in si.bufs])
  np.testing.assert_allclose(si.bufs[0].numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("cast_in_kernel", [False, True])
def test_tensor_core_lowering_on_python(dtype, cast_in_kernel):
  """TC maps SUM(A*B) onto mma m16n8k16 WMMAs (emulated per warp on PYTHON) and matches float64 within 1e-2."""
  rng = np.random.default_rng(1)
  a, b = rng.standard_normal((32, 48)).astype(np.float32), rng.standard_normal((48, 16)).astype(np.float32)
  if cast_in_kernel:
    A, B = (LazyBuffer.from_numpy(x, dtypes.float32, "PYTHON").cast(dtype) for x in (a, b))
  else:
    A, B = (LazyBuffer.from_numpy(x, dtype, "PYTHON") for x in (a, b))
  si = one_kernel(matmul(A, B).cast(dtypes.float32))
  for opts in ([Opt(OptOps.TC, 0, 0)], [Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 0, 2)], [Opt(OptOps.TC, 0, 0), Opt(OptOps.UNROLL, 0, 3)]):
    out, ck = run_with(si, "PYTHON", opts)
    assert sum(u.op is Ops.WMMA for u in ck.lin.uops) >= 1
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(out.reshape(ref.shape) - ref) / np.linalg.norm(ref) < 1e-2


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_tensor_cores_for_a_half_conv2d(dtype):
  """A conv's sum over (cin, kh, kw) maps onto tensor cores with K = cin and kh, kw as reduce loops (padding gates
  the fragment loads), matching float64 within 1e-2. Heuristics pick TC by default when the M axis is contiguous
  in the image (width 16 here); with a 6-wide image M would be the batch, and they use FMAs instead."""
  rng = np.random.default_rng(2)
  x, w = rng.standard_normal((16, 16, 6, 6)).astype(np.float32), rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
  out = Tensor(x, device="PYTHON").cast(dtype).conv2d(Tensor(w, device="PYTHON").cast(dtype), padding=1).float()
  si = one_kernel(out.lazydata)
  assert kernel_for(si.ast, "PYTHON").tensor_core is None
  wide = Tensor(rng.standard_normal((2, 16, 4, 16)).astype(np.float32), device="PYTHON").cast(dtype)
  assert kernel_for(one_kernel(wide.conv2d(Tensor(w, device="PYTHON").cast(dtype), padding=1).lazydata).ast,
                    "PYTHON").tensor_core is not None
  got, ck = run_with(si, "PYTHON", [Opt(OptOps.TC, 0, 0)])
  assert sum(u.op is Ops.WMMA for u in ck.lin.uops) >= 1
  ref = torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float64), torch.tensor(w, dtype=torch.float64),
                                   padding=1).numpy()
  assert np.linalg.norm(got.reshape(ref.shape) - ref) / np.linalg.norm(ref) < 1e-2
