"""Tests for fusegrad.config: environment parsing, Context overrides, error messages and the generated docs/env.md.

Environment tests set variables with monkeypatch and call config.reload(); a fixture re-reads the real environment
afterwards so no test leaks flag values into another.
"""
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fusegrad import config as config_module
from fusegrad.config import FLAGS, Context, Flag, config, flag, render_env_md

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
  for name in FLAGS:
    monkeypatch.delenv(name, raising=False)
  config.reload()
  yield
  monkeypatch.undo()
  config.reload()


def test_defaults() -> None:
  assert config.DEBUG == 0 and config.NOOPT is False and config.CC == "cc" and config.DEV == ""
  assert config.CFLAGS == "-O2 -march=native"


def test_registered_names() -> None:
  assert set(FLAGS) >= {"DEV", "DEBUG", "NOOPT", "CACHE_DIR", "NOCACHE", "CC", "CFLAGS", "VERIFY"}


@pytest.mark.parametrize("raw,value", [("2", 2), (" 3 ", 3), ("-1", -1), ("", 0)])
def test_env_int(monkeypatch: pytest.MonkeyPatch, raw: str, value: int) -> None:
  monkeypatch.setenv("DEBUG", raw)
  config.reload()
  assert config.DEBUG == value


@pytest.mark.parametrize("raw,value", [("1", True), ("0", False), ("true", True), ("False", False), ("TRUE", True)])
def test_env_bool(monkeypatch: pytest.MonkeyPatch, raw: str, value: bool) -> None:
  monkeypatch.setenv("NOOPT", raw)
  config.reload()
  assert config.NOOPT is value


def test_env_str_kept_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("CFLAGS", " -O3 ")
  config.reload()
  assert config.CFLAGS == " -O3 "


def test_env_read_only_on_reload(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("DEBUG", "4")
  assert config.DEBUG == 0
  config.reload()
  assert config.DEBUG == 4


MALFORMED = [("DEBUG", "two", "int"), ("NOOPT", "yes", "bool"), ("DEBUG", "1.5", "int")]


@pytest.mark.parametrize("name,raw,expected", MALFORMED)
def test_env_malformed(monkeypatch: pytest.MonkeyPatch, name: str, raw: str, expected: str) -> None:
  monkeypatch.setenv(name, raw)
  with pytest.raises(ValueError) as err:
    config.reload()
  assert name in str(err.value) and repr(raw) in str(err.value) and expected in str(err.value)


def test_malformed_reload_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("DEBUG", "2")
  config.reload()
  monkeypatch.setenv("NOOPT", "maybe")
  monkeypatch.setenv("DEBUG", "3")
  with pytest.raises(ValueError):
    config.reload()
  assert config.DEBUG == 2


def test_context_overrides_env(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("DEBUG", "2")
  config.reload()
  with Context(DEBUG=4):
    assert config.DEBUG == 4
  assert config.DEBUG == 2


def test_context_nesting() -> None:
  with Context(DEBUG=1, CC="gcc"):
    with Context(DEBUG=2):
      assert (config.DEBUG, config.CC) == (2, "gcc")
      with Context(CC="clang"):
        assert (config.DEBUG, config.CC) == (2, "clang")
      assert config.CC == "gcc"
    assert config.DEBUG == 1
  assert (config.DEBUG, config.CC) == (0, "cc")


def test_context_reentrant() -> None:
  ctx = Context(DEBUG=3)
  with ctx:
    with Context(DEBUG=1):
      with ctx:
        assert config.DEBUG == 3
      assert config.DEBUG == 1
    assert config.DEBUG == 3
  assert config.DEBUG == 0


def test_context_restores_on_exception() -> None:
  with pytest.raises(RuntimeError):
    with Context(NOOPT=True):
      with Context(DEBUG=5):
        raise RuntimeError("boom")
  assert config.NOOPT is False and config.DEBUG == 0


def test_context_unknown_flag() -> None:
  with pytest.raises(ValueError) as err:
    Context(DEBGU=1)
  assert "DEBGU" in str(err.value) and "DEBUG" in str(err.value) and "NOOPT" in str(err.value)


@pytest.mark.parametrize("overrides", [{"DEBUG": "2"}, {"DEBUG": True}, {"NOOPT": 1}, {"CC": 3}])
def test_context_wrong_type(overrides: dict) -> None:
  with pytest.raises(TypeError):
    Context(**overrides)


def test_unknown_attribute() -> None:
  with pytest.raises(AttributeError) as err:
    config.DEBGU
  assert "DEBGU" in str(err.value) and "DEBUG" in str(err.value)


def test_config_read_only() -> None:
  with pytest.raises(AttributeError):
    config.DEBUG = 3


def test_flag_registration() -> None:
  f = flag("TEST_ONLY_FLAG", int, 7, "used by tests")
  try:
    assert config.TEST_ONLY_FLAG == 7
    assert flag("TEST_ONLY_FLAG", int, 7, "used by tests") == f
    with pytest.raises(ValueError):
      flag("TEST_ONLY_FLAG", int, 8, "used by tests")
    with Context(TEST_ONLY_FLAG=9):
      assert config.TEST_ONLY_FLAG == 9
  finally:
    del FLAGS["TEST_ONLY_FLAG"]


BAD_FLAGS = [("lower", int, 0, ""), ("X", float, 0.0, ""), ("X", int, "0", ""), ("X", int, True, "")]


@pytest.mark.parametrize("args", BAD_FLAGS)
def test_bad_flag_definition(args: tuple) -> None:
  with pytest.raises((ValueError, TypeError)):
    Flag(*args)


def test_render_env_md_lists_every_flag() -> None:
  md = render_env_md()
  assert md.startswith("# ") and "| name | type | default | help |" in md
  assert all(f"| `{name}` |" in md for name in FLAGS)


def test_env_md_up_to_date() -> None:
  doc = (ROOT / "docs" / "env.md").read_text()
  assert doc == render_env_md(), "docs/env.md is stale: run `python -m fusegrad.config > docs/env.md`"


def test_module_main_prints_env_md() -> None:
  cmd = [sys.executable, "-m", "fusegrad.config"]
  out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
  assert out == config_module.render_env_md()
