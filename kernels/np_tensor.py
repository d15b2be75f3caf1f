"""A numpy array wearing just enough of ``torch.Tensor`` for Triton's CPU interpreter.

Under ``TRITON_INTERPRET=1`` a ``@triton.jit`` kernel runs on the CPU; the interpreter reads each
pointer argument through ``data_ptr()``, ``dtype``, ``untyped_storage()``, ``storage_offset()``,
``size()``, ``stride()``, ``new_empty()``/``set_()`` and ``copy_()``
(``triton/runtime/interpreter.py``, ``GridExecutor._init_args_hst``). :class:`Tensor` provides those
over one contiguous numpy buffer, so the kernel tests need no torch. The interpreter then reads and
writes that buffer in place (the "host copy" is the buffer itself).

bf16 has no numpy dtype: a bf16 tensor holds its bits as ``uint16`` (see :func:`bf16` and
:func:`from_bf16`; rounding to nearest even, as the GPU's ``cvt.rn.bf16.f32``).
"""

import numpy as np

_TORCH_NAMES = {
    np.dtype(np.float64): "torch.float64",
    np.dtype(np.float32): "torch.float32",
    np.dtype(np.float16): "torch.float16",
    np.dtype(np.int64): "torch.int64",
    np.dtype(np.int32): "torch.int32",
    np.dtype(np.uint8): "torch.uint8",
}


class _DType:
    """A dtype whose ``str`` is torch's name, which Triton's argument specialisation reads.

    One object per name, alive for the whole process (:func:`_dtype`): Triton's native
    specialisation caches a dtype's type string by the object's identity, so a freed dtype object
    whose address is reused by another dtype would give that one a stale type (seen: a bf16
    gradient read as f32, and f32 moments stored as uint16, depending on garbage collection).
    """

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return self.name

    __repr__ = __str__


_DTYPES = {}


def _dtype(name):
    if name not in _DTYPES:
        _DTYPES[name] = _DType(name)
    return _DTYPES[name]


class _Storage:
    def __init__(self, tensor):
        self.tensor = tensor

    def data_ptr(self):
        return self.tensor.arr.ctypes.data

    def cpu(self):
        return self

    def copy_(self, other):
        pass  # the interpreter worked on this very buffer


class Tensor:
    """A contiguous numpy buffer seen by Triton's interpreter as a CPU torch tensor.

    ``Tensor(arr)`` takes float64/float32/float16/int64/int32/uint8 arrays; ``Tensor(bits, bf16=True)``
    a ``uint16`` array of bf16 bits. ``.arr`` is the (shared, not copied) numpy array.
    """

    def __init__(self, arr, bf16=False):
        self.arr = np.ascontiguousarray(arr)
        if bf16:
            assert self.arr.dtype == np.uint16, "bf16 bits are held as uint16"
            self.dtype = _dtype("torch.bfloat16")
        else:
            self.dtype = _dtype(_TORCH_NAMES[self.arr.dtype])
        self.device = "cpu"

    def data_ptr(self):
        return self.arr.ctypes.data

    def untyped_storage(self):
        return _Storage(self)

    def storage_offset(self):
        return 0

    def size(self):
        return self.arr.shape

    def stride(self):
        return tuple(s // self.arr.itemsize for s in self.arr.strides)

    def new_empty(self, *args, **kwargs):
        return _Unset()

    def copy_(self, other):
        pass


class _Unset:
    """What ``new_empty(0)`` returns; ``set_(storage, ...)`` turns it into the storage's tensor."""

    def set_(self, storage, offset, size, stride):
        assert offset == 0 and tuple(size) == storage.tensor.arr.shape
        self.__class__ = Tensor
        self.__dict__ = storage.tensor.__dict__
        return self


def bf16(x):
    """float array -> uint16 bf16 bits, rounded to nearest even (NaN stays NaN)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    out[np.isnan(f)] = 0x7FC0
    return out


def from_bf16(bits):
    """uint16 bf16 bits -> float32 array (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def interpreter_bf16_dot_as_f32():
    """Triton 3.9's interpreter multiplies bf16 dot operands as their raw uint16 bits
    (``InterpreterBuilder.create_dot`` calls ``np.matmul`` on the storage). Widen them to f32
    first (exact), which is what the tensor cores compute: exact bf16 products summed in f32."""
    import triton.language as tl
    from triton.runtime import interpreter as interp

    orig = interp.InterpreterBuilder.create_dot
    if getattr(orig, "_bf16_fixed", False):
        return

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16:
            a = self.cast_impl(a, tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = self.cast_impl(b, tl.float32)
        return orig(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._bf16_fixed = True
    interp.InterpreterBuilder.create_dot = create_dot
