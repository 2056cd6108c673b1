"""Compiling a schedule's new kernels side by side before it runs (engine/realize.compile_ahead): every kernel is
built first with its compile postponed (device.deferred_compiles), the compilers then run in parallel
(device.compile_many), and the programs are loaded; results equal those of kernel-by-kernel compilation."""
import numpy as np
import pytest
from fusegrad import Tensor, Context, GlobalCounters
from fusegrad.device import Device, deferred_compiles, compile_many
from fusegrad.engine import realize
from fusegrad.engine.schedule import create_schedule


def _expr(seed: int):
  rng = np.random.default_rng(seed)
  a, b = (Tensor(rng.standard_normal((8, 16)).astype(np.float32), device="CPU") for _ in range(2))
  return (a * b).sum(1).contiguous() + (a - b).max(1).contiguous() * 2, a.numpy(), b.numpy()


def test_deferred_compiles_record_then_compile_many_fills_the_cache(cache):
  src = "void k(float* restrict a) { a[0] = 1.0f; }"
  compiler = Device["CPU"].compiler
  with deferred_compiles() as pending:
    assert compiler.compile_cached(src) == b""
  assert pending == [(compiler, src)]
  assert compile_many(pending) == {}
  assert len(list((cache / "kernels").glob("*.bin"))) == 1
  with deferred_compiles() as pending:   # on disk now: served at once, nothing postponed
    assert compiler.compile_cached(src) != b"" and pending == []


def test_schedule_compiles_ahead_and_matches(cache):
  out, a, b = _expr(0)
  sched = create_schedule([out.lazydata])
  assert sum(si.ast.op.name == "SINK" for si in sched) >= 2
  GlobalCounters.reset()
  realize.run_schedule(sched)
  assert GlobalCounters.compile_count >= 2 and GlobalCounters.compile_time_s > 0
  np.testing.assert_allclose(out.numpy(), (a * b).sum(1) + (a - b).max(1) * 2, rtol=1e-5, atol=1e-6)
  # programs built this run keep their UOps (no round trip through the disk cache)
  assert all(hasattr(ck.lin, "uops") for ck in realize._PROGRAMS.values())


def test_a_kernel_that_does_not_compile_still_raises_with_its_source(cache, monkeypatch):
  compiler = Device["CPU"].compiler
  real = type(compiler).compile
  monkeypatch.setattr(type(compiler), "compile", lambda self, src: real(self, src + "\nthis is not C"))
  out, _, _ = _expr(1)
  with pytest.raises(RuntimeError, match="CPU compile failed"):
    out.realize()


def test_beam_compiles_its_candidates_itself(cache):
  """With BEAM on, the search compiles and times every candidate: compiling ahead stands aside (a postponed compile
  would hand it an empty binary)."""
  rng = np.random.default_rng(4)
  a, b = (Tensor(rng.standard_normal((16, 16)).astype(np.float32)).realize() for _ in range(2))
  s, m = a.sum(0), b.max(1)
  with Context(BEAM=1, BEAM_BUDGET=2):
    Tensor.realize_all(s, m)
  np.testing.assert_allclose(s.numpy(), a.numpy().sum(0), rtol=1e-5)
  np.testing.assert_allclose(m.numpy(), b.numpy().max(1))
