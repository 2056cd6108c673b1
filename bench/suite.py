"""The benchmark suite: fusegrad side by side with numpy and PyTorch (eager and torch.compile) in one process.

Every array case first checks fusegrad's result against numpy in float64 on a small size, then times each contender:
median of >= 10 runs after warm-up; fusegrad's kernels are timed by the device (CUDA events on GPU), without the
Python scheduling around them. Three more cases time what surrounds the kernels, against targets: `overhead` (per-op
cost of building the lazy graph, of realizing after every op, and of a JIT replay, on a 16-element tensor),
`cold_start` (a fresh Python process that imports fusegrad and runs a small matmul) and `train_step` (forward, backward
and SGD update of the demo's network). The first run of every case is also split by compiler stage (schedule,
optimize, linearize, render, compile, run; see GlobalCounters.stage_s). Results go to bench/results/<device>-<date>.json
(a run of some --cases replaces only those cases' rows) and tables with time, GB/s (inputs read once, outputs written
once), GFLOP/s and the ratio of each peer's time to fusegrad's (> 1: we win).
"""
from __future__ import annotations
import contextlib
import ctypes
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable
import numpy as np
from fusegrad import Tensor, GlobalCounters, nn
from fusegrad.config import Context, config
from fusegrad.device import Device
from fusegrad.helpers import STAGES
from fusegrad.engine.jit import jit
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.search import beam_search
from fusegrad.engine.realize import run_schedule, get_program
from fusegrad.nn.state import get_state_dict, get_parameters

def _steady_malloc() -> None:
  """Serve big allocations from glibc's heap and never trim it. With glibc's adaptive defaults, one library's large
  frees in the process move the mmap threshold so that another's per-call 16 MB tensors become fresh mmaps, paid in
  page faults on every call: torch eager's relu(a*b+c) went from 3 to 15 ms after a fusegrad kernel had run in the
  same process. Fixed thresholds keep the peers' timings independent of the order cases run in."""
  try:
    libc = ctypes.CDLL("libc.so.6")
  except OSError:
    return   # not glibc: nothing to pin
  m_trim_threshold, m_mmap_threshold = -1, -3
  libc.mallopt(m_mmap_threshold, 32 << 20)      # glibc's largest allowed value on 64-bit
  libc.mallopt(m_trim_threshold, (1 << 31) - 1)


_steady_malloc()

try:
  import torch
except ImportError:
  torch = None

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


@dataclass
class Case:
  name: str
  shapes: dict[str, tuple]                 # per device kind: "CPU" / "CUDA"
  make: Callable                           # (xp, inputs) -> output, for fusegrad / numpy / torch alike
  inputs: Callable[[tuple], list]          # shape -> list of numpy inputs
  flops: Callable[[tuple], float]
  bytes: Callable[[tuple], float]
  dtype: str = "float32"
  skip: set = field(default_factory=set)


def _rand(*shape, dtype=np.float32):
  return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def _np_softmax(x):
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def _np_layernorm(x):
  c = x - x.mean(axis=-1, keepdims=True)
  return c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5)


def _fg_layernorm(x):
  c = x - x.mean(axis=-1, keepdim=True)
  return c * ((c * c).mean(axis=-1, keepdim=True) + 1e-5).rsqrt()


def _pick(np_fn, torch_fn, fg_fn):
  """One `make(xp, *inputs)` from the three spellings of the same computation."""
  return lambda xp, *xs: (np_fn if xp is np else torch_fn if xp is torch else fg_fn)(*xs)


def _matmul(a, b): return a @ b


def _np_conv2d(x, w):
  """3x3, stride 1, padding 1 convolution in numpy (sliding windows + einsum), the numpy peer and the check."""
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  windows = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
  return np.einsum("nchwij,ocij->nohw", windows, w, optimize=True)


def _conv_inputs(s, dtype=np.float32):
  return [_rand(s[0], 64, 56, 56, dtype=dtype), (_rand(64, 64, 3, 3) * 0.05).astype(dtype)]


CASES = [
  Case("ew_fused", {"CPU": (1 << 22,), "CUDA": (1 << 24,)},
       _pick(lambda a, b, c: np.maximum(a * b + c, 0), lambda a, b, c: (a * b + c).relu(),
             lambda a, b, c: (a * b + c).relu()),
       lambda s: [_rand(*s), _rand(*s), _rand(*s)], lambda s: 3 * s[0], lambda s: 16 * s[0]),
  Case("reduce_rows", {"CPU": (4096, 4096), "CUDA": (8192, 8192)},
       _pick(lambda a: a.sum(axis=1), lambda a: a.sum(dim=1), lambda a: a.sum(axis=1)), lambda s: [_rand(*s)],
       lambda s: s[0] * s[1], lambda s: 4 * s[0] * s[1] + 4 * s[0]),
  Case("reduce_all", {"CPU": (1 << 24,), "CUDA": (1 << 26,)}, _pick(np.sum, lambda a: a.sum(), lambda a: a.sum()),
       lambda s: [_rand(*s)], lambda s: s[0], lambda s: 4 * s[0]),
  Case("softmax", {"CPU": (2048, 2048), "CUDA": (8192, 8192)},
       _pick(_np_softmax, lambda a: a.softmax(dim=-1), lambda a: a.softmax(-1)), lambda s: [_rand(*s)],
       lambda s: 5 * s[0] * s[1], lambda s: 8 * s[0] * s[1]),
  Case("layernorm", {"CPU": (2048, 2048), "CUDA": (8192, 8192)},
       _pick(_np_layernorm, lambda a: torch.nn.functional.layer_norm(a, a.shape[-1:]), _fg_layernorm),
       lambda s: [_rand(*s)], lambda s: 7 * s[0] * s[1], lambda s: 8 * s[0] * s[1]),
  Case("matmul_fp32", {"CPU": (1024,), "CUDA": (4096,)}, _pick(_matmul, _matmul, _matmul),
       lambda s: [_rand(s[0], s[0]), _rand(s[0], s[0])], lambda s: 2 * s[0] ** 3, lambda s: 12 * s[0] ** 2),
  Case("conv2d", {"CPU": (8,), "CUDA": (32,)},
       _pick(_np_conv2d, lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), lambda x, w: x.conv2d(w, padding=1)),
       lambda s: _conv_inputs(s, np.float32), lambda s: 2 * s[0] * 64 * 64 * 9 * 56 * 56,
       lambda s: 4 * (2 * s[0] * 64 * 56 * 56 + 64 * 64 * 9)),
  Case("conv2d_fp16", {"CUDA": (32,)},
       _pick(_np_conv2d, lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), lambda x, w: x.conv2d(w, padding=1)),
       lambda s: _conv_inputs(s, np.float16), lambda s: 2 * s[0] * 64 * 64 * 9 * 56 * 56,
       lambda s: 2 * (2 * s[0] * 64 * 56 * 56 + 64 * 64 * 9)),
  Case("matmul_fp16", {"CUDA": (8192,)}, _pick(_matmul, _matmul, _matmul),
       lambda s: [_rand(s[0], s[0], dtype=np.float16), _rand(s[0], s[0], dtype=np.float16)],
       lambda s: 2 * s[0] ** 3, lambda s: 6 * s[0] ** 2, dtype="float16"),
]


def time_fusegrad(out: Tensor, device: str, runs: int) -> float:
  """Median device time of the schedule that computes `out` (compiled and warmed up first), its kernels launched
  back to back."""
  sched = create_schedule([out.lazydata])
  run_schedule(sched)
  kernels = [(get_program(si.ast, si.bufs[0].device), si) for si in sched if si.ast.op.name == "SINK"]
  Device[device].synchronize()
  launches = [(ck.program, [b._handle for b in si.bufs], tuple(si.var_vals[v] for v in ck.lin.vars),
               ck.lin.global_size, ck.lin.local_size) for ck, si in kernels]
  def launch_all() -> None:
    for program, handles, vals, gsz, lsz in launches: program(handles, vals, gsz, lsz)
  # the whole schedule between two device timestamps, as torch's ops are timed (CUDA events around the launches)
  return statistics.median(Device[device].time(launch_all) for _ in range(runs))


def time_host(fn: Callable, runs: int, sync: Callable = lambda: None) -> float:
  fn()
  sync()
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    fn()
    sync()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def time_torch_cuda(fn: Callable, runs: int) -> float:
  fn()
  torch.cuda.synchronize()
  times = []
  for _ in range(runs):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()   # keeps the GPU busy while the timed launches queue up behind it (no host latency in the measurement)
    s.record()
    fn()
    e.record()
    e.synchronize()
    times.append(s.elapsed_time(e) / 1e3)
  return statistics.median(times)


def check_small(case: Case, device: str) -> float:
  """Max relative error of fusegrad against numpy float64 on a small size."""
  small = tuple(min(s, 64) if len(case.shapes.get("CPU", case.shapes.get("CUDA"))) > 1 else 4096 for s in
                next(iter(case.shapes.values())))
  if case.name.startswith("matmul"): small = (64,)
  if case.name.startswith("conv2d"): small = (1,)
  inputs = case.inputs(small)
  ref = np.asarray(case.make(np, *[x.astype(np.float64) for x in inputs]), dtype=np.float64)
  got = case.make(Tensor, *[Tensor(x, device=device) for x in inputs]).numpy().astype(np.float64)
  return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-6))


@contextlib.contextmanager
def first_run(row: dict):
  """Add the compiler-stage seconds spent inside the block to row["first_run_s"], and the kernels compiled (disk-cache
  hits included) to row["kernels_compiled"]; wraps the untimed first runs, so the timed loops don't count."""
  before, compiled = dict(GlobalCounters.stage_s), GlobalCounters.compile_count
  try:
    yield
  finally:
    acc = row.setdefault("first_run_s", dict.fromkeys(STAGES, 0.0))
    for name, seconds in GlobalCounters.stage_s.items():
      acc[name] = acc.get(name, 0.0) + seconds - before.get(name, 0.0)
    row["kernels_compiled"] = row.get("kernels_compiled", 0) + GlobalCounters.compile_count - compiled


def run_beam(case: Case, device: str, runs: int, tensors: list, beam: int, budget: int, row: dict) -> None:
  """Time the case again with the opts BEAM search finds (`beam` wide, `budget` s per kernel), and what a second
  lookup (warm disk cache) costs per kernel; the heuristics are judged by fusegrad_s / beam_s (<= 1.5)."""
  start = time.perf_counter()
  with Context(BEAM=beam, BEAM_BUDGET=budget):
    row["beam_s"] = time_fusegrad(case.make(Tensor, *tensors), device, runs)
    row["beam_search_s"] = time.perf_counter() - start
    kernels = [si for si in create_schedule([case.make(Tensor, *tensors).lazydata]) if si.ast.op.name == "SINK"]
    start = time.perf_counter()
    for si in kernels: beam_search(si.ast, si.bufs, si.var_vals, si.bufs[0].device)
    row["beam_warm_s_per_kernel"] = (time.perf_counter() - start) / max(1, len(kernels))


def run_case(case: Case, device: str, runs: int, beam: int = 0, budget: int = 60) -> dict | None:
  kind = "CUDA" if device == "CUDA" else "CPU"
  if kind not in case.shapes: return None
  shape = case.shapes[kind]
  row = {"case": case.name, "shape": list(shape)}
  inputs = case.inputs(shape)
  with first_run(row):
    row["check_rel_err"] = check_small(case, device)
    tensors = [Tensor(x, device=device).realize() for x in inputs]
    row["fusegrad_s"] = time_fusegrad(case.make(Tensor, *tensors), device, runs)
  if beam: run_beam(case, device, runs, tensors, beam, budget, row)
  if kind == "CPU":
    row["numpy_s"] = time_host(lambda: case.make(np, *inputs), runs)
  if torch is not None:
    tdev = "cuda" if kind == "CUDA" else "cpu"
    tin = [torch.from_numpy(x).to(tdev) for x in inputs]
    timer = (lambda f: time_torch_cuda(f, runs)) if kind == "CUDA" else (lambda f: time_host(f, runs))
    row["torch_s"] = timer(lambda: case.make(torch, *tin))
    try:
      compiled = torch.compile(lambda *xs: case.make(torch, *xs))
      row["torch_compile_s"] = timer(lambda: compiled(*tin))
    except Exception as e:  # noqa: BLE001  (torch.compile may be unavailable; record why)
      row["torch_compile_error"] = f"{type(e).__name__}: {str(e)[:120]}"
  row["gflops"] = case.flops(shape) / row["fusegrad_s"] / 1e9
  row["gbps"] = case.bytes(shape) / row["fusegrad_s"] / 1e9
  return row


# ---- cases that time what surrounds the kernels: per-op overhead, a fresh process, a training step ----

OVERHEAD_OPS, JIT_OPS = 1000, 100
TARGETS_S = {   # upper bounds per device kind, in seconds
  "lazy build": {"CPU": 10e-6, "CUDA": 10e-6}, "JIT replay": {"CPU": 5e-6, "CUDA": 1e-6},
  "cold start": {"CPU": 0.5, "CUDA": 1.0},
}


def _kind(device: str) -> str: return "CUDA" if device == "CUDA" else "CPU"


def _metric(name: str, unit: str, fusegrad_s: float, device: str, peer: str | None = None,
            peer_s: float | None = None) -> dict:
  """One line of the overhead table: a time in seconds shown in `unit` (us/..., ms/..., s), its target if it has
  one, and a peer's time for the same thing."""
  m = {"metric": name, "unit": unit, "fusegrad_s": fusegrad_s}
  if name in TARGETS_S: m["target_s"] = TARGETS_S[name][_kind(device)]
  if peer_s is not None: m.update(peer=peer, peer_s=peer_s)
  return m


def _chain(x, n: int, realize: bool = False):
  """n dependent elementwise ops on x (multiply and add in turn); with `realize`, one kernel per op."""
  for i in range(n):
    x = x * 1.0001 if i % 2 == 0 else x + 0.5
    if realize: x = x.realize()
  return x


def _rel_err(got, ref) -> float:
  got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
  return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-6))


def run_overhead(device: str, runs: int, n_ops: int = OVERHEAD_OPS, jit_ops: int = JIT_OPS) -> dict:
  """Per op on a 16-element float32 tensor: building the lazy graph of n_ops dependent ops (no realize); realizing
  after every op (one cached kernel each); replaying a @jit function of jit_ops realized ops (per kernel)."""
  row: dict = {"case": "overhead", "shape": [16], "ops": n_ops, "jit_ops": jit_ops}
  sync = Device[device].synchronize
  x = Tensor(np.ones(16, np.float32), device=device).realize()

  @jit
  def chained(t: Tensor) -> Tensor: return _chain(t, jit_ops, realize=True)

  with first_run(row):
    each_out = _chain(x, n_ops, realize=True).numpy()
    chained(x)
    launched = GlobalCounters.kernel_count
    jit_out = chained(x).numpy()   # the second call captures
    kernels = GlobalCounters.kernel_count - launched
  lazy = time_host(lambda: _chain(x, n_ops), runs) / n_ops
  each = time_host(lambda: _chain(x, n_ops, realize=True), runs, sync) / n_ops
  calls = max(1, 1000 // max(kernels, 1))   # >= 1000 kernels per timed sample
  replay = time_host(lambda: [chained(x) for _ in range(calls)], runs, sync) / (calls * max(kernels, 1))
  ref = np.ones(16, np.float32)
  row["check_rel_err"] = max(_rel_err(each_out, _chain(ref, n_ops)),
                             *(_rel_err(out, _chain(ref, jit_ops)) for out in (jit_out, chained(x).numpy())))
  peer = None
  if torch is not None:
    tx = torch.ones(16, dtype=torch.float32, device="cuda" if _kind(device) == "CUDA" else "cpu")
    peer = time_host(lambda: _chain(tx, n_ops), runs, torch.cuda.synchronize if _kind(device) == "CUDA" else
                     lambda: None) / n_ops
  row["jit_kernels"] = kernels
  row["metrics"] = [_metric("lazy build", "us/op", lazy, device, "torch eager", peer),
                    _metric("realize each", "us/op", each, device, "torch eager", peer),
                    _metric("JIT replay", "us/kernel", replay, device, "torch eager", peer)]
  return row


_COLD_START = {
  "fusegrad": "from fusegrad import Tensor, GlobalCounters\n",
  "torch": "import torch\n",
}
_COLD_START_WORK = {
  "fusegrad": "value = (Tensor(a) @ Tensor(b)).sum().item()\nstages = GlobalCounters.stage_s\n",
  "torch": "a, b = torch.from_numpy(a).to(DEV), torch.from_numpy(b).to(DEV)\nvalue = (a @ b).sum().item()\n"
           "stages = {}\n",
}


def _cold_start_src(who: str, device: str) -> str:
  """A child program: import `who`, matmul + sum two fixed 64x64 float32 matrices on `device`, print one JSON line
  with the value and its own split of the time (import, work, compiler stages)."""
  return ("import time\nstart = time.perf_counter()\nimport json\nimport numpy as np\n" + _COLD_START[who] +
          f"imported = time.perf_counter()\nDEV = {'cuda' if _kind(device) == 'CUDA' else 'cpu'!r}\n"
          "rng = np.random.default_rng(0)\n"
          "a, b = (rng.standard_normal((64, 64), dtype=np.float32) for _ in range(2))\n" + _COLD_START_WORK[who] +
          "print(json.dumps({'value': value, 'import_s': imported - start, 'work_s': time.perf_counter() - imported,"
          " 'stages_s': stages}))\n")


def _child_env(device: str) -> dict[str, str]:
  """The environment of a child process: this one's, on `device`, with this process's kernel cache folder, and with
  bytecode caching on (as for any installed package; PYTHONDONTWRITEBYTECODE would add recompiling every module)."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
  env["DEV"] = device
  if config.CACHE_DIR: env["CACHE_DIR"] = config.CACHE_DIR
  return env


def _time_child(src: str, device: str, runs: int) -> tuple[float, str]:
  """Median wall time of `python -c src` over `runs` runs after one warm-up run (kernel and bytecode caches warm),
  and the last run's stdout. Runs in the repository root so `import fusegrad` finds this checkout."""
  times, out = [], ""
  for i in range(runs + 1):
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", src], cwd=ROOT, env=_child_env(device), capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0: raise RuntimeError(f"cold_start: the child process failed:\n{proc.stderr[-3000:]}")
    if i > 0: times.append(time.perf_counter() - start)
    out = proc.stdout
  return statistics.median(times), out


def run_cold_start(device: str, runs: int, peers: bool = True) -> dict:
  """Wall time of a fresh process that imports fusegrad and prints sum(A @ B) for 64x64 matrices (warm kernel cache),
  next to the same in torch; plus bare `import fusegrad` and bare interpreter start, to split the time."""
  row: dict = {"case": "cold_start", "shape": [64, 64]}
  wall, out = _time_child(_cold_start_src("fusegrad", device), device, runs)
  child = json.loads(next(line for line in out.splitlines() if line.startswith('{"value"')))   # DEBUG may print too
  rng = np.random.default_rng(0)
  a, b = (rng.standard_normal((64, 64), dtype=np.float32) for _ in range(2))
  row["check_rel_err"] = _rel_err(child["value"], (a.astype(np.float64) @ b).sum())
  row["child"] = {"import_s": child["import_s"], "work_s": child["work_s"], "stages_s": child["stages_s"]}
  peer = _time_child(_cold_start_src("torch", device), device, runs)[0] if peers and torch is not None else None
  row["metrics"] = [_metric("cold start", "s", wall, device, "torch", peer),
                    _metric("import fusegrad", "s", _time_child("import fusegrad", device, runs)[0], device),
                    _metric("python start", "s", _time_child("pass", device, runs)[0], device)]
  return row


class _DigitNet:
  """The demo's network (fusegrad/demo.py DigitNet), restated here so the bench needs no scikit-learn: conv(1->8) relu,
  conv(8->16) relu, max-pool 2, linear(256->64) relu, linear(64->10)."""

  def __init__(self):
    self.conv1, self.conv2 = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
    self.fc1, self.fc2 = nn.Linear(16 * 4 * 4, 64), nn.Linear(64, 10)

  def __call__(self, x: Tensor) -> Tensor:
    x = self.conv2(self.conv1(x).relu()).relu().max_pool2d(2)
    return self.fc2(self.fc1(x.flatten(1)).relu())


def _torch_digitnet():
  """The same network in torch.nn, with the same parameter names (so fusegrad's weights load into it)."""
  class TorchDigitNet(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.conv1, self.conv2 = torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.Conv2d(8, 16, 3, padding=1)
      self.fc1, self.fc2 = torch.nn.Linear(16 * 4 * 4, 64), torch.nn.Linear(64, 10)

    def forward(self, x):
      x = torch.nn.functional.max_pool2d(self.conv2(self.conv1(x).relu()).relu(), 2)
      return self.fc2(self.fc1(x.flatten(1)).relu())
  return TorchDigitNet()


def run_train_step(device: str, runs: int, batch: int = 64, lr: float = 0.01,
                   nets: tuple[Callable, Callable] = (_DigitNet, _torch_digitnet)) -> dict:
  """One step of the demo's training loop (batch from host memory, zero_grad, forward, cross-entropy, backward, SGD
  update) on random 8x8 images; torch eager runs the same network (`nets`: the fusegrad and torch constructors) from
  the same weights, and the losses of the first two steps are compared."""
  row: dict = {"case": "train_step", "shape": [batch, 1, 8, 8]}
  rng = np.random.default_rng(0)
  x, y = rng.random((batch, 1, 8, 8), dtype=np.float32), rng.integers(0, 10, batch).astype(np.int32)
  Tensor.manual_seed(0)
  model = nets[0]()
  opt = nn.optim.SGD(get_parameters(model), lr=lr)

  def step() -> Tensor:
    xb, yb = Tensor(x, device=device), Tensor(y, device=device)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
    return loss

  tmodel = nets[1]() if torch is not None else None
  if tmodel is not None:
    tmodel.load_state_dict({k: torch.from_numpy(v.numpy()) for k, v in get_state_dict(model).items()})
  with Tensor.train():
    with first_run(row):
      start = time.perf_counter()
      losses = [step()]
      Device[device].synchronize()
      first = time.perf_counter() - start
    losses.append(step())
    losses = [loss.item() for loss in losses]
    step_s = time_host(step, runs, Device[device].synchronize)
  metrics = [_metric("first step", "s", first, device), _metric("step", "ms/step", step_s, device)]
  if tmodel is not None:
    tdev = "cuda" if _kind(device) == "CUDA" else "cpu"
    tmodel.to(tdev)
    topt = torch.optim.SGD(tmodel.parameters(), lr=lr)
    tsync = torch.cuda.synchronize if tdev == "cuda" else lambda: None

    def torch_step():
      xb, yb = torch.from_numpy(x).to(tdev), torch.from_numpy(y.astype(np.int64)).to(tdev)
      topt.zero_grad()
      loss = torch.nn.functional.cross_entropy(tmodel(xb), yb)
      loss.backward()
      topt.step()
      return loss

    row["check_rel_err"] = _rel_err(losses, [torch_step().item() for _ in range(2)])
    row["torch_threads"] = torch.get_num_threads()
    metrics[1] = _metric("step", "ms/step", step_s, device, "torch eager", time_host(torch_step, runs, tsync))
  row["metrics"] = metrics
  return row


@dataclass
class Special:
  """A case with its own runner and table; `runs` and `quick_runs` are its timed repetitions."""
  name: str
  run: Callable[[str, int], dict]
  runs: int
  quick_runs: int


SPECIAL = [Special("overhead", run_overhead, 10, 5), Special("cold_start", run_cold_start, 5, 3),
           Special("train_step", run_train_step, 10, 5)]


def print_table(rows: list[dict]) -> None:
  peers = ["numpy_s", "torch_s", "torch_compile_s"]
  print(f"{'case':<13} {'shape':<14} {'fusegrad':>10} {'GB/s':>8} {'GFLOP/s':>9} " +
        " ".join(f"{p[:-2] + ' x':>15}" for p in peers) + f" {'check':>9}")
  for r in rows:
    ratios = " ".join(f"{r[p] / r['fusegrad_s']:>15.2f}" if p in r else f"{'-':>15}" for p in peers)
    print(f"{r['case']:<13} {'x'.join(map(str, r['shape'])):<14} {r['fusegrad_s'] * 1e3:>8.3f}ms {r['gbps']:>8.1f} "
          f"{r['gflops']:>9.1f} {ratios} {r['check_rel_err']:>9.1e}")
  print("ratios are peer time / fusegrad time: above 1 means fusegrad is faster")
  beams = [r for r in rows if "beam_s" in r]
  if beams:
    print(f"{'case':<13} {'heuristic':>10} {'BEAM':>10} {'heur/BEAM':>10} {'<=1.5':>6} {'search s':>9} "
          f"{'warm ms/kernel':>15}")
    for r in beams:
      ratio = r["fusegrad_s"] / r["beam_s"]
      print(f"{r['case']:<13} {r['fusegrad_s'] * 1e3:>8.3f}ms {r['beam_s'] * 1e3:>8.3f}ms {ratio:>10.2f} "
            f"{'yes' if ratio <= 1.5 else 'NO':>6} {r['beam_search_s']:>9.1f} "
            f"{r['beam_warm_s_per_kernel'] * 1e3:>15.2f}")


def _in_unit(seconds: float, unit: str) -> str:
  scale = {"us": 1e6, "ms": 1e3, "s": 1.0}[unit.split("/")[0]]
  return f"{seconds * scale:.3g}" if seconds * scale < 100 else f"{seconds * scale:.0f}"


def print_metrics(rows: list[dict]) -> None:
  """The overhead / cold start / training step table: one line per metric, its target and its peer."""
  print(f"{'case':<11} {'metric':<16} {'fusegrad':>18} {'target':>8} {'met':>4} {'peer':<12} {'peer time':>10} "
        f"{'peer x':>7} {'check':>9}")
  for r in rows:
    for i, m in enumerate(r["metrics"]):
      unit = m["unit"]
      target = f"<={_in_unit(m['target_s'], unit)}" if "target_s" in m else "-"
      met = ("yes" if m["fusegrad_s"] <= m["target_s"] else "NO") if "target_s" in m else "-"
      peer = (m["peer"], _in_unit(m["peer_s"], unit), f"{m['peer_s'] / m['fusegrad_s']:.2f}") if "peer_s" in m else \
          ("-", "-", "-")
      check = f"{r['check_rel_err']:.1e}" if i == 0 and "check_rel_err" in r else ""
      print(f"{r['case'] if i == 0 else '':<11} {m['metric']:<16} {_in_unit(m['fusegrad_s'], unit) + ' ' + unit:>18} "
            f"{target:>8} {met:>4} {peer[0]:<12} {peer[1]:>10} {peer[2]:>7} {check:>9}")
  cold = next((r for r in rows if r["case"] == "cold_start"), None)
  if cold is not None:
    c = cold["child"]
    stages = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in c["stages_s"].items() if v >= 5e-4)
    print(f"cold start, inside the child: import {c['import_s'] * 1e3:.0f} ms, matmul+sum {c['work_s'] * 1e3:.0f} ms "
          f"(stages, ms: {stages}); the rest is interpreter start and exit")
  print("peer x is peer time / fusegrad time: above 1 means fusegrad is faster; targets are upper bounds")


def stage_totals(rows: list[dict]) -> dict[str, float]:
  """The first-run seconds per compiler stage, summed over the rows."""
  total = dict.fromkeys(STAGES, 0.0)
  for r in rows:
    for name, seconds in r.get("first_run_s", {}).items(): total[name] = total.get(name, 0.0) + seconds
  return total


def print_stages(rows: list[dict]) -> None:
  """The first run of each case, split by compiler stage (ms), with the kernels compiled (disk-cache hits too)."""
  rows = [r for r in rows if "first_run_s" in r]
  if not rows: return
  names = list(stage_totals(rows))
  print("first run by compiler stage (ms; kernels compiled, disk-cache hits included):")
  print(f"{'case':<13} " + " ".join(f"{n:>9}" for n in names) + f" {'total':>9} {'kernels':>8}")
  lines = [(r["case"], r["first_run_s"], r.get("kernels_compiled", 0)) for r in rows]
  lines.append(("all", stage_totals(rows), sum(r.get("kernels_compiled", 0) for r in rows)))
  for case, stages, kernels in lines:
    print(f"{case:<13} " + " ".join(f"{stages.get(n, 0.0) * 1e3:>9.1f}" for n in names) +
          f" {sum(stages.values()) * 1e3:>9.1f} {kernels:>8}")


def write_results(device: str, rows: list[dict]) -> pathlib.Path:
  """Write the rows into today's results file for `device`, keeping the rows of cases this run didn't run."""
  RESULTS.mkdir(parents=True, exist_ok=True)
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
  path = RESULTS / f"{device}-{datetime.date.today().isoformat()}.json"
  ran = {r["case"] for r in rows}
  kept = []
  if path.exists():
    with contextlib.suppress(ValueError, KeyError, TypeError):
      kept = [r for r in json.loads(path.read_text())["rows"] if r["case"] not in ran]
  result = {"device": device, "commit": commit.stdout.strip(), "rows": kept + rows,
            "first_run_s": stage_totals(rows), "first_run_cases": [r["case"] for r in rows]}
  path.write_text(json.dumps(result, indent=1))
  return path


def main(args) -> int:
  device = Device.canonicalize(args.device) if args.device else Device.DEFAULT
  runs = 5 if args.quick else 10
  known = [c.name for c in CASES] + [s.name for s in SPECIAL]
  unknown = [c for c in args.cases or [] if c not in known]
  if unknown: raise SystemExit(f"bench: unknown case(s) {', '.join(unknown)}; valid cases: {', '.join(known)}")
  rows, special = [], []
  with Context(DEV=device):
    for case in CASES:
      if args.cases and case.name not in args.cases: continue
      row = run_case(case, device, runs, getattr(args, "beam", 0), getattr(args, "beam_budget", 60))
      if row is not None:
        rows.append(row)
        print(f"  {case.name}: {row['fusegrad_s'] * 1e3:.3f} ms", file=sys.stderr)
    for sp in SPECIAL:
      if args.cases and sp.name not in args.cases: continue
      special.append(sp.run(device, sp.quick_runs if args.quick else sp.runs))
      print(f"  {sp.name}: done", file=sys.stderr)
  if rows: print_table(rows)
  if special: print_metrics(special)
  print_stages(rows + special)
  path = write_results(device, rows + special)
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  import argparse
  parser = argparse.ArgumentParser()
  parser.add_argument("--device", default=None)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--cases", nargs="*")
  parser.add_argument("--beam", type=int, default=0, help="also time each case with BEAM search of this width")
  parser.add_argument("--beam-budget", type=int, default=60, help="BEAM_BUDGET seconds per kernel for --beam")
  sys.exit(main(parser.parse_args()))
