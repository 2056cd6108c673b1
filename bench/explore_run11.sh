export PYTHONPATH=. CACHE_DIR=/tmp/fgcache
E="python3 -m bench.explore --device CUDA"
U="Opt(OptOps.UPCAST"; L="Opt(OptOps.LOCAL"; R="Opt(OptOps.UNROLL"; T="Opt(OptOps.TC)"; G="Opt(OptOps.GROUP"
echo "== matmul fp16 8192"
$E --setup "a = Tensor.rand(8192, 8192).half(); b = Tensor.rand(8192, 8192).half()" --expr "a @ b" --opts "[
[$T,$U,1,4),$U,0,4),$L,0,2),$L,1,4),$R,0,4),Opt(OptOps.STAGE,0,3)],
[$T,$U,1,8),$U,0,4),$L,0,2),$L,1,2),$R,0,2),Opt(OptOps.STAGE,0,2)],
[$T,$U,1,4),$U,0,4),$L,0,4),$L,1,4),$R,0,4),Opt(OptOps.STAGE,0,3)],
[$T,$U,1,4),$U,0,4),$L,0,2),$L,1,4),$R,0,2),Opt(OptOps.STAGE,0,3)],
]"
echo "== reduce_all first stage"
$E --kernel 0 --setup "a = Tensor.rand(2**26)" --expr "a.sum()" --opts "[
[$R,0,4),$G,0,128)],
[$R,0,4),$G,0,256)],
[$R,0,4),$G,0,128),$U,0,2)],
[$R,0,4),$G,0,64)],
]"
echo "== reduce_rows"
$E --setup "a = Tensor.rand(8192, 8192)" --expr "a.sum(axis=1)" --opts "[
[$R,0,4),$G,0,128)],
]"
