"""The log-prob head over vocabulary chunks: online log-sum-exp, target log-prob, entropy, gradient.

The model's head is ``log_softmax(h·Wᵀ / T)[y]`` and the entropy ``H = −Σ_j p_j log p_j`` of
``p = softmax(h·Wᵀ / T)`` per row (``crates/rlvr-model/src/head.rs``; the CPU ops
``rlvr_kernels::LmHeadLogprobOp``/``TokenLogprobOp`` and the device-generic
``rlvr_model::chunked``). The ``[rows, V]`` logits never exist: cuBLAS computes one chunk
``z = h·W[c0:c0+C]ᵀ`` (``[rows, C]``, f32 or bf16, row stride ``stride_z``) at a time and these
kernels consume it. The online softmax normaliser is Milakov & Gimelshein, "Online normalizer
calculation for softmax" (arXiv 1805.02867), as used by FlashAttention (Dao et al. 2022, Dao 2023)
and by fused linear-cross-entropy heads (Liger Kernel, arXiv 2410.10989; Cut Cross-Entropy,
Wijmans et al. 2024, arXiv 2411.09009); the code is rlvr's own.

Per row r, with ``s_j = f32(z_j)·inv_t`` (``inv_t = f32(1/T)``) the scaled logits, the running
state ``state[r] = (M, S, D, s_y)`` (f32) holds over the chunks seen so far::

    M = max_j s_j,   S = Σ_j e^{s_j − M},   D = Σ_j e^{s_j − M}·(s_j − M),   s_y (target's logit)

``logprob_fwd_kernel`` (grid ``(rows,)``, one chunk per launch, chunks in vocabulary order)
merges the chunk into the state, ``BLOCK`` columns at a time: with the block's maximum ``b``,
``M' = max(M, b)``, ``δ = M − M'`` (≤ 0), ``e_j = e^{s_j − M'}``::

    S' = e^δ·S + Σ_j e_j
    D' = e^δ·(D + δ·S) + Σ_j e_j·(s_j − M')       (δ is taken as 0 while S = 0: no −inf·0)

and sets ``s_y`` when the target id ``y ∈ [col0, col0 + n_cols)``. ``first != 0`` starts a fresh
state (nothing is read from it). Every term of D is ``e·d`` with ``d ≤ 0`` bounded by ``e·|d| ≤
1/e``, so nothing overflows or cancels catastrophically (the "Σ p·z form, stable").

``logprob_finish_kernel`` (grid ``cdiv(rows, BLOCK)``) writes ``out[r] = (log p_y, H)``::

    log p_y = (s_y − M) − ln S,      H = ln S − D/S

(``log p_y = s_y − lse`` with ``lse = M + ln S``; ``H = lse − Σ p_j s_j = ln S − D/S``.)

``logprob_bwd_kernel`` (grid ``(rows, cdiv(n_cols, BLOCK))``, one chunk per launch, the same
chunk of logits recomputed or kept) turns the chunk into the gradient w.r.t. the *unscaled*
logits, in place, from the upstream ``grad[r] = (g_ℓ, g_H)`` (the gradients of ``out``)::

    log p_j = (s_j − M) − ln S,   p_j = e^{log p_j}
    ∂L/∂s_j = g_ℓ·(δ_{jy} − p_j) − g_H·p_j·(log p_j + H)
    ∂L/∂z_j = inv_t · ∂L/∂s_j                   (written in z's dtype)

(``∂H/∂s_j = −p_j·(log p_j + H)``), the formulas of ``TokenLogprobGradOp`` and
``rlvr_model::chunked``; ``dX`` and ``dW`` are then GEMMs of this chunk with ``W`` and ``h``.

Final-logit softcapping (Gemma 2, ``cap · tanh(z / cap)`` before the temperature; Team Gemma,
"Gemma 2", arXiv 2408.00118): the ``_softcap`` variants (constexpr ``SOFTCAP``) read the same raw
chunk and use ``s_j = (cap·inv_t)·tanh(z_j / cap)`` in place of ``z_j·inv_t`` everywhere above
(``cap`` an ``fp32`` argument, > 0; the plain variants ignore it), so the state, ``log p_y`` and
``H`` are those of the capped logits; the backward multiplies ``∂L/∂s_j`` (target's ``g_ℓ``
included) by ``∂ tanh = 1 − tanh²(z_j / cap)`` before the ``inv_t``::

    ∂L/∂z_j = inv_t · (1 − t_j²) · ∂L/∂s_j,      t_j = tanh(z_j / cap)

with ``1 − t² = 4e/(1 + e)²``, ``e = exp(−2|z/cap|)`` (exact to a few ulp even where ``t`` rounds
to ±1).

``tanh`` is computed as ``sign(x)·(1 − e)/(1 + e)``, ``e = exp(−2|x|)`` (no overflow; absolute
error of the order of f32's rounding near 1), the CPU op's formula (``rlvr_kernels::exp::tanh_fast``).

Launch contract (the host's part): ``targets`` ``[rows]`` holds the vocabulary ids (rlvr's u32 ids
read as i32); ``state`` ``[rows, 4]``, ``out`` ``[rows, 2]`` and ``grad`` ``[rows, 2]`` are
contiguous f32; ``state`` needs no initialisation (the first chunk's launch passes ``first = 1``
and reads nothing from it) and must be kept from the forward to the backward; ``inv_t`` is
``f32(1/T)``, as the CPU op's ``inv_t``. Without entropy the host passes ``g_H = 0`` (the CPU op
drops it) and ignores ``out[:, 1]``. Grids: forward ``(rows,)``, finish ``(cdiv(rows, 128),)``,
backward ``(rows, cdiv(n_cols, BLOCK))`` (``n_cols ≤ 65535·BLOCK``).

Precision: f32 arithmetic throughout (bf16 logits are widened when loaded; the bf16 gradient is
rounded to nearest even when stored). No fused multiply-add contraction (``fp_fusion`` off). On
the device ``exp`` is ``ex2.approx.f32`` of ``x·log2 e`` (≈2 ulp, plus the rounding of the
product: relative ≈ |x|·6e-8, which only the exponentially small terms see) and ``log`` is
libdevice's ``logf`` (≤ 1 ulp); under the interpreter both are numpy's.
"""

import triton
import triton.language as tl

from kernels.src._bf16 import to_bf16_rne
from kernels.variant import Variant, aligned


@triton.jit
def _tanh(x):
    """``tanh(x)`` as ``sign(x)·(1 − e)/(1 + e)`` with ``e = exp(−2|x|)`` (f32, no overflow)."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = tl.div_rn(1.0 - e, 1.0 + e)
    return tl.where(x < 0.0, -t, t)


@triton.jit
def _scaled(z, inv_t, cap, SOFTCAP: tl.constexpr):
    """The scaled logits ``s`` of raw f32 logits ``z``: ``z·inv_t``, or ``(cap·inv_t)·tanh(z/cap)``."""
    if SOFTCAP:
        return (cap * inv_t) * _tanh(tl.div_rn(z, cap))
    else:
        return z * inv_t


@triton.jit
def logprob_fwd_kernel(z, targets, state, n_cols, stride_z, col0, first, inv_t, cap,
                       BLOCK: tl.constexpr, SOFTCAP: tl.constexpr):
    """Merges row ``program_id(0)`` of one logits chunk into ``state`` ``[rows, 4]`` f32."""
    row = tl.program_id(0)
    zr = z + row.to(tl.int64) * stride_z
    st = state + row * 4
    fresh = first != 0
    M = tl.where(fresh, float("-inf"), tl.load(st + 0))
    S = tl.where(fresh, 0.0, tl.load(st + 1))
    D = tl.where(fresh, 0.0, tl.load(st + 2))
    sy = tl.where(fresh, 0.0, tl.load(st + 3))
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        s = _scaled(tl.load(zr + cols, mask=mask, other=0.0).to(tl.float32), inv_t, cap, SOFTCAP)
        s = tl.where(mask, s, float("-inf"))
        m_new = tl.maximum(M, tl.max(s, axis=0))
        d = tl.where(mask, s - m_new, 0.0)
        e = tl.where(mask, tl.exp(d), 0.0)
        # δ = M − M' (0 while nothing was merged: then S = D = 0 and M = −inf).
        delta = tl.where(S > 0.0, M - m_new, 0.0)
        a = tl.exp(delta)
        D = a * (D + delta * S) + tl.sum(e * d, axis=0)
        S = a * S + tl.sum(e, axis=0)
        M = m_new
    y = tl.load(targets + row)
    inside = (y >= col0) & (y < col0 + n_cols)
    zy = tl.load(zr + tl.where(inside, y - col0, 0), mask=inside, other=0.0).to(tl.float32)
    sy = tl.where(inside, _scaled(zy, inv_t, cap, SOFTCAP), sy)
    tl.store(st + 0, M)
    tl.store(st + 1, S)
    tl.store(st + 2, D)
    tl.store(st + 3, sy)


@triton.jit
def logprob_finish_kernel(state, out, n_rows, BLOCK: tl.constexpr):
    """``out[r] = (log p_y, H)`` ``[rows, 2]`` f32 from the merged ``state`` ``[rows, 4]``."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < n_rows
    M = tl.load(state + rows * 4 + 0, mask=mask, other=0.0)
    S = tl.load(state + rows * 4 + 1, mask=mask, other=1.0)
    D = tl.load(state + rows * 4 + 2, mask=mask, other=0.0)
    sy = tl.load(state + rows * 4 + 3, mask=mask, other=0.0)
    ln_s = tl.log(S)
    tl.store(out + rows * 2 + 0, (sy - M) - ln_s, mask=mask)
    tl.store(out + rows * 2 + 1, ln_s - tl.div_rn(D, S), mask=mask)


@triton.jit
def logprob_bwd_kernel(z, targets, state, out, grad, n_cols, stride_z, col0, inv_t, cap,
                       BLOCK: tl.constexpr, SOFTCAP: tl.constexpr):
    """In place on one logits chunk: ``z ← ∂L/∂z`` for the block ``program_id(1)`` of row
    ``program_id(0)``."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    zr = z + row.to(tl.int64) * stride_z
    M = tl.load(state + row * 4 + 0)
    ln_s = tl.log(tl.load(state + row * 4 + 1))
    H = tl.load(out + row * 2 + 1)
    gl = tl.load(grad + row * 2 + 0)
    gh = tl.load(grad + row * 2 + 1)
    y = tl.load(targets + row)
    zc = tl.load(zr + cols, mask=mask, other=0.0).to(tl.float32)
    s = _scaled(zc, inv_t, cap, SOFTCAP)
    lp = (s - M) - ln_s
    p = tl.exp(lp)
    ds = -gl * p - tl.where(gh != 0.0, gh * p * (lp + H), 0.0)
    ds = tl.where(cols + col0 == y, ds + gl, ds)
    if SOFTCAP:
        # 1 − tanh²(x) = 4e/(1 + e)², e = exp(−2|x|): no cancellation where tanh saturates.
        e = tl.exp(-2.0 * tl.abs(tl.div_rn(zc, cap)))
        ds = ds * tl.div_rn(4.0 * e, (1.0 + e) * (1.0 + e))
    dz = ds * inv_t
    if z.dtype.element_ty == tl.bfloat16:
        tl.store(zr + cols, to_bf16_rne(dz), mask=mask)
    else:
        tl.store(zr + cols, dz, mask=mask)


FWD_BLOCK = 1024
BWD_BLOCK = 1024
FINISH_BLOCK = 128


def _fwd(name, dt, softcap=False):
    sig = {"z": f"*{dt}", "targets": "*i32", "state": "*fp32", "n_cols": "i32", "stride_z": "i32",
           "col0": "i32", "first": "i32", "inv_t": "fp32", "cap": "fp32", "BLOCK": "constexpr",
           "SOFTCAP": "constexpr"}
    return Variant(name, logprob_fwd_kernel, sig, {"BLOCK": FWD_BLOCK, "SOFTCAP": softcap},
                   num_warps=4, num_stages=1)


def _bwd(name, dt, softcap=False):
    sig = {"z": f"*{dt}", "targets": "*i32", "state": "*fp32", "out": "*fp32", "grad": "*fp32",
           "n_cols": "i32", "stride_z": "i32", "col0": "i32", "inv_t": "fp32", "cap": "fp32",
           "BLOCK": "constexpr", "SOFTCAP": "constexpr"}
    return Variant(name, logprob_bwd_kernel, sig, {"BLOCK": BWD_BLOCK, "SOFTCAP": softcap},
                   num_warps=4, num_stages=1)


VARIANTS = [
    _fwd("logprob_fwd_f32", "fp32"),
    _fwd("logprob_fwd_bf16", "bf16"),
    Variant("logprob_finish", logprob_finish_kernel,
            {"state": "*fp32", "out": "*fp32", "n_rows": "i32", "BLOCK": "constexpr"},
            {"BLOCK": FINISH_BLOCK}, num_warps=4, num_stages=1),
    _bwd("logprob_bwd_f32", "fp32"),
    _bwd("logprob_bwd_bf16", "bf16"),
    # Aligned twins (``_a16``): every pointer 16-byte aligned and the chunk's ``n_cols`` and
    # ``stride_z`` multiples of 16 (Qwen2.5's vocabulary 151936 = 16·9496). The
    # launcher's first choice.
    aligned(_fwd("logprob_fwd_f32", "fp32"), ("n_cols", "stride_z")),
    aligned(_fwd("logprob_fwd_bf16", "bf16"), ("n_cols", "stride_z")),
    aligned(_bwd("logprob_bwd_f32", "fp32"), ("n_cols", "stride_z")),
    aligned(_bwd("logprob_bwd_bf16", "bf16"), ("n_cols", "stride_z")),
    # Final-logit softcapping (Gemma 2): the same kernels with ``SOFTCAP``, and their twins.
    _fwd("logprob_fwd_softcap_f32", "fp32", True),
    _fwd("logprob_fwd_softcap_bf16", "bf16", True),
    _bwd("logprob_bwd_softcap_f32", "fp32", True),
    _bwd("logprob_bwd_softcap_bf16", "bf16", True),
    aligned(_fwd("logprob_fwd_softcap_f32", "fp32", True), ("n_cols", "stride_z")),
    aligned(_fwd("logprob_fwd_softcap_bf16", "bf16", True), ("n_cols", "stride_z")),
    aligned(_bwd("logprob_bwd_softcap_f32", "fp32", True), ("n_cols", "stride_z")),
    aligned(_bwd("logprob_bwd_softcap_bf16", "bf16", True), ("n_cols", "stride_z")),
]
