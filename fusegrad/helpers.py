"""Small utilities used across fusegrad: sequence helpers, integer math, terminal colors, names, counters, timing.

The compiler stages time themselves with `with stage("linearize"):` into GlobalCounters.stage_s; DEBUG>=1 prints
those totals when the process exits.

Kept dependency-free (standard library and fusegrad.config only) so every other module can import it.
"""
from __future__ import annotations

import atexit
import functools
import operator
import os
import pathlib
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, TypeVar

from fusegrad.config import config

T = TypeVar("T")

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_NOT_IDENT_RE = re.compile(r"[^A-Za-z0-9_]")
_COLORS = {"black": 30, "red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35, "cyan": 36, "white": 37}


def prod(xs: Iterable[Any]) -> Any:
  """Product of xs; 1 when empty. Works for any objects supporting `*` (a single item is returned unchanged)."""
  items = list(xs)
  return functools.reduce(operator.mul, items) if items else 1


def toposort(root: T, sources: Callable[[T], Iterable[T]]) -> list[T]:
  """Every node reachable from `root` through `sources`, each after its sources (root last). Iterative, so deep
  graphs (long lazy chains, long autograd tapes) don't hit the recursion limit."""
  order: list[T] = []
  seen: set[int] = set()
  stack: list[tuple[T, bool]] = [(root, False)]
  pop, push, mark = stack.pop, stack.append, seen.add   # a hot loop (every UOp walk): bound methods, no generators
  while stack:
    node, expanded = pop()
    if expanded:
      order.append(node)
      continue
    if id(node) in seen: continue
    mark(id(node))
    push((node, True))
    srcs = sources(node)
    if type(srcs) is not tuple and type(srcs) is not list: srcs = list(srcs)
    for i in range(len(srcs) - 1, -1, -1):   # pushed last to first, so they are visited first to last
      if id(srcs[i]) not in seen: push((srcs[i], False))
  return order


def all_same(xs: Sequence[Any]) -> bool:
  """True when every item equals the first (and for an empty sequence)."""
  return all(x == xs[0] for x in xs[1:])


def all_int(xs: Iterable[Any]) -> bool:
  """True when every item is a Python int (so no symbolic values are left)."""
  return all(isinstance(x, int) for x in xs)


def dedup(xs: Iterable[T]) -> list[T]:
  """Drop repeated (hashable) items, keeping the first occurrence of each, in order."""
  return list(dict.fromkeys(xs))


def flatten(xss: Iterable[Iterable[T]]) -> list[T]:
  """Concatenate a list of lists into one list."""
  return [x for xs in xss for x in xs]


def argsort(xs: Sequence[Any]) -> list[int]:
  """Indices that would sort xs (stable)."""
  return sorted(range(len(xs)), key=xs.__getitem__)


def argfix(*x: Any) -> tuple[Any, ...]:
  """Normalize f(1, 2, 3) and f((1, 2, 3)) (or f([1, 2, 3])) to the tuple (1, 2, 3)."""
  if len(x) == 1 and isinstance(x[0], (tuple, list)):
    return tuple(x[0])
  return x


def make_pair(x: int | Sequence[int], n: int = 2) -> tuple[int, ...]:
  """An int becomes (x,) * n; a tuple (or list) passes through as a tuple."""
  return (x,) * n if isinstance(x, int) else tuple(x)


def ceildiv(a: Any, b: Any) -> Any:
  """Ceiling of a / b for a positive divisor b; also works on objects supporting +, - and //."""
  return (a + b - 1) // b


def round_up(n: Any, m: Any) -> Any:
  """Smallest multiple of m (positive) that is >= n."""
  return ceildiv(n, m) * m


def colored(text: str, color: str | None) -> str:
  """Wrap text in an ANSI color: a name from _COLORS, optionally prefixed "bright_". None returns text unchanged."""
  if color is None:
    return text
  base = color.removeprefix("bright_")
  if base not in _COLORS:
    raise ValueError(f"unknown color {color!r}; use one of {', '.join(_COLORS)}, optionally prefixed 'bright_'")
  code = _COLORS[base] + (60 if color.startswith("bright_") else 0)
  return f"\x1b[{code}m{text}\x1b[0m"


def ansistrip(s: str) -> str:
  """Remove ANSI color escapes."""
  return _ANSI_RE.sub("", s)


def ansilen(s: str) -> int:
  """Printed length of s, not counting ANSI color escapes."""
  return len(ansistrip(s))


def to_function_name(s: str) -> str:
  """A valid C identifier from s: ANSI escapes removed, other characters outside [A-Za-z0-9_] as hex codes.

  A name that would start with a digit (or be empty) gets the prefix "f_".
  """
  name = _NOT_IDENT_RE.sub(lambda m: f"{ord(m.group()):02X}", ansistrip(s))
  return name if name and not name[0].isdigit() else f"f_{name}"


def cache_dir() -> pathlib.Path:
  """The kernel cache folder, created if missing: config.CACHE_DIR, else $XDG_CACHE_HOME/fusegrad or ~/.cache."""
  if config.CACHE_DIR:
    path = pathlib.Path(config.CACHE_DIR).expanduser()
  else:
    path = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "fusegrad"
  path.mkdir(parents=True, exist_ok=True)
  return path


def write_atomic(path: pathlib.Path, data: str | bytes) -> None:
  """Write a file that readers never see half-written, however many processes write it at once: the data goes to a
  temporary file of a name only this writer uses, which is then renamed over `path`. Raises OSError on failure."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
  try:
    if isinstance(data, bytes): tmp.write_bytes(data)
    else: tmp.write_text(data)
    os.replace(tmp, path)
  finally:
    tmp.unlink(missing_ok=True)


# the compiler stages GlobalCounters.stage_s reports, in pipeline order
STAGES = ("schedule", "optimize", "linearize", "render", "compile", "run")


class GlobalCounters:
  """Process-wide counters for kernels run, work done, compile time and time per compiler stage; reset() zeroes
  them."""
  kernel_count: ClassVar[int] = 0
  global_ops: ClassVar[int] = 0
  global_mem: ClassVar[int] = 0
  time_sum_s: ClassVar[float] = 0.0
  compile_count: ClassVar[int] = 0
  compile_time_s: ClassVar[float] = 0.0
  stage_s: ClassVar[dict[str, float]] = dict.fromkeys(STAGES, 0.0)   # seconds per stage, see `stage`
  mem_used: ClassVar[int] = 0   # bytes held by allocated Buffers now; not reset

  @classmethod
  def reset(cls) -> None:
    cls.kernel_count, cls.global_ops, cls.global_mem, cls.compile_count = 0, 0, 0, 0
    cls.time_sum_s, cls.compile_time_s = 0.0, 0.0
    cls.stage_s.clear()
    cls.stage_s.update(dict.fromkeys(STAGES, 0.0))


_OPEN_STAGES: list[stage] = []   # the stages being timed now, innermost last


class stage:  # noqa: N801  (used like a function: `with stage("render"):`)
  """Add the wall time of a block to GlobalCounters.stage_s[name]. Stages nest exclusively: while an inner stage runs,
  the enclosing one's clock is paused, so nested stages are not counted twice and the totals add up to wall time."""
  __slots__ = ("name", "start")

  def __init__(self, name: str) -> None:
    self.name = name

  def __enter__(self) -> stage:
    now = time.perf_counter()
    if _OPEN_STAGES: _OPEN_STAGES[-1]._charge(now)
    self.start = now
    _OPEN_STAGES.append(self)
    return self

  def __exit__(self, *exc: object) -> None:
    now = time.perf_counter()
    _OPEN_STAGES.remove(self)
    self._charge(now)
    if _OPEN_STAGES: _OPEN_STAGES[-1].start = now

  def _charge(self, now: float) -> None:
    GlobalCounters.stage_s[self.name] = GlobalCounters.stage_s.get(self.name, 0.0) + now - self.start
    self.start = now


def format_stages(stage_s: dict[str, float]) -> str:
  """One line: milliseconds per stage and their total."""
  parts = [f"{name} {seconds * 1e3:.1f}" for name, seconds in stage_s.items()]
  return f"stages (ms): {', '.join(parts)}; total {sum(stage_s.values()) * 1e3:.1f}"


@atexit.register
def _print_stages_at_exit() -> None:
  if config.DEBUG >= 1 and any(GlobalCounters.stage_s.values()): print(format_stages(GlobalCounters.stage_s))


class Timing:
  """Context manager that measures a block and prints "<prefix><ms> ms" on exit (unless enabled is False)."""

  def __init__(self, prefix: str = "", enabled: bool = True) -> None:
    self.prefix, self.enabled = prefix, enabled
    self.elapsed_s = 0.0

  def __enter__(self) -> Timing:
    self._start = time.perf_counter()
    return self

  def __exit__(self, *exc: object) -> None:
    self.elapsed_s = time.perf_counter() - self._start
    if self.enabled:
      print(f"{self.prefix}{self.elapsed_s * 1e3:.2f} ms")
