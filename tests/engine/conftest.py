"""Fixtures of the engine tests."""
import pytest
from fusegrad import Context
from fusegrad.engine import realize


@pytest.fixture
def cache(tmp_path):
  """A fresh CACHE_DIR (on even under NOCACHE=1), and no programs in memory (other tests' come back afterwards)."""
  saved = dict(realize._PROGRAMS)
  realize._PROGRAMS.clear()
  try:
    with Context(CACHE_DIR=str(tmp_path), NOCACHE=False):
      yield tmp_path
  finally:
    realize._PROGRAMS.clear()
    realize._PROGRAMS.update(saved)
