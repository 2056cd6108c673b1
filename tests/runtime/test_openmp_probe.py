"""The CPU backend's OpenMP probe: its answer is kept on disk per compiler identity, so a new process doesn't build
the probe again; a corrupt entry is ignored, NOCACHE probes every time, and one core never probes."""
import json
import pytest
from fusegrad.config import Context
from fusegrad.runtime import cpu


@pytest.fixture
def probes(tmp_path, monkeypatch):
  """A fresh CACHE_DIR, no in-memory answer, and a probe that counts its runs (answering as the real one did)."""
  real = cpu.openmp_works("cc")
  calls = []

  def fake(cc):
    calls.append(cc)
    return real
  monkeypatch.setattr(cpu, "_probe_openmp", fake)
  cpu.openmp_works.cache_clear()
  try:
    with Context(CACHE_DIR=str(tmp_path), NOCACHE=False):
      yield calls, real, tmp_path
  finally:
    cpu.openmp_works.cache_clear()


def entries(cache_dir):
  return sorted((cache_dir / "probes").glob("openmp-*.json"))


def test_answer_is_kept_on_disk(probes):
  calls, real, cache_dir = probes
  assert cpu.openmp_works("cc") is real and len(calls) == 1
  (entry,) = entries(cache_dir)
  assert json.loads(entry.read_text()) == {"compiler": cpu.compiler_identity("cc"), "openmp": real}
  cpu.openmp_works.cache_clear()   # as a new process
  assert cpu.openmp_works("cc") is real and len(calls) == 1


def test_keyed_by_compiler_identity(probes, monkeypatch):
  calls, real, cache_dir = probes
  cpu.openmp_works("cc")
  monkeypatch.setattr(cpu, "compiler_identity", lambda cc: "/usr/bin/othercc 1:2 othercc 9.9")
  cpu.openmp_works.cache_clear()
  cpu.openmp_works("cc")
  assert len(calls) == 2 and len(entries(cache_dir)) == 2


@pytest.mark.parametrize("bad", ["", "{", "[]", "null", '{"compiler": "x", "openmp": true}', '{"openmp": 1}'])
def test_corrupt_entry_is_ignored(probes, bad):
  calls, real, cache_dir = probes
  cpu.openmp_works("cc")
  (entry,) = entries(cache_dir)
  entry.write_text(bad)
  cpu.openmp_works.cache_clear()
  assert cpu.openmp_works("cc") is real and len(calls) == 2
  assert json.loads(entry.read_text())["openmp"] is real   # rewritten


def test_nocache_probes_every_time(probes):
  calls, real, cache_dir = probes
  with Context(NOCACHE=True):
    for _ in range(2):
      cpu.openmp_works.cache_clear()
      assert cpu.openmp_works("cc") is real
  assert len(calls) == 2 and not entries(cache_dir)


def test_one_core_never_probes(probes):
  calls, _, _ = probes
  with Context(THREADS=1):
    dev = cpu.make_device()
  assert dev.renderer.max_threads == 1 and not calls
