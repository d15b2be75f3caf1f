"""bf16 rounding shared by the kernels (a helper module: ``generate.py`` skips files named ``_*``).

Triton 3.9's interpreter truncates on ``.to(tl.bfloat16)`` while the GPU's ``cvt.rn.bf16.f32``
rounds to nearest even, so a kernel that must give the GPU's bits under the interpreter too (the
CI replay) rounds on the f32 bits itself. Round to nearest even on the bit pattern: add
``0x7FFF + lsb`` to the 32-bit word and drop the low 16 bits (IEEE 754-2008 §4.3.1's
roundTiesToEven, specialised to a 16-bit cut); a carry into the exponent gives the next binade or
infinity, as the hardware does.
"""

import triton
import triton.language as tl


@triton.jit
def round_bf16(x):
    """f32 -> the nearest bf16 value (ties to even), still as f32; NaN stays NaN. The final
    ``.to(tl.bfloat16)`` of the result is then exact on the GPU and under the interpreter."""
    u = x.to(tl.uint32, bitcast=True)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return tl.where(x != x, x, r.to(tl.float32, bitcast=True))


@triton.jit
def to_bf16_rne(x):
    """f32 -> bf16 rounded to nearest even, in integer ops: the GPU's ``cvt.rn.bf16.f32`` for every
    non-NaN value (NaN -> the canonical quiet NaN 0x7FC0)."""
    u = x.to(tl.uint32, bitcast=True)
    r = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    r = tl.where(x != x, 0x7FC0, r)
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)
