"""Lowering a Kernel to a flat list of UOps, in named steps.

1. `index_uops`: one index per axis: SPECIAL thread/block ids (devices with thread blocks) or LOOPs (CPU), LOOPs for
   reduce axes; upcast axes are unrolled, so every value is a list with one UOp per upcast "lane".
2. `lower_ast`: the AST becomes that lane-wise UOp graph: LOADs with indices from each access' ShapeTracker (gated
   where a view has a mask, float4 where an upcast axis has unit stride and alignment is proven), ALUs, a REDUCE
   as DEFINE_ACC + PHI updates (through a shared-memory buffer, BARRIER and IF gate for grouped reduces), STOREs.
3. `symbolic` rewrite: constant folding and index simplification over the whole graph.
4. `linearize_graph`: place every node in the innermost loop/IF block it depends on (so loop-invariant code moves
   out of loops) and order blocks and nodes topologically; END closes each block.
`verify_uops` checks the invariants of the result.
"""
from __future__ import annotations
import math
import itertools
from dataclasses import dataclass
from fusegrad.helpers import prod
from fusegrad.dtype import DType, dtypes
from fusegrad.uop import UOp, Ops, GroupOp, SpecialArg, ReduceArg, LocalArg, MatrixLoad, MaskedLoad, WGMMAArg
from fusegrad.rewrite import graph_rewrite
from fusegrad.symbolic import symbolic, simplify
from fusegrad.shape.shapetracker import ShapeTracker
from fusegrad.shape.view import View
from fusegrad.codegen.kernel import Kernel, StagedLoad
from fusegrad.codegen.tensor_cores import WMMAArg, a_pos, b_pos, ldmatrix_lane, A_REGS, B_REGS, C_REGS, \
  swizzle, panel_offset


@dataclass
class LinearProgram:
  """The result of linearization: what the renderer and the runtime need."""
  name: str
  uops: list[UOp]
  global_size: tuple[int, ...] | None      # launch grid for devices with thread blocks
  local_size: tuple[int, ...] | None
  vars: list[UOp]                          # DEFINE_VARs, in parameter order
  buf_count: int
  op_estimate: int = 0
  mem_estimate: int = 0


# ***** step 1: indices *****

def _grouped_specials(prefix: str, sizes: list, max_dims: int, first: int) -> list[UOp]:
  """SPECIAL ids for `sizes`, folding leading axes together when there are more than `max_dims` of them."""
  if not sizes: return []
  if len(sizes) > max_dims:
    folded = [prod(sizes[:len(sizes) - max_dims + 1])] + list(sizes[len(sizes) - max_dims + 1:])
  else:
    folded = list(sizes)
  specials = [UOp(Ops.SPECIAL, dtypes.index, (), SpecialArg(f"{prefix}{first + i}", len(folded) - 1 - i, s))
              for i, s in enumerate(folded)]
  if len(folded) == len(sizes): return specials
  # unravel the folded id back into the original leading axes
  lead = sizes[:len(sizes) - max_dims + 1]
  out, rest = [], specials[0]
  for s in reversed(lead[1:]):
    out.append(rest % s)
    rest = rest // s
  out.append(rest)
  return out[::-1] + specials[1:]


MAX_PARTIAL_ACCS = 16   # up to this many lanes, unrolled reduce lanes accumulate separately
# ALU ops done on whole vectors on devices with vector arithmetic (the rest run lane by lane)
VECTOR_ALU_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.NEG, Ops.MAX, Ops.RECIP, Ops.EXP2})


def _tree(op: Ops, dtype: DType, parts: list[UOp]) -> UOp:
  """Combine partial results pairwise (a balanced tree keeps the dependency chain short)."""
  while len(parts) > 1:
    parts = [UOp(op, dtype, (parts[i], parts[i + 1])) if i + 1 < len(parts) else parts[i]
             for i in range(0, len(parts), 2)]
  return parts[0]


class Lowerer:
  """Builds the lane-wise UOp graph of one Kernel (step 2)."""

  def __init__(self, k: Kernel):
    self.k = k
    self.opts = k.opts
    self.full_shape = k.full_shape
    self.up_axes = k.upcasted_axes()
    # one lane coordinate per slot: a slot is one upcast axis, or (multireduce) several that no phase uses together
    self.slots = k.lane_slots()
    self.slot_of = {ax: j for j, slot in enumerate(self.slots) for ax in slot}
    self.up_sizes = [self.full_shape[slot[0]] for slot in self.slots]
    self.reduce_slots = [all(k._is_reduce_axis(ax) for ax in slot) for slot in self.slots]   # lanes of reduce axes
    self.up_reduce = [k._is_reduce_axis(ax) for ax in self.up_axes]   # upcast axes that are unrolled reduce axes
    self.lanes = list(itertools.product(*[range(s) for s in self.up_sizes]))
    self.acc_count = 0
    self.reduce_loops: tuple[UOp, ...] = ()
    self.lane_index = {ln: i for i, ln in enumerate(self.lanes)}
    self.valu = self.alu_vector_lanes()
    # staged load -> (shared array, view, offset); the copies of the next tiles, inside the reduce loops
    self.stage_views: dict[UOp, tuple[UOp, ShapeTracker, UOp | None]] = {}
    self.pipeline: list[UOp] = []
    self.up_strides: dict = {}   # view -> its strides along the upcast axes (lane_access)
    self.lane0: dict = {}        # (view, indices, zero_reduce) -> (indices, lane 0's (index, valid))

  def alu_vector_lanes(self) -> tuple[int, int] | None:
    """(upcast axis position, width) along which ALU ops work on whole vectors: the upcast axis along which the most
    loads (counted twice) and the output are contiguous. None when the device has no vector arithmetic."""
    if not self.opts.vector_alu: return None
    k = self.k
    def contiguous(j: int) -> int:
      score = [any(st.real_strides(ignore_valid=True)[ax] == 1 and st.shape[ax] == self.full_shape[ax]
                   for ax in self.slots[j])
               for st in k.sts]
      return score[0] + 2 * sum(score[1:])
    best, best_score = None, (0, 0)
    for j, size in enumerate(self.up_sizes):
      width = next((w for w in self.opts.vector_widths if w >= 4 and isinstance(size, int) and size % w == 0), 0)
      score = (contiguous(j), width) if width else (0, 0)
      if score[0] > 0 and score > best_score: best, best_score = (j, width), score
    return best

  def as_vector(self, vals: list[UOp]) -> tuple[UOp, bool]:
    """One vector UOp holding `vals` as lanes, and whether it is a real vector (the lanes of one vector value in
    order) rather than a broadcast or a gather of scalars."""
    first, n = vals[0], len(vals)
    if first.op is Ops.GEP and first.src[0].dtype.count == n and \
       all(v.op is Ops.GEP and v.src[0] is first.src[0] and v.arg == i for i, v in enumerate(vals)):
      return first.src[0], True
    return UOp(Ops.VECTORIZE, first.dtype.vec(n), tuple(vals)), False

  def vector_alu(self, op: Ops, dtype: DType, srcs: list[list[UOp]]) -> list[UOp] | None:
    """Lane values of `op` computed one vector per group of lanes along the vector axis, or None when no source is
    a real vector (then lane-wise scalars are as good)."""
    plan, real = [], False
    for group in self.group_lanes(self.valu, self.lanes):
      ins = []
      for src in srcs:
        vec, is_real = self.as_vector([src[self.lane_index[ln]] for ln in group])
        real |= is_real
        ins.append(vec)
      plan.append((group, ins))
    if not real: return None
    out: list[UOp] = [None] * len(self.lanes)  # type: ignore[list-item]
    for group, ins in plan:
      v = UOp(op, dtype.vec(len(group)), tuple(ins))
      for i, ln in enumerate(group): out[self.lane_index[ln]] = UOp(Ops.GEP, dtype, (v,), i)
    return out

  # ***** index variables *****
  def make_indices(self) -> list[UOp | None]:
    k, fs = self.k, self.full_shape
    idxs: list[UOp | None] = [None] * k.shape_len
    gsizes = list(fs[:k.global_dims])
    lsizes = list(fs[k.global_dims:k.first_reduce + k.group_for_reduces])
    self.outer_blocks: tuple[UOp, ...] = ()
    if self.opts.has_local:
      gids = _grouped_specials("gidx", gsizes, 3, 0)
      lids = _grouped_specials("lidx", lsizes, 3, 0) if not k.dont_use_locals else []
      if k.dont_use_locals and lsizes: raise AssertionError("locals on a kernel with NOLOCALS")
      if k.raster: gids = gids[:-2] + self.rastered(gids[-2], gids[-1], gsizes[-2], gsizes[-1], k.raster)
      idxs[:k.global_dims] = gids
      idxs[k.global_dims:k.first_reduce + k.group_for_reduces] = lids
    else:
      parent: UOp | None = None
      for i, s in enumerate(gsizes):
        if i == 0 and k.threads > 1:  # the THREAD axis: one OpenMP thread per index
          idxs[0] = UOp(Ops.SPECIAL, dtypes.index, (), SpecialArg("core0", 0, k.threads))
          continue
        parent = self.loop(f"gidx{i}", s, parent)
        idxs[i] = parent
      self.outer_blocks = (parent,) if parent is not None else ()
    self.global_idxs = idxs[:k.global_dims]
    return idxs

  @staticmethod
  def rastered(y: UOp, x: UOp, rows: int, cols, group: int) -> list[UOp]:
    """(row, column) of the block at launch position (y, x) when blocks go in groups of `group` rows, column by
    column within a group (kernel.apply_raster)."""
    linear = y * cols + x
    return [simplify((linear // (group * cols)) * group + linear % group), simplify((linear % (group * cols)) // group)]

  def loop(self, name: str, size, parent: UOp | None) -> UOp:
    end = size if isinstance(size, UOp) else UOp.const(dtypes.index, size)
    src = (UOp.const(dtypes.index, 0), end) + ((parent,) if parent is not None else ())
    return UOp(Ops.LOOP, dtypes.index, src, name)

  def lane_indices(self, base: list[UOp | None], lane: tuple[int, ...], zero_reduce: bool) -> list[UOp]:
    idxs = list(base)
    for ax, red in zip(self.up_axes, self.up_reduce):
      idxs[ax] = UOp.const(dtypes.index, 0 if zero_reduce and red else lane[self.slot_of[ax]])
    return [UOp.const(dtypes.index, 0) if i is None else i for i in idxs]

  def lane_access(self, st, base_idxs, ln: tuple[int, ...], zero_reduce: bool) -> tuple[UOp, UOp]:
    """(index, valid) of lane `ln` of an access through `st`. Where the view is affine along every upcast axis (and
    its validity does not depend on them), lane 0's index is built once and the others add a constant offset."""
    strides = self.up_strides.get(st)
    if strides is None: strides = self.up_strides[st] = tuple(st.real_strides()[ax] for ax in self.up_axes)
    if not all(isinstance(x, int) for x in strides): return st.expr_idxs(self.lane_indices(base_idxs, ln, zero_reduce))
    key = (st, id(base_idxs), zero_reduce)
    cached = self.lane0.get(key)
    if cached is None or cached[0] is not base_idxs:
      cached = self.lane0[key] = (base_idxs, st.expr_idxs(self.lane_indices(base_idxs, (0,) * len(ln), zero_reduce)))
    idx, valid = cached[1]
    offset = sum(0 if zero_reduce and red else ln[self.slot_of[ax]] * stride
                 for ax, red, stride in zip(self.up_axes, self.up_reduce, strides))
    return (idx + offset if offset else idx), valid

  # ***** memory *****
  def vector_axis(self, st, dtype: DType) -> tuple[int, int] | None:
    """The upcast axis (position in lanes) and width for float4/float2 access of this view, if one fits."""
    if not self.opts.supports_float4 or dtype not in self.opts.vector_dtypes: return None
    # on devices with vector arithmetic, contiguity regardless of padding: lanes whose validities differ become one
    # masked load (window_load)
    strides = st.real_strides(ignore_valid=self.opts.vector_alu)
    order = list(self.up_axes)
    if self.valu is not None: order.sort(key=lambda ax: self.slot_of[ax] != self.valu[0])
    for ax in order:
      size = self.full_shape[ax]
      if st.shape[ax] != size or strides[ax] != 1: continue
      for width in self.opts.vector_widths:
        if size % width == 0: return self.slot_of[ax], width
    return None

  def group_lanes(self, vec: tuple[int, int] | None, lanes: list[tuple[int, ...]]):
    """Lanes grouped by vector: each group is the lanes one vector access covers (a single lane when scalar)."""
    if vec is None: return [[ln] for ln in lanes]
    j, width = vec
    groups: dict[tuple, list] = {}
    for ln in lanes:
      key = ln[:j] + (ln[j] - ln[j] % width,) + ln[j + 1:]
      groups.setdefault(key, []).append(ln)
    return [sorted(g, key=lambda ln: ln[j]) for g in groups.values()]

  def load(self, access: UOp, st, buf: UOp, base_idxs, zero_reduce: bool, barrier: UOp | None = None,
           offset: UOp | None = None) -> list[UOp]:
    """One UOp per lane for a LOAD through view `st` (plus `offset`, which keeps vector alignment); vector loads
    where possible, gated where the view is masked."""
    dtype = access.dtype
    out: dict[tuple, UOp] = {}
    lanes = sorted(set(self.lane_key(ln, zero_reduce) for ln in self.lanes))
    vec = self.vector_axis(st, dtype)
    for group in self.group_lanes(vec, lanes):
      accesses = [self.lane_access(st, base_idxs, ln, zero_reduce) for ln in group]
      vectorize = len(group) > 1 and self.can_vectorize(accesses, len(group))
      if offset is not None: accesses = [(idx + offset, valid) for idx, valid in accesses]
      if len(group) > 1 and not vectorize:
        window = self.window_load(buf, accesses, dtype, barrier)
        for i, (ln, acc) in enumerate(zip(group, accesses)):
          out[ln] = self.emit_load(buf, acc, dtype, barrier) if window is None else UOp(Ops.GEP, dtype, (window,), i)
        continue
      if len(group) == 1:
        out[group[0]] = self.emit_load(buf, accesses[0], dtype, barrier)
        continue
      vload = self.emit_load(buf, accesses[0], dtype.vec(len(group)), barrier)
      for i, ln in enumerate(group): out[ln] = UOp(Ops.GEP, dtype, (vload,), i)
    return [out[self.lane_key(ln, zero_reduce)] for ln in self.lanes]

  def window_load(self, buf: UOp, accesses: list[tuple[UOp, UOp]], dtype: DType, barrier: UOp | None) -> UOp | None:
    """On devices with vector arithmetic, consecutive lanes whose validities differ (a padded row: a conv's image
    shifted by its kernel offset) as one masked vector load (MaskedLoad), or None where the lanes are not
    consecutive floats."""
    if not self.opts.vector_alu or not dtypes.is_float(dtype) or dtype not in self.opts.vector_dtypes: return None
    idx0 = accesses[0][0]
    if any(not self.is_const(idx - idx0, i) for i, (idx, _) in enumerate(accesses)): return None
    valids = tuple(valid for _, valid in accesses)
    if all(v.op is Ops.CONST and not v.arg for v in valids): return None   # nothing to read: scalar zeros fold away
    alt = UOp(Ops.VECTORIZE, dtype.vec(len(accesses)), (UOp.const(dtype, 0),) * len(accesses))
    extra = (barrier,) if barrier is not None else ()
    return UOp(Ops.LOAD, dtype.vec(len(accesses)), (buf, idx0) + valids + (alt,) + extra, MaskedLoad())

  @staticmethod
  def is_const(x: UOp, value: int) -> bool:
    x = simplify(x)
    return x.op is Ops.CONST and x.arg == value

  def lane_key(self, ln: tuple[int, ...], zero_reduce: bool) -> tuple[int, ...]:
    if not zero_reduce: return ln
    return tuple(0 if red else v for red, v in zip(self.reduce_slots, ln))

  def can_vectorize(self, accesses: list[tuple[UOp, UOp]], width: int) -> bool:
    (idx0, valid0) = accesses[0]
    if any(v is not valid0 for _, v in accesses): return False
    return self.is_const(idx0 % width, 0) and all(self.is_const(idx - idx0, i) for i, (idx, _) in enumerate(accesses))

  def emit_load(self, buf: UOp, access: tuple[UOp, UOp], dtype: DType, barrier: UOp | None) -> UOp:
    idx, valid = access
    alt = UOp.const(dtype.scalar, 0)
    alt = alt if dtype.count == 1 else UOp(Ops.VECTORIZE, dtype, (alt,) * dtype.count)
    if valid.op is Ops.CONST and not valid.arg: return alt
    extra = (barrier,) if barrier is not None else ()
    if valid.op is Ops.CONST: return UOp(Ops.LOAD, dtype, (buf, idx) + extra)
    return UOp(Ops.LOAD, dtype, (buf, idx, valid, alt) + extra)

  def store(self, st, buf: UOp, base_idxs, values: list[UOp], zero_reduce: bool, extra=()) -> list[UOp]:
    lanes = sorted(set(self.lane_key(ln, zero_reduce) for ln in self.lanes))
    by_lane = dict(zip(self.lanes, values))
    dtype = values[0].dtype
    vec = self.vector_axis(st, dtype)
    stores = []
    for group in self.group_lanes(vec, lanes):
      accesses = [self.lane_access(st, base_idxs, ln, zero_reduce) for ln in group]
      for _, valid in accesses:
        if not (valid.op is Ops.CONST and valid.arg): raise AssertionError("stores are always valid")
      if len(group) > 1 and self.can_vectorize(accesses, len(group)):
        value = self.as_vector([by_lane[ln] for ln in group])[0]
        stores.append(UOp(Ops.STORE, dtypes.void, (buf, accesses[0][0], value) + extra))
      else:
        stores.extend(UOp(Ops.STORE, dtypes.void, (buf, a[0], by_lane[ln]) + extra) for ln, a in zip(group, accesses))
    return stores

  # ***** the AST *****
  def lower(self) -> UOp:
    k = self.k
    idxs = self.make_indices()
    self.values: dict[UOp, list[UOp]] = {}
    reduce_result: list[UOp] | None = None
    gate: UOp | None = None
    if k.reduceop is not None:
      reduce_result, gate, idxs = self.lower_reduce(k.reduceop, idxs)
      self.values[k.reduceop] = reduce_result
      ending = self.pipeline_barrier(reduce_result)
      self.stage_views = {}   # loads after the reduce read the buffers themselves
      if ending is not None:
        sink = self.lower_stores(idxs, gate)
        return UOp(Ops.SINK, dtypes.void, (ending,) + sink.src)
    return self.lower_stores(idxs, gate)

  def lower_stores(self, idxs, gate: UOp | None) -> UOp:
    """The kernel's STOREs of the values outside every reduce (behind `gate` when one thread writes), as the SINK."""
    k = self.k
    stores: list[UOp] = []
    for access in k.accesses:
      if access.op is not Ops.STORE: continue
      st = k.sts[k.accesses.index(access)]
      vals = self.lower_node(access.src[2], idxs, zero_reduce=True)
      stores += self.store(st, access.src[0], idxs, vals, zero_reduce=True, extra=(gate,) if gate is not None else ())
    return UOp(Ops.SINK, dtypes.void, tuple(stores))

  def lower_node(self, root: UOp, idxs, zero_reduce: bool, barrier: UOp | None = None) -> list[UOp]:
    """Lane-wise UOps of an AST subgraph (stopping at an already lowered REDUCE)."""
    for node in root.toposort():
      if node in self.values: continue
      if node.op is Ops.REDUCE: raise AssertionError("REDUCE must be lowered before its consumers")
      if node.op in (Ops.VIEW, Ops.DEFINE_GLOBAL): continue
      self.values[node] = self.lower_one(node, idxs, zero_reduce, barrier)
    return self.values[root]

  def lower_one(self, node: UOp, idxs, zero_reduce: bool, barrier) -> list[UOp]:
    k = self.k
    if node.op is Ops.LOAD:
      if node in self.stage_views:
        buf, st, offset = self.stage_views[node]
        return self.load(node, st, buf, idxs, zero_reduce, barrier, offset)
      st = k.sts[k.accesses.index(node)]
      return self.load(node, st, node.src[0], idxs, zero_reduce, barrier)
    if node.op is Ops.CONST:
      st = k.sts[k.accesses.index(node)] if node.src else None
      c = UOp.const(node.dtype, node.arg)
      if st is None: return [c] * len(self.lanes)
      out = []
      for ln in self.lanes:
        _, valid = self.lane_access(st, idxs, self.lane_key(ln, zero_reduce), zero_reduce)
        out.append(c if valid.op is Ops.CONST and valid.arg else valid.where(c, UOp.const(node.dtype, 0)))
      return out
    srcs = [self.values[s] for s in node.src]
    if node.op in GroupOp.ALU:
      if self.valu is not None and node.op in VECTOR_ALU_OPS and node.dtype in self.opts.vector_dtypes and \
         dtypes.is_float(node.dtype) and all(s.dtype is node.dtype for s in node.src):
        vec = self.vector_alu(node.op, node.dtype, srcs)
        if vec is not None: return vec
      return [UOp(node.op, node.dtype, tuple(v)) for v in zip(*srcs)]
    if node.op in (Ops.CAST, Ops.BITCAST): return [UOp(node.op, node.dtype, (v,)) for v in srcs[0]]
    raise NotImplementedError(f"lower: no lowering for {node.op} in a kernel AST")

  # ***** reduce *****
  def reduce_identity(self, op: Ops, dtype: DType) -> UOp:
    if op is Ops.ADD: return UOp.const(dtype, 0)
    return UOp.const(dtype, -math.inf if dtypes.is_float(dtype) else dtypes.min(dtype))

  def accumulate(self, op: Ops, dtype: DType, values: list[UOp], lanes_to_acc: dict, enclosing: tuple,
                 loops: tuple[UOp, ...], lanes: list[tuple[int, ...]] | None = None) -> dict:
    """DEFINE_ACC per output lane, updated through PHI by every lane's value (in lane order). Each PHI names the
    reduce loops it runs in (after its two sources), so placement keeps the update inside them even when the
    value added does not depend on them. When there are few lanes, unrolled reduce lanes get accumulators of their
    own, combined after the loop: independent chains instead of one chain of dependent adds per output."""
    lanes = self.lanes if lanes is None else lanes
    if self.valu is not None and op in (Ops.ADD, Ops.MAX) and dtype in self.opts.vector_dtypes and \
       dtypes.is_float(dtype) and all(v is not None for v in values):
      vec = self.vector_accumulate(op, dtype, values, lanes_to_acc, enclosing, loops, lanes)
      if vec is not None: return vec
    split = len(lanes) <= MAX_PARTIAL_ACCS and len(set(lanes_to_acc.values())) < len(lanes)
    acc_of = {ln: ln for ln in lanes} if split else lanes_to_acc
    accs: dict[tuple, UOp] = {}
    for key in dict.fromkeys(acc_of.values()):
      accs[key] = UOp(Ops.DEFINE_ACC, dtype, (self.reduce_identity(op, dtype),) + enclosing, self.acc_count)
      self.acc_count += 1
    for ln, val in zip(lanes, values):
      key = acc_of[ln]
      if val is None: continue
      new = UOp(op, dtype, (accs[key], val))
      accs[key] = UOp(Ops.PHI, dtype, (accs[key], new) + loops)
    if not split: return accs
    partials: dict[tuple, list[UOp]] = {}
    for ln in lanes: partials.setdefault(lanes_to_acc[ln], []).append(accs[ln])
    return {key: _tree(op, dtype, parts) for key, parts in partials.items()}

  def vector_accumulate(self, op: Ops, dtype: DType, values: list[UOp], lanes_to_acc: dict, enclosing: tuple,
                        loops: tuple[UOp, ...], lanes: list[tuple[int, ...]]) -> dict | None:
    """One vector accumulator per group of lanes along the vector axis (when every group's values are a real
    vector), or, past MAX_PARTIAL_ACCS groups, one per group of outputs, updated by each of its groups in turn (a
    conv's unrolled kernel taps); after the loop, each output combines its lanes' partials in a balanced tree."""
    groups = self.group_lanes(self.valu, lanes)
    if any(len(g) != self.valu[1] for g in groups): return None   # the vector slot is not one this reduce varies along
    position = {ln: i for i, ln in enumerate(lanes)}
    vecs = [self.as_vector([values[position[ln]] for ln in g]) for g in groups]
    if not all(real for _, real in vecs): return None
    split = len(groups) <= MAX_PARTIAL_ACCS
    ident = self.reduce_identity(op, dtype)
    by_keys: dict[tuple, list[UOp]] = {}   # accumulators whose lanes feed the same outputs, lane for lane
    for group, (vec, _) in zip(groups, vecs):
      vdt, keys = dtype.vec(len(group)), tuple(lanes_to_acc[ln] for ln in group)
      if split or keys not in by_keys:
        acc = UOp(Ops.DEFINE_ACC, vdt, (UOp(Ops.VECTORIZE, vdt, (ident,) * len(group)),) + enclosing, self.acc_count)
        self.acc_count += 1
        by_keys.setdefault(keys, []).append(UOp(Ops.PHI, vdt, (acc, UOp(op, vdt, (acc, vec))) + loops))
      else:   # the same accumulator again: chain the update
        acc = by_keys[keys][-1]
        by_keys[keys][-1] = UOp(Ops.PHI, vdt, (acc, UOp(op, vdt, (acc, vec))) + loops)
    partials: dict[tuple, list[UOp]] = {}
    for keys, accs in by_keys.items():
      total = _tree(op, accs[0].dtype, accs)   # whole vectors first, then lanes that share an output
      for i, key in enumerate(keys): partials.setdefault(key, []).append(UOp(Ops.GEP, dtype, (total,), i))
    return {key: _tree(op, dtype, parts) for key, parts in partials.items()}

  def lower_reduce(self, red: UOp, idxs):
    k = self.k
    arg: ReduceArg = red.arg
    fs = self.full_shape
    first_loop = k.first_reduce + k.group_for_reduces
    parent = self.outer_blocks[-1] if self.outer_blocks else None
    for i in range(first_loop, k.first_upcast):
      parent = self.loop(f"ridx{i - first_loop}", fs[i], parent)
      idxs[i] = parent
    self.reduce_loops = (parent,) if first_loop < k.first_upcast else ()
    out_key = {ln: self.lane_key(ln, True) for ln in self.lanes}
    staged = self.stage_tiles(idxs) if k.staged else None
    if k.tensor_core is not None:
      accs = self.lower_tensor_cores(red, idxs, staged)
      return [UOp(Ops.CAST, red.dtype, (accs[out_key[ln]],)) if red.dtype is not dtypes.float32
              else accs[out_key[ln]] for ln in self.lanes], None, idxs
    values = self.lower_node(red.src[0], idxs, zero_reduce=False, barrier=staged)
    accs = self.accumulate(arg.op, red.dtype, values, out_key, self.outer_blocks, self.reduce_loops)
    for n in list(self.values):  # values inside the reduce are not visible after it
      if n is not red: del self.values[n]
    if k.group_for_reduces == 0:
      return [accs[out_key[ln]] for ln in self.lanes], None, idxs
    return self.group_reduce(red, arg, accs, out_key, idxs)

  def stage_tiles(self, idxs) -> UOp:
    """Copy the tiles of the staged loads into shared memory (kernel.StagedLoad) and point those loads at them;
    returns the barrier that every read of a tile waits for.

    Inside reduce loops each load has a ring of S tiles (kernel.stages): the tiles of the first S - 1 iterations
    are copied before the loops; iteration s starts the copy of tile s + S - 1 into the slot that iteration s - 1
    read, computes from slot s % S, and ends at one barrier (`pipeline_barrier`, after the reads and the copy). A
    thread refills a slot only after the barrier that every thread reaches after reading it, so one barrier per
    iteration suffices. On CUDA the copies are asynchronous (cp.async) and the barrier waits only for tile s + 1:
    S - 1 tiles are in flight while one is computed. When wgmma batches stay in flight past the barrier
    (WGMMAArg.in_flight), the copies run that many tiles less ahead, so a slot is refilled only after the batch
    reading it has finished."""
    k, fs = self.k, self.full_shape
    loops = list(range(k.first_reduce, k.first_upcast))
    block = list(range(k.global_dims, k.first_reduce))
    tid = UOp.const(dtypes.index, 0)
    for ax in block: tid = tid * fs[ax] + idxs[ax]
    threads = int(prod(fs[ax] for ax in block))
    zero = UOp.const(dtypes.index, 0)
    base = [zero if i is None or (k.global_dims <= ax < k.first_reduce) else i for ax, i in enumerate(idxs)]
    step = zero
    for ax in loops: step = step * fs[ax] + idxs[ax]
    total, stages, ahead = int(prod(fs[ax] for ax in loops)), k.stages, k.copy_ahead
    def at(flat: UOp) -> list[UOp]:   # the indices of the tile of iteration `flat` (past the end: wraps around)
      out, rest = list(base), flat % total
      for ax in reversed(loops):
        out[ax] = simplify(rest % fs[ax])
        rest = rest // fs[ax]
      return out
    prologue: list[UOp] = []
    for n, plan in enumerate(k.staged):
      access, st = k.accesses[plan.access], k.sts[plan.access]
      dtype = access.src[0].dtype.base
      buf = UOp(Ops.DEFINE_LOCAL, dtype.ptr(local=True), (), LocalArg(f"stage{n}", plan.size * stages,
                                                                      1024 if plan.swizzled else 16))
      if loops:
        for j in range(ahead):
          prologue += self.copy_tile(plan, st, access.src[0], buf, at(UOp.const(dtypes.index, j)), tid, threads,
                                     UOp.const(dtypes.index, j * plan.size) if j else None)
        nxt = step + ahead
        self.pipeline += self.copy_tile(plan, st, access.src[0], buf, at(nxt), tid, threads,
                                        simplify((nxt % stages) * plan.size))
        offset = simplify((step % stages) * plan.size)
      else:
        prologue += self.copy_tile(plan, st, access.src[0], buf, base, tid, threads, None)
        offset = None
      strides = [0] * k.shape_len
      for ax, stride in zip(plan.axes, plan.strides): strides[ax] = stride
      self.stage_views[access] = (buf, ShapeTracker((View.create(fs, tuple(strides)),)), offset)
    return UOp(Ops.BARRIER, dtypes.void, tuple(prologue))

  def pipeline_barrier(self, results: list[UOp]) -> UOp | None:
    """The barrier that ends an iteration of a pipelined staged reduce: after the copy of the next tiles and every
    read of this iteration's (found under `results`). It leads the SINK, so the copies are emitted first."""
    if not self.pipeline: return None
    bufs = {buf for buf, _, _ in self.stage_views.values()}
    # after the reads; the math on them may follow it (timed on the H200: a barrier after the accumulator updates
    # too was 5 % slower, bench/NOTES.md run 11)
    reads = [u for u in UOp(Ops.SINK, dtypes.void, tuple(results)).toposort()
             if (u.op is Ops.LOAD and u.src[0] in bufs) or (u.op is Ops.WMMA and isinstance(u.arg, WGMMAArg))]
    # arg: how many iterations' copies may still be in flight after it (the tile read next must have landed)
    return UOp(Ops.BARRIER, dtypes.void, tuple(self.pipeline) + tuple(dict.fromkeys(reads)), self.k.copy_ahead - 1)

  def copy_tile(self, plan: StagedLoad, st, src: UOp, buf: UOp, base: list[UOp], tid: UOp, threads: int,
                offset: UOp | None) -> list[UOp]:
    """The block's copy of one tile: thread `tid` copies vectors tid, tid + threads, ... of the tile (in the
    buffer's order, so neighbouring threads read neighbouring memory). Along the row (the axes contiguous in both
    the buffer and the shared array) a vector is 16, 8 or 4 bytes where the row and its alignment allow: raw
    element vectors, no conversion."""
    fs, dtype = self.full_shape, src.dtype.base
    lead, run = plan.axes[:len(plan.axes) - plan.row], plan.axes[len(plan.axes) - plan.row:]
    row = int(prod(fs[ax] for ax in run))
    zero = UOp.const(dtypes.index, 0)
    widths = [w for w in (16 // dtype.itemsize, 8 // dtype.itemsize, 4 // dtype.itemsize) if w > 1]
    for w in widths + [1]:
      if row % w or plan.elements % (threads * w): continue
      out = []
      for e in range(plan.elements // (threads * w)):
        q = tid + e * threads
        along, rest = (q % (row // w)) * w, q // (row // w)   # position in the row, and which row
        coords = []
        for ax in reversed(lead):
          coords.append(rest % fs[ax])
          rest = rest // fs[ax]
        idx = list(base)
        for ax, c in zip(reversed(lead), coords): idx[ax] = c
        for ax in run: idx[ax] = zero
        start, valid = st.expr_idxs([simplify(x) for x in idx])
        first = (simplify(start + along), valid)
        # the w lanes are consecutive by construction: a vector needs an ungated, aligned first lane
        if w > 1 and not (valid.op is Ops.CONST and self.is_const(first[0] % w, 0)): break
        smem = sum((c * plan.strides[plan.axes.index(ax)] for ax, c in zip(reversed(lead), coords)), along)
        if plan.swizzled:   # (row, column) of the plain matrix -> its place in the panels, swizzled
          smem = swizzle(panel_offset(smem // plan.run, along, plan.elements // plan.run))
        where = simplify(smem) if offset is None else simplify(smem) + offset
        value = self.emit_load(src, first, dtype.vec(w) if w > 1 else dtype, None)
        out.append(UOp(Ops.STORE, dtypes.void, (buf, where, value)))
      else:
        return out
    raise AssertionError("copy_tile: no copy width fits (a width of 1 always does)")

  def lower_tensor_cores(self, red: UOp, idxs, staged: UOp | None) -> dict:
    """One WMMA per combination of the non-TC upcast lanes; fragments are loaded per the m16n8k16 layout (from the
    shared tiles when the loads are staged)."""
    if self.k.wgmma is not None: return self.lower_wgmma(idxs, staged)
    k, plan = self.k, self.k.tensor_core
    g, t = idxs[k.first_reduce - 2], idxs[k.first_reduce - 1]
    ax_g, ax_t = k.first_reduce - 2, k.first_reduce - 1
    ax_nl, ax_mh, ax_k = k.first_upcast, k.first_upcast + 1, k.first_upcast + 2
    pos = self.slot_of   # a TC kernel has one reduce: one slot per upcast axis
    others = [j for j in range(len(self.up_axes)) if self.up_axes[j] not in (ax_nl, ax_mh, ax_k)]
    st_a, st_b = k.sts[k.accesses.index(plan.a)], k.sts[k.accesses.index(plan.b)]
    zero = UOp.const(dtypes.index, 0)

    def fragment(st, load_uop: UOp, lane, axis_values: dict) -> UOp:
      base = self.lane_indices(idxs, lane, zero_reduce=False)
      for ax, v in axis_values.items(): base[ax] = v
      buf, offset = load_uop.src[0], None
      if load_uop in self.stage_views: buf, st, offset = self.stage_views[load_uop]
      idx, valid = st.expr_idxs([simplify(x) for x in base])
      load = self.emit_load(buf, (idx if offset is None else idx + offset, valid), buf.dtype.base, staged)
      return load if load.dtype is plan.dtype_in else UOp(Ops.CAST, plan.dtype_in, (load,))
    def registers(load_uop: UOp, lane, operand: str) -> list[UOp] | None:
      """A's 4 or B's 2 fragment registers read with one ldmatrix from the shared tile, or None when the load is
      not staged or the tile's layout does not give ldmatrix 16-byte rows of 8 elements along k (or, transposed,
      along m or n)."""
      if load_uop not in self.stage_views: return None
      buf, sst, offset = self.stage_views[load_uop]
      strides = sst.views[0].strides
      q_run = {ax_g: 1} if operand == "a" else {ax_nl: 1, ax_t: 2}   # m (or n) contiguous: the transposed form
      if buf.dtype.base.itemsize != 2: return None
      if strides[ax_k] == 1: trans, run = False, {ax_k: 1}
      elif all(strides[ax] == s for ax, s in q_run.items()): trans, run = True, q_run
      else: return None
      if any(s % 8 for ax, s in enumerate(strides) if ax not in run): return None   # 16-byte aligned rows
      matrix, row = ldmatrix_lane(g, t)
      base = self.lane_indices(idxs, lane, zero_reduce=False)
      first = 0   # the register this lane's fragment starts at
      if operand == "a":   # matrix j: m + 8 (j % 2), k + 8 (j // 2)
        count, q_off, p_off = 4, (matrix % 2) * 8, (matrix // 2) * 8
      else:                # matrix j: k + 8 (j % 2); j // 2: the next N tile, when an N tile axis pairs them
        count, q_off, p_off = 2, zero, (matrix % 2) * 8
        if pair is not None:
          at = lane[pos[pair]]
          count, first = 4, 2 * (at % 2)
          base[pair] = UOp.const(dtypes.index, at - at % 2) + matrix // 2
      q, kk = (q_off, p_off + row) if trans else (q_off + row, p_off)
      values = {ax_g: q % 8, ax_mh: q // 8, ax_t: zero, ax_nl: zero} if operand == "a" else \
               {ax_t: q // 2, ax_nl: q % 2, ax_g: zero, ax_mh: zero}
      for ax, v in values.items(): base[ax] = v
      base[ax_k] = kk
      idx, _ = sst.expr_idxs([simplify(x) for x in base])
      ld = UOp(Ops.LOAD, dtypes.uint32.vec(count), (buf, idx + offset if offset is not None else idx, staged),
               MatrixLoad(count, trans))
      return [UOp(Ops.GEP, dtypes.uint32, (ld,), i) for i in range(first, first + (4 if operand == "a" else 2))]
    # an upcast axis of N tiles (B moves along it, A does not): B's ldmatrix reads two neighbouring tiles at once
    sa_all, sb_all = st_a.real_strides(), st_b.real_strides()
    pair = next((self.up_axes[j] for j in others if sa_all[self.up_axes[j]] == 0 and sb_all[self.up_axes[j]] != 0
                 and self.up_sizes[j] % 2 == 0), None)
    accs: dict[tuple, UOp] = {}
    for other in itertools.product(*[range(self.up_sizes[j]) for j in others]):
      lane = [0] * len(self.up_axes)
      for j, v in zip(others, other): lane[j] = v
      a_regs, b_regs = registers(plan.a, tuple(lane), "a"), registers(plan.b, tuple(lane), "b")
      packed = a_regs is not None and b_regs is not None
      a_vals, b_vals = (a_regs, b_regs) if packed else ([], [])
      for i in range(0 if packed else A_REGS):
        m, kk = a_pos(g, t, i)
        a_vals.append(fragment(st_a, plan.a, tuple(lane), {ax_g: m % 8, ax_mh: m // 8, ax_k: kk, ax_t: zero,
                                                                  ax_nl: zero}))
      for i in range(0 if packed else B_REGS):
        kk, n = b_pos(g, t, i)
        b_vals.append(fragment(st_b, plan.b, tuple(lane), {ax_t: n // 2, ax_nl: n % 2, ax_k: kk, ax_g: zero,
                                                                  ax_mh: zero}))
      keys = []
      for i in range(C_REGS):
        acc_lane = list(lane)
        acc_lane[pos[ax_mh]], acc_lane[pos[ax_nl]] = i >> 1, i & 1
        keys.append(self.fp32_accumulator(accs, acc_lane))
      wmma = UOp(Ops.WMMA, dtypes.float32.vec(4), tuple(a_vals + b_vals + [accs[key] for key in keys]),
                 WMMAArg(plan.dtype_in, dtypes.float32, packed=packed))
      self.update_accumulators(accs, keys, wmma)
    return accs

  def fp32_accumulator(self, accs: dict, acc_lane: list[int]) -> tuple:
    """The key in `accs` of the tensor cores' fp32 accumulator of an output lane (defined on first use)."""
    key = self.lane_key(tuple(acc_lane), True)
    if key not in accs:
      accs[key] = UOp(Ops.DEFINE_ACC, dtypes.float32, (UOp.const(dtypes.float32, 0),) + self.outer_blocks,
                      self.acc_count)
      self.acc_count += 1
    return key

  def update_accumulators(self, accs: dict, keys: list[tuple], wmma: UOp) -> None:
    """Result i of a WMMA is the new value of accumulator keys[i]."""
    for i, key in enumerate(keys):
      accs[key] = UOp(Ops.PHI, dtypes.float32, (accs[key], UOp(Ops.GEP, dtypes.float32, (wmma,), i)) +
                      self.reduce_loops)

  def lower_wgmma(self, idxs, staged: UOp) -> dict:
    """One wgmma per lane of the upcast axes it does not cover (M tiles, unrolled K), reading the swizzled tiles
    from the origin of its part (kernel.WGMMAPlan); its N / 2 results are this thread's C fragments of the N / 8
    tiles, in order."""
    k, tc, wg = self.k, self.k.tensor_core, self.k.wgmma
    ax_nl, ax_mh, ax_k = k.first_upcast, k.first_upcast + 1, k.first_upcast + 2
    covered = {ax_nl, ax_mh, ax_k, *wg.n_axes}
    others = [j for j in range(len(self.up_axes)) if self.up_axes[j] not in covered]
    instruction_axes = covered | set(range(k.first_reduce - 3, k.first_reduce))   # and the warp's (w, g, t)
    plans = {k.accesses[p.access]: p for p in k.staged}
    def origin(load: UOp, lane: tuple[int, ...]) -> tuple[UOp, UOp]:
      """(shared array, element offset) where this wgmma's part of the tile starts (its first row and column)."""
      p, (buf, _, slot) = plans[load], self.stage_views[load]
      at = self.lane_indices(idxs, lane, zero_reduce=False)
      row, col = UOp.const(dtypes.index, 0), UOp.const(dtypes.index, 0)
      for ax, stride in zip(p.axes, p.strides):
        if ax in instruction_axes: continue
        if stride < p.run: col = col + at[ax] * stride
        else: row = row + at[ax] * (stride // p.run)
      start = simplify(panel_offset(row, col, p.elements // p.run))
      return buf, start if slot is None else simplify(start + slot)
    sizes = [self.up_sizes[self.slot_of[ax]] for ax in wg.n_axes]
    accs: dict[tuple, UOp] = {}
    for other in itertools.product(*[range(self.up_sizes[j]) for j in others]):
      lane = [0] * len(self.up_axes)
      for j, v in zip(others, other): lane[j] = v
      keys = []
      for tile in itertools.product(*[range(s) for s in reversed(sizes)]):   # N tiles, the fastest axis last
        for i in range(C_REGS):
          acc_lane = list(lane)
          for ax, v in zip(reversed(wg.n_axes), tile): acc_lane[self.slot_of[ax]] = v
          acc_lane[self.slot_of[ax_mh]], acc_lane[self.slot_of[ax_nl]] = i >> 1, i & 1
          keys.append(self.fp32_accumulator(accs, acc_lane))
      a_buf, a_start = origin(tc.a, tuple(lane))
      b_buf, b_start = origin(tc.b, tuple(lane))
      wmma = UOp(Ops.WMMA, dtypes.float32.vec(len(keys)),
                 (a_buf, a_start, b_buf, b_start) + tuple(accs[key] for key in keys) + (staged,), wg.arg)
      self.update_accumulators(accs, keys, wmma)
    return accs

  def group_reduce(self, red: UOp, arg: ReduceArg, accs: dict, out_key: dict, idxs):
    """Partial results of each thread meet in shared memory; the thread with group index 0 finishes."""
    k = self.k
    fs = self.full_shape
    local_axes = list(range(k.global_dims, k.first_reduce))
    group_axes = list(range(k.first_reduce, k.first_reduce + k.group_for_reduces))
    out_lanes = list(dict.fromkeys(out_key.values()))
    thread_idx = [idxs[i] for i in local_axes + group_axes]
    temp, temp_index, barrier = self.stage_partials(red.dtype, "temp", [fs[i] for i in local_axes + group_axes],
                                                    thread_idx, [accs[key] for key in out_lanes])
    late_idx = list(idxs)
    for i in group_axes: late_idx[i] = UOp.const(dtypes.index, 0)
    size = fs[group_axes[0]]
    if len(group_axes) == 1 and isinstance(size, int) and size & (size - 1) == 0:
      tid = idxs[group_axes[0]]
      def index(g: UOp, n: int) -> UOp: return temp_index(thread_idx[:-1] + [g], n)
      barrier = self.halving_tree(temp, index, tid, size, arg.op, red.dtype, len(out_lanes), barrier)
      gate = UOp(Ops.IF, dtypes.void, (simplify(tid.eq(0)), barrier))
      zero = UOp.const(dtypes.index, 0)
      totals = {key: UOp(Ops.LOAD, red.dtype, (temp, index(zero, n), barrier)) for n, key in enumerate(out_lanes)}
      return [totals[out_key[ln]] for ln in self.lanes], gate, late_idx
    first = UOp.const(dtypes.bool, True)
    for i in group_axes: first = first & idxs[i].eq(0)
    gate = UOp(Ops.IF, dtypes.void, (simplify(first), barrier))
    # second stage: loop over the group inside the gate
    parent = gate
    group_loops = []
    for j, i in enumerate(group_axes):
      parent = self.loop(f"tidx{j}", fs[i], parent)
      group_loops.append(parent)
    local_part = [idxs[i] for i in local_axes] + group_loops
    accs2 = {}
    for n, key in enumerate(out_lanes):
      acc = UOp(Ops.DEFINE_ACC, red.dtype, (self.reduce_identity(arg.op, red.dtype), gate), self.acc_count)
      self.acc_count += 1
      partial = UOp(Ops.LOAD, red.dtype, (temp, temp_index(local_part, n), barrier))
      accs2[key] = UOp(Ops.PHI, red.dtype, (acc, UOp(arg.op, red.dtype, (acc, partial))) + tuple(group_loops))
    return [accs2[out_key[ln]] for ln in self.lanes], gate, late_idx

  def stage_partials(self, dtype: DType, name: str, sizes: list, ids: list[UOp], values: list[UOp]):
    """Every thread stores its partials in a shared buffer laid out [partial][thread ids], then a barrier. Returns
    the buffer, `index(ids, n)` (partial n of the thread with those ids) and the barrier."""
    threads = int(prod(sizes))
    temp = UOp(Ops.DEFINE_LOCAL, dtype.ptr(local=True), (), LocalArg(name, threads * len(values)))

    def index(at: list[UOp], n: int) -> UOp:
      flat = UOp.const(dtypes.index, 0)
      for i, size in zip(at, sizes): flat = flat * size + i
      return simplify(flat + n * threads)
    stores = tuple(UOp(Ops.STORE, dtypes.void, (temp, index(ids, n), v)) for n, v in enumerate(values))
    return temp, index, UOp(Ops.BARRIER, dtypes.void, stores)

  def halving_tree(self, temp: UOp, index, tid: UOp, size: int, op: Ops, dtype: DType, count: int,
                   barrier: UOp) -> UOp:
    """Combine `size` partials along thread id `tid` in shared memory in log2(size) steps: in each, the lower half of
    the threads combines its values with the upper half's, then all wait at a barrier. `index(g, n)` addresses
    partial n of the thread whose group id is g. Returns the last barrier, after which group id 0 holds the totals
    (a serial loop over the partials in one thread took ~size shared-memory latencies)."""
    half = size // 2
    while half >= 1:
      active = simplify(tid < half)
      gate = UOp(Ops.IF, dtypes.void, (active, barrier))
      step = []
      for n in range(count):
        mine = self.emit_load(temp, (index(tid, n), active), dtype, barrier)
        other = self.emit_load(temp, (index(tid + half, n), active), dtype, barrier)
        step.append(UOp(Ops.STORE, dtypes.void, (temp, index(tid, n), UOp(op, dtype, (mine, other)), gate)))
      barrier = UOp(Ops.BARRIER, dtypes.void, tuple(step))
      half //= 2
    return barrier


# ***** several reduces in one kernel *****

class MultiLowerer(Lowerer):
  """A kernel whose reduces have private axes (fused softmax/layernorm): each reduce runs its own loops (and thread
  group) inside only the outer loops it depends on, one after another; its result is broadcast to the phases that use
  it; the elementwise output comes last. On devices with thread blocks, the axes of different phases share thread
  ids and lanes (kernel.thread_slots / lane_slots), grouped reduces end with every thread reading all partials (no
  gate: all threads go on), and global axes that not every reduce depends on become loops, not grid dims."""

  def make_indices(self) -> list[UOp | None]:
    k, fs = self.k, self.full_shape
    idxs: list[UOp | None] = [None] * k.shape_len
    self.global_loops: dict[int, UOp] = {}
    deps = [k.phase_axes(r) for r in k.reduceops]
    parent: UOp | None = None
    if self.opts.has_local:
      grid = [i for i in range(k.global_dims) if all(i in d for d in deps)]
      for i, g in zip(grid, _grouped_specials("gidx", [fs[i] for i in grid], 3, 0)): idxs[i] = g
      self.thread_slots = k.thread_slots() if not k.dont_use_locals else []
      self.thread_ids = _grouped_specials("lidx", [fs[slot[0]] for slot in self.thread_slots], 3, 0)
      for slot, tid in zip(self.thread_slots, self.thread_ids):
        for ax in slot: idxs[ax] = tid
      loop_axes = [i for i in range(k.global_dims) if i not in grid]
    else:
      self.thread_slots, self.thread_ids = [], []
      loop_axes = list(range(k.global_dims))
      if k.threads > 1:
        idxs[0] = UOp(Ops.SPECIAL, dtypes.index, (), SpecialArg("core0", 0, k.threads))
        loop_axes = loop_axes[1:]
    # the axes the reduces vary along outermost: a reduce then runs once per index of them, not once per index of
    # every loop outside them (softmax over axis 0: the column loop outside, the row loop inside)
    used = set().union(*deps) if deps else set()
    loop_axes = [i for i in loop_axes if i in used] + [i for i in loop_axes if i not in used]
    for i in loop_axes:   # (named apart from the grid ids, which are numbered from 0 too)
      parent = self.loop(f"{'oidx' if self.opts.has_local else 'gidx'}{i}", fs[i], parent)
      idxs[i] = self.global_loops[i] = parent
    self.outer_blocks = (parent,) if parent is not None else ()
    self.loop_count = 0
    self.trailing: list[UOp] = []   # barriers after shared totals are read inside a loop (see share_partials)
    return idxs

  def lower(self) -> UOp:
    k = self.k
    idxs = self.make_indices()
    self.values = {}
    for r in k.reduceops:
      self.values[r] = self.lower_one_reduce(r, idxs)
      for n in list(self.values):  # values inside a reduce body depend on its loops
        if n.op is not Ops.REDUCE: del self.values[n]
    store_axes = k.phase_axes(None)
    gate: UOp | None = None
    idle = [tid for slot, tid in zip(self.thread_slots, self.thread_ids) if not any(ax in store_axes for ax in slot)]
    if idle:  # thread ids the output does not vary along: one thread writes
      cond = UOp.const(dtypes.bool, True)
      for tid in idle: cond = cond & tid.eq(0)
      gate = UOp(Ops.IF, dtypes.void, (simplify(cond),) + self.outer_blocks)   # inside the output loops
    sink = self.lower_stores(idxs, gate)
    return UOp(Ops.SINK, dtypes.void, sink.src + tuple(self.trailing))

  def lower_one_reduce(self, r: UOp, idxs: list[UOp | None]) -> list[UOp]:
    k, fs = self.k, self.full_shape
    own = k.own_axes(r)
    deps = k.phase_axes(r) - own
    first_loop = k.first_reduce + k.group_for_reduces
    # the reduce runs inside the outer loops it depends on, and only those
    # the innermost of the loops it depends on (they are outermost, in the order make_indices nested them)
    outer = [loop for i, loop in self.global_loops.items() if i in deps]
    parent = outer[-1] if outer else None
    enclosing = (parent,) if parent is not None else ()
    ridxs = list(idxs)
    for i in sorted(a for a in own if first_loop <= a < k.first_upcast):
      parent = self.loop(f"ridx{self.loop_count}", fs[i], parent)
      self.loop_count += 1
      ridxs[i] = parent
    loops = (parent,) if parent is not None and parent not in enclosing else ()
    # lanes this reduce varies along: the rest hold copies
    relevant = {self.slot_of[a] for a in self.up_axes if a in own | deps}
    keep = {self.slot_of[a] for a in self.up_axes if a in deps}
    lanes = [ln for ln in self.lanes if all(c == 0 for j, c in enumerate(ln) if j not in relevant)]
    def key(ln): return tuple(c if j in keep else 0 for j, c in enumerate(ln))
    values = self.lower_node(r.src[0], ridxs, zero_reduce=False)
    accs = self.accumulate(r.arg.op, r.dtype, [values[self.lane_index[ln]] for ln in lanes],
                           {ln: key(ln) for ln in lanes},
                           enclosing, loops, lanes)
    groups = [j for j, slot in enumerate(self.thread_slots) if any(ax in own for ax in slot)]
    if groups: accs = self.share_partials(r, accs, groups, enclosing)
    return [accs[key(ln)] for ln in self.lanes]

  def share_partials(self, r: UOp, accs: dict, groups: list[int], enclosing: tuple) -> dict:
    """Each thread's partial results go to shared memory and every thread ends up with its group's total (the
    threads that differ only in this reduce's group ids): a tree of halving steps, one barrier each, when the group
    is one power-of-two thread id; else every thread reads all partials of its group after one barrier."""
    sizes = [self.full_shape[slot[0]] for slot in self.thread_slots]
    keys = list(accs)
    temp, flat, barrier = self.stage_partials(r.dtype, f"temp{self.acc_count}", sizes, self.thread_ids,
                                              [accs[key] for key in keys])
    size = sizes[groups[0]]
    if len(groups) == 1 and size & (size - 1) == 0:
      j, tid = groups[0], self.thread_ids[groups[0]]
      def at(g: UOp) -> list[UOp]: return [g if i == j else t for i, t in enumerate(self.thread_ids)]
      barrier = self.halving_tree(temp, lambda g, n: flat(at(g), n), tid, size, r.arg.op, r.dtype, len(keys), barrier)
      zero = UOp.const(dtypes.index, 0)
      totals = {key: UOp(Ops.LOAD, r.dtype, (temp, flat(at(zero), n), barrier)) for n, key in enumerate(keys)}
      return self.reused(totals, enclosing)
    parent = enclosing[-1] if enclosing else None
    ids = list(self.thread_ids)
    loops = []
    for j in groups:
      parent = self.loop(f"tidx{self.loop_count}", sizes[j], parent)
      self.loop_count += 1
      ids[j] = parent
      loops.append(parent)
    out = {}
    for n, key in enumerate(keys):
      acc = UOp(Ops.DEFINE_ACC, r.dtype, (self.reduce_identity(r.arg.op, r.dtype),) + enclosing, self.acc_count)
      self.acc_count += 1
      partial = UOp(Ops.LOAD, r.dtype, (temp, flat(ids, n), barrier))
      out[key] = UOp(Ops.PHI, r.dtype, (acc, UOp(r.arg.op, r.dtype, (acc, partial))) + (loops[-1],))
    return self.reused(out, enclosing)

  def reused(self, totals: dict, enclosing: tuple) -> dict:
    """Inside a loop the shared buffer is written again by the next iteration's partials: every thread must have
    read this iteration's totals first, so a barrier follows the reads (kept alive as a root of the SINK)."""
    if enclosing: self.trailing.append(UOp(Ops.BARRIER, dtypes.void, tuple(totals.values())))
    return totals


# ***** step 4: placement and ordering *****

def _merge_chains(chains: list[tuple[UOp, ...]], node: UOp) -> tuple[UOp, ...]:
  longest: tuple[UOp, ...] = ()
  for c in chains:
    if len(c) > len(longest): longest = c
  for c in chains:
    if longest[:len(c)] != c:
      raise AssertionError(f"linearize: {node.op} depends on values from two sibling blocks")
  return longest


# values that never depend on an accumulator: a walk looking for one need not look under them
_NO_ACC = frozenset({Ops.LOAD, Ops.CONST, Ops.SPECIAL, Ops.LOOP, Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.DEFINE_VAR,
                     Ops.BARRIER})


def _accumulator_masks(nodes: list[UOp], accs: dict[UOp, int]) -> dict[UOp, int]:
  """For each node (in topological order), a bit mask of the accumulators (`accs`: node -> bit) it depends on. Index
  arithmetic and memory accesses carry none: an update's chain runs through the combining ALUs (and WMMAs, GEPs,
  casts) only."""
  masks: dict[UOp, int] = {}
  for n in nodes:
    m = 1 << accs[n] if n in accs else 0
    if n.op not in _NO_ACC and n.dtype is not dtypes.index:
      for s in n.src: m |= masks[s]
    masks[n] = m
  return masks


def _depending(root: UOp, acc: UOp, bit: int, masks: dict[UOp, int]) -> list[UOp]:
  """The nodes under `root` (itself included) that depend on `acc` (bit `bit` of their mask), sources first; the
  walk never leaves the nodes that do (a wgmma's batch has 128 accumulators and would be walked for each)."""
  flag = 1 << bit
  seen: set[UOp] = {acc}
  out: list[UOp] = []
  stack = [(root, False)]
  while stack:
    n, expanded = stack.pop()
    if expanded:
      out.append(n)
      continue
    if n in seen or not masks[n] & flag: continue
    seen.add(n)
    stack.append((n, True))
    stack.extend((x, False) for x in n.src if x not in seen)
  return out


def _keep_updates_in_loops(nodes: list[UOp], place: dict, seen_as: dict) -> None:
  """An accumulator update runs once per iteration of the loops its PHI names, even when the value it adds does not
  depend on them (sum over r of x is R*x): move the PHI, and every node between the accumulator and it, into them."""
  updates = [p for p in nodes if p.op is Ops.PHI and len(p.src) > 2]
  accs: dict[UOp, int] = {}
  for p in updates: accs.setdefault(p.src[0], len(accs))
  masks = _accumulator_masks(nodes, accs) if updates else {}
  for p in updates:
    target = _merge_chains([place[p]] + [seen_as[lp] for lp in p.src[2:]], p)
    # the chain: nodes under the update that depend on the previous accumulator value (sources first)
    chain = _depending(p.src[1], p.src[0], accs[p.src[0]], masks)
    for m in chain + [p]:
      place[m] = _merge_chains([place[m], target], m)
      if m is not p: seen_as[m] = place[m]


def linearize_graph(sink: UOp) -> list[UOp]:
  """Flatten a kernel graph: each node goes in the innermost LOOP/IF it depends on; blocks nest as their sources say."""
  nodes = sink.toposort()
  order = {n: i for i, n in enumerate(nodes)}
  place: dict[UOp, tuple[UOp, ...]] = {}   # enclosing blocks of the node's position
  seen_as: dict[UOp, tuple[UOp, ...]] = {}  # enclosing blocks of the node's value, as consumers see it
  for n in nodes:
    chain = _merge_chains([seen_as[s] for s in n.src], n)
    if n.op is Ops.BARRIER:   # every thread must reach a barrier: it waits after the gated stores, never inside
      while chain and chain[-1].op is Ops.IF: chain = chain[:-1]
    place[n] = chain
    if n.op in (Ops.LOOP, Ops.IF): seen_as[n] = chain + (n,)
    elif n.op is Ops.PHI: seen_as[n] = seen_as[n.src[0]]
    else: seen_as[n] = chain
  _keep_updates_in_loops(nodes, place, seen_as)
  children: dict[UOp | None, list[UOp]] = {}
  for n in nodes:
    if n is sink: continue
    children.setdefault(place[n][-1] if place[n] else None, []).append(n)

  def home(n: UOp) -> tuple[UOp, ...]: return place[n] + ((n,) if n.op in (Ops.LOOP, Ops.IF) else ())

  def contents(block: UOp) -> list[UOp]:
    out = []
    for c in children.get(block, []):
      out.append(c)
      if c.op in (Ops.LOOP, Ops.IF): out.extend(contents(c))
    return out

  out: list[UOp] = []

  def emit(block: UOp | None, level: tuple[UOp, ...]) -> None:
    items = children.get(block, [])
    deps: dict[UOp, set[UOp]] = {}
    for item in items:
      members = [item] + (contents(item) if item.op in (Ops.LOOP, Ops.IF) else [])
      member_set = set(members)
      d = set()
      for m in members:
        for s in m.src:
          if s in member_set: continue
          h = home(s)
          if h[:len(level)] != level or (level and s is level[-1]): continue
          d.add(s if len(h) == len(level) else h[len(level)])
      d.discard(item)
      deps[item] = d
    done: set[UOp] = set()

    def visit(item: UOp) -> None:
      stack = [(item, False)]
      while stack:
        it, ready = stack.pop()
        if it in done: continue
        if ready:
          done.add(it)
          out.append(it)
          if it.op in (Ops.LOOP, Ops.IF):
            emit(it, level + (it,))
            out.append(UOp(Ops.END, dtypes.void, (it,)))
          continue
        stack.append((it, True))
        stack.extend((d, False) for d in sorted(deps[it], key=order.__getitem__, reverse=True) if d not in done)
    for item in sorted(items, key=order.__getitem__): visit(item)

  emit(None, ())
  return out


# ***** the whole lowering *****

def linearize(k: Kernel) -> LinearProgram:
  """Kernel -> flat UOp list, applying the named steps in order."""
  lowerer = MultiLowerer(k) if k.multireduce else Lowerer(k)
  graph = lowerer.lower()
  graph = graph_rewrite(graph, symbolic)
  uops = linearize_graph(graph)
  specials = [u for u in uops if u.op is Ops.SPECIAL]
  gsz = lsz = None
  if k.opts.has_local:
    gsz_l, lsz_l = [1, 1, 1], [1, 1, 1]
    for u in specials:
      (gsz_l if u.arg.name.startswith("gidx") else lsz_l)[u.arg.dim] = u.arg.size
    gsz, lsz = tuple(gsz_l), tuple(lsz_l)
  for b in k.bufs:
    if b not in uops: uops.insert(0, b)  # every buffer stays a parameter, used or not
  uops = linearize_params_first(uops)
  prog = LinearProgram(k.name, uops, gsz, lsz, [u for u in uops if u.op is Ops.DEFINE_VAR], len(k.bufs))
  prog.op_estimate, prog.mem_estimate = estimate_ops(uops), estimate_mem(k)
  return prog


def linearize_params_first(uops: list[UOp]) -> list[UOp]:
  head_ops = (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.DEFINE_LOCAL)
  head = sorted([u for u in uops if u.op in head_ops],
                key=lambda u: (head_ops.index(u.op), u.arg if u.op is Ops.DEFINE_GLOBAL else
                               u.arg.name))
  return head + [u for u in uops if u.op not in head_ops]


def estimate_ops(uops: list[UOp]) -> int:
  """Floating/int ALU operations executed, counting loop trip counts and vector widths (for GFLOP/s)."""
  total, mult, stack = 0, 1, []
  for u in uops:
    if u.op is Ops.LOOP:
      trip = u.src[1].arg - u.src[0].arg if u.src[1].op is Ops.CONST else 1
      stack.append(trip)
      mult *= trip
    elif u.op is Ops.END and u.src[0].op is Ops.LOOP:
      mult //= stack.pop()
    elif u.op in GroupOp.ALU and not dtypes.is_int(u.dtype) and u.dtype is not dtypes.bool:
      total += mult * u.dtype.count
    elif u.op is Ops.WMMA:   # per thread: its share of the warp's (wgmma: the warpgroup's) multiply-adds
      total += mult * 2 * prod(u.arg.dims) // (128 if isinstance(u.arg, WGMMAArg) else 32)
  threads = 1
  for u in uops:
    if u.op is Ops.SPECIAL: threads *= u.arg.size
  return total * threads


def estimate_mem(k: Kernel) -> int:
  """Bytes the kernel must move at least: every buffer read or written once (through its widest view)."""
  sizes: dict[UOp, int] = {}
  for access, st in zip(k.accesses, k.sts):
    if access.op is Ops.CONST: continue
    buf = access.src[0]
    size = st.size if isinstance(st.size, int) else int(st.size.vmax)
    sizes[buf] = max(sizes.get(buf, 0), size * buf.dtype.base.itemsize)
  return sum(sizes.values())


def verify_uops(uops: list[UOp]) -> None:
  """Check the invariants of a flat UOp list; raise AssertionError naming the first broken one."""
  seen: set[UOp] = set()
  open_blocks: list[UOp] = []
  in_head = True
  head_rank = {Ops.DEFINE_GLOBAL: 0, Ops.DEFINE_VAR: 1, Ops.DEFINE_LOCAL: 2}
  last_rank = 0
  consumers: set[UOp] = set()
  index_names: dict[str, UOp] = {}
  for i, u in enumerate(uops):
    if u.op in head_rank:
      if not in_head: raise AssertionError(f"uop {i}: {u.op} after the first non-parameter uop")
      if head_rank[u.op] < last_rank: raise AssertionError(f"uop {i}: parameters out of order")
      last_rank = head_rank[u.op]
    else:
      in_head = False
    for s in u.src:
      if s not in seen: raise AssertionError(f"uop {i} ({u.op}): source {s.op} is not defined before it")
      consumers.add(s)
    if u.op in (Ops.LOOP, Ops.SPECIAL):
      name = u.arg if u.op is Ops.LOOP else u.arg.name
      if name in index_names and index_names[name] is not u:
        raise AssertionError(f"uop {i}: index name {name} is used by two different {u.op}s")
      index_names[name] = u
    if u.op in (Ops.LOOP, Ops.IF): open_blocks.append(u)
    if u.op is Ops.END:
      if not open_blocks or open_blocks[-1] is not u.src[0]:
        raise AssertionError(f"uop {i}: END does not close the innermost open block")
      open_blocks.pop()
    if u.op is Ops.PHI and u.src[0].op not in (Ops.DEFINE_ACC, Ops.PHI):
      raise AssertionError(f"uop {i}: PHI must update an accumulator")
    if u.op in GroupOp.Binary and u.op not in GroupOp.Comparison and u.op not in (Ops.SHL, Ops.SHR):
      if u.src[0].dtype is not u.src[1].dtype or u.dtype is not u.src[0].dtype:
        raise AssertionError(f"uop {i}: {u.op} mixes dtypes {u.src[0].dtype}, {u.src[1].dtype} -> {u.dtype}")
    if u.op is Ops.WHERE and (u.src[0].dtype is not dtypes.bool or u.src[1].dtype is not u.src[2].dtype):
      raise AssertionError(f"uop {i}: WHERE needs a bool condition and equal branch dtypes")
    seen.add(u)
  if open_blocks: raise AssertionError(f"{len(open_blocks)} LOOP/IF blocks are never closed")
  for i, u in enumerate(uops):
    if u not in consumers and u.op not in GroupOp.SideEffect and u.op not in (Ops.DEFINE_VAR, Ops.LOOP, Ops.IF):
      raise AssertionError(f"uop {i}: {u.op} has no consumer")
