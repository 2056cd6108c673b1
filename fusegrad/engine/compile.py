"""Turning a kernel AST into compiled code for a device: choose opts, linearize, render, compile.

Kept apart from running (realize.py) so BEAM search workers and the `kernels` command can compile without a device
present. DEBUG=3 prints the applied opts, 4 the source, 5 the UOps. Each step is timed as its stage in
GlobalCounters.stage_s: optimize, linearize, render, compile (the on-disk cache lookups included).

`build_program` also keeps a disk cache of programs (CACHE_DIR/programs, off with NOCACHE): the rendered source and
what launching it needs (name, launch dims, int parameters, estimates, applied opts), keyed by the AST printed in
full, its variables' ranges, the renderer's identity (arch, vector widths, threads), how the opts are chosen
(explicit opts, a search, the heuristics), the flags that may change a program (NOOPT, BEAM, ...), fusegrad's version
and a hash of fusegrad's own compiler code (so editing the compiler never serves a stale program).
A second process then skips optimize, linearize and render; the binary comes from the compiler's cache by source.
Entries are written atomically (a temporary file, then a rename); one that can't be read or parsed is ignored.
"""
from __future__ import annotations
import dataclasses
import functools
import hashlib
import json
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from fusegrad import __version__
from fusegrad.config import config, FLAGS
from fusegrad.dtype import to_dtype
from fusegrad.helpers import colored, to_function_name, stage, cache_dir, write_atomic
from fusegrad.uop import UOp, Ops, GroupOp, pretty
from fusegrad.device import Device
from fusegrad.renderer.cstyle import Renderer
from fusegrad.codegen.kernel import Kernel, Opt, OptOps
from fusegrad.codegen.heuristic import hand_coded_optimizations
from fusegrad.codegen.linearizer import linearize, verify_uops, LinearProgram

PROGRAM_FORMAT = 1   # bump when an entry's layout changes
# flags that never change a program's source or launch: every other flag's value (NOOPT, BEAM, ... and flags added
# later) is part of the program cache key
_KEYLESS_FLAGS = frozenset({"DEV", "DEBUG", "VERIFY", "CACHE_DIR", "NOCACHE", "JIT_GRAPH"})
# the parts of fusegrad whose code decides a program: a change to any of them makes every cached program a miss
_CODE_PATHS = ("codegen", "renderer", "shape", "runtime", "engine/compile.py", "engine/search.py", "uop.py",
               "symbolic.py", "rewrite.py", "dtype.py", "helpers.py", "device.py", "__init__.py")


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
class ProgramInfo:
  """The attributes of a LinearProgram that launching a kernel and its counters use, as the program cache keeps
  them. `uops` (for DEBUG output and tests) linearizes the kernel again on first use."""
  name: str
  global_size: tuple | None
  local_size: tuple | None
  vars: list[UOp]   # DEFINE_VARs, in parameter order
  buf_count: int
  op_estimate: int | UOp   # symbolic in a kernel over a variable's range
  mem_estimate: int | UOp
  relinearize: Callable[[], LinearProgram] = field(repr=False)

  @functools.cached_property
  def uops(self) -> list[UOp]: return self.relinearize().uops


@dataclass
class KernelSource:
  """A kernel rendered and compiled for a device, not yet loaded (works without the device present). `lin` is the
  LinearProgram, or a ProgramInfo when the program came from the disk cache (`cached`)."""
  name: str
  lin: LinearProgram | ProgramInfo
  src: str
  lib: bytes
  opts: list[Opt] = field(default_factory=list)   # the applied opts
  display_name: str = ""                          # the kernel's shape, colored by axis kind (DEBUG=2)
  cached: bool = False


def display_name(k: Kernel) -> str:
  """The kernel's shape as DEBUG=2 prints it: r_/E_ then each axis colored by its kind."""
  shape = "_".join(colored(str(s) if isinstance(s, int) else s.render(), c) for s, c in zip(k.full_shape, k.colors()))
  return ("r_" if k.reduceop is not None else "E_") + shape


def _debug_print(name: str, opts: list[Opt], src: str, uops: list[UOp] | None) -> None:
  if config.DEBUG >= 3: print(f"{colored(name, 'cyan')} opts: {opts}")
  if config.DEBUG >= 4: print(src)
  if config.DEBUG >= 5 and uops is not None:
    for i, u in enumerate(uops):
      print(f"{i:4d} {u.op.name:<14} {u.dtype.name:<12} {[uops.index(s) for s in u.src]} "
            f"{u.arg if u.arg is not None else ''}")


def render_kernel(k: Kernel, device: str) -> KernelSource:
  """Linearize, render and compile one Kernel; DEBUG=3/4/5 print opts, source and UOps."""
  dev = Device[device]
  with stage("linearize"):
    lin = linearize(k)
    if config.DEBUG >= 1 or config.VERIFY: verify_uops(lin.uops)
  with stage("render"):
    name = to_function_name(lin.name)
    src = dev.renderer.render(name, lin.uops)
  _debug_print(name, k.applied_opts, src, lin.uops)
  with stage("compile"):
    lib = dev.compiler.compile_cached(src)
  return KernelSource(name, lin, src, lib, list(k.applied_opts), display_name(k))


def build_program(ast: UOp, device: str, opts: list[Opt] | None = None,
                  search: Callable[[], list[Opt]] | None = None) -> KernelSource:
  """The compiled program of a kernel AST, from the program cache when it is there. Its opts are `opts` if given,
  else what `search()` returns (a BEAM search; keyed by the BEAM width), else the hand-coded heuristics (or none with
  NOOPT). A miss optimizes, linearizes, renders and compiles, then stores the program."""
  if opts is not None: how = "opts " + " ".join(f"{o.op.name}/{o.axis}/{o.amount}" for o in opts)
  else: how = "search" if search is not None else "heuristics"
  key = None if config.NOCACHE else _program_key(ast, device, how)
  # DEBUG=5 prints the UOps and VERIFY checks them: both want a fresh linearization (whose program is then stored)
  if key is not None and config.DEBUG < 5 and not config.VERIFY:
    with stage("compile"):
      hit = _load_program(key, ast, device)
    if hit is not None:
      _debug_print(hit.name, hit.opts, hit.src, None)
      return hit
  ks = render_kernel(kernel_for(ast, device, opts if opts is not None else search() if search is not None else None),
                     device)
  if key is not None: _store_program(key, ast, ks)
  return ks


# ***** the program cache *****

@functools.cache
def _code_fingerprint() -> str:
  """A hash of the source of the parts of fusegrad that decide a program; the version alone where unreadable."""
  root = pathlib.Path(__file__).resolve().parent.parent
  h = hashlib.sha256(__version__.encode())
  try:
    files = sorted(p for name in _CODE_PATHS for p in ([root / name] if name.endswith(".py") else
                                                        (root / name).rglob("*.py")))
    for path in files:
      h.update(path.relative_to(root).as_posix().encode() + b"\0")
      h.update(path.read_bytes())
  except OSError:
    return __version__
  return h.hexdigest()


def _renderer_identity(r: Renderer) -> str:
  """The renderer's class and every field (arch, vector widths, threads, limits), the same in every process."""
  parts = [f"{type(r).__module__}.{type(r).__qualname__}"]
  if not dataclasses.is_dataclass(r): return parts[0] + repr(sorted(vars(r).items()))
  for f in dataclasses.fields(r):
    value = getattr(r, f.name)
    # a frozenset's order follows hashes, which differ between processes: sort it
    parts.append(f"{f.name}={sorted(map(repr, value)) if isinstance(value, (set, frozenset)) else repr(value)}")
  return " ".join(parts)


def _ast_vars(ast: UOp) -> dict[str, UOp] | None:
  """The DEFINE_VARs of an AST (in its views and its graph) by name; None when two share a name."""
  found: set[UOp] = set()
  for n in ast.toposort():
    if n.op is Ops.VIEW: found |= n.arg.vars()
    elif n.op is Ops.DEFINE_VAR: found.add(n)
  by_name = {v.arg.name: v for v in found}
  return by_name if len(by_name) == len(found) else None


def _program_key(ast: UOp, device: str, how: str) -> str | None:
  """The cache key of a program, or None when this AST can't be cached (variables sharing a name)."""
  names = _ast_vars(ast)
  if names is None: return None
  # the printed AST names variables without their ranges, which simplification depends on: add them
  variables = " ".join(f"{n}:{v.dtype.name}:{v.arg.min}:{v.arg.max}" for n, v in sorted(names.items()))
  flags = " ".join(f"{name}={getattr(config, name)!r}" for name in sorted(FLAGS) if name not in _KEYLESS_FLAGS)
  text = "\n".join([f"program {PROGRAM_FORMAT}", __version__, _code_fingerprint(), device,
                    _renderer_identity(Device[device].renderer), how, flags, variables, pretty(ast, max_nodes=0)])
  return hashlib.sha256(text.encode()).hexdigest()


def _program_path(key: str) -> pathlib.Path: return cache_dir() / "programs" / f"{key}.json"


def _expr_to_json(x: int | UOp) -> Any:
  """A launch size or estimate (an int, or an int expression of the kernel's variables) as JSON."""
  if type(x) is int: return x
  if x.op is Ops.DEFINE_VAR: return ["var", x.arg.name]
  if x.op is Ops.CONST and type(x.arg) is int: return ["const", x.dtype.name, x.arg]
  if x.op in GroupOp.ALU or x.op is Ops.CAST: return [x.op.name, x.dtype.name, [_expr_to_json(s) for s in x.src]]
  raise ValueError(f"program cache: can't store a size containing {x!r}")


def _expr_from_json(j: Any, variables: dict[str, UOp]) -> int | UOp:
  if type(j) is int: return j
  if j[0] == "var": return variables[j[1]]
  if j[0] == "const":
    if type(j[2]) is not int: raise ValueError("program cache: a size constant is not an int")
    return UOp.const(to_dtype(j[1]), j[2])
  op = Ops[j[0]]
  if op not in GroupOp.ALU and op is not Ops.CAST: raise ValueError(f"program cache: {op} in a size")
  return UOp(op, to_dtype(j[1]), tuple(_expr_from_json(s, variables) for s in j[2]))


def _typed(x: Any, t: type, optional: bool = False) -> Any:
  """x when it is exactly of type t (or None, if optional); a malformed entry raises ValueError."""
  if type(x) is t or (optional and x is None): return x
  raise ValueError(f"program cache: expected a {t.__name__}, got {x!r}")


def _sizes_from_json(j: Any, variables: dict[str, UOp]) -> tuple | None:
  return None if j is None else tuple(_expr_from_json(s, variables) for s in j)


def _load_program(key: str, ast: UOp, device: str) -> KernelSource | None:
  """The cached program of `key`, or None: no entry, an unreadable or malformed one, or a source that no longer
  compiles."""
  try:
    entry = json.loads(_program_path(key).read_text())
    if entry["format"] != PROGRAM_FORMAT or entry["key"] != key: return None
    variables = _ast_vars(ast) or {}
    lin_name, name, src, display = (_typed(entry[k], str) for k in ("lin_name", "name", "src", "display"))
    opts = [Opt(OptOps[o], _typed(a, int, True), _typed(n, int, True)) for o, a, n in entry["opts"]]
    params = [variables[v] for v in entry["vars"]]
    gsz, lsz = _sizes_from_json(entry["global_size"], variables), _sizes_from_json(entry["local_size"], variables)
    buf_count = _typed(entry["buf_count"], int)
    op_estimate, mem_estimate = (_expr_from_json(entry[k], variables) for k in ("op_estimate", "mem_estimate"))
  except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
    return None
  try:
    lib = Device[device].compiler.compile_cached(src)
  except RuntimeError:   # a hand-edited or foreign entry whose source doesn't build: rebuild it instead
    return None
  info = ProgramInfo(lin_name, gsz, lsz, params, buf_count, op_estimate, mem_estimate,
                     lambda: linearize(kernel_for(ast, device, opts)))
  return KernelSource(name, info, src, lib, opts, display, cached=True)


def _store_program(key: str, ast: UOp, ks: KernelSource) -> None:
  """Write a program's entry (best effort: a program that can't be stored, or an unwritable folder, is skipped)."""
  lin = ks.lin
  variables = _ast_vars(ast)
  if variables is None or any(variables.get(v.arg.name) is not v for v in lin.vars): return
  try:
    entry = {"format": PROGRAM_FORMAT, "key": key, "lin_name": lin.name, "name": ks.name, "src": ks.src,
             "display": ks.display_name, "opts": [(o.op.name, o.axis, o.amount) for o in ks.opts],
             "vars": [v.arg.name for v in lin.vars],
             "global_size": None if lin.global_size is None else [_expr_to_json(s) for s in lin.global_size],
             "local_size": None if lin.local_size is None else [_expr_to_json(s) for s in lin.local_size],
             "buf_count": lin.buf_count, "op_estimate": _expr_to_json(lin.op_estimate),
             "mem_estimate": _expr_to_json(lin.mem_estimate)}
    write_atomic(_program_path(key), json.dumps(entry))   # parallel writers never leave a half-written entry
  except (OSError, ValueError, TypeError, AttributeError):
    return
