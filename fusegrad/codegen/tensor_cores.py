"""Tensor cores: the mma.sync.aligned.m16n8k16 fragment layout, the TC opt that maps a matmul-shaped reduce onto
it, and Hopper's warpgroup MMA (wgmma), which reads both operands from shared tiles in the 128-byte swizzled layout.

A warp of 32 threads computes a 16x16 @ 16x8 product per instruction. Lane `l` (g = l // 4, t = l % 4) holds eight
A values, four B values and four C/D values at the positions below (PTX ISA, "Matrix Fragments for mma.m16n8k16").
The functions work on ints, numpy arrays and UOps alike, so the lowering, the PYTHON backend's emulation and the
tests share one definition of the layout.
"""
from __future__ import annotations
from dataclasses import dataclass
import numpy as np
from fusegrad.dtype import DType, dtypes
from fusegrad.uop import UOp, Ops, WGMMAArg

M, N, K = 16, 8, 16
A_REGS, B_REGS, C_REGS = 8, 4, 4


def a_pos(g, t, i: int): return g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)   # (m, k)
def b_pos(g, t, i: int): return 2 * t + (i & 1) + 8 * (i >> 1), g                       # (k, n)
def c_pos(g, t, i: int): return g + 8 * (i >> 1), 2 * t + (i & 1)                       # (m, n)


@dataclass(frozen=True)
class WMMAArg:
  """WMMA: one m16n8k16 multiply-accumulate; src = 8 A values, 4 B values, 4 accumulators; dtype float4. When
  `packed`, src = the 4 A and 2 B registers as the instruction takes them (two 16-bit values each, low half
  first, as ldmatrix gives them), then the 4 accumulators."""
  dtype_in: DType
  dtype_out: DType
  dims: tuple[int, int, int] = (M, N, K)
  packed: bool = False


def ldmatrix_lane(g, t):
  """(matrix, row) whose address lane (g, t) supplies to ldmatrix."""
  return g // 2, (g % 2) * 4 + t


TC_INPUT_DTYPES = (dtypes.float16, dtypes.bfloat16)


@dataclass(frozen=True)
class TCPlan:
  """The loads that feed the tensor cores. The TC axes sit at fixed places of the layout: the two local axes are
  g (8, part of M) and t (4, part of N); the first three upcast axes are nl (2, low N), mh (2, high M), k (16)."""
  a: UOp          # LOAD of A (varies along M and K)
  b: UOp          # LOAD of B (varies along N and K)
  dtype_in: DType


def _strip_cast(u: UOp) -> UOp:
  while u.op is Ops.CAST: u = u.src[0]
  return u


def match_matmul(reduceop: UOp | None) -> tuple[UOp, UOp, DType] | None:
  """(x, y, dtype) if the reduce is SUM(x*y) with the product in fp16/bf16 and x, y LOADs (possibly cast to that
  dtype in the kernel, as `a.half() @ b.half()` of float32 buffers is), else None."""
  if reduceop is None or reduceop.arg.op is not Ops.ADD: return None
  mul = _strip_cast(reduceop.src[0])
  if mul.op is not Ops.MUL or mul.dtype not in TC_INPUT_DTYPES: return None
  x, y = (_strip_cast(s) for s in mul.src)
  if x.op is not Ops.LOAD or y.op is not Ops.LOAD or not (dtypes.is_float(x.dtype) and dtypes.is_float(y.dtype)):
    return None
  return x, y, mul.dtype


# ***** wgmma: m64nNk16 by a warpgroup of 4 warps, operands read from shared memory (sm_90a) *****
WGMMA = WGMMAArg.NAME  # the name a renderer lists in `tensor_cores` when its device has wgmma
WG_M = 64              # rows of one wgmma: warp w of the warpgroup holds rows 16 w .. 16 w + 15
PANEL = 64             # 16-bit elements in one 128-byte row of a swizzled tile
SBO = WGMMAArg.SBO     # elements between the 8-row groups of a swizzled tile (1024 bytes)


def swizzle(offset):
  """The 128-byte swizzle on the element offset of a 16-bit element from a 1024-byte aligned base: the 16-byte
  chunk within each 128-byte row is XORed with the row's index mod 8 (address bits 4-6 ^= bits 7-9), so the
  8 rows of an 8x8 core matrix sit in 8 different bank groups. Works on ints, numpy arrays and UOps."""
  return offset ^ (((offset // PANEL) % 8) * 8)


def panel_offset(r, c, rows: int):
  """Unswizzled element offset of (row r, column c) of a tile of `rows` rows whose columns are cut into panels of
  64 (one 128-byte row each), panel after panel."""
  return (c // PANEL) * (rows * PANEL) + r * PANEL + c % PANEL


def operand_offsets(rows: int, trans: bool, start, lbo: int):
  """Element offsets (rows x 16: m or n, then k) that a wgmma reads for an operand whose descriptor starts at
  `start`, in the canonical 128-byte swizzled layouts: K-major, row mn of the operand is row mn of the tile (8-row
  groups SBO apart), its 16 k contiguous; MN-major, k is the row (groups of 8 rows SBO apart) and mn the column,
  in panels of 64 that are `lbo` apart. `start` may be a numpy array of origins (one per warpgroup)."""
  mn, k = np.arange(rows)[:, None], np.arange(K)[None, :]
  rel = (mn // PANEL) * lbo + (k // 8) * SBO + (k % 8) * PANEL + mn % PANEL if trans else \
      (mn // 8) * SBO + (mn % 8) * PANEL + k
  return swizzle(np.asarray(start)[..., None, None] + rel)
