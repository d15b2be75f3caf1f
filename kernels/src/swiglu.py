"""SwiGLU's gating, ``a = silu(g) · u``, forward and backward.

SwiGLU: Shazeer, "GLU Variants Improve Transformer", 2020 (arXiv:2002.05202); SiLU (swish):
``silu(g) = g · σ(g) = g / (1 + exp(−g))`` (Elfwing et al. 2017; Ramachandran et al. 2017). The MLP is
``down(silu(gate(x)) · up(x))``; ``g = gate(x)`` and ``u = up(x)`` come from the GEMMs, ``a`` goes
to the down projection.

The oracle is rlvr's CPU path (``layers.rs``, ``Mlp::forward``: ``gate(x).silu()`` then ``g * u``),
that is candle's ops. Where it rounds:

- f32: ``silu(g) = g / (1 + exp(−g))`` in f32 (one rounding per op), then ``silu · u`` in f32.
- bf16: candle's bf16 ``silu`` is written with bf16 arithmetic (``v / (bf16::ONE + (−v).exp())``,
  each op an f32 op rounded to bf16), so it rounds three times: ``e = bf16(exp(−g))``,
  ``d = bf16(1 + e)``, ``s = bf16(g / d)``; then ``a = bf16(s · u)``.

The kernels compute in f32 and round exactly there (``tl.div_rn``: a correctly rounded division as
the CPU's). The one op that is not correctly rounded on either side is ``exp`` (glibc's ``expf``
on the CPU, ``tl.exp`` here: numpy's under the interpreter, ``ex2.approx`` of ``−g·log2(e)`` on the
GPU, relative error ≲ 2⁻²² + |g|·2⁻²⁴): f32 results agree with the CPU to about 1e-6 relative for
|g| < 16, and a bf16 result differs from the CPU's only where that last-bit difference crosses a
bf16 rounding boundary of ``e``.

Backward (casts passed straight through, as autograd does; ``σ = 1/(1 + exp(−g))``)::

    du = da · s                       s: the forward's silu(g) (bf16: its rounded value)
    dg = da · u · σ · (1 + g·σ(−g))     σ(−g) = e·σ for g > 0 (not 1 − σ: no cancellation)

computed in f32, each rounded once to the dtype. ``dg``/``du`` may be written over ``g``/``u``
(each program reads its block before writing it).

Layout: ``g``, ``u``, ``a`` (and ``da``, ``dg``, ``du``) ``[n_rows, n_cols]`` contiguous; grid
``(n_rows, cdiv(n_cols, BLOCK))``, rows on the first axis (up to 2³¹ − 1), 64-bit offsets.
"""

import triton
import triton.language as tl

from kernels.src._bf16 import round_bf16
from kernels.variant import Variant, with_aligned


@triton.jit
def _silu(g, IS_BF16: tl.constexpr):
    """silu(g) with the CPU's roundings; g holds f32 (bf16 variants: bf16 values)."""
    e = tl.exp(-g)
    if IS_BF16:
        s = round_bf16(tl.div_rn(g, round_bf16(1.0 + round_bf16(e))))
    else:
        s = tl.div_rn(g, 1.0 + e)
    return s


@triton.jit
def _offsets(n_cols, BLOCK: tl.constexpr):
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    return tl.program_id(0).to(tl.int64) * n_cols + cols, cols < n_cols


@triton.jit
def swiglu_fwd_kernel(g, u, a, n_cols, BLOCK: tl.constexpr):
    """a = silu(g) · u. Grid (n_rows, cdiv(n_cols, BLOCK))."""
    is_bf16: tl.constexpr = a.dtype.element_ty == tl.bfloat16
    off, m = _offsets(n_cols, BLOCK)
    gv = tl.load(g + off, mask=m, other=0.0).to(tl.float32)
    uv = tl.load(u + off, mask=m, other=0.0).to(tl.float32)
    av = _silu(gv, is_bf16) * uv
    if is_bf16:
        av = round_bf16(av)
    tl.store(a + off, av.to(a.dtype.element_ty), mask=m)


@triton.jit
def swiglu_bwd_kernel(g, u, da, dg, du, n_cols, BLOCK: tl.constexpr):
    """dg, du from da for a = silu(g) · u. Grid (n_rows, cdiv(n_cols, BLOCK))."""
    is_bf16: tl.constexpr = dg.dtype.element_ty == tl.bfloat16
    off, m = _offsets(n_cols, BLOCK)
    gv = tl.load(g + off, mask=m, other=0.0).to(tl.float32)
    uv = tl.load(u + off, mask=m, other=0.0).to(tl.float32)
    dav = tl.load(da + off, mask=m, other=0.0).to(tl.float32)
    e = tl.exp(-gv)
    sig = tl.div_rn(1.0, 1.0 + e)
    # σ(−g) = 1 − σ(g) without its cancellation for g > 0: e·σ (there e ≤ 1; the minimum keeps
    # the unused lanes of g ≤ −89, where e = inf and σ = 0, from computing inf·0)
    sig_neg = tl.where(gv > 0.0, tl.minimum(e, 1.0) * sig, 1.0 - sig)
    duv = dav * _silu(gv, is_bf16)
    dgv = dav * uv * (sig * (1.0 + gv * sig_neg))
    if is_bf16:
        duv = round_bf16(duv)
        dgv = round_bf16(dgv)
    tl.store(dg + off, dgv.to(dg.dtype.element_ty), mask=m)
    tl.store(du + off, duv.to(du.dtype.element_ty), mask=m)


BLOCK = 1024


def _variants():
    out = []
    for dt, p in (("f32", "*fp32"), ("bf16", "*bf16")):
        out.append(Variant(f"swiglu_fwd_{dt}", swiglu_fwd_kernel,
                           {"g": p, "u": p, "a": p, "n_cols": "i32"},
                           constexprs={"BLOCK": BLOCK}, num_warps=4, num_stages=1))
        out.append(Variant(f"swiglu_bwd_{dt}", swiglu_bwd_kernel,
                           {"g": p, "u": p, "da": p, "dg": p, "du": p, "n_cols": "i32"},
                           constexprs={"BLOCK": BLOCK}, num_warps=4, num_stages=1))
    return out


# Each followed by its aligned twin (``_a16``: pointers 16-byte aligned, ``n_cols % 16 == 0``).
VARIANTS = with_aligned(_variants(), lambda v: ("n_cols",))
