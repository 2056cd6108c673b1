"""Model state: finding a model's tensors, state dicts, and reading and writing weights files.

Tensors are named by the attribute path that reaches them (`layers.0.weight`), as in PyTorch, so weights move between
the two. safetensors files are validated in full before anything is loaded, then read through a memory map (the only
copy is the one into the device buffer). PyTorch checkpoints are read without torch by a restricted unpickler that
knows only tensor storage and plain containers, so loading a checkpoint can never run code.
"""
from __future__ import annotations
import collections
import json
import mmap
import os
import pickle
import struct
import sys
import types
import zipfile
from typing import Any, BinaryIO, Iterator, NamedTuple
import numpy as np
from fusegrad.dtype import DType, dtypes
from fusegrad.device import numpy_to_storage
from fusegrad.helpers import prod
from fusegrad.tensor import Tensor

# ***** finding tensors *****

_NOT_WALKED = (types.ModuleType, type, types.FunctionType, types.MethodType, types.BuiltinFunctionType, str, bytes)


def _named_tensors(obj: Any, prefix: str, seen: set[int]) -> Iterator[tuple[str, Tensor]]:
  """(name, tensor) for every Tensor reachable from obj through attributes, lists, tuples and dicts."""
  if isinstance(obj, Tensor):
    yield prefix.rstrip("."), obj
    return
  if isinstance(obj, _NOT_WALKED) or id(obj) in seen: return
  seen.add(id(obj))
  if isinstance(obj, (list, tuple)): items: Any = enumerate(obj)
  elif isinstance(obj, dict): items = obj.items()
  elif hasattr(obj, "__dict__"): items = vars(obj).items()
  else: return
  for key, value in items: yield from _named_tensors(value, f"{prefix}{key}.", seen)


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
  """Every Tensor reachable from obj, keyed by its path: attributes and dict keys by name, list items by index,
  joined with dots (`layers.0.weight`). A tensor reachable along several paths appears under each."""
  return dict(_named_tensors(obj, prefix, set()))


def get_parameters(obj: Any) -> list[Tensor]:
  """Every distinct Tensor reachable from obj (see get_state_dict), each once, in state-dict order."""
  return list({id(t): t for t in get_state_dict(obj).values()}.values())


class LoadResult(NamedTuple):
  """The keys load_state_dict skipped (only non-empty with strict=False)."""
  missing_keys: list[str]
  unexpected_keys: list[str]


def _as_tensor(value: Any) -> Tensor:
  if isinstance(value, Tensor): return value
  if isinstance(value, np.ndarray): return Tensor(value)
  raise TypeError(f"load_state_dict: values must be Tensors or numpy arrays, got {type(value).__name__}")


def load_state_dict(model: Any, state_dict: dict[str, Any], strict: bool = True) -> LoadResult:
  """Copy state_dict's tensors into the model's tensors of the same name, converted to their dtype and device, and
  realize them together. Checks everything first, so a failed load changes nothing: a shape mismatch is always an
  error, missing or unexpected keys are errors when strict."""
  own = get_state_dict(model)
  values = {k: _as_tensor(v) for k, v in state_dict.items()}
  missing = [k for k in own if k not in values]
  unexpected = [k for k in values if k not in own]
  mismatched = [f"{k} (checkpoint {tuple(values[k].shape)}, model {tuple(t.shape)})" for k, t in own.items()
                if k in values and tuple(values[k].shape) != tuple(t.shape)]
  problems = [f"{what}: {', '.join(keys)}" for what, keys in
              (("missing keys", missing if strict else []), ("unexpected keys", unexpected if strict else []),
               ("shape mismatch", mismatched)) if keys]
  if problems:
    hint = "; pass strict=False to skip missing/unexpected keys" if strict and (missing or unexpected) else ""
    raise RuntimeError(f"load_state_dict: can't load into {type(model).__name__}: {'; '.join(problems)}{hint}")
  loaded = []
  for key, target in own.items():
    if key not in values: continue
    target.assign(values[key].detach().to(target.device).cast(target.dtype))
    loaded.append(target)
  Tensor.realize_all(*loaded)
  return LoadResult(missing, unexpected)


# ***** safetensors *****

SAFETENSORS_DTYPES: dict[str, DType] = {
  "F64": dtypes.float64, "F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16,
  "I64": dtypes.int64, "I32": dtypes.int32, "I16": dtypes.int16, "I8": dtypes.int8,
  "U64": dtypes.uint64, "U32": dtypes.uint32, "U16": dtypes.uint16, "U8": dtypes.uint8, "BOOL": dtypes.bool}
_SAFETENSORS_NAMES = {dt: name for name, dt in SAFETENSORS_DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024   # as the reference implementation: a bigger header is a corrupt length


class _Entry(NamedTuple):
  name: str
  dtype: DType
  shape: tuple[int, ...]
  begin: int
  end: int


def _raw_to_numpy(raw: np.ndarray, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
  """Little-endian bytes -> a host array fusegrad can take: bfloat16 widens exactly to float32 (Tensor() narrows it
  back without loss); big-endian hosts get swapped copies."""
  if dtype is dtypes.bfloat16:
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
  arr = raw.view(np.dtype(dtype.fmt).newbyteorder("<")).reshape(shape)
  return arr if sys.byteorder == "little" else arr.astype(arr.dtype.newbyteorder("="))


def _host_bytes(arr: np.ndarray, dtype: DType) -> np.ndarray:
  """What a tensor's numpy() gave -> its little-endian storage bytes."""
  stored = numpy_to_storage(arr, dtype)
  if sys.byteorder != "little": stored = stored.astype(stored.dtype.newbyteorder("<"))
  return np.ascontiguousarray(stored).reshape(-1).view(np.uint8)


def _is_int(x: Any) -> bool: return isinstance(x, int) and not isinstance(x, bool)


def _parse_entry(name: Any, info: Any, path: str) -> _Entry:
  def bad(problem: str) -> ValueError: return ValueError(f"safe_load: {path}: tensor {name!r}: {problem}")
  if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
    raise bad(f"expected an object with exactly dtype, shape and data_offsets, got {info!r}")
  if info["dtype"] not in SAFETENSORS_DTYPES:
    raise bad(f"unknown dtype {info['dtype']!r}; known: {', '.join(SAFETENSORS_DTYPES)}")
  shape, offsets = info["shape"], info["data_offsets"]
  if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
    raise bad(f"shape must be a list of non-negative ints, got {shape!r}")
  if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) and o >= 0 for o in offsets):
    raise bad(f"data_offsets must be [begin, end] with non-negative ints, got {offsets!r}")
  dtype, (begin, end) = SAFETENSORS_DTYPES[info["dtype"]], offsets
  if end < begin: raise bad(f"data_offsets {offsets} end before they begin")
  if end - begin != prod(shape) * dtype.itemsize:
    raise bad(f"{end - begin} bytes for shape {shape} of {info['dtype']}, which needs {prod(shape) * dtype.itemsize}")
  return _Entry(name, dtype, tuple(shape), begin, end)


def _parse_header(raw: bytes, data_len: int, path: str) -> list[_Entry]:
  """The header's tensors, checked: known dtypes, byte counts that fit the shapes, and offsets that tile the data
  section exactly (in range, no overlaps, no holes — as the format requires)."""
  try:
    header = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"safe_load: {path}: the header is not valid UTF-8 JSON ({e})") from None
  if not isinstance(header, dict): raise ValueError(f"safe_load: {path}: the header must be a JSON object")
  metadata = header.pop("__metadata__", {})
  if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
    raise ValueError(f"safe_load: {path}: __metadata__ must map strings to strings, got {metadata!r}")
  entries = sorted((_parse_entry(k, v, path) for k, v in header.items()), key=lambda e: (e.begin, e.end))
  position = 0
  for e in entries:
    if e.end > data_len:
      raise ValueError(f"safe_load: {path}: tensor {e.name!r} ends at byte {e.end} of a {data_len}-byte data section")
    if e.begin != position:
      what = "overlaps the previous tensor" if e.begin < position else f"leaves a hole at bytes {position}..{e.begin}"
      raise ValueError(f"safe_load: {path}: tensor {e.name!r} at data_offsets [{e.begin}, {e.end}] {what}")
    position = e.end
  if position != data_len:
    raise ValueError(f"safe_load: {path}: the data section has {data_len} bytes, the tensors cover {position}")
  order = {name: i for i, name in enumerate(header)}
  return sorted(entries, key=lambda e: order[e.name])


def _read_safetensors_header(f: BinaryIO, path: str) -> tuple[list[_Entry], int]:
  size = os.fstat(f.fileno()).st_size
  if size < 8: raise ValueError(f"safe_load: {path}: {size} bytes is too short for the 8-byte header length")
  (header_len,) = struct.unpack("<Q", f.read(8))
  if header_len > min(size - 8, _MAX_HEADER):
    raise ValueError(f"safe_load: {path}: header length {header_len} is larger than the "
                     f"{'file allows' if header_len > size - 8 else 'limit of 100 MiB'} (file has {size} bytes)")
  return _parse_header(f.read(header_len), size - 8 - header_len, path), 8 + header_len


def safe_load(path: str | os.PathLike) -> dict[str, Tensor]:
  """The tensors of a safetensors file, in header order. The file is checked before anything is read, then mapped
  into memory, so each tensor is copied once, straight into its device buffer. ValueError on a malformed file."""
  path = os.fspath(path)
  with open(path, "rb") as f:
    entries, data_start = _read_safetensors_header(f, path)
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
      return _tensors_from_map(mapped, entries, data_start)


def _tensors_from_map(mapped: mmap.mmap, entries: list[_Entry], data_start: int) -> dict[str, Tensor]:
  """Tensors copied out of the mapped file; no array viewing the map outlives this call, so the map can close."""
  out = {}
  for e in entries:
    raw = np.frombuffer(mapped, dtype=np.uint8, count=e.end - e.begin, offset=data_start + e.begin)
    out[e.name] = Tensor(_raw_to_numpy(raw, e.dtype, e.shape), dtype=e.dtype).realize()
    del raw
  return out


def safe_save(tensors: dict[str, Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
  """Write tensors to a safetensors file. Tensors are laid out widest dtype first so every one is aligned to its
  itemsize; the file is written beside the target and renamed into place, so a failed save leaves no partial file."""
  path = os.fspath(path)
  for name, t in tensors.items():
    if not isinstance(name, str) or name == "__metadata__":
      raise ValueError(f"safe_save: {path}: tensor names must be strings other than __metadata__, got {name!r}")
    if not isinstance(t, Tensor): raise TypeError(f"safe_save: {path}: {name!r} is a {type(t).__name__}, not a Tensor")
    if t.dtype not in _SAFETENSORS_NAMES:
      raise TypeError(f"safe_save: {path}: {name!r} has dtype {t.dtype.name}, which safetensors files can't hold")
  if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
    raise TypeError(f"safe_save: {path}: metadata must map strings to strings")
  Tensor.realize_all(*tensors.values())
  order = sorted(tensors, key=lambda name: -tensors[name].dtype.itemsize)
  blobs = [_host_bytes(tensors[name].numpy(), tensors[name].dtype) for name in order]
  header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
  position = 0
  for name, blob in zip(order, blobs):
    header[name] = {"dtype": _SAFETENSORS_NAMES[tensors[name].dtype], "shape": list(tensors[name].shape),
                    "data_offsets": [position, position + blob.size]}
    position += blob.size
  encoded = json.dumps(header, separators=(",", ":")).encode()
  encoded += b" " * (-len(encoded) % 8)
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      f.write(struct.pack("<Q", len(encoded)) + encoded)
      for blob in blobs: f.write(blob.data)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp): os.remove(tmp)


# ***** PyTorch checkpoints *****

_TORCH_LEGACY_MAGIC = 0x1950a86a20f9469cfc6c
_TORCH_LEGACY_PROTOCOL = 1001
_TORCH_DTYPES: dict[str, DType] = {
  "float64": dtypes.float64, "double": dtypes.float64, "float32": dtypes.float32, "float": dtypes.float32,
  "float16": dtypes.float16, "half": dtypes.float16, "bfloat16": dtypes.bfloat16, "int64": dtypes.int64,
  "long": dtypes.int64, "int32": dtypes.int32, "int": dtypes.int32, "int16": dtypes.int16, "short": dtypes.int16,
  "int8": dtypes.int8, "uint8": dtypes.uint8, "uint16": dtypes.uint16, "uint32": dtypes.uint32,
  "uint64": dtypes.uint64, "bool": dtypes.bool}
_TORCH_STORAGES: dict[str, DType] = {
  "DoubleStorage": dtypes.float64, "FloatStorage": dtypes.float32, "HalfStorage": dtypes.float16,
  "BFloat16Storage": dtypes.bfloat16, "LongStorage": dtypes.int64, "IntStorage": dtypes.int32,
  "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8, "BoolStorage": dtypes.bool}
# torch dtypes fusegrad lacks (float8_e4m3fn, complex64, qint8, bits8, int4, uint3, ...); storages end in "Storage"
_TORCH_UNSUPPORTED = ("float8", "float4", "complex", "cfloat", "cdouble", "chalf", "qint", "quint", "bits", "int",
                      "uint")


class UnsafeCheckpointError(pickle.UnpicklingError):
  """A checkpoint that would call or build anything but tensor storage and plain containers: refused unrun."""


class _Refuse:
  """Refuses the BUILD opcode: a pickle can't set state on the loader's own objects."""
  __slots__ = ()
  def __setstate__(self, state: Any) -> None:
    raise UnsafeCheckpointError(f"refusing to load checkpoint: it sets state on a {type(self).__name__[1:]}")


class _DTypeMarker(_Refuse):
  """What the pickle's reference to a torch dtype or typed storage class (torch.FloatStorage) stands for."""
  __slots__ = ("dtype",)
  def __init__(self, dtype: DType | None): self.dtype = dtype   # None: an UntypedStorage (bytes)


class _Storage(_Refuse):
  """One storage of the checkpoint: `nbytes` raw bytes, read when `data` is filled in."""
  __slots__ = ("key", "dtype", "nbytes", "data")
  def __init__(self, key: str, dtype: DType | None, nbytes: int):
    self.key, self.dtype, self.nbytes, self.data = key, dtype, nbytes, None


class _StoredTensor(_Refuse):
  """A tensor as the checkpoint describes it: a strided view of a storage; made into a Tensor after the load."""
  __slots__ = ("storage", "offset", "shape", "strides", "dtype")
  def __init__(self, storage: _Storage, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: DType):
    self.storage, self.offset, self.shape, self.strides, self.dtype = storage, offset, shape, strides, dtype


def _rebuild_tensor(storage: Any, offset: Any, shape: Any, strides: Any, dtype: Any) -> _StoredTensor:
  if not isinstance(storage, _Storage): raise ValueError("malformed checkpoint: a tensor's storage is not a storage")
  fields = (offset, *shape, *strides) if isinstance(shape, tuple) and isinstance(strides, tuple) else (None,)
  if not all(_is_int(x) and x >= 0 for x in fields) or len(shape) != len(strides):
    raise ValueError(f"malformed checkpoint: tensor layout offset {offset!r}, size {shape!r}, stride {strides!r}")
  if not isinstance(dtype, _DTypeMarker) or dtype.dtype is None:
    raise ValueError("malformed checkpoint: a tensor's dtype is not a dtype")
  return _StoredTensor(storage, offset, shape, strides, dtype.dtype)


def _rebuild_tensor_v2(storage, offset, shape, strides, requires_grad, hooks, metadata=None) -> _StoredTensor:
  return _rebuild_tensor(storage, offset, shape, strides, _DTypeMarker(getattr(storage, "dtype", None)))


def _rebuild_tensor_v3(storage, offset, shape, strides, requires_grad, hooks, dtype, metadata=None) -> _StoredTensor:
  return _rebuild_tensor(storage, offset, shape, strides, dtype)


def _rebuild_parameter(data: Any, requires_grad: Any, hooks: Any) -> Any: return data


def _encode_latin1(text: Any, encoding: Any = "latin1") -> bytes:
  """Protocol-2 pickles spell bytes as _codecs.encode(str, 'latin1'); no other codec is run."""
  if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
    raise UnsafeCheckpointError(f"refusing to load checkpoint: it calls _codecs.encode with {encoding!r}")
  return text.encode("latin1")


_SAFE_GLOBALS: dict[tuple[str, str], Any] = {
  ("collections", "OrderedDict"): collections.OrderedDict,
  ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
  ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
  ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
  ("torch", "Size"): tuple,
  ("_codecs", "encode"): _encode_latin1,
  ("torch.storage", "UntypedStorage"): _DTypeMarker(None),
  **{("torch", name): _DTypeMarker(dt) for name, dt in {**_TORCH_DTYPES, **_TORCH_STORAGES}.items()}}


class _RestrictedUnpickler(pickle.Unpickler):
  """An Unpickler whose globals are the few a tensor checkpoint needs, each mapped to the loader's own harmless
  stand-in; storages come through persistent ids and are recorded, to be read by the caller."""

  def __init__(self, f: BinaryIO):
    super().__init__(f, encoding="utf-8")
    self.storages: dict[str, _Storage] = {}

  def find_class(self, module: str, name: str) -> Any:
    if (module, name) in _SAFE_GLOBALS: return _SAFE_GLOBALS[(module, name)]
    if module == "torch" and (name.endswith("Storage") or name.startswith(_TORCH_UNSUPPORTED)):
      raise ValueError(f"unsupported tensor type torch.{name}; supported: {', '.join(sorted(set(_TORCH_DTYPES)))}")
    raise UnsafeCheckpointError(f"refusing to load checkpoint: it references {module}.{name} (only tensor storage "
                                f"and plain containers are allowed; save a model's state_dict(), not the model)")

  def persistent_load(self, pid: Any) -> _Storage:
    if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage" and isinstance(pid[1], _DTypeMarker)
            and isinstance(pid[2], str) and _is_int(pid[4]) and pid[4] >= 0 and (len(pid) == 5 or pid[5] is None)):
      raise UnsafeCheckpointError(f"refusing to load checkpoint: unknown persistent id {pid!r}")
    dtype, key = pid[1].dtype, pid[2]
    nbytes = pid[4] * (dtype.itemsize if dtype is not None else 1)
    if key not in self.storages: self.storages[key] = _Storage(key, dtype, nbytes)
    return self.storages[key]


def _stored_to_tensor(st: _StoredTensor, big_endian: bool) -> Tensor:
  """Copy the strided view out of its storage (bounds checked first: the layout comes from the file)."""
  raw, itemsize = st.storage.data, st.dtype.itemsize
  last = st.offset + sum((n - 1) * s for n, s in zip(st.shape, st.strides)) if prod(st.shape) else -1
  if (last + 1) * itemsize > raw.size:
    raise ValueError(f"malformed checkpoint: a tensor of shape {st.shape}, stride {st.strides}, offset {st.offset} "
                     f"reads past the end of its {raw.size}-byte storage {st.storage.key!r}")
  elems = raw[:raw.size - raw.size % itemsize].view(f"V{itemsize}")
  view = np.lib.stride_tricks.as_strided(elems[st.offset:] if prod(st.shape) else elems[:0], st.shape,
                                         tuple(s * itemsize for s in st.strides), writeable=False)
  contiguous = np.ascontiguousarray(view).reshape(-1).view(np.uint8)
  if big_endian: contiguous = contiguous.reshape(-1, itemsize)[:, ::-1].reshape(-1)
  return Tensor(_raw_to_numpy(np.ascontiguousarray(contiguous), st.dtype, st.shape), dtype=st.dtype)


def _materialize(obj: Any, big_endian: bool, memo: dict[int, Any]) -> Any:
  """The loaded object with every _StoredTensor replaced by a Tensor (containers rebuilt, shared ones shared)."""
  if isinstance(obj, _StoredTensor): return _stored_to_tensor(obj, big_endian)
  if id(obj) in memo: return memo[id(obj)]
  if isinstance(obj, dict):
    out = memo[id(obj)] = type(obj)()
    for k, v in obj.items(): out[k] = _materialize(v, big_endian, memo)
    return out
  if isinstance(obj, list):
    out_list: list[Any] = []
    memo[id(obj)] = out_list
    out_list.extend(_materialize(v, big_endian, memo) for v in obj)
    return out_list
  if isinstance(obj, tuple): return tuple(_materialize(v, big_endian, memo) for v in obj)
  if isinstance(obj, (_Storage, _DTypeMarker)):
    raise ValueError("unsupported checkpoint: it holds a bare storage or dtype, not a tensor")
  return obj


def _read_zip(path: str) -> tuple[Any, bool]:
  """The zip layout of torch.save (since 1.6): <archive>/data.pkl, <archive>/data/<key>, <archive>/byteorder."""
  with zipfile.ZipFile(path) as zf:
    names = set(zf.namelist())
    pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1: raise ValueError("a zip archive, but not one torch.save wrote (no <archive>/data.pkl)")
    root = pickles[0][:-len("data.pkl")]
    big_endian = f"{root}byteorder" in names and zf.read(f"{root}byteorder").strip() == b"big"
    with zf.open(pickles[0]) as f:
      unpickler = _RestrictedUnpickler(f)
      result = unpickler.load()
    for key, storage in unpickler.storages.items():
      if f"{root}data/{key}" not in names: raise ValueError(f"storage {key!r} is missing from the archive")
      storage.data = np.frombuffer(zf.read(f"{root}data/{key}"), dtype=np.uint8)
      if storage.data.size < storage.nbytes:
        raise ValueError(f"storage {key!r} has {storage.data.size} bytes, the checkpoint says {storage.nbytes}")
  return result, big_endian


def _read_legacy(path: str) -> tuple[Any, bool]:
  """The format of torch.save before 1.6: magic number, protocol and sys info as pickles, the object, the list of
  storage keys, then each storage as an 8-byte element count and its bytes."""
  with open(path, "rb") as f:
    if f.read(1) != b"\x80": raise ValueError("not a PyTorch checkpoint (neither a zip archive nor a pickle)")
    f.seek(0)
    magic, protocol, sys_info = (_RestrictedUnpickler(f).load() for _ in range(3))
    if magic != _TORCH_LEGACY_MAGIC or protocol != _TORCH_LEGACY_PROTOCOL:
      raise ValueError("not a PyTorch checkpoint: a pickle without torch.save's magic number")
    big_endian = isinstance(sys_info, dict) and sys_info.get("little_endian") is False
    unpickler = _RestrictedUnpickler(f)
    result = unpickler.load()
    keys = _RestrictedUnpickler(f).load()
    if not isinstance(keys, list) or set(keys) != set(unpickler.storages):
      raise ValueError(f"the storage list {keys!r} doesn't match the storages the tensors use")
    for key in keys:
      storage = unpickler.storages[key]
      count = int.from_bytes(f.read(8), "big" if big_endian else "little")
      storage.data = np.frombuffer(f.read(count * (storage.dtype.itemsize if storage.dtype else 1)), dtype=np.uint8)
      if storage.data.size < storage.nbytes: raise ValueError(f"storage {key!r} is truncated")
  return result, big_endian


def torch_load(path: str | os.PathLike) -> Any:
  """Load a PyTorch checkpoint (.pt/.pth, zip or legacy format) without torch: usually a dict[str, Tensor] (a state
  dict), else the saved containers with Tensors in them. A checkpoint that references anything but tensor storage and
  plain containers is refused with UnsafeCheckpointError (a pickle.UnpicklingError) before any of it runs; a
  malformed one raises ValueError. Both name the file."""
  path = os.fspath(path)
  try:
    result, big_endian = _read_zip(path) if zipfile.is_zipfile(path) else _read_legacy(path)
    return _materialize(result, big_endian, {})
  except UnsafeCheckpointError as e:
    raise UnsafeCheckpointError(f"torch_load: {path}: {e}") from None
  except (ValueError, TypeError, EOFError, IndexError, KeyError, AttributeError, struct.error, zipfile.BadZipFile,
          pickle.UnpicklingError) as e:
    raise ValueError(f"torch_load: {path}: {e}") from e
