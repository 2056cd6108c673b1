"""The benchmark suite: fusegrad side by side with numpy and PyTorch (eager and torch.compile) in one process.

Every case first checks fusegrad's result against numpy in float64 on a small size, then times each contender:
median of >= 10 runs after warm-up; fusegrad's kernels are timed by the device (CUDA events on GPU), without the
Python scheduling around them. Results go to bench/results/<device>-<date>.json and a table with time, GB/s
(inputs read once, outputs written once), GFLOP/s and the ratio of each peer's time to fusegrad's (> 1: we win).
"""
from __future__ import annotations
import datetime
import json
import pathlib
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable
import numpy as np
from fusegrad import Tensor
from fusegrad.config import Context
from fusegrad.device import Device
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.realize import run_schedule, get_program

try:
  import torch
except ImportError:
  torch = None

RESULTS = pathlib.Path(__file__).parent / "results"


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
  """Median kernel time of the schedule that computes `out` (compiled and warmed up first)."""
  sched = create_schedule([out.lazydata])
  run_schedule(sched)
  kernels = [(get_program(si.ast, si.bufs[0].device), si) for si in sched if si.ast.op.name == "SINK"]
  Device[device].synchronize()
  times = []
  for _ in range(runs):
    total = 0.0
    for ck, si in kernels:
      vals = tuple(si.var_vals[v] for v in ck.lin.vars)
      total += ck.program([b._handle for b in si.bufs], vals, ck.lin.global_size, ck.lin.local_size, wait=True)
    times.append(total)
  return statistics.median(times)


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


def run_case(case: Case, device: str, runs: int) -> dict | None:
  kind = "CUDA" if device == "CUDA" else "CPU"
  if kind not in case.shapes: return None
  shape = case.shapes[kind]
  err = check_small(case, device)
  inputs = case.inputs(shape)
  row = {"case": case.name, "shape": list(shape), "check_rel_err": err}
  tensors = [Tensor(x, device=device).realize() for x in inputs]
  row["fusegrad_s"] = time_fusegrad(case.make(Tensor, *tensors), device, runs)
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


def print_table(rows: list[dict]) -> None:
  peers = ["numpy_s", "torch_s", "torch_compile_s"]
  print(f"{'case':<13} {'shape':<14} {'fusegrad':>10} {'GB/s':>8} {'GFLOP/s':>9} " +
        " ".join(f"{p[:-2] + ' x':>15}" for p in peers) + f" {'check':>9}")
  for r in rows:
    ratios = " ".join(f"{r[p] / r['fusegrad_s']:>15.2f}" if p in r else f"{'-':>15}" for p in peers)
    print(f"{r['case']:<13} {'x'.join(map(str, r['shape'])):<14} {r['fusegrad_s'] * 1e3:>8.3f}ms {r['gbps']:>8.1f} "
          f"{r['gflops']:>9.1f} {ratios} {r['check_rel_err']:>9.1e}")
  print("ratios are peer time / fusegrad time: above 1 means fusegrad is faster")


def main(args) -> int:
  device = Device.canonicalize(args.device) if args.device else Device.DEFAULT
  runs = 5 if args.quick else 10
  rows = []
  with Context(DEV=device):
    for case in CASES:
      if args.cases and case.name not in args.cases: continue
      row = run_case(case, device, runs)
      if row is not None:
        rows.append(row)
        print(f"  {case.name}: {row['fusegrad_s'] * 1e3:.3f} ms", file=sys.stderr)
  print_table(rows)
  RESULTS.mkdir(exist_ok=True)
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
  path = RESULTS / f"{device}-{datetime.date.today().isoformat()}.json"
  path.write_text(json.dumps({"device": device, "commit": commit, "rows": rows}, indent=1))
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  import argparse
  parser = argparse.ArgumentParser()
  parser.add_argument("--device", default=None)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--cases", nargs="*")
  sys.exit(main(parser.parse_args()))
