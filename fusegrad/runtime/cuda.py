"""The CUDA backend on NVIDIA's cuda-bindings: NVRTC compiles kernels to cubin, the driver API runs them.

One context (the device's primary context) and the default stream; a pooled allocator over plain cuMemAlloc
(freed blocks are kept by size and reused); host copies through pinned staging buffers for large transfers; events
time kernels under DEBUG>=2; CUDAGraph replays a JIT's captured launches as one CUDA graph. Without a GPU, the
compiler still works (NVRTC needs no device), so CUDA source can be rendered and compiled on any machine:
`python -m fusegrad kernels --device CUDA "EXPR"`.
"""
from __future__ import annotations
import ctypes
import functools
import sys
from collections import defaultdict
import numpy as np
from fusegrad.config import config
from fusegrad.device import Allocator, Compiler, Compiled, GraphLaunch
from fusegrad.renderer.cstyle import CUDARenderer

try:
  from cuda.bindings import driver, nvrtc
except ImportError as e:  # the optional extra is missing: say how to get it
  raise ImportError("the CUDA backend needs the 'cuda' extra: pip install 'fusegrad[cuda]' "
                    "(cuda-bindings and nvidia-cuda-nvrtc)") from e

STAGING_MIN = 1 << 20   # copies at least this big go through pinned host memory
STREAM = 0              # kernels and graphs all run on the legacy default stream, so they are ordered with the copies


def check(result, what: str):
  """Unwrap a cuda-bindings result tuple, raising RuntimeError with the error's name on failure."""
  err, *rest = result if isinstance(result, tuple) else (result,)
  if int(err) != 0:
    name = err.name if hasattr(err, "name") else str(err)
    raise RuntimeError(f"CUDA: {what} failed with {name}")
  return rest[0] if len(rest) == 1 else tuple(rest) if rest else None


@functools.cache
def gpu_available() -> bool:
  try:
    check(driver.cuInit(0), "cuInit")
    return check(driver.cuDeviceGetCount(), "cuDeviceGetCount") > 0
  except (RuntimeError, OSError):
    return False


@functools.cache
def _context():
  """The primary context of GPU 0, made current."""
  if not gpu_available():
    raise RuntimeError("CUDA: no usable GPU (cuInit or cuDeviceGetCount failed); use DEV=CPU, or only render and "
                       "compile with `python -m fusegrad kernels --device CUDA`")
  dev = check(driver.cuDeviceGet(0), "cuDeviceGet")
  ctx = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
  check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
  return dev, ctx


def device_arch() -> str:
  if config.CUDA_ARCH: return config.CUDA_ARCH
  if not gpu_available(): return "sm_90"
  dev, _ = _context()
  major = check(driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                            dev), "cuDeviceGetAttribute")
  minor = check(driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                            dev), "cuDeviceGetAttribute")
  return f"sm_{major}{minor}"


class CUDAAllocator(Allocator):
  """Plain device allocations, pooled by size: a freed block is reused by the next alloc of that size."""

  def __init__(self):
    self.pool: dict[int, list[int]] = defaultdict(list)
    self.staging: tuple[int, int] | None = None   # (pinned host pointer, size)

  def alloc(self, nbytes: int) -> int:
    _context()
    if self.pool[nbytes]: return self.pool[nbytes].pop()
    try:
      return int(check(driver.cuMemAlloc(nbytes), f"cuMemAlloc({nbytes})"))
    except RuntimeError:
      self.release_pool()
      return int(check(driver.cuMemAlloc(nbytes), f"cuMemAlloc({nbytes})"))

  def free(self, handle: int, nbytes: int) -> None: self.pool[nbytes].append(handle)

  def release_pool(self) -> None:
    for blocks in self.pool.values():
      for h in blocks: driver.cuMemFree(h)
    self.pool.clear()

  def _pinned(self, nbytes: int) -> int:
    """A pinned host buffer of at least nbytes, kept for the next large copy."""
    if self.staging is None or self.staging[1] < nbytes:
      if self.staging is not None: driver.cuMemFreeHost(self.staging[0])
      self.staging = (int(check(driver.cuMemHostAlloc(nbytes, 0), "cuMemHostAlloc")), nbytes)
    return self.staging[0]

  def copyin(self, handle: int, src: memoryview) -> None:
    _context()
    host = np.frombuffer(src, dtype=np.uint8)
    if len(host) >= STAGING_MIN:
      pinned = self._pinned(len(host))
      ctypes.memmove(pinned, host.ctypes.data, len(host))
      check(driver.cuMemcpyHtoD(handle, pinned, len(host)), "cuMemcpyHtoD")
    else:
      check(driver.cuMemcpyHtoD(handle, host.ctypes.data, len(host)), "cuMemcpyHtoD")

  def copyout(self, dest: memoryview, handle: int) -> None:
    _context()
    host = np.frombuffer(dest, dtype=np.uint8)
    if len(host) >= STAGING_MIN:
      pinned = self._pinned(len(host))
      check(driver.cuMemcpyDtoH(pinned, handle, len(host)), "cuMemcpyDtoH")
      ctypes.memmove(host.ctypes.data, pinned, len(host))
    else:
      check(driver.cuMemcpyDtoH(host.ctypes.data, handle, len(host)), "cuMemcpyDtoH")


class NVRTCCompiler(Compiler):
  def __init__(self, arch: str):
    self.arch = arch
    self.cache_key = f"cuda {arch} nvrtc {'.'.join(map(str, check(nvrtc.nvrtcVersion(), 'nvrtcVersion')))}"

  def compile(self, src: str) -> bytes:
    prog = check(nvrtc.nvrtcCreateProgram(src.encode(), b"kernel.cu", 0, [], []), "nvrtcCreateProgram")
    # wgmma exists only on sm_90a: the arch-specific target (its cubin runs on compute capability 9.0 exactly)
    arch = self.arch + "a" if "wgmma.mma_async" in src and self.arch == "sm_90" else self.arch
    opts = [f"--gpu-architecture={arch}".encode(), b"-default-device", b"--std=c++17"]
    result = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(result[0]) != 0:
      size = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
      log = b" " * size
      check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
      numbered = "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(src.splitlines()))
      raise RuntimeError(f"CUDA compile failed ({arch}):\n{log.decode(errors='replace')}\n--- source ---\n"
                         f"{numbered}")
    size = check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
    cubin = b" " * size
    check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    nvrtc.nvrtcDestroyProgram(prog)
    return cubin


def kernel_args(bufs: list, vals: tuple[int, ...]) -> list:
  """A kernel's arguments as ctypes values: buffers as 64-bit device pointers, then the int values as int32."""
  return [ctypes.c_uint64(int(b)) for b in bufs] + [ctypes.c_int32(v) for v in vals]


def param_array(args: list) -> ctypes.Array:
  """The void*[] the driver reads a launch's arguments through (kernelParams); it must outlive its use."""
  return (ctypes.c_void_p * max(len(args), 1))(*[ctypes.addressof(a) for a in args])


class CUDAProgram:
  """A loaded kernel; call with device pointers, int values and launch dims."""

  def __init__(self, name: str, lib: bytes):
    _context()
    self.name = name
    self.module = check(driver.cuModuleLoadData(lib), f"cuModuleLoadData({name})")
    self.fn = check(driver.cuModuleGetFunction(self.module, name.encode()), f"cuModuleGetFunction({name})")
    self.shared = self._dynamic_shared()

  def resources(self) -> str:
    """Registers per thread, spilled (local) bytes per thread and shared bytes per block, as the driver reports."""
    def attr(name: str) -> int:
      return check(driver.cuFuncGetAttribute(getattr(driver.CUfunction_attribute, name), self.fn), name)
    return (f"regs={attr('CU_FUNC_ATTRIBUTE_NUM_REGS')} spill={attr('CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES')}B "
            f"smem={attr('CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES') + self.shared}B")

  def _dynamic_shared(self) -> int:
    """Bytes of dynamic shared memory the kernel needs: the renderer leaves the number in `fg_dynamic_shared` when
    the block's arrays exceed the 48 KB of static shared memory; the kernel is then opted in to that much."""
    err, ptr, _ = driver.cuModuleGetGlobal(self.module, b"fg_dynamic_shared")
    if err == driver.CUresult.CUDA_ERROR_NOT_FOUND: return 0
    check((err,), f"cuModuleGetGlobal({self.name}, fg_dynamic_shared)")
    value = ctypes.c_uint32()
    check(driver.cuMemcpyDtoH(ctypes.addressof(value), ptr, 4), "cuMemcpyDtoH(fg_dynamic_shared)")
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(driver.cuFuncSetAttribute(self.fn, attr, value.value),
          f"{self.name}: {value.value} bytes of shared memory per block (more than this GPU allows?)")
    return value.value

  def __call__(self, bufs: list, vals: tuple[int, ...] = (), global_size=(1, 1, 1), local_size=(1, 1, 1), wait=False):
    args = kernel_args(bufs, vals)
    params = param_array(args)
    gx, gy, gz = global_size
    lx, ly, lz = local_size
    if wait:
      start, end = check(driver.cuEventCreate(0), "cuEventCreate"), check(driver.cuEventCreate(0), "cuEventCreate")
      check(driver.cuEventRecord(start, STREAM), "cuEventRecord")
    try:
      check(driver.cuLaunchKernel(self.fn, gx, gy, gz, lx, ly, lz, self.shared, STREAM, ctypes.addressof(params), 0),
            f"launch of {self.name} grid={tuple(global_size)} block={tuple(local_size)}")
    except RuntimeError as e:
      raise RuntimeError(f"{e} (kernel {self.name})") from e
    if not wait: return None
    check(driver.cuEventRecord(end, STREAM), "cuEventRecord")
    check(driver.cuEventSynchronize(end), f"kernel {self.name}")
    ms = check(driver.cuEventElapsedTime(start, end), "cuEventElapsedTime")
    driver.cuEventDestroy(start)
    driver.cuEventDestroy(end)
    return ms / 1e3


class CUDAGraph:
  """A JIT's captured launches as one CUDA graph: a chain of kernel nodes (each depends on the one before, as the
  launches were ordered on one stream), instantiated once and replayed with one cuGraphLaunch.

  Every argument slot that takes JIT input i reads the same c_uint64. When an input arrives at a new device pointer,
  that value is updated in place and the nodes reading it are re-set with cuGraphExecKernelNodeSetParams (the driver
  copies argument values when params are set, so the storage only has to live as long as this object, which keeps it).
  Int values (bound symbolic dims) are baked in, as they are at capture. The caller keeps the captured buffers alive.
  """

  def __init__(self, launches: list[GraphLaunch], input_slots: list[list[tuple[int, int]]]):
    _context()
    self.graph = self.exec = None
    self.args = [kernel_args(launch.handles, launch.vals) for launch in launches]
    self.inputs = [ctypes.c_uint64(int(launches[slots[0][0]].handles[slots[0][1]]) if slots else 0)
                   for slots in input_slots]
    for i, slots in enumerate(input_slots):
      for li, pos in slots: self.args[li][pos] = self.inputs[i]
    self.readers = [sorted({li for li, _ in slots}) for slots in input_slots]   # nodes to re-set per input
    self.param_arrays = [param_array(args) for args in self.args]
    self.params = [self._node_params(launch, arr) for launch, arr in zip(launches, self.param_arrays)]
    self.graph = check(driver.cuGraphCreate(0), "cuGraphCreate")
    self.nodes: list = []
    for launch, params in zip(launches, self.params):
      deps = self.nodes[-1:]
      try:
        self.nodes.append(check(driver.cuGraphAddKernelNode(self.graph, deps, len(deps), params),
                                f"cuGraphAddKernelNode({launch.program.name})"))
      except RuntimeError as e:
        raise RuntimeError(f"{e}: grid={tuple(launch.global_size)} block={tuple(launch.local_size)}; "
                           "JIT_GRAPH=0 replays kernel by kernel instead") from e
    self.exec = check(driver.cuGraphInstantiate(self.graph, 0), f"cuGraphInstantiate ({len(self.nodes)} kernels)")
    check(driver.cuGraphUpload(self.exec, STREAM), "cuGraphUpload")

  @staticmethod
  def _node_params(launch: GraphLaunch, arr: ctypes.Array):
    params = driver.CUDA_KERNEL_NODE_PARAMS()
    params.func = launch.program.fn
    params.gridDimX, params.gridDimY, params.gridDimZ = (int(d) for d in launch.global_size)
    params.blockDimX, params.blockDimY, params.blockDimZ = (int(d) for d in launch.local_size)
    params.sharedMemBytes = launch.program.shared
    params.kernelParams = ctypes.addressof(arr)
    return params

  def launch(self, input_handles: list) -> None:
    """Point the graph at these input device pointers (re-setting only the nodes whose inputs moved) and launch it
    on the kernels' stream. Asynchronous, like a kernel launch: returns None (no time measured)."""
    if self.exec is None: raise RuntimeError("CUDAGraph.launch: this graph was freed")
    stale: set[int] = set()
    for i, handle in enumerate(input_handles):
      if handle != self.inputs[i].value:
        self.inputs[i].value = handle
        stale.update(self.readers[i])
    for li in sorted(stale):
      check(driver.cuGraphExecKernelNodeSetParams(self.exec, self.nodes[li], self.params[li]),
            "cuGraphExecKernelNodeSetParams")
    check(driver.cuGraphLaunch(self.exec, STREAM), "cuGraphLaunch")

  def free(self) -> None:
    """Destroy the executable graph and the graph (done on collection too); launching afterwards is an error."""
    if getattr(self, "exec", None) is not None: driver.cuGraphExecDestroy(self.exec)
    if getattr(self, "graph", None) is not None: driver.cuGraphDestroy(self.graph)
    self.exec = self.graph = None

  def __del__(self):
    if not sys.is_finalizing(): self.free()   # at interpreter exit the driver may be gone; the exit frees it all


def synchronize() -> None:
  if gpu_available(): check(driver.cuCtxSynchronize(), "cuCtxSynchronize")


def event_timer(fn) -> float:
  """Seconds between CUDA events recorded on the stream before and after the launches fn makes. fn runs once
  untimed first: the GPU is still busy with it while the timed launches queue up, so the time is the kernels' own,
  not the host's latency in launching them (the way GPU kernels are benchmarked)."""
  _context()
  start, end = check(driver.cuEventCreate(0), "cuEventCreate"), check(driver.cuEventCreate(0), "cuEventCreate")
  try:
    fn()
    check(driver.cuEventRecord(start, STREAM), "cuEventRecord")
    fn()
    check(driver.cuEventRecord(end, STREAM), "cuEventRecord")
    check(driver.cuEventSynchronize(end), "cuEventSynchronize")
    return check(driver.cuEventElapsedTime(start, end), "cuEventElapsedTime") / 1e3
  finally:
    driver.cuEventDestroy(start)
    driver.cuEventDestroy(end)


def make_device() -> Compiled:
  arch = device_arch()
  return Compiled("CUDA", CUDAAllocator(), CUDARenderer(arch), NVRTCCompiler(arch), CUDAProgram, synchronize,
                  graph=CUDAGraph, timer=event_timer)
