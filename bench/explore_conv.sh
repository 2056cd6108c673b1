#!/usr/bin/env bash
# GPU run 11: tensor cores for the bench conv with the weights as A (M = output channels, N = image columns).
export PYTHONPATH=. CACHE_DIR=/tmp/fgcache
E="python3 -m bench.explore --device CUDA"
U="Opt(OptOps.UPCAST"; L="Opt(OptOps.LOCAL"; R="Opt(OptOps.UNROLL"; T="Opt(OptOps.TC,1)"
echo "== conv2d fp16 N=32"
$E --setup "x = Tensor.rand(32, 64, 56, 56).half(); w = Tensor.rand(64, 64, 3, 3).half()" --expr "x.conv2d(w, padding=1)" --opts "[
[$T],
[$T,$U,1,4),$U,2,7)],
[$T,$U,1,4),$U,2,7),$U,1,2)],
[$T,$U,1,4),$U,2,7),$L,1,4)],
[$T,$U,1,4),$U,2,7),$U,1,2),$L,1,4)],
[$T,$U,1,2),$U,3,7),$U,2,2),$L,2,4)],
[$T,$U,1,4),$U,2,7),$U,1,2),$L,1,2),$L,0,2)],
[$T,$U,1,4),$U,2,7),$U,1,4),$L,1,2)],
]"
