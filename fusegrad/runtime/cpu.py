"""The CPU backend: C source compiled by the system C compiler into a shared object and called through ctypes.

Memory is host memory held in 64-byte aligned numpy arrays (so float4 loads are aligned). Compiled objects are
cached on disk keyed by the source, the compiler's version and the flags; so is the answer of the OpenMP probe
(keyed by the compiler's identity), which runs only when kernels may use more than one core (THREADS). CPUGraph
replays a JIT's captured launches with every ctypes argument built once.
"""
from __future__ import annotations
import contextlib
import ctypes
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import numpy as np
from fusegrad.config import config
from fusegrad.helpers import cache_dir, write_atomic
from fusegrad.device import Allocator, Compiler, Compiled, GraphLaunch
from fusegrad.renderer.cstyle import CRenderer

ALIGN = 64


class CPUAllocator(Allocator):
  def alloc(self, nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes]

  def copyin(self, handle: np.ndarray, src: memoryview) -> None:
    np.copyto(handle, np.frombuffer(src, dtype=np.uint8))

  def copyout(self, dest: memoryview, handle: np.ndarray) -> None:
    np.copyto(np.frombuffer(dest, dtype=np.uint8), handle)


@functools.cache
def compiler_version(cc: str) -> str:
  try:
    return subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
  except (OSError, subprocess.CalledProcessError) as e:
    raise RuntimeError(f"CPU backend: the C compiler {cc!r} does not run ({e}); install gcc or set CC") from e


class CCompiler(Compiler):
  def __init__(self, openmp: bool = False):
    self.cc, self.flags = config.CC, config.CFLAGS.split() + (["-fopenmp"] if openmp else [])
    self.cache_key = f"cpu {compiler_version(self.cc)} {' '.join(self.flags)}"

  def compile(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
      out = os.path.join(tmp, "kernel.so")
      cmd = [self.cc, *self.flags, "-shared", "-fPIC", "-fno-math-errno", "-x", "c", "-", "-o", out, "-lm"]
      proc = subprocess.run(cmd, input=src, capture_output=True, text=True)
      if proc.returncode != 0:
        numbered = "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(src.splitlines()))
        raise RuntimeError(f"CPU compile failed ({' '.join(cmd)}):\n{proc.stderr}\n--- source ---\n{numbered}")
      with open(out, "rb") as f: return f.read()


class CPUProgram:
  """A compiled kernel: call it with buffers and int values; returns seconds taken when asked to wait."""

  def __init__(self, name: str, lib: bytes):
    self.name = name
    with tempfile.NamedTemporaryFile(suffix=".so", delete=False) as f:
      f.write(lib)
      self.path = f.name
    try:
      self.lib = ctypes.CDLL(self.path)
    finally:
      os.unlink(self.path)
    self.fn = getattr(self.lib, name)
    self.fn.restype = None

  def __call__(self, bufs: list, vals: tuple[int, ...] = (), global_size=None, local_size=None, wait=False):
    args = [ctypes.c_void_p(b.ctypes.data) for b in bufs] + [ctypes.c_int(v) for v in vals]
    start = time.perf_counter()
    self.fn(*args)
    return time.perf_counter() - start


class CPUGraph:
  """A captured list of launches, replayed as calls whose ctypes arguments were all built once (the CPU's counterpart
  of a CUDA graph). Every slot that takes JIT input i holds the same c_void_p, so swapping in a new input buffer is
  one assignment however many kernels read it."""

  def __init__(self, launches: list[GraphLaunch], input_slots: list[list[tuple[int, int]]]):
    args = [[ctypes.c_void_p(h.ctypes.data) for h in launch.handles] + [ctypes.c_int(v) for v in launch.vals]
            for launch in launches]
    self.inputs = [ctypes.c_void_p(0) for _ in input_slots]
    self.last: list = [None] * len(input_slots)   # the handle each input slot points at now (kept alive by this)
    for i, slots in enumerate(input_slots):
      for li, pos in slots: args[li][pos] = self.inputs[i]
    self.calls = [functools.partial(launch.program.fn, *a) for launch, a in zip(launches, args)]
    taken = {slot for slots in input_slots for slot in slots}
    # the captured buffers' memory must outlive the calls (capture-time inputs are let go: replay swaps them out)
    self.kept = [h for li, launch in enumerate(launches) for pos, h in enumerate(launch.handles)
                 if (li, pos) not in taken]

  def launch(self, input_handles: list) -> float:
    """Run every launch in order with these input handles; returns the seconds taken."""
    for i, handle in enumerate(input_handles):
      if handle is not self.last[i]:
        self.inputs[i].value = handle.ctypes.data
        self.last[i] = handle
    start = time.perf_counter()
    for call in self.calls: call()
    return time.perf_counter() - start


def compiler_identity(cc: str) -> str:
  """What identifies the C compiler `cc` resolves to: its path, that file's size and modification time (an upgrade
  changes them) and its version line."""
  path = shutil.which(cc) or cc
  try:
    st = os.stat(path)
    stamp = f"{st.st_size}:{st.st_mtime_ns}"
  except OSError:
    stamp = "?"
  return f"{os.path.realpath(path)} {stamp} {compiler_version(cc)}"


def _probe_openmp(cc: str) -> bool:
  src = "#include <omp.h>\nint f(void) { return omp_get_max_threads(); }\n"
  with tempfile.TemporaryDirectory() as tmp:
    proc = subprocess.run([cc, "-fopenmp", "-shared", "-fPIC", "-x", "c", "-", "-o", os.path.join(tmp, "t.so")],
                          input=src, capture_output=True, text=True)
  return proc.returncode == 0


@functools.cache
def openmp_works(cc: str) -> bool:
  """Whether `cc -fopenmp` builds a shared object here (kernels then may use several cores). Building the probe
  takes tens of milliseconds, so its answer is kept on disk (CACHE_DIR/probes, not with NOCACHE), keyed by the
  compiler's identity; delete that folder to probe again (after installing libgomp, say). An unreadable or
  malformed entry is ignored."""
  if config.NOCACHE: return _probe_openmp(cc)
  identity = compiler_identity(cc)
  digest = hashlib.sha256(f"openmp\n{identity}".encode()).hexdigest()
  try:
    path = cache_dir() / "probes" / f"openmp-{digest}.json"
  except OSError:   # no cache folder can be made: probe every time
    return _probe_openmp(cc)
  try:
    entry = json.loads(path.read_text())
    if entry.get("compiler") == identity and type(entry.get("openmp")) is bool: return entry["openmp"]
  except (OSError, ValueError, AttributeError):
    pass
  works = _probe_openmp(cc)
  with contextlib.suppress(OSError): write_atomic(path, json.dumps({"compiler": identity, "openmp": works}))
  return works


def core_count() -> int:
  if config.THREADS > 0: return config.THREADS   # 0 means every core this process may run on
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def make_device() -> Compiled:
  cores = core_count()
  threads = cores if cores > 1 and openmp_works(config.CC) else 1   # one core needs no OpenMP (nor its probe)
  # OpenMP's own knob (not a fusegrad flag): idle kernel threads sleep instead of spinning, so a busy machine or a
  # second process doesn't turn every parallel kernel into a spin-wait; an explicit setting by the user wins
  if threads > 1: os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
  return Compiled("CPU", CPUAllocator(), CRenderer(max_threads=threads), CCompiler(openmp=threads > 1), CPUProgram,
                  graph=CPUGraph)
