#!/usr/bin/env bash
# GPU run 14 (device machine, repo root): BEAM on the conv fp16 and matmul fp16 cases, conv tilings by hand.
export PYTHONPATH=. PYTHONUNBUFFERED=1 CACHE_DIR=/tmp/fgcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
E="python3 -m bench.explore --device CUDA --runs 20"
U="Opt(OptOps.UPCAST"; L="Opt(OptOps.LOCAL"; R="Opt(OptOps.UNROLL"; T="Opt(OptOps.TC,1)"
echo "== conv2d fp16 N=32 by hand (first line: the heuristic)"
timeout 150 $E --setup "x = Tensor.rand(32, 64, 56, 56).half(); w = Tensor.rand(64, 64, 3, 3).half()" --expr "x.conv2d(w, padding=1)" --opts "[
[$T,$U,1,4),$U,2,7)],
[$T,$U,1,2),$U,2,7),$U,1,2)],
[$T,$U,1,4),$U,2,7),$U,1,2),$L,1,2)],
[$T,$U,1,4),$U,2,7),$U,1,2),$L,0,2)],
[$T,$U,1,4),$U,2,7),$U,1,2),$R,0,2)],
[$T,$U,1,4),$U,2,7),$U,1,2),Opt(OptOps.STAGE,0,2)],
[$T,$U,1,4),$U,2,7),$U,1,2),$L,1,2),Opt(OptOps.STAGE,0,2)],
]" 2>&1 | tee "$OUT/explore_conv.log"
echo "== BEAM 2 on conv2d_fp16 and matmul_fp16 (budget 100 s a kernel)"
timeout 330 python3 -m bench.suite --device CUDA --cases conv2d_fp16 matmul_fp16 --beam 2 --beam-budget 100 2>&1 | tail -12
python3 - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ["CACHE_DIR"], "beam.json")))
for key, opts in d.items(): print(key[:16], opts)
PY
