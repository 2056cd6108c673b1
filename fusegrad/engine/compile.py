"""Turning a kernel AST into compiled code for a device: choose opts, linearize, render, compile.

Kept apart from running (realize.py) so BEAM search workers and the `kernels` command can compile without a device
present. DEBUG=3 prints the applied opts, 4 the source, 5 the UOps. Each step is timed as its stage in
GlobalCounters.stage_s: optimize, linearize, render, compile (the on-disk cache lookup included).
"""
from __future__ import annotations
from dataclasses import dataclass
from fusegrad.config import config
from fusegrad.helpers import colored, to_function_name, stage
from fusegrad.uop import UOp
from fusegrad.device import Device
from fusegrad.codegen.kernel import Kernel, Opt
from fusegrad.codegen.heuristic import hand_coded_optimizations
from fusegrad.codegen.linearizer import linearize, verify_uops, LinearProgram


def kernel_for(ast: UOp, device: str, opts: list[Opt] | None = None) -> Kernel:
  """The Kernel of an AST with opts applied: `opts` if given, else the hand-coded heuristics (unless NOOPT)."""
  with stage("optimize"):
    k = Kernel(ast, Device[device].renderer)
    if opts is not None:
      for o in opts: k.apply_opt(o)
    elif not config.NOOPT:
      hand_coded_optimizations(k)
  return k


@dataclass
class KernelSource:
  """A kernel rendered and compiled for a device, not yet loaded (works without the device present)."""
  name: str
  lin: LinearProgram
  src: str
  lib: bytes


def render_kernel(k: Kernel, device: str) -> KernelSource:
  """Linearize, render and compile one Kernel; DEBUG=3/4/5 print opts, source and UOps."""
  dev = Device[device]
  with stage("linearize"):
    lin = linearize(k)
    if config.DEBUG >= 1 or config.VERIFY: verify_uops(lin.uops)
  with stage("render"):
    name = to_function_name(lin.name)
    src = dev.renderer.render(name, lin.uops)
  if config.DEBUG >= 3: print(f"{colored(name, 'cyan')} opts: {k.applied_opts}")
  if config.DEBUG >= 4: print(src)
  if config.DEBUG >= 5:
    for i, u in enumerate(lin.uops):
      print(f"{i:4d} {u.op.name:<14} {u.dtype.name:<12} {[lin.uops.index(s) for s in u.src]} "
            f"{u.arg if u.arg is not None else ''}")
  with stage("compile"):
    lib = dev.compiler.compile_cached(src)
  return KernelSource(name, lin, src, lib)
