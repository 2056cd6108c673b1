#!/usr/bin/env bash
# GPU runs 18-19 (device machine, repo root): transposing copies with the register-tile heuristic, and their tests.
export PYTHONPATH=. PYTHONUNBUFFERED=1 CACHE_DIR=/tmp/fgcache
E="python3 -m bench.explore --device CUDA --runs 20"
U="Opt(OptOps.UPCAST"; L="Opt(OptOps.LOCAL"
DEV=CUDA timeout 120 python3 -m pytest tests/codegen/test_transpose.py tests/test_ops.py -k "permute or transpose or Transpose" \
  -p no:cacheprovider -p no:benchmark -q 2>&1 | tail -2
echo "== fp32 8192^2 .T (first line: the heuristic; then the old heuristic and variants)"
timeout 60 $E --setup "x = Tensor.rand(8192, 8192)" --expr "x.T.contiguous()" --opts "[
[$U,1,4),$L,1,256)], [$U,0,4),$U,1,4),$L,1,64)], [$U,0,8),$U,1,4),$L,1,32),$L,0,4)], [$U,0,8),$U,1,8),$L,1,64)]]"
echo "== fp16 NCHW -> NHWC 32x64x56x56"
timeout 60 $E --setup "x = Tensor.rand(32, 64, 56, 56).half()" --expr "x.permute(0,2,3,1).contiguous()" --opts "[
[$U,2,4),$L,2,16),$L,1,16)]]"
python3 - <<'PY'
import torch
for shape, f in [((8192, 8192), lambda x: x.t().contiguous()), ((32, 64, 56, 56), lambda x: x.half().permute(0, 2, 3, 1).contiguous())]:
  x = torch.rand(*shape, device="cuda"); x = x.half() if len(shape) == 4 else x
  for _ in range(3): f(x)
  s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  torch.cuda.synchronize(); s.record()
  for _ in range(20): f(x)
  e.record(); torch.cuda.synchronize()
  print("torch", shape, f"{s.elapsed_time(e) / 20:.3f} ms")
PY
