"""Rotary position embedding on q and k, forward and backward.

RoPE: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021
(arXiv:2104.09864), in transformers' half-split layout (``rotate_half``): with ``[x1, x2]`` the two
halves of a head, ``rotate_half(x) = [−x2, x1]`` and

    y = x · cos + rotate_half(x) · sin,  i.e.  y1 = x1·c1 − x2·s1,  y2 = x2·c2 + x1·s2

where ``c``/``s`` are row ``pos[t]`` of the tables ``[max_pos, head_dim]`` (rlvr's tables repeat
the half: ``c1 = c2``). Positions are gathered per token (int32 ``[N]``): rlvr's shared-prompt
layout gives a completion's tokens the positions that continue its prompt, so they are arbitrary,
repeated and out of order.

The oracle is rlvr's CPU op (``layers.rs``: ``Rotary`` and ``rope``): the tables are computed in
f32 and cast to the compute dtype, then ``x·cos`` and ``rotate_half(x)·sin`` are two tensors in
that dtype and their sum a third. The kernels take the f32 tables and follow that sequence:
f32 variants compute the two products and the sum in f32 (no FMA contraction: bit-identical to the
CPU); bf16 variants round the tables to bf16, then round each product and the sum to bf16 as candle
does (each bf16 op is an f32 op rounded once): bit-identical to the CPU too.

Backward: the Jacobian is ``C + S·R`` (``C``, ``S`` diagonal, ``R`` = rotate_half, ``Rᵀ = −R``),
so ``dx = C·dy − R·(S·dy)``::

    dx1 = dy1·c1 + dy2·s2,   dx2 = dy2·c2 − dy1·s1

(the rotation by −sin when ``s1 = s2``), computed in f32 from the same (bf16-rounded, in bf16
variants) tables and rounded once to the dtype.

Layout: ``q`` ``[N, Hq, D]`` and ``k`` ``[N, Hkv, D]`` contiguous; one program per token handles
all of its q heads then all of its k heads, ``HEAD_BLOCK`` heads at a time. ``q_out``/``k_out``
may be ``q``/``k`` themselves (in place): each program reads a head block before writing it.
"""

import triton
import triton.language as tl

from kernels.src._bf16 import round_bf16
from kernels.variant import Variant, with_aligned


@triton.jit
def _rotate_heads(x, out, tok, n_heads, c1, c2, s1, s2, TRANSPOSE: tl.constexpr,
                  HEAD_DIM: tl.constexpr, HEAD_BLOCK: tl.constexpr):
    is_bf16: tl.constexpr = out.dtype.element_ty == tl.bfloat16
    HALF: tl.constexpr = HEAD_DIM // 2
    j = tl.arange(0, HALF)[None, :]
    base = tok.to(tl.int64) * n_heads * HEAD_DIM
    for h0 in range(0, n_heads, HEAD_BLOCK):
        heads = h0 + tl.arange(0, HEAD_BLOCK)[:, None]
        m = heads < n_heads
        off = base + heads * HEAD_DIM + j
        x1 = tl.load(x + off, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(x + off + HALF, mask=m, other=0.0).to(tl.float32)
        if TRANSPOSE:
            y1 = x1 * c1 + x2 * s2
            y2 = x2 * c2 - x1 * s1
        else:
            a1 = x1 * c1
            b1 = -x2 * s1
            a2 = x2 * c2
            b2 = x1 * s2
            if is_bf16:
                a1 = round_bf16(a1)
                b1 = round_bf16(b1)
                a2 = round_bf16(a2)
                b2 = round_bf16(b2)
            y1 = a1 + b1
            y2 = a2 + b2
        if is_bf16:
            y1 = round_bf16(y1)
            y2 = round_bf16(y2)
        tl.store(out + off, y1.to(out.dtype.element_ty), mask=m)
        tl.store(out + off + HALF, y2.to(out.dtype.element_ty), mask=m)


@triton.jit
def _rotary(q, k, q_out, k_out, cos, sin, pos, n_qh, n_kh, TRANSPOSE: tl.constexpr,
            HEAD_DIM: tl.constexpr, HEAD_BLOCK: tl.constexpr):
    is_bf16: tl.constexpr = q_out.dtype.element_ty == tl.bfloat16
    HALF: tl.constexpr = HEAD_DIM // 2
    tok = tl.program_id(0)
    row = tl.load(pos + tok).to(tl.int64) * HEAD_DIM
    j = tl.arange(0, HALF)[None, :]
    c1 = tl.load(cos + row + j)
    c2 = tl.load(cos + row + HALF + j)
    s1 = tl.load(sin + row + j)
    s2 = tl.load(sin + row + HALF + j)
    if is_bf16:  # the CPU casts the f32 tables to the compute dtype
        c1 = round_bf16(c1)
        c2 = round_bf16(c2)
        s1 = round_bf16(s1)
        s2 = round_bf16(s2)
    _rotate_heads(q, q_out, tok, n_qh, c1, c2, s1, s2, TRANSPOSE, HEAD_DIM, HEAD_BLOCK)
    _rotate_heads(k, k_out, tok, n_kh, c1, c2, s1, s2, TRANSPOSE, HEAD_DIM, HEAD_BLOCK)


@triton.jit
def rotary_fwd_kernel(q, k, q_out, k_out, cos, sin, pos, n_qh, n_kh,
                      HEAD_DIM: tl.constexpr, HEAD_BLOCK: tl.constexpr):
    """q_out, k_out = rope(q), rope(k) at positions ``pos``. Grid (N,)."""
    _rotary(q, k, q_out, k_out, cos, sin, pos, n_qh, n_kh, False, HEAD_DIM, HEAD_BLOCK)


@triton.jit
def rotary_bwd_kernel(dq, dk, dq_out, dk_out, cos, sin, pos, n_qh, n_kh,
                      HEAD_DIM: tl.constexpr, HEAD_BLOCK: tl.constexpr):
    """dq_out, dk_out = ropeᵀ(dq), ropeᵀ(dk) (the gradients w.r.t. the unrotated q, k). Grid (N,)."""
    _rotary(dq, dk, dq_out, dk_out, cos, sin, pos, n_qh, n_kh, True, HEAD_DIM, HEAD_BLOCK)


HEAD_DIMS = (64, 128)


def head_block(head_dim):
    """Heads per step: a [HEAD_BLOCK, head_dim/2] tile of 512 elements per half."""
    return 1024 // head_dim


def _variants():
    out = []
    for dt, p in (("f32", "*fp32"), ("bf16", "*bf16")):
        for d in HEAD_DIMS:
            for kind, fn, names in (("fwd", rotary_fwd_kernel, ("q", "k", "q_out", "k_out")),
                                    ("bwd", rotary_bwd_kernel, ("dq", "dk", "dq_out", "dk_out"))):
                sig = {n: p for n in names}
                sig.update({"cos": "*fp32", "sin": "*fp32", "pos": "*i32", "n_qh": "i32",
                            "n_kh": "i32"})
                out.append(Variant(f"rotary_{kind}_{dt}_d{d}", fn, sig,
                                   constexprs={"HEAD_DIM": d, "HEAD_BLOCK": head_block(d)},
                                   num_warps=4, num_stages=1))
    return out


# Each followed by its aligned twin (``_a16``: every pointer 16-byte aligned; the strides are
# multiples of the constexpr HEAD_DIM already).
VARIANTS = with_aligned(_variants(), lambda v: ())
