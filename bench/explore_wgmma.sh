#!/usr/bin/env bash
# GPU runs 12-13 (device machine, repo root): wgmma (STAGE 1/2) correctness, then its tilings for fp16 8192^3 by
# CUDA events (bench/NOTES.md).
export PYTHONPATH=. PYTHONUNBUFFERED=1 CACHE_DIR=/tmp/fgcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
echo "== wgmma tests on the GPU"
timeout 200 python3 -m pytest tests/codegen/test_wgmma.py -k gpu -p no:cacheprovider -p no:benchmark -x -q 2>&1 | tail -25
E="python3 -m bench.explore --device CUDA --runs 20"
T="Opt(OptOps.TC)"; L="Opt(OptOps.LOCAL"; U="Opt(OptOps.UPCAST"; R="Opt(OptOps.UNROLL"; W="Opt(OptOps.RASTER,0"
S="Opt(OptOps.STAGE"; WG2="$T,$L,0,4),$L,0,2)"
echo "== matmul fp16 8192 (first line: the heuristic)"
timeout 240 $E --setup "a = Tensor.rand(8192, 8192).half(); b = Tensor.rand(8192, 8192).half()" --expr "a @ b" --opts "[
[$WG2,$U,1,16),$R,0,4),$W,16),$S,1,3)],
[$WG2,$U,1,16),$R,0,4),$W,16),$S,2,3)],
[$WG2,$U,1,16),$R,0,4),$W,16),$S,2,4)],
[$WG2,$U,1,32),$R,0,4),$W,16),$S,2,3)],
[$WG2,$U,1,32),$R,0,4),$W,16),$S,2,4)],
[$WG2,$U,0,2),$U,1,16),$R,0,4),$W,16),$S,2,3)],
[$WG2,$U,0,2),$U,1,16),$R,0,4),$W,16),$S,2,4)],
[$WG2,$U,1,16),$R,0,4),$W,8),$S,2,3)],
[$WG2,$U,1,16),$R,0,4),$W,32),$S,2,3)],
[$WG2,$U,1,16),$R,0,4),$S,1,3)],
[$T,$L,0,4),$U,1,16),$L,1,2),$R,0,4),$W,16),$S,2,3)],
]" 2>&1 | tee "$OUT/explore_fp16.log"
echo "== x @ w.T fp16 8192 (B K-major), bf16 4096"
timeout 60 $E --setup "a = Tensor.rand(8192, 8192).half(); b = Tensor.rand(8192, 8192).half()" --expr "a @ b.T" --opts "[
[$WG2,$U,1,16),$R,0,4),$W,16),$S,2,3)]]"
timeout 60 $E --setup "a = Tensor.rand(4096, 4096).cast(dtypes.bfloat16); b = Tensor.rand(4096, 4096).cast(dtypes.bfloat16)" --expr "a @ b" --opts "[
[$WG2,$U,1,16),$R,0,4),$W,16),$S,2,3)]]"
echo "== suite: matmul_fp16 against torch"
timeout 120 python3 -m bench.suite --device CUDA --cases matmul_fp16 2>&1 | tail -8
