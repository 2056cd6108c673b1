"""The disk cache of rendered programs (engine/compile.py): a new process, or one whose in-memory programs are gone,
runs the cached source without optimizing, linearizing or rendering, with results identical to a fresh compile.
Corrupt or malformed entries are ignored, NOCACHE turns the cache off, symbolic kernels keep their variables, and
parallel writers never leave a half-written file. Every test uses its own CACHE_DIR."""
import json
import os
import pathlib
import subprocess
import sys
import threading
import numpy as np
from fusegrad import Tensor, Context, GlobalCounters, Variable
from fusegrad.dtype import dtypes
from fusegrad.uop import Ops
from fusegrad.lazy import LazyBuffer
from fusegrad.helpers import write_atomic
from fusegrad.codegen.linearizer import LinearProgram
from fusegrad.engine import realize
from fusegrad.engine.compile import ProgramInfo, build_program, render_kernel, kernel_for, _renderer_identity
from fusegrad.engine.schedule import create_schedule
from fusegrad.engine.realize import get_program, run_kernel
from fusegrad.renderer.cstyle import CRenderer

ROOT = pathlib.Path(__file__).resolve().parents[2]
rng = np.random.default_rng(0)


def entries(cache_dir: pathlib.Path) -> list[pathlib.Path]:
  return sorted((cache_dir / "programs").glob("*.json"))


def kernels(out: Tensor):
  return [si for si in create_schedule([out.lazydata]) if si.ast.op is Ops.SINK]


def expr(seed: int = 0, device: str = "CPU") -> Tensor:
  a = Tensor(np.random.default_rng(seed).standard_normal((16, 24)).astype(np.float32), device=device)
  b = Tensor(np.random.default_rng(seed + 1).standard_normal((24, 8)).astype(np.float32), device=device)
  return ((a @ b).relu() * 2 + 1).sum(axis=1)


def test_cleared_memory_hits_the_disk(cache, device):
  fresh = expr(device=device).numpy()
  assert len(entries(cache)) >= 1
  first = {si.ast: get_program(si.ast, device, si) for si in kernels(expr(device=device))}
  assert all(isinstance(ck.lin, LinearProgram) for ck in first.values())
  realize._PROGRAMS.clear()
  GlobalCounters.reset()
  again = expr(device=device).numpy()
  assert GlobalCounters.stage_s["linearize"] == 0 and GlobalCounters.stage_s["render"] == 0
  assert GlobalCounters.stage_s["optimize"] == 0
  np.testing.assert_array_equal(again, fresh)
  for ast, ck in first.items():
    hit = get_program(ast, device)
    assert isinstance(hit.lin, ProgramInfo)
    assert (hit.name, hit.src, hit.opts, hit.display_name) == (ck.name, ck.src, ck.opts, ck.display_name)
    for attr in ("name", "global_size", "local_size", "vars", "buf_count", "op_estimate", "mem_estimate"):
      assert getattr(hit.lin, attr) == getattr(ck.lin, attr), attr
    assert hit.lin.uops == ck.lin.uops   # linearized again on demand, the same program


_CHILD = """
import json, numpy as np
from fusegrad import Tensor, GlobalCounters
a = Tensor(np.arange(96, dtype=np.float32).reshape(8, 12) / 10)
out = ((a @ a.T).relu().exp2() * 0.5).sum(axis=0).numpy()
print(json.dumps({"out": out.tolist(), "stages": GlobalCounters.stage_s, "compiled": GlobalCounters.compile_count}))
"""


def run_child(cache_dir: pathlib.Path, **env) -> dict:
  full = {**os.environ, "CACHE_DIR": str(cache_dir), "DEV": "CPU", "NOCACHE": "0", **env}
  proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=full, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_skips_linearize_and_render(tmp_path):
  first = run_child(tmp_path)
  assert first["stages"]["linearize"] > 0 and entries(tmp_path)
  second = run_child(tmp_path)
  assert second["out"] == first["out"]
  assert second["compiled"] == first["compiled"] >= 1
  assert second["stages"]["linearize"] == 0 and second["stages"]["render"] == 0 and second["stages"]["optimize"] == 0
  # NOOPT chooses other opts: another entry, not the heuristics' program
  noopt = run_child(tmp_path, NOOPT="1")
  assert noopt["stages"]["linearize"] > 0
  np.testing.assert_allclose(noopt["out"], first["out"], rtol=1e-5)


def test_corrupt_and_malformed_entries_are_ignored(cache):
  want = expr().numpy()
  paths = entries(cache)
  good = {p: p.read_text() for p in paths}
  entry = json.loads(next(iter(good.values())))
  bad_entries = ["", "{not json", "[]", "null", json.dumps({**entry, "format": -1}), json.dumps({**entry, "key": "x"}),
                 json.dumps({k: v for k, v in entry.items() if k != "src"}), json.dumps({**entry, "vars": ["nope"]}),
                 json.dumps({**entry, "opts": [["NOT_AN_OPT", 0, 1]]}), json.dumps({**entry, "buf_count": "2"}),
                 json.dumps({**entry, "src": "this is not C"})]
  for bad in bad_entries:
    for p in paths: p.write_text(bad)
    realize._PROGRAMS.clear()
    GlobalCounters.reset()
    np.testing.assert_array_equal(expr().numpy(), want)
    assert GlobalCounters.stage_s["linearize"] > 0, bad   # rebuilt, not read
    for p in paths: assert json.loads(p.read_text()) == json.loads(good[p])   # and rewritten whole
  (cache / "programs" / "garbage.json").write_bytes(b"\xff\xfe\x00")
  for p in paths: p.write_bytes(b"\xff\xfe\x00binary")
  realize._PROGRAMS.clear()
  np.testing.assert_array_equal(expr().numpy(), want)


def test_nocache_neither_reads_nor_writes(cache):
  with Context(NOCACHE=True):
    want = expr().numpy()
  assert not entries(cache)
  realize._PROGRAMS.clear()
  expr().numpy()   # with the cache: written
  assert entries(cache)
  with Context(NOCACHE=True):
    realize._PROGRAMS.clear()
    GlobalCounters.reset()
    np.testing.assert_array_equal(expr().numpy(), want)
    assert GlobalCounters.stage_s["linearize"] > 0
    assert all(isinstance(ck.lin, LinearProgram) for ck in realize._PROGRAMS.values())


def test_verify_relinearizes(cache):
  want = expr().numpy()
  realize._PROGRAMS.clear()
  with Context(VERIFY=True):
    GlobalCounters.reset()
    np.testing.assert_array_equal(expr().numpy(), want)
    assert GlobalCounters.stage_s["linearize"] > 0


def symbolic_kernel(n, val: int, device: str):
  data = rng.standard_normal(64).astype(np.float32)
  full = LazyBuffer.from_numpy(data, dtypes.float32, device)
  view = full.shrink(((0, n.bind(val)),))
  (si,) = [si for si in create_schedule([view.alu(Ops.MUL, view).alu(Ops.ADD, view).contiguous()])
           if si.ast.op is Ops.SINK]
  return si, data[:val] * data[:val] + data[:val]


def test_symbolic_kernels_keep_their_variables(cache, device):
  n = Variable("n", 1, 64)
  si, _ = symbolic_kernel(n, 5, device)
  fresh = get_program(si.ast, device, si)
  realize._PROGRAMS.clear()
  for val in (3, 17, 64):
    si, want = symbolic_kernel(n, val, device)
    ck = get_program(si.ast, device, si)
    assert isinstance(ck.lin, ProgramInfo) and ck.src == fresh.src
    assert ck.lin.vars == fresh.lin.vars and all(v is n for v in ck.lin.vars)   # PYTHON: n sizes the grid only
    if device == "CPU": assert ck.lin.vars == [n]
    assert ck.lin.global_size == fresh.lin.global_size and ck.lin.local_size == fresh.lin.local_size
    si.bufs[0].allocate()
    run_kernel(ck, si.bufs, si.var_vals)
    np.testing.assert_allclose(si.bufs[0].numpy()[:val], want, rtol=1e-5, atol=1e-6)
  # the same kernel over a variable of another range is another program (bounds decide simplifications)
  si, _ = symbolic_kernel(Variable("n", 1, 32), 5, device)
  realize._PROGRAMS.clear()
  assert isinstance(get_program(si.ast, device, si).lin, LinearProgram)


def test_explicit_opts_are_part_of_the_key(cache):
  (si,) = kernels(Tensor(rng.standard_normal((8, 32)).astype(np.float32)).sum(axis=1))
  heuristic = build_program(si.ast, "CPU")
  none = build_program(si.ast, "CPU", opts=[])
  assert not heuristic.cached and not none.cached and none.opts == []
  assert build_program(si.ast, "CPU", opts=[]).cached and build_program(si.ast, "CPU").cached
  assert build_program(si.ast, "CPU").src == heuristic.src and build_program(si.ast, "CPU", opts=[]).src == none.src
  assert len(entries(cache)) == 2


def test_kernels_command_path_still_renders(cache):
  (si,) = kernels(Tensor(rng.standard_normal((4, 4)).astype(np.float32)).exp())
  ks = render_kernel(kernel_for(si.ast, "CPU"), "CPU")
  assert isinstance(ks.lin, LinearProgram) and ks.name in ks.src and ks.lib


def test_renderer_identity_is_stable():
  a, b = CRenderer(max_threads=1, vector_lanes=8), CRenderer(max_threads=1, vector_lanes=8)
  assert _renderer_identity(a) == _renderer_identity(b)
  assert "vector_dtypes=['dtypes.float32', 'dtypes.int32']" in _renderer_identity(a)
  assert _renderer_identity(a) != _renderer_identity(CRenderer(max_threads=2, vector_lanes=8))
  assert _renderer_identity(a) != _renderer_identity(CRenderer(max_threads=1, vector_lanes=16))


def test_write_atomic_from_many_writers(tmp_path):
  path = tmp_path / "sub" / "entry.json"
  texts = [json.dumps({"writer": i, "pad": "x" * 100_000}) for i in range(16)]
  threads = [threading.Thread(target=lambda t=t: [write_atomic(path, t) for _ in range(20)]) for t in texts]
  for t in threads: t.start()
  for t in threads: t.join()
  assert path.read_text() in texts
  assert [p.name for p in path.parent.iterdir()] == ["entry.json"]   # no temporary files left behind


_PARALLEL = """
import sys, numpy as np
from fusegrad import Tensor
a = Tensor(np.arange(64, dtype=np.float32).reshape(8, 8))
print(float(((a @ a).relu() + a.T).sum(axis=1).exp2().mean().numpy()))
"""


def test_parallel_processes_share_one_cache(tmp_path):
  env = {**os.environ, "CACHE_DIR": str(tmp_path), "DEV": "CPU", "NOCACHE": "0"}
  procs = [subprocess.Popen([sys.executable, "-c", _PARALLEL], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for _ in range(4)]
  outs = [p.communicate(timeout=120) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
  assert len({out for out, _ in outs}) == 1
  for p in entries(tmp_path): json.loads(p.read_text())
  assert not [p for p in tmp_path.rglob("*.tmp")]
