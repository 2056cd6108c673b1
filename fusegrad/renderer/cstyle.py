"""Rendering a flat UOp list to C-family source: the C dialect for the CPU backend (and the base for CUDA).

`Renderer` also carries what codegen needs to know about a device (thread blocks, vector types, size limits).
Every value gets a named local; constants are inlined. Ints keep Python/torch semantics: `//` and `%` floor, and
division by zero gives 0 instead of trapping; plain C `/` and `%` are used where bounds prove both signs positive.
bfloat16 values live in `float` registers and are stored as 16-bit patterns.
"""
from __future__ import annotations
import functools
import math
from dataclasses import dataclass, field
from fusegrad.dtype import DType, dtypes
from fusegrad.uop import UOp, Ops, GroupOp, MatrixLoad, MaskedLoad, WGMMAArg
from fusegrad.symbolic import simplify


@dataclass(frozen=True)
class Renderer:
  """What codegen needs to know about a device, and how to turn a UOp list into source."""
  device: str = "CPU"
  has_local: bool = False
  has_shared: bool = False
  supports_float4: bool = False
  vector_dtypes: frozenset = field(default_factory=frozenset)
  vector_widths: tuple[int, ...] = (4, 2)   # vector load/store widths, widest first
  vector_alu: bool = False                  # arithmetic on vector values (GCC vector extensions on the CPU)
  global_max: tuple[int, ...] | None = None
  local_max: tuple[int, ...] | None = None
  local_max_threads: int = 0
  shared_max: int = 0
  tensor_cores: tuple = ()
  arch: str = ""
  max_threads: int = 1   # CPU cores a kernel may split its outer axis across (THREAD)

  def render(self, name: str, uops: list[UOp]) -> str: raise NotImplementedError


C_TYPES = {dtypes.bool: "bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
           dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int",
           dtypes.int64: "long long", dtypes.uint64: "unsigned long long", dtypes.float16: "_Float16",
           dtypes.bfloat16: "float", dtypes.float32: "float", dtypes.float64: "double", dtypes.void: "void"}

VALUE_OPS = frozenset({Ops.LOAD, Ops.GEP, Ops.VECTORIZE, Ops.CAST, Ops.BITCAST}) | GroupOp.ALU

C_PRELUDE = """#include <math.h>
#include <stdbool.h>
#include <string.h>
#define FG_IDIV(a, b) ((b) == 0 ? 0 : ((a) / (b)) - ((((a) % (b)) != 0) && (((a) < 0) != ((b) < 0))))
#define FG_MOD(a, b) ((b) == 0 ? 0 : ((a) % (b)) + (((((a) % (b)) != 0) && (((a) % (b) < 0) != ((b) < 0))) ? (b) : 0))
static inline long long fg_ipow(long long b, long long e) { long long r = 1;
  if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;
  while (e) { if (e & 1) r *= b; b *= b; e >>= 1; } return r; }
static inline float fg_bf16_load(unsigned short x) { unsigned int u = ((unsigned int)x) << 16; float f;
  memcpy(&f, &u, 4); return f; }
static inline unsigned short fg_bf16_store(float f) { unsigned int u; memcpy(&u, &f, 4);
  if (f != f) return 0x7FC0; return (unsigned short)((u + 0x7FFF + ((u >> 16) & 1)) >> 16); }
static inline float fg_bf16_round(float f) { return fg_bf16_load(fg_bf16_store(f)); }
"""


# 2^x on float32 vectors (the scalar exp2f is a libm call per lane): x = n + f with n = round(x) and |f| <= 1/2,
# 2^f by a degree-6 polynomial (relative error < 1e-7, fitted here for 2^f on [-1/2, 1/2]), 2^n built from exponent
# bits in two halves so that results from 2^-149 (denormal) to 2^128 (inf) come out right; NaN stays NaN
EXP2_POLY = ("0.00015345805f", "0.0013399931f", "0.009618489f", "0.055503286f", "0.24022646f", "0.6931472f", "1.0f")


def _horner(step: str) -> str:
  """The polynomial's Horner steps after `p = c0`, each rendered by `step` (from the coefficient)."""
  return " ".join(f"p = {step.format(c=c)};" for c in EXP2_POLY[1:])


VECTOR_EXP2 = ("""static inline V fg_exp2_V(V x) { typedef __typeof__(x > x) I; V z = {0};
  I hi = x > 128.0f, lo = x < -150.0f; V t = (V)((hi & (I)(z + 128.0f)) | (~hi & (I)x));
  t = (V)((lo & (I)(z - 150.0f)) | (~lo & (I)t));
  V n = (t + 12582912.0f) - 12582912.0f, f = t - n;
  V p = z + """ + EXP2_POLY[0] + "; " + _horner("p * f + {c}") + """
  I e = __builtin_convertvector(n, I), h = e >> 1;
  return p * (V)((h + 127) << 23) * (V)((e - h + 127) << 23); }""")


# the same on 16 floats with AVX-512: clamp (max/min keep a NaN operand: it is the second one), round, and scalef
# for p * 2^n, which is inf above 2^128 and rounds to denormals and 0 below 2^-126
AVX512_EXP2 = ("""static inline floatx16 fg_exp2_floatx16(floatx16 x) { __m512 v = (__m512)x;
  __m512 t = _mm512_min_ps(_mm512_set1_ps(128.0f), _mm512_max_ps(_mm512_set1_ps(-150.0f), v));
  __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(""" + EXP2_POLY[0] + "); " + _horner("_mm512_fmadd_ps(p, f, _mm512_set1_ps({c}))") + """
  return (floatx16)_mm512_scalef_ps(p, n); }""")


class CStyleRenderer(Renderer):
  """C source for a UOp list. Dialects override the small hooks below (types, indices, barriers, kernel header)."""
  kernel_prefix = ""
  buffer_prefix = ""
  float_suffix = "f"

  soft_half = False   # True: float16 values live in float registers and are stored as 16-bit patterns

  def type_name(self, dt: DType) -> str:
    if dt.count > 1: return dt.name
    return "float" if dt is dtypes.float16 and self.soft_half else C_TYPES[dt]

  def soft16(self, dt: DType) -> str | None:
    """"bf16"/"f16" when values of dt are kept in float registers (loads widen, stores and casts round)."""
    if dt is dtypes.bfloat16: return "bf16"
    return "f16" if dt is dtypes.float16 and self.soft_half else None

  def storage_type(self, dt: DType) -> str:
    return "unsigned short" if self.soft16(dt) else self.type_name(dt)

  # ***** literals *****
  def literal(self, value, dt: DType) -> str:
    if dt.count > 1: return self.vector_literal([self.literal(value, dt.scalar)] * dt.count, dt)
    if dt is dtypes.bool: return "1" if value else "0"
    if dtypes.is_float(dt):
      if math.isnan(value): text = "NAN"
      elif math.isinf(value): text = "INFINITY" if value > 0 else "-INFINITY"
      else: text = repr(float(value)) + (self.float_suffix if dt is not dtypes.float64 else "")
      if dt is dtypes.float64 and (math.isnan(value) or math.isinf(value)): return f"((double){text})"
      return f"(({self.type_name(dt)}){text})" if dt is dtypes.float16 else text
    if dt in (dtypes.int64,): return f"{value}ll"
    if dt in (dtypes.uint64,): return f"{value}ull"
    if dt in (dtypes.uint32,): return f"{value}u"
    if dt is dtypes.int32 and value == -(1 << 31): return "(-2147483647-1)"
    return str(value)

  def vector_literal(self, parts: list[str], dt: DType) -> str: return f"(({dt.name}){{{', '.join(parts)}}})"

  # ***** ALU *****
  def alu(self, u: UOp, a: list[str]) -> str:
    op, dt = u.op, u.dtype
    fdt = u.src[0].dtype
    is_f = dtypes.is_float(fdt)
    fn = (lambda n: n + ("" if fdt is dtypes.float64 else "f"))
    if op is Ops.NEG: return f"(!{a[0]})" if dt is dtypes.bool else f"(-{a[0]})"
    if op is Ops.EXP2: return f"fg_exp2_{dt.name}({a[0]})" if dt.count > 1 else f"{fn('exp2')}({a[0]})"
    if op is Ops.LOG2: return f"{fn('log2')}({a[0]})"
    if op is Ops.SIN: return f"{fn('sin')}({a[0]})"
    if op is Ops.SQRT: return f"{fn('sqrt')}({a[0]})"
    if op is Ops.TRUNC: return f"{fn('trunc')}({a[0]})"
    if op is Ops.RECIP: return f"({self.literal(1.0, dt)}/{a[0]})"
    if op is Ops.POW:
      if not is_f: return f"(({self.type_name(dt)})fg_ipow({a[0]}, {a[1]}))"
      return f"{fn('pow')}({a[0]}, {a[1]})"
    if op is Ops.MAX:
      if dt.count > 1: return f"fg_max_{dt.name}({a[0]}, {a[1]})"
      if is_f: return f"((({a[0]})!=({a[0]}))||(({a[0]})>({a[1]}))?({a[0]}):({a[1]}))"
      return f"(({a[0]})>({a[1]})?({a[0]}):({a[1]}))"
    if op is Ops.IDIV:
      if self.positive_division(u): return f"({a[0]}/{a[1]})"
      return f"FG_IDIV({a[0]}, {a[1]})"
    if op is Ops.MOD:
      if is_f: return f"{fn('fmod')}({a[0]}, {a[1]})"
      if self.positive_division(u): return f"({a[0]}%{a[1]})"
      return f"FG_MOD({a[0]}, {a[1]})"
    if op is Ops.WHERE: return f"({a[0]}?{a[1]}:{a[2]})"
    if op is Ops.MULACC: return f"(({a[0]}*{a[1]})+{a[2]})"
    sym = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/", Ops.CMPLT: "<", Ops.CMPNE: "!=",
           Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}[op]
    return f"({a[0]}{sym}{a[1]})"

  @staticmethod
  def positive_division(u: UOp) -> bool:
    return u.src[0].vmin >= 0 and u.src[1].vmin > 0

  # ***** dialect hooks *****
  def special(self, u: UOp) -> str: raise NotImplementedError("SPECIAL needs a device with thread blocks")
  def barrier(self, u: UOp, state: dict) -> str: raise NotImplementedError("BARRIER needs a device with thread blocks")
  def local_decl(self, u: UOp, uops: list[UOp]) -> str:
    raise NotImplementedError("DEFINE_LOCAL needs a device with shared memory")

  def vector_load(self, dt: DType, ptr: str, idx: str) -> str: return f"(*(({self.type_name(dt)}*)({ptr}+{idx})))"
  def vector_store(self, dt: DType, ptr: str, idx: str, val: str) -> str:
    return f"*(({self.type_name(dt)}*)({ptr}+{idx})) = {val};"
  def gep(self, vec: str, lane: int) -> str: return f"{vec}[{lane}]"
  def cast(self, u: UOp, val: str) -> str:
    if self.soft16(u.dtype): return f"fg_{self.soft16(u.dtype)}_round((float)({val}))"
    if u.dtype is dtypes.bool: return f"(({val})!=0)"
    return f"(({self.type_name(u.dtype)})({val}))"

  def bitcast(self, u: UOp, val: str) -> str:
    to_t, from_t = self.storage_type(u.dtype), self.storage_type(u.src[0].dtype)
    if self.soft16(u.src[0].dtype): val = f"fg_{self.soft16(u.src[0].dtype)}_store({val})"
    raw = self.bitcast_expr(from_t, to_t, val)
    return f"fg_{self.soft16(u.dtype)}_load({raw})" if self.soft16(u.dtype) else raw

  def bitcast_expr(self, from_t: str, to_t: str, val: str) -> str:
    return f"({{ union {{ {from_t} a; {to_t} b; }} u_ = {{ .a = {val} }}; u_.b; }})"

  def kernel_header(self, name: str, params: list[str], uops: list[UOp]) -> str:
    return f"{self.kernel_prefix}void {name}({', '.join(params)}) {{"

  def prelude(self, uops: list[UOp]) -> str:
    vec_types = sorted({u.dtype for u in uops if u.dtype.count > 1}, key=lambda d: d.name)
    typedefs = [f"typedef {self.type_name(d.scalar)} {d.name} __attribute__((vector_size({d.itemsize})));"
                for d in vec_types]
    # lane-wise max with NaN propagating from either side, as the scalar form: a bit-select on the compare mask
    for d in sorted({u.dtype for u in uops if u.op is Ops.MAX and u.dtype.count > 1}, key=lambda d: d.name):
      typedefs.append(f"static inline {d.name} fg_max_{d.name}({d.name} a, {d.name} b) {{ "
                      f"__typeof__(a > b) m = (a != a) | (a > b); "
                      f"return ({d.name})((m & (__typeof__(m))a) | (~m & (__typeof__(m))b)); }}")
    for d in sorted({u.dtype for u in uops if isinstance(u.arg, MaskedLoad)}, key=lambda d: d.name):
      typedefs.append(masked_load(d))
    for d in sorted({u.dtype for u in uops if u.op is Ops.EXP2 and u.dtype.count > 1}, key=lambda d: d.name):
      generic = VECTOR_EXP2.replace("V", d.name)
      if d.count == 16 and d.scalar is dtypes.float32:   # AVX-512 has the pieces as single instructions
        generic = f"#if defined(__AVX512F__)\n#include <immintrin.h>\n{AVX512_EXP2}\n#else\n{generic}\n#endif"
      typedefs.append(generic)
    return C_PRELUDE + "\n".join(typedefs)

  # ***** the program *****
  def render(self, name: str, uops: list[UOp]) -> str:
    names: dict[UOp, str] = {}
    counters: dict[str, int] = {}
    params: list[str] = []
    lines: list[str] = []
    depth = 1

    def fresh(prefix: str) -> str:
      counters[prefix] = counters.get(prefix, 0) + 1
      return f"{prefix}{counters[prefix] - 1}"

    def r(x: UOp) -> str: return names[x] if x in names else self.literal(x.arg, x.dtype)
    written = {u.src[0] for u in uops if u.op is Ops.STORE and u.src[0].op is Ops.DEFINE_GLOBAL}
    skipped = self.unrendered(uops)
    state = self.render_state(uops)   # what a dialect tracks from one statement to the next (before(), barrier())

    for u in uops:
      op = u.op
      emit = lambda text: lines.append("  " * depth + text)  # noqa: E731
      for text in self.before(u, state): emit(text)
      if op is Ops.DEFINE_GLOBAL:
        names[u] = f"data{u.arg}"
        const = "" if u in written else "const "
        params.append(f"{self.buffer_prefix}{const}{self.storage_type(u.dtype.base)}* restrict {names[u]}")
      elif op is Ops.DEFINE_VAR:
        names[u] = u.arg.name
        params.append(f"const int {u.arg.name}")
      elif op is Ops.DEFINE_LOCAL:
        names[u] = u.arg.name
        emit(self.local_decl(u, uops))
        
      elif op is Ops.CONST: continue
      elif op is Ops.SPECIAL:
        names[u] = u.arg.name
        emit(f"int {u.arg.name} = {self.special(u)}; /* {u.arg.size} */")
      elif op is Ops.LOOP:
        names[u] = u.arg
        emit(f"for (int {u.arg} = {r(u.src[0])}; {u.arg} < {r(u.src[1])}; {u.arg}++) {{")
        depth += 1
      elif op is Ops.IF:
        emit(f"if ({r(u.src[0])}) {{")
        depth += 1
      elif op is Ops.END:
        depth -= 1
        lines.append("  " * depth + "}")
      elif op is Ops.BARRIER: emit(self.barrier(u, state))
      elif op is Ops.DEFINE_ACC:
        names[u] = fresh("acc")
        emit(f"{self.type_name(u.dtype)} {names[u]} = {r(u.src[0])};")
      elif op is Ops.PHI:
        names[u] = names[u.src[0]]
        if r(u.src[1]) != names[u]: emit(f"{names[u]} = {r(u.src[1])};")
      elif op is Ops.STORE:
        emit(self.render_store(u, r))
      elif u in skipped: continue
      elif (alias := self.alias(u, r)) is not None: names[u] = alias
      elif op in VALUE_OPS:
        prefix, text = self.value(u, r)
        names[u] = fresh(prefix)
        emit(f"{self.type_name(u.dtype)} {names[u]} = {text};")
      elif op is Ops.WMMA:
        names[u] = fresh("wmma")
        emit(self.wmma(u, names[u], [r(s) for s in u.src], r))
      else:
        raise NotImplementedError(f"render: {op} is not supported by the {self.device} renderer")
    body = "\n".join(lines)
    return f"{self.prelude(uops)}\n{self.kernel_header(name, params, uops)}\n{body}\n{self.kernel_footer(uops)}\n"

  def kernel_footer(self, uops: list[UOp]) -> str: return "}"

  def render_state(self, uops: list[UOp]) -> dict: return {}

  def before(self, u: UOp, state: dict) -> list[str]:
    """Statements the dialect puts before `u` (`state` lives for one render)."""
    return []

  def alias(self, u: UOp, r) -> str | None:
    """The name of a value `u` only renames (no statement of its own), or None."""
    return None

  def unrendered(self, uops: list[UOp]) -> set[UOp]:
    """Values the dialect folds into their consumers (no statement of their own)."""
    return set()

  def value(self, u: UOp, r) -> tuple[str, str]:
    """(name prefix, C expression) of a uop that defines one value."""
    if u.op is Ops.LOAD: return "val", self.render_load(u, r)
    if u.op is Ops.GEP: return "g", self.gep(r(u.src[0]), u.arg)
    if u.op is Ops.VECTORIZE: return "vec", self.vector_literal([r(s) for s in u.src], u.dtype)
    if u.op is Ops.CAST: return "cast", self.cast(u, r(u.src[0]))
    if u.op is Ops.BITCAST: return "bc", self.bitcast(u, r(u.src[0]))
    return "alu", self.alu(u, [r(s) for s in u.src])

  def wmma(self, u: UOp, name: str, args: list[str], r) -> str:
    raise NotImplementedError(f"WMMA is not supported by the {self.device} renderer")

  def render_load(self, u: UOp, r) -> str:
    src = memory_srcs(u)
    buf, idx = r(src[0]), r(src[1])
    if isinstance(u.arg, MaskedLoad):   # lane i reads buf[idx + i] where valid i holds: a bit mask of the valids
      mask = " | ".join(f"((unsigned)({r(v)}) << {i})" for i, v in enumerate(src[2:2 + u.dtype.count]))
      return f"fg_maskload_{u.dtype.name}({buf}+{idx}, {mask})"
    soft = self.soft16(src[0].dtype.base)
    if u.dtype.count > 1: value = self.vector_load(u.dtype, buf, idx)
    elif soft: value = f"fg_{soft}_load({buf}[{idx}])"
    else: value = f"{buf}[{idx}]"
    if len(src) == 4: return f"({r(src[2])}?{value}:{r(src[3])})"
    return value

  def render_store(self, u: UOp, r) -> str:
    buf, idx, val = u.src[0], r(u.src[1]), u.src[2]
    if val.dtype.count > 1: return self.vector_store(val.dtype, r(buf), idx, r(val))
    soft = self.soft16(buf.dtype.base)
    if soft: return f"{r(buf)}[{idx}] = fg_{soft}_store({r(val)});"
    return f"{r(buf)}[{idx}] = {r(val)};"


def memory_srcs(u: UOp) -> tuple[UOp, ...]:
  """A LOAD's sources without the barriers it is ordered after: (buffer, index[, valid..., alternative])."""
  return tuple(s for s in u.src if s.op is not Ops.BARRIER)


def masked_load(d: DType) -> str:
  """C for fg_maskload_<d>(p, m): lanes i with bit i of m read p[i], the others are 0 (and read nothing, so a window
  hanging over a buffer's end is safe). AVX-512 has it as one instruction; elsewhere a loop GCC turns into selects."""
  intrinsic = {4: ("__AVX512VL__", "_mm_maskz_loadu_ps", "__mmask8"), 8: ("__AVX512VL__", "_mm256_maskz_loadu_ps",
               "__mmask8"), 16: ("__AVX512F__", "_mm512_maskz_loadu_ps", "__mmask16")}.get(d.count)
  fallback = (f"{d.name} v = {{0}}; for (int i = 0; i < {d.count}; i++) if ((m >> i) & 1u) v[i] = p[i]; "
              f"return v;")
  head = f"static inline {d.name} fg_maskload_{d.name}(const float* p, unsigned m) {{"
  if d.scalar is not dtypes.float32 or intrinsic is None: return f"{head} {fallback} }}"
  guard, fn, mask_t = intrinsic
  return (f"#if defined({guard})\n#include <immintrin.h>\n{head} return ({d.name}){fn}(({mask_t})m, p); }}\n"
          f"#else\n{head} {fallback} }}\n#endif")


@functools.cache
def native_float_lanes() -> int:
  """float32 lanes of this CPU's widest vector registers (16 with AVX-512, else 8: GCC splits wider vectors)."""
  try:
    with open("/proc/cpuinfo") as f: flags = next((ln for ln in f if ln.startswith("flags")), "")
  except OSError:
    flags = ""
  return 16 if " avx512f" in flags else 8


class CRenderer(CStyleRenderer):
  """Plain C for the CPU backend: global axes become loops; GCC vector extensions give float4; a SPECIAL `core`
  index (the THREAD opt) runs the kernel body in an OpenMP parallel region, one contiguous chunk per core."""
  def __init__(self, max_threads: int = 1, vector_lanes: int | None = None):
    vector_lanes = vector_lanes or native_float_lanes()
    widths = tuple(w for w in (16, 8, 4, 2) if w <= vector_lanes)
    super().__init__(device="CPU", has_local=False, supports_float4=True,
                     vector_dtypes=frozenset({dtypes.float32, dtypes.int32}), vector_widths=widths, vector_alu=True,
                     max_threads=max_threads)

  def special(self, u: UOp) -> str: return "omp_get_thread_num()"

  @staticmethod
  def threads(uops: list[UOp]) -> int:
    return next((u.arg.size for u in uops if u.op is Ops.SPECIAL), 1)

  def prelude(self, uops: list[UOp]) -> str:
    return ("#include <omp.h>\n" if self.threads(uops) > 1 else "") + super().prelude(uops)

  def kernel_header(self, name: str, params: list[str], uops: list[UOp]) -> str:
    header = super().kernel_header(name, params, uops)
    n = self.threads(uops)
    return header if n == 1 else f"{header}\n#pragma omp parallel num_threads({n})\n{{"

  def kernel_footer(self, uops: list[UOp]) -> str: return "}" if self.threads(uops) == 1 else "}\n}"


CUDA_PRELUDE = """#define INFINITY (__int_as_float(0x7f800000))
#define NAN (__int_as_float(0x7fffffff))
#define FG_IDIV(a, b) ((b) == 0 ? 0 : ((a) / (b)) - ((((a) % (b)) != 0) && (((a) < 0) != ((b) < 0))))
#define FG_MOD(a, b) ((b) == 0 ? 0 : ((a) % (b)) + (((((a) % (b)) != 0) && (((a) % (b) < 0) != ((b) < 0))) ? (b) : 0))
__device__ inline long long fg_ipow(long long b, long long e) { long long r = 1;
  if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;
  while (e) { if (e & 1) r *= b; b *= b; e >>= 1; } return r; }
__device__ inline float fg_bf16_load(unsigned short x) { return __uint_as_float(((unsigned int)x) << 16); }
__device__ inline unsigned short fg_bf16_store(float f) { unsigned int u = __float_as_uint(f);
  if (f != f) return 0x7FC0; return (unsigned short)((u + 0x7FFF + ((u >> 16) & 1)) >> 16); }
__device__ inline float fg_bf16_round(float f) { return fg_bf16_load(fg_bf16_store(f)); }
__device__ inline float fg_f16_load(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f; }
__device__ inline unsigned short fg_f16_store(float f) { unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ inline float fg_f16_round(float f) { return fg_f16_load(fg_f16_store(f)); }
__device__ inline unsigned fg_pack_f16(float lo, float hi) { return (unsigned)fg_f16_store(lo) |
  ((unsigned)fg_f16_store(hi) << 16); }
__device__ inline unsigned fg_pack_bf16(float lo, float hi) { return (unsigned)fg_bf16_store(lo) |
  ((unsigned)fg_bf16_store(hi) << 16); }
template <typename T, typename F> __device__ inline T fg_bitcast(F f) { union { F a; T b; } u; u.a = f; return u.b; }
#define FG_LDMATRIX(name, type, n, outs, ...) __device__ inline type name(const unsigned short* p) { type r; \
  asm volatile("ldmatrix.sync.aligned.m8n8." n ".shared.b16 " outs ";" : __VA_ARGS__ \
               : "r"((unsigned)__cvta_generic_to_shared(p))); return r; }
FG_LDMATRIX(fg_ldmatrix_x4, uint4, "x4", "{%0,%1,%2,%3}, [%4]", "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w))
FG_LDMATRIX(fg_ldmatrix_x4_trans, uint4, "x4.trans", "{%0,%1,%2,%3}, [%4]", "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w))
FG_LDMATRIX(fg_ldmatrix_x2, uint2, "x2", "{%0,%1}, [%2]", "=r"(r.x), "=r"(r.y))
FG_LDMATRIX(fg_ldmatrix_x2_trans, uint2, "x2.trans", "{%0,%1}, [%2]", "=r"(r.x), "=r"(r.y))
"""

WGMMA_PRELUDE = """__device__ inline unsigned long long fg_wgmma_desc(const void* p, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((((unsigned)__cvta_generic_to_shared(p)) & 0x3FFFF) >> 4) |
    ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) | ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32) |
    (1ull << 62); }
"""   # a wgmma shared-memory descriptor: start address, leading and stride byte offsets (16-byte units), 128B swizzle


def _is_wgmma(u: UOp) -> bool: return u.op is Ops.WMMA and isinstance(u.arg, WGMMAArg)


_CUDA_VECTOR_FIELDS = "xyzw"
_RAW_VECTORS = {4: "unsigned", 8: "uint2", 16: "uint4"}   # bytes -> the CUDA type that moves them as raw bits


def arch_number(arch: str) -> int:
  """The compute capability of an "sm_XY" name as a number (sm_90 -> 90, sm_120 -> 120; 0 when unknown)."""
  digits = arch.removeprefix("sm_").rstrip("af")
  return int(digits) if digits.isdigit() else 0


def shared_per_block(arch: str) -> int:
  """Shared memory one block may use (with the dynamic opt-in above 48 KB), per compute capability."""
  return {80: 163, 87: 163, 86: 99, 89: 99, 90: 227, 100: 227, 120: 99}.get(arch_number(arch), 48) * 1024


class CUDARenderer(CStyleRenderer):
  """CUDA C++ for NVRTC: SPECIAL as blockIdx/threadIdx, __shared__ arrays, __syncthreads, float4 structs,
  float16 and bfloat16 in float registers with 16-bit storage (so fp32 accumulation is the default)."""
  kernel_prefix = 'extern "C" __global__ '
  soft_half = True

  def __init__(self, arch: str = "sm_90"):
    super().__init__(device="CUDA", has_local=True, has_shared=True, supports_float4=True,
                     vector_dtypes=frozenset({dtypes.float32, dtypes.float16, dtypes.bfloat16}),
                     global_max=(2**31 - 1, 65535, 65535),
                     local_max=(1024, 1024, 64), local_max_threads=1024, shared_max=shared_per_block(arch), arch=arch,
                     tensor_cores=(("m16n8k16",) if arch_number(arch) >= 80 else ()) +
                                  ((WGMMAArg.NAME,) if arch_number(arch) == 90 else ()))   # wgmma: sm_90a only

  def prelude(self, uops: list[UOp]) -> str:
    total = self.shared_bytes(uops)[-1][1]
    prelude = CUDA_PRELUDE + (WGMMA_PRELUDE if any(_is_wgmma(u) for u in uops) else "")
    if total <= self.STATIC_SHARED: return prelude
    return prelude + f'extern "C" __device__ const unsigned int fg_dynamic_shared = {total};\n'

  def special(self, u: UOp) -> str:
    return f"{'blockIdx' if u.arg.name.startswith('g') else 'threadIdx'}.{'xyz'[u.arg.dim]}"

  def barrier(self, u: UOp, state: dict) -> str:
    # a barrier after asynchronous copies first waits for this thread's copies to land (all but the `arg` newest
    # groups: one group per iteration of a pipelined STAGE loop); where wgmma reads the tiles next, a proxy fence
    # makes the copied data visible to the tensor cores' (async) reads
    fence = " fence.proxy.async.shared::cta;" if state.get("wgmma_kernel") and \
        any(s.op is Ops.STORE and s.src[0].op is Ops.DEFINE_LOCAL for s in u.src) else ""
    if any(self.async_copy(s) for s in u.src):
      wait = f"cp.async.commit_group; cp.async.wait_group {u.arg};" if u.arg else "cp.async.wait_all;"
      return f'asm volatile("{wait}{fence}" ::: "memory"); __syncthreads();'
    return f'asm volatile("{fence[1:]}" ::: "memory"); __syncthreads();' if fence else "__syncthreads();"

  def async_copy(self, u: UOp) -> bool:
    """A STORE into shared memory of a plain 4-, 8- or 16-byte load of a global buffer (the copies of STAGE), done
    with cp.async (sm_80 and later): the data skips the registers, and the copy runs on while the thread computes,
    until the next barrier waits for it."""
    if arch_number(self.arch) < 80 or u.op is not Ops.STORE or len(u.src) != 3 or u.src[0].op is not Ops.DEFINE_LOCAL:
      return False
    v = u.src[2]
    return v.op is Ops.LOAD and v.src[0].op is Ops.DEFINE_GLOBAL and v.dtype.itemsize in (4, 8, 16) and \
        len(memory_srcs(v)) == 2

  def render_state(self, uops: list[UOp]) -> dict:
    wgmmas = [u for u in uops if _is_wgmma(u)]
    accs = {s for w in wgmmas for s in w.src[4:4 + w.arg.n // 2]}   # the accumulators: their values and updates
    for u in uops:
      if (u.op is Ops.GEP and _is_wgmma(u.src[0])) or (u.op is Ops.PHI and u.src[0] in accs): accs.add(u)
    return {"wgmma_kernel": bool(wgmmas), "accs": accs, "open": False, "pending": False, "drain": False, "loops": 0,
            "in_flight": max((w.arg.in_flight for w in wgmmas), default=0)}

  def before(self, u: UOp, state: dict) -> list[str]:
    """wgmma runs asynchronously: a fence before the first of a batch (the accumulators were last written by other
    instructions), a commit after it, and waits: at the barrier that ends an iteration (after it other threads
    refill tiles) for all but `in_flight` batches, for all right after the reduce loops that leave batches running
    (the outermost: one ring runs through all of them; ptxas serializes the wgmmas when the wait comes later), and
    before anything else reads the accumulators."""
    WAIT = 'asm volatile("{}wgmma.wait_group.sync.aligned {};" ::: "memory");'
    if state["drain"]:   # the statement after the END of the loop
      state["drain"] = state["pending"] = False
      return [WAIT.format("", 0)] + self.before(u, state)
    if _is_wgmma(u):
      if state["open"]: return []
      state["open"] = True
      return ['asm volatile("wgmma.fence.sync.aligned;" ::: "memory");']
    if u.op is Ops.LOOP: state["loops"] += 1
    if u.op is Ops.END and u.src[0].op is Ops.LOOP:
      state["loops"] -= 1
      if state["pending"] and state["loops"] == 0: state["drain"] = True
    if not (state["open"] or state["pending"]): return []
    if u.op is Ops.BARRIER: left = state["in_flight"]
    elif (u.op is not Ops.PHI and any(s in state["accs"] for s in u.src)) or u.op is Ops.IF or \
        (u.op is Ops.LOOP and not state["pending"]) or \
        (u.op is Ops.STORE and not self.async_copy(u)): left = 0
    else: return []
    commit = "wgmma.commit_group.sync.aligned; " if state["open"] else ""
    state["open"], state["pending"] = False, left > 0
    return [WAIT.format(commit, left)]

  def alias(self, u: UOp, r) -> str | None:
    """A result of wgmma is its accumulator register, updated in place."""
    if u.op is Ops.GEP and _is_wgmma(u.src[0]): return r(u.src[0].src[4 + u.arg])
    return None

  def render_load(self, u: UOp, r) -> str:
    if isinstance(u.arg, MatrixLoad):
      return f"fg_ldmatrix_x{u.arg.count}{'_trans' if u.arg.trans else ''}({r(u.src[0])}+{r(u.src[1])})"
    return super().render_load(u, r)

  def unrendered(self, uops: list[UOp]) -> set[UOp]:
    """Global loads whose only consumers are asynchronous copies (the copy reads the memory itself). Checks that a
    barrier waits for every asynchronous copy (STAGE makes each copy a source of the barrier after it)."""
    asynchronous = [u for u in uops if self.async_copy(u)]
    if not asynchronous: return set()
    waited = {s for u in uops if u.op is Ops.BARRIER for s in u.src}
    if any(u not in waited for u in asynchronous):
      raise AssertionError("CUDA renderer: an asynchronous copy into shared memory that no barrier waits for")
    copied, copies = {u.src[2] for u in asynchronous}, set(asynchronous)
    used = {s for u in uops if u not in copies for s in u.src}
    return copied - used

  def render_store(self, u: UOp, r) -> str:
    if not self.async_copy(u): return super().render_store(u, r)
    load, size = u.src[2], u.src[2].dtype.itemsize
    return (f'asm volatile("cp.async.{"cg" if size == 16 else "ca"}.shared.global [%0], [%1], {size};" :: '
            f'"r"((unsigned)__cvta_generic_to_shared({r(u.src[0])}+{r(u.src[1])})), '
            f'"l"({r(load.src[0])}+{r(load.src[1])}) : "memory");')

  STATIC_SHARED = 48 * 1024   # more than this per block only as dynamic shared memory (opted in per kernel)

  @staticmethod
  def shared_bytes(uops: list[UOp]) -> list[tuple[UOp, int]]:
    """Each shared array with its byte offset in one block-wide layout (aligned as its LocalArg asks, at least 16
    bytes), and the total last."""
    out, total = [], 0
    for u in uops:
      if u.op is Ops.DEFINE_LOCAL:
        total = -(-total // u.arg.align) * u.arg.align
        out.append((u, total))
        total += -(-u.arg.size * u.dtype.base.itemsize // 16) * 16
    return out + [(None, total)]  # type: ignore[list-item]

  def local_decl(self, u: UOp, uops: list[UOp]) -> str:
    layout = self.shared_bytes(uops)
    storage = self.storage_type(u.dtype.base)
    if layout[-1][1] <= self.STATIC_SHARED:
      return f"__shared__ __align__({u.arg.align}) {storage} {u.arg.name}[{u.arg.size}];"
    # dynamic: the arrays are slices of one extern buffer, sized at launch (runtime/cuda.py reads fg_dynamic_shared)
    offset = next(off for v, off in layout if v is u)
    align = max(v.arg.align for v, _ in layout[:-1])
    head = f"extern __shared__ __align__({align}) unsigned char fg_smem[];\n  " if layout[0][0] is u else ""
    return f"{head}{storage}* {u.arg.name} = ({storage}*)(fg_smem + {offset});"

  def type_name(self, dt: DType) -> str:
    # float32 vectors are float2/float4; vectors of any other dtype only ever move raw bits (the copies into shared
    # memory, ldmatrix registers, 16-bit loads and stores, whose lanes value() widens and packs): unsigned words of
    # the same size hold them
    if dt.count == 1 or dt.scalar is dtypes.float32: return super().type_name(dt)
    if dt.itemsize not in _RAW_VECTORS:
      raise NotImplementedError(f"CUDA renderer: no type moves a {dt.name} ({dt.itemsize} bytes) as raw bits")
    return _RAW_VECTORS[dt.itemsize]

  def vector_literal(self, parts: list[str], dt: DType) -> str: return f"make_{dt.name}({', '.join(parts)})"

  def value(self, u: UOp, r) -> tuple[str, str]:
    if u.op is Ops.VECTORIZE and u.dtype.scalar is not dtypes.float32:
      words = u.dtype.itemsize // 4
      # zero words (padding, a gated load's fallback); -0.0 keeps its sign bit through the packing below
      if all(s.op is Ops.CONST and s.arg == 0 and math.copysign(1.0, s.arg) > 0 for s in u.src):
        return "vec", "0u" if words == 1 else f"make_uint{words}({', '.join(['0u'] * words)})"
      soft = self.soft16(u.dtype.scalar)
      if soft is None or u.dtype.count % 2:
        raise NotImplementedError(f"CUDA renderer: a {u.dtype.name} vector built from values")
      # 16-bit values live in float registers: pack them two to a word, rounding as a scalar store would
      packed = [f"fg_pack_{soft}({r(u.src[2 * i])}, {r(u.src[2 * i + 1])})" for i in range(words)]
      return "vec", packed[0] if words == 1 else f"make_uint{words}({', '.join(packed)})"
    if u.op is Ops.GEP and (soft := self.soft16(u.src[0].dtype.scalar)) is not None and u.src[0].dtype.count > 1:
      # a lane of a raw 16-bit vector: its half of a word, widened into a float register
      words = u.src[0].dtype.itemsize // 4
      word = r(u.src[0]) if words == 1 else self.gep(r(u.src[0]), u.arg // 2)
      return "g", f"fg_{soft}_load((unsigned short)({word} >> {16 * (u.arg % 2)}))"
    return super().value(u, r)

  def gep(self, vec: str, lane: int) -> str: return f"{vec}.{_CUDA_VECTOR_FIELDS[lane]}"
  def bitcast_expr(self, from_t: str, to_t: str, val: str) -> str: return f"fg_bitcast<{to_t}, {from_t}>({val})"

  def wmma(self, u: UOp, name: str, args: list[str], r) -> str:
    if isinstance(u.arg, WGMMAArg): return self.wgmma(u, r)
    return self.mma_sync(u, name, args, r)

  @staticmethod
  def wgmma(u: UOp, r) -> str:
    """One wgmma.mma_async in inline PTX, on the accumulators in place; the operands' shared-memory descriptors
    (fg_wgmma_desc) from the tiles' origins. D = A B + D (scale-d 1), A and B transposed where MN-major."""
    arg = u.arg
    kind, count = "f16" if arg.dtype_in is dtypes.float16 else "bf16", arg.n // 2
    def desc(buf: UOp, start: UOp, lbo: int) -> str:
      return f"fg_wgmma_desc({r(buf)}+{r(start)}, {2 * lbo}u, {2 * arg.SBO}u)"
    regs = ",".join(f"%{i}" for i in range(count))
    accs = ", ".join(f'"+f"({r(s)})' for s in u.src[4:4 + count])
    return (f'asm volatile("{{ .reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n{arg.n}k16.f32.'
            f'{kind}.{kind} {{{regs}}}, %{count}, %{count + 1}, p, 1, 1, {int(arg.trans_a)}, {int(arg.trans_b)}; }}" : '
            f'{accs} : "l"({desc(u.src[0], u.src[1], arg.lbo_a)}), "l"({desc(u.src[2], u.src[3], arg.lbo_b)}) : '
            f'"memory");')

  def mma_sync(self, u: UOp, name: str, args: list[str], r) -> str:
    """One mma.sync m16n8k16 in inline PTX: halves are packed two to a 32-bit register, accumulators are fp32.
    A pair of fragment elements loaded straight from a 16-bit buffer is packed from the raw bits (one 32-bit load
    when the two are neighbours at an even index), skipping the round trip through float registers."""
    kind = "f16" if u.arg.dtype_in is dtypes.float16 else "bf16"
    def pack(i: int) -> str: return self.raw_pair(u.src[i], u.src[i + 1], r) or \
        f"fg_pack_{kind}({args[i]}, {args[i + 1]})"
    if u.arg.packed: a, b, c = args[0:4], args[4:6], args[6:10]   # registers straight from ldmatrix
    else: a, b, c = [pack(2 * j) for j in range(4)], [pack(8 + 2 * j) for j in range(2)], args[12:16]
    outs = ", ".join(f'"=f"({name}.{f})' for f in "xyzw")
    ins = ", ".join([f'"r"({x})' for x in a + b] + [f'"f"({x})' for x in c])
    return (f'float4 {name}; asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 '
            f'{{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%10,%11,%12,%13}};" : {outs} : {ins});')

  @staticmethod
  def raw_pair(lo: UOp, hi: UOp, r) -> str | None:
    """The 32-bit register of two 16-bit values read by plain (ungated) loads of one buffer, or None."""
    def plain(x: UOp) -> tuple[UOp, ...] | None:
      src = memory_srcs(x) if x.op is Ops.LOAD else ()
      ok = len(src) == 2 and src[0].op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL) and src[0].dtype.base.itemsize == 2
      return src if ok else None
    if not ((lo_src := plain(lo)) and (hi_src := plain(hi))): return None
    (buf, i0), (buf1, i1) = lo_src, hi_src
    step, parity = simplify(i1 - i0), simplify(i0 % 2)
    if buf is buf1 and step.op is Ops.CONST and step.arg == 1 and parity.op is Ops.CONST and parity.arg == 0:
      return f"(*((const unsigned*)({r(buf)}+{r(i0)})))"
    return f"((unsigned){r(buf)}[{r(i0)}]|((unsigned){r(buf1)}[{r(i1)}]<<16))"

  def kernel_header(self, name: str, params: list[str], uops: list[UOp]) -> str:
    threads = 1
    for u in uops:
      if u.op is Ops.SPECIAL and u.arg.name.startswith("l"): threads *= u.arg.size
    params = [p.replace(" restrict ", " __restrict__ ") for p in params]
    return f"{self.kernel_prefix}void __launch_bounds__({threads}) {name}({', '.join(params)}) {{"
