#!/usr/bin/env bash
# Hand-picked opt lists for the GPU cases, timed with bench/explore.py (device machine, repo root).
export PYTHONPATH=. CACHE_DIR=/tmp/fgcache
E="python3 -m bench.explore --device CUDA"
echo "== matmul fp32 4096"
$E --setup "a = Tensor.rand(4096, 4096); b = Tensor.rand(4096, 4096)" --expr "a @ b" --opts "[
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,8),Opt(OptOps.LOCAL,1,32),Opt(OptOps.LOCAL,0,2)],
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,2),Opt(OptOps.LOCAL,1,32),Opt(OptOps.LOCAL,0,2)],
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,4),Opt(OptOps.LOCAL,1,16),Opt(OptOps.LOCAL,0,2)],
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,4),Opt(OptOps.LOCAL,1,32)],
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,4),Opt(OptOps.LOCAL,0,2),Opt(OptOps.LOCAL,1,32)],
[Opt(OptOps.UPCAST,1,16),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,2),Opt(OptOps.LOCAL,1,16),Opt(OptOps.LOCAL,0,2)],
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,16),Opt(OptOps.UNROLL,0,2),Opt(OptOps.LOCAL,1,32),Opt(OptOps.LOCAL,0,2)],
[Opt(OptOps.UPCAST,1,4),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,4),Opt(OptOps.LOCAL,1,32),Opt(OptOps.LOCAL,0,2)],
]"
echo "== conv2d fp32 N=32"
$E --setup "x = Tensor.rand(32, 64, 56, 56); w = Tensor.rand(64, 64, 3, 3)" --expr "x.conv2d(w, padding=1)" --opts "[
[Opt(OptOps.UPCAST,3,4),Opt(OptOps.UPCAST,1,16),Opt(OptOps.UNROLL,2,3),Opt(OptOps.LOCAL,3,14),Opt(OptOps.LOCAL,2,8)],
[Opt(OptOps.UPCAST,3,8),Opt(OptOps.UPCAST,1,8),Opt(OptOps.UNROLL,2,3),Opt(OptOps.LOCAL,3,7),Opt(OptOps.LOCAL,2,8)],
[Opt(OptOps.UPCAST,3,4),Opt(OptOps.UPCAST,1,8),Opt(OptOps.UNROLL,2,3),Opt(OptOps.LOCAL,3,14),Opt(OptOps.LOCAL,2,4)],
[Opt(OptOps.UPCAST,3,4),Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,2,2),Opt(OptOps.UNROLL,2,3),Opt(OptOps.LOCAL,3,14),Opt(OptOps.LOCAL,2,4)],
]"
