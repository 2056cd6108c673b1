"""Devices: the name -> (allocator, renderer, compiler, program) mapping, and the Buffer that lives on a device.

`Device["CPU"]` returns the device object, created on first use; backends live in fusegrad/runtime/<name>.py and are
loaded by name, so a missing optional dependency (cuda-bindings) only matters to the device that needs it.
`Device.DEFAULT` comes from DEV, else CUDA when usable, else CPU. Compiled binaries are cached on disk by source,
device and compiler identity. A device may also offer a graph: a captured list of launches replayed in one go (the JIT
uses it; a CUDA graph on CUDA, precomputed ctypes calls on CPU).
"""
from __future__ import annotations
import contextlib
import hashlib
import os
import threading
import time
import importlib
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, NamedTuple
import numpy as np
from fusegrad.config import config
from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import cache_dir, GlobalCounters, prod, write_atomic
from fusegrad.renderer.cstyle import Renderer

KNOWN_DEVICES = ("CPU", "CUDA", "PYTHON")


class Allocator:
  """Raw device memory: alloc/free and host copies. Handles are opaque to everything but the allocator."""
  def alloc(self, nbytes: int) -> Any: raise NotImplementedError
  def free(self, handle: Any, nbytes: int) -> None: pass
  def copyin(self, handle: Any, src: memoryview) -> None: raise NotImplementedError
  def copyout(self, dest: memoryview, handle: Any) -> None: raise NotImplementedError


_DEFERRED = threading.local()   # per thread: the open deferred_compiles() blocks' lists of postponed sources


def _deferred() -> list[list[tuple[Compiler, str]]]:
  if not hasattr(_DEFERRED, "blocks"): _DEFERRED.blocks = []
  return _DEFERRED.blocks


@contextlib.contextmanager
def deferred_compiles():
  """Inside the block (in this thread), `compile_cached` of a source whose binary is not on disk yet records it and
  returns b"" instead of compiling; the block yields the list of (compiler, source) pairs, for `compile_many`."""
  pending: list[tuple[Compiler, str]] = []
  _deferred().append(pending)
  try:
    yield pending
  finally:
    _deferred().remove(pending)


def compile_many(jobs: list[tuple[Compiler, str]]) -> dict[tuple[Compiler, str], Exception]:
  """Compile sources into the binary cache side by side (the compilers are subprocesses or release the GIL);
  returns the jobs that failed, with their errors."""
  jobs = list(dict.fromkeys(jobs))
  def run(job):
    try:
      job[0].compile_cached(job[1])
      return None
    except RuntimeError as e:
      return e
  if not jobs: return {}
  with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
    return {job: err for job, err in zip(jobs, pool.map(run, jobs)) if err is not None}


class Compiler:
  """Source -> binary, with an on-disk cache keyed by source and `cache_key` (compiler identity, arch, flags)."""
  cache_key: str = ""
  def compile(self, src: str) -> bytes: raise NotImplementedError

  def compile_cached(self, src: str) -> bytes:
    if config.NOCACHE: return self.compile(src)
    digest = hashlib.sha256(f"{self.cache_key}\n{src}".encode()).hexdigest()
    path = cache_dir() / "kernels" / f"{digest}.bin"
    if path.exists(): return path.read_bytes()
    if _deferred():
      _deferred()[-1].append((self, src))
      return b""
    lib = self.compile(src)
    write_atomic(path, lib)   # a temporary file, then a rename: parallel processes never see half a binary
    return lib


class GraphLaunch(NamedTuple):
  """One captured kernel launch, as a device graph takes it: the program, its buffers' allocator handles, its int
  values and its launch dims."""
  program: Any
  handles: list
  vals: tuple[int, ...]
  global_size: tuple[int, ...] | None
  local_size: tuple[int, ...] | None


@dataclass
class Compiled:
  """A device: how to hold memory, render kernels, compile them and build runnable programs."""
  name: str
  allocator: Allocator
  renderer: Renderer
  compiler: Compiler
  program: type                    # Program(name, lib, renderer_extra) -> callable(bufs, vals, global, local, wait)
  synchronize: Any = field(default=lambda: None)
  # Graph(launches: list[GraphLaunch], input_slots) replays the launches in order through .launch(input_handles);
  # input_slots[i] lists the (launch, buffer position) pairs that take input i's handle. None: no graph here.
  graph: type | None = None
  # timer(fn) -> seconds the device spends from before fn's launches to after them (fn launches without waiting)
  timer: Any = None

  def time(self, fn: Callable[[], Any]) -> float:
    """Device seconds for the launches fn makes, start to end (GPU: events around them, with the queue kept full
    by an untimed call before; else wall time to done)."""
    if self.timer is not None: return self.timer(fn)
    self.synchronize()
    start = time.perf_counter()
    fn()
    self.synchronize()
    return time.perf_counter() - start


class _DeviceRegistry:
  def canonicalize(self, name: str | None) -> str:
    if name is None: return self.DEFAULT
    if not isinstance(name, str): raise TypeError(f"device: expected a device name string, got {type(name).__name__}")
    upper = name.split(":")[0].upper()
    if upper == "CLANG": upper = "CPU"
    if upper not in KNOWN_DEVICES:
      raise ValueError(f"device: unknown device {name!r}; valid devices: {', '.join(KNOWN_DEVICES)}")
    return upper

  @functools.cache
  def __getitem__(self, name: str) -> Compiled:
    name = self.canonicalize(name)
    module = importlib.import_module(f"fusegrad.runtime.{name.lower()}")
    return module.make_device()

  @functools.cached_property
  def DEFAULT(self) -> str:
    if config.DEV: return self.canonicalize(config.DEV)
    return "CUDA" if cuda_usable() else "CPU"


def cuda_usable() -> bool:
  """True when cuda-bindings import and a GPU answers."""
  try:
    module = importlib.import_module("fusegrad.runtime.cuda")
  except ImportError:
    return False
  return module.gpu_available()


Device = _DeviceRegistry()


class Buffer:
  """`size` elements of `dtype` on a device. Memory is taken on `allocate()` and given back when collected."""

  def __init__(self, device: str, size: int, dtype: DType):
    if size < 0: raise ValueError(f"Buffer: size must be >= 0, got {size}")
    self.device, self.size, self.dtype = device, size, dtype
    self._handle: Any = None

  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  @property
  def is_allocated(self) -> bool: return self._handle is not None

  def allocate(self) -> Buffer:
    if self._handle is None:
      self._handle = Device[self.device].allocator.alloc(max(self.nbytes, 1))
      GlobalCounters.mem_used += self.nbytes
    return self

  def __del__(self):
    if getattr(self, "_handle", None) is not None:
      GlobalCounters.mem_used -= self.nbytes
      Device[self.device].allocator.free(self._handle, max(self.nbytes, 1))

  def copyin(self, data: np.ndarray) -> Buffer:
    data = np.ascontiguousarray(data)
    if data.nbytes != self.nbytes:
      raise ValueError(f"Buffer.copyin: {data.nbytes} bytes given for a buffer of {self.nbytes} bytes")
    self.allocate()
    if self.nbytes: Device[self.device].allocator.copyin(self._handle, memoryview(data.reshape(-1).view(np.uint8)))
    return self

  def raw_bytes(self) -> np.ndarray:
    """A host copy of the contents as bytes."""
    raw = np.empty(self.nbytes, dtype=np.uint8)
    if self.nbytes: Device[self.device].allocator.copyout(memoryview(raw), self.allocate()._handle)
    return raw

  def numpy(self) -> np.ndarray:
    """A host copy of the contents (bfloat16 comes back as float32)."""
    raw = self.raw_bytes()
    if self.dtype is dtypes.bfloat16: return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return raw.view(self.dtype.np)

  def __repr__(self) -> str: return f"<Buffer {self.device} {self.size} {self.dtype.name}>"


def numpy_to_storage(arr: np.ndarray, dtype: DType) -> np.ndarray:
  """Host array laid out as `dtype` stores it (bfloat16 is rounded into its 16-bit pattern)."""
  if dtype is dtypes.bfloat16:
    bits = np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)
  return np.ascontiguousarray(arr, dtype=dtype.np)


def buffer_size(shape: tuple[int, ...]) -> int: return int(prod(shape))
