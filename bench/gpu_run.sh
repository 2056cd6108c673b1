#!/usr/bin/env bash
# One device-machine call: environment facts, the CUDA test suites, then the benchmark suite on the GPU.
# Usage (device machine, repo root): bash bench/gpu_run.sh [pytest -k expression]
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 CACHE_DIR=/tmp/fgcache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
python3 -c "import sys, torch, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)" | tee -a "$OUT/env.txt"
python3 -m fusegrad doctor | tee -a "$OUT/env.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/env.txt"
DEV=CUDA timeout ${TEST_TIMEOUT:-330} python3 -m pytest ${TESTS:-tests/runtime tests/engine tests/codegen tests/test_ops.py tests/nn} \
  -p no:cacheprovider -p no:benchmark -n 14 -vv -k "${1:-not PYTHON}" > "$OUT/tests.log" 2>&1
grep -E "FAILED|ERROR" "$OUT/tests.log" | head -30; grep -cE "PASSED" "$OUT/tests.log"; tail -3 "$OUT/tests.log"
timeout ${BENCH_TIMEOUT:-240} python3 -m bench.suite --device CUDA ${CASES:+--cases $CASES} 2>&1 | tee "$OUT/bench.log" | tail -20
cp bench/results/CUDA-*.json "$OUT/" 2>/dev/null || true
