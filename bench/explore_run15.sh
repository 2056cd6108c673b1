#!/usr/bin/env bash
# GPU run 15 (device machine, repo root): around the wgmma default (2 warpgroups x 64x256, ring of 4, a batch in
# flight), then BEAM 2 on matmul_fp16 with the ulp-scaled output check.
export PYTHONPATH=. PYTHONUNBUFFERED=1 CACHE_DIR=/tmp/fgcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
E="python3 -m bench.explore --device CUDA --runs 20"
T="Opt(OptOps.TC)"; L="Opt(OptOps.LOCAL"; U="Opt(OptOps.UPCAST"; R="Opt(OptOps.UNROLL"; W="Opt(OptOps.RASTER,0"
S="Opt(OptOps.STAGE"; WG="$T,$L,0,4),$L,0,2),$U,1,32),$R,0,4)"
echo "== matmul fp16 8192 (first line: the heuristic)"
timeout 150 $E --setup "a = Tensor.rand(8192, 8192).half(); b = Tensor.rand(8192, 8192).half()" --expr "a @ b" --opts "[
[$WG,$W,8),$S,2,4)],
[$WG,$W,32),$S,2,4)],
[$WG,$S,2,4)],
[$WG,$W,16),$S,2,3)],
[$WG,$W,16),$S,1,4)],
]" 2>&1 | tee "$OUT/explore_fp16.log"
echo "== other shapes with the heuristic"
timeout 60 $E --setup "a = Tensor.rand(4096, 4096).half(); b = Tensor.rand(4096, 4096).half()" --expr "a @ b" --opts "[]"
timeout 60 $E --setup "a = Tensor.rand(2048, 8192).half(); b = Tensor.rand(8192, 2048).half()" --expr "a @ b" --opts "[]"
timeout 60 $E --setup "a = Tensor.rand(8, 512, 1024).half(); b = Tensor.rand(1024, 4096).half()" --expr "a @ b" --opts "[]"
echo "== BEAM 2 on matmul_fp16 (budget 100 s a kernel)"
timeout 300 python3 -m bench.suite --device CUDA --cases matmul_fp16 --beam 2 --beam-budget 100 2>&1 | tail -8
