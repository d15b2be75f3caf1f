"""Causal attention over a flat varlen token axis with shared prefixes: forward and backward.

The algorithm is FlashAttention-2 (Tri Dao, "FlashAttention-2: Faster Attention with Better
Parallelism and Work Partitioning", arXiv:2307.08691, 2023), written here from the paper:

- forward (Algorithm 1): one program per (query block, query head) streams the key/value blocks
  with the online softmax (running row max ``m``, running sum ``l``, unnormalised output rescaled
  by ``exp(m_old - m_new)``), divides by ``l`` once at the end and saves the log-sum-exp
  ``L = m + log(l)`` of the *scaled* scores (§3.1.1);
- backward (Algorithm 2): ``D = rowsum(dO ∘ O)`` first (§3.1.2, the preprocessing), then the
  probabilities are recomputed from ``L`` (``P = exp(S - L)``) and
  ``dV += Pᵀ dO``, ``dP = dO Vᵀ``, ``dS = P ∘ (dP - D)``, ``dK += dSᵀ Q``, ``dQ += dS K``.
  Unlike the paper's single kernel with atomic dQ updates, dK/dV and dQ are two kernels
  (one program per key block, one per query block), each summing in a fixed order: no atomics,
  two runs are bit-identical.

Exponentials are base 2 (``exp(x) = 2^(x·log2 e)``: the scale and ``log2 e`` are folded into one
multiply of the scores); the saved LSE is converted back to the natural log.

Layout (kernels/README.md, "## Attention", is the caller's reference):

- ``q [N, Hq, D]``, ``k, v [N, Hkv, D]``, ``o, dq [N, Hq, D]``, ``dk, dv [N, Hkv, D]``: one flat
  token axis, contiguous, f32 or bf16; ``lse, delta [Hq, N]`` f32. ``N`` (``n_tokens``) is the
  flat axis length; positions that belong to no sequence are never read or written.
- ``seqs [S, 4]`` i32, one row per sequence ``s``: ``(start, len, prefix_start, prefix_len)``.
  Sequence ``s`` owns flat rows ``start .. start+len`` (its queries *and* its keys); its query ``i``
  sees the ``prefix_len`` keys at ``prefix_start ..`` (all of them), then its own keys ``0..=i``.
  A non-empty prefix lies inside the rows of one other sequence (its *owner*): the owner's dK/dV
  programs are where the prefix keys' gradients are summed.
- ``viewer_off [S+1]``, ``viewers [max(V, 1)]`` i32 (CSR):
  ``viewers[viewer_off[s] .. viewer_off[s+1]]`` lists the sequences whose prefix lies in sequence
  ``s``'s rows (each of the V sequences with a prefix once, under its owner), in the order their
  gradient contributions are summed.
- ``q_blocks [NBq, 2]`` i32: ``(s, m0)`` for every query block, ``m0 = 0, BLOCK_M, …`` below
  ``len_s``; ``k_blocks [NBk, 2]``: the same with ``BLOCK_N`` of the dK/dV variant.

Sliding window (Mistral, Qwen2/3 with ``use_sliding_window``, Gemma 2/3's local layers): the
``window`` argument (i32; ``0``: none). Positions are the sequence's own: its prefix keys are
``0 .. prefix_len``, its query/key ``i`` is at ``prefix_len + i``. A query at position ``p`` sees a
key at position ``j`` iff ``p − window < j ≤ p`` (``window`` keys, itself included): transformers'
``sliding_window_overlay`` (``kv_idx > q_idx − sliding_window``, masking_utils.py) with the causal
mask, and rlvr's ``window_bias``. The key-block loops start at the first block holding a key
inside the block's window (blocks wholly outside are never loaded) and the window's edge is
masked like the causal diagonal; the dK/dV kernel's query loops end at the last query that still
sees the key block. A runtime argument, not a constexpr: a window is a model's (Gemma alternates
windowed and global layers), so one compiled form serves both, and the cost is one integer
compare per score, next to the causal mask's.
"""

import dataclasses

import triton
import triton.language as tl

from kernels.variant import Variant, aligned

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
NO_WINDOW = tl.constexpr(1 << 30)  # what ``window = 0`` (none) becomes: wider than any sequence


@triton.jit
def _window(window):
    """The window in keys; ``window <= 0`` (none) becomes ``NO_WINDOW``."""
    return tl.where(window > 0, window, NO_WINDOW)


@triton.jit
def _first_block(lo, BLOCK: tl.constexpr):
    """The start of the first ``BLOCK``-aligned block holding index ``max(lo, 0)``."""
    return (tl.maximum(lo, 0) // BLOCK) * BLOCK


@triton.jit
def _rows_ptr(base, rows, head, row_stride, HEAD_DIM: tl.constexpr):
    """Pointers ``[len(rows), HEAD_DIM]`` to head ``head`` of flat rows ``rows`` (int64 offsets)."""
    d = tl.arange(0, HEAD_DIM)
    return base + rows.to(tl.int64)[:, None] * row_stride + head * HEAD_DIM + d[None, :]


@triton.jit
def _seq(seqs, s):
    """Sequence ``s``'s descriptor: (start, len, prefix_start, prefix_len)."""
    return (tl.load(seqs + 4 * s), tl.load(seqs + 4 * s + 1), tl.load(seqs + 4 * s + 2),
            tl.load(seqs + 4 * s + 3))


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------


@triton.jit
def _fwd_step(acc, l_i, m_i, qt, k, v, key_rows, n_ok, visible, kv_stride, hk, qk_scale2,
              HEAD_DIM: tl.constexpr):
    """One key block of the online softmax (FlashAttention-2 Alg. 1, inner loop), base 2."""
    kt = tl.load(_rows_ptr(k, key_rows, hk, kv_stride, HEAD_DIM), mask=n_ok[:, None], other=0.0)
    vt = tl.load(_rows_ptr(v, key_rows, hk, kv_stride, HEAD_DIM), mask=n_ok[:, None], other=0.0)
    s = tl.dot(qt, tl.trans(kt), input_precision="ieee") * qk_scale2
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(vt.dtype), vt, acc * alpha[:, None], input_precision="ieee")
    return acc, l_i, m_new


@triton.jit
def attn_fwd_kernel(q, k, v, o, lse, seqs, q_blocks, n_tokens, n_heads_q, n_heads_kv,
                    softmax_scale, window, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    """O and LSE of one query block of one query head. Grid ``(NBq, Hq)``.

    FlashAttention-2 (arXiv:2307.08691) Algorithm 1: the prefix keys (all visible without a
    window), then the sequence's own keys up to the block's last query (causal mask on the
    diagonal blocks); with a ``window``, from the first block inside the first query's window.
    """
    blk = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.load(q_blocks + 2 * blk)
    m0 = tl.load(q_blocks + 2 * blk + 1)
    start, length, p_start, p_len = _seq(seqs, s)
    hk = h // (n_heads_q // n_heads_kv)
    q_stride = n_heads_q * HEAD_DIM
    kv_stride = n_heads_kv * HEAD_DIM
    qk_scale2 = softmax_scale * LOG2E
    win = _window(window)

    offs_m = m0 + tl.arange(0, BLOCK_M)
    m_ok = offs_m < length
    q_rows = start + offs_m
    qt = tl.load(_rows_ptr(q, q_rows, h, q_stride, HEAD_DIM), mask=m_ok[:, None], other=0.0)

    # A finite start for the running max: a row whose first block is all masked stays finite.
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # The prefix: every query sees all of it (without a window). Query i is at position
    # p_len + i, prefix key j at j: visible iff p_len + i − j < win.
    for n0 in range(_first_block(p_len + m0 - win + 1, BLOCK_N), p_len, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < p_len
        # p_len + i − j < win, as one compare of two vectors (no [M, N] integer tile).
        visible = (n_ok[None, :] & m_ok[:, None]
                   & (offs_n[None, :] > (p_len + offs_m - win)[:, None]))
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, qt, k, v, p_start + offs_n, n_ok, visible,
                                  kv_stride, hk, qk_scale2, HEAD_DIM)
    # The sequence's own keys, causal (and i − j < win).
    n_end = tl.minimum(m0 + BLOCK_M, length)
    for n0 in range(_first_block(m0 - win + 1, BLOCK_N), n_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < length
        visible = (n_ok[None, :] & m_ok[:, None] & (offs_n[None, :] <= offs_m[:, None])
                   & (offs_n[None, :] > (offs_m - win)[:, None]))
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, qt, k, v, start + offs_n, n_ok, visible,
                                  kv_stride, hk, qk_scale2, HEAD_DIM)

    l_safe = tl.where(m_ok, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(_rows_ptr(o, q_rows, h, q_stride, HEAD_DIM), out.to(o.dtype.element_ty),
             mask=m_ok[:, None])
    lse_rows = h.to(tl.int64) * n_tokens + q_rows
    tl.store(lse + lse_rows, (m_i + tl.log2(l_safe)) * LN2, mask=m_ok)


# ----------------------------------------------------------------------------------------------
# Backward: D = rowsum(dO ∘ O)
# ----------------------------------------------------------------------------------------------


@triton.jit
def attn_bwd_pre_kernel(o, do, delta, seqs, q_blocks, n_tokens, n_heads_q,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """``delta[h, t] = Σ_d dO[t, h, d]·O[t, h, d]`` (f32) for one query block of one head.

    Grid ``(NBq, Hq)``. FlashAttention-2 (arXiv:2307.08691) §3.1.2: ``D_i = rowsum(dO_i ∘ O_i)``.
    """
    blk = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.load(q_blocks + 2 * blk)
    m0 = tl.load(q_blocks + 2 * blk + 1)
    start = tl.load(seqs + 4 * s)
    length = tl.load(seqs + 4 * s + 1)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    m_ok = offs_m < length
    rows = start + offs_m
    stride = n_heads_q * HEAD_DIM
    ot = tl.load(_rows_ptr(o, rows, h, stride, HEAD_DIM), mask=m_ok[:, None], other=0.0)
    dot_ = tl.load(_rows_ptr(do, rows, h, stride, HEAD_DIM), mask=m_ok[:, None], other=0.0)
    dl = tl.sum(ot.to(tl.float32) * dot_.to(tl.float32), 1)
    tl.store(delta + h.to(tl.int64) * n_tokens + rows, dl, mask=m_ok)


# ----------------------------------------------------------------------------------------------
# Backward: dK and dV, one program per (key block, kv head)
# ----------------------------------------------------------------------------------------------


@triton.jit
def _dkdv_step(dk_acc, dv_acc, kt, vt, q, do, lse, delta, q_rows, m_ok, visible_t, h,
               n_tokens, q_stride, qk_scale2, HEAD_DIM: tl.constexpr):
    """One query block's contribution to a key block's dK (unscaled) and dV, transposed form.

    FlashAttention-2 Alg. 2: ``Pᵀ = exp(K Qᵀ·scale - L)``, ``dV += Pᵀ dO``, ``dPᵀ = V dOᵀ``,
    ``dSᵀ = Pᵀ ∘ (dPᵀ - D)``, ``dK += dSᵀ Q``. ``visible_t`` is ``[BLOCK_N, BLOCK_M]``.
    """
    qt = tl.load(_rows_ptr(q, q_rows, h, q_stride, HEAD_DIM), mask=m_ok[:, None], other=0.0)
    dot_ = tl.load(_rows_ptr(do, q_rows, h, q_stride, HEAD_DIM), mask=m_ok[:, None], other=0.0)
    hrows = h.to(tl.int64) * n_tokens + q_rows
    lse2 = tl.load(lse + hrows, mask=m_ok, other=0.0) * LOG2E
    dl = tl.load(delta + hrows, mask=m_ok, other=0.0)
    st = tl.dot(kt, tl.trans(qt), input_precision="ieee") * qk_scale2
    pt = tl.where(visible_t, tl.exp2(st - lse2[None, :]), 0.0)
    dv_acc = tl.dot(pt.to(dot_.dtype), dot_, dv_acc, input_precision="ieee")
    dpt = tl.dot(vt, tl.trans(dot_), input_precision="ieee")
    dst = pt * (dpt - dl[None, :])
    dk_acc = tl.dot(dst.to(qt.dtype), qt, dk_acc, input_precision="ieee")
    return dk_acc, dv_acc


@triton.jit
def attn_bwd_dkdv_kernel(q, k, v, do, lse, delta, dk, dv, seqs, k_blocks, viewer_off, viewers,
                         n_tokens, n_heads_q, n_heads_kv, softmax_scale, window,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK and dV of one key block of one sequence for one kv head. Grid ``(NBk, Hkv)``.

    Sums, in this fixed order, over the kv head's query heads ``hk·r .. hk·r + r - 1``
    (``r = Hq/Hkv``) and, per head, over the sequence's own queries from the key block on
    (causal), then over every query of each viewer sequence (``viewers[viewer_off[s]:
    viewer_off[s+1]]``, in list order) for the keys inside that viewer's prefix; with a
    ``window``, only up to the last query whose window still holds a key of the block.
    FlashAttention-2 (arXiv:2307.08691) Algorithm 2, outer loop over key blocks.
    """
    blk = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.load(k_blocks + 2 * blk)
    n0 = tl.load(k_blocks + 2 * blk + 1)
    start, length, _ps, _pl = _seq(seqs, s)
    rep = n_heads_q // n_heads_kv
    q_stride = n_heads_q * HEAD_DIM
    kv_stride = n_heads_kv * HEAD_DIM
    qk_scale2 = softmax_scale * LOG2E
    win = _window(window)

    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_ok = offs_n < length
    key_rows = start + offs_n
    kt = tl.load(_rows_ptr(k, key_rows, hk, kv_stride, HEAD_DIM), mask=n_ok[:, None], other=0.0)
    vt = tl.load(_rows_ptr(v, key_rows, hk, kv_stride, HEAD_DIM), mask=n_ok[:, None], other=0.0)
    dk_acc = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv_acc = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    v_lo = tl.load(viewer_off + s)
    v_hi = tl.load(viewer_off + s + 1)

    for r in range(0, rep):
        h = hk * rep + r
        # The sequence's own queries i >= the block's first key (causal), i − j < win: up to
        # query n0 + BLOCK_N − 1 + win − 1.
        m_end = tl.minimum(length, n0 + BLOCK_N - 1 + win)
        for m0 in range((n0 // BLOCK_M) * BLOCK_M, m_end, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            m_ok = offs_m < length
            vis = (n_ok[:, None] & m_ok[None, :] & (offs_n[:, None] <= offs_m[None, :])
                   & (offs_m[None, :] < (offs_n + win)[:, None]))
            dk_acc, dv_acc = _dkdv_step(dk_acc, dv_acc, kt, vt, q, do, lse, delta, start + offs_m,
                                        m_ok, vis, h, n_tokens, q_stride, qk_scale2, HEAD_DIM)
        # Every query of every sequence whose prefix holds (some of) these keys.
        for vi in range(v_lo, v_hi):
            w = tl.load(viewers + vi)
            w_start, w_len, w_pstart, w_plen = _seq(seqs, w)
            in_prefix = n_ok & (key_rows >= w_pstart) & (key_rows < w_pstart + w_plen)
            # The viewer's query i (position w_plen + i) sees prefix key j (position
            # key_row − w_pstart) iff w_plen + i − j < win: up to the block's last key's window.
            q_lim = key_rows - w_pstart + win - w_plen  # queries below it see the key
            w_end = tl.minimum(w_len, tl.maximum(start + n0 + BLOCK_N - 1 - w_pstart + win - w_plen, 0))
            for m0 in range(0, w_end, BLOCK_M):
                offs_m = m0 + tl.arange(0, BLOCK_M)
                m_ok = offs_m < w_len
                vis = in_prefix[:, None] & m_ok[None, :] & (offs_m[None, :] < q_lim[:, None])
                dk_acc, dv_acc = _dkdv_step(dk_acc, dv_acc, kt, vt, q, do, lse, delta,
                                            w_start + offs_m, m_ok, vis, h, n_tokens, q_stride,
                                            qk_scale2, HEAD_DIM)

    dk_acc = dk_acc * softmax_scale
    tl.store(_rows_ptr(dk, key_rows, hk, kv_stride, HEAD_DIM), dk_acc.to(dk.dtype.element_ty),
             mask=n_ok[:, None])
    tl.store(_rows_ptr(dv, key_rows, hk, kv_stride, HEAD_DIM), dv_acc.to(dv.dtype.element_ty),
             mask=n_ok[:, None])


# ----------------------------------------------------------------------------------------------
# Backward: dQ, one program per (query block, query head)
# ----------------------------------------------------------------------------------------------


@triton.jit
def _dq_step(dq_acc, qt, dot_, lse2, dl, k, v, key_rows, n_ok, visible, kv_stride, hk, qk_scale2,
             HEAD_DIM: tl.constexpr):
    """One key block's contribution to a query block's dQ (unscaled): ``dQ += dS K``."""
    kt = tl.load(_rows_ptr(k, key_rows, hk, kv_stride, HEAD_DIM), mask=n_ok[:, None], other=0.0)
    vt = tl.load(_rows_ptr(v, key_rows, hk, kv_stride, HEAD_DIM), mask=n_ok[:, None], other=0.0)
    s = tl.dot(qt, tl.trans(kt), input_precision="ieee") * qk_scale2
    p = tl.where(visible, tl.exp2(s - lse2[:, None]), 0.0)
    dp = tl.dot(dot_, tl.trans(vt), input_precision="ieee")
    ds = p * (dp - dl[:, None])
    return tl.dot(ds.to(kt.dtype), kt, dq_acc, input_precision="ieee")


@triton.jit
def attn_bwd_dq_kernel(q, k, v, do, lse, delta, dq, seqs, q_blocks, n_tokens, n_heads_q,
                       n_heads_kv, softmax_scale, window, HEAD_DIM: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ of one query block of one query head. Grid ``(NBq, Hq)``.

    FlashAttention-2 (arXiv:2307.08691) Algorithm 2's dQ, with the loop turned around (one
    program owns the query block and streams its keys: the prefix, then its own keys, causal;
    with a ``window``, the forward's key ranges and masks).
    """
    blk = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.load(q_blocks + 2 * blk)
    m0 = tl.load(q_blocks + 2 * blk + 1)
    start, length, p_start, p_len = _seq(seqs, s)
    hk = h // (n_heads_q // n_heads_kv)
    q_stride = n_heads_q * HEAD_DIM
    kv_stride = n_heads_kv * HEAD_DIM
    qk_scale2 = softmax_scale * LOG2E

    offs_m = m0 + tl.arange(0, BLOCK_M)
    m_ok = offs_m < length
    q_rows = start + offs_m
    qt = tl.load(_rows_ptr(q, q_rows, h, q_stride, HEAD_DIM), mask=m_ok[:, None], other=0.0)
    dot_ = tl.load(_rows_ptr(do, q_rows, h, q_stride, HEAD_DIM), mask=m_ok[:, None], other=0.0)
    hrows = h.to(tl.int64) * n_tokens + q_rows
    lse2 = tl.load(lse + hrows, mask=m_ok, other=0.0) * LOG2E
    dl = tl.load(delta + hrows, mask=m_ok, other=0.0)
    dq_acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    win = _window(window)

    for n0 in range(_first_block(p_len + m0 - win + 1, BLOCK_N), p_len, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < p_len
        visible = (n_ok[None, :] & m_ok[:, None]
                   & (offs_n[None, :] > (p_len + offs_m - win)[:, None]))
        dq_acc = _dq_step(dq_acc, qt, dot_, lse2, dl, k, v, p_start + offs_n, n_ok, visible,
                          kv_stride, hk, qk_scale2, HEAD_DIM)
    n_end = tl.minimum(m0 + BLOCK_M, length)
    for n0 in range(_first_block(m0 - win + 1, BLOCK_N), n_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < length
        visible = (n_ok[None, :] & m_ok[:, None] & (offs_n[None, :] <= offs_m[:, None])
                   & (offs_n[None, :] > (offs_m - win)[:, None]))
        dq_acc = _dq_step(dq_acc, qt, dot_, lse2, dl, k, v, start + offs_n, n_ok, visible,
                          kv_stride, hk, qk_scale2, HEAD_DIM)

    dq_acc = dq_acc * softmax_scale
    tl.store(_rows_ptr(dq, q_rows, h, q_stride, HEAD_DIM), dq_acc.to(dq.dtype.element_ty),
             mask=m_ok[:, None])


# ----------------------------------------------------------------------------------------------
# Variants
# ----------------------------------------------------------------------------------------------

_DT = {"f32": "*fp32", "bf16": "*bf16"}


def _sig(fn, dtype, head_dim, **blocks):
    """Signature and constexprs of ``fn`` with tensors of ``dtype`` (lse/delta always f32)."""
    t = _DT[dtype]
    types = {
        "q": t, "k": t, "v": t, "o": t, "do": t, "dq": t, "dk": t, "dv": t,
        "lse": "*fp32", "delta": "*fp32",
        "seqs": "*i32", "q_blocks": "*i32", "k_blocks": "*i32", "viewer_off": "*i32",
        "viewers": "*i32",
        "n_tokens": "i32", "n_heads_q": "i32", "n_heads_kv": "i32", "softmax_scale": "fp32",
        "window": "i32",
    }
    consts = {"HEAD_DIM": head_dim, **blocks}
    sig = {}
    for name in fn.arg_names:
        sig[name] = "constexpr" if name in consts else types[name]
    assert set(consts) <= set(fn.arg_names), (fn.__name__, consts)
    return sig, consts


# (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel, dtype and head dim, for both targets or
# per target where they differ. Chosen so that every compiled form fits its target's shared memory
# (sm_80: 163 KB, sm_90: 227 KB) and the cubin has no local memory or stack (no spills; CUDA
# 13.0 ptxas, read back with cuobjdump --dump-resource-usage): the numbers are in
# kernels/README.md ("## Attention", "### Variants"). The backward's preprocessing uses the dQ
# kernel's BLOCK_M, so one q_blocks list serves the whole backward.
_CONFIGS = {
    ("f32", 64): {"fwd": (64, 32, 8, 2),
                  # with the window's masks sm90a spilled at BLOCK_N 32 (2 stages: 144 bytes, 1: 160)
                  "dkdv": {"sm90a": (16, 16, 8, 2), "sm80": (16, 32, 8, 1)},
                  "dq": (32, 32, 8, 2)},
    ("f32", 128): {"fwd": (32, 16, 8, 2),
                   "dkdv": {"sm90a": (16, 16, 4, 1), "sm80": (16, 16, 8, 2)},
                   "dq": {"sm90a": (16, 32, 8, 2), "sm80": (16, 32, 8, 1)}},  # sm80: 2 stages spilled
    ("bf16", 64): {"fwd": (128, 64, 8, 3), "dkdv": (64, 32, 8, 2), "dq": (128, 32, 8, 2)},
    ("bf16", 128): {"fwd": {"sm90a": (128, 64, 8, 2), "sm80": (64, 32, 8, 2)},
                    "dkdv": (32, 32, 8, 2), "dq": (64, 32, 8, 2)},
}
_KERNELS = {"fwd": attn_fwd_kernel, "dkdv": attn_bwd_dkdv_kernel, "dq": attn_bwd_dq_kernel}


def _variants():
    out = []
    for (dtype, hd), cfgs in _CONFIGS.items():
        suffix = f"{dtype}_d{hd}"
        for kind, cfg in cfgs.items():
            per_target = cfg if isinstance(cfg, dict) else {("sm90a", "sm80"): cfg}
            for targets, (bm, bn, warps, stages) in per_target.items():
                targets = targets if isinstance(targets, tuple) else (targets, )
                fn = _KERNELS[kind]
                sig, c = _sig(fn, dtype, hd, BLOCK_M=bm, BLOCK_N=bn)
                name = f"attn_{'fwd' if kind == 'fwd' else 'bwd_' + kind}_{suffix}"
                out.append(Variant(name, fn, sig, c, warps, stages, targets=targets))
        dq = cfgs["dq"] if isinstance(cfgs["dq"], dict) else {"all": cfgs["dq"]}
        bm = {c[0] for c in dq.values()}
        assert len(bm) == 1, (dtype, hd, "the dQ variants of both targets share BLOCK_M")
        bm = bm.pop()
        sig, c = _sig(attn_bwd_pre_kernel, dtype, hd, BLOCK_M=bm)
        out.append(Variant(f"attn_bwd_pre_{suffix}", attn_bwd_pre_kernel, sig, c, 8, 1))
    return out


# Aligned twins (``_a16``: every pointer 16-byte aligned; the row strides are multiples of the
# constexpr HEAD_DIM already): the fallback's configuration, except where that spills with the
# vectorised loads (CUDA 13.0 ptxas), per (name, target): fields of the Variant or constexprs to
# change, or None for no twin (the launcher then takes the fallback on that target).
_TWIN_CHANGES = {
    ("attn_bwd_dkdv_bf16_d64", "sm90a"): {"num_stages": 1},      # 2 stages: 8 bytes of spills
    ("attn_bwd_dkdv_bf16_d64", "sm80"): {"BLOCK_M": 32},         # 64: 20 bytes
    ("attn_bwd_dkdv_f32_d128", "sm90a"): {"num_warps": 8},       # 4 warps: 68 bytes
    ("attn_bwd_dkdv_f32_d64", "sm90a"): {"num_stages": 1},       # 2 stages: 8 bytes (window)
    ("attn_bwd_dkdv_f32_d64", "sm80"): None,  # 40-112 bytes at 4 or 8 warps, 1 or 2 stages, BLOCK_N 16
}


def _with_twins(variants):
    out = []
    for v in variants:
        out.append(v)
        if not any((v.name, t) in _TWIN_CHANGES for t in v.targets):
            out.append(aligned(v))
            continue
        for t in v.targets:
            change = _TWIN_CHANGES.get((v.name, t), {})
            if change is None:
                continue
            fields = {k: c for k, c in change.items() if k in ("num_warps", "num_stages")}
            consts = {**v.constexprs, **{k: c for k, c in change.items() if k not in fields}}
            out.append(aligned(dataclasses.replace(v, targets=(t, ), constexprs=consts, **fields)))
    return out


VARIANTS = _with_twins(_variants())
