#!/usr/bin/env bash
# GPU run 20 (device machine, repo root): 16-bit vector loads/stores. The CUDA suites, then fp16 copies and
# elementwise kernels against torch.
export PYTHONPATH=. PYTHONUNBUFFERED=1 CACHE_DIR=/tmp/fgcache
DEV=CUDA timeout 200 python3 -m pytest tests/runtime tests/engine tests/codegen tests/test_ops.py tests/nn tests/test_grad.py \
  tests/test_cli.py -o addopts="" -p no:cacheprovider -p no:benchmark -n 14 -q 2>&1 | grep -a -E "passed|failed|FAILED|ERROR" | tail -12
E="python3 -m bench.explore --device CUDA --runs 20"
for dt in "half()" "cast(dtypes.bfloat16)"; do
  timeout 40 $E --setup "a = Tensor.rand(1 << 24).$dt; b = Tensor.rand(1 << 24).$dt; c = Tensor.rand(1 << 24).$dt" --expr "(a*b+c).relu()" --opts "[]"
done
timeout 40 $E --setup "x = Tensor.rand(32, 64, 56, 56).half()" --expr "x.permute(0,2,3,1).contiguous()" --opts "[]"
timeout 60 $E --setup "a = Tensor.rand(8192, 8192).half(); b = Tensor.rand(8192, 8192).half()" --expr "a @ b" --opts "[]"
python3 - <<'PY'
import torch
a, b, c = (torch.rand(1 << 24, device="cuda").half() for _ in range(3))
f = lambda: torch.relu(a * b + c)
for _ in range(3): f()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize(); s.record()
for _ in range(20): f()
e.record(); torch.cuda.synchronize()
print(f"torch eager fp16 relu(a*b+c) 2^24: {s.elapsed_time(e) / 20:.3f} ms")
PY
