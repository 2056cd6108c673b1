"""Time hand-picked Opt lists for the kernels of one expression on a device (a manual BEAM, for tuning heuristics).

  python -m bench.explore --device CUDA --expr "a @ b" \\
      --setup "a = Tensor.rand(4096, 4096); b = Tensor.rand(4096, 4096)" \\
      --opts "[[Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 1, 8)]]"
Prints, for the heuristic opts and each given list: the opts, median kernel time (device timer), GFLOP/s and GB/s
of one kernel of the expression (--kernel, default the last), and whether its output matches the heuristic kernel's.
"""
from __future__ import annotations
import argparse
import statistics
import sys
import numpy as np
from fusegrad import Tensor, dtypes
from fusegrad.device import Device
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.compile import kernel_for
from fusegrad.engine.realize import compile_kernel, run_kernel, run_schedule
from fusegrad.codegen.kernel import Opt, OptOps


def main() -> int:
  p = argparse.ArgumentParser()
  p.add_argument("--device", default="CPU")
  p.add_argument("--setup", default="")
  p.add_argument("--expr", required=True)
  p.add_argument("--opts", default="[]", help="a Python list of Opt lists")
  p.add_argument("--runs", type=int, default=10)
  p.add_argument("--kernel", type=int, default=-1, help="which kernel of the expression to time (default: the last)")
  args = p.parse_args()
  env = {"Tensor": Tensor, "dtypes": dtypes, "Opt": Opt, "OptOps": OptOps}
  exec(args.setup, env)
  for k, v in list(env.items()):
    if isinstance(v, Tensor): env[k] = v.to(args.device).realize()
  out = eval(args.expr, env)
  sched = create_schedule([out.lazydata])
  kernels = [si for si in sched if si.ast.op.name == "SINK"]
  si = kernels[args.kernel]
  run_schedule(sched[:sched.index(si)])   # what the kernel reads is computed first
  for b in si.bufs: b.allocate()
  reference = None
  for opts in [None] + eval(args.opts, env):
    try:
      k = kernel_for(si.ast, args.device, opts)
      ck = compile_kernel(k, args.device)
    except Exception as e:  # noqa: BLE001  (a bad opt list is reported, not fatal)
      print(f"{str(opts):100s} FAILED {type(e).__name__}: {str(e)[:100]}")
      continue
    times = [run_kernel(ck, si.bufs, si.var_vals) or 0.0 for _ in range(3)]
    Device[args.device].synchronize()
    times = []
    for _ in range(args.runs):
      times.append(ck.program([b._handle for b in si.bufs], tuple(si.var_vals[v] for v in ck.lin.vars),
                              ck.lin.global_size, ck.lin.local_size, wait=True))
    t = statistics.median(times)
    got = si.bufs[0].numpy().copy()
    if reference is None: reference = got
    ok = np.allclose(got.astype(np.float64), reference.astype(np.float64), rtol=1e-2, atol=1e-2)
    print(f"{str(k.applied_opts):100s} {t * 1e3:9.3f} ms {ck.lin.op_estimate / t / 1e9:9.1f} GFLOP/s "
          f"{ck.lin.mem_estimate / t / 1e9:8.1f} GB/s {'ok' if ok else 'MISMATCH'} "
          f"{ck.program.resources() if hasattr(ck.program, 'resources') else ''}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
