"""Shared pytest fixtures and hooks: `device` runs a test once per backend in `test_devices()`, and every test runs
under a time limit, so a compiler pass that loops forever fails its test instead of stalling the suite.

PYTHON (the reference interpreter) always runs; the compiled backend is CPU, or CUDA when DEV=CUDA. This file stays
free of torch and fusegrad imports so that collecting unrelated tests stays fast.
"""
import os
import signal

import pytest

# CPU kernels may use every core by default; under pytest-xdist on a many-core machine that is workers x cores OpenMP
# threads, so tests cap it (the THREAD opt itself is tested with explicit renderers)
os.environ.setdefault("THREADS", "2")

TIME_LIMIT_S = 60   # per test; `@pytest.mark.time_limit(seconds)` overrides it


def test_devices() -> list[str]:
  """The backends to test: the compiled one (CPU, or CUDA when DEV=CUDA) and the PYTHON reference interpreter."""
  compiled = "CUDA" if os.environ.get("DEV", "").upper() == "CUDA" else "CPU"
  return [compiled, "PYTHON"]


test_devices.__test__ = False  # a helper, not a test, despite its name


@pytest.fixture(params=test_devices())
def device(request) -> str:
  return request.param


def pytest_configure(config) -> None:
  config.addinivalue_line("markers", "time_limit(seconds): fail the test when its call runs longer than this")


def _raise_timeout(signum, frame):
  raise TimeoutError("test ran past its time limit (see tests/conftest.py)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
  marker = item.get_closest_marker("time_limit")
  limit = marker.args[0] if marker is not None else TIME_LIMIT_S
  if not hasattr(signal, "SIGALRM"):   # Windows: no alarms, no limit
    return (yield)
  previous = signal.signal(signal.SIGALRM, _raise_timeout)
  signal.setitimer(signal.ITIMER_REAL, limit)
  try:
    return (yield)
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
