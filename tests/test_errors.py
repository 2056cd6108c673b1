"""Tests that bad input to the Tensor API raises the documented exception at the API boundary (DESIGN section 8).

Each case checks the exception type and the key words of the message: the op's name, the shapes/dtypes/devices
involved, and what would be valid. None of these may surface as a bare assert or an error from deep in codegen.
"""
import re

import numpy as np
import pytest

from fusegrad import Tensor, dtypes


def raises(exc: type[Exception], *words: str):
  """pytest.raises that also checks every word appears in the message (in order)."""
  return pytest.raises(exc, match=".*".join(re.escape(w) for w in words))


# ***** construction, dtypes and devices *****

def test_unknown_dtype():
  with raises(TypeError, "Tensor: unknown dtype 'float33'", "valid:", "float32"):
    Tensor([1.0], dtype="float33")
  with raises(TypeError, "cast: unknown dtype 'int3'", "int32"):
    Tensor([1.0]).cast("int3")
  with raises(TypeError, "zeros: unknown dtype"):
    Tensor.zeros(2, dtype="half_float")


def test_unknown_device():
  with raises(ValueError, "to: unknown device 'TPU'", "valid devices: CPU, CUDA, PYTHON"):
    Tensor([1.0]).to("TPU")
  with raises(ValueError, "Tensor: unknown device 'GPU0'", "CPU"):
    Tensor([1.0], device="GPU0")


def test_bad_data():
  with raises(TypeError, "Tensor", "str"):
    Tensor("hello")
  with raises(TypeError, "Tensor: can't make a tensor from a dict"):
    Tensor({"a": 1})
  with raises(ValueError, "Tensor", "rectangular"):
    Tensor([[1, 2], [3]])
  with raises(TypeError, "Tensor", "complex128", "supported"):
    Tensor(np.array([1j]))


def test_requires_grad_needs_floats():
  with raises(TypeError, "requires_grad", "floating point", "int64"):
    Tensor([1, 2], requires_grad=True)


def test_bad_shapes_for_creation():
  with raises(ValueError, "zeros: shape (2, -1) has a negative dim"):
    Tensor.zeros(2, -1)
  with raises(TypeError, "ones: a shape is ints"):
    Tensor.ones(2.5)
  with raises(ValueError, "arange: step must be nonzero"):
    Tensor.arange(0, 5, 0)
  with raises(ValueError, "randint", "low < high"):
    Tensor.randint(3, low=5, high=5)
  with raises(TypeError, "rand: makes floating point tensors, not int32"):
    Tensor.rand(3, dtype="int32")


def test_devices_must_match():
  with raises(ValueError, "add: tensors are on different devices, CPU and PYTHON", ".to()"):
    Tensor([1.0], device="CPU") + Tensor([1.0], device="PYTHON")
  with raises(ValueError, "cat: tensor 1 is on PYTHON but tensor 0 is on CPU"):
    Tensor.cat([Tensor([1.0], device="CPU"), Tensor([2.0], device="PYTHON")])


def test_bitcast_needs_equal_itemsize():
  with raises(TypeError, "bitcast: float32 (4 bytes) and int16 (2 bytes) differ in size"):
    Tensor([1.0]).bitcast(dtypes.int16)


# ***** elementwise *****

def test_broadcast_error_names_the_dims():
  with raises(ValueError, "add: shapes (2, 3) and (4,) can't broadcast: dim -1 is 3 vs 4"):
    Tensor.ones(2, 3) + Tensor.ones(4)
  with raises(ValueError, "mul: shapes (2, 3) and (5, 3) can't broadcast: dim -2 is 2 vs 5"):
    Tensor.ones(2, 3) * Tensor.ones(5, 3)
  with raises(ValueError, "where: shapes", "can't broadcast"):
    Tensor.ones(2).where(Tensor.ones(3), Tensor.ones(4))


def test_bitwise_ops_reject_floats():
  with raises(TypeError, "and: bitwise ops need bool or integer tensors, got float32"):
    Tensor([1.0]) & Tensor([1.0])
  with raises(TypeError, "xor", "float32"):
    Tensor([1, 2]) ^ 1.5
  with raises(TypeError, "invert", "float16"):
    ~Tensor([1.0], dtype="float16")
  with raises(TypeError, "lshift: bitwise ops need integer tensors, got bool"):
    Tensor([True]) << Tensor([True])


def test_unsupported_operands():
  with raises(TypeError, "add: can't combine a Tensor with a str"):
    Tensor([1.0]) + "a"
  with raises(TypeError, "sub: subtracting bool tensors"):
    Tensor([True]) - Tensor([False])
  with raises(TypeError, "neg: negating a bool tensor"):
    -Tensor([True])
  with raises(ValueError, "pow: integers to negative integer powers", "int64 ** -1"):
    Tensor([2]) ** -1
  with raises(ValueError, "div: rounding_mode", "'floor' or 'trunc'"):
    Tensor([1.0]).div(2, rounding_mode="round")


# ***** reductions *****

def test_axis_out_of_range():
  with raises(ValueError, "sum: axis 3 out of range for a 2-d tensor (valid: -2..1)"):
    Tensor.ones(2, 3).sum(3)
  with raises(ValueError, "max: axis -3 out of range for a 2-d tensor (valid: -2..1)"):
    Tensor.ones(2, 3).max(-3)
  with raises(ValueError, "softmax: axis 1 out of range for a 1-d tensor (valid: -1..0)"):
    Tensor.ones(3).softmax(1)
  with raises(ValueError, "mean: axis (0, 0) names a dim more than once"):
    Tensor.ones(2, 3).mean((0, 0))
  with raises(TypeError, "sum: a dim is an int"):
    Tensor.ones(2).sum(0.5)


def test_reducing_empty_dims():
  with raises(ValueError, "max: can't reduce dim 0 of size 0 of a (0, 2) tensor"):
    Tensor.ones(0, 2).max(0)
  with raises(ValueError, "argmax", "size 0"):
    Tensor.ones(0).argmax(0)


def test_item_and_bool_need_one_element():
  with raises(ValueError, "item: a tensor of shape (2, 3) has 6 elements, not one"):
    Tensor.ones(2, 3).item()
  with raises(ValueError, "bool: the truth value of a tensor of shape (2,) is ambiguous"):
    bool(Tensor([1, 2]))
  with raises(TypeError, "len: a 0-d tensor has no length"):
    len(Tensor(1.0))


# ***** movement *****

def test_reshape_errors():
  with raises(ValueError, "reshape: can't reshape (2, 3) (6 elements) to (4, 2) (8 elements)"):
    Tensor.ones(2, 3).reshape(4, 2)
  with raises(ValueError, "reshape: can't reshape (2, 3) (6 elements) to (4, -1)"):
    Tensor.ones(2, 3).reshape(4, -1)
  with raises(ValueError, "reshape: (-1, -1) may have one -1"):
    Tensor.ones(2, 3).reshape(-1, -1)
  with raises(TypeError, "reshape: a shape is ints"):
    Tensor.ones(2, 3).reshape(2, "3")


def test_permute_expand_pad_shrink_errors():
  with raises(ValueError, "permute: (0, 0) is not a permutation of the 2 dims of a (2, 3) tensor"):
    Tensor.ones(2, 3).permute(0, 0)
  with raises(ValueError, "expand: can't expand (2, 3) to (4, 3): dim 0 has size 2; only size-1 dims can grow"):
    Tensor.ones(2, 3).expand(4, 3)
  with raises(ValueError, "expand", "fewer dims"):
    Tensor.ones(2, 3).expand(3)
  with raises(ValueError, "pad: padding", "(before, after) pair or None for each of the 2 dims"):
    Tensor.ones(2, 3).pad(((1, 1),))
  with raises(ValueError, "pad: mode 'reflect' is not supported; valid: 'constant'"):
    Tensor.ones(2, 3).pad((1, 1), mode="reflect")
  with raises(ValueError, "shrink: can't keep [1, 5) of dim 1 of a (2, 3) tensor", "end <= 3"):
    Tensor.ones(2, 3).shrink((None, (1, 5)))
  with raises(ValueError, "transpose: axis 2 out of range for a 2-d tensor"):
    Tensor.ones(2, 3).transpose(0, 2)
  with raises(ValueError, "repeat: needs at least 2 repeat counts"):
    Tensor.ones(2, 3).repeat(2)


def test_cat_stack_split_errors():
  with raises(ValueError, "cat: tensor 1 has shape (2, 4) but tensor 0 has (3, 4); all sizes but dim 1 must match"):
    Tensor.ones(3, 4).cat(Tensor.ones(2, 4), dim=1)
  with raises(ValueError, "cat: zero-dimensional"):
    Tensor.cat([Tensor(1.0), Tensor(2.0)])
  with raises(TypeError, "cat: needs a non-empty list of Tensors"):
    Tensor.cat([])
  with raises(ValueError, "stack: tensor 1 has shape (3,) but tensor 0 has (2,)"):
    Tensor.stack([Tensor.ones(2), Tensor.ones(3)])
  with raises(ValueError, "split: sizes [2, 2] don't add up to 5"):
    Tensor.ones(5).split([2, 2])


# ***** indexing *****

def test_getitem_errors():
  with raises(IndexError, "getitem: index 5 is out of range for dim 0 of size 3"):
    Tensor.ones(3)[5]
  with raises(IndexError, "getitem: index -4 is out of range for dim 1 of size 3"):
    Tensor.ones(2, 3)[0, -4]
  with raises(IndexError, "getitem: too many indices for a 2-d tensor: 3 given"):
    Tensor.ones(2, 3)[0, 0, 0]
  with raises(IndexError, "getitem: an index can have only one ellipsis"):
    Tensor.ones(2, 3)[..., ...]
  with raises(ValueError, "getitem: slice step cannot be zero"):
    Tensor.ones(3)[::0]
  with raises(IndexError, "getitem: tensors used as indices must be integer or bool, not float32"):
    Tensor.ones(3)[Tensor([0.0])]
  with raises(TypeError, "getitem: can't index with a str"):
    Tensor.ones(3)["a"]
  with raises(ValueError, "getitem: shapes (2,) and (3,) can't broadcast"):
    Tensor.ones(4, 4)[[0, 1], [0, 1, 2]]


def test_gather_errors():
  with raises(ValueError, "gather: index of shape (3, 1) doesn't fit a (2, 3) tensor along dim 1"):
    Tensor.ones(2, 3).gather(1, Tensor([[0], [1], [2]]))
  with raises(TypeError, "gather: index must be an integer tensor"):
    Tensor.ones(2, 3).gather(1, Tensor([[0.0]]))


# ***** matmul, conv, pooling *****

def test_matmul_errors():
  with raises(ValueError, "matmul: (2, 3) @ (4, 5): inner dims 3 and 4 differ"):
    Tensor.ones(2, 3) @ Tensor.ones(4, 5)
  with raises(ValueError, "matmul: (3,) @ (2,): inner dims 3 and 2 differ"):
    Tensor.ones(3) @ Tensor.ones(2)
  with raises(ValueError, "matmul: both operands need at least 1 dim"):
    Tensor(1.0) @ Tensor.ones(2)
  with raises(ValueError, "matmul: shapes (2,) and (3,) can't broadcast: dim -1 is 2 vs 3"):
    Tensor.ones(2, 4, 5) @ Tensor.ones(3, 5, 6)


def test_conv2d_errors():
  x = Tensor.ones(1, 4, 8, 8)
  with raises(ValueError, "conv2d: input of shape (1, 4, 8, 8) has 4 channels but weight (8, 3, 3, 3) with groups=1 "
              "expects 3"):
    x.conv2d(Tensor.ones(8, 3, 3, 3))
  with raises(ValueError, "conv2d: groups=3 must be a positive int dividing the 8 output channels"):
    x.conv2d(Tensor.ones(8, 2, 3, 3), groups=3)
  with raises(ValueError, "conv2d: input of shape (4, 8) doesn't fit weight (8, 4, 3, 3)"):
    Tensor.ones(4, 8).conv2d(Tensor.ones(8, 4, 3, 3))
  with raises(ValueError, "conv2d: kernel (9, 9)", "larger than the padded input (8, 8)"):
    x.conv2d(Tensor.ones(2, 4, 9, 9))
  with raises(ValueError, "conv2d: bias of shape (3,) should be (8,)"):
    x.conv2d(Tensor.ones(8, 4, 3, 3), Tensor.ones(3))
  with raises(ValueError, "conv2d: padding", "'valid' or 'same'"):
    x.conv2d(Tensor.ones(8, 4, 3, 3), padding="full")


def test_pool_errors():
  with raises(ValueError, "max_pool2d: padding (2, 2) must be at most half the kernel (2, 2)"):
    Tensor.ones(1, 1, 8, 8).max_pool2d(2, padding=2)
  with raises(ValueError, "avg_pool2d: kernel (5, 5)", "larger than the padded input (4, 4)"):
    Tensor.ones(1, 1, 4, 4).avg_pool2d(5)
  with raises(ValueError, "max_pool2d: input of shape (4,) needs at least 3 dims"):
    Tensor.ones(4).max_pool2d(2)
  with raises(ValueError, "avg_pool2d: kernel_size, stride and dilation must be positive"):
    Tensor.ones(1, 4, 4).avg_pool2d(0)


# ***** autograd *****

def test_backward_errors():
  with raises(ValueError, "backward: a gradient can only be implied for a one-element output, not one of shape (2,)"):
    (Tensor([1.0, 2.0], requires_grad=True) * 2).backward()
  with raises(ValueError, "backward: this tensor doesn't require grad"):
    Tensor([1.0]).sum().backward()
  with raises(ValueError, "backward: gradient must be a tensor of the output's shape (2,), got (3,)"):
    (Tensor([1.0, 2.0], requires_grad=True) * 2).backward(Tensor.ones(3))
  y = (Tensor([1.0], requires_grad=True) * 2).sum()
  y.backward()
  with raises(ValueError, "backward: this graph was already freed", "retain_graph=True"):
    y.backward()


def test_errors_leave_no_half_written_state():
  x = Tensor([1.0, 2.0])
  before = x.lazydata
  with pytest.raises(ValueError):
    x.assign(Tensor([1.0, 2.0, 3.0]))
  assert x.lazydata is before and x.tolist() == [1.0, 2.0]
