"""Differential tests of every Tensor op against PyTorch (CPU, forward only) on every backend in `test_devices()`.

Each test builds the same seeded inputs for torch and fusegrad (helpers.check_op), runs the op on both and compares
shape, dtype and values: float32 within a small tolerance, float16 loosely, ints and bools exactly. Inputs cover 0-d,
size-1 and medium shapes, non-contiguous views (permuted, sliced, flipped, expanded), broadcasting, Python scalars on
either side and mixed dtypes. Random ops are checked by shape, range, statistics and seeding rather than by value.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings, strategies as st

from fusegrad import Tensor, dtypes
from helpers import ANY, GRID, INTS, NONZERO, POS, Domain, assert_same, check_op, make_array, torch_dtype

NONZERO_INTS = Domain(-9, 9, nonzero=True)
INF, NAN = float("inf"), float("nan")


def op(name: str, torch_fn, fg_fn=None, domain=ANY, atol: float = 1e-5, rtol: float = 1e-5, marks=()):
  """A pytest.param of one op: torch function, fusegrad function (None: the same), input domain and tolerance."""
  return pytest.param(torch_fn, fg_fn, domain, atol, rtol, id=name, marks=marks)


# ---------------------------------------------------------------------------------------------------------------------
# Unary elementwise ops and activations

UNARY_OPS = [
  op("neg", lambda x: -x),
  op("neg_method", lambda x: x.neg()),
  op("exp", lambda x: x.exp(), domain=Domain(-5, 5)),
  op("exp2", lambda x: x.exp2(), domain=Domain(-5, 5)),
  op("log", lambda x: x.log(), domain=Domain(0.01, 10)),
  op("log2", lambda x: x.log2(), domain=Domain(0.01, 10)),
  op("sqrt", lambda x: x.sqrt(), domain=Domain(0, 10)),
  op("rsqrt", lambda x: x.rsqrt(), domain=Domain(0.05, 10)),
  op("sin", lambda x: x.sin(), domain=Domain(-7, 7)),
  op("cos", lambda x: x.cos(), domain=Domain(-7, 7)),
  op("tan", lambda x: x.tan(), domain=Domain(-1.4, 1.4)),
  op("abs", lambda x: x.abs()),
  op("sign", lambda x: x.sign(), domain=GRID),
  op("reciprocal", lambda x: x.reciprocal(), domain=NONZERO),
  op("square", lambda x: x.square()),
  op("trunc", lambda x: x.trunc(), domain=Domain(-5, 5)),
  op("floor", lambda x: x.floor(), domain=Domain(-5, 5)),
  op("ceil", lambda x: x.ceil(), domain=Domain(-5, 5)),
  op("clip", lambda x: x.clip(-0.5, 0.7)),
  op("clamp", lambda x: x.clamp(-0.5, 0.7)),
  op("clamp_min", lambda x: x.clamp(min=-0.5)),
  op("clamp_max", lambda x: x.clamp(max=0.5)),
  op("relu", lambda x: x.relu(), domain=GRID),
  op("sigmoid", lambda x: x.sigmoid(), domain=Domain(-8, 8)),
  op("tanh", lambda x: x.tanh(), domain=Domain(-5, 5)),
  op("gelu", F.gelu, lambda x: x.gelu(), domain=Domain(-5, 5)),
  op("silu", F.silu, lambda x: x.silu(), domain=Domain(-5, 5)),
  op("elu", F.elu, lambda x: x.elu()),
  op("elu_alpha", lambda x: F.elu(x, 0.5), lambda x: x.elu(0.5)),
  op("leakyrelu", F.leaky_relu, lambda x: x.leakyrelu()),
  op("leakyrelu_slope", lambda x: F.leaky_relu(x, 0.2), lambda x: x.leakyrelu(0.2)),
  op("softplus", F.softplus, lambda x: x.softplus(), domain=Domain(-5, 5)),
  op("hardswish", F.hardswish, lambda x: x.hardswish(), domain=Domain(-5, 5)),
  op("mish", F.mish, lambda x: x.mish(), domain=Domain(-5, 5)),
  op("relu6", F.relu6, lambda x: x.relu6(), domain=Domain(-8, 8)),
]


@pytest.mark.parametrize("shape", [(), (3, 1, 4), (45, 65)], ids=str)
@pytest.mark.parametrize("torch_fn, fg_fn, domain, atol, rtol", UNARY_OPS)
def test_unary(device, shape, torch_fn, fg_fn, domain, atol, rtol):
  check_op(device, [shape], torch_fn, fg_fn, domain=domain, atol=atol, rtol=rtol)


def edge(name: str, values: list[float], torch_fn, fg_fn=None, atol: float = 1e-5):
  return pytest.param(np.array(values, dtype=np.float32), torch_fn, fg_fn, atol, id=name)


EDGE_VALUES = [
  edge("exp", [-100.0, -10.0, 0.0, 10.0, 88.0, 100.0, INF, -INF, NAN], lambda x: x.exp()),
  edge("log", [0.0, 1e-30, 1.0, 1e30, INF, -1.0], lambda x: x.log()),
  edge("sqrt", [0.0, 1e-30, 4.0, 1e30, INF, -1.0], lambda x: x.sqrt()),
  edge("sigmoid", [-100.0, -20.0, 0.0, 20.0, 100.0], lambda x: x.sigmoid()),
  edge("tanh", [-100.0, -10.0, -0.0, 10.0, 100.0], lambda x: x.tanh()),
  edge("softplus", [-100.0, -20.0, 0.0, 20.0, 30.0, 100.0], F.softplus, lambda x: x.softplus()),
  edge("silu", [-100.0, -20.0, 20.0, 100.0], F.silu, lambda x: x.silu()),
  edge("gelu", [-100.0, -10.0, 10.0, 100.0], F.gelu, lambda x: x.gelu()),
  edge("mish", [-100.0, -30.0, 30.0, 100.0], F.mish, lambda x: x.mish()),
  edge("floor", [-2.5, -1.0, -0.5, 0.5, 1.0, 2.5, 1e8], lambda x: x.floor()),
  edge("ceil", [-2.5, -1.0, -0.5, 0.5, 1.0, 2.5, 1e8], lambda x: x.ceil()),
  edge("trunc", [-2.5, -1.0, -0.5, 0.5, 1.0, 2.5, 1e8], lambda x: x.trunc()),
  edge("sign", [-INF, -2.0, -0.0, 0.0, 3.0, INF], lambda x: x.sign()),
  edge("abs", [-INF, -2.0, -0.0, INF, NAN], lambda x: x.abs()),
  edge("neg", [-INF, 0.0, INF, NAN], lambda x: -x),
  edge("reciprocal", [INF, -INF, 1e-3, -1e3], lambda x: x.reciprocal()),
  edge("sin", [-100.0, -0.0, 100.0, 1000.0], lambda x: x.sin(), atol=1e-4),
  edge("cos", [-100.0, 0.0, 100.0, 1000.0], lambda x: x.cos(), atol=1e-4),
  edge("relu", [-INF, -1.0, 0.0, INF], lambda x: x.relu()),
]


@pytest.mark.parametrize("values, torch_fn, fg_fn, atol", EDGE_VALUES)
def test_unary_edge_values(device, values, torch_fn, fg_fn, atol):
  check_op(device, [values], torch_fn, fg_fn, atol=atol)


SHAPES = [(), (1,), (1, 1), (3, 1, 4), (4, 5, 6), (45, 65)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_elementwise_chain_shapes(device, shape):
  check_op(device, [shape, shape], lambda x, y: (x * y + x.exp()).relu() - y / 3)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("fn", [
  pytest.param(lambda x: -x, id="neg"),
  pytest.param(lambda x: x.abs(), id="abs"),
  pytest.param(lambda x: x.sign(), id="sign"),
  pytest.param(lambda x: x.square(), id="square"),
  pytest.param(lambda x: ~x, id="invert"),
  pytest.param(lambda x: x.relu(), id="relu"),
  pytest.param(lambda x: x.clamp(-3, 4), id="clamp"),
])
def test_unary_int(device, dtype, fn):
  check_op(device, [(4, 5, 6)], fn, dtype=dtype, domain=INTS)


def test_invert_bool(device):
  check_op(device, [(4, 5, 6)], lambda x: ~x, dtype="bool")


@pytest.mark.parametrize("fn", [
  pytest.param(lambda x: x + x, id="add"),
  pytest.param(lambda x: x * 1.5, id="mul"),
  pytest.param(lambda x: x.exp(), id="exp"),
  pytest.param(lambda x: x.sqrt(), id="sqrt"),
  pytest.param(lambda x: x.sigmoid(), id="sigmoid"),
  pytest.param(lambda x: x.relu(), id="relu"),
  pytest.param(lambda x: x.float(), id="to_float"),
  pytest.param(lambda x: x < 1.0, id="lt"),
])
def test_unary_float16(device, fn):
  check_op(device, [(45, 65)], fn, dtype="float16", domain=Domain(0.0, 3.0), atol=1e-2, rtol=1e-2)


def test_float16_sum(device):
  check_op(device, [(4, 5, 6)], lambda x: x.sum(1), dtype="float16", atol=2e-2, rtol=1e-2)
  # torch accumulates half in float32; a half accumulator would be off by far more than one final rounding
  check_op(device, [(45, 65)], lambda x: x.sum(), dtype="float16", domain=Domain(0, 3), rtol=2e-3)
  check_op(device, [(45, 65)], lambda x: x.mean(1), dtype="float16", domain=Domain(0, 3), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("fn", [
  pytest.param(lambda x: x.exp(), id="exp"),
  pytest.param(lambda x: x.log(), id="log"),
  pytest.param(lambda x: x.sin(), id="sin"),
  pytest.param(lambda x: x.sigmoid(), id="sigmoid"),
  pytest.param(lambda x: x / 3 + x ** 2, id="arith"),
  pytest.param(lambda x: x.sum(1), id="sum"),
  pytest.param(lambda x: x.softmax(-1), id="softmax"),
  pytest.param(lambda x: x @ x.T, id="matmul"),
])
def test_float64(device, fn):
  """float64 keeps double precision end to end: constants and intermediates must not pass through float32."""
  check_op(device, [(9, 11)], fn, dtype="float64", domain=Domain(0.1, 3), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("dtype", ["int32", "bool"])
@pytest.mark.parametrize("fn", [
  pytest.param(lambda x: x.exp(), id="exp"),
  pytest.param(lambda x: x.exp2(), id="exp2"),
  pytest.param(lambda x: x.log(), id="log"),
  pytest.param(lambda x: x.sqrt(), id="sqrt"),
  pytest.param(lambda x: x.rsqrt(), id="rsqrt"),
  pytest.param(lambda x: x.sin(), id="sin"),
  pytest.param(lambda x: x.sigmoid(), id="sigmoid"),
  pytest.param(lambda x: x.tanh(), id="tanh"),
  pytest.param(lambda x: x.reciprocal(), id="reciprocal"),
  pytest.param(lambda x: x.float().floor(), id="floor"),
])
def test_unary_int_input_gives_float(device, dtype, fn):
  """torch computes float ops of int and bool tensors in float32."""
  check_op(device, [(3, 4)], fn, dtype=dtype, domain=Domain(1, 9))


# ---------------------------------------------------------------------------------------------------------------------
# Binary elementwise ops, broadcasting and Python scalars

BINARY_OPS = [
  op("add", lambda x, y: x + y),
  op("sub", lambda x, y: x - y),
  op("mul", lambda x, y: x * y),
  op("div", lambda x, y: x / y, domain=[ANY, NONZERO]),
  op("pow", lambda x, y: x ** y, domain=[POS, ANY], rtol=1e-4),
  op("maximum", torch.maximum, lambda x, y: x.maximum(y), domain=GRID),
  op("minimum", torch.minimum, lambda x, y: x.minimum(y), domain=GRID),
  op("floordiv", lambda x, y: x // y, domain=[ANY, NONZERO]),
  op("mod", lambda x, y: x % y, domain=[ANY, NONZERO]),
  op("lt", lambda x, y: x < y, domain=GRID),
  op("le", lambda x, y: x <= y, domain=GRID),
  op("gt", lambda x, y: x > y, domain=GRID),
  op("ge", lambda x, y: x >= y, domain=GRID),
  op("eq", lambda x, y: x == y, domain=GRID),
  op("ne", lambda x, y: x != y, domain=GRID),
]
BROADCAST_SHAPES = [((45, 65), (45, 65)), ((4, 5, 6), (5, 1)), ((), (3, 1, 4)), ((3, 1, 4), (1, 5, 1))]


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("torch_fn, fg_fn, domain, atol, rtol", BINARY_OPS)
def test_binary(device, shapes, torch_fn, fg_fn, domain, atol, rtol):
  check_op(device, list(shapes), torch_fn, fg_fn, domain=domain, atol=atol, rtol=rtol)


@pytest.mark.parametrize("fn", [
  pytest.param(lambda x, y: x.add(y), id="add"),
  pytest.param(lambda x, y: x.sub(y), id="sub"),
  pytest.param(lambda x, y: x.mul(y), id="mul"),
  pytest.param(lambda x, y: x.div(y), id="div"),
  pytest.param(lambda x, y: x.abs().pow(y), id="pow"),
])
def test_binary_methods(device, fn):
  check_op(device, [(4, 5, 6), (6,)], fn, domain=[ANY, NONZERO], rtol=1e-4)


SCALAR_OPS = [
  op("add", lambda x: x + 2),
  op("radd", lambda x: 2 + x),
  op("sub", lambda x: x - 2.5),
  op("rsub", lambda x: 2 - x),
  op("mul", lambda x: x * -1.5),
  op("rmul", lambda x: 3 * x),
  op("div", lambda x: x / 4),
  op("rdiv", lambda x: 3 / x, domain=NONZERO),
  op("pow2", lambda x: x ** 2),
  op("pow3", lambda x: x ** 3),
  op("pow_half", lambda x: x ** 0.5, domain=POS),
  op("pow_half_negative_base", lambda x: x ** 0.5),
  op("pow0", lambda x: x ** 0),
  op("pow_neg1", lambda x: x ** -1, domain=NONZERO),
  op("pow_neg2", lambda x: x ** -2, domain=NONZERO, rtol=1e-4),
  op("rpow", lambda x: 2 ** x, rtol=1e-4),
  op("rpow_half", lambda x: 0.5 ** x, rtol=1e-4),
  op("floordiv", lambda x: x // 0.75),
  op("rfloordiv", lambda x: 3 // x, domain=NONZERO),
  op("mod", lambda x: x % 0.75),
  op("mod_negative", lambda x: x % -0.75),
  op("rmod", lambda x: 3 % x, domain=NONZERO),
  op("lt", lambda x: x < 0.5, domain=GRID),
  op("rlt", lambda x: 0.5 < x, domain=GRID),
  op("le", lambda x: x <= 0.5, domain=GRID),
  op("gt", lambda x: x > 0.5, domain=GRID),
  op("ge", lambda x: x >= 0, domain=GRID),
  op("eq", lambda x: x == 0.5, domain=GRID),
  op("ne", lambda x: x != 0.5, domain=GRID),
]


@pytest.mark.parametrize("torch_fn, fg_fn, domain, atol, rtol", SCALAR_OPS)
def test_python_scalar(device, torch_fn, fg_fn, domain, atol, rtol):
  check_op(device, [(4, 5, 6)], torch_fn, fg_fn, domain=domain, atol=atol, rtol=rtol)


def test_python_scalar_0d(device):
  check_op(device, [()], lambda x: (2 - x) * 3 / (x * x + 1) + x ** 2)


def test_pow_edge_values(device):
  base = np.array([0.0, 0.0, 0.0, -2.0, -2.0, 2.0, -0.5, 1.0, -1.0], dtype=np.float32)
  exponent = np.array([0.0, 2.0, -1.0, 3.0, 0.5, -2.0, 2.0, INF, 2.0], dtype=np.float32)
  check_op(device, [base, exponent], lambda x, y: x ** y)


def test_float_division_by_zero(device):
  """IEEE results, as torch: x/0 is +-inf, 0/0 is nan; floor division and modulo by zero follow torch too."""
  x = np.array([1.0, -1.0, 0.0, 2.5, -0.0, INF], dtype=np.float32)
  zero = np.array([0.0, 0.0, 0.0, -0.0, 0.0, 0.0], dtype=np.float32)
  check_op(device, [x, zero], lambda a, b: a / b)
  check_op(device, [x], lambda a: a / 0.0)
  check_op(device, [x], lambda a: a.reciprocal())
  check_op(device, [x, zero], lambda a, b: a // b)
  check_op(device, [x, zero], lambda a, b: a % b)


NAN_CASES = [
  pytest.param(lambda x, y: torch.maximum(x, y), lambda x, y: x.maximum(y), id="maximum"),
  pytest.param(lambda x, y: torch.minimum(x, y), lambda x, y: x.minimum(y), id="minimum"),
  pytest.param(lambda x, y: x.relu(), None, id="relu"),
  pytest.param(lambda x, y: x.clamp(-0.5, 0.5), None, id="clamp"),
  pytest.param(lambda x, y: x.amax(1), lambda x, y: x.max(1), id="max_reduce"),
  pytest.param(lambda x, y: x.sum(1), None, id="sum"),
  pytest.param(lambda x, y: x.sigmoid() + x.exp(), None, id="sigmoid_exp"),
  pytest.param(lambda x, y: x < y, None, id="lt"),
  pytest.param(lambda x, y: x != x, None, id="ne_self"),
]


@pytest.mark.parametrize("torch_fn, fg_fn", NAN_CASES)
def test_nan_propagation(device, torch_fn, fg_fn):
  x = np.array([[NAN, 1.0, -2.0], [0.5, NAN, 3.0]], dtype=np.float32)
  y = np.array([0.0, NAN, -1.0], dtype=np.float32)
  check_op(device, [x, y], torch_fn, fg_fn)


INT_BINARY_OPS = [
  op("add", lambda x, y: x + y),
  op("sub", lambda x, y: x - y),
  op("mul", lambda x, y: x * y),
  op("div", lambda x, y: x / y, domain=[INTS, NONZERO_INTS]),
  op("floordiv", lambda x, y: x // y, domain=[INTS, NONZERO_INTS]),
  op("mod", lambda x, y: x % y, domain=[INTS, NONZERO_INTS]),
  op("pow", lambda x, y: x ** y, domain=[INTS, Domain(0, 4)]),
  op("maximum", torch.maximum, lambda x, y: x.maximum(y)),
  op("minimum", torch.minimum, lambda x, y: x.minimum(y)),
  op("lt", lambda x, y: x < y),
  op("le", lambda x, y: x <= y),
  op("gt", lambda x, y: x > y),
  op("ge", lambda x, y: x >= y),
  op("eq", lambda x, y: x == y),
  op("ne", lambda x, y: x != y),
  op("and", lambda x, y: x & y),
  op("or", lambda x, y: x | y),
  op("xor", lambda x, y: x ^ y),
]


@pytest.mark.parametrize("dtype, domain", [("uint8", Domain(0, 15)), ("int8", INTS), ("int16", Domain(-200, 200))])
@pytest.mark.parametrize("torch_fn, fg_fn", [
  pytest.param(lambda x, y: x * y, None, id="mul"),
  pytest.param(torch.maximum, lambda x, y: x.maximum(y), id="maximum"),
  pytest.param(lambda x, y: x < y, None, id="lt"),
  pytest.param(lambda x, y: x & y, None, id="and"),
  pytest.param(lambda x, y: x.sum(0), None, id="sum"),
  pytest.param(lambda x, y: x.amax(0), lambda x, y: x.max(0), id="max"),
  pytest.param(lambda x, y: x.float() / 3, None, id="to_float"),
])
def test_small_int_dtypes(device, dtype, domain, torch_fn, fg_fn):
  check_op(device, [(4, 5), (5,)], torch_fn, fg_fn, dtype=dtype, domain=domain)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("torch_fn, fg_fn, domain, atol, rtol", INT_BINARY_OPS)
def test_binary_int(device, dtype, torch_fn, fg_fn, domain, atol, rtol):
  domain = INTS if domain is ANY else domain
  check_op(device, [(4, 5, 6), (5, 1)], torch_fn, fg_fn, dtype=dtype, domain=domain, atol=atol, rtol=rtol)


BOOL_BINARY_OPS = [
  op("add", lambda x, y: x + y),
  op("mul", lambda x, y: x * y),
  op("and", lambda x, y: x & y),
  op("or", lambda x, y: x | y),
  op("xor", lambda x, y: x ^ y),
  op("maximum", torch.maximum, lambda x, y: x.maximum(y)),
  op("minimum", torch.minimum, lambda x, y: x.minimum(y)),
  op("lt", lambda x, y: x < y),
  op("eq", lambda x, y: x == y),
  op("ne", lambda x, y: x != y),
]


@pytest.mark.parametrize("torch_fn, fg_fn, domain, atol, rtol", BOOL_BINARY_OPS)
def test_binary_bool(device, torch_fn, fg_fn, domain, atol, rtol):
  check_op(device, [(4, 5, 6), (5, 1)], torch_fn, fg_fn, dtype="bool")


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_int_floordiv_mod_negative(device, dtype):
  a = np.array([-7, 7, -7, 7, -1, 0, 9, -9, 6, -6, 1, -12], dtype=dtype)
  b = np.array([2, 2, -2, -2, 3, 5, -4, 4, 3, -3, -5, 5], dtype=dtype)
  check_op(device, [a, b], lambda x, y: x // y)
  check_op(device, [a, b], lambda x, y: x % y)
  check_op(device, [a], lambda x: x // -3)
  check_op(device, [a], lambda x: x % -3)
  check_op(device, [a], lambda x: x // 4)
  check_op(device, [a], lambda x: x % 4)
  check_op(device, [b], lambda x: -7 // x)
  check_op(device, [b], lambda x: 7 % x)


@pytest.mark.parametrize("dtype, bound", [("int32", 2 ** 30), ("int64", 2 ** 40)])
@pytest.mark.parametrize("torch_fn, fg_fn", [
  pytest.param(lambda x, y: x + y, None, id="add"),
  pytest.param(lambda x, y: x - 3 * y, None, id="sub_mul"),
  pytest.param(lambda x, y: x // 7, None, id="floordiv7"),
  pytest.param(lambda x, y: x % 7, None, id="mod7"),
  pytest.param(lambda x, y: x // -7, None, id="floordiv-7"),
  pytest.param(lambda x, y: x % -1000, None, id="mod-1000"),
  pytest.param(lambda x, y: x // y, None, id="floordiv"),
  pytest.param(lambda x, y: x % y, None, id="mod"),
  pytest.param(lambda x, y: x < y, None, id="lt"),
  pytest.param(lambda x, y: x.amax(0), lambda x, y: x.max(0), id="max"),
  pytest.param(lambda x, y: x.sum(0), None, id="sum"),
  pytest.param(lambda x, y: x.argmax(0), None, id="argmax"),
])
def test_int_large_values(device, dtype, bound, torch_fn, fg_fn):
  """Values far from zero catch 32-bit constants and intermediates, and division rewritten as a multiply."""
  domains = [Domain(-bound, bound), Domain(-bound // 4, bound // 4, nonzero=True)]
  check_op(device, [(6, 7), (7,)], torch_fn, fg_fn, dtype=dtype, domain=domains)


@pytest.mark.parametrize("fn", [
  pytest.param(lambda x: x + 3, id="add"),
  pytest.param(lambda x: 3 - x, id="rsub"),
  pytest.param(lambda x: x * -2, id="mul"),
  pytest.param(lambda x: x & 5, id="and"),
  pytest.param(lambda x: 5 | x, id="ror"),
  pytest.param(lambda x: x ^ -1, id="xor"),
  pytest.param(lambda x: x ** 2, id="pow"),
  pytest.param(lambda x: x < 3, id="lt"),
  pytest.param(lambda x: x == 3, id="eq"),
])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_int_python_scalar(device, dtype, fn):
  check_op(device, [(4, 5, 6)], fn, dtype=dtype, domain=INTS)


@pytest.mark.parametrize("fn", [
  pytest.param(lambda x: x & True, id="and"),
  pytest.param(lambda x: x | False, id="or"),
  pytest.param(lambda x: x ^ True, id="xor"),
  pytest.param(lambda x: x == True, id="eq"),  # noqa: E712
])
def test_bool_python_scalar(device, fn):
  check_op(device, [(4, 5, 6)], fn, dtype="bool")


# ---------------------------------------------------------------------------------------------------------------------
# dtype promotion: mixed tensor dtypes, weak Python scalars and 0-d tensors

PROMOTION_PAIRS = [("int32", "int64"), ("int32", "float32"), ("bool", "int32"), ("bool", "float32"),
                   ("float16", "float32"), ("int64", "float16"), ("uint8", "int8"), ("int8", "int16"),
                   ("uint8", "float32"), ("bool", "bool"), ("int64", "float32")]
PROMOTION_OPS = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y, "lt": lambda x, y: x < y}
PROMOTION_CASES = [pytest.param(pair, PROMOTION_OPS[name], id=f"{name}-{pair[0]}-{pair[1]}")
                   for name in PROMOTION_OPS for pair in PROMOTION_PAIRS]


@pytest.mark.parametrize("dtypes_, fn", PROMOTION_CASES)
def test_promotion(device, dtypes_, fn):
  check_op(device, [(4, 5), (5,)], fn, dtype=dtypes_, domain=Domain(-5, 5, discrete=True), atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("dtype, fn", [
  pytest.param("int32", lambda x: x + 2, id="int32+int"),
  pytest.param("int32", lambda x: x + 2.5, id="int32+float"),
  pytest.param("int32", lambda x: x * True, id="int32*bool"),
  pytest.param("int32", lambda x: x / 2, id="int32/int"),
  pytest.param("int64", lambda x: 7 / x, id="int/int64"),
  pytest.param("int32", lambda x: x ** 2, id="int32**int"),
  pytest.param("int32", lambda x: x ** 0.5, id="int32**float"),
  pytest.param("int32", lambda x: x // 2, id="int32//int"),
  pytest.param("int32", lambda x: x < 2.5, id="int32<float"),
  pytest.param("int32", lambda x: x == 2.0, id="int32==float"),
  pytest.param("bool", lambda x: x + 1, id="bool+int"),
  pytest.param("bool", lambda x: x + 1.5, id="bool+float"),
  pytest.param("bool", lambda x: x + True, id="bool+bool"),
  pytest.param("bool", lambda x: x * 3, id="bool*int"),
  pytest.param("float16", lambda x: x + 2.5, id="half+float"),
  pytest.param("float16", lambda x: x * 3, id="half*int"),
  pytest.param("uint8", lambda x: x + 3, id="uint8+int"),
  pytest.param("int8", lambda x: x * 2.0, id="int8*float"),
])
def test_weak_python_scalars(device, dtype, fn):
  check_op(device, [(3, 4)], fn, dtype=dtype, domain=Domain(0, 5), atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("dtypes_", [("int32", "int64"), ("float32", "float64"), ("int32", "float64"),
                                     ("bool", "int32"), ("float16", "float32")], ids=str)
def test_promotion_0d_tensor(device, dtypes_):
  """torch: a 0-d tensor only raises the result's category, not its width within a category."""
  check_op(device, [(3, 4), ()], lambda x, y: x + y, dtype=dtypes_, domain=Domain(0, 5), atol=1e-2, rtol=1e-3)


# ---------------------------------------------------------------------------------------------------------------------
# where

def torch_where(c, x, y): return torch.where(c, x, y)


@pytest.mark.parametrize("shapes", [((4, 5, 6),) * 3, ((4, 1, 6), (5, 1), ()), ((), (3, 1, 4), (1, 5, 1))], ids=str)
def test_where(device, shapes):
  cond, x, y = shapes
  inputs = [make_array(np.random.default_rng(1), cond, "bool"), x, y]
  check_op(device, inputs, torch_where, lambda c, a, b: Tensor.where(c, a, b))
  check_op(device, inputs, torch_where, lambda c, a, b: c.where(a, b))


@pytest.mark.parametrize("torch_fn, fg_fn", [
  pytest.param(lambda x: torch.where(x > 0, x, 0.0), lambda x: (x > 0).where(x, 0.0), id="x_scalar"),
  pytest.param(lambda x: torch.where(x > 0, 1.5, x), lambda x: (x > 0).where(1.5, x), id="scalar_x"),
  pytest.param(lambda x: torch.where(x > 0, 1, 0), lambda x: (x > 0).where(1, 0), id="int_scalars"),
  pytest.param(lambda x: torch.where(x > 0, 1.0, -1.0), lambda x: (x > 0).where(1.0, -1.0), id="float_scalars"),
  pytest.param(lambda x: torch.where(x > 0, x.int(), 0.5), lambda x: (x > 0).where(x.int(), 0.5), id="int_x_float"),
  pytest.param(lambda x: torch.where(x > 0, x.int(), x), lambda x: (x > 0).where(x.int(), x), id="int_x_float_y"),
])
def test_where_scalars_and_dtypes(device, torch_fn, fg_fn):
  check_op(device, [(4, 5, 6)], torch_fn, fg_fn, domain=Domain(-3, 3))


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_where_int_bool(device, dtype):
  inputs = [make_array(np.random.default_rng(1), (4, 5), "bool"), (4, 5), (5,)]
  check_op(device, inputs, torch_where, lambda c, a, b: c.where(a, b), dtype=["bool", dtype, dtype], domain=INTS)


# ---------------------------------------------------------------------------------------------------------------------
# Reductions

def torch_max(x, axis=None, keepdim=False): return x.amax(() if axis is None else axis, keepdim=keepdim)
def torch_min(x, axis=None, keepdim=False): return x.amin(() if axis is None else axis, keepdim=keepdim)
def torch_logsumexp(x, axis=None, keepdim=False): return x.logsumexp(tuple(range(x.ndim)) if axis is None else axis,
                                                                     keepdim=keepdim)


REDUCE_OPS = {  # name: (torch_fn(x, axis, keepdim), fusegrad fn or None for the same, input domain)
  "sum": (lambda x, axis, keepdim: x.sum(axis, keepdim=keepdim), None, ANY),
  "max": (torch_max, lambda x, axis, keepdim: x.max(axis, keepdim=keepdim), GRID),
  "min": (torch_min, lambda x, axis, keepdim: x.min(axis, keepdim=keepdim), GRID),
  "mean": (lambda x, axis, keepdim: x.mean(axis, keepdim=keepdim), None, ANY),
  "std": (lambda x, axis, keepdim: x.std(axis, keepdim=keepdim), None, ANY),
  "var": (lambda x, axis, keepdim: x.var(axis, keepdim=keepdim), None, ANY),
  "logsumexp": (torch_logsumexp, lambda x, axis, keepdim: x.logsumexp(axis, keepdim=keepdim), ANY),
}
REDUCE_AXES = [(None, False), (None, True), (0, False), (1, True), (-1, False), ((0, 2), False), ((-1, 0), True)]


def check_reduce(device, name: str, shape: tuple[int, ...], axis, keepdim: bool) -> None:
  torch_fn, fg_fn, domain = REDUCE_OPS[name]
  fg_fn = fg_fn or torch_fn
  check_op(device, [shape], lambda x: torch_fn(x, axis, keepdim), lambda x: fg_fn(x, axis, keepdim), domain=domain,
           atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("axis, keepdim", REDUCE_AXES, ids=str)
@pytest.mark.parametrize("name", list(REDUCE_OPS))
def test_reduce(device, name, axis, keepdim):
  check_reduce(device, name, (4, 5, 6), axis, keepdim)


# std and var of a single element divide by zero degrees of freedom; those cases are left out
REDUCE_SHAPE_CASES = [(name, shape, axis) for name in REDUCE_OPS
                      for shape, axis in [((45, 65), None), ((45, 65), 1), ((45, 65), 0), ((3, 1, 4), 0),
                                          ((3, 1, 4), 1), ((1, 1), None), ((1,), 0)]
                      if name not in ("std", "var") or shape not in ((1, 1), (1,)) and (shape, axis) != ((3, 1, 4), 1)]


@pytest.mark.parametrize("name, shape, axis", REDUCE_SHAPE_CASES, ids=str)
def test_reduce_shapes(device, name, shape, axis):
  check_reduce(device, name, shape, axis, False)


@pytest.mark.parametrize("fn", [
  pytest.param(lambda x: x.sum(), id="sum"),
  pytest.param(lambda x: x.mean(), id="mean"),
  pytest.param(lambda x: x.max(), id="max"),
  pytest.param(lambda x: x.min(), id="min"),
  pytest.param(lambda x: x.sum(0), id="sum0"),
  pytest.param(lambda x: x.sum(-1, keepdim=True), id="sum-1_keepdim"),
  pytest.param(lambda x: x.softmax(0), id="softmax"),
  pytest.param(lambda x: x.cumsum(0), id="cumsum"),
])
def test_reduce_0d(device, fn):
  check_op(device, [()], fn)


@pytest.mark.parametrize("fn", [
  pytest.param(lambda x: x.std(1, correction=0), id="std_correction0"),
  pytest.param(lambda x: x.var(0, correction=0), id="var_correction0"),
  pytest.param(lambda x: x.var((0, 1), correction=2), id="var_correction2"),
  pytest.param(lambda x: x.std(None, correction=0), id="std_all_correction0"),
])
def test_std_var_correction(device, fn):
  check_op(device, [(4, 5, 6)], fn, rtol=1e-4)


ARG_AXES = [(None, False), (0, False), (1, True), (-1, False), (-2, True)]


@pytest.mark.parametrize("axis, keepdim", ARG_AXES, ids=str)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_argmax_argmin(device, name, axis, keepdim, dtype):
  fn = lambda x: getattr(x, name)() if axis is None else getattr(x, name)(axis, keepdim=keepdim)  # noqa: E731
  check_op(device, [(4, 5, 6)], fn, dtype=dtype, domain=Domain(-2, 2, discrete=True))


def test_argmax_ties_first_index(device):
  values = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [-1, -5, -1, -5]], dtype=np.float32)
  check_op(device, [values], lambda x: x.argmax(1))
  check_op(device, [values], lambda x: x.argmin(1))
  check_op(device, [values], lambda x: x.argmax())
  check_op(device, [values], lambda x: x.argmin(0))


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax(device, name, axis):
  check_op(device, [(4, 5, 6)], lambda x: getattr(x, name)(axis), domain=Domain(-5, 5), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_size1_axis(device, name):
  check_op(device, [(3, 1, 4)], lambda x: getattr(x, name)(1), atol=1e-6)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_large_values(device, name):
  check_op(device, [(45, 65)], lambda x: getattr(x, name)(-1), domain=Domain(-200, 200), atol=1e-6, rtol=1e-5)
  values = np.array([[1000.0, 1000.0, -1000.0], [-1e30, 0.0, 1e30]], dtype=np.float32)
  check_op(device, [values], lambda x: getattr(x, name)(1), atol=1e-6, rtol=1e-5)


def test_logsumexp_large_values(device):
  values = np.array([[1000.0, 1000.0, -1000.0], [-100.0, -100.0, -100.0]], dtype=np.float32)
  check_op(device, [values], lambda x: x.logsumexp(1), rtol=1e-6)


@pytest.mark.parametrize("fn", [pytest.param(lambda x: x.softmax(-1), id="softmax"),
                                pytest.param(lambda x: x.log_softmax(-1), id="log_softmax"),
                                pytest.param(lambda x: x.logsumexp(-1), id="logsumexp")])
def test_masked_with_neg_inf(device, fn):
  """-inf entries (attention masks) get zero weight; a row of only -inf gives what torch gives."""
  values = np.array([[0.0, -INF, 1.0], [-INF, 2.0, -INF], [-INF, -INF, -INF]], dtype=np.float32)
  check_op(device, [values], fn, atol=1e-6)


@pytest.mark.parametrize("shape, axis", [((4, 5, 6), 0), ((4, 5, 6), 1), ((4, 5, 6), -1), ((45, 65), 1),
                                         ((3, 1, 4), 1), ((1,), 0), ((200,), 0)], ids=str)
def test_cumsum(device, shape, axis):
  check_op(device, [shape], lambda x: x.cumsum(axis), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype, torch_fn, fg_fn", [
  pytest.param("int32", lambda x: x.sum(), None, id="int32_sum"),
  pytest.param("int32", lambda x: x.sum(1), None, id="int32_sum_axis"),
  pytest.param("int64", lambda x: x.sum(-1, keepdim=True), None, id="int64_sum_axis"),
  pytest.param("bool", lambda x: x.sum(), None, id="bool_sum"),
  pytest.param("bool", lambda x: x.sum(0), None, id="bool_sum_axis"),
  pytest.param("int32", lambda x: x.amax(1), lambda x: x.max(1), id="int32_max"),
  pytest.param("int64", lambda x: x.amin(), lambda x: x.min(), id="int64_min"),
  pytest.param("bool", lambda x: x.amax(1), lambda x: x.max(1), id="bool_max"),
  pytest.param("bool", lambda x: x.amin(), lambda x: x.min(), id="bool_min"),
  pytest.param("int32", lambda x: x.cumsum(1), None, id="int32_cumsum"),
  pytest.param("bool", lambda x: x.cumsum(0), None, id="bool_cumsum"),
  pytest.param("int64", lambda x: x.argmax(0), None, id="int64_argmax"),
])
def test_reduce_int_bool(device, dtype, torch_fn, fg_fn):
  check_op(device, [(4, 5, 6)], torch_fn, fg_fn, dtype=dtype, domain=INTS)


# ---------------------------------------------------------------------------------------------------------------------
# Movement ops

def torch_pad(x, padding):
  """fusegrad pads ((before, after), ...) from dim 0; torch's F.pad takes flat pairs from the last dim."""
  return F.pad(x, [amount for pair in reversed(padding) for amount in pair])


def torch_shrink(x, arg): return x[tuple(slice(begin, end) for begin, end in arg)]


def movement(name: str, shape: tuple[int, ...], torch_fn, fg_fn=None):
  return pytest.param(shape, torch_fn, fg_fn, id=name)


MOVEMENT_OPS = [
  movement("reshape", (4, 5, 6), lambda x: x.reshape(20, 6)),
  movement("reshape_tuple", (4, 5, 6), lambda x: x.reshape((2, 10, 6))),
  movement("reshape_-1", (4, 5, 6), lambda x: x.reshape(-1)),
  movement("reshape_mid_-1", (4, 5, 6), lambda x: x.reshape(2, -1, 3)),
  movement("reshape_0d_to_11", (), lambda x: x.reshape(1, 1)),
  movement("reshape_1_to_0d", (1,), lambda x: x.reshape(())),
  movement("reshape_medium", (45, 65), lambda x: x.reshape(65, 45)),
  movement("view", (4, 5, 6), lambda x: x.view(5, 24)),
  movement("permute", (4, 5, 6), lambda x: x.permute(2, 0, 1)),
  movement("permute_tuple", (4, 5, 6), lambda x: x.permute((1, 2, 0))),
  movement("permute_negative", (4, 5, 6), lambda x: x.permute(-1, 0, -2)),
  movement("permute_size1", (3, 1, 4), lambda x: x.permute(1, 2, 0)),
  movement("expand", (3, 1, 4), lambda x: x.expand(3, 5, 4)),
  movement("expand_new_dims", (3, 1, 4), lambda x: x.expand(2, 3, 5, 4)),
  movement("expand_-1", (3, 1, 4), lambda x: x.expand(-1, 5, -1)),
  movement("expand_tuple", (1,), lambda x: x.expand((4,))),
  movement("expand_0d", (), lambda x: x.expand(2, 3)),
  movement("pad_2d", (4, 5), lambda x: torch_pad(x, ((1, 2), (0, 3))), lambda x: x.pad(((1, 2), (0, 3)))),
  movement("pad_3d", (4, 5, 6), lambda x: torch_pad(x, ((0, 0), (2, 1), (1, 1))),
           lambda x: x.pad(((0, 0), (2, 1), (1, 1)))),
  movement("pad_1d", (5,), lambda x: torch_pad(x, ((3, 0),)), lambda x: x.pad(((3, 0),))),
  movement("pad_noop", (4, 5), lambda x: torch_pad(x, ((0, 0), (0, 0))), lambda x: x.pad(((0, 0), (0, 0)))),
  movement("shrink", (4, 5), lambda x: torch_shrink(x, ((1, 3), (0, 5))), lambda x: x.shrink(((1, 3), (0, 5)))),
  movement("shrink_3d", (4, 5, 6), lambda x: torch_shrink(x, ((0, 4), (2, 3), (1, 5))),
           lambda x: x.shrink(((0, 4), (2, 3), (1, 5)))),
  movement("flip", (4, 5, 6), lambda x: x.flip(0)),
  movement("flip_negative", (4, 5, 6), lambda x: x.flip(-1)),
  movement("flip_tuple", (4, 5, 6), lambda x: x.flip((0, 2))),
  movement("flip_0d", (), lambda x: x.flip(0)),
  movement("transpose", (4, 5, 6), lambda x: x.transpose(0, 1)),
  movement("transpose_negative", (4, 5, 6), lambda x: x.transpose(-1, 0)),
  movement("T", (45, 65), lambda x: x.T),
  movement("flatten", (4, 5, 6), lambda x: x.flatten()),
  movement("flatten_start", (4, 5, 6), lambda x: x.flatten(1)),
  movement("flatten_range", (2, 3, 4, 5), lambda x: x.flatten(1, 2)),
  movement("flatten_0d", (), lambda x: x.flatten()),
  movement("squeeze", (3, 1, 4), lambda x: x.squeeze()),
  movement("squeeze_dim", (3, 1, 4), lambda x: x.squeeze(1)),
  movement("squeeze_noop_dim", (3, 1, 4), lambda x: x.squeeze(0)),
  movement("squeeze_negative", (3, 1, 4), lambda x: x.squeeze(-2)),
  movement("squeeze_all_ones", (1, 1), lambda x: x.squeeze()),
  movement("squeeze_0d", (), lambda x: x.squeeze()),
  movement("unsqueeze_front", (4, 5, 6), lambda x: x.unsqueeze(0)),
  movement("unsqueeze_back", (4, 5, 6), lambda x: x.unsqueeze(-1)),
  movement("unsqueeze_mid", (4, 5, 6), lambda x: x.unsqueeze(2)),
  movement("unsqueeze_0d", (), lambda x: x.unsqueeze(0)),
  movement("repeat", (3, 1, 4), lambda x: x.repeat(2, 3, 1)),
  movement("repeat_new_dims", (2, 3), lambda x: x.repeat(2, 1, 2)),
  movement("repeat_tuple", (2, 3), lambda x: x.repeat((1, 2))),
  movement("repeat_0d", (), lambda x: x.repeat(3)),
  movement("contiguous", (4, 5, 6), lambda x: x.permute(2, 1, 0).contiguous()),
  movement("chunk", (45, 65), lambda x: x.chunk(3, 1)),
  movement("chunk_uneven", (45, 65), lambda x: x.chunk(4, 0)),
  movement("chunk_default_dim", (6, 4), lambda x: x.chunk(2)),
  movement("chunk_more_than_size", (3, 4), lambda x: x.chunk(5, 0)),
  movement("chunk_negative_dim", (4, 5, 6), lambda x: x.chunk(3, -1)),
]


@pytest.mark.parametrize("shape, torch_fn, fg_fn", MOVEMENT_OPS)
def test_movement(device, shape, torch_fn, fg_fn):
  check_op(device, [shape], torch_fn, fg_fn)


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_movement_int_bool(device, dtype):
  check_op(device, [(4, 5, 6)], lambda x: x.permute(2, 0, 1)[1:, ::2].flip(0).reshape(-1), dtype=dtype, domain=INTS)
  check_op(device, [(4, 5)], lambda x: torch_pad(x, ((1, 2), (0, 3))), lambda x: x.pad(((1, 2), (0, 3))), dtype=dtype,
           domain=INTS)


def fg_cat(*tensors, dim=0): return tensors[0].cat(*tensors[1:], dim=dim)
def fg_stack(*tensors, dim=0): return tensors[0].stack(*tensors[1:], dim=dim)


@pytest.mark.parametrize("shapes, dim", [(((2, 3), (4, 3)), 0), (((2, 3), (2, 5)), 1), (((2, 3), (2, 5), (2, 1)), -1),
                                         (((4, 5, 6), (4, 2, 6)), 1), (((1,), (3,)), 0), (((3, 1, 4),) * 2, 2)],
                         ids=str)
def test_cat(device, shapes, dim):
  check_op(device, list(shapes), lambda *ts: torch.cat(ts, dim), lambda *ts: fg_cat(*ts, dim=dim))


@pytest.mark.parametrize("shapes, dim", [(((2, 3),) * 2, 0), (((2, 3),) * 3, 1), (((4, 5, 6),) * 2, -1),
                                         (((),) * 3, 0), (((3, 1, 4),) * 2, 1)], ids=str)
def test_stack(device, shapes, dim):
  check_op(device, list(shapes), lambda *ts: torch.stack(ts, dim), lambda *ts: fg_stack(*ts, dim=dim))


def test_cat_stack_list_form(device):
  check_op(device, [(2, 3), (2, 4)], lambda x, y: torch.cat([x, y], dim=1), lambda x, y: Tensor.cat([x, y], dim=1))
  check_op(device, [(2, 3), (2, 3)], lambda x, y: torch.stack([x, y], dim=1), lambda x, y: Tensor.stack([x, y], dim=1))
  check_op(device, [(2, 3), (2, 3)], lambda x, y: torch.stack([x, y]), lambda x, y: Tensor.stack([x, y]))


@pytest.mark.parametrize("dtypes_", [("int32", "float32"), ("bool", "int32")], ids=str)
def test_cat_mixed_dtypes(device, dtypes_):
  check_op(device, [(2, 3), (1, 3)], lambda x, y: torch.cat([x, y]), lambda x, y: Tensor.cat([x, y]), dtype=dtypes_,
           domain=INTS)


# ---------------------------------------------------------------------------------------------------------------------
# Indexing: getitem and gather

GETITEM_BASIC = [
  pytest.param(lambda x: x[1], id="int"),
  pytest.param(lambda x: x[-1], id="negative_int"),
  pytest.param(lambda x: x[1, 2], id="two_ints"),
  pytest.param(lambda x: x[1, -2, 3], id="all_ints"),
  pytest.param(lambda x: x[1:3], id="slice"),
  pytest.param(lambda x: x[:, 1:], id="slice_dim1"),
  pytest.param(lambda x: x[::2], id="step"),
  pytest.param(lambda x: x[1::3, :, ::4], id="steps"),
  pytest.param(lambda x: x[-3:-1], id="negative_bounds"),
  pytest.param(lambda x: x[2:100], id="clamped_bounds"),
  pytest.param(lambda x: x[3:1], id="empty_slice"),
  pytest.param(lambda x: x[None], id="none"),
  pytest.param(lambda x: x[:, None, 2], id="none_int"),
  pytest.param(lambda x: x[..., 1], id="ellipsis_int"),
  pytest.param(lambda x: x[..., None], id="ellipsis_none"),
  pytest.param(lambda x: x[1, ..., 2:], id="int_ellipsis_slice"),
  pytest.param(lambda x: x[...], id="ellipsis"),
  pytest.param(lambda x: x[:], id="full_slice"),
  pytest.param(lambda x: x[::10], id="step_past_end"),
  pytest.param(lambda x: x[-100:], id="start_before_begin"),
  pytest.param(lambda x: x[7:], id="start_past_end"),
  pytest.param(lambda x: x[:, None, :, None], id="two_nones"),
]


@pytest.mark.parametrize("fn", GETITEM_BASIC)
def test_getitem(device, fn):
  check_op(device, [(4, 5, 6)], fn)


@pytest.mark.parametrize("key", [np.s_[::-1], np.s_[::-2, 1:], np.s_[3:0:-1, ::-3], np.s_[-1::-2, None, 2],
                                 np.s_[..., ::-1], np.s_[1:, ::-2, ::-1]], ids=str)
def test_getitem_negative_step(device, key):
  """torch has no negative steps, so numpy gives the expected values."""
  arr = make_array(np.random.default_rng(0), (4, 5, 6), "float32")
  assert_same(Tensor(arr, device=device)[key], torch.from_numpy(arr[key].copy()), device=device)


def test_getitem_0d(device):
  check_op(device, [()], lambda x: x[None])
  check_op(device, [()], lambda x: x[...])


IDX = np.array([0, 2, -1, 1, 2])
IDX2D = np.array([[0, 3], [2, -4]])
GETITEM_TENSOR = [
  pytest.param([IDX], lambda x, i: x[i], id="tensor"),
  pytest.param([IDX.astype(np.int32)], lambda x, i: x[i], id="int32_tensor"),
  pytest.param([IDX2D], lambda x, i: x[i], id="2d_tensor"),
  pytest.param([IDX], lambda x, i: x[i, 1:], id="tensor_slice"),
  pytest.param([IDX], lambda x, i: x[:, i], id="slice_tensor"),
  pytest.param([IDX], lambda x, i: x[1, i], id="int_tensor"),
  pytest.param([IDX, IDX[::-1].copy()], lambda x, i, j: x[i, j], id="tensor_tensor"),
  pytest.param([IDX2D, np.array([1, 0])], lambda x, i, j: x[i, j], id="tensor_tensor_broadcast"),
  pytest.param([IDX, IDX[::-1].copy()], lambda x, i, j: x[i, :, j], id="tensor_slice_tensor"),
  pytest.param([IDX], lambda x, i: x[..., i], id="ellipsis_tensor"),
  pytest.param([IDX], lambda x, i: x[None, i], id="none_tensor"),
  pytest.param([np.array(3)], lambda x, i: x[i], id="0d_tensor"),
  pytest.param([np.array(-2)], lambda x, i: x[1, i], id="int_0d_tensor"),
]


@pytest.mark.parametrize("indices, fn", GETITEM_TENSOR)
def test_getitem_tensor_index(device, indices, fn):
  check_op(device, [(5, 5, 6), *indices], fn)


@pytest.mark.parametrize("shape, dim, index", [
  ((4, 5), 1, np.array([[0, 4, 4], [1, 1, 0], [3, 2, 1], [0, 0, 0]])),
  ((4, 5), 0, np.array([[3, 0, 1, 2, 3], [0, 0, 0, 1, 1]])),
  ((4, 5), -1, np.array([[2], [0], [4], [1]])),
  ((3, 4, 5), 2, np.random.default_rng(0).integers(0, 5, (3, 2, 4))),
  ((3, 4, 5), 1, np.random.default_rng(1).integers(0, 4, (2, 6, 5))),
], ids=["dim1", "dim0", "dim-1", "3d_dim2", "3d_dim1"])
def test_gather(device, shape, dim, index):
  check_op(device, [shape, index], lambda x, i: x.gather(dim, i))


# ---------------------------------------------------------------------------------------------------------------------
# matmul, conv2d and pooling

MATMUL_SHAPES = [((3, 4), (4, 5)), ((45, 65), (65, 20)), ((1, 1), (1, 1)), ((4,), (4, 5)), ((3, 4), (4,)),
                 ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((1, 3, 4), (2, 4, 5)), ((3, 4), (2, 4, 5)),
                 ((2, 1, 3, 4), (5, 4, 2))]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(device, shapes):
  check_op(device, list(shapes), lambda x, y: x @ y, atol=1e-4, rtol=1e-4)


def test_matmul_method_and_dot(device):
  check_op(device, [(3, 4), (4, 5)], lambda x, y: x.matmul(y), atol=1e-4, rtol=1e-4)
  check_op(device, [(7,), (7,)], lambda x, y: x.dot(y), atol=1e-4, rtol=1e-4)
  check_op(device, [(7,), (7,)], lambda x, y: x @ y, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_matmul_int(device, dtype):
  check_op(device, [(3, 4), (4, 5)], lambda x, y: x @ y, dtype=dtype, domain=INTS)


def test_matmul_transposed_inputs(device):
  check_op(device, [(5, 3), (6, 5)], lambda x, y: x.T @ y.T, atol=1e-4, rtol=1e-4)
  check_op(device, [(4, 5, 6), (4, 6, 5)], lambda x, y: x.flip(1) @ y[..., ::2], atol=1e-4, rtol=1e-4)


CONV_CASES = [  # (x shape, weight shape, bias?, stride, padding, dilation, groups)
  pytest.param((1, 1, 5, 5), (1, 1, 3, 3), False, 1, 0, 1, 1, id="single"),
  pytest.param((2, 3, 9, 9), (4, 3, 3, 3), True, 1, 0, 1, 1, id="bias"),
  pytest.param((2, 3, 9, 9), (4, 3, 3, 3), True, 2, 1, 1, 1, id="stride2_pad1"),
  pytest.param((1, 2, 8, 7), (3, 2, 3, 2), False, (2, 1), (1, 0), 1, 1, id="rect_kernel_tuple_args"),
  pytest.param((1, 2, 9, 9), (2, 2, 3, 3), True, 1, 2, 2, 1, id="dilation2"),
  pytest.param((2, 6, 7, 7), (6, 2, 3, 3), True, 1, 1, 1, 3, id="groups3"),
  pytest.param((1, 4, 6, 6), (4, 1, 3, 3), False, 1, 1, 1, 4, id="depthwise"),
  pytest.param((1, 3, 5, 5), (2, 3, 1, 1), True, 1, 0, 1, 1, id="1x1"),
]


@pytest.mark.parametrize("x_shape, w_shape, bias, stride, padding, dilation, groups", CONV_CASES)
def test_conv2d(device, x_shape, w_shape, bias, stride, padding, dilation, groups):
  shapes = [x_shape, w_shape] + ([(w_shape[0],)] if bias else [])
  check_op(device, shapes,
           lambda x, w, b=None: F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups),
           lambda x, w, b=None: x.conv2d(w, b, stride=stride, padding=padding, dilation=dilation, groups=groups),
           atol=1e-4, rtol=1e-4)


POOL_CASES = [  # (x shape, kernel_size, stride, padding)
  pytest.param((1, 1, 4, 4), 2, None, 0, id="k2"),
  pytest.param((2, 3, 9, 9), 3, 2, 0, id="k3_s2"),
  pytest.param((2, 3, 8, 7), (2, 3), (2, 1), 0, id="rect"),
  pytest.param((1, 2, 6, 6), 3, 1, 1, id="k3_s1_pad1"),
  pytest.param((1, 2, 7, 7), 2, 3, 0, id="stride_gt_kernel"),
]


@pytest.mark.parametrize("x_shape, kernel_size, stride, padding", POOL_CASES)
@pytest.mark.parametrize("name", ["avg_pool2d", "max_pool2d"])
def test_pool2d(device, name, x_shape, kernel_size, stride, padding):
  check_op(device, [x_shape],
           lambda x: getattr(F, name)(x, kernel_size=kernel_size, stride=stride, padding=padding),
           lambda x: getattr(x, name)(kernel_size=kernel_size, stride=stride, padding=padding), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# Larger inputs, which take other kernel optimizations (upcasts, unrolls, threads, grouped reductions) on the compiled
# backend; the PYTHON interpreter gets the small variant of each

def sized(device: str, big, small): return small if device == "PYTHON" else big


def test_large_elementwise(device):
  shape = sized(device, (256, 257), (16, 17))
  check_op(device, [shape, shape[-1:]], lambda x, y: (x * y).exp() + x.sigmoid() - y / 3, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_large_reduce(device, axis):
  shape = sized(device, (256, 513), (31, 33))
  check_op(device, [shape], lambda x: x.sum(axis), atol=1e-3, rtol=1e-4)
  check_op(device, [shape], lambda x: x.amax(() if axis is None else axis), lambda x: x.max(axis))
  check_op(device, [shape], lambda x: x.mean(axis), atol=1e-5, rtol=1e-4)


def test_large_reduce_int(device):
  check_op(device, [sized(device, (300, 301), (30, 31))], lambda x: x.sum(), dtype="int32", domain=Domain(-1000, 1000))


@pytest.mark.parametrize("shapes", [((64, 96), (96, 80)), ((128, 128), (128, 128)), ((3, 33, 65), (3, 65, 17))],
                         ids=str)
def test_large_matmul(device, shapes):
  shapes = sized(device, shapes, tuple(tuple(min(d, 24) for d in s) for s in shapes))
  check_op(device, list(shapes), lambda x, y: x @ y, atol=1e-4, rtol=1e-4)


def test_large_conv2d(device):
  x_shape = sized(device, (2, 8, 20, 20), (1, 4, 8, 8))
  w_shape = sized(device, (16, 8, 3, 3), (4, 4, 3, 3))
  check_op(device, [x_shape, w_shape, w_shape[:1]], lambda x, w, b: F.conv2d(x, w, b, padding=1),
           lambda x, w, b: x.conv2d(w, b, padding=1), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("n", [255, 256, 257, 1000])
def test_long_cumsum(device, n):
  check_op(device, [(n,)], lambda x: x.cumsum(0), atol=1e-4, rtol=1e-5)
  check_op(device, [(3, n)], lambda x: x.cumsum(1), dtype="int32", domain=INTS)


def test_large_softmax(device):
  check_op(device, [sized(device, (64, 1000), (8, 100))], lambda x: x.log_softmax(-1), domain=Domain(-10, 10),
           atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# Casts and bitcasts

CAST_CASES = [  # (from dtype, to dtype, input domain)
  ("float32", "int32", Domain(-50, 50)),
  ("float32", "int64", Domain(-50, 50)),
  ("float32", "bool", GRID),
  ("float32", "float16", ANY),
  ("float32", "uint8", Domain(0, 250)),
  ("float16", "float32", ANY),
  ("int32", "float32", INTS),
  ("int32", "int64", INTS),
  ("int64", "int32", INTS),
  ("int32", "bool", INTS),
  ("int32", "uint8", Domain(-300, 300)),
  ("int32", "int8", Domain(-300, 300)),
  ("bool", "float32", ANY),
  ("bool", "int32", ANY),
  ("uint8", "int32", Domain(0, 255)),
  ("int8", "float32", Domain(-128, 127)),
]


@pytest.mark.parametrize("src, dst, domain", CAST_CASES, ids=str)
def test_cast(device, src, dst, domain):
  check_op(device, [(4, 5, 6)], lambda x: x.to(torch_dtype(dst)), lambda x: x.cast(getattr(dtypes, dst)), dtype=src,
           domain=domain, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("src", ["float32", "int32", "bool"])
@pytest.mark.parametrize("method", ["float", "half", "int", "long", "bool"])
def test_cast_methods(device, src, method):
  check_op(device, [(3, 4)], lambda x: getattr(x, method)(), dtype=src, domain=Domain(-5, 5), atol=1e-3, rtol=1e-3)


def test_cast_by_name(device):
  check_op(device, [(3, 4)], lambda x: x.to(torch.int32), lambda x: x.cast("int32"), domain=Domain(-5, 5))


@pytest.mark.parametrize("src, dst", [("float32", "int32"), ("int32", "float32"), ("float16", "int16"),
                                      ("int16", "float16")], ids=str)
def test_bitcast(device, src, dst):
  check_op(device, [(4, 5)], lambda x: x.view(torch_dtype(dst)), lambda x: x.bitcast(getattr(dtypes, dst)), dtype=src,
           domain=Domain(-1000, 1000))


def test_cast_then_compute(device):
  check_op(device, [(4, 5, 6)], lambda x: (x * 10).int() // 3 + (x > 0).float(), domain=Domain(-5, 5))


# ---------------------------------------------------------------------------------------------------------------------
# Operations on non-contiguous inputs: the same view is applied on both sides before the op

VIEWS = [
  pytest.param((4, 5, 6), lambda t: t.permute(2, 0, 1), id="permuted"),
  pytest.param((7, 9), lambda t: t[1:, ::2], id="sliced"),
  pytest.param((5, 6), lambda t: t.flip(0), id="flipped"),
  pytest.param((3, 1, 4), lambda t: t.expand(3, 5, 4), id="expanded"),
  pytest.param((6, 8), lambda t: t.transpose(0, 1), id="transposed"),
  pytest.param((6, 7, 8), lambda t: t[1:5, ::3].permute(1, 2, 0), id="sliced_permuted"),
]
VIEW_OPS = [  # (torch function, fusegrad function or None for the same)
  pytest.param(lambda x, y: x.exp(), None, id="exp"),
  pytest.param(lambda x, y: x * x + 1, None, id="mul_self"),
  pytest.param(lambda x, y: x + y, None, id="add"),
  pytest.param(lambda x, y: torch.where(x > 0, x, y), lambda x, y: (x > 0).where(x, y), id="where"),
  pytest.param(lambda x, y: x.sum(-1), None, id="sum"),
  pytest.param(lambda x, y: x.amax(0), lambda x, y: x.max(0), id="max"),
  pytest.param(lambda x, y: x.cumsum(-1), None, id="cumsum"),
  pytest.param(lambda x, y: x.softmax(-1), None, id="softmax"),
  pytest.param(lambda x, y: x.reshape(-1) * 2, None, id="reshape"),
  pytest.param(lambda x, y: x.contiguous(), None, id="contiguous"),
  pytest.param(lambda x, y: x @ y.transpose(-1, -2), None, id="matmul"),
]


@pytest.mark.parametrize("torch_fn, fg_fn", VIEW_OPS)
@pytest.mark.parametrize("shape, view", VIEWS)
def test_noncontiguous(device, shape, view, torch_fn, fg_fn):
  check_op(device, [shape, shape], torch_fn, fg_fn, view=view, atol=1e-5, rtol=1e-4)


def test_noncontiguous_mixed_views(device):
  check_op(device, [(5, 6), (6, 5)], lambda x, y: x.T + y.flip(1) * x.flip(0).T - y[::2].sum(0), atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# Fusion: chains whose parts the scheduler may put into one kernel (masked loads under reduces, reduce into
# elementwise into reduce), checked end to end

FUSED = [
  pytest.param([(4, 5)], lambda x: torch_pad(x, ((1, 1), (2, 0))).amax(1), lambda x: x.pad(((1, 1), (2, 0))).max(1),
               id="pad_max"),
  pytest.param([(4, 5)], lambda x: torch_pad(x - 5, ((0, 2), (1, 1))).sum(0),
               lambda x: (x - 5).pad(((0, 2), (1, 1))).sum(0), id="pad_sum"),
  pytest.param([(4, 5)], lambda x: torch_pad(x, ((1, 1), (2, 0))).exp().amin(),
               lambda x: x.pad(((1, 1), (2, 0))).exp().min(), id="pad_exp_min"),
  pytest.param([(3, 1, 4)], lambda x: x.expand(3, 5, 4).sum(1), None, id="expand_sum"),
  pytest.param([(8, 9)], lambda x: x - x.mean(1, keepdim=True) / (x.std(1, keepdim=True) + 1e-5), None,
               id="normalize"),
  pytest.param([(8, 9)], lambda x: (x - x.amax(1, keepdim=True)).exp().sum(0),
               lambda x: (x - x.max(1, keepdim=True)).exp().sum(0), id="reduce_elementwise_reduce"),
  pytest.param([(6, 7), (7, 5)], lambda x, w: (x @ w).relu().sum(), None, id="matmul_relu_sum"),
  pytest.param([(6, 7), (7, 5)], lambda x, w: x.softmax(-1) @ w, None, id="softmax_matmul"),
  pytest.param([(1, 2, 8, 8), (3, 2, 3, 3)], lambda x, w: F.max_pool2d(F.conv2d(x, w).relu(), 2),
               lambda x, w: x.conv2d(w).relu().max_pool2d(2), id="conv_relu_pool"),
  pytest.param([(5, 6)], lambda x: x.sum(0) + x.sum(1).sum() + x.amax(), lambda x: x.sum(0) + x.sum(1).sum() + x.max(),
               id="several_reduces"),
  pytest.param([(4, 5)], lambda x: torch.cat([x, x.exp()], 1).cumsum(1), lambda x: x.cat(x.exp(), dim=1).cumsum(1),
               id="cat_cumsum"),
]


@pytest.mark.parametrize("shapes, torch_fn, fg_fn", FUSED)
def test_fused(device, shapes, torch_fn, fg_fn):
  check_op(device, shapes, torch_fn, fg_fn, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------------
# Property tests: random movement chains and random integer expressions, end to end through codegen, against torch

PROPERTY_SETTINGS = settings(max_examples=25, deadline=None,
                             suppress_health_check=[HealthCheck.function_scoped_fixture])


def draw_movement(data, shape: tuple[int, ...]):
  """One random movement op valid for `shape`, as (new shape, torch function, fusegrad function)."""
  ndim = len(shape)
  kind = data.draw(st.sampled_from(["permute", "reshape", "pad", "shrink", "flip", "expand", "step"] if ndim else
                                   ["reshape", "expand"]))
  if kind == "permute":
    order = tuple(data.draw(st.permutations(range(ndim))))
    return tuple(shape[i] for i in order), lambda x: x.permute(order), lambda x: x.permute(order)
  if kind == "reshape":
    numel = int(np.prod(shape))
    first = data.draw(st.sampled_from([d for d in range(1, numel + 1) if numel % d == 0]))
    new = (first, numel // first) if data.draw(st.booleans()) else (numel // first, 1, first)
    return new, lambda x: x.reshape(new), lambda x: x.reshape(new)
  if kind == "pad":
    pads = tuple((data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in shape)
    return (tuple(s + a + b for s, (a, b) in zip(shape, pads)), lambda x: torch_pad(x, pads), lambda x: x.pad(pads))
  if kind == "shrink":
    arg = []
    for s in shape:
      begin = data.draw(st.integers(0, s - 1))
      arg.append((begin, data.draw(st.integers(begin + 1, s))))
    arg = tuple(arg)
    return tuple(e - b for b, e in arg), lambda x: torch_shrink(x, arg), lambda x: x.shrink(arg)
  if kind == "flip":
    axis = data.draw(st.integers(0, ndim - 1))
    return shape, lambda x: x.flip(axis), lambda x: x.flip(axis)
  if kind == "step":
    axis, step = data.draw(st.integers(0, ndim - 1)), data.draw(st.integers(2, 3))
    key = (slice(None),) * axis + (slice(None, None, step),)
    return (tuple(-(-s // step) if i == axis else s for i, s in enumerate(shape)), lambda x: x[key],
            lambda x: x[key])
  new = (data.draw(st.integers(1, 3)),) + tuple(data.draw(st.integers(2, 3)) if s == 1 else s for s in shape)
  return new, lambda x: x.expand(new), lambda x: x.expand(new)


@PROPERTY_SETTINGS
@given(data=st.data())
def test_random_movement_chains(device, data):
  start = shape = data.draw(st.sampled_from([(3, 4), (2, 1, 5), (6,), (1, 4, 3)]))
  torch_fns, fg_fns = [], []
  for _ in range(data.draw(st.integers(1, 4))):
    shape, torch_fn, fg_fn = draw_movement(data, shape)
    torch_fns.append(torch_fn)
    fg_fns.append(fg_fn)
    if int(np.prod(shape)) > 200: break
  reduce = data.draw(st.booleans())

  def chain(fns):
    def run(x):
      for fn in fns: x = fn(x)
      return x.sum(-1) if reduce and x.ndim else x + 1
    return run
  check_op(device, [start], chain(torch_fns), chain(fg_fns))


def where(cond, x, y):
  """cond ? x : y for torch or fusegrad tensors (torch's Tensor.where puts the condition second)."""
  return torch.where(cond, x, y) if isinstance(cond, torch.Tensor) else cond.where(x, y)


INT_BINARY = [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a.maximum(b), lambda a, b: a.minimum(b),
              lambda a, b: where(a < b, a, b * 2)]
INT_WITH_CONST = [lambda a, c: a * c, lambda a, c: a // c, lambda a, c: a % c, lambda a, c: a + c,
                  lambda a, c: c - a, lambda a, c: where(a > c, a, c)]


def draw_int_expr(data, depth: int):
  """A random integer expression of x and y, as one function used on torch and fusegrad tensors alike."""
  if depth == 0 or data.draw(st.integers(0, 3)) == 0:
    leaf = data.draw(st.sampled_from(["x", "y", "xy"]))
    return {"x": lambda x, y: x, "y": lambda x, y: y, "xy": lambda x, y: x * y}[leaf]
  if data.draw(st.booleans()):
    fn, a, b = data.draw(st.sampled_from(INT_BINARY)), draw_int_expr(data, depth - 1), draw_int_expr(data, depth - 1)
    return lambda x, y: fn(a(x, y), b(x, y))
  fn, a = data.draw(st.sampled_from(INT_WITH_CONST)), draw_int_expr(data, depth - 1)
  c = data.draw(st.integers(-9, 9).filter(lambda v: v != 0))
  return lambda x, y: fn(a(x, y), c)


@PROPERTY_SETTINGS
@given(data=st.data())
def test_random_int_expressions(device, data):
  """The symbolic rewrites run on every kernel; they must hold for data values too (negative, unbounded)."""
  expr = draw_int_expr(data, 4)
  dtype = data.draw(st.sampled_from(["int32", "int64"]))
  check_op(device, [(4, 6), (6,)], expr, dtype=dtype, domain=Domain(-30, 30), seed=data.draw(st.integers(0, 100)))


# ---------------------------------------------------------------------------------------------------------------------
# Zero-size tensors

ZERO_SIZE = [
  pytest.param((0,), lambda x: x + 1, None, id="add"),
  pytest.param((2, 0), lambda x: x.exp() * 2, None, id="exp"),
  pytest.param((0, 3), lambda x: x.sum(0), None, id="sum_empty_axis"),
  pytest.param((0, 3), lambda x: x.sum(1), None, id="sum_other_axis"),
  pytest.param((0, 3), lambda x: x.sum(), None, id="sum_all"),
  pytest.param((0, 3), lambda x: x.reshape(3, 0), None, id="reshape"),
  pytest.param((0, 3), lambda x: x.permute(1, 0), None, id="permute"),
  pytest.param((2, 0), lambda x: x @ x.T, None, id="matmul_k0"),
  pytest.param((0, 3), lambda x: torch.cat([x, x + 1]), lambda x: x.cat(x + 1), id="cat"),
  pytest.param((3,), lambda x: x[1:1] + 1, None, id="empty_slice"),
]


@pytest.mark.parametrize("shape, torch_fn, fg_fn", ZERO_SIZE)
def test_zero_size(device, shape, torch_fn, fg_fn):
  check_op(device, [shape], torch_fn, fg_fn)


# ---------------------------------------------------------------------------------------------------------------------
# torch spellings: keyword arguments and call forms as torch users write them, on both libraries unchanged

TORCH_SPELLINGS = [
  pytest.param(lambda x: x.sum(dim=1, keepdim=True), id="sum(dim=,keepdim=)"),
  pytest.param(lambda x: x.mean(dim=(0, 2)), id="mean(dim=tuple)"),
  pytest.param(lambda x: x.std(dim=1, correction=0, keepdim=True), id="std(dim=,correction=)"),
  pytest.param(lambda x: x.var(dim=-1, unbiased=False), id="var(unbiased=)"),
  pytest.param(lambda x: x.amax(dim=1), id="amax"),
  pytest.param(lambda x: x.amin(1, keepdim=True), id="amin"),
  pytest.param(lambda x: x.softmax(dim=0), id="softmax(dim=)"),
  pytest.param(lambda x: x.log_softmax(dim=-1), id="log_softmax(dim=)"),
  pytest.param(lambda x: x.logsumexp(dim=1), id="logsumexp(dim=)"),
  pytest.param(lambda x: x.cumsum(dim=1), id="cumsum(dim=)"),
  pytest.param(lambda x: x.argmax(dim=1, keepdim=True), id="argmax(dim=)"),
  pytest.param(lambda x: x.permute(dims=(2, 0, 1)), id="permute(dims=)"),
  pytest.param(lambda x: x.transpose(dim0=0, dim1=2), id="transpose(dim0=,dim1=)"),
  pytest.param(lambda x: x.flip(dims=(0, 1)), id="flip(dims=)"),
  pytest.param(lambda x: x.flatten(start_dim=1), id="flatten(start_dim=)"),
  pytest.param(lambda x: x.reshape(shape=(5, 24)), id="reshape(shape=)"),
  pytest.param(lambda x: x[:, :1].squeeze(dim=1), id="squeeze(dim=)"),
  pytest.param(lambda x: x[:1, :1].squeeze((0, 1)), id="squeeze(tuple)"),
  pytest.param(lambda x: x.unsqueeze(dim=0), id="unsqueeze(dim=)"),
  pytest.param(lambda x: x.chunk(chunks=2, dim=2), id="chunk(chunks=,dim=)"),
  pytest.param(lambda x: x.clip(min=-0.5, max=0.5), id="clip(min=,max=)"),
  pytest.param(lambda x: x.clamp(-0.5), id="clamp(min)"),
  pytest.param(lambda x: x.pow(2), id="pow"),
  pytest.param(lambda x: x.abs().pow(exponent=0.5), id="pow(exponent=)"),
  pytest.param(lambda x: abs(x), id="abs()"),
  pytest.param(lambda x: x.maximum(other=x * 0), id="maximum(other=)"),
  pytest.param(lambda x: x.expand(size=(2, 4, 5, 6)), id="expand(size=)"),
  pytest.param(lambda x: x.repeat(1, 2, 1), id="repeat"),
  pytest.param(lambda x: x.square().sum(), id="square_sum"),
  pytest.param(lambda x: x.neg().relu(), id="neg_relu"),
  pytest.param(lambda x: x.contiguous().view(-1, 6), id="view(-1)"),
  pytest.param(lambda x: x.div(2, rounding_mode="floor"), id="div(rounding_mode=floor)"),
  pytest.param(lambda x: x.div(2, rounding_mode="trunc"), id="div(rounding_mode=trunc)"),
  pytest.param(lambda x: x.T if x.ndim == 2 else x.mT, id="mT"),
  pytest.param(lambda x: x.gelu(approximate="tanh") if hasattr(x, "gelu") else F.gelu(x, approximate="tanh"),
               id="gelu(approximate=tanh)"),
]


@pytest.mark.parametrize("fn", TORCH_SPELLINGS)
def test_torch_spellings(device, fn):
  check_op(device, [(4, 5, 6)], fn, rtol=1e-4)


@pytest.mark.parametrize("torch_fn, fg_fn", [
  pytest.param(lambda: torch.arange(start=1, end=7, step=2), lambda d: Tensor.arange(start=1, end=7, step=2, device=d),
               id="arange(end=)"),
  pytest.param(lambda: torch.zeros(size=(2, 3)), lambda d: Tensor.zeros(size=(2, 3), device=d), id="zeros(size=)"),
  pytest.param(lambda: torch.full(size=(2,), fill_value=3.0),
               lambda d: Tensor.full(size=(2,), fill_value=3.0, device=d), id="full(size=,fill_value=)"),
  pytest.param(lambda: torch.ones((2, 3), dtype=torch.int32),
               lambda d: Tensor.ones((2, 3), dtype=dtypes.int32, device=d), id="ones(tuple,dtype=)"),
])
def test_torch_creation_spellings(device, torch_fn, fg_fn):
  assert_same(fg_fn(device), torch_fn(), device=device)


def test_to_dtype(device):
  check_op(device, [(3, 4)], lambda x: x.to(torch.float16), lambda x: x.to(dtypes.float16), atol=1e-3)


# ---------------------------------------------------------------------------------------------------------------------
# Creation

CREATION = [  # (torch function, fusegrad function of the device)
  pytest.param(lambda: torch.zeros(2, 3), lambda d: Tensor.zeros(2, 3, device=d), id="zeros"),
  pytest.param(lambda: torch.zeros((2, 3)), lambda d: Tensor.zeros((2, 3), device=d), id="zeros_tuple"),
  pytest.param(lambda: torch.zeros(()), lambda d: Tensor.zeros((), device=d), id="zeros_0d"),
  pytest.param(lambda: torch.zeros(2, dtype=torch.int32), lambda d: Tensor.zeros(2, dtype=dtypes.int32, device=d),
               id="zeros_int32"),
  pytest.param(lambda: torch.ones(3, 1, 4), lambda d: Tensor.ones(3, 1, 4, device=d), id="ones"),
  pytest.param(lambda: torch.ones(4, dtype=torch.bool), lambda d: Tensor.ones(4, dtype=dtypes.bool, device=d),
               id="ones_bool"),
  pytest.param(lambda: torch.full((2, 3), 1.5), lambda d: Tensor.full((2, 3), 1.5, device=d), id="full_float"),
  pytest.param(lambda: torch.full((2, 3), 7), lambda d: Tensor.full((2, 3), 7, device=d), id="full_int"),
  pytest.param(lambda: torch.full((2, 3), True), lambda d: Tensor.full((2, 3), True, device=d), id="full_bool"),
  pytest.param(lambda: torch.full((), 2.5), lambda d: Tensor.full((), 2.5, device=d), id="full_0d"),
  pytest.param(lambda: torch.full((3,), 2, dtype=torch.float16),
               lambda d: Tensor.full((3,), 2, dtype=dtypes.float16, device=d), id="full_dtype"),
  pytest.param(lambda: torch.arange(5), lambda d: Tensor.arange(5, device=d), id="arange"),
  pytest.param(lambda: torch.arange(2, 9), lambda d: Tensor.arange(2, 9, device=d), id="arange_start"),
  pytest.param(lambda: torch.arange(1, 10, 3), lambda d: Tensor.arange(1, 10, 3, device=d), id="arange_step"),
  pytest.param(lambda: torch.arange(10, 0, -3), lambda d: Tensor.arange(10, 0, -3, device=d), id="arange_negative"),
  pytest.param(lambda: torch.arange(0.0, 1.0, 0.25), lambda d: Tensor.arange(0.0, 1.0, 0.25, device=d),
               id="arange_float"),
  pytest.param(lambda: torch.arange(-1, 1, 0.1), lambda d: Tensor.arange(-1, 1, 0.1, device=d),
               id="arange_float_inexact"),
  pytest.param(lambda: torch.arange(3.5), lambda d: Tensor.arange(3.5, device=d), id="arange_float_stop"),
  pytest.param(lambda: torch.arange(0), lambda d: Tensor.arange(0, device=d), id="arange_empty"),
  pytest.param(lambda: torch.arange(5, dtype=torch.int32), lambda d: Tensor.arange(5, dtype=dtypes.int32, device=d),
               id="arange_int32"),
  pytest.param(lambda: torch.arange(200), lambda d: Tensor.arange(200, device=d), id="arange_long"),
  pytest.param(lambda: torch.eye(3), lambda d: Tensor.eye(3, device=d), id="eye"),
  pytest.param(lambda: torch.eye(2, 4), lambda d: Tensor.eye(2, 4, device=d), id="eye_rect"),
  pytest.param(lambda: torch.eye(1), lambda d: Tensor.eye(1, device=d), id="eye_1"),
]


@pytest.mark.parametrize("torch_fn, fg_fn", CREATION)
def test_creation(device, torch_fn, fg_fn):
  assert_same(fg_fn(device), torch_fn(), device=device)


def test_empty(device):
  t = Tensor.empty(2, 3, device=device)
  assert t.shape == (2, 3) and t.dtype is dtypes.float32 and t.device == device
  assert t.numpy().shape == (2, 3)
  t = Tensor.empty((4,), dtype=dtypes.int32, device=device)
  assert t.shape == (4,) and t.dtype is dtypes.int32


LIKE = [
  pytest.param(lambda x: torch.zeros_like(x), lambda x: Tensor.zeros_like(x), id="zeros_like"),
  pytest.param(lambda x: torch.ones_like(x), lambda x: Tensor.ones_like(x), id="ones_like"),
  pytest.param(lambda x: torch.full_like(x, 3), lambda x: Tensor.full_like(x, 3), id="full_like"),
  pytest.param(lambda x: torch.ones_like(x, dtype=torch.int32), lambda x: Tensor.ones_like(x, dtype=dtypes.int32),
               id="ones_like_dtype"),
]


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
@pytest.mark.parametrize("torch_fn, fg_fn", LIKE)
def test_like(device, dtype, torch_fn, fg_fn):
  check_op(device, [(3, 1, 4)], torch_fn, fg_fn, dtype=dtype)


FROM_DATA = [
  pytest.param(3, None, id="int"),
  pytest.param(2.5, None, id="float"),
  pytest.param(True, None, id="bool"),
  pytest.param([[1, 2], [3, 4]], None, id="int_list"),
  pytest.param([1, 2.5], None, id="mixed_list"),
  pytest.param([True, False], None, id="bool_list"),
  pytest.param([True, 2], None, id="bool_int_list"),
  pytest.param([], None, id="empty_list"),
  pytest.param([[1.5]], None, id="nested_1x1"),
  pytest.param(np.arange(6, dtype=np.int32).reshape(2, 3), None, id="numpy_int32"),
  pytest.param(np.linspace(0, 1, 5), None, id="numpy_float64"),
  pytest.param(np.array([1, 0, 1], dtype=np.uint8), None, id="numpy_uint8"),
  pytest.param(np.array(4.0, dtype=np.float32), None, id="numpy_0d"),
  pytest.param([1, 2], "float16", id="list_dtype_half"),
  pytest.param([1.7, -2.7], "int32", id="list_float_to_int32"),
  pytest.param(np.array([0.5, 1.5], dtype=np.float32), "int64", id="numpy_dtype_cast"),
]


@pytest.mark.parametrize("data, dtype", FROM_DATA)
def test_from_data(device, data, dtype):
  expected = torch.tensor(data, dtype=None if dtype is None else torch_dtype(dtype))
  got = Tensor(data, device=device, dtype=None if dtype is None else getattr(dtypes, dtype))
  assert_same(got, expected, device=device)
  assert got.tolist() == expected.tolist()


def test_item_tolist_numpy(device):
  assert Tensor(2.5, device=device).item() == 2.5 and isinstance(Tensor(2.5, device=device).item(), float)
  assert Tensor(3, device=device).item() == 3 and isinstance(Tensor(3, device=device).item(), int)
  assert Tensor(True, device=device).item() is True
  assert Tensor([[1, 2], [3, 4]], device=device).tolist() == [[1, 2], [3, 4]]
  assert (Tensor([1.5, 2.0], device=device) * 2).tolist() == [3.0, 4.0]
  assert Tensor(7, device=device).tolist() == 7
  assert Tensor([[1.5, 2.0]], device=device).sum().item() == 3.5
  arr = Tensor([[1, 2], [3, 4]], dtype=dtypes.int32, device=device).numpy()
  assert arr.dtype == np.int32 and arr.shape == (2, 2) and arr.tolist() == [[1, 2], [3, 4]]
  assert Tensor([True, False], device=device).numpy().dtype == np.bool_


def test_realize(device):
  t = (Tensor([1.0, 2.0], device=device) + 1).realize()
  assert isinstance(t, Tensor) and t.tolist() == [2.0, 3.0]


# ---------------------------------------------------------------------------------------------------------------------
# Random ops: shape, dtype, range, statistics and determinism, never values

@pytest.mark.parametrize("shape", [(), (1,), (3, 1, 4)], ids=str)
@pytest.mark.parametrize("name", ["rand", "randn"])
def test_random_shapes(device, name, shape):
  t = getattr(Tensor, name)(*shape, device=device)
  assert t.shape == shape and t.dtype is dtypes.float32 and t.device == device
  assert t.numpy().shape == shape and np.isfinite(t.numpy()).all()


def test_rand_statistics(device):
  x = Tensor.rand(100, 100, device=device).numpy()
  assert x.min() >= 0.0 and x.max() < 1.0
  assert abs(x.mean() - 0.5) < 0.02 and abs(x.std() - 12 ** -0.5) < 0.02
  assert len(np.unique(x)) > 9000, "rand repeats values"


def test_randn_statistics(device):
  x = Tensor.randn(100, 100, device=device).numpy()
  assert abs(x.mean()) < 0.05 and abs(x.std() - 1.0) < 0.05
  assert abs(np.mean(np.abs(x) < 1.0) - 0.6827) < 0.03, "randn is not normal: wrong mass within one sigma"
  assert np.isfinite(x).all()


def test_uniform_statistics(device):
  x = Tensor.uniform(100, 100, low=-3.0, high=5.0, device=device).numpy()
  assert x.min() >= -3.0 and x.max() < 5.0
  assert abs(x.mean() - 1.0) < 0.1 and abs(x.std() - 8 * 12 ** -0.5) < 0.1


def test_random_dtype(device):
  assert Tensor.rand(4, 4, dtype=dtypes.float16, device=device).dtype is dtypes.float16
  x = Tensor.randn(8, 8, dtype=dtypes.float16, device=device).numpy()
  assert x.dtype == np.float16 and np.isfinite(x).all()


@pytest.mark.parametrize("name", ["rand", "randn"])
def test_random_like(device, name):
  x = Tensor.zeros(3, 1, 4, device=device)
  y = getattr(Tensor, f"{name}_like")(x)
  assert y.shape == (3, 1, 4) and y.dtype is dtypes.float32 and y.device == device


@pytest.mark.parametrize("name", ["rand", "randn"])
def test_manual_seed_determinism(device, name):
  fn = lambda: getattr(Tensor, name)(7, 9, device=device).numpy()  # noqa: E731
  Tensor.manual_seed(1234)
  first, second = fn(), fn()
  Tensor.manual_seed(1234)
  np.testing.assert_array_equal(fn(), first)
  np.testing.assert_array_equal(fn(), second)
  assert not np.array_equal(first, second), "two draws after one seed are equal"
  Tensor.manual_seed(4321)
  assert not np.array_equal(fn(), first), "different seeds give equal draws"


def test_manual_seed_uniform(device):
  Tensor.manual_seed(5)
  a = Tensor.uniform(64, low=2.0, high=3.0, device=device).numpy()
  Tensor.manual_seed(5)
  np.testing.assert_array_equal(Tensor.uniform(64, low=2.0, high=3.0, device=device).numpy(), a)


# ---------------------------------------------------------------------------------------------------------------------
# User errors: the message names the op and the shapes

@pytest.mark.parametrize("fn, words", [
  pytest.param(lambda d: Tensor.ones(2, 3, device=d).reshape(4), ["reshape", "(2, 3)", "(4,)"], id="reshape"),
  pytest.param(lambda d: Tensor.ones(3, 4, device=d) + Tensor.ones(5, device=d), ["(3, 4)", "(5,)"], id="broadcast"),
  pytest.param(lambda d: Tensor.ones(2, 3, device=d) @ Tensor.ones(4, 5, device=d), ["(2, 3)", "(4, 5)"], id="matmul"),
  pytest.param(lambda d: Tensor.ones(3, 4, device=d).permute(1, 0, 2), ["permute"], id="permute"),
  pytest.param(lambda d: Tensor.ones(3, device=d).expand(4), ["expand", "(3,)", "(4,)"], id="expand"),
  pytest.param(lambda d: Tensor.ones(2, 3, device=d).sum(2), ["sum"], id="reduce_axis"),
  pytest.param(lambda d: fg_cat(Tensor.ones(2, 3, device=d), Tensor.ones(2, 4, device=d)), ["cat"], id="cat"),
])
def test_user_errors(device, fn, words):
  with pytest.raises((ValueError, TypeError, IndexError, RuntimeError)) as info:
    fn(device)
  message = str(info.value)
  for word in words: assert word in message, f"error message {message!r} should mention {word!r}"


def test_getitem_out_of_range(device):
  with pytest.raises(IndexError):
    Tensor.ones(4, 5, device=device)[4]
  with pytest.raises(IndexError):
    Tensor.ones(4, 5, device=device)[:, -6]
