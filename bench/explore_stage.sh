#!/usr/bin/env bash
# Shared-memory staging (STAGE) and multi-warp blocks, timed with bench/explore.py (device machine, repo root).
export PYTHONPATH=. CACHE_DIR=/tmp/fgcache
E="python3 -m bench.explore --device CUDA"
U="Opt(OptOps.UPCAST"; L="Opt(OptOps.LOCAL"; R="Opt(OptOps.UNROLL"; S="Opt(OptOps.STAGE)"; T="Opt(OptOps.TC)"
echo "== matmul fp16 8192 (TC)"
$E --setup "a = Tensor.rand(8192, 8192).half(); b = Tensor.rand(8192, 8192).half()" --expr "a @ b" --opts "[
[$T,$U,1,8),$U,0,4),$L,0,2),$L,1,2),$R,0,2),$S],
[$T,$U,1,8),$U,0,4),$L,0,2),$L,1,2),$R,0,2),Opt(OptOps.STAGE,0,3)],
[$T,$U,1,8),$U,0,4),$L,0,2),$L,1,2),$R,0,2),Opt(OptOps.STAGE,0,4)],
[$T,$U,1,4),$U,0,4),$L,0,2),$L,1,4),$R,0,4),Opt(OptOps.STAGE,0,2)],
[$T,$U,1,4),$U,0,4),$L,0,2),$L,1,4),$R,0,4),Opt(OptOps.STAGE,0,3)],
[$T,$U,1,4),$U,0,4),$L,0,2),$L,1,4),$R,0,4),Opt(OptOps.STAGE,0,4)],
[$T,$U,1,4),$U,0,4),$L,0,2),$L,1,4),$R,0,2),Opt(OptOps.STAGE,0,4)],
[$T,$U,1,4),$U,0,4),$L,0,4),$L,1,2),$R,0,4),Opt(OptOps.STAGE,0,3)],
[$T,$U,1,8),$U,0,4),$L,0,2),$L,1,4),$R,0,2),Opt(OptOps.STAGE,0,4)],
[$T,$U,1,4),$U,0,4),$L,0,4),$L,1,4),$R,0,4),Opt(OptOps.STAGE,0,3)],
]"
echo "== matmul bf16 8192 (TC)"
$E --setup "a = Tensor.rand(8192, 8192).cast(dtypes.bfloat16); b = Tensor.rand(8192, 8192).cast(dtypes.bfloat16)" --expr "a @ b" --opts "[
[$T,$U,1,8),$U,0,4),$L,0,2),$L,1,2),$R,0,2),$S],
]"
echo "== linear fp16 x @ w.T 8192"
$E --setup "a = Tensor.rand(8192, 8192).half(); b = Tensor.rand(8192, 8192).half()" --expr "a @ b.T" --opts "[
[$T,$U,1,8),$U,0,4),$L,0,2),$L,1,2),$R,0,2),$S],
]"
echo "== matmul fp32 4096"
$E --setup "a = Tensor.rand(4096, 4096); b = Tensor.rand(4096, 4096)" --expr "a @ b" --opts "[
[$U,1,8),$U,0,8),$R,0,4),$L,1,32),$L,0,2),$S],
[$U,1,8),$U,0,8),$R,0,4),$L,1,32),$L,0,2),Opt(OptOps.STAGE,0,3)],
[$U,1,8),$U,0,8),$R,0,4),$L,1,32),$L,0,2),Opt(OptOps.STAGE,0,4)],
[$U,1,8),$U,0,8),$R,0,4),$L,0,4),$L,1,32),$S],
[$U,1,8),$U,0,8),$R,0,4),$L,0,16),$L,1,16),$S],
[$U,1,8),$U,0,8),$R,0,4),$L,0,16),$L,1,16),Opt(OptOps.STAGE,0,3)],
]"
