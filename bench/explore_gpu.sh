#!/usr/bin/env bash
# Hand-picked opt lists for the GPU cases, timed with bench/explore.py (device machine, repo root).
export PYTHONPATH=. CACHE_DIR=/tmp/fgcache
E="python3 -m bench.explore --device CUDA"
echo "== matmul fp16 8192 (tensor cores, raw fragment loads)"
$E --setup "a = Tensor.rand(8192, 8192).half(); b = Tensor.rand(8192, 8192).half()" --expr "a @ b" --opts "[
[Opt(OptOps.TC,0,0),Opt(OptOps.UPCAST,1,16),Opt(OptOps.UPCAST,0,4)],
[Opt(OptOps.TC,0,0),Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,8)],
[Opt(OptOps.TC,0,0),Opt(OptOps.UPCAST,1,4),Opt(OptOps.UPCAST,0,8)],
[Opt(OptOps.TC,0,0),Opt(OptOps.UPCAST,1,16),Opt(OptOps.UPCAST,0,2)],
[Opt(OptOps.TC,0,0),Opt(OptOps.UPCAST,1,4),Opt(OptOps.UPCAST,0,4)],
]"
