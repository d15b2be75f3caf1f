"""RMSNorm fused with the residual add, forward and backward.

RMSNorm: Zhang & Sennrich, "Root Mean Square Layer Normalization", NeurIPS 2019 (arXiv:1910.07467):
``y = x / sqrt(mean(x²) + eps) · w``, no mean subtraction, no bias.

The oracle is rlvr's CPU op, ``rlvr_model::ops::rms_norm`` (transformers' ``Qwen2RMSNorm``), and the
decoder layer's residual add (``layers.rs``, ``DecoderLayer::forward``), with their exact cast order:

    h  = x + residual                  in the input dtype (bf16: f32 add, one rounding to bf16)
    hf = f32(h)                        upcast
    ms = sum(hf²) · f32(1/n)           candle's ``mean_keepdim`` is ``sum · (1/n)`` (an affine)
    s  = sqrt(ms + eps)                IEEE f32 sqrt
    n  = hf / s                        IEEE f32 division, per element
    y  = dtype(n) · w                  cast back to the input dtype, THEN multiplied by the weight
                                       in the input dtype (bf16: f32 product, one rounding)

``f32(1/n)`` is candle's f64 ``1/n`` rounded to f32; the kernels' f32 ``1.0 / n`` equals it for every
n ≤ 8192 (tested). The kernels use ``tl.sqrt_rn`` and ``tl.div_rn`` (correctly rounded, as the CPU's) rather than
Triton's default approximate ``/`` (``div.full.f32``) and ``sqrt``. The only difference from the CPU
is the summation order of ``sum(hf²)`` (a tree here, candle's AVX lanes there): f32 ``y`` agrees to
about 2e-7 relative, and bf16 ``y`` is bit-identical except where that last-bit difference in ``s``
moves ``n`` across a bf16 rounding boundary: ``dtype(n)`` is then 1 ulp off, and ``y = dtype(n)·w``
up to 2 ulps (the weight's significand, up to 2, scales the step); about 2 elements in 10⁴.

Backward (``n = h · r``, ``r = 1/s``, ``dn = dy · w``, casts passed straight through as autograd
does)::

    dh = r · (dn − n · mean(dn · n)) + dh_in        dh_in: the gradient reaching h from the
                                                    residual stream (the add variant)
    dw = Σ_rows dy · dtype(n)                       the factor the forward multiplied by
                                                    (recomputed as h·rstd, which may differ from
                                                    the forward's h/s in the last f32 bit)

``dh`` is the gradient of both ``x`` and ``residual``. ``dw`` is summed in a fixed order without
atomics: the row kernel's program ``p`` takes rows ``[p·rows_per_prog, (p+1)·rows_per_prog)`` in
order and writes its partial sum to row ``p`` of ``dw_part`` ``[n_parts, n_cols]`` (f32); then
``rmsnorm_dw_kernel`` adds the partials in order ``0..n_parts``. Two runs with the same
``rows_per_prog`` are bit-identical.

bf16 rounding is done by :func:`round_bf16` (integer round-to-nearest-even on the f32 bits): Triton
3.9's interpreter truncates on ``.to(tl.bfloat16)`` while the GPU rounds to nearest even, so every
value is rounded explicitly and the final ``.to(bf16)`` is exact on both.
"""

import dataclasses

import triton
import triton.language as tl

from kernels.src._bf16 import round_bf16
from kernels.variant import Variant, aligned


@triton.jit
def _norm_row(h, w, y, rstd, row, off, cols, mask, n_cols, eps):
    """From one row's f32 values ``h`` (the input dtype's values, zero past ``n_cols``): y and rstd."""
    is_bf16: tl.constexpr = y.dtype.element_ty == tl.bfloat16
    ms = tl.sum(h * h, axis=0) * tl.div_rn(1.0, n_cols.to(tl.float32))
    s = tl.sqrt_rn(ms + eps)
    n = tl.div_rn(h, s)
    wv = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
    if is_bf16:
        yv = round_bf16(round_bf16(n) * wv)
    else:
        yv = n * wv
    tl.store(y + off, yv.to(y.dtype.element_ty), mask=mask)
    tl.store(rstd + row, tl.div_rn(1.0, s))


@triton.jit
def rmsnorm_fwd_kernel(x, w, y, rstd, n_cols, eps, BLOCK: tl.constexpr):
    """y = rmsnorm(x) · w; rstd[row] = 1/sqrt(mean(x²) + eps). Grid (n_rows,)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    off = row.to(tl.int64) * n_cols + cols
    h = tl.load(x + off, mask=mask, other=0.0).to(tl.float32)
    _norm_row(h, w, y, rstd, row, off, cols, mask, n_cols, eps)


@triton.jit
def rmsnorm_add_fwd_kernel(x, residual, w, h_out, y, rstd, n_cols, eps, BLOCK: tl.constexpr):
    """h_out = x + residual (rounded to the dtype); y = rmsnorm(h_out) · w. Grid (n_rows,)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    off = row.to(tl.int64) * n_cols + cols
    h = tl.load(x + off, mask=mask, other=0.0).to(tl.float32)
    h = h + tl.load(residual + off, mask=mask, other=0.0).to(tl.float32)
    if h_out.dtype.element_ty == tl.bfloat16:
        h = round_bf16(h)
    tl.store(h_out + off, h.to(h_out.dtype.element_ty), mask=mask)
    _norm_row(h, w, y, rstd, row, off, cols, mask, n_cols, eps)


@triton.jit
def _bwd_rows(dy, h, w, rstd, dres, dx, dw_part, n_rows, n_cols, rows_per_prog,
              HAS_DRES: tl.constexpr, BLOCK: tl.constexpr):
    is_bf16: tl.constexpr = dx.dtype.element_ty == tl.bfloat16
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    wv = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
    inv_n = tl.div_rn(1.0, n_cols.to(tl.float32))
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    stride = n_cols.to(tl.int64)  # 64-bit row offsets
    start = pid * rows_per_prog
    end = tl.minimum(start + rows_per_prog, n_rows)
    for row in range(start, end):
        off = row * stride + cols
        r = tl.load(rstd + row)
        n = tl.load(h + off, mask=mask, other=0.0).to(tl.float32) * r
        g = tl.load(dy + off, mask=mask, other=0.0).to(tl.float32)
        if is_bf16:
            acc += g * round_bf16(n)
        else:
            acc += g * n
        dn = g * wv
        c = tl.sum(dn * n, axis=0) * inv_n
        d = (dn - n * c) * r
        if HAS_DRES:
            d = d + tl.load(dres + off, mask=mask, other=0.0).to(tl.float32)
        if is_bf16:
            d = round_bf16(d)
        tl.store(dx + off, d.to(dx.dtype.element_ty), mask=mask)
    tl.store(dw_part + pid.to(tl.int64) * n_cols + cols, acc, mask=mask)


@triton.jit
def rmsnorm_bwd_kernel(dy, h, w, rstd, dx, dw_part, n_rows, n_cols, rows_per_prog,
                       BLOCK: tl.constexpr):
    """dx = d(rmsnorm(h) · w)/dh · dy, and dw's per-program partial sums. Grid (n_parts,)."""
    _bwd_rows(dy, h, w, rstd, dy, dx, dw_part, n_rows, n_cols, rows_per_prog, False, BLOCK)


@triton.jit
def rmsnorm_add_bwd_kernel(dy, h, w, rstd, dres, dx, dw_part, n_rows, n_cols, rows_per_prog,
                           BLOCK: tl.constexpr):
    """As ``rmsnorm_bwd_kernel``, plus ``dres`` (the residual stream's gradient at h). Grid (n_parts,)."""
    _bwd_rows(dy, h, w, rstd, dres, dx, dw_part, n_rows, n_cols, rows_per_prog, True, BLOCK)


@triton.jit
def rmsnorm_dw_kernel(dw_part, dw, n_parts, n_cols, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """dw[c] = Σ_{p = 0 .. n_parts-1} dw_part[p, c], in that order. Grid (cdiv(n_cols, BLOCK),).

    ``UNROLL`` partial rows are loaded per step (independent loads in flight, not one latency per
    row) and then added one by one in order; a row past ``n_parts`` adds +0.0, which changes no sum.
    """
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    stride = n_cols.to(tl.int64)
    for p0 in range(0, n_parts, UNROLL):
        for i in tl.static_range(UNROLL):
            p = p0 + i
            in_range = cols * 0 + p < n_parts  # a vector: the interpreter rejects `mask & scalar`
            acc += tl.load(dw_part + p * stride + cols, mask=mask & in_range, other=0.0)
    if dw.dtype.element_ty == tl.bfloat16:
        acc = round_bf16(acc)
    tl.store(dw + cols, acc.to(dw.dtype.element_ty), mask=mask)


# The hidden-size classes: a row of n_cols uses the smallest BLOCK >= n_cols (block_for). 128 covers
# Qwen3's per-head q/k norm (head_dim 128) and tiny models; 1024 Qwen2.5-0.5B (896), SmolLM (576,
# 960) and Qwen3-0.6B; 2048 1.5B/3B; 4096 7B/8B; 8192 14B-72B.
BLOCKS = (128, 1024, 2048, 4096, 8192)
DW_BLOCK = 64  # columns per program of rmsnorm_dw_kernel (2 warps: one column per thread)
DW_UNROLL = 16


def _warps(block, bwd=False):
    """Warps per program. Forward: 8 to 16 elements per thread per row vector. Backward (which
    also holds w and dw's partial row across its rows): 8 warps at 2048, 32 beyond, which is what
    keeps every variant from spilling at both targets (ptxas 13.0: the 16-warp backward at 4096
    spilled on sm80, at 8192 on both)."""
    if block <= 1024:
        return 4
    if bwd:
        return 8 if block <= 2048 else 32
    return min(32, block // 512)


def _variants():
    out = []
    for dt, p in (("f32", "*fp32"), ("bf16", "*bf16")):
        for b in BLOCKS:
            common = dict(constexprs={"BLOCK": b}, num_warps=_warps(b), num_stages=1)
            common_bwd = dict(common, num_warps=_warps(b, bwd=True))
            out += [
                Variant(f"rmsnorm_fwd_{dt}_h{b}", rmsnorm_fwd_kernel,
                        {"x": p, "w": p, "y": p, "rstd": "*fp32", "n_cols": "i32", "eps": "fp32"},
                        **common),
                Variant(f"rmsnorm_add_fwd_{dt}_h{b}", rmsnorm_add_fwd_kernel,
                        {"x": p, "residual": p, "w": p, "h_out": p, "y": p, "rstd": "*fp32",
                         "n_cols": "i32", "eps": "fp32"},
                        **common),
                Variant(f"rmsnorm_bwd_{dt}_h{b}", rmsnorm_bwd_kernel,
                        {"dy": p, "h": p, "w": p, "rstd": "*fp32", "dx": p, "dw_part": "*fp32",
                         "n_rows": "i32", "n_cols": "i32", "rows_per_prog": "i32"},
                        **common_bwd),
                Variant(f"rmsnorm_add_bwd_{dt}_h{b}", rmsnorm_add_bwd_kernel,
                        {"dy": p, "h": p, "w": p, "rstd": "*fp32", "dres": p, "dx": p,
                         "dw_part": "*fp32", "n_rows": "i32", "n_cols": "i32",
                         "rows_per_prog": "i32"},
                        **common_bwd),
            ]
        out.append(Variant(f"rmsnorm_dw_{dt}", rmsnorm_dw_kernel,
                           {"dw_part": "*fp32", "dw": p, "n_parts": "i32", "n_cols": "i32"},
                           constexprs={"BLOCK": DW_BLOCK, "UNROLL": DW_UNROLL}, num_warps=2,
                           num_stages=1))
    return out


def _with_twins(variants):
    """Each row-kernel variant of BLOCK ≥ 1024 followed by its aligned twin (``_a16``: every
    pointer 16-byte aligned, ``n_cols % 16 == 0``, as every hidden size of the Qwen2.5/Qwen3/Llama
    families is), the launcher's first choice. None for BLOCK 128 and the dw kernel: one element
    per thread there, nothing to vectorise. ``rmsnorm_fwd_f32_h2048_a16`` takes 8 warps (at 4 it
    spills 28 bytes on sm_90a)."""
    out = []
    for v in variants:
        out.append(v)
        if v.constexprs["BLOCK"] >= 1024 and v.fn is not rmsnorm_dw_kernel:
            twin = aligned(v, ("n_cols",))
            if v.name == "rmsnorm_fwd_f32_h2048":
                twin = dataclasses.replace(twin, num_warps=8)
            out.append(twin)
    return out


VARIANTS = _with_twins(_variants())


def block_for(n_cols):
    """The variant class (its BLOCK) for rows of ``n_cols`` elements: the smallest of ``BLOCKS`` that holds them."""
    for b in BLOCKS:
        if n_cols <= b:
            return b
    raise ValueError(f"rmsnorm: rows of {n_cols} elements exceed the largest class ({BLOCKS[-1]})")
