"""fusegrad.nn.state: state-dict naming, strict loading, safetensors files and PyTorch checkpoints.

safetensors files are round-tripped for every dtype and cross-checked against the `safetensors` package both ways
(skipped where it isn't installed); corrupt files must raise a ValueError naming the file and the problem, and leave no
file open. PyTorch checkpoints are written by torch here (zip and legacy formats, strided and shared storages) and must
load identically; checkpoints that would run code must be refused before any of it runs.
"""
import collections
import gc
import json
import os
import pickle
import re
import struct
import warnings
import zipfile

import numpy as np
import pytest
import torch

import fusegrad.nn as nn
from fusegrad import Tensor, dtypes
from fusegrad.nn import state
from fusegrad.nn.state import (UnsafeCheckpointError, get_parameters, get_state_dict, load_state_dict, safe_load,
                               safe_save, torch_load)


def open_fds() -> int: return len(os.listdir("/proc/self/fd"))


# ***** state dicts *****

class Block:
  def __init__(self):
    self.norm = nn.LayerNorm(4)
    self.layers = [nn.Linear(4, 4), nn.Linear(4, 2, bias=False)]

  def __call__(self, x: Tensor) -> Tensor: return self.layers[1](self.layers[0](self.norm(x)).relu())


class Model:
  def __init__(self):
    self.blocks = {"first": Block(), "second": Block()}
    self.scale = Tensor([2.0])
    self.activation = Tensor.relu   # functions and other non-containers are not walked
    self.name = "model"


class TorchBlock(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.norm = torch.nn.LayerNorm(4)
    self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 2, bias=False)])

  def forward(self, x): return self.layers[1](self.layers[0](self.norm(x)).relu())


def test_state_dict_keys():
  keys = list(get_state_dict(Model()))
  assert keys == [f"blocks.{b}.{k}" for b in ("first", "second") for k in ("norm.weight", "norm.bias",
                  "layers.0.weight", "layers.0.bias", "layers.1.weight")] + ["scale"]
  assert list(get_state_dict(Block())) == list(TorchBlock().state_dict())
  assert list(get_state_dict(Block(), prefix="enc.")) == [f"enc.{k}" for k in TorchBlock().state_dict()]


def test_get_parameters_deduplicates():
  block = Block()
  block.tied = block.layers[0].weight
  block.cycle = block   # reference cycles are fine
  params = get_parameters(block)
  assert len(params) == 5 and len({id(p) for p in params}) == 5
  assert "tied" in get_state_dict(block)


def test_load_state_dict_from_torch():
  theirs, ours = TorchBlock(), Block()
  result = load_state_dict(ours, {k: v.numpy().astype(np.float64) for k, v in theirs.state_dict().items()})
  assert result == ([], [])
  assert all(t.dtype is dtypes.float32 and t.lazydata.realized is not None for t in get_state_dict(ours).values())
  x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
  np.testing.assert_allclose(ours(Tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(), atol=1e-6)


def test_load_state_dict_errors_change_nothing():
  block = Block()
  before = {k: v.numpy() for k, v in get_state_dict(block).items()}
  good = {k: Tensor.zeros(*v.shape) for k, v in get_state_dict(block).items()}
  missing = {k: v for k, v in good.items() if k != "layers.0.bias"}
  with pytest.raises(RuntimeError, match=r"can't load into Block: missing keys: layers.0.bias; pass strict=False"):
    load_state_dict(block, missing)
  with pytest.raises(RuntimeError, match=r"unexpected keys: extra.weight"):
    load_state_dict(block, {**good, "extra.weight": Tensor.zeros(2)})
  bad_shape = {**good, "layers.1.weight": Tensor.zeros(4, 2)}
  with pytest.raises(RuntimeError, match=r"shape mismatch: layers.1.weight \(checkpoint \(4, 2\), model \(2, 4\)\)"):
    load_state_dict(block, bad_shape)
  with pytest.raises(RuntimeError, match="shape mismatch"): load_state_dict(block, bad_shape, strict=False)
  with pytest.raises(TypeError, match="Tensors or numpy arrays"): load_state_dict(block, {**good, "norm.bias": [1.0]})
  for k, v in get_state_dict(block).items(): np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)
  result = load_state_dict(block, {**missing, "extra": Tensor.ones(1)}, strict=False)
  assert result.missing_keys == ["layers.0.bias"] and result.unexpected_keys == ["extra"]
  np.testing.assert_array_equal(block.layers[0].bias.numpy(), before["layers.0.bias"])
  np.testing.assert_array_equal(block.layers[0].weight.numpy(), np.zeros((4, 4)))


# ***** safetensors *****

ALL_DTYPES = [dtypes.float64, dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.int64, dtypes.int32,
              dtypes.int16, dtypes.int8, dtypes.uint64, dtypes.uint32, dtypes.uint16, dtypes.uint8, dtypes.bool]


def sample_tensors() -> dict[str, Tensor]:
  """One tensor of every dtype, plus a 0-d, an empty and a non-contiguous one."""
  rng = np.random.default_rng(0)
  out = {}
  for dt in ALL_DTYPES:
    values = rng.random((3, 5)) < 0.5 if dt is dtypes.bool else rng.integers(0, 100, (3, 5)) / 4
    out[f"t.{dt.name}"] = Tensor(values, dtype=dt)
  out["scalar"], out["empty"] = Tensor(7.5), Tensor.zeros(0, 4, dtype=dtypes.int16)
  out["view"] = Tensor.arange(12).reshape(3, 4).T[1:]
  return out


def assert_same_tensors(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
  assert set(a) == set(b)
  for k in a:
    assert a[k].dtype is b[k].dtype and a[k].shape == b[k].shape, k
    np.testing.assert_array_equal(a[k].numpy(), b[k].numpy(), err_msg=k)


def test_safetensors_round_trip(tmp_path):
  tensors, path = sample_tensors(), tmp_path / "model.safetensors"
  safe_save(tensors, path, metadata={"format": "pt", "note": "hi"})
  assert_same_tensors(safe_load(path), tensors)
  header_len = struct.unpack("<Q", path.read_bytes()[:8])[0]
  header = json.loads(path.read_bytes()[8:8 + header_len])
  assert header_len % 8 == 0 and header["__metadata__"] == {"format": "pt", "note": "hi"}
  for name, info in header.items():
    if name != "__metadata__": assert info["data_offsets"][0] % tensors[name].dtype.itemsize == 0, "aligned"
  assert os.listdir(tmp_path) == ["model.safetensors"], "no temporary file left behind"
  safe_save({"e": Tensor.zeros(0, 2)}, path)   # an empty data section
  assert safe_load(path)["e"].shape == (0, 2)


def test_safetensors_interop_with_reference_package(tmp_path):
  st = pytest.importorskip("safetensors.torch")
  tensors = sample_tensors()
  safe_save(tensors, tmp_path / "ours.safetensors")
  theirs = st.load_file(tmp_path / "ours.safetensors")
  for k, v in tensors.items():
    assert str(theirs[k].dtype) == f"torch.{v.dtype.name}", k
    np.testing.assert_array_equal(theirs[k].float().numpy() if v.dtype is dtypes.bfloat16 else theirs[k].numpy(),
                                  v.numpy(), err_msg=k)
  st.save_file(theirs, tmp_path / "theirs.safetensors", metadata={"k": "v"})
  assert_same_tensors(safe_load(tmp_path / "theirs.safetensors"), tensors)


def test_safe_load_maps_the_file(tmp_path, monkeypatch):
  safe_save({"w": Tensor.ones(64, 64)}, tmp_path / "w.safetensors")
  maps = []
  real_mmap = state.mmap.mmap
  monkeypatch.setattr(state.mmap, "mmap", lambda *a, **kw: maps.append(a) or real_mmap(*a, **kw))
  np.testing.assert_array_equal(safe_load(tmp_path / "w.safetensors")["w"].numpy(), np.ones((64, 64)))
  assert len(maps) == 1


def write_raw(path, header, data: bytes = b"", header_len: int | None = None) -> None:
  encoded = header if isinstance(header, bytes) else json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(encoded) if header_len is None else header_len) + encoded + data)


F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
CORRUPT = {
  "too short": (lambda p: p.write_bytes(b"\x01\x02"), "too short for the 8-byte header length"),
  "huge header length": (lambda p: write_raw(p, {"a": F32_2}, bytes(8), header_len=1 << 40), "header length"),
  "header past end": (lambda p: write_raw(p, {"a": F32_2}, bytes(8), header_len=500), "larger than the file"),
  "not json": (lambda p: write_raw(p, b"{not json", bytes(8)), "not valid UTF-8 JSON"),
  "not utf8": (lambda p: write_raw(p, b"\xff\xfe", bytes(8)), "not valid UTF-8 JSON"),
  "json list": (lambda p: write_raw(p, [1, 2], bytes(8)), "must be a JSON object"),
  "unknown dtype": (lambda p: write_raw(p, {"a": {**F32_2, "dtype": "F8"}}, bytes(8)), "unknown dtype 'F8'"),
  "missing field": (lambda p: write_raw(p, {"a": {"dtype": "F32", "shape": [2]}}, bytes(8)), "exactly dtype"),
  "bad shape": (lambda p: write_raw(p, {"a": {**F32_2, "shape": [True, 2]}}, bytes(8)), "shape must be a list"),
  "negative offset": (lambda p: write_raw(p, {"a": {**F32_2, "data_offsets": [-8, 0]}}, bytes(8)), "data_offsets"),
  "reversed offsets": (lambda p: write_raw(p, {"a": {**F32_2, "data_offsets": [8, 0]}}, bytes(8)), "end before"),
  "wrong byte count": (lambda p: write_raw(p, {"a": {**F32_2, "shape": [3]}}, bytes(8)), "8 bytes for shape [3]"),
  "offsets past end": (lambda p: write_raw(p, {"a": {**F32_2, "data_offsets": [8, 16]}}, bytes(8)), "ends at byte 16"),
  "truncated data": (lambda p: write_raw(p, {"a": F32_2}, bytes(5)), "ends at byte 8 of a 5-byte data section"),
  "overlap": (lambda p: write_raw(p, {"a": F32_2, "b": {**F32_2, "data_offsets": [4, 12]}}, bytes(12)), "overlaps"),
  "hole": (lambda p: write_raw(p, {"a": {**F32_2, "data_offsets": [4, 12]}}, bytes(12)), "leaves a hole"),
  "trailing bytes": (lambda p: write_raw(p, {"a": F32_2}, bytes(12)), "the tensors cover 8"),
  "bad metadata": (lambda p: write_raw(p, {"__metadata__": {"a": 1}, "a": F32_2}, bytes(8)), "__metadata__"),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_corrupt_safetensors(tmp_path, case):
  make, problem = CORRUPT[case]
  path = tmp_path / "bad.safetensors"
  make(path)
  fds = open_fds()
  with warnings.catch_warnings():
    warnings.simplefilter("error", ResourceWarning)
    with pytest.raises(ValueError, match=re.escape(f"safe_load: {path}: ") + ".*" + re.escape(problem)):
      safe_load(path)
    gc.collect()
  assert open_fds() == fds, "a failed load left a file open"
  os.remove(path)


def test_safe_load_and_save_leave_no_open_files(tmp_path):
  path = tmp_path / "ok.safetensors"
  fds = open_fds()
  safe_save(sample_tensors(), path)
  loaded = safe_load(path)
  assert open_fds() == fds
  os.remove(path)
  assert loaded["t.float32"].numpy().shape == (3, 5), "tensors don't depend on the file"


def test_safe_save_errors(tmp_path):
  with pytest.raises(TypeError, match="'w' is a ndarray, not a Tensor"): safe_save({"w": np.ones(2)}, tmp_path / "a")
  with pytest.raises(ValueError, match="tensor names must be strings"):
    safe_save({"__metadata__": Tensor.ones(2)}, tmp_path / "a")
  with pytest.raises(TypeError, match="metadata must map strings to strings"):
    safe_save({"w": Tensor.ones(2)}, tmp_path / "a", metadata={"epoch": 3})
  assert os.listdir(tmp_path) == []


# ***** PyTorch checkpoints *****

def torch_checkpoint() -> dict:
  base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
  sd = collections.OrderedDict(
    transposed=base.t(), offset=base[1:3, 2:5], strided=base[::2, ::3], whole=base,   # four views of one storage
    bf16=torch.tensor([1.5, -2.25, 3e38], dtype=torch.bfloat16), f16=torch.tensor([0.5, -65504], dtype=torch.float16),
    f64=torch.tensor([1e-300, 2.5], dtype=torch.float64), i8=torch.tensor([-128, 127], dtype=torch.int8),
    u8=torch.tensor([0, 255], dtype=torch.uint8), i16=torch.tensor([-3, 3], dtype=torch.int16),
    i32=torch.tensor([-(2 ** 31), 5], dtype=torch.int32), i64=torch.tensor([2 ** 40, -1]),
    u16=torch.tensor([65535, 1], dtype=torch.uint16), u32=torch.tensor([2 ** 32 - 1, 0], dtype=torch.uint32),
    b=torch.tensor([True, False, True]), scalar=torch.tensor(3.25), empty=torch.zeros(0, 3),
    param=torch.nn.Parameter(torch.ones(2, 2)))
  return sd


def check_checkpoint(loaded: dict, expected: dict) -> None:
  assert list(loaded) == list(expected)
  for k, v in expected.items():
    assert isinstance(loaded[k], Tensor), k
    assert loaded[k].shape == tuple(v.shape) and loaded[k].dtype.name == str(v.dtype).removeprefix("torch."), k
    np.testing.assert_array_equal(loaded[k].numpy(), v.detach().float().numpy() if v.dtype == torch.bfloat16 else
                                  v.detach().numpy(), err_msg=k)


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_torch_load(tmp_path, zip_format):
  sd = torch_checkpoint()
  if not zip_format: sd.pop("u16"), sd.pop("u32")   # torch's legacy writer can't save the newer unsigned types
  torch.save(sd, tmp_path / "ckpt.pt", _use_new_zipfile_serialization=zip_format)
  fds = open_fds()
  check_checkpoint(torch_load(tmp_path / "ckpt.pt"), sd)
  assert open_fds() == fds


def test_torch_load_nested_containers_and_model(tmp_path):
  model = TorchBlock()
  torch.save({"model": model.state_dict(), "epoch": 3, "tags": ["a", b"raw"], "pair": (torch.ones(1), 2.5)},
             tmp_path / "ckpt.pth")
  loaded = torch_load(tmp_path / "ckpt.pth")
  assert loaded["epoch"] == 3 and loaded["tags"] == ["a", b"raw"] and loaded["pair"][1] == 2.5
  assert isinstance(loaded["pair"], tuple) and isinstance(loaded["pair"][0], Tensor)
  ours = Block()
  load_state_dict(ours, loaded["model"])
  x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
  np.testing.assert_allclose(ours(Tensor(x)).numpy(), model(torch.tensor(x)).detach().numpy(), atol=1e-6)


class Evil:
  """Pickles as a call to os.system that would create `marker`."""
  def __init__(self, marker): self.marker = marker
  def __reduce__(self): return (os.system, (f"touch {self.marker}",))


def rewrite_zip(path, edit) -> None:
  """Rewrite a torch.save zip with edit(name, data) -> data | None (None drops the entry)."""
  with zipfile.ZipFile(path) as zf: entries = [(n, zf.read(n)) for n in zf.namelist()]
  with zipfile.ZipFile(path, "w") as zf:
    for name, data in entries:
      data = edit(name, data)
      if data is not None: zf.writestr(name, data)


@pytest.mark.parametrize("how", ["torch_zip", "torch_legacy", "plain_pickle"])
def test_malicious_checkpoint_is_refused(tmp_path, how):
  marker, path = tmp_path / "pwned", tmp_path / "evil.pt"
  payload = {"weight": torch.ones(2), "evil": Evil(marker)}
  if how == "plain_pickle":
    path.write_bytes(pickle.dumps(Evil(marker), protocol=2))
  else:
    torch.save(payload, path, _use_new_zipfile_serialization=how == "torch_zip")
  with pytest.raises(UnsafeCheckpointError, match=r"refusing to load checkpoint: it references (posix|os)\.system "
                                                  r"\(only tensor storage and plain containers are allowed"):
    torch_load(path)
  assert isinstance(UnsafeCheckpointError("x"), pickle.UnpicklingError)
  assert not marker.exists(), "the checkpoint ran code"


def test_pickled_modules_and_builtins_are_refused(tmp_path):
  torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
  with pytest.raises(UnsafeCheckpointError, match=r"torch.nn.modules.linear.Linear .*save a model's state_dict"):
    torch_load(tmp_path / "module.pt")
  (tmp_path / "eval.pt").write_bytes(b"\x80\x02cbuiltins\neval\nX\x04\x00\x00\x001+1\x85R.")
  with pytest.raises(UnsafeCheckpointError, match="builtins.eval"): torch_load(tmp_path / "eval.pt")
  (tmp_path / "codec.pt").write_bytes(b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x06\x00\x00\x00rot_13\x86R.")
  with pytest.raises(UnsafeCheckpointError, match="_codecs.encode with 'rot_13'"): torch_load(tmp_path / "codec.pt")


def test_malformed_checkpoints(tmp_path):
  path = tmp_path / "ckpt.pt"
  torch.save({"w": torch.arange(37, dtype=torch.float32)}, path)
  rewrite_zip(path, lambda name, data: data.replace(b"K%\x85", b"K\xc8\x85") if name.endswith("data.pkl") else data)
  with pytest.raises(ValueError, match=r"torch_load: .*ckpt.pt: malformed checkpoint: a tensor of shape \(200,\).* "
                                       r"reads past the end of its 148-byte storage"):
    torch_load(path)
  torch.save({"w": torch.ones(4)}, path)
  rewrite_zip(path, lambda name, data: data[:6] if "/data/" in name else data)
  with pytest.raises(ValueError, match="storage '0' has 6 bytes, the checkpoint says 16"): torch_load(path)
  rewrite_zip(path, lambda name, data: None if "/data/" in name else data)
  with pytest.raises(ValueError, match="storage '0' is missing from the archive"): torch_load(path)
  torch.save({"w": torch.ones(4)}, path, _use_new_zipfile_serialization=False)
  path.write_bytes(path.read_bytes()[:-3])
  with pytest.raises(ValueError, match="storage .* is truncated"): torch_load(path)
  path.write_bytes(b"definitely not a checkpoint")
  with pytest.raises(ValueError, match="not a PyTorch checkpoint"): torch_load(path)
  torch.save({"w": torch.zeros(2, dtype=torch.complex64)}, path)
  with pytest.raises(ValueError, match="unsupported tensor type torch.ComplexFloatStorage"): torch_load(path)
