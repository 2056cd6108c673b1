"""`@jit`: capture the kernels a function runs, then replay them on new inputs without Python tracing.

Call 1 runs the function normally (compiling its kernels). Call 2 runs it again while recording every kernel launch
(program, buffers, int values). From call 3 on, the recording is replayed with the new inputs' buffers swapped in:
no graph building, no scheduling, no Python per op. Semantics, as in tinygrad's TinyJit: Python values (non-tensor
arguments, shapes, closed-over scalars) are baked in at capture; the returned tensors are the same buffers every
call, overwritten by the next call; inputs must keep their shape, dtype and device, or the call raises.

When every captured kernel runs on one device that offers a graph (Compiled.graph: a CUDA graph on CUDA, prebuilt
ctypes calls on CPU), replay goes through it: one launch per call, counters bumped in bulk. Otherwise (PYTHON, kernels
on several devices, JIT_GRAPH=0, or DEBUG>=2, which wants a timed line per kernel) each kernel is run in turn.
"""
from __future__ import annotations
import functools
from dataclasses import dataclass
from typing import Any, Callable
from fusegrad.config import config
from fusegrad.helpers import GlobalCounters
from fusegrad.uop import UOp
from fusegrad.device import Buffer, Device, GraphLaunch
from fusegrad.engine.realize import CompiledKernel, run_kernel, capture_kernels, launch_dims


@dataclass
class _Launch:
  kernel: CompiledKernel
  bufs: list[Buffer]
  var_vals: dict[UOp, int]
  inputs: dict[int, int]      # position in bufs -> index of the jit input whose buffer goes there


class JitError(RuntimeError):
  """A jitted function was called in a way its capture can't serve."""


def _tensors(args: tuple, kwargs: dict) -> list:
  from_args = [a for a in args if hasattr(a, "lazydata")]
  return from_args + [v for _, v in sorted(kwargs.items()) if hasattr(v, "lazydata")]


class TinyJit:
  """Wrap `fn`; see the module docstring for what is captured and what must stay the same. After the first replay
  through a device graph, `graph` holds it (None while replays go kernel by kernel)."""

  def __init__(self, fn: Callable):
    self.fn = fn
    self.calls = 0
    self.launches: list[_Launch] = []
    self.signature: tuple | None = None
    self.result: Any = None
    self.graph: Any = None
    self._graph_tried = False
    self._ops = self._mem = 0              # the captured kernels' op and memory estimates, summed for the counters
    self._inputs_held: list[Buffer] = []   # the last replay's inputs: a graph may still be reading them
    functools.update_wrapper(self, fn)

  def _signature(self, tensors: list) -> tuple:
    return tuple((t.shape, t.dtype, t.device) for t in tensors)

  def __call__(self, *args, **kwargs):
    tensors = _tensors(args, kwargs)
    for t in tensors:
      if t.lazydata.is_view:
        raise JitError(f"jit({self.fn.__name__}): input of shape {t.shape} is a view; pass .contiguous() tensors")
      t.realize()
    sig = self._signature(tensors)
    if self.calls >= 2:
      if sig != self.signature:
        raise JitError(f"jit({self.fn.__name__}): inputs changed from {self.signature} to {sig}; a captured "
                       f"function needs the same shapes, dtypes and devices (make a new jit for new shapes)")
      self.replay([t.lazydata.base.buffer for t in tensors])
      return self.result
    self.calls += 1
    if self.calls == 1:
      return self.fn(*args, **kwargs)
    with capture_kernels() as launches:
      result = self.fn(*args, **kwargs)
      for t in _flatten_result(result): t.realize()
    self.signature = sig
    input_bufs = {id(t.lazydata.base.buffer): i for i, t in enumerate(tensors)}
    self.launches = [_Launch(ck, list(bufs), dict(vv), {j: input_bufs[id(b)] for j, b in enumerate(bufs)
                                                        if id(b) in input_bufs}) for ck, bufs, vv in launches]
    self.result = result
    return result

  def replay(self, input_bufs: list[Buffer]) -> None:
    """Run the captured kernels on these input buffers: through the device graph when there is one, else in turn."""
    graph = self._replay_graph()
    if graph is None:
      for launch in self.launches:
        for j, i in launch.inputs.items(): launch.bufs[j] = input_bufs[i]
        run_kernel(launch.kernel, launch.bufs, launch.var_vals)
      return
    elapsed = graph.launch([b.allocate()._handle for b in input_bufs])
    self._inputs_held = input_bufs
    GlobalCounters.kernel_count += len(self.launches)
    GlobalCounters.global_ops += self._ops
    GlobalCounters.global_mem += self._mem
    GlobalCounters.time_sum_s += elapsed or 0.0

  def _replay_graph(self) -> Any:
    """The device graph to replay through now, built on first use; None to run kernel by kernel."""
    if not config.JIT_GRAPH or config.DEBUG >= 2: return None
    if not self._graph_tried:
      self.graph = self._build_graph()   # a failure raises here (and again next call), naming JIT_GRAPH=0
      self._graph_tried = True
    return self.graph

  def _build_graph(self) -> Any:
    devices = {launch.kernel.device for launch in self.launches}
    if len(devices) != 1: return None   # no kernels, or kernels on several devices
    graph_type = Device[devices.pop()].graph
    if graph_type is None: return None
    slots: list[list[tuple[int, int]]] = [[] for _ in self.signature]
    for li, launch in enumerate(self.launches):
      for pos, i in launch.inputs.items(): slots[i].append((li, pos))
    self._ops = sum(launch.kernel.lin.op_estimate for launch in self.launches)
    self._mem = sum(launch.kernel.lin.mem_estimate for launch in self.launches)
    return graph_type([_graph_launch(launch) for launch in self.launches], slots)


def _graph_launch(launch: _Launch) -> GraphLaunch:
  lin = launch.kernel.lin
  return GraphLaunch(launch.kernel.program, [b.allocate()._handle for b in launch.bufs],
                     tuple(launch.var_vals[v] for v in lin.vars), *launch_dims(lin, launch.var_vals))


def _flatten_result(result) -> list:
  if hasattr(result, "lazydata"): return [result]
  if isinstance(result, (list, tuple)): return [t for r in result for t in _flatten_result(r)]
  if isinstance(result, dict): return [t for r in result.values() for t in _flatten_result(r)]
  return []


def jit(fn: Callable) -> TinyJit:
  """Decorator form of TinyJit."""
  return TinyJit(fn)
