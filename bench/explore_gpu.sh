export PYTHONPATH=. CACHE_DIR=/tmp/fgcache
E="python3 -m bench.explore --device CUDA"
echo "== matmul fp32 4096"
$E --setup "a = Tensor.rand(4096, 4096); b = Tensor.rand(4096, 4096)" --expr "a @ b" --opts "[
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,4),Opt(OptOps.LOCAL,1,16),Opt(OptOps.LOCAL,0,16)],
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,4),Opt(OptOps.LOCAL,1,16),Opt(OptOps.LOCAL,0,8)],
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,4),Opt(OptOps.LOCAL,1,8),Opt(OptOps.LOCAL,0,8)],
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,2),Opt(OptOps.LOCAL,1,16),Opt(OptOps.LOCAL,0,16)],
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,8),Opt(OptOps.LOCAL,1,16),Opt(OptOps.LOCAL,0,16)],
[Opt(OptOps.UPCAST,1,4),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,4),Opt(OptOps.LOCAL,1,32),Opt(OptOps.LOCAL,0,4)],
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,4),Opt(OptOps.UNROLL,0,4),Opt(OptOps.LOCAL,1,16),Opt(OptOps.LOCAL,0,8)],
[Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,8),Opt(OptOps.UNROLL,0,4),Opt(OptOps.LOCAL,1,32),Opt(OptOps.LOCAL,0,4)],
]"
echo "== matmul fp16 8192"
$E --setup "a = Tensor.rand(8192, 8192).half(); b = Tensor.rand(8192, 8192).half()" --expr "a @ b" --opts "[
[Opt(OptOps.TC,0,0),Opt(OptOps.UPCAST,1,2),Opt(OptOps.UPCAST,1,2),Opt(OptOps.UPCAST,0,2)],
[Opt(OptOps.TC,0,0),Opt(OptOps.UPCAST,1,2),Opt(OptOps.UPCAST,1,2),Opt(OptOps.UPCAST,0,2),Opt(OptOps.UPCAST,0,2)],
[Opt(OptOps.TC,0,0),Opt(OptOps.UPCAST,1,4),Opt(OptOps.UPCAST,0,4)],
[Opt(OptOps.TC,0,0),Opt(OptOps.UPCAST,1,8),Opt(OptOps.UPCAST,0,2)],
[Opt(OptOps.TC,0,0),Opt(OptOps.UPCAST,1,2),Opt(OptOps.UPCAST,0,4)],
]"
echo "== reduce_all 2^26"
$E --setup "a = Tensor.rand(2**26)" --expr "a.sum()" --opts "[]"
$E --setup "a = Tensor.rand(4096, 16384)" --expr "a.sum(1)" --opts "[
[Opt(OptOps.GROUP,0,256),Opt(OptOps.UNROLL,0,4)],
[Opt(OptOps.UNROLL,0,4),Opt(OptOps.GROUP,0,256)],
[Opt(OptOps.UNROLL,0,4),Opt(OptOps.GROUP,0,128)],
[Opt(OptOps.UNROLL,0,4),Opt(OptOps.GROUP,0,256),Opt(OptOps.UPCAST,0,2)],
[Opt(OptOps.UNROLL,0,4),Opt(OptOps.GROUP,0,512)],
]"
echo "== reduce_rows 8192"
$E --setup "a = Tensor.rand(8192, 8192)" --expr "a.sum(1)" --opts "[
[Opt(OptOps.UNROLL,0,4),Opt(OptOps.GROUP,0,256)],
[Opt(OptOps.UNROLL,0,4),Opt(OptOps.GROUP,0,128)],
[Opt(OptOps.UNROLL,0,4),Opt(OptOps.GROUP,0,256),Opt(OptOps.UPCAST,0,2)],
[Opt(OptOps.UNROLL,0,4),Opt(OptOps.GROUP,0,512)],
[Opt(OptOps.UNROLL,0,4),Opt(OptOps.GROUP,0,1024)],
]"
echo "== copy bandwidth (torch)"
python3 -c "
import torch
x = torch.empty(2**26, device='cuda'); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(20):
  s.record(); y.copy_(x); e.record(); e.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
ts.sort(); print('copy 2^26 floats', 2 * 4 * 2**26 / ts[10] / 1e9, 'GB/s')
"
