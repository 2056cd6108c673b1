"""The command line as a user runs it: --help, doctor, and `kernels` printing CUDA source compiled by NVRTC
without a GPU (the CI check of the GPU half of the seed: shared memory, barriers, mma.sync, float4)."""
import subprocess
import sys
import pytest

import fusegrad.__main__ as fusegrad_main
from fusegrad.device import Device


def cli(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "fusegrad", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_subcommands():
  out = cli("--help")
  assert out.returncode == 0
  for cmd in ("demo", "doctor", "kernels", "bench"): assert cmd in out.stdout


def test_doctor_reports_the_machine():
  out = cli("doctor")
  assert "python" in out.stdout and "numpy" in out.stdout and "C compiler" in out.stdout
  assert "default" in out.stdout


def test_doctor_names_the_gpus_tensor_cores(monkeypatch, capsys):
  """With a GPU, doctor names its compute capability and the tensor-core instructions fusegrad will use (an H200:
  sm_90, mma.sync and wgmma). Without one here, the check pretends a GPU is usable; the CUDA device still renders."""
  pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (the 'cuda' extra) is not installed")
  monkeypatch.setattr(fusegrad_main, "cuda_usable", lambda: True)
  fusegrad_main.cmd_doctor(None)
  line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("CUDA GPU"))
  arch = Device["CUDA"].renderer.arch
  assert f"usable: {arch}" in line and "mma.sync m16n8k16" in line
  assert ("wgmma m64nNk16" in line) == (arch in ("sm_90", "sm_90a"))




@pytest.mark.parametrize("expr, needles", [
  ("(Tensor.rand(1 << 14).sum())", ["__shared__", "__syncthreads()"]),
  ("(Tensor.rand(64, 64).half() @ Tensor.rand(64, 64).half()).float()", ["mma.sync.aligned.m16n8k16"]),
  ("(Tensor.rand(4096) * Tensor.rand(4096) + 1).relu()", ["float4", "blockIdx", "threadIdx"]),
])
def test_kernels_command_renders_cuda_without_a_gpu(expr, needles):
  pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (the 'cuda' extra) is not installed")
  out = cli("kernels", "--device", "CUDA", expr)
  assert out.returncode == 0, out.stderr
  assert "bytes compiled" in out.stdout
  for needle in needles: assert needle in out.stdout


def test_kernels_command_on_cpu():
  out = cli("kernels", "--device", "CPU", "Tensor.rand(8, 8).exp().sum(axis=1)")
  assert out.returncode == 0, out.stderr
  assert "void r_" in out.stdout


def test_unknown_device_is_a_clear_error():
  out = cli("kernels", "--device", "TPU", "Tensor.rand(2)")
  assert out.returncode != 0 and "unknown device 'TPU'" in out.stderr
