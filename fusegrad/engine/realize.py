"""Running a schedule: kernel AST -> optimized Kernel -> UOps -> source -> compiled program -> launch.

Compiled programs are cached in memory by (AST, device) — ASTs are hash-consed, so the lookup is one dict probe —
and on disk by source (device.py). Counters and DEBUG output are kept here: DEBUG=2 prints one line per kernel,
3 the applied opts, 4 the source, 5 the UOps.
"""
from __future__ import annotations
import contextlib
import time
from dataclasses import dataclass
from fusegrad.config import config
from fusegrad.helpers import GlobalCounters, colored, ansilen, stage
from fusegrad.uop import UOp, Ops
from fusegrad.device import Device, Buffer
from fusegrad.codegen.kernel import Kernel, Opt
from fusegrad.codegen.linearizer import LinearProgram
from fusegrad.engine.compile import kernel_for, render_kernel
from fusegrad.engine.search import beam_search
from fusegrad.engine.schedule import ScheduleItem


@dataclass
class CompiledKernel:
  """A runnable kernel and what DEBUG output and counters need to know about it."""
  name: str
  display_name: str
  device: str
  program: object
  lin: LinearProgram
  src: str
  opts: list[Opt]
  compile_s: float


_PROGRAMS: dict[tuple, CompiledKernel] = {}
_CAPTURE: list[list] = []   # open JIT captures: each records (kernel, buffers, var_vals) of every launch


@contextlib.contextmanager
def capture_kernels():
  """Record every kernel launched inside the block (used by the JIT)."""
  record: list = []
  _CAPTURE.append(record)
  try:
    yield record
  finally:
    _CAPTURE.remove(record)


def compile_kernel(k: Kernel, device: str) -> CompiledKernel:
  start = time.perf_counter()
  ks = render_kernel(k, device)
  with stage("compile"):   # loading the binary is the last step of compiling
    program = Device[device].program(ks.name, ks.lib)
  elapsed = time.perf_counter() - start
  GlobalCounters.compile_count += 1
  GlobalCounters.compile_time_s += elapsed
  display = "_".join(colored(str(s) if isinstance(s, int) else s.render(), c) for s, c in zip(k.full_shape, k.colors()))
  display = ("r_" if k.reduceop is not None else "E_") + display
  return CompiledKernel(ks.name, display, device, program, ks.lin, ks.src, list(k.applied_opts), elapsed)


def get_program(ast: UOp, device: str, si: ScheduleItem | None = None) -> CompiledKernel:
  """The compiled program of an AST: hand-coded opts, or with BEAM=n the opts a search finds (cached on disk)."""
  key = (ast, device, config.NOOPT, config.BEAM)   # the flags that choose the opts are part of the program
  if key not in _PROGRAMS:
    with stage("optimize"):
      opts = beam_search(ast, si.bufs, si.var_vals, device) if config.BEAM > 0 and si is not None else None
    _PROGRAMS[key] = compile_kernel(kernel_for(ast, device, opts), device)
  return _PROGRAMS[key]


def launch_dims(lin, var_vals: dict[UOp, int]) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
  """The grid and block sizes of a launch: a symbolic size (a grid over a Variable's range) takes its value now."""
  if lin.global_size is None: return None, None
  env = {v.arg.name: var_vals[v] for v in lin.vars}
  def dims(sizes): return tuple(s if isinstance(s, int) else int(s.evaluate(env)) for s in sizes)
  return dims(lin.global_size), dims(lin.local_size)


def run_kernel(ck: CompiledKernel, bufs: tuple[Buffer, ...], var_vals: dict[UOp, int]) -> float:
  vals = tuple(var_vals[v] for v in ck.lin.vars)
  gsz, lsz = launch_dims(ck.lin, var_vals)
  handles = [b.allocate()._handle for b in bufs]
  wait = config.DEBUG >= 2
  elapsed = ck.program(handles, vals, gsz, lsz, wait=wait)
  GlobalCounters.kernel_count += 1
  GlobalCounters.global_ops += ck.lin.op_estimate
  GlobalCounters.global_mem += ck.lin.mem_estimate
  GlobalCounters.time_sum_s += elapsed or 0.0
  if config.DEBUG >= 2: _print_kernel_line(ck, elapsed or 0.0, gsz, lsz)
  return elapsed


def _print_kernel_line(ck: CompiledKernel, elapsed: float, gsz, lsz) -> None:
  ops, mem = ck.lin.op_estimate, ck.lin.mem_estimate
  pad = max(0, 36 - ansilen(ck.display_name))
  dims = f"{list(gsz)} {list(lsz)}" if gsz is not None else "loops"
  print(f"*** {ck.device:<6} {GlobalCounters.kernel_count:4d} {ck.display_name}{' ' * pad} {dims:<22} "
        f"tm {elapsed * 1e6:9.2f}us ({ops / max(elapsed, 1e-9) / 1e9:8.2f} GFLOP/s "
        f"{mem / max(elapsed, 1e-9) / 1e9:7.2f} GB/s)"
        f"  opts {len(ck.opts)}")


def run_schedule(schedule: list[ScheduleItem]) -> None:
  """Run every item in order, then mark each output as realized (dropping its lazy sources). Timed as the "run"
  stage, less the stages of compiling a kernel on its first use."""
  with stage("run"):
    for si in schedule:
      if si.ast.op is Ops.EMPTY:
        si.bufs[0].allocate()
      elif si.ast.op is Ops.COPY:
        dst, src = si.bufs
        dst.allocate()
        Device[dst.device].allocator.copyin(dst._handle, memoryview(src.raw_bytes()))
      else:
        ck = get_program(si.ast, si.bufs[0].device, si)
        run_kernel(ck, si.bufs, si.var_vals)
        for record in _CAPTURE: record.append((ck, si.bufs, si.var_vals))
      for out in si.outputs:
        out.op, out.srcs, out.arg = Ops.BUFFER, (), None
