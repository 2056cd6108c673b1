#!/usr/bin/env bash
# GPU run 17 (device machine, repo root): is the fp16 conv load-bound on its 16-bit NCHW reads? The same conv kernel
# (TC, 4x7x2 tiles) on channels-last copies of the image and weights, where channel pairs are one 32-bit load.
export PYTHONPATH=. PYTHONUNBUFFERED=1 CACHE_DIR=/tmp/fgcache
E="python3 -m bench.explore --device CUDA --runs 20"
U="Opt(OptOps.UPCAST"; L="Opt(OptOps.LOCAL"; T="Opt(OptOps.TC,1)"
SETUP="x = Tensor.rand(32, 64, 56, 56).half(); w = Tensor.rand(64, 64, 3, 3).half()"
OPTS="[[$T,$U,1,4),$U,2,7),$U,1,2)], [$T,$U,1,4),$U,2,7),$U,1,2),Opt(OptOps.RASTER,0,4)], [$T,$U,1,4),$U,2,7)], [$T,$U,1,2),$U,2,7),$U,1,2)]]"
echo "== NCHW (the bench case)"
timeout 90 $E --setup "$SETUP" --expr "x.conv2d(w, padding=1)" --opts "$OPTS"
echo "== image and weights channels-last (conv kernel only)"
timeout 90 $E --setup "$SETUP" --expr "x.permute(0,2,3,1).contiguous().permute(0,3,1,2).conv2d(w.permute(0,2,3,1).contiguous().permute(0,3,1,2), padding=1)" --opts "$OPTS"
echo "== weights channels-last only"
timeout 90 $E --setup "$SETUP" --expr "x.conv2d(w.permute(0,2,3,1).contiguous().permute(0,3,1,2), padding=1)" --opts "$OPTS"
echo "== the image's permute kernel"
timeout 60 $E --setup "$SETUP" --expr "x.permute(0,2,3,1).contiguous()" --opts "[]"
