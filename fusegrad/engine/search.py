"""BEAM search: find Opts for a kernel by timing candidates on the device.

The beam starts from the unoptimized kernel and the hand-coded opts. Each round extends every kept candidate by one
Opt from a fixed action list, compiles the new candidates in worker processes (a candidate whose compile fails or
hangs past its timeout is dropped, never the search), times them on scratch buffers, checks each winner's output
against the unoptimized kernel on the same inputs, and keeps the fastest `BEAM` ones. The search stops when a round
brings no gain or the `BEAM_BUDGET` seconds are spent. Results persist on disk, keyed by the kernel AST, device,
arch and fusegrad version, so a second run costs one lookup.
"""
from __future__ import annotations
import hashlib
import json
import statistics
import sys
import time
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, TimeoutError as FutureTimeout
import numpy as np
from fusegrad import __version__
from fusegrad.config import config
from fusegrad.helpers import cache_dir, write_atomic
from fusegrad.uop import UOp, pretty
from fusegrad.dtype import DType, dtypes
from fusegrad.device import Device, Buffer
from fusegrad.codegen.kernel import Kernel, Opt, OptOps, KernelOptError
from fusegrad.engine.compile import kernel_for, render_kernel

ACTIONS: list[Opt] = (
  [Opt(OptOps.UPCAST, axis, amt) for amt in (0, 2, 3, 4, 5, 7, 8) for axis in range(6)] +
  [Opt(OptOps.UNROLL, axis, amt) for amt in (0, 2, 4, 7, 8) for axis in range(4)] +
  [Opt(OptOps.LOCAL, axis, amt) for amt in (2, 3, 4, 8, 13, 16, 29, 32) for axis in range(6)] +
  [Opt(OptOps.GROUPTOP, axis, amt) for amt in (13, 16, 28, 29, 32, 49, 64, 256) for axis in range(3)] +
  [Opt(OptOps.GROUP, axis, amt) for amt in (0, 4, 8, 16, 32, 64, 128) for axis in range(3)] +
  [Opt(OptOps.RASTER, 0, amt) for amt in (4, 8, 16)] +
  [Opt(OptOps.STAGE, reader, amt) for reader in (0, 1, 2) for amt in (2, 3, 4)] +
  [Opt(OptOps.NOLOCALS), Opt(OptOps.TC, 0, 0), Opt(OptOps.TC, 1, 0)])
COMPILE_TIMEOUT_S = 20.0


def _cache_path():
  return cache_dir() / "beam.json"


def _key(ast: UOp, device: str) -> str:
  arch = Device[device].renderer.arch or device
  return hashlib.sha256(f"{__version__}|{device}|{arch}|{pretty(ast, max_nodes=0)}".encode()).hexdigest()


def cached_opts(ast: UOp, device: str) -> list[Opt] | None:
  path = _cache_path()
  if config.NOCACHE or not path.exists(): return None
  try:
    entry = json.loads(path.read_text()).get(_key(ast, device))
  except (OSError, json.JSONDecodeError):
    return None
  return None if entry is None else [Opt(OptOps[o], a, n) for o, a, n in entry]


def _store_opts(ast: UOp, device: str, opts: list[Opt]) -> None:
  if config.NOCACHE: return
  path = _cache_path()
  try:
    data = json.loads(path.read_text()) if path.exists() else {}
  except (OSError, json.JSONDecodeError):
    data = {}
  data[_key(ast, device)] = [(o.op.name, o.axis, o.amount) for o in opts]
  write_atomic(path, json.dumps(data).encode())


def _candidates(base: Kernel, ast: UOp, device: str) -> list[list[Opt]]:
  out = []
  for action in ACTIONS:
    opts = base.applied_opts + [action]
    try:
      k = Kernel(ast, Device[device].renderer)
      for o in opts: k.apply_opt(o)
    except KernelOptError:   # (apply_opt enforces the lane and thread limits)
      continue
    out.append(opts)
  return out


def _compile(args):
  """Worker: build, linearize, render and compile one candidate. Returns (opts, name, lin vars/dims, lib) or None."""
  ast, device, opts = args
  try:
    ks = render_kernel(kernel_for(ast, device, opts), device)
  except Exception:  # noqa: BLE001  (a bad candidate is dropped, whatever broke)
    return None
  return opts, ks.name, ks.lin, ks.lib


def _time(device: str, name: str, lin, lib: bytes, bufs: list[Buffer], var_vals: dict, runs: int = 3) -> float:
  program = Device[device].program(name, lib)
  vals = tuple(var_vals[v] for v in lin.vars)
  handles = [b._handle for b in bufs]
  return statistics.median(program(handles, vals, lin.global_size, lin.local_size, wait=True) for _ in range(runs))


def _scratch(bufs: tuple[Buffer, ...]) -> list[Buffer]:
  rng = np.random.default_rng(0)
  out = []
  for b in bufs:
    nb = Buffer(b.device, b.size, b.dtype).allocate()
    raw = rng.integers(0, 256, b.nbytes, dtype=np.uint8)
    if b.dtype.fmt is not None and b.dtype.np is not None and np.issubdtype(b.dtype.np, np.floating):
      raw = rng.standard_normal(b.size).astype(b.dtype.np).view(np.uint8)
    nb.copyin(raw.view(np.uint8))
    out.append(nb)
  return out


def _progress(done: int, total: int, start: float, budget: float, best: float) -> None:
  elapsed = time.perf_counter() - start
  eta = elapsed / max(done, 1) * (total - done)
  bar = "#" * int(30 * done / max(total, 1))
  print(f"\rBEAM [{bar:<30}] {done}/{total} best {best * 1e6:9.1f}us elapsed {elapsed:5.1f}s eta {eta:5.1f}s "
        f"budget {budget:.0f}s", end="", file=sys.stderr, flush=True)


def beam_search(ast: UOp, bufs: tuple[Buffer, ...], var_vals: dict, device: str, width: int | None = None,
                budget_s: float | None = None) -> list[Opt]:
  """The fastest Opts found for `ast` within the budget (cached on disk)."""
  hit = cached_opts(ast, device)
  if hit is not None: return hit
  width = width or config.BEAM
  budget_s = budget_s if budget_s is not None else config.BEAM_BUDGET
  start = time.perf_counter()
  scratch = _scratch(bufs)
  renderer = Device[device].renderer
  base = Kernel(ast, renderer)
  reference = _compile((ast, device, []))
  best_opts, best_time = [], _time(device, *reference[1:], scratch, var_vals)
  expected = _run_output(device, reference, scratch, var_vals)
  beam = [(best_time, base)]
  # the hand-coded opts seed the beam too, so the search starts from them and can only improve on them
  hand = kernel_for(ast, device, None)
  seeded = _compile((ast, device, list(hand.applied_opts))) if hand.applied_opts else None
  if seeded is not None and _matches(_run_output(device, seeded, scratch, var_vals), expected, scratch[0].dtype):
    t = _time(device, *seeded[1:], scratch, var_vals)
    if t < best_time: best_time, best_opts = t, list(hand.applied_opts)
    beam = sorted(beam + [(t, hand)], key=lambda x: x[0])[:width]
  ctx = multiprocessing.get_context("fork")
  with ProcessPoolExecutor(max_workers=max(1, min(8, multiprocessing.cpu_count())), mp_context=ctx) as pool:
    while time.perf_counter() - start < budget_s:
      candidates = [opts for _, k in beam for opts in _candidates(k, ast, device)]
      futures = [pool.submit(_compile, (ast, device, opts)) for opts in candidates]
      timed = []
      for i, fut in enumerate(futures):
        remaining = budget_s - (time.perf_counter() - start)
        if remaining <= 0: break
        try:
          res = fut.result(timeout=min(COMPILE_TIMEOUT_S, remaining))
        except (FutureTimeout, Exception):  # noqa: BLE001  (timeout or a crashed worker drops one candidate)
          continue
        if res is None: continue
        try:
          timed.append((_time(device, *res[1:], scratch, var_vals), res))
        except RuntimeError:
          continue
        _progress(i + 1, len(futures), start, budget_s, min([best_time] + [t for t, _ in timed]))
      timed.sort(key=lambda x: x[0])
      improved = False
      kept = []
      for t, res in timed:
        if len(kept) >= width: break
        if not _matches(_run_output(device, res, scratch, var_vals), expected, scratch[0].dtype):
          continue   # a wrong candidate never wins
        if t < best_time: best_time, best_opts, improved = t, res[0], True
        k = Kernel(ast, renderer)
        for o in res[0]: k.apply_opt(o)
        kept.append((t, k))
      if not improved or not kept: break
      beam = kept
  print(file=sys.stderr)
  _store_opts(ast, device, best_opts)
  return best_opts


def _matches(got: np.ndarray, expected: np.ndarray, dtype: DType) -> bool:
  """A candidate's output against the unoptimized kernel's: equal up to a few units in the last place of the output
  dtype, relative to the output's scale (a long sum rounded to fp16 differs by an ulp where the order of its adds
  does; its values near zero are cancellations, compared against the scale)."""
  tol = {dtypes.float16: 4e-3, dtypes.bfloat16: 3e-2}.get(dtype, 1e-3)
  finite = expected[np.isfinite(expected)]
  scale = float(np.abs(finite).max()) if finite.size else 1.0
  return bool(np.allclose(got.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol * max(scale, 1e-30),
                          equal_nan=True))


def _run_output(device: str, compiled, scratch: list[Buffer], var_vals: dict) -> np.ndarray:
  _time(device, *compiled[1:], scratch, var_vals, runs=1)
  return scratch[0].numpy().copy()
