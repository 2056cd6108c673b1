"""The PYTHON backend: an interpreter of the flat UOp list, the reference every compiled backend is tested against.

It runs the whole launch grid in lockstep, SIMT style: every value is a numpy array with one entry per thread
(blocks x threads). So SPECIAL ids, shared memory (one array per block), BARRIER (lockstep makes it hold by
construction) and IF gates (a per-thread mask) behave as on a GPU, at numpy speed. Loops must be uniform.
"""
from __future__ import annotations
import base64
import time
import pickle
import numpy as np
from fusegrad.dtype import DType, dtypes
from fusegrad.uop import UOp, Ops, GroupOp, MatrixLoad, WGMMAArg
from fusegrad.device import Allocator, Compiler, Compiled
from fusegrad.renderer.cstyle import Renderer
from fusegrad.codegen.tensor_cores import a_pos, b_pos, c_pos, M, N, K, WGMMA, WG_M, operand_offsets


class PythonRenderer(Renderer):
  """The "source" is a readable listing followed by the program itself, serialized as a flat list."""
  def __init__(self):
    super().__init__(device="PYTHON", has_local=True, has_shared=True, supports_float4=True,
                     vector_dtypes=frozenset({dtypes.float32, dtypes.int32}), global_max=(2**31 - 1, 65535, 65535),
                     local_max=(1024, 1024, 64), local_max_threads=1024, shared_max=227 * 1024,
                     tensor_cores=("m16n8k16", WGMMA))

  def render(self, name: str, uops: list[UOp]) -> str:
    index = {u: i for i, u in enumerate(uops)}
    flat = [(u.op, u.dtype, tuple(index[s] for s in u.src), u.arg) for u in uops]
    listing = "\n".join(f"# {i:4d} {u.op.name:<13} {u.dtype.name:<14} {[index[s] for s in u.src]} "
                        f"{'' if u.arg is None else u.arg}" for i, u in enumerate(uops))
    return f"# kernel {name}\n{listing}\n" + base64.b64encode(pickle.dumps((name, flat))).decode()


class PythonCompiler(Compiler):
  cache_key = "python"
  def compile(self, src: str) -> bytes: return base64.b64decode(src.splitlines()[-1])
  def compile_cached(self, src: str) -> bytes: return self.compile(src)


class PythonAllocator(Allocator):
  def alloc(self, nbytes: int) -> np.ndarray: return np.zeros(nbytes, dtype=np.uint8)
  def copyin(self, handle: np.ndarray, src: memoryview) -> None: np.copyto(handle, np.frombuffer(src, dtype=np.uint8))
  def copyout(self, dest: memoryview, handle: np.ndarray) -> None:
    np.copyto(np.frombuffer(dest, dtype=np.uint8), handle)


def _np(dt: DType):
  """numpy dtype that holds values of dt in registers (bfloat16 is computed in float32)."""
  return np.float32 if dt.scalar is dtypes.bfloat16 else dt.scalar.np


def _round_bf16(x: np.ndarray) -> np.ndarray:
  bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
  out = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
  return np.where(np.isnan(x), np.float32(np.nan), out)


def _safe_div(a, b, fn):
  zero = b == 0
  return np.where(zero, 0, fn(a, np.where(zero, 1, b)))


ALU_NUMPY = {
  Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt, Ops.TRUNC: np.trunc,
  Ops.RECIP: lambda a: np.divide(np.ones_like(a), a), Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply,
  Ops.FDIV: np.divide, Ops.MAX: np.maximum, Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal,
  Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor, Ops.SHL: np.left_shift,
  Ops.SHR: np.right_shift, Ops.POW: np.power, Ops.WHERE: np.where, Ops.MULACC: lambda a, b, c: a * b + c,
}


def run_alu(op: Ops, dt: DType, args: list) -> np.ndarray:
  if op is Ops.NEG: out = np.logical_not(args[0]) if dt is dtypes.bool else np.negative(args[0])
  elif op is Ops.IDIV: out = _safe_div(args[0], args[1], np.floor_divide)
  elif op is Ops.MOD: out = np.fmod(args[0], args[1]) if dtypes.is_float(dt) else _safe_div(args[0], args[1], np.mod)
  else: out = ALU_NUMPY[op](*args)
  out = np.asarray(out).astype(_np(dt), copy=False)
  return _round_bf16(out) if dt is dtypes.bfloat16 else out


class PythonProgram:
  """Runs one serialized UOp list over a launch grid."""

  def __init__(self, name: str, lib: bytes):
    self.name, self.program = pickle.loads(lib)

  def __call__(self, bufs: list, vals: tuple[int, ...] = (), global_size=(1, 1, 1), local_size=(1, 1, 1), wait=False):

    start = time.perf_counter()
    _Interpreter(self.program, bufs, vals, tuple(global_size or (1, 1, 1)), tuple(local_size or (1, 1, 1))).run()
    return time.perf_counter() - start


class _PhiValues(dict):
  """Values by uop index, where reading a PHI reads its accumulator: as in C, every PHI of one accumulator is the
  same variable, so a read sees the latest update wherever the PHI sits."""

  def __init__(self, prog):
    super().__init__()
    self.root = {}
    for pc, (op, _, src, _) in enumerate(prog):
      if op is Ops.PHI: self.root[pc] = self.root.get(src[0], src[0])

  def __getitem__(self, pc): return super().__getitem__(self.root.get(pc, pc))


def _memory_srcs(prog, src) -> list[int]:
  """The sources of a memory access or WMMA without the barriers it is ordered after (they hold no value)."""
  return [s for s in src if prog[s][0] is not Ops.BARRIER]


class _Interpreter:
  def __init__(self, program, bufs, vals, gsz, lsz):
    self.prog, self.bufs, self.vals = program, bufs, vals
    self.gsz, self.lsz = gsz, lsz
    self.n_blocks, self.n_local = int(np.prod(gsz)), int(np.prod(lsz))
    self.n = self.n_blocks * self.n_local
    thread = np.arange(self.n)
    self.block, self.local = thread // self.n_local, thread % self.n_local

  def grid_index(self, which: str, dim: int) -> np.ndarray:
    sizes, ids = (self.gsz, self.block) if which == "g" else (self.lsz, self.local)
    stride = int(np.prod(sizes[:dim]))
    return ((ids // stride) % sizes[dim]).astype(np.int32)

  def memory(self, i: int, dt: DType) -> np.ndarray:
    raw = self.bufs[i]
    return raw.view(np.uint16) if dt is dtypes.bfloat16 else raw.view(dt.np)

  def run(self) -> None:
    prog = self.prog
    v: dict[int, object] = _PhiValues(prog)
    mask_stack = [np.ones(self.n, dtype=bool)]
    loops: list[list] = []   # [pc of LOOP, current, end]
    ends = self._match_ends()
    var_i = 0
    pc = 0
    while pc < len(prog):
      op, dt, src, arg = prog[pc]
      mask = mask_stack[-1]
      if op is Ops.DEFINE_GLOBAL: v[pc] = ("global", arg, dt.base)
      elif op is Ops.DEFINE_VAR:
        v[pc] = np.int32(self.vals[var_i])
        var_i += 1
      elif op is Ops.DEFINE_LOCAL: v[pc] = ("local", np.zeros((self.n_blocks, arg.size), dtype=_np(dt.base)), dt.base)
      elif op is Ops.CONST: v[pc] = np.array(arg, dtype=_np(dt)) if dt.count == 1 else np.full(dt.count, arg, _np(dt))
      elif op is Ops.SPECIAL: v[pc] = self.grid_index(arg.name[0], arg.dim)
      elif op is Ops.LOOP:
        start, end = int(v[src[0]]), int(v[src[1]])
        if start >= end:
          pc = ends[pc] + 1
          continue
        loops.append([pc, start, end])
        v[pc] = np.int32(start)
      elif op is Ops.IF: mask_stack.append(mask & np.broadcast_to(v[src[0]], (self.n,)))
      elif op is Ops.END:
        opener = prog[src[0]][0]
        if opener is Ops.LOOP:
          loop = loops[-1]
          loop[1] += 1
          if loop[1] < loop[2]:
            v[loop[0]] = np.int32(loop[1])
            pc = loop[0] + 1
            continue
          loops.pop()
        else:
          mask_stack.pop()
      elif op is Ops.BARRIER: pass
      elif op is Ops.DEFINE_ACC: v[pc] = np.broadcast_to(v[src[0]], (self.n,) + v[src[0]].shape).copy()
      elif op is Ops.PHI:
        root = src[0]
        while prog[root][0] is Ops.PHI: root = prog[root][2][0]
        v[root] = v[pc] = np.where(mask if np.ndim(v[src[1]]) == 1 else mask[:, None], v[src[1]], v[root])
      elif op is Ops.LOAD: v[pc] = self.load(prog, pc, v, mask)
      elif op is Ops.STORE: self.store(prog, pc, v, mask)
      elif op is Ops.GEP: v[pc] = np.asarray(v[src[0]])[..., arg]
      elif op is Ops.VECTORIZE:
        v[pc] = np.stack([np.broadcast_to(v[s], (self.n,)) for s in src], axis=-1)
      elif op is Ops.CAST: v[pc] = self.cast(v[src[0]], prog[src[0]][1], dt)
      elif op is Ops.BITCAST:
        v[pc] = np.ascontiguousarray(np.broadcast_to(v[src[0]], (self.n,))).view(_np(dt))
      elif op is Ops.WMMA:
        vals = [v[s] for s in _memory_srcs(prog, src)]
        v[pc] = self.wgmma(arg, vals) if isinstance(arg, WGMMAArg) else self.wmma(arg, vals)
      elif op in GroupOp.ALU:
        with np.errstate(all="ignore"): v[pc] = run_alu(op, dt, [v[s] for s in src])
      else: raise NotImplementedError(f"PYTHON backend: {op} is not supported")
      pc += 1

  def _match_ends(self) -> dict[int, int]:
    ends = {}
    for pc, (op, _, src, _) in enumerate(self.prog):
      if op is Ops.END: ends[src[0]] = pc
    return ends

  def _address(self, prog, v, src_ids):
    ref = v[src_ids[0]]
    idx = np.broadcast_to(np.asarray(v[src_ids[1]], dtype=np.int64), (self.n,))
    return ref, idx

  def load(self, prog, pc, v, mask) -> np.ndarray:
    op, dt, src, arg = prog[pc]
    if isinstance(arg, MatrixLoad): return self.ldmatrix(prog, pc, v)
    src = _memory_srcs(prog, src)
    (kind, handle, base), idx = self._address(prog, v, src)
    valid = mask & (np.broadcast_to(v[src[2]], (self.n,)) if len(src) == 4 else True)
    width = dt.count
    mem = self.memory(handle, base) if kind == "global" else handle
    size = mem.shape[-1]
    lanes = idx[:, None] + np.arange(width)[None, :]
    bad = valid[:, None] & ((lanes < 0) | (lanes >= size))
    if bad.any():
      raise IndexError(f"PYTHON backend: load out of bounds in buffer {handle if kind == 'global' else 'local'}: "
                       f"index {int(lanes[bad][0])} of {size}")
    safe = np.where(valid[:, None], lanes, 0)
    vals = mem[safe] if kind == "global" else mem[self.block[:, None], safe]
    if base is dtypes.bfloat16 and kind == "global": vals = (vals.astype(np.uint32) << 16).view(np.float32)
    if len(src) == 4:
      alt = np.asarray(v[src[3]])
      alt = np.broadcast_to(alt, (self.n, width)) if width > 1 else alt
      vals = np.where(valid[:, None], vals, alt)
    return vals if width > 1 else vals[:, 0]

  def store(self, prog, pc, v, mask) -> None:
    op, dt, src, arg = prog[pc]
    (kind, handle, base), idx = self._address(prog, v, src)
    value = v[src[2]]
    width = prog[src[2]][1].count
    mem = self.memory(handle, base) if kind == "global" else handle
    size = mem.shape[-1]
    lanes = idx[:, None] + np.arange(width)[None, :]
    active = np.nonzero(mask)[0]
    if ((lanes[active] < 0) | (lanes[active] >= size)).any():
      raise IndexError(f"PYTHON backend: store out of bounds in buffer {handle if kind == 'global' else 'local'}")
    vals = np.broadcast_to(np.asarray(value).reshape((-1, width) if np.ndim(value) else (1, 1)), (self.n, width))
    if base is dtypes.bfloat16 and kind == "global":
      vals = (_round_bf16(vals.astype(np.float32)).view(np.uint32) >> 16).astype(np.uint16)
    if kind == "global": mem[lanes[active]] = vals[active].astype(mem.dtype, copy=False)
    else: mem[self.block[active, None], lanes[active]] = vals[active]

  def ldmatrix(self, prog, pc, v) -> np.ndarray:
    """ldmatrix across each warp: lane l's register j holds row l // 4, columns 2 (l % 4) and 2 (l % 4) + 1 of
    matrix j (transposed: rows 2 (l % 4) and 2 (l % 4) + 1, column l // 4), whose rows start at the addresses that
    lanes 8 j .. 8 j + 7 supply; two 16-bit values per register, low half first."""
    _, _, src, arg = prog[pc]
    (_, mem, base), idx = self._address(prog, v, _memory_srcs(prog, src))
    if (idx % 8 != 0).any():   # the hardware reads 16-byte rows: each row address must be 16-byte aligned
      raise ValueError(f"PYTHON backend: ldmatrix row address {int(idx[idx % 8 != 0][0])} is not 16-byte aligned")
    flat = self.block * self.n_local + self.local
    lane = flat % 32
    bits = mem.view(np.uint16) if base is dtypes.float16 else (mem.view(np.uint32) >> 16).astype(np.uint16)
    out = np.zeros((self.n, arg.count), dtype=np.uint32)
    for j in range(arg.count):
      for half in range(2):
        if arg.trans: provider, col = 8 * j + 2 * (lane % 4) + half, lane // 4
        else: provider, col = 8 * j + lane // 4, 2 * (lane % 4) + half
        addr = idx[flat - lane + provider] + col
        if ((addr < 0) | (addr >= mem.shape[-1])).any():
          raise IndexError(f"PYTHON backend: ldmatrix out of bounds in a local buffer of {mem.shape[-1]}")
        out[:, j] |= bits[self.block, addr].astype(np.uint32) << (16 * half)
    return out

  def wmma(self, arg, vals: list) -> np.ndarray:
    """Emulate mma.sync m16n8k16 across each warp: gather fragments into matrices, multiply, scatter D back."""
    lane = self.local % 32
    warp = (self.block * self.n_local + self.local) // 32
    n_warps = int(warp.max()) + 1
    g, t = lane // 4, lane % 4
    rnd = (lambda x: _round_bf16(x)) if arg.dtype_in is dtypes.bfloat16 else (lambda x: x.astype(np.float16))
    a = np.zeros((n_warps, M, K), np.float32)
    b = np.zeros((n_warps, K, N), np.float32)
    c = np.zeros((n_warps, M, N), np.float32)
    if arg.packed:   # 4 A and 2 B registers of two 16-bit values each: unpack them into the 8 + 4 values
      def unpack(reg) -> list:
        reg = np.broadcast_to(np.asarray(reg, dtype=np.uint32), (self.n,))
        halves = [(reg >> (16 * h)) & 0xFFFF for h in range(2)]
        if arg.dtype_in is dtypes.float16:
          return [x.astype(np.uint16).view(np.float16).astype(np.float32) for x in halves]
        return [(x.astype(np.uint32) << 16).view(np.float32) for x in halves]
      vals = [x for reg in vals[0:6] for x in unpack(reg)] + list(vals[6:10])
    for i in range(8): a[(warp,) + a_pos(g, t, i)] = rnd(np.broadcast_to(vals[i], (self.n,)).astype(np.float32))
    for i in range(4): b[(warp,) + b_pos(g, t, i)] = rnd(np.broadcast_to(vals[8 + i], (self.n,)).astype(np.float32))
    for i in range(4): c[(warp,) + c_pos(g, t, i)] = np.broadcast_to(vals[12 + i], (self.n,))
    d = np.matmul(a.astype(np.float32), b.astype(np.float32)) + c
    return np.stack([d[(warp,) + c_pos(g, t, i)] for i in range(4)], axis=-1).astype(np.float32)

  def wgmma(self, arg: WGMMAArg, vals: list) -> np.ndarray:
    """Emulate wgmma m64nNk16 across each warpgroup (4 warps, 128 threads): read A (64 x 16) and B (N x 16) from
    the shared tiles at the warpgroup's origins in the swizzled layouts (tensor_cores.operand_offsets), multiply,
    and hand each thread its C fragments of the N / 8 tiles."""
    (_, mem_a, _), start_a, (_, mem_b, _), start_b = vals[:4]
    accs = vals[4:]
    if self.n_local % 128: raise ValueError(f"PYTHON backend: wgmma in blocks of {self.n_local} threads (not whole "
                                            f"warpgroups of 128)")
    flat = self.block * self.n_local + self.local
    group, lane, warp = flat // 128, flat % 32, (flat // 32) % 4
    lead = np.arange(self.n // 128) * 128   # the first thread of each warpgroup
    blocks = self.block[lead]
    def operand(mem, start, rows: int, trans: bool, lbo: int) -> np.ndarray:
      start = np.broadcast_to(np.asarray(start, dtype=np.int64), (self.n,))
      if (start != start[flat - flat % 128]).any():
        raise ValueError("PYTHON backend: the threads of a warpgroup give a wgmma different shared origins")
      offs = operand_offsets(rows, trans, start[lead], lbo)
      if ((offs < 0) | (offs >= mem.shape[-1])).any():
        raise IndexError(f"PYTHON backend: wgmma reads past a shared array of {mem.shape[-1]}")
      return mem[blocks[:, None, None], offs].astype(np.float32)
    a = operand(mem_a, start_a, WG_M, arg.trans_a, arg.lbo_a)            # (groups, 64, 16)
    b = operand(mem_b, start_b, arg.n, arg.trans_b, arg.lbo_b)           # (groups, N, 16)
    d = np.matmul(a.astype(np.float64), b.astype(np.float64).transpose(0, 2, 1)).astype(np.float32)
    g, t = lane // 4, lane % 4
    out = np.empty((self.n, arg.n // 2), dtype=np.float32)
    for i in range(arg.n // 2):
      tile, reg = i // 4, i % 4
      out[:, i] = d[group, 16 * warp + g + 8 * (reg >> 1), 8 * tile + 2 * t + (reg & 1)] + \
          np.broadcast_to(accs[i], (self.n,))
    return out

  def cast(self, x, src_dt: DType, dt: DType) -> np.ndarray:
    x = np.asarray(x)
    if dt is dtypes.bool: return x != 0
    with np.errstate(all="ignore"):
      if dtypes.is_int(dt) and dtypes.is_float(src_dt):
        x = np.where(np.isfinite(x), np.trunc(x), 0)
        info = np.iinfo(np.int64)
        x = np.clip(x, info.min, info.max).astype(np.int64)
      out = x.astype(_np(dt))
    return _round_bf16(out) if dt is dtypes.bfloat16 else out


def make_device() -> Compiled:
  return Compiled("PYTHON", PythonAllocator(), PythonRenderer(), PythonCompiler(), PythonProgram)
