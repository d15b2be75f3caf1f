"""The sampler's decode step: rotary + KV-cache write, and split-KV decode attention (issue 50).

One decode step runs one new token per row through every layer. Per layer the step needs, besides
the projections (cuBLAS) and the kernels it shares with training (``rmsnorm_add_fwd`` for the
residual add fused with the next norm, ``swiglu_fwd`` for the MLP's gating; ``src/rmsnorm.py``,
``src/swiglu.py``, whose ``[n_rows, n_cols]`` forms take a decode step's ``[B, hidden]`` rows as
they are), the three kernels of this module:

1. ``decode_rope_kv_kernel``: the rotary embedding (Su et al. 2021, RoFormer, arXiv:2104.09864;
   transformers' half-split layout, rlvr's cast sequence exactly as ``src/rotary.py``) of the new
   query and key of every row, with the rotated key and the value written straight into the
   preallocated cache at each row's column: one launch instead of rotary + two ``slice_set``.
2. ``decode_attn_kernel``: attention of one query per row over that row's cache, grouped-query
   (the ``Hq/Hkv`` query heads of one kv head in one program, so each key/value block is read
   once per kv head), split over the sequence for long caches: FlashDecoding (Tri Dao, Daniel
   Haziza, Francisco Massa, Grigory Sizov, "Flash-Decoding for long-context inference", 2023),
   i.e. FlashAttention's online softmax (Dao et al., "FlashAttention: Fast and Memory-Efficient
   Exact Attention with IO-Awareness", arXiv:2205.14135, 2022; FlashAttention-2,
   arXiv:2307.08691, Algorithm 1) run independently on each split, each split saving its
   normalised output and its log-sum-exp.
3. ``decode_attn_combine_kernel``: the splits of one (row, query head) merged by their
   log-sum-exp in split order: with ``M = max_s lse_s``, ``o = Σ_s 2^(lse_s − M)·o_s / Σ_s
   2^(lse_s − M)`` (the rescaling of FlashAttention's online softmax, applied once per split).

Layouts (all contiguous row-major unless a stride is given; kernels/README.md, "## Decode", is the
caller's reference):

- ``q, k, v``: the new token's query ``[B, Hq, D]`` and key/value ``[B, Hkv, D]``; row ``b`` of q
  starts at element ``b·stride_q``, of k and v at ``b·stride_kv`` (so a fused QKV projection's
  ``[B, (Hq + 2·Hkv)·D]`` output can be passed as three views). ``q_out [B, Hq, D]`` contiguous
  (may be ``q`` itself when ``stride_q = Hq·D``).
- ``k_cache, v_cache [B, Hkv, cap, D]``: the sampler's preallocated cache (``KvBuffer``), keys
  after the rotary embedding. ``cols [B]`` i32: the column row ``b``'s new key/value go to;
  ``pos [B]`` i32: its rotary position (row ``pos[b]`` of the f32 tables ``cos, sin [max_pos,
  D]``). Both are device buffers, read by the kernel: a captured CUDA graph replays with the
  values of the step, nothing baked in.
- ``lens [B]`` i32: row ``b``'s cache length for the attention (its columns ``0 .. lens[b]``,
  the new one included; ``1 ≤ lens[b] ≤ cap``); ``bias [B, cap]`` f32: added to the scaled
  scores (0 for a real token, rlvr's ``MASK_BIAS`` −1e30 for padding columns).
- ``o_part [B, Hq, n_splits, D]`` f32 and ``lse_part [B, Hq, n_splits]`` f32 (base-2
  log-sum-exp of the scaled scores): the per-split results; ``o [B, Hq, D]`` the output.

The split: row ``b``'s keys are cut into ``cdiv(L, split_len(L))`` splits of ``split_len(L)``
keys, ``L = lens[b]``, where ``split_len(L) = BLOCK_N · max(SPLIT_MIN / BLOCK_N,
cdiv(cdiv(L, BLOCK_N), MAX_SPLITS))`` (``split_len`` below): a function of the cache length
alone (and the variant's constexprs), never of the batch size, the capacity or the GPU, so a
rerun gives the same bits whatever the launch around it. At most ``MAX_SPLITS`` splits, and at
most ``cdiv(L, SPLIT_MIN)``: a cache of up to ``SPLIT_MIN`` keys is one split. The launch's
third grid axis is ``n_splits = min(MAX_SPLITS, cdiv(cap, SPLIT_MIN))`` (``grid_splits``), at
least the splits of any length up to ``cap``; programs past a row's splits return at once.

No atomics, fixed summation orders (keys in order within a split, splits in order in the
combine): two runs are bit-identical.
"""

import triton
import triton.language as tl

from kernels.src._bf16 import round_bf16, to_bf16_rne
from kernels.variant import Variant, aligned

LOG2E = tl.constexpr(1.4426950408889634)


def split_len(length, block_n, split_min, max_splits):
    """Keys per split for a cache of ``length`` keys (the kernels' ``_split_len``, on the host)."""
    blocks = -(-length // block_n)
    return block_n * max(split_min // block_n, -(-blocks // max_splits))


def splits(length, block_n, split_min, max_splits):
    """Splits of a cache of ``length`` keys."""
    return -(-length // split_len(length, block_n, split_min, max_splits))


def grid_splits(cap, split_min, max_splits):
    """The launch's split axis for a cache of capacity ``cap``: ≥ ``splits(L)`` for every L ≤ cap."""
    return max(1, min(max_splits, -(-cap // split_min)))


@triton.jit
def _split_len(length, BLOCK_N: tl.constexpr, SPLIT_MIN: tl.constexpr, MAX_SPLITS: tl.constexpr):
    blocks = tl.cdiv(length, BLOCK_N)
    return BLOCK_N * tl.maximum(SPLIT_MIN // BLOCK_N, tl.cdiv(blocks, MAX_SPLITS))


# ----------------------------------------------------------------------------------------------
# Rotary + cache write
# ----------------------------------------------------------------------------------------------


@triton.jit
def _rope_heads(src, dst, src_base, dst_base, dst_hstride, n_heads, c1, c2, s1, s2,
                HEAD_DIM: tl.constexpr, HEAD_BLOCK: tl.constexpr):
    """Rotates ``n_heads`` heads read at ``src + src_base + h·HEAD_DIM`` into ``dst + dst_base +
    h·dst_hstride``, with rlvr's cast sequence (``src/rotary.py``: bf16 rounds each product and
    the sum)."""
    is_bf16: tl.constexpr = dst.dtype.element_ty == tl.bfloat16
    HALF: tl.constexpr = HEAD_DIM // 2
    j = tl.arange(0, HALF)[None, :]
    for h0 in range(0, n_heads, HEAD_BLOCK):
        heads = h0 + tl.arange(0, HEAD_BLOCK)[:, None]
        m = heads < n_heads
        si = src_base + heads * HEAD_DIM + j
        di = dst_base + heads.to(tl.int64) * dst_hstride + j
        x1 = tl.load(src + si, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(src + si + HALF, mask=m, other=0.0).to(tl.float32)
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
        tl.store(dst + di, y1.to(dst.dtype.element_ty), mask=m)
        tl.store(dst + di + HALF, y2.to(dst.dtype.element_ty), mask=m)


@triton.jit
def decode_rope_kv_kernel(q, k, v, q_out, k_cache, v_cache, cos, sin, pos, cols, stride_q,
                          stride_kv, n_qh, n_kh, cap,
                          HEAD_DIM: tl.constexpr, HEAD_BLOCK: tl.constexpr):
    """q_out[b] = rope(q[b]); k_cache[b, :, cols[b]] = rope(k[b]); v_cache[b, :, cols[b]] = v[b].
    Grid ``(B,)``."""
    is_bf16: tl.constexpr = q_out.dtype.element_ty == tl.bfloat16
    HALF: tl.constexpr = HEAD_DIM // 2
    b = tl.program_id(0).to(tl.int64)
    row = tl.load(pos + b).to(tl.int64) * HEAD_DIM
    col = tl.load(cols + b).to(tl.int64)
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
    _rope_heads(q, q_out, b * stride_q, b * n_qh * HEAD_DIM, HEAD_DIM, n_qh, c1, c2, s1, s2,
                HEAD_DIM, HEAD_BLOCK)
    cache_base = (b * n_kh * cap + col) * HEAD_DIM
    _rope_heads(k, k_cache, b * stride_kv, cache_base, cap * HEAD_DIM, n_kh, c1, c2, s1, s2,
                HEAD_DIM, HEAD_BLOCK)
    d = tl.arange(0, HEAD_DIM)[None, :]
    for h0 in range(0, n_kh, HEAD_BLOCK):
        heads = h0 + tl.arange(0, HEAD_BLOCK)[:, None]
        m = heads < n_kh
        x = tl.load(v + b * stride_kv + heads * HEAD_DIM + d, mask=m)
        tl.store(v_cache + cache_base + heads.to(tl.int64) * cap * HEAD_DIM + d, x, mask=m)


# ----------------------------------------------------------------------------------------------
# Split-KV decode attention
# ----------------------------------------------------------------------------------------------


@triton.jit
def decode_attn_kernel(q, k_cache, v_cache, bias, lens, o_part, lse_part, n_qh, n_kh, cap,
                       n_splits, softmax_scale, HEAD_DIM: tl.constexpr,
                       GROUP_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
                       SPLIT_MIN: tl.constexpr, MAX_SPLITS: tl.constexpr):
    """One split of one row's cache for the query heads of one kv head: the normalised output and
    the base-2 log-sum-exp into ``o_part``/``lse_part``. Grid ``(B, Hkv, n_splits)``."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    length = tl.load(lens + b)
    span = _split_len(length, BLOCK_N, SPLIT_MIN, MAX_SPLITS)
    start = s * span
    if start < length:
        end = tl.minimum(start + span, length)
        group = n_qh // n_kh
        g = tl.arange(0, GROUP_BLOCK)
        g_ok = g < group
        qh = (hk * group + g).to(tl.int64)
        d = tl.arange(0, HEAD_DIM)
        b64 = b.to(tl.int64)
        qt = tl.load(q + (b64 * n_qh + qh)[:, None] * HEAD_DIM + d[None, :], mask=g_ok[:, None],
                     other=0.0)
        kv_base = (b64 * n_kh + hk) * cap * HEAD_DIM
        bias_row = bias + b64 * cap
        qk_scale2 = softmax_scale * LOG2E
        m_i = tl.full([GROUP_BLOCK], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_BLOCK], tl.float32)
        acc = tl.zeros([GROUP_BLOCK, HEAD_DIM], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            n_ok = offs < end
            kv = kv_base + offs.to(tl.int64)[:, None] * HEAD_DIM + d[None, :]
            kt = tl.load(k_cache + kv, mask=n_ok[:, None], other=0.0)
            vt = tl.load(v_cache + kv, mask=n_ok[:, None], other=0.0)
            bj = tl.load(bias_row + offs, mask=n_ok, other=0.0)
            sc = tl.dot(qt, tl.trans(kt), input_precision="ieee") * qk_scale2 + bj[None, :] * LOG2E
            sc = tl.where(n_ok[None, :], sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(sc - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(vt.dtype), vt, acc * alpha[:, None], input_precision="ieee")
            m_i = m_new
        out = acc / l_i[:, None]
        lse2 = m_i + tl.log2(l_i)
        row = (b64 * n_qh + qh) * n_splits + s
        tl.store(o_part + row[:, None] * HEAD_DIM + d[None, :], out, mask=g_ok[:, None])
        tl.store(lse_part + row, lse2, mask=g_ok)


@triton.jit
def decode_attn_combine_kernel(o_part, lse_part, lens, o, n_qh, n_splits,
                               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                               SPLIT_MIN: tl.constexpr, MAX_SPLITS: tl.constexpr):
    """``o[b, h]`` from row ``b``'s splits of head ``h``, merged by log-sum-exp in split order.
    Grid ``(B, Hq)``."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    length = tl.load(lens + b)
    n = tl.cdiv(length, _split_len(length, BLOCK_N, SPLIT_MIN, MAX_SPLITS))
    base = (b * n_qh + h) * n_splits
    m = tl.load(lse_part + base)
    for s in range(1, n):
        m = tl.maximum(m, tl.load(lse_part + base + s))
    d = tl.arange(0, HEAD_DIM)
    num = tl.zeros([HEAD_DIM], tl.float32)
    den = 0.0
    for s in range(0, n):
        w = tl.exp2(tl.load(lse_part + base + s) - m)
        num += w * tl.load(o_part + (base + s) * HEAD_DIM + d)
        den += w
    out = num / den
    dst = o + (b * n_qh + h) * HEAD_DIM + d
    if o.dtype.element_ty == tl.bfloat16:
        tl.store(dst, to_bf16_rne(out))
    else:
        tl.store(dst, out)


# ----------------------------------------------------------------------------------------------
# Variants
# ----------------------------------------------------------------------------------------------

HEAD_DIMS = (64, 128)
# Query heads per kv head a program handles (padded: tl.dot's smallest M is 16). Qwen2.5 has 7
# (0.5B: 14/2), 6 (1.5B: 12/2), 8 (3B: 16/2), 7 (7B: 28/4), 5 (14B, 32B: 40/8); the launcher
# refuses a ratio above it.
GROUP_BLOCK = 16
# Splits: at least SPLIT_MIN keys each, at most MAX_SPLITS of them (so a 128 + 256 token cache is
# 2 splits, 4096 keys 16 splits of 256); knobs for the first GPU run to tune, part of the
# variant (changing them changes the bits, as any kernel change does).
SPLIT_MIN = 256
MAX_SPLITS = 16
# Key/value block per loop step and warps of the attention kernel, per (dtype, head dim), chosen
# for no spills (CUDA 13.0 ptxas): the f32 variants (FMA path, ``input_precision="ieee"``) spilled
# at 4 warps with 32-key blocks on sm90a, and d64 at 8 warps with 32-key blocks on sm80.
BLOCK_N = {("f32", 64): 16, ("f32", 128): 16, ("bf16", 64): 64, ("bf16", 128): 64}
ATTN_WARPS = {("f32", 64): 8, ("f32", 128): 8, ("bf16", 64): 4, ("bf16", 128): 4}


def _variants():
    out = []
    for dt, p in (("f32", "*fp32"), ("bf16", "*bf16")):
        for d in HEAD_DIMS:
            sig = {n: p for n in ("q", "k", "v", "q_out", "k_cache", "v_cache")}
            sig.update({"cos": "*fp32", "sin": "*fp32", "pos": "*i32", "cols": "*i32",
                        "stride_q": "i32", "stride_kv": "i32", "n_qh": "i32", "n_kh": "i32",
                        "cap": "i32"})
            rope = Variant(f"decode_rope_kv_{dt}_d{d}", decode_rope_kv_kernel, sig,
                           constexprs={"HEAD_DIM": d, "HEAD_BLOCK": 1024 // d},
                           num_warps=4, num_stages=1)
            out += [rope, aligned(rope, ("stride_q", "stride_kv"))]
            bn = BLOCK_N[(dt, d)]
            split = {"BLOCK_N": bn, "SPLIT_MIN": SPLIT_MIN, "MAX_SPLITS": MAX_SPLITS}
            sig = {"q": p, "k_cache": p, "v_cache": p, "bias": "*fp32", "lens": "*i32",
                   "o_part": "*fp32", "lse_part": "*fp32", "n_qh": "i32", "n_kh": "i32",
                   "cap": "i32", "n_splits": "i32", "softmax_scale": "fp32"}
            attn = Variant(f"decode_attn_{dt}_d{d}", decode_attn_kernel, sig,
                           constexprs={"HEAD_DIM": d, "GROUP_BLOCK": GROUP_BLOCK, **split},
                           num_warps=ATTN_WARPS[(dt, d)], num_stages=2)
            out += [attn, aligned(attn)]
            sig = {"o_part": "*fp32", "lse_part": "*fp32", "lens": "*i32", "o": p,
                   "n_qh": "i32", "n_splits": "i32"}
            comb = Variant(f"decode_attn_combine_{dt}_d{d}", decode_attn_combine_kernel, sig,
                           constexprs={"HEAD_DIM": d, **split}, num_warps=1, num_stages=1)
            out += [comb, aligned(comb)]
    return out


VARIANTS = _variants()
