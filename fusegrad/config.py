"""The one registry of fusegrad's environment flags.

Every flag is declared here with `flag(...)` and read as an attribute of `config` (e.g. `config.DEBUG`).
A value comes from the innermost `Context` override, else the environment variable of the same name, else the default.
Resolved values are cached as plain attributes, so reading a flag on a hot path is a dict lookup.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

FLAG_TYPES: tuple[type, ...] = (int, bool, str)
_TRUE, _FALSE = frozenset({"1", "true"}), frozenset({"0", "false"})


@dataclass(frozen=True)
class Flag:
  """One environment flag: its name (also the environment variable), value type, default and one-line help."""
  name: str
  type: type
  default: Any
  help: str

  def __post_init__(self) -> None:
    if not (self.name.isidentifier() and self.name.isupper()):
      raise ValueError(f"flag name {self.name!r} must be an UPPER_CASE identifier")
    if self.type not in FLAG_TYPES:
      raise ValueError(f"flag {self.name}: type must be one of int, bool, str, not {self.type!r}")
    check_type(self, self.default)


FLAGS: dict[str, Flag] = {}
_environ: dict[str, str] = dict(os.environ)
_env_values: dict[str, Any] = {}
_overrides: list[dict[str, Any]] = []


def _type_name(t: type) -> str:
  return {int: "int", bool: "bool (0/1/true/false)", str: "str"}[t]


def check_type(f: Flag, value: Any) -> None:
  """Raise TypeError unless value has exactly the flag's type (a bool is not accepted as an int)."""
  if type(value) is not f.type:
    raise TypeError(f"flag {f.name} takes a {f.type.__name__}, got {value!r} of type {type(value).__name__}")


def parse_env(f: Flag, raw: str) -> Any:
  """Parse the environment string raw for flag f. An empty int/bool variable counts as unset (the default)."""
  text = raw.strip().lower()
  if f.type is str:
    return raw
  if text == "":
    return f.default
  if f.type is bool and text in _TRUE | _FALSE:
    return text in _TRUE
  if f.type is int:
    try:
      return int(text)
    except ValueError:
      pass
  raise ValueError(f"environment variable {f.name}={raw!r} is not a valid {_type_name(f.type)}")


def _env_value(f: Flag, environ: dict[str, str]) -> Any:
  return parse_env(f, environ[f.name]) if f.name in environ else f.default


def _unknown(name: str) -> str:
  return f"unknown flag {name!r}; valid flags: {', '.join(sorted(FLAGS))}"


class _Config:
  """Attribute access to the resolved flag values. Values live in the instance dict; unknown names raise."""

  def __getattr__(self, name: str) -> Any:
    raise AttributeError(_unknown(name))

  def __setattr__(self, name: str, value: Any) -> None:
    raise AttributeError(f"config is read-only; use `with fusegrad.config.Context({name}=...)` to override a flag")

  def __dir__(self) -> list[str]:
    return sorted(FLAGS) + ["reload"]

  def reload(self) -> None:
    """Re-read the environment (otherwise read once, at import). A malformed value raises and changes nothing."""
    global _environ
    environ = dict(os.environ)
    values = {name: _env_value(f, environ) for name, f in FLAGS.items()}
    _environ = environ
    _env_values.update(values)
    _refresh()


config = _Config()


def _refresh() -> None:
  """Recompute the cached values on config: default < environment < Context overrides, innermost last."""
  values = dict(_env_values)
  for layer in _overrides:
    values.update(layer)
  vars(config).update(values)


def flag(name: str, type: type, default: Any, help: str) -> Flag:
  """Register a flag and return it. Registering the same flag twice is a no-op; a conflicting one raises."""
  f = Flag(name, type, default, help)
  if name in FLAGS:
    if FLAGS[name] != f:
      raise ValueError(f"flag {name} is already registered as {FLAGS[name]}")
    return FLAGS[name]
  _env_values[name] = _env_value(f, _environ)
  FLAGS[name] = f
  _refresh()
  return f


class Context:
  """Override flags inside a `with` block. Nestable and re-entrant; the previous values come back on exit."""

  def __init__(self, **overrides: Any) -> None:
    for name, value in overrides.items():
      if name not in FLAGS:
        raise ValueError(_unknown(name))
      check_type(FLAGS[name], value)
    self.overrides = overrides
    self._layers: list[dict[str, Any]] = []

  def __enter__(self) -> Context:
    layer = dict(self.overrides)
    self._layers.append(layer)
    _overrides.append(layer)
    _refresh()
    return self

  def __exit__(self, *exc: object) -> None:
    layer = self._layers.pop()
    idx = max(i for i, x in enumerate(_overrides) if x is layer)
    del _overrides[idx]
    _refresh()


def _md_default(f: Flag) -> str:
  return f'`"{f.default}"`' if f.type is str else f"`{int(f.default) if f.type is bool else f.default}`"


def _md_escape(text: str) -> str:
  return text.replace("|", "\\|")


def render_env_md() -> str:
  """Render docs/env.md: how flags are read, then one table row per registered flag."""
  rows = [f"| `{f.name}` | {f.type.__name__} | {_md_default(f)} | {_md_escape(f.help)} |" for f in FLAGS.values()]
  return "\n".join([
    "# Environment flags",
    "",
    "fusegrad reads these flags once, from environment variables of the same name, when `fusegrad.config` is",
    "imported (`config.reload()` reads the environment again). Code reads them as `config.NAME`. Inside",
    "`with fusegrad.Context(NAME=value):` a flag is overridden; contexts nest, and the innermost one wins.",
    "Booleans accept `0`, `1`, `true` and `false`; a malformed value raises a `ValueError`.",
    "This page is generated by `python -m fusegrad.config > docs/env.md`.",
    "",
    "| name | type | default | help |",
    "| --- | --- | --- | --- |",
    *rows,
  ]) + "\n"


flag("DEV", str, "", "device: CPU, CUDA or PYTHON; empty means CUDA when usable, else CPU")
flag("DEBUG", int, 0, "1 summary, 2 one line per kernel (time, GFLOP/s, GB/s), 3 applied opts, 4 kernel source, 5 UOps")
flag("NOOPT", bool, False, "turn off the hand-coded kernel optimizations")
flag("CACHE_DIR", str, "", "where compiled kernels, rendered programs, BEAM results and the OpenMP probe are cached; "
     "empty means $XDG_CACHE_HOME/fusegrad or ~/.cache/fusegrad")
flag("NOCACHE", bool, False, "do not read or write the on-disk caches (kernels, programs, BEAM results)")
flag("CC", str, "cc", "C compiler for the CPU backend")
flag("CFLAGS", str, "-O2 -march=native", "flags for the CPU backend's C compiler")
flag("VERIFY", bool, False, "run the UOp invariant checker on every kernel, even when DEBUG=0")
flag("THREADS", int, 0, "CPU cores a kernel may use through OpenMP (0: all cores this process may run on; 1: one "
     "core, no OpenMP). Only kernels with enough work (>= 256K element-steps) are split")
flag("BEAM", int, 0, "search kernel opts with a beam of this width (0: use the hand-coded heuristics)")
flag("BEAM_BUDGET", int, 60, "seconds one kernel's BEAM search may take")
flag("CUDA_ARCH", str, "", "GPU architecture NVRTC compiles for, e.g. sm_90; empty means the GPU's own, or sm_90 "
     "when no GPU is present")
flag("JIT_GRAPH", bool, True, "replay a JIT's captured kernels through the device's graph (a CUDA graph on CUDA, "
     "prebuilt ctypes calls on CPU); 0 replays them kernel by kernel")

if __name__ == "__main__":
  # render from the package's own module (not this __main__ copy) so flags registered on package import are listed
  print(importlib.import_module("fusegrad.config").render_env_md(), end="")
