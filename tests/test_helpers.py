"""Tests for fusegrad.helpers: sequence and integer helpers, ANSI colors, C names, cache_dir, counters and Timing.

Property tests (hypothesis) check the integer helpers against plain math on many inputs.
"""
import math
import pathlib
import re

import pytest
from hypothesis import given, strategies as st

from fusegrad.config import Context
from fusegrad.helpers import (GlobalCounters, Timing, all_int, all_same, ansilen, ansistrip, argfix, argsort, cache_dir,
                              ceildiv, colored, dedup, flatten, make_pair, prod, round_up, to_function_name)


class Sym:
  """A stand-in for a symbolic value: supports `*` only with another Sym, never with an int."""
  def __init__(self, name: str) -> None:
    self.name = name

  def __mul__(self, other: "Sym") -> "Sym":
    assert isinstance(other, Sym)
    return Sym(f"{self.name}*{other.name}")


def test_prod() -> None:
  assert prod([]) == 1 and prod(()) == 1 and prod([5]) == 5 and prod((2, 3, 4)) == 24
  assert prod(x for x in [2, 5]) == 10
  assert prod([Sym("a"), Sym("b"), Sym("c")]).name == "a*b*c"
  assert prod([1.5, 2]) == 3.0


def test_all_same() -> None:
  assert all_same([]) and all_same([3]) and all_same([2, 2, 2])
  assert not all_same([2, 2, 3])


def test_all_int() -> None:
  assert all_int([]) and all_int((1, 2, 3))
  assert not all_int([1, 2.0]) and not all_int([1, Sym("a")])


def test_dedup_flatten_argsort() -> None:
  assert dedup([3, 1, 3, 2, 1]) == [3, 1, 2]
  assert flatten([[1, 2], [], [3]]) == [1, 2, 3] and flatten([]) == []
  assert argsort([30, 10, 20]) == [1, 2, 0] and argsort([]) == []
  assert argsort([1, 0, 1, 0]) == [1, 3, 0, 2]


def test_argfix() -> None:
  assert argfix(1, 2, 3) == (1, 2, 3)
  assert argfix((1, 2, 3)) == (1, 2, 3) and argfix([1, 2, 3]) == (1, 2, 3)
  assert argfix(4) == (4,) and argfix() == ()


def test_make_pair() -> None:
  assert make_pair(3) == (3, 3) and make_pair(2, 3) == (2, 2, 2)
  assert make_pair((1, 2)) == (1, 2) and make_pair([1, 2]) == (1, 2)


@given(st.integers(-1000, 1000), st.integers(1, 100))
def test_ceildiv_round_up(a: int, b: int) -> None:
  assert ceildiv(a, b) == math.ceil(a / b)
  r = round_up(a, b)
  assert r % b == 0 and a <= r < a + b


def test_colored() -> None:
  assert colored("x", None) == "x"
  assert colored("x", "red") == "\x1b[31mx\x1b[0m"
  assert colored("x", "bright_green") == "\x1b[92mx\x1b[0m"
  with pytest.raises(ValueError):
    colored("x", "reddish")


def test_ansilen() -> None:
  s = colored("abc", "red") + "de" + colored("f", "bright_blue")
  assert ansilen(s) == 6 and ansistrip(s) == "abcdef" and ansilen("") == 0


@pytest.mark.parametrize("name,expected", [("r_4_4", "r_4_4"), ("E_2.3", "E_22E3"), ("a b", "a20b"), ("9x", "f_9x"),
                                           ("", "f_")])
def test_to_function_name(name: str, expected: str) -> None:
  assert to_function_name(name) == expected


@given(st.text())
def test_to_function_name_is_c_identifier(name: str) -> None:
  assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", to_function_name(name))


def test_to_function_name_strips_ansi() -> None:
  assert to_function_name(colored("r_", "green") + colored("3", "red")) == "r_3"


def test_cache_dir_from_config(tmp_path: pathlib.Path) -> None:
  with Context(CACHE_DIR=str(tmp_path / "a" / "b")):
    path = cache_dir()
  assert path == tmp_path / "a" / "b" and path.is_dir()


def test_cache_dir_xdg(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  with Context(CACHE_DIR=""):
    assert cache_dir() == tmp_path / "fusegrad" and (tmp_path / "fusegrad").is_dir()


def test_cache_dir_home(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
  monkeypatch.setenv("HOME", str(tmp_path))
  with Context(CACHE_DIR=""):
    assert cache_dir() == tmp_path / ".cache" / "fusegrad"


def test_global_counters_reset() -> None:
  GlobalCounters.kernel_count += 3
  GlobalCounters.time_sum_s += 1.5
  GlobalCounters.compile_time_s += 0.5
  GlobalCounters.reset()
  names = ["kernel_count", "global_ops", "global_mem", "time_sum_s", "compile_count", "compile_time_s"]
  assert all(getattr(GlobalCounters, n) == 0 for n in names)


def test_timing(capsys: pytest.CaptureFixture[str]) -> None:
  with Timing("step: ") as t:
    sum(range(1000))
  out = capsys.readouterr().out
  assert re.fullmatch(r"step: \d+\.\d\d ms\n", out) and t.elapsed_s >= 0
  with Timing("quiet", enabled=False):
    pass
  assert capsys.readouterr().out == ""
