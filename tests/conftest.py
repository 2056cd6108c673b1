"""Shared pytest fixtures: `device` runs a test once per backend in `test_devices()`.

PYTHON (the reference interpreter) always runs; the compiled backend is CPU, or CUDA when DEV=CUDA. This file stays
free of torch and fusegrad imports so that collecting unrelated tests stays fast.
"""
import os

import pytest


def test_devices() -> list[str]:
  """The backends to test: the compiled one (CPU, or CUDA when DEV=CUDA) and the PYTHON reference interpreter."""
  compiled = "CUDA" if os.environ.get("DEV", "").upper() == "CUDA" else "CPU"
  return [compiled, "PYTHON"]


test_devices.__test__ = False  # a helper, not a test, despite its name


@pytest.fixture(params=test_devices())
def device(request) -> str:
  return request.param
