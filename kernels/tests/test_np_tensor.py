"""The numpy stand-in for torch tensors under Triton's interpreter: f32 and bf16 round trips."""

import numpy as np
import triton
import triton.language as tl

from kernels.np_tensor import Tensor, bf16, from_bf16


@triton.jit
def _scale(x, out, n, s, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    y = tl.load(x + i, mask=m).to(tl.float32) * s
    tl.store(out + i, y.to(out.dtype.element_ty), mask=m)


def test_f32_in_place():
    x = np.arange(13, dtype=np.float32)
    out = Tensor(np.zeros(13, np.float32))
    _scale[(2,)](Tensor(x), out, 13, 0.5, BLOCK=8)
    np.testing.assert_array_equal(out.arr, x * 0.5)


def test_bf16_bits():
    x = np.array([1.5, -2.25, 3.0e-3, 1.0e30], np.float32)
    out = Tensor(np.zeros(4, np.uint16), bf16=True)
    _scale[(1,)](Tensor(bf16(x), bf16=True), out, 4, 2.0, BLOCK=4)
    np.testing.assert_array_equal(from_bf16(out.arr), from_bf16(bf16(x)) * 2.0)


def test_bf16_round_to_nearest_even():
    # 1 + 2^-8 is halfway between two bf16 values: ties go to the even mantissa (1.0).
    assert from_bf16(bf16(np.float32(1 + 2**-8)))[()] == 1.0
    assert from_bf16(bf16(np.float32(1 + 3 * 2**-8)))[()] == 1 + 2**-6


def test_dtype_objects_are_interned():
    # Triton's specialiser caches by the dtype object's address: a fresh object per tensor, once
    # freed and its address reused by another dtype, made bf16 buffers specialise as f32.
    a = Tensor(np.zeros(2, np.float32))
    b = Tensor(np.zeros(2, np.uint16), bf16=True)
    assert a.dtype is Tensor(np.ones(3, np.float32)).dtype
    assert b.dtype is Tensor(np.ones(3, np.uint16), bf16=True).dtype
    assert triton.runtime.jit.mangle_type(b) == "*bf16" and triton.runtime.jit.mangle_type(a) == "*fp32"
