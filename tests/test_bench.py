"""The benchmark suite's own checks (bench/suite.py): the overhead, cold-start and training-step cases run in a tiny
mode and give well-formed rows, the bench command prints its tables and merges its results file, and the compiler
stage counters (GlobalCounters.stage_s) fill up when a fresh kernel is compiled. No timing thresholds: only structure
and invariants."""
import json
import time
from argparse import Namespace
import numpy as np
import pytest
from fusegrad import Tensor, GlobalCounters, nn
from fusegrad.config import Context
from fusegrad.helpers import STAGES, stage
from bench import suite


def _metrics(row: dict) -> dict[str, dict]:
  return {m["metric"]: m for m in row["metrics"]}


def test_stage_counters_fill_when_a_fresh_kernel_compiles():
  before = dict(GlobalCounters.stage_s)
  with Context(NOCACHE=True):   # a compile that really runs the C compiler, whatever the disk cache holds
    out = (Tensor(np.arange(37, dtype=np.float32), device="CPU") * 1.234567 + 0.25).sum().numpy()
  assert out == pytest.approx(float((np.arange(37) * 1.234567 + 0.25).sum()), rel=1e-5)
  for name in STAGES: assert GlobalCounters.stage_s[name] > before[name], name


def test_stages_nest_without_double_counting():
  before = dict(GlobalCounters.stage_s)
  start = time.perf_counter()
  with stage("bench_test_outer"):
    with stage("bench_test_inner"): time.sleep(0.01)
  wall = time.perf_counter() - start
  outer = GlobalCounters.stage_s["bench_test_outer"] - before.get("bench_test_outer", 0.0)
  inner = GlobalCounters.stage_s["bench_test_inner"] - before.get("bench_test_inner", 0.0)
  assert outer > 0 and inner > 0 and outer + inner <= wall   # the outer clock paused while the inner one ran
  GlobalCounters.reset()
  assert set(GlobalCounters.stage_s) == set(STAGES) and not any(GlobalCounters.stage_s.values())


def test_overhead_case():
  row = suite.run_overhead("CPU", runs=1, n_ops=8, jit_ops=4)
  metrics = _metrics(row)
  assert list(metrics) == ["lazy build", "realize each", "JIT replay"]
  assert all(m["fusegrad_s"] > 0 for m in metrics.values())
  assert "target_s" in metrics["lazy build"] and "target_s" in metrics["JIT replay"]
  assert row["jit_kernels"] == 4 and row["check_rel_err"] < 1e-5
  assert set(row["first_run_s"]) >= set(STAGES)


def test_cold_start_case():
  row = suite.run_cold_start("CPU", runs=1, peers=False)
  metrics = _metrics(row)
  assert list(metrics) == ["cold start", "import fusegrad", "python start"]
  assert metrics["cold start"]["target_s"] == 0.5 and all(m["fusegrad_s"] > 0 for m in metrics.values())
  assert row["check_rel_err"] < 1e-4
  assert row["child"]["import_s"] > 0 and set(row["child"]["stages_s"]) >= set(STAGES)


class _TinyNet:
  """A stand-in for the demo's network that compiles in a moment: one linear layer on the flattened image."""
  def __init__(self): self.fc = nn.Linear(64, 10)
  def __call__(self, x: Tensor) -> Tensor: return self.fc(x.flatten(1))


def test_train_step_case(monkeypatch):
  monkeypatch.setattr(suite, "torch", None)   # torch.optim's first use imports torch._dynamo: seconds
  row = suite.run_train_step("CPU", runs=1, batch=4, nets=(_TinyNet, None))
  metrics = _metrics(row)
  assert list(metrics) == ["first step", "step"] and all(m["fusegrad_s"] > 0 for m in metrics.values())
  assert row["first_run_s"]["schedule"] > 0 and row["first_run_s"]["run"] > 0


def test_bench_digitnet_is_the_demos():
  pytest.importorskip("sklearn")
  pytest.importorskip("tqdm")
  from fusegrad.demo import DigitNet
  from fusegrad.nn.state import get_state_dict
  shapes = {k: v.shape for k, v in get_state_dict(suite._DigitNet()).items()}
  assert shapes == {k: v.shape for k, v in get_state_dict(DigitNet()).items()}
  if suite.torch is not None:   # the torch peer has the same parameters, by name and shape
    assert {k: tuple(v.shape) for k, v in suite._torch_digitnet().state_dict().items()} == shapes


def test_bench_command_prints_tables_and_keeps_other_rows(monkeypatch, tmp_path, capsys):
  monkeypatch.setattr(suite, "RESULTS", tmp_path)
  monkeypatch.setattr(suite, "torch", None)
  monkeypatch.setattr(suite, "OVERHEAD_OPS", 8)
  monkeypatch.setattr(suite, "SPECIAL", [suite.Special("overhead", lambda d, r: suite.run_overhead(d, r, 8, 4), 1, 1)])
  older = {"case": "ew_fused", "fusegrad_s": 1.0}
  path = tmp_path / f"CPU-{suite.datetime.date.today().isoformat()}.json"
  path.write_text(json.dumps({"device": "CPU", "rows": [older, {"case": "overhead"}]}))
  assert suite.main(Namespace(device="CPU", quick=True, cases=["overhead"])) == 0
  out = capsys.readouterr().out
  assert "lazy build" in out and "JIT replay" in out and "first run by compiler stage" in out
  result = json.loads(path.read_text())
  assert [r["case"] for r in result["rows"]] == ["ew_fused", "overhead"] and result["rows"][0] == older
  assert set(result["first_run_s"]) >= set(STAGES) and result["first_run_cases"] == ["overhead"]
  with pytest.raises(SystemExit, match="unknown case"):
    suite.main(Namespace(device="CPU", quick=True, cases=["nope"]))


def test_beam_column(tmp_path):
  """--beam times the case again with the opts a search finds (it starts from the heuristics too), within the budget,
  and measures what the second, warm-cache lookup costs per kernel."""
  case = next(c for c in suite.CASES if c.name == "reduce_rows")
  small = [np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)]
  row: dict = {}
  with Context(CACHE_DIR=str(tmp_path)):
    tensors = [Tensor(x, device="CPU").realize() for x in small]
    suite.run_beam(case, "CPU", 3, tensors, beam=2, budget=5, row=row)
  assert row["beam_s"] > 0 and row["beam_search_s"] < 5 + 30   # the budget, plus one round finishing
  assert 0 <= row["beam_warm_s_per_kernel"] < 0.5
  assert (tmp_path / "beam.json").exists()
