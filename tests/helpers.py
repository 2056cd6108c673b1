"""Shared test utilities: seeded inputs and the differential check against PyTorch.

`check_op` builds identical numpy inputs for torch and fusegrad, applies the same view and op on both sides and
compares shape, dtype and values (float tolerances; ints and bools exactly). The devices to run on come from
`test_devices` in conftest.py (the `device` fixture).
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from fusegrad import Tensor


TORCH_DTYPE_NAMES = {torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16",
                     torch.uint16: "uint16", torch.int32: "int32", torch.uint32: "uint32", torch.int64: "int64",
                     torch.uint64: "uint64", torch.float16: "float16", torch.bfloat16: "bfloat16",
                     torch.float32: "float32", torch.float64: "float64"}


def torch_dtype(name: str) -> torch.dtype:
  """The torch dtype with this fusegrad dtype name."""
  return next(t for t, n in TORCH_DTYPE_NAMES.items() if n == name)


@dataclass(frozen=True)
class Domain:
  """Where random inputs are drawn from. `nonzero` keeps |x| >= 0.5 (ints: x != 0), for denominators;
  `discrete` puts floats on a grid of 0.5, so ties and exact equality occur."""
  low: float = -2.0
  high: float = 2.0
  nonzero: bool = False
  discrete: bool = False


ANY, POS, NONZERO, GRID = Domain(), Domain(0.1, 3.0), Domain(nonzero=True), Domain(-2.0, 2.0, discrete=True)
INTS = Domain(-9, 9)


def make_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, domain: Domain = ANY) -> np.ndarray:
  """A seeded random array of `shape` and fusegrad dtype name `dtype`, drawn from `domain`."""
  if dtype == "bool": return np.asarray(rng.random(shape) < 0.5)
  np_dtype = np.dtype(dtype)
  if np.issubdtype(np_dtype, np.integer):
    values = rng.integers(int(domain.low), int(domain.high) + 1, size=shape)
    if domain.nonzero: values = np.where(values == 0, int(domain.high) or 1, values)
    return np.asarray(values, dtype=np_dtype)
  if domain.discrete:
    values = rng.integers(int(domain.low * 2), int(domain.high * 2) + 1, size=shape) / 2
  else:
    values = rng.uniform(domain.low, domain.high, size=shape)
  if domain.nonzero: values = np.where(np.abs(values) < 0.5, values + np.copysign(0.5, values), values)
  return np.asarray(values, dtype=np_dtype)


def make_inputs(inputs: Sequence[Any], dtype: str | Sequence[str], domain: Domain | Sequence[Domain],
                seed: int = 0) -> list[np.ndarray]:
  """Numpy arrays for `inputs`: a shape tuple is filled at random; an array (or list/scalar) is used as given."""
  rng = np.random.default_rng(seed)
  dtypes_ = [dtype] * len(inputs) if isinstance(dtype, str) else list(dtype)
  domains = [domain] * len(inputs) if isinstance(domain, Domain) else list(domain)
  arrays = []
  for item, dt, dom in zip(inputs, dtypes_, domains):
    if isinstance(item, tuple) and all(isinstance(d, int) for d in item): arrays.append(make_array(rng, item, dt, dom))
    else: arrays.append(np.asarray(item))
  return arrays


def to_numpy(t: torch.Tensor) -> np.ndarray:
  return t.detach().float().numpy() if t.dtype is torch.bfloat16 else t.detach().numpy()


def assert_same(got: Any, expected: Any, atol: float = 1e-5, rtol: float = 1e-5, device: str | None = None) -> None:
  """`got` (fusegrad; a Tensor or a sequence of them) matches `expected` (torch) in shape, dtype and value."""
  if isinstance(expected, (tuple, list)):
    assert isinstance(got, (tuple, list)), f"expected a sequence of {len(expected)} tensors, got {type(got).__name__}"
    assert len(got) == len(expected), f"expected {len(expected)} tensors, got {len(got)}"
    for g, e in zip(got, expected): assert_same(g, e, atol, rtol, device)
    return
  want_dtype = TORCH_DTYPE_NAMES[expected.dtype]
  assert tuple(got.shape) == tuple(expected.shape), f"shape: fusegrad {tuple(got.shape)}, torch {tuple(expected.shape)}"
  assert got.dtype.name == want_dtype, f"dtype: fusegrad {got.dtype.name}, torch {want_dtype}"
  if device is not None: assert got.device == device, f"device: {got.device!r}, expected {device!r}"
  actual, want = got.numpy(), to_numpy(expected)
  assert actual.shape == want.shape, f"numpy() shape {actual.shape}, expected {want.shape}"
  if expected.dtype.is_floating_point:
    np.testing.assert_allclose(actual.astype(np.float64), want.astype(np.float64), atol=atol, rtol=rtol)
  else:
    np.testing.assert_array_equal(actual, want)


def check_op(device: str, inputs: Sequence[Any], torch_fn: Callable, fg_fn: Callable | None = None, *,
             dtype: str | Sequence[str] = "float32", domain: Domain | Sequence[Domain] = ANY, atol: float = 1e-5,
             rtol: float = 1e-5, view: Callable | None = None, seed: int = 0) -> None:
  """Run `torch_fn` on torch tensors and `fg_fn` (default: the same function) on fusegrad tensors made from the
  same seeded inputs on `device`, after applying `view` to every input on both sides, and compare the results."""
  arrays = make_inputs(inputs, dtype, domain, seed)
  t_inputs = [torch.from_numpy(np.array(a)) for a in arrays]
  f_inputs = [Tensor(np.array(a), device=device) for a in arrays]
  if view is not None: t_inputs, f_inputs = [view(t) for t in t_inputs], [view(f) for f in f_inputs]
  expected = torch_fn(*t_inputs)
  got = (fg_fn or torch_fn)(*f_inputs)
  assert_same(got, expected, atol, rtol, device)
