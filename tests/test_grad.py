"""Differential tests of reverse-mode autograd against PyTorch on every backend in `test_devices()`.

Each test builds the same seeded float32 inputs as fusegrad leaves and float64 torch leaves (both requiring grad), runs
the same function on both, backpropagates `.sum()` or a random upstream gradient of the output's shape, and compares
the forward value and every input's `.grad`. Also covered: accumulation, detach, no_grad, error cases and fusion of
the backward pass's kernels.
"""
from typing import Any, Callable, Sequence

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from fusegrad import Tensor, dtypes
from fusegrad.engine.schedule import create_schedule
from helpers import ANY, GRID, NONZERO, POS, Domain, make_inputs

ATOL, RTOL = 1e-4, 1e-3


def check_grad(device: str, shapes: Sequence[Any], torch_fn: Callable, fg_fn: Callable | None = None, *,
               domain: Domain | Sequence[Domain] = ANY, upstream: bool = True, view: Callable | None = None,
               atol: float = ATOL, rtol: float = RTOL, seed: int = 0) -> None:
  """Run `torch_fn` on float64 torch leaves and `fg_fn` (default: the same) on float32 fusegrad leaves built from the
  same seeded inputs (after `view` on both), backpropagate a random upstream gradient (or `.sum()` when not
  `upstream`) and compare the outputs and the leaves' grads."""
  arrays = make_inputs(shapes, "float32", domain, seed)
  t_leaves = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
  f_leaves = [Tensor(np.array(a), device=device, requires_grad=True) for a in arrays]
  t_in, f_in = (t_leaves, f_leaves) if view is None else ([view(t) for t in t_leaves], [view(f) for f in f_leaves])
  t_out, f_out = torch_fn(*t_in), (fg_fn or torch_fn)(*f_in)
  assert tuple(f_out.shape) == tuple(t_out.shape), f"shape: fusegrad {tuple(f_out.shape)}, torch {tuple(t_out.shape)}"
  np.testing.assert_allclose(f_out.numpy().astype(np.float64), t_out.detach().numpy(), atol=atol, rtol=rtol,
                             err_msg="forward")
  if upstream:
    g = np.random.default_rng(seed + 1000).uniform(-1, 1, size=tuple(t_out.shape)).astype(np.float32)
    t_out.backward(torch.tensor(g, dtype=torch.float64))
    f_out.backward(Tensor(g, device=device))
  else:
    t_out.sum().backward()
    f_out.sum().backward()
  for i, (t, f) in enumerate(zip(t_leaves, f_leaves)):
    if t.grad is None and f.grad is None: continue   # the input only reaches the output through a comparison
    want = np.zeros(t.shape) if t.grad is None else t.grad.numpy()
    assert f.grad is not None, f"input {i}: fusegrad grad is None, torch grad is {want}"
    assert tuple(f.grad.shape) == tuple(t.shape), f"input {i}: grad shape {tuple(f.grad.shape)}, want {tuple(t.shape)}"
    assert f.grad.dtype is f.dtype, f"input {i}: grad dtype {f.grad.dtype.name}, leaf dtype {f.dtype.name}"
    np.testing.assert_allclose(f.grad.numpy().astype(np.float64), want, atol=atol, rtol=rtol, err_msg=f"grad {i}")


def case(name: str, shapes: Sequence[Any], torch_fn: Callable, fg_fn: Callable | None = None, domain: Any = ANY,
         marks: Any = ()) -> Any:
  return pytest.param(shapes, torch_fn, fg_fn, domain, id=name, marks=marks)




# ---------------------------------------------------------------------------------------------------------------------
# Unary elementwise ops and activations

def unary(name: str, torch_fn: Callable, fg_fn: Callable | None = None, domain: Domain = ANY, marks: Any = ()) -> Any:
  return case(name, [(3, 4)], torch_fn, fg_fn, domain, marks)


UNARY = [
  unary("neg", lambda x: -x),
  unary("neg_method", lambda x: x.neg()),
  unary("exp", lambda x: x.exp(), domain=Domain(-4, 4)),
  unary("exp2", lambda x: x.exp2(), domain=Domain(-4, 4)),
  unary("log", lambda x: x.log(), domain=Domain(0.1, 10)),
  unary("log2", lambda x: x.log2(), domain=Domain(0.1, 10)),
  unary("sqrt", lambda x: x.sqrt(), domain=Domain(0.1, 10)),
  unary("rsqrt", lambda x: x.rsqrt(), domain=Domain(0.1, 10)),
  unary("sin", lambda x: x.sin(), domain=Domain(-7, 7)),
  unary("cos", lambda x: x.cos(), domain=Domain(-7, 7)),
  unary("tan", lambda x: x.tan(), domain=Domain(-1.2, 1.2)),
  unary("abs", lambda x: x.abs(), domain=NONZERO),
  unary("sign", lambda x: x.sign() * x.square() + x.sign(), domain=GRID),
  unary("reciprocal", lambda x: x.reciprocal(), domain=NONZERO),
  unary("square", lambda x: x.square()),
  unary("clip", lambda x: x.clip(-0.5, 0.7)),
  unary("clamp", lambda x: x.clamp(-0.5, 0.7)),
  unary("clamp_min", lambda x: x.clamp(min=-0.5)),
  unary("clamp_max", lambda x: x.clamp(max=0.5)),
  unary("relu", lambda x: x.relu(), domain=NONZERO),
  unary("sigmoid", lambda x: x.sigmoid(), domain=Domain(-6, 6)),
  unary("tanh", lambda x: x.tanh(), domain=Domain(-4, 4)),
  unary("gelu", TF.gelu, lambda x: x.gelu(), domain=Domain(-4, 4)),
  unary("gelu_tanh", lambda x: TF.gelu(x, approximate="tanh"), lambda x: x.gelu(approximate="tanh"),
        domain=Domain(-4, 4)),
  unary("silu", TF.silu, lambda x: x.silu(), domain=Domain(-4, 4)),
  unary("elu", TF.elu, lambda x: x.elu(), domain=NONZERO),
  unary("elu_alpha", lambda x: TF.elu(x, 0.5), lambda x: x.elu(0.5), domain=NONZERO),
  unary("leakyrelu", TF.leaky_relu, lambda x: x.leakyrelu(), domain=NONZERO),
  unary("leakyrelu_slope", lambda x: TF.leaky_relu(x, 0.2), lambda x: x.leakyrelu(0.2), domain=NONZERO),
  unary("softplus", TF.softplus, lambda x: x.softplus(), domain=Domain(-4, 4)),
  unary("hardswish", TF.hardswish, lambda x: x.hardswish(), domain=Domain(-4, 4)),
  unary("mish", TF.mish, lambda x: x.mish(), domain=Domain(-4, 4)),
  unary("relu6", TF.relu6, lambda x: x.relu6(), domain=Domain(-3, 9)),
  # kinks hit exactly: inputs on a grid of 0.5 (0, the clip limits, +-3 for hardswish, 0 and 6 for relu6)
  unary("relu_at_kink", lambda x: x.relu(), domain=GRID),
  unary("abs_at_kink", lambda x: x.abs(), domain=GRID),
  unary("clip_at_limits", lambda x: x.clip(-0.5, 1.0), domain=GRID),
  unary("clamp_min_at_limit", lambda x: x.clamp(min=0.5), domain=GRID),
  unary("leakyrelu_at_kink", TF.leaky_relu, lambda x: x.leakyrelu(), domain=GRID),
  unary("elu_at_kink", TF.elu, lambda x: x.elu(), domain=GRID),
  unary("hardswish_at_kinks", TF.hardswish, lambda x: x.hardswish(), domain=Domain(-4, 4, discrete=True)),
  unary("relu6_at_kinks", TF.relu6, lambda x: x.relu6(), domain=Domain(-1, 7, discrete=True)),
  # large magnitudes: no inf or nan may leak into the gradient
  unary("sigmoid_large", lambda x: x.sigmoid(), domain=Domain(-60, 60)),
  unary("tanh_large", lambda x: x.tanh(), domain=Domain(-40, 40)),
  unary("softplus_large", TF.softplus, lambda x: x.softplus(), domain=Domain(-40, 40)),
  unary("softplus_beta", lambda x: TF.softplus(x, 2.0, 5.0), lambda x: x.softplus(2.0, 5.0), domain=Domain(-5, 5)),
  unary("elu_large", TF.elu, lambda x: x.elu(), domain=Domain(-100, 100)),
  unary("gelu_large", TF.gelu, lambda x: x.gelu(), domain=Domain(-12, 12)),
  unary("silu_large", TF.silu, lambda x: x.silu(), domain=Domain(-60, 60)),
  unary("mish_large", TF.mish, lambda x: x.mish(), domain=Domain(-30, 30)),
]


@pytest.mark.parametrize("shapes, torch_fn, fg_fn, domain", UNARY)
def test_unary(device, shapes, torch_fn, fg_fn, domain):
  check_grad(device, shapes, torch_fn, fg_fn, domain=domain)


def test_sign_grad_is_zero(device):
  """sign is flat: it adds nothing to the grad (at 0 included), as torch."""
  x = Tensor([-1.5, 0.0, 2.0], device=device, requires_grad=True)
  (x.sign() * 5 + x).sum().backward()
  np.testing.assert_array_equal(x.grad.numpy(), np.ones(3, np.float32))


# ---------------------------------------------------------------------------------------------------------------------
# Binary elementwise ops, broadcasting and Python scalars

BROADCAST = [(3, 1, 4), (5, 4)]
# explicit inputs with ties: equal pairs (maximum/minimum), and repeated maxima and minima in rows and columns
TIES_AB = [np.array([[1.0, -0.5, 2.0, 0.0], [0.5, 0.5, -1.0, 3.0]], np.float32),
           np.array([[1.0, 0.5, 2.0, -1.0], [0.5, -2.0, -1.0, 3.0]], np.float32)]
TIES = np.array([[1.0, 0.5, 1.0, -2.0, 1.0, 0.0], [-1.0, -1.0, 0.5, 0.5, -1.0, 0.25], [0.0, 2.0, 0.0, 2.0, 0.0, 2.0]],
                np.float32)

BINARY = [
  case("add", [(3, 4), (3, 4)], lambda a, b: a + b),
  case("add_method", [(3, 4), (3, 4)], lambda a, b: a.add(b)),
  case("sub", [(3, 4), (3, 4)], lambda a, b: a - b),
  case("mul", [(3, 4), (3, 4)], lambda a, b: a * b),
  case("div", [(3, 4), (3, 4)], lambda a, b: a / b, domain=NONZERO),
  case("add_broadcast", BROADCAST, lambda a, b: a + b),
  case("sub_broadcast", BROADCAST, lambda a, b: a - b),
  case("mul_broadcast", BROADCAST, lambda a, b: a * b),
  case("div_broadcast", BROADCAST, lambda a, b: a / b, domain=NONZERO),
  case("div_broadcast_rev", BROADCAST, lambda a, b: b / a, domain=NONZERO),
  case("add_same_input", [(3, 4)], lambda a: a + a),
  case("mul_same_input", [(3, 4)], lambda a: a * a * a),
  case("add_scalar", [(3, 4)], lambda a: a + 1.5),
  case("radd_scalar", [(3, 4)], lambda a: 1.5 + a),
  case("sub_scalar", [(3, 4)], lambda a: a - 1.5),
  case("rsub_scalar", [(3, 4)], lambda a: 1.5 - a),
  case("mul_scalar", [(3, 4)], lambda a: a * -2.5),
  case("rmul_scalar", [(3, 4)], lambda a: -2.5 * a),
  case("div_scalar", [(3, 4)], lambda a: a / 4.0),
  case("rdiv_scalar", [(3, 4)], lambda a: 3.0 / a, domain=NONZERO),
  case("pow_scalar", [(3, 4)], lambda a: a ** 3),
  case("pow_scalar_frac", [(3, 4)], lambda a: a ** 0.5, domain=POS),
  case("pow_scalar_neg", [(3, 4)], lambda a: a ** -1.5, domain=POS),
  case("pow_scalar_two_negbase", [(3, 4)], lambda a: a ** 2.0),
  case("rpow_scalar", [(3, 4)], lambda a: 2.5 ** a),
  case("pow_tensor", [(3, 4), (3, 4)], lambda a, b: a ** b, domain=[POS, ANY]),
  case("pow_tensor_broadcast", BROADCAST, lambda a, b: a ** b, domain=[POS, ANY]),
  case("maximum", [(3, 4), (3, 4)], lambda a, b: a.maximum(b), lambda a, b: a.maximum(b)),
  case("minimum", [(3, 4), (3, 4)], lambda a, b: a.minimum(b)),
  case("maximum_broadcast", BROADCAST, lambda a, b: a.maximum(b)),
  case("maximum_scalar", [(3, 4)], lambda a: torch.clamp(a, min=0.3), lambda a: a.maximum(0.3)),
  case("minimum_scalar", [(3, 4)], lambda a: torch.clamp(a, max=0.3), lambda a: a.minimum(0.3)),
  case("maximum_ties", TIES_AB, lambda a, b: torch.maximum(a, b), lambda a, b: a.maximum(b)),
  case("minimum_ties", TIES_AB, lambda a, b: torch.minimum(a, b), lambda a, b: a.minimum(b)),
  case("maximum_self", [(3, 4)], lambda a: torch.maximum(a, a), lambda a: a.maximum(a)),
  case("minimum_self", [(3, 4)], lambda a: torch.minimum(a, a), lambda a: a.minimum(a)),
  case("where", [(3, 4), (3, 4), (3, 4)], lambda c, a, b: torch.where(c > 0, a, b),
       lambda c, a, b: (c > 0).where(a, b)),
  case("where_broadcast", [(3, 1, 4), (5, 4), (4,)], lambda c, a, b: torch.where(c > 0, a, b),
       lambda c, a, b: (c > 0).where(a, b)),
  case("where_scalar", [(3, 4), (3, 4)], lambda c, a: torch.where(c > 0, a, 2.0), lambda c, a: (c > 0).where(a, 2.0)),
  case("clip_tensor_bounds", [(3, 4), (3, 4), (3, 4)], lambda x, lo, hi: torch.clamp(x, lo - 1, hi + 1),
       lambda x, lo, hi: x.clip(lo - 1, hi + 1)),
  case("scalar_0d_broadcast", [(), (3, 4)], lambda a, b: (a * b).exp() / (1 + a * a)),
  case("size1_broadcast", [(1,), (4, 1), (1, 3)], lambda a, b, c: a * b - c * b + c / (2 + a * a)),
  case("maximum_scalar_ties", [(3, 4)], lambda a: torch.maximum(a, torch.tensor(0.5, dtype=torch.float64)),
       lambda a: a.maximum(0.5), domain=GRID),
  case("minimum_scalar_ties", [(3, 4)], lambda a: torch.minimum(a, torch.tensor(0.5, dtype=torch.float64)),
       lambda a: a.minimum(0.5), domain=GRID),
  case("pow_int_exponent_negbase", [(3, 4)], lambda a: a ** 4 - a ** -2, domain=NONZERO),
  case("pow_zero_exponent", [(3, 4)], lambda a: a ** 0),
  case("pow_tensor_zero_base", [(2, 3)], lambda a: (a * 0) ** (a * a + 1), domain=POS),
  case("div_self", [(3, 4)], lambda a: a / a, domain=NONZERO),
  case("where_same_source", [(3, 4)], lambda a: torch.where(a > 0, a * 2, a.exp()),
       lambda a: (a > 0).where(a * 2, a.exp())),
]


@pytest.mark.parametrize("shapes, torch_fn, fg_fn, domain", BINARY)
def test_binary(device, shapes, torch_fn, fg_fn, domain):
  check_grad(device, shapes, torch_fn, fg_fn, domain=domain)


# ---------------------------------------------------------------------------------------------------------------------
# Reductions and normalizations

REDUCE = [
  case("sum", [(3, 4, 5)], lambda x: x.sum()),
  case("sum_axis", [(3, 4, 5)], lambda x: x.sum(1)),
  case("sum_axes_keepdim", [(3, 4, 5)], lambda x: x.sum((0, 2), keepdim=True)),
  case("mean", [(3, 4, 5)], lambda x: x.mean()),
  case("mean_axis", [(3, 4, 5)], lambda x: x.mean(-1)),
  case("mean_keepdim", [(3, 4, 5)], lambda x: x.mean((0, 1), keepdim=True)),
  case("max", [(3, 4, 5)], lambda x: x.amax(), lambda x: x.max()),
  case("max_axis", [(3, 4, 5)], lambda x: x.amax(1), lambda x: x.max(1)),
  case("max_keepdim", [(3, 4, 5)], lambda x: x.amax((0, 2), keepdim=True), lambda x: x.max((0, 2), keepdim=True)),
  case("min", [(3, 4, 5)], lambda x: x.amin(), lambda x: x.min()),
  case("min_axis", [(3, 4, 5)], lambda x: x.amin(2), lambda x: x.min(2)),
  case("min_keepdim", [(3, 4, 5)], lambda x: x.amin(0, keepdim=True), lambda x: x.min(0, keepdim=True)),
  case("max_ties", [TIES], lambda x: x.amax(1), lambda x: x.max(1)),
  case("max_ties_keepdim_axis0", [TIES], lambda x: x.amax(0, keepdim=True), lambda x: x.max(0, keepdim=True)),
  case("max_ties_all", [TIES], lambda x: x.amax(), lambda x: x.max()),
  case("min_ties", [TIES], lambda x: x.amin(1), lambda x: x.min(1)),
  case("min_ties_axis0", [TIES], lambda x: x.amin(0), lambda x: x.min(0)),
  case("max_min_ties_all", [np.full((2, 3), 0.5, np.float32)], lambda x: x.amax() * 2 - x.amin(),
       lambda x: x.max() * 2 - x.min()),
  case("std", [(3, 4, 5)], lambda x: x.std()),
  case("std_axis", [(3, 4, 5)], lambda x: x.std(1)),
  case("std_keepdim_corr0", [(3, 4, 5)], lambda x: x.std(-1, keepdim=True, correction=0)),
  case("var", [(3, 4, 5)], lambda x: x.var()),
  case("var_axis", [(3, 4, 5)], lambda x: x.var((0, 2))),
  case("var_keepdim_corr0", [(3, 4, 5)], lambda x: x.var(1, keepdim=True, correction=0)),
  case("softmax", [(3, 5)], lambda x: x.softmax(-1)),
  case("softmax_axis0", [(3, 5)], lambda x: x.softmax(0)),
  case("log_softmax", [(3, 5)], lambda x: x.log_softmax(-1)),
  case("log_softmax_axis0", [(3, 5)], lambda x: x.log_softmax(0)),
  case("logsumexp", [(3, 5)], lambda x: x.logsumexp(1)),
  case("logsumexp_keepdim", [(3, 5)], lambda x: x.logsumexp(0, keepdim=True)),
  case("logsumexp_all", [(3, 5)], lambda x: torch.logsumexp(x, (0, 1)), lambda x: x.logsumexp()),
  case("cumsum", [(4, 5)], lambda x: x.cumsum(1)),
  case("cumsum_axis0", [(4, 5)], lambda x: x.cumsum(0)),
  case("cumsum_blocked", [(2, 300)], lambda x: x.cumsum(1)),
  case("prod", [(3, 5)], lambda x: x.prod(1)),
  case("prod_all", [(2, 3)], lambda x: x.prod()),
  case("prod_with_zeros", [(4, 5)], lambda x: x.prod(1), domain=GRID),
  case("sum_to_float64", [(3, 4)], lambda x: x.sum(1, dtype=torch.float64), lambda x: x.sum(1, dtype=dtypes.float64)),
  case("max_of_expanded", [(3, 1)], lambda x: x.expand(3, 4).amax(1), lambda x: x.expand(3, 4).max(1)),
  case("max_0d", [()], lambda x: x.amax(), lambda x: x.max()),
  case("sum_size1_axis", [(3, 1, 2)], lambda x: x.sum(1)),
  case("std_corr0_size1", [(3, 1)], lambda x: x.std(1, correction=0) + x.sum(1)),
  case("softmax_3d_middle", [(2, 4, 3)], lambda x: x.softmax(1)),
  case("softmax_large", [(3, 5)], lambda x: (x * 100).softmax(-1), domain=Domain(-1, 1)),
  case("log_softmax_large", [(3, 5)], lambda x: (x * 100).log_softmax(-1), domain=Domain(-1, 1)),
  case("logsumexp_large", [(3, 5)], lambda x: (x * 100).logsumexp(1), domain=Domain(-1, 1)),
  case("logsumexp_ties", [(3, 4)], lambda x: x.logsumexp(1), domain=GRID),
]


@pytest.mark.parametrize("shapes, torch_fn, fg_fn, domain", REDUCE)
def test_reduce(device, shapes, torch_fn, fg_fn, domain):
  check_grad(device, shapes, torch_fn, fg_fn, domain=domain)


# ---------------------------------------------------------------------------------------------------------------------
# Movement ops, joins and indexing

MOVEMENT = [
  case("reshape", [(3, 4)], lambda x: x.reshape(2, 6)),
  case("reshape_infer", [(3, 4)], lambda x: x.reshape(-1, 3)),
  case("permute", [(2, 3, 4)], lambda x: x.permute(2, 0, 1)),
  case("expand", [(3, 1)], lambda x: x.expand(3, 4)),
  case("expand_new_dims", [(1, 4)], lambda x: x.expand(2, 3, 4)),
  case("pad", [(3, 4)], lambda x: TF.pad(x, (1, 2, 0, 1)), lambda x: x.pad((1, 2, 0, 1))),
  case("pad_value", [(3, 4)], lambda x: TF.pad(x, (1, 1, 2, 0), value=1.5), lambda x: x.pad((1, 1, 2, 0), value=1.5)),
  case("pad_negative", [(3, 4)], lambda x: TF.pad(x, (-1, 2, 1, -1)), lambda x: x.pad((-1, 2, 1, -1))),
  case("shrink", [(4, 5)], lambda x: x[1:3, 2:5], lambda x: x.shrink(((1, 3), (2, 5)))),
  case("flip", [(3, 4)], lambda x: x.flip(1)),
  case("flip_both", [(3, 4)], lambda x: x.flip(0, 1), lambda x: x.flip(0, 1)),
  case("transpose", [(2, 3, 4)], lambda x: x.transpose(0, 2)),
  case("flatten", [(2, 3, 4)], lambda x: x.flatten()),
  case("flatten_range", [(2, 3, 4, 2)], lambda x: x.flatten(1, 2)),
  case("squeeze", [(3, 1, 4, 1)], lambda x: x.squeeze()),
  case("squeeze_dim", [(3, 1, 4, 1)], lambda x: x.squeeze(1)),
  case("unsqueeze", [(3, 4)], lambda x: x.unsqueeze(1)),
  case("unsqueeze_neg", [(3, 4)], lambda x: x.unsqueeze(-1)),
  case("repeat", [(2, 3)], lambda x: x.repeat(2, 3)),
  case("repeat_new_dim", [(2, 3)], lambda x: x.repeat(2, 1, 2)),
  case("cat", [(2, 3), (4, 3)], lambda a, b: torch.cat([a, b]), lambda a, b: Tensor.cat([a, b])),
  case("cat_dim1_method", [(2, 3), (2, 1), (2, 2)], lambda a, b, c: torch.cat([a, b, c], dim=1),
       lambda a, b, c: a.cat(b, c, dim=1)),
  case("stack", [(2, 3), (2, 3)], lambda a, b: torch.stack([a, b], dim=1), lambda a, b: Tensor.stack([a, b], dim=1)),
  case("chunk", [(5, 3)], lambda x: torch.cat([c * (i + 1) for i, c in enumerate(x.chunk(3, 0))]),
       lambda x: Tensor.cat([c * (i + 1) for i, c in enumerate(x.chunk(3, 0))])),
  case("chunk_unused", [(6, 3)], lambda x: x.chunk(3, 0)[1]),
  case("split", [(5, 3)], lambda x: x.split([2, 3])[1] * 2),
  case("getitem_int", [(3, 4, 5)], lambda x: x[1]),
  case("getitem_neg_int", [(3, 4, 5)], lambda x: x[-1, 2]),
  case("getitem_slice", [(5, 6)], lambda x: x[1:4, ::2]),
  case("getitem_step3", [(7, 6)], lambda x: x[1::3].flip(1)[:, 0:5:2], lambda x: x[1::3, 5:0:-2]),
  case("getitem_neg_step", [(5, 6)], lambda x: x.flip(0)[::2], lambda x: x[::-2]),
  case("getitem_neg_step_range", [(5, 6)], lambda x: x.flip(1)[:, 1:5:2], lambda x: x[:, 4:0:-2]),
  case("getitem_none_ellipsis", [(2, 3, 4)], lambda x: x[None, ..., 1:3, None]),
  case("getitem_ellipsis_int", [(2, 3, 4)], lambda x: x[..., 2]),
  case("getitem_tensor", [(5, 3)], lambda x: x[torch.tensor([0, 3, 3, -1])], lambda x: x[Tensor([0, 3, 3, -1])]),
  case("getitem_tensor_2d", [(5, 3)], lambda x: x[torch.tensor([[1, 2], [2, 4]]), 1:],
       lambda x: x[Tensor([[1, 2], [2, 4]]), 1:]),
  case("getitem_two_tensors", [(4, 5)], lambda x: x[torch.tensor([0, 2, 2]), torch.tensor([1, 4, 1])],
       lambda x: x[Tensor([0, 2, 2]), Tensor([1, 4, 1])]),
  case("getitem_tensor_middle", [(2, 5, 3)], lambda x: x[:, torch.tensor([4, 0, 4])],
       lambda x: x[:, Tensor([4, 0, 4])]),
  case("getitem_list", [(5, 3)], lambda x: x[[1, 1, 0]]),
  case("getitem_tensor_and_step", [(4, 6)], lambda x: x[torch.tensor([3, 0]), ::2], lambda x: x[Tensor([3, 0]), ::2]),
  case("getitem_tensors_split_by_slice", [(3, 4, 5)],
       lambda x: x[torch.tensor([0, 2]), :, torch.tensor([1, 4])], lambda x: x[Tensor([0, 2]), :, Tensor([1, 4])]),
  case("pad_both_negative", [(4, 5)], lambda x: TF.pad(x, (-1, -2, -1, 0)), lambda x: x.pad((-1, -2, -1, 0))),
  case("cat_same_tensor", [(2, 3)], lambda a: torch.cat([a, a * 2, a], 1), lambda a: Tensor.cat([a, a * 2, a], dim=1)),
  case("stack_last", [(2, 3), (2, 3), (2, 3)], lambda a, b, c: torch.stack([a, b, c], -1),
       lambda a, b, c: Tensor.stack([a, b, c], dim=-1)),
  case("flip_then_stride", [(5, 4)], lambda x: x.flip(0)[::2].flip(1)[:, 1:], lambda x: x[::-2, -2::-1]),
  case("gather", [(3, 4)], lambda x: x.gather(1, torch.tensor([[0, 0, 3], [1, 2, 1], [3, 3, 3]])),
       lambda x: x.gather(1, Tensor([[0, 0, 3], [1, 2, 1], [3, 3, 3]], device=x.device))),
  case("gather_dim0", [(3, 4)], lambda x: x.gather(0, torch.tensor([[0, 2, 2, 1], [1, 1, 0, 2]])),
       lambda x: x.gather(0, Tensor([[0, 2, 2, 1], [1, 1, 0, 2]], device=x.device))),
]


@pytest.mark.parametrize("shapes, torch_fn, fg_fn, domain", MOVEMENT)
def test_movement(device, shapes, torch_fn, fg_fn, domain):
  check_grad(device, shapes, torch_fn, fg_fn, domain=domain)


# ---------------------------------------------------------------------------------------------------------------------
# Matmul, convolution, pooling, casts

def conv(name: str, x: tuple[int, ...], w: tuple[int, ...], bias: bool = False, marks: Any = (), **kw: Any) -> Any:
  shapes = [x, w] + ([(w[0],)] if bias else [])
  return case(name, shapes, lambda x, w, *b: TF.conv2d(x, w, *b, **kw), lambda x, w, *b: x.conv2d(w, *b, **kw),
              marks=marks)


NN = [
  case("matmul", [(3, 4), (4, 5)], lambda a, b: a @ b),
  case("matmul_method", [(3, 4), (4, 2)], lambda a, b: a.matmul(b)),
  case("matmul_vec", [(4,), (4, 3)], lambda a, b: a @ b),
  case("matmul_batched", [(2, 3, 4), (2, 4, 5)], lambda a, b: a @ b),
  case("matmul_batched_broadcast", [(2, 3, 4), (4, 5)], lambda a, b: a @ b),
  case("matmul_batch_broadcast_both", [(2, 1, 3, 4), (3, 4, 2)], lambda a, b: a @ b),
  case("matmul_dot", [(4,), (4,)], lambda a, b: a @ b),
  case("matmul_mat_vec", [(3, 4), (4,)], lambda a, b: a @ b),
  conv("conv2d_unbatched", (2, 5, 5), (3, 2, 3, 3), bias=True, padding=1),
  conv("conv2d", (2, 3, 6, 6), (4, 3, 3, 3)),
  conv("conv2d_bias", (1, 2, 5, 5), (3, 2, 3, 3), bias=True),
  conv("conv2d_stride", (1, 2, 7, 7), (3, 2, 3, 3), stride=2),
  conv("conv2d_padding", (1, 2, 5, 5), (3, 2, 3, 3), bias=True, padding=1),
  conv("conv2d_dilation", (1, 2, 7, 7), (2, 2, 3, 3), dilation=2),
  conv("conv2d_groups", (1, 4, 5, 5), (6, 2, 3, 3), bias=True, groups=2),
  conv("conv2d_depthwise", (1, 3, 5, 5), (3, 1, 2, 2), groups=3),
  conv("conv2d_all", (2, 4, 8, 7), (4, 2, 3, 2), bias=True, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
  case("avg_pool2d", [(1, 2, 6, 6)], lambda x: TF.avg_pool2d(x, 2), lambda x: x.avg_pool2d(2)),
  case("avg_pool2d_stride_pad", [(1, 2, 7, 7)], lambda x: TF.avg_pool2d(x, 3, 2, 1),
       lambda x: x.avg_pool2d(3, 2, 1)),
  case("avg_pool2d_overlap", [(1, 1, 5, 5)], lambda x: TF.avg_pool2d(x, 3, 1), lambda x: x.avg_pool2d(3, 1)),
  case("avg_pool2d_no_pad_count", [(1, 2, 6, 6)], lambda x: TF.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
       lambda x: x.avg_pool2d(3, 2, 1, count_include_pad=False)),
  case("max_pool2d", [(1, 2, 6, 6)], lambda x: TF.max_pool2d(x, 2), lambda x: x.max_pool2d(2)),
  case("max_pool2d_stride_pad", [(1, 2, 7, 7)], lambda x: TF.max_pool2d(x, 3, 2, 1),
       lambda x: x.max_pool2d(3, 2, 1)),
  case("max_pool2d_overlap", [(1, 1, 5, 5)], lambda x: TF.max_pool2d(x, 3, 1), lambda x: x.max_pool2d(3, 1)),
  case("max_pool2d_dilation", [(1, 1, 7, 7)], lambda x: TF.max_pool2d(x, 2, 2, 0, 2),
       lambda x: x.max_pool2d(2, 2, 0, 2)),
  case("max_pool2d_pad_dilation", [(1, 2, 7, 6)], lambda x: TF.max_pool2d(x, 3, (2, 1), 1, (1, 2)),
       lambda x: x.max_pool2d(3, (2, 1), 1, (1, 2))),
  case("max_pool2d_gapped", [(1, 1, 8, 8)], lambda x: TF.max_pool2d(x, 2, 3), lambda x: x.max_pool2d(2, 3)),
  case("avg_pool2d_gapped", [(1, 1, 8, 7)], lambda x: TF.avg_pool2d(x, 2, 3), lambda x: x.avg_pool2d(2, 3)),
  case("avg_pool2d_rect", [(2, 1, 6, 5)], lambda x: TF.avg_pool2d(x, (3, 2), (1, 2)),
       lambda x: x.avg_pool2d((3, 2), (1, 2))),
  # the torch side computes in float64 throughout: the reference for a float32 -> float64 -> float32 round trip
  case("cast_float64_roundtrip", [(3, 4)], lambda x: (x * 3).exp(),
       lambda x: (x.cast(dtypes.float64) * 3).exp().cast(dtypes.float32), domain=Domain(-1, 1)),
  case("cast_float64_out", [(3, 4)], lambda x: x.double().square(), lambda x: x.double().square()),
  case("linear_chain", [(2, 3), (4, 3), (4,)], lambda x, w, b: (x @ w.T + b).relu().sum(1).sigmoid(),
       lambda x, w, b: (x @ w.transpose() + b).relu().sum(1).sigmoid()),
]


@pytest.mark.parametrize("shapes, torch_fn, fg_fn, domain", NN)
def test_nn(device, shapes, torch_fn, fg_fn, domain):
  check_grad(device, shapes, torch_fn, fg_fn, domain=domain)


# ---------------------------------------------------------------------------------------------------------------------
# Non-contiguous leaf views: the grad lands on the leaf, in the leaf's layout

VIEWS = [
  pytest.param(lambda x: x.permute(1, 0), id="permuted"),
  pytest.param(lambda x: x[1:, ::2], id="sliced_step"),
  pytest.param(lambda x: x.flip(0), id="flipped"),
  pytest.param(lambda x: x[:, 1:3].transpose(0, 1), id="sliced_transposed"),
]


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("fn", [pytest.param(lambda x: (x * x).exp(), id="elementwise"),
                                pytest.param(lambda x: x.softmax(-1), id="softmax"),
                                pytest.param(lambda x: x @ x.transpose(0, 1), id="matmul")])
def test_noncontiguous_leaf(device, view, fn):
  check_grad(device, [(4, 5)], fn, view=view, domain=Domain(-1, 1))


def test_sum_backward(device):
  """`.sum().backward()` without an upstream gradient, on broadcasting inputs."""
  check_grad(device, BROADCAST, lambda a, b: (a * b).exp() - b, upstream=False, domain=Domain(-1, 1))


# ---------------------------------------------------------------------------------------------------------------------
# Tape mechanics

def test_grad_accumulates(device):
  x = Tensor([1.0, -2.0, 3.0], device=device, requires_grad=True)
  (x * x).sum().backward()
  (x * 3).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [5.0, -1.0, 9.0], rtol=1e-6)


def test_grad_accumulates_same_graph(device):
  x = Tensor([1.0, -2.0, 3.0], device=device, requires_grad=True)
  y = (x * x).sum()
  y.backward(retain_graph=True)
  y.backward()
  np.testing.assert_allclose(x.grad.numpy(), [4.0, -8.0, 12.0], rtol=1e-6)


def test_detach_stops_gradient(device):
  x = Tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
  (x * x.detach()).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [1.0, 2.0, 3.0], rtol=1e-6)
  d = x.detach()
  assert not d.requires_grad and d.grad is None


def test_detach_only_branch_has_no_grad(device):
  x = Tensor([1.0, 2.0], device=device, requires_grad=True)
  y = Tensor([3.0, 4.0], device=device, requires_grad=True)
  (x * y.detach()).sum().backward()
  assert y.grad is None
  np.testing.assert_allclose(x.grad.numpy(), [3.0, 4.0])


def test_no_grad_builds_no_graph(device):
  x = Tensor([1.0, 2.0], device=device, requires_grad=True)
  with Tensor.no_grad():
    assert not Tensor.is_grad_enabled()
    y = (x * 2).exp().sum()
  assert Tensor.is_grad_enabled()
  assert y._ctx is None and not y.requires_grad
  with pytest.raises(ValueError):
    y.backward()
  assert x.grad is None


def test_no_grad_decorator(device):
  x = Tensor([1.0, 2.0], device=device, requires_grad=True)
  y = Tensor.no_grad()(lambda t: t * 3)(x)
  assert y._ctx is None and not y.requires_grad
  assert (x * 3)._ctx is not None


def test_backward_nonscalar_needs_gradient(device):
  x = Tensor([[1.0, 2.0], [3.0, 4.0]], device=device, requires_grad=True)
  with pytest.raises(ValueError, match="gradient"):
    (x * 2).backward()


def test_backward_gradient_shape_mismatch(device):
  x = Tensor([[1.0, 2.0], [3.0, 4.0]], device=device, requires_grad=True)
  with pytest.raises(ValueError):
    (x * 2).backward(Tensor([1.0, 2.0], device=device))


def test_backward_twice_without_retain_raises(device):
  x = Tensor([1.0, 2.0], device=device, requires_grad=True)
  y = (x * x).sum()
  y.backward()
  with pytest.raises(ValueError):
    y.backward()


def test_one_element_nonscalar_backward(device):
  x = Tensor([[2.0]], device=device, requires_grad=True)
  (x * x).backward()
  np.testing.assert_allclose(x.grad.numpy(), [[4.0]])


def test_requires_grad_false_input_gets_no_grad(device):
  x = Tensor([1.0, 2.0], device=device, requires_grad=True)
  y = Tensor([3.0, 4.0], device=device)
  (x * y).sum().backward()
  assert y.grad is None


def test_backward_on_leaf(device):
  x = Tensor([1.0, 2.0], device=device, requires_grad=True)
  x.backward(Tensor([3.0, -1.0], device=device))
  np.testing.assert_allclose(x.grad.numpy(), [3.0, -1.0])


def test_upstream_gradient_other_dtype(device):
  """A float64 upstream gradient for a float32 output: the leaf's grad stays float32."""
  x = Tensor([1.0, 2.0], device=device, requires_grad=True)
  (x * x).backward(Tensor(np.array([1.0, 0.5]), device=device, dtype=dtypes.float64))
  assert x.grad.dtype is dtypes.float32
  np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


def test_mixed_dtype_grads(device):
  """float32 * float64 computes in float64; each leaf's grad comes back in its own dtype."""
  a_np, b_np = np.array([1.5, -2.0, 0.5], np.float32), np.array([0.25, 3.0, -1.0], np.float64)
  a = Tensor(a_np, device=device, requires_grad=True)
  b = Tensor(b_np, device=device, requires_grad=True)
  out = Tensor.cat([(a * b).exp(), a.cast(dtypes.float64)])
  assert out.dtype is dtypes.float64
  out.sum().backward()
  ta, tb = torch.tensor(a_np, requires_grad=True), torch.tensor(b_np, requires_grad=True)
  torch.cat([(ta * tb).exp(), ta.double()]).sum().backward()
  assert a.grad.dtype is dtypes.float32 and b.grad.dtype is dtypes.float64
  np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-5)
  np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-5)


def test_float64_leaf(device):
  x_np = np.linspace(0.1, 2.0, 6).reshape(2, 3)
  x = Tensor(x_np, device=device, requires_grad=True)
  assert x.dtype is dtypes.float64
  (x.log() * x.sqrt()).softmax(-1).square().sum().backward()
  t = torch.tensor(x_np, requires_grad=True)
  (t.log() * t.sqrt()).softmax(-1).square().sum().backward()
  assert x.grad.dtype is dtypes.float64
  np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_int_operand_gets_no_grad(device):
  x = Tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
  k = Tensor([2, -1, 4], device=device)
  (x * k + k).sum().backward()
  assert k.grad is None
  np.testing.assert_allclose(x.grad.numpy(), [2.0, -1.0, 4.0])


def test_max_pool2d_ties_keep_gradient_mass(device):
  """With ties, torch gives a window's gradient to one element and fusegrad splits it; either way each
  non-overlapping window passes on exactly its upstream gradient."""
  x = Tensor(np.ones((1, 1, 4, 4), np.float32), device=device, requires_grad=True)
  g = np.arange(1, 5, dtype=np.float32).reshape(1, 1, 2, 2)
  x.max_pool2d(2).backward(Tensor(g, device=device))
  per_window = x.grad.numpy().reshape(2, 2, 2, 2).sum(axis=(1, 3))
  np.testing.assert_allclose(per_window, g[0, 0])


def test_retain_graph_partial_reuse(device):
  """A retained graph can be backpropagated again through a new head."""
  x = Tensor([1.0, 2.0], device=device, requires_grad=True)
  y = x.exp()
  y.sum().backward(retain_graph=True)
  (y * 2).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), 3 * np.exp([1.0, 2.0]), rtol=1e-5)


def test_grad_through_device_copy(device):
  """A copy to the other backend and back is differentiable; the grad lands on the leaf's device."""
  other = "CPU" if device == "PYTHON" else "PYTHON"
  x = Tensor([1.0, -2.0, 0.5], device=device, requires_grad=True)
  ((x.to(other) * 3).exp().to(device) * x).sum().backward()
  assert x.grad.device == device
  xs = np.array([1.0, -2.0, 0.5])
  np.testing.assert_allclose(x.grad.numpy(), np.exp(3 * xs) * (1 + 3 * xs), rtol=1e-5)


def test_no_grad_nested_restores(device):
  with Tensor.no_grad():
    with Tensor.no_grad():
      pass
    assert not Tensor.is_grad_enabled()
  assert Tensor.is_grad_enabled()


def test_leaf_without_requires_grad_is_untracked(device):
  x = Tensor([1.0, 2.0], device=device)
  y = (x * 2).sum()
  assert y._ctx is None and x.grad is None
  with pytest.raises(ValueError):
    y.backward()


def test_int_tensor_cannot_require_grad():
  with pytest.raises(TypeError):
    Tensor([1, 2, 3], requires_grad=True)


# ---------------------------------------------------------------------------------------------------------------------
# Fusion of the backward pass

def _kernels(*tensors: Tensor) -> int:
  return sum(1 for item in create_schedule([t.lazydata for t in tensors]) if item.ast.op.name == "SINK")


def test_backward_fuses(device):
  rng = np.random.default_rng(0)
  a = Tensor(rng.uniform(-1, 1, (8, 8)).astype(np.float32), device=device, requires_grad=True)
  b = Tensor(rng.uniform(-1, 1, (8, 8)).astype(np.float32), device=device, requires_grad=True)
  a.realize(b)
  (a * b).relu().sum().backward()
  assert _kernels(a.grad, b.grad) <= 3


def test_backward_elementwise_chain_fuses(device):
  x = Tensor(np.linspace(-1, 1, 16, dtype=np.float32), device=device, requires_grad=True).realize()
  (x.exp() * x.sin() + x.square()).sum().backward()
  assert _kernels(x.grad) <= 2


def test_backward_matmul_relu_fuses(device):
  rng = np.random.default_rng(1)
  x = Tensor(rng.uniform(-1, 1, (4, 8)).astype(np.float32), device=device, requires_grad=True)
  w = Tensor(rng.uniform(-1, 1, (8, 5)).astype(np.float32), device=device, requires_grad=True)
  x.realize(w)
  (x @ w).relu().sum().backward()
  assert _kernels(x.grad, w.grad) <= 4   # forward matmul (its relu mask is reused), dx, dw
