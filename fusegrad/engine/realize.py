"""Running a schedule: kernel AST -> optimized Kernel -> UOps -> source -> compiled program -> launch.

Compiled programs are cached in memory by (AST, device) — ASTs are hash-consed, so the lookup is one dict probe —
on disk as rendered programs by AST (compile.py, so a new process skips optimizing, linearizing and rendering) and
as binaries by source (device.py). Counters and DEBUG output are kept here: DEBUG=2 prints one line per kernel,
3 the applied opts, 4 the source, 5 the UOps.
"""
from __future__ import annotations
import contextlib
import time
from dataclasses import dataclass
from fusegrad.config import config
from fusegrad.helpers import GlobalCounters, ansilen, stage
from fusegrad.uop import UOp, Ops
from fusegrad.device import Device, Buffer, deferred_compiles, compile_many
from fusegrad.codegen.kernel import Kernel, Opt
from fusegrad.codegen.linearizer import LinearProgram
from fusegrad.engine.compile import KernelSource, ProgramInfo, build_program, render_kernel
from fusegrad.engine.compile import kernel_for  # noqa: F401  (re-exported: tests and tools import it from here)
from fusegrad.engine.search import beam_search
from fusegrad.engine.schedule import ScheduleItem


@dataclass
class CompiledKernel:
  """A runnable kernel and what DEBUG output and counters need to know about it."""
  name: str
  display_name: str
  device: str
  program: object
  lin: LinearProgram | ProgramInfo   # a ProgramInfo when the program came from the disk cache
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


def _load(ks: KernelSource, device: str, start: float) -> CompiledKernel:
  with stage("compile"):   # loading the binary is the last step of compiling
    program = Device[device].program(ks.name, ks.lib)
  elapsed = time.perf_counter() - start
  GlobalCounters.compile_count += 1
  GlobalCounters.compile_time_s += elapsed
  return CompiledKernel(ks.name, ks.display_name, device, program, ks.lin, ks.src, list(ks.opts), elapsed)


def compile_kernel(k: Kernel, device: str) -> CompiledKernel:
  """Compile and load a Kernel as it is (its opts already applied; no program cache)."""
  start = time.perf_counter()
  return _load(render_kernel(k, device), device, start)


def _memory_key(ast: UOp, device: str) -> tuple:
  """The in-memory key of a program: the flags that choose the opts are part of it."""
  return (ast, device, config.NOOPT, config.BEAM)


def _search(ast: UOp, device: str, si: ScheduleItem | None):
  """The BEAM search for this kernel when BEAM is on (it needs the item's buffers), else None: heuristics."""
  if config.BEAM <= 0 or si is None: return None
  def search() -> list[Opt]:
    with stage("optimize"):
      return beam_search(ast, si.bufs, si.var_vals, device)
  return search


def get_program(ast: UOp, device: str, si: ScheduleItem | None = None) -> CompiledKernel:
  """The compiled program of an AST: hand-coded opts, or with BEAM=n the opts a search finds (cached on disk); from
  the disk's program cache when a process before this one built it."""
  key = _memory_key(ast, device)
  ck = _PROGRAMS.get(key)
  if ck is None:
    start = time.perf_counter()
    ks = build_program(ast, device, search=_search(ast, device, si))
    ck = _PROGRAMS[key] = _load(ks, device, start)
  return ck


def compile_ahead(schedule: list[ScheduleItem]) -> None:
  """Before a schedule runs, build the sources of its new kernels and compile them side by side (a C compiler
  process or an NVRTC call each, one per core), so the first run of a model compiles in a fraction of the time.
  Nothing to overlap (fewer than two new kernels), no disk cache (NOCACHE compiles on the spot) or a BEAM search:
  one by one. Compiles from other threads while this runs are not deferred (the deferral is per thread)."""
  todo: dict[tuple, ScheduleItem] = {}
  for si in schedule:
    key = _memory_key(si.ast, si.bufs[0].device) if si.ast.op is Ops.SINK else None
    if key is not None and key not in _PROGRAMS: todo.setdefault(key, si)
  if len(todo) < 2 or config.BEAM > 0: return   # BEAM compiles and times its candidates itself, one by one
  start = time.perf_counter()
  with deferred_compiles() as pending:
    built = [(key, build_program(key[0], key[1], search=_search(key[0], key[1], si))) for key, si in todo.items()]
  with stage("compile"):
    failed = compile_many(pending)
    ready = []
    for key, ks in built:   # binaries postponed above are on disk now
      err = failed.get((Device[key[1]].compiler, ks.src))
      if err is not None and not ks.cached: raise err
      if err is not None: continue   # a disk-cache entry that no longer builds: get_program rebuilds it
      if not ks.lib: ks.lib = Device[key[1]].compiler.compile_cached(ks.src)
      ready.append((key, ks))
  GlobalCounters.compile_time_s += time.perf_counter() - start
  for key, ks in ready: _PROGRAMS[key] = _load(ks, key[1], time.perf_counter())


def launch_dims(lin, var_vals: dict[UOp, int]) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
  """The grid and block sizes of a launch: a symbolic size (a grid over a Variable's range) takes its value now.
  Every variable of the launch counts, not only the kernel's int parameters: one that only sizes the grid is none."""
  if lin.global_size is None: return None, None
  env = {v.arg.name: value for v, value in var_vals.items()}
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
  compile_ahead(schedule)
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
