"""A small kernel family for rlvr-kernels' own tests of the Triton launcher (not shipped).

``rows_scale_kernel`` computes ``y[r, c] = alpha * x[r * stride_x + c] + r`` for ``r < n_rows``,
``c < n_cols``, stored with row stride ``stride_y``: a 2-D grid (rows, column blocks), pointer,
i32 and f32 arguments and row strides, so a plan with a swapped argument or a wrong grid gives a
wrong result under replay. ``make_fixture.py`` compiles it into ``manifest.json`` and ``sm*/``.
"""

import triton
import triton.language as tl

from kernels.variant import Variant


@triton.jit
def rows_scale_kernel(x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y, alpha,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < tl.where(row < n_rows, n_cols, 0)  # rows past n_rows write nothing
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * alpha + row.to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _sig(x, y):
    return {"x_ptr": x, "y_ptr": y, "n_rows": "i32", "n_cols": "i32", "stride_x": "i32",
            "stride_y": "i32", "alpha": "fp32", "BLOCK": "constexpr"}


VARIANTS = [
    Variant("rows_scale_f32_b64", rows_scale_kernel, _sig("*fp32", "*fp32"), {"BLOCK": 64},
            num_warps=2),
    Variant("rows_scale_bf16_b128", rows_scale_kernel, _sig("*bf16", "*bf16"), {"BLOCK": 128},
            num_warps=4),
]
