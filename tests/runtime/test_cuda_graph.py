"""CUDAGraph, the JIT's CUDA replay: a chain of kernel nodes, re-set only where a JIT input moved, launched at once.

Without a GPU the graph is built against a recording stand-in for the driver module, which reads each node's
kernelParams the way the driver does (through the void*[] the node points at), so the node chain, the argument values
and the re-set-on-move logic are checked anywhere. With a GPU, jitted functions replay through a real CUDA graph and
are compared with numpy on fresh inputs every call.
"""
import ctypes
import numpy as np
import pytest
from fusegrad import Tensor, Variable
from fusegrad.uop import Ops
from fusegrad.device import GraphLaunch
from fusegrad.engine.jit import jit
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.realize import run_schedule

driver = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings (the 'cuda' extra) is not installed")
from fusegrad.runtime import cuda as cuda_rt  # noqa: E402

OK = driver.CUresult.CUDA_SUCCESS
gpu = pytest.mark.skipif(not cuda_rt.gpu_available(), reason="no CUDA GPU here")


class FakeProgram:
  def __init__(self, fn: int, name: str, n_bufs: int, n_vals: int, shared: int = 0):
    self.fn, self.name, self.arity, self.shared = driver.CUfunction(fn), name, (n_bufs, n_vals), shared


class RecordingDriver:
  """The driver calls CUDAGraph makes, recorded; argument values are read when the call is made, as the driver does."""
  CUDA_KERNEL_NODE_PARAMS = driver.CUDA_KERNEL_NODE_PARAMS

  def __init__(self, programs: list[FakeProgram]):
    self.arity = {int(p.fn): p.arity for p in programs}
    self.added: list[dict] = []
    self.sets: list[tuple[int, dict]] = []
    self.calls: list[str] = []

  def read(self, params) -> dict:
    n_bufs, n_vals = self.arity[int(params.func)]
    ptrs = (ctypes.c_void_p * (n_bufs + n_vals)).from_address(params.kernelParams)
    bufs = [ctypes.c_uint64.from_address(p).value for p in ptrs[:n_bufs]]
    vals = [ctypes.c_int32.from_address(p).value for p in ptrs[n_bufs:]]
    return {"func": int(params.func), "grid": (params.gridDimX, params.gridDimY, params.gridDimZ),
            "block": (params.blockDimX, params.blockDimY, params.blockDimZ), "bufs": bufs, "vals": vals,
            "shared": params.sharedMemBytes}

  def cuGraphCreate(self, flags):
    self.calls.append("create")
    return OK, driver.CUgraph(1)

  def cuGraphAddKernelNode(self, graph, deps, n_deps, params):
    assert len(deps) == n_deps
    self.added.append({**self.read(params), "deps": [int(d) for d in deps]})
    return OK, driver.CUgraphNode(100 + len(self.added) - 1)

  def cuGraphInstantiate(self, graph, flags):
    self.calls.append("instantiate")
    return OK, driver.CUgraphExec(2)

  def cuGraphUpload(self, exec_, stream):
    self.calls.append(f"upload {int(stream)}")
    return (OK,)

  def cuGraphExecKernelNodeSetParams(self, exec_, node, params):
    self.sets.append((int(node) - 100, self.read(params)))
    return (OK,)

  def cuGraphLaunch(self, exec_, stream):
    self.calls.append(f"launch {int(stream)}")
    return (OK,)

  def cuGraphExecDestroy(self, exec_): self.calls.append("destroy exec")
  def cuGraphDestroy(self, graph): self.calls.append("destroy graph")


@pytest.fixture
def fake(monkeypatch):
  progs = [FakeProgram(0xA0, "k0", 2, 0), FakeProgram(0xB0, "k1", 3, 1, shared=65536), FakeProgram(0xC0, "k2", 2, 2)]
  rec = RecordingDriver(progs)
  monkeypatch.setattr(cuda_rt, "driver", rec)
  monkeypatch.setattr(cuda_rt, "_context", lambda: None)
  # out <- in0; out2 <- (out, in1) with n=7; out3 <- (out2) with two values; input 0 is read by k0 and k1 (twice)
  launches = [GraphLaunch(progs[0], [1000, 5000], (), (4, 1, 1), (32, 1, 1)),
              GraphLaunch(progs[1], [2000, 1000, 6000], (7,), (2, 3, 1), (16, 2, 1)),
              GraphLaunch(progs[2], [3000, 2000], (-1, 9), (1, 1, 1), (1, 1, 1))]
  slots = [[(0, 1)], [(1, 2)]]
  built: list = []

  def build(slots=slots):
    built.append(cuda_rt.CUDAGraph(launches, slots))
    return built[-1]
  yield rec, build
  for graph in built: graph.exec = graph.graph = None   # fake handles: never hand them to a real driver


def test_builds_a_chain_of_kernel_nodes(fake):
  rec, build = fake
  graph = build()
  assert [n["deps"] for n in rec.added] == [[], [100], [101]]
  assert [n["func"] for n in rec.added] == [0xA0, 0xB0, 0xC0]
  assert [n["grid"] for n in rec.added] == [(4, 1, 1), (2, 3, 1), (1, 1, 1)]
  assert [n["block"] for n in rec.added] == [(32, 1, 1), (16, 2, 1), (1, 1, 1)]
  assert [n["bufs"] for n in rec.added] == [[1000, 5000], [2000, 1000, 6000], [3000, 2000]]
  assert [n["vals"] for n in rec.added] == [[], [7], [-1, 9]]
  assert [n["shared"] for n in rec.added] == [0, 65536, 0]   # a kernel's dynamic shared memory goes with its node
  assert rec.calls == ["create", "instantiate", "upload 0"]
  graph.free()
  graph.free()
  assert rec.calls[3:] == ["destroy exec", "destroy graph"]
  with pytest.raises(RuntimeError, match="freed"):
    graph.launch([5000, 6000])


def test_launch_resets_only_nodes_whose_inputs_moved(fake):
  rec, build = fake
  graph = build()
  graph.launch([5000, 6000])                     # the captured pointers: nothing to re-set
  assert rec.sets == [] and rec.calls[-1] == "launch 0"
  graph.launch([5000, 6100])                     # input 1 moved: only k1 reads it
  assert [(i, s["bufs"], s["vals"]) for i, s in rec.sets] == [(1, [2000, 1000, 6100], [7])]
  rec.sets.clear()
  graph.launch([5200, 6100])                     # input 0 moved: k0 only
  assert [(i, s["bufs"]) for i, s in rec.sets] == [(0, [1000, 5200])]
  rec.sets.clear()
  graph.launch([5300, 6300])
  assert [(i, s["bufs"]) for i, s in rec.sets] == [(0, [1000, 5300]), (1, [2000, 1000, 6300])]
  assert rec.calls.count("launch 0") == 4


def test_one_input_in_several_slots_is_one_value(fake):
  rec, build = fake
  graph = build([[(0, 1), (1, 2)]])
  graph.launch([8000])
  assert [(i, s["bufs"]) for i, s in rec.sets] == [(0, [1000, 8000]), (1, [2000, 1000, 8000])]


# ***** on a GPU *****

def cuda_rand(*shape, seed=0):
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device="CUDA").realize()


@gpu
def test_jit_replays_through_a_cuda_graph():
  @jit
  def f(a, b): return (a @ b).relu().sum(axis=1) + a.max(axis=1)
  keep = []
  for seed in range(8):
    a, b = cuda_rand(32, 64, seed=seed), cuda_rand(64, 16, seed=100 + seed)
    keep.append((a, b))   # kept alive, so every call brings new device pointers
    an, bn = a.numpy(), b.numpy()
    np.testing.assert_allclose(f(a, b).numpy(), np.maximum(an @ bn, 0).sum(1) + an.max(1), rtol=1e-4, atol=1e-4)
  assert isinstance(f.graph, cuda_rt.CUDAGraph) and len(f.graph.nodes) == len(f.launches)
  a, b = keep[1]   # back to an older pair of buffers
  np.testing.assert_allclose(f(a, b).numpy(), np.maximum(a.numpy() @ b.numpy(), 0).sum(1) + a.numpy().max(1),
                             rtol=1e-4, atol=1e-4)


@gpu
def test_cuda_graph_keeps_kernel_order():
  """Many dependent kernels: each node must wait for the one before."""
  @jit
  def f(x):
    for _ in range(64):
      x = x * 1.5 + 1
      x.realize()
    return x
  for seed in range(4):
    x = cuda_rand(1024, seed=seed)
    want = x.numpy().astype(np.float64)
    for _ in range(64): want = want * 1.5 + 1
    np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-4)
  assert isinstance(f.graph, cuda_rt.CUDAGraph) and len(f.graph.nodes) == 64


@gpu
def test_cuda_graph_passes_symbolic_values():
  n = Variable("n", 1, 64)

  @jit
  def f(a):
    view = a.lazydata.shrink(((0, n.bind(37)),))
    out = view.alu(Ops.MUL, view).contiguous()
    run_schedule(create_schedule([out]))
    return out
  for seed in range(5):
    x = cuda_rand(64, seed=seed)
    np.testing.assert_allclose(f(x).base.buffer.numpy(), x.numpy()[:37] ** 2, rtol=1e-6)
  assert isinstance(f.graph, cuda_rt.CUDAGraph)
