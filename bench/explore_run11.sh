#!/usr/bin/env bash
# GPU run 11 explorations (device machine, repo root): the staged TC matmul around the new heuristic.
export PYTHONPATH=. CACHE_DIR=/tmp/fgcache
E="python3 -m bench.explore --device CUDA"
U="Opt(OptOps.UPCAST"; L="Opt(OptOps.LOCAL"; R="Opt(OptOps.UNROLL"; T="Opt(OptOps.TC)"; W="Opt(OptOps.RASTER,0"
H16="$T,$U,1,4),$U,0,4),$L,0,2),$L,1,4),$R,0,4)"
echo "== matmul fp16 8192"
$E --setup "a = Tensor.rand(8192, 8192).half(); b = Tensor.rand(8192, 8192).half()" --expr "a @ b" --opts "[
[$T,$U,1,8),$U,0,4),$L,0,2),$L,1,2),$R,0,2),$W,16),Opt(OptOps.STAGE,0,3)],
[$T,$U,1,8),$U,0,4),$L,0,2),$L,1,2),$R,0,2),$W,16),Opt(OptOps.STAGE,0,4)],
[$T,$U,1,8),$U,0,2),$L,0,4),$L,1,2),$R,0,4),$W,16),Opt(OptOps.STAGE,0,3)],
[$T,$U,1,8),$U,0,2),$L,0,4),$L,1,2),$R,0,2),$W,16),Opt(OptOps.STAGE,0,4)],
[$T,$U,1,4),$U,0,4),$L,0,2),$L,1,4),$R,0,4),$W,16),Opt(OptOps.STAGE,0,3)],
]"
echo "== linear fp16 x @ w.T 8192"
$E --setup "a = Tensor.rand(8192, 8192).half(); b = Tensor.rand(8192, 8192).half()" --expr "a @ b.T" --opts "[]"
echo "== matmul bf16 4096"
$E --setup "a = Tensor.rand(4096, 4096).cast(dtypes.bfloat16); b = Tensor.rand(4096, 4096).cast(dtypes.bfloat16)" --expr "a @ b" --opts "[]"
