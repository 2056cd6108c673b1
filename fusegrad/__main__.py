"""The fusegrad command line: `python -m fusegrad demo | doctor | kernels | bench`.

`demo` trains the digit classifier (the main job); `doctor` says what this machine can run and what is missing;
`kernels` schedules an expression and prints the source of every kernel for a device, compiling each — CUDA
included, which needs NVRTC but no GPU; `bench` runs the benchmark suite.
"""
from __future__ import annotations
import argparse
import importlib
import platform
import shutil
import subprocess
import sys
import numpy as np
from fusegrad import Tensor, dtypes, __version__
from fusegrad.config import config, Context
from fusegrad.device import Device, cuda_usable
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.compile import kernel_for, render_kernel


def cmd_doctor(args) -> int:
  """Report what fusegrad can use here, with a hint for each missing piece."""
  ok = True
  print(f"fusegrad {__version__}")
  print(f"python     {platform.python_version()} ({sys.executable})")
  print(f"numpy      {np.__version__}")
  cc = shutil.which(config.CC)
  if cc:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    print(f"C compiler {cc}: {version[0] if version else '?'}")
  else:
    ok = False
    print(f"C compiler {config.CC!r} not found: install gcc (apt-get install gcc) or set CC; the CPU device needs it")
  try:
    importlib.import_module("cuda.bindings.driver")
    from_nvrtc = importlib.import_module("cuda.bindings.nvrtc")
    err, major, minor = from_nvrtc.nvrtcVersion()
    print(f"NVRTC      {major}.{minor}" if int(err) == 0 else "NVRTC      not loadable: pip install nvidia-cuda-nvrtc")
    if cuda_usable():
      renderer = Device["CUDA"].renderer
      cores = {"m16n8k16": "mma.sync m16n8k16", "m64nNk16": "wgmma m64nNk16"}
      tcs = " + ".join(cores.get(t, t) for t in renderer.tensor_cores) or "none"
      print(f"CUDA GPU   usable: {renderer.arch}, tensor cores {tcs}")
    else:
      print("CUDA GPU   none found (CUDA kernels can still be compiled, for sm_90)")
  except (ImportError, RuntimeError, OSError):
    print("CUDA       cuda-bindings not installed: pip install 'fusegrad[cuda]' for the CUDA device")
  print(f"default    {Device.DEFAULT} (set DEV=CPU|CUDA|PYTHON to choose)")
  return 0 if ok else 1


def cmd_kernels(args) -> int:
  """Schedule EXPR on the CPU (kernel ASTs don't depend on the device), then render and compile for --device."""
  device = Device.canonicalize(args.device)
  with Context(DEV="CPU"):
    out = eval(args.expr, {"Tensor": Tensor, "dtypes": dtypes, "np": np})  # noqa: S307  (a developer tool)
  if not isinstance(out, Tensor): raise TypeError(f"kernels: EXPR must give a Tensor, got {type(out).__name__}")
  items = [si for si in create_schedule([out.lazydata]) if si.ast.op.name == "SINK"]
  for i, si in enumerate(items):
    k = kernel_for(si.ast, device)
    ks = render_kernel(k, device)
    print(f"// kernel {i + 1}/{len(items)}: {ks.name}  opts={k.applied_opts}  global={ks.lin.global_size} "
          f"local={ks.lin.local_size}  ({len(ks.lib)} bytes compiled)")
    print(ks.src)
  return 0


def cmd_demo(args) -> int:
  # the demo needs the optional 'demo' extra (scikit-learn, tqdm): load it only for this command
  demo = importlib.import_module("fusegrad.demo")
  return demo.main(args)


def cmd_bench(args) -> int:
  # the suite lives in the repository's bench/ folder (it needs torch and writes bench/results/)
  try:
    suite = importlib.import_module("bench.suite")
  except ImportError as e:
    raise SystemExit(f"bench: can't import bench/suite.py ({e}); run this from the fusegrad repository root") from e
  return suite.main(args)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m fusegrad", description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("demo", help="train a small CNN on scikit-learn's 8x8 digits and report accuracy and timings")
  p.add_argument("--device", default=None)
  p.add_argument("--epochs", type=int, default=None)
  p.add_argument("--seed", type=int, default=0)
  p.set_defaults(fn=cmd_demo)
  p = sub.add_parser("doctor", help="report Python, numpy, C compiler, CUDA driver/NVRTC and the default device")
  p.set_defaults(fn=cmd_doctor)
  p = sub.add_parser("kernels", help="print (and compile) the kernels of a Tensor expression for a device")
  p.add_argument("expr", help='e.g. "(Tensor.rand(64,64).half() @ Tensor.rand(64,64).half()).float()"')
  p.add_argument("--device", default="CPU")
  p.set_defaults(fn=cmd_kernels)
  p = sub.add_parser("bench", help="time fusegrad side by side with numpy and PyTorch; writes bench/results/")
  p.add_argument("--device", default=None)
  p.add_argument("--quick", action="store_true", help="fewer timed runs")
  p.add_argument("--cases", nargs="*", help="only these cases (e.g. ew_fused softmax)")
  p.add_argument("--beam", type=int, default=0, help="also time each case with the opts BEAM search of this width "
                 "finds, next to the heuristics")
  p.add_argument("--beam-budget", type=int, default=60, help="BEAM_BUDGET seconds per kernel for --beam")
  p.set_defaults(fn=cmd_bench)
  args = parser.parse_args(argv)
  return args.fn(args)


if __name__ == "__main__":
  sys.exit(main())
