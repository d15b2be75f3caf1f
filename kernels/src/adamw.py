"""AdamW in one pass per parameter tensor, and the gradient norm's deterministic sum of squares.

AdamW is Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (ICLR 2019), in the form of
``torch.optim.AdamW`` that rlvr implements on the CPU (``crates/rlvr-model/src/optim.rs``, whose
in-place f32 passes are ``crates/rlvr-kernels/src/adamw.rs``: ``MomentUpdate`` twice, then
``ParamUpdate``). One program updates ``BLOCK`` consecutive elements; per element, in f32, in
exactly the CPU's order of operations (no fused multiply-add: the variants set ``fp_fusion`` off
and the cubins are assembled with ``--fmad=false``; the square root and the division are the
correctly rounded ``sqrt_rn``/``div_rn``), so the GPU result equals the CPU's bit for bit::

    g  = f32(grad) · grad_scale                 (the clipping factor; 1 when not clipping)
    m  ← β₁·m + (1 − β₁)·g
    v  ← β₂·v + (1 − β₂)·(g·g)
    θ  ← θ·decay − lr·(m·inv_bc1) / (√(v·inv_bc2) + ε)
    copy ← bf16(θ)                              (round to nearest even; bf16-masters variants)

The scalars are f32, computed on the host as the CPU code computes them (``AdamW::step``):
``beta1 = f32(β₁)``, ``one_minus_beta1 = 1 − f32(β₁)`` in f32 (so for β₂), ``lr = f32(lr)``,
``decay = f32(1 − lr·λ)`` (decoupled weight decay, computed in f64), ``inv_bc1 = f32(1/(1 − β₁ᵗ))``
and ``inv_bc2 = f32(1/(1 − β₂ᵗ))`` (bias corrections, f64 with t the step count after the
increment), ``eps = f32(ε)``, and ``grad_scale = f32(clip/(‖g‖ + 1e-6))`` when the norm exceeds
the clip (``rlvr_train::update::optimizer``), else 1. θ is the f32 parameter, or the f32 master
weight of a bf16 parameter (then ``copy`` receives the parameter's new bf16 value).

The gradient norm (``‖g‖² = Σ_tensors Σ_i g_i²``; the optimizer takes its square root) is two
kernels and no atomics: ``grad_sumsq_kernel`` writes one f32 partial sum per program, each over a
fixed span of ``BLOCK·ITERS`` elements (lanes accumulate in f32, then one tree sum); the host
launches it per gradient tensor into consecutive slots of one partials buffer, and
``grad_sumsq_total_kernel`` (one program) adds all partials in f64, ``BLOCK`` lanes striding over
them in index order, then one tree sum. The order of every addition is fixed by the shapes alone,
so two runs give the same bits.
"""

import triton
import triton.language as tl

from kernels.src._bf16 import to_bf16_rne
from kernels.variant import Variant, aligned


@triton.jit
def adamw_kernel(param, grad, exp_avg, exp_avg_sq, copy, n, grad_scale, beta1, one_minus_beta1,
                 beta2, one_minus_beta2, lr, decay, inv_bc1, inv_bc2, eps, BLOCK: tl.constexpr):
    """One AdamW step on ``n`` elements (grid: ``cdiv(n, BLOCK)``); ``copy`` is None (constexpr)
    for an f32 parameter, else the bf16 parameter that mirrors the f32 master ``param``."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(param + offs, mask=mask, other=0.0)
    g = tl.load(grad + offs, mask=mask, other=0.0).to(tl.float32) * grad_scale
    m = tl.load(exp_avg + offs, mask=mask, other=0.0)
    v = tl.load(exp_avg_sq + offs, mask=mask, other=0.0)
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * (g * g)
    denom = tl.sqrt_rn(v * inv_bc2) + eps
    p = p * decay - tl.div_rn(lr * (m * inv_bc1), denom)
    tl.store(exp_avg + offs, m, mask=mask)
    tl.store(exp_avg_sq + offs, v, mask=mask)
    tl.store(param + offs, p, mask=mask)
    if copy is not None:
        tl.store(copy + offs, to_bf16_rne(p), mask=mask)


@triton.jit
def grad_sumsq_kernel(grad, partials, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """``partials[pid] = Σ g_i²`` over elements ``[pid·BLOCK·ITERS, (pid+1)·BLOCK·ITERS) ∩ [0, n)``
    (grid: ``cdiv(n, BLOCK·ITERS)``), accumulated in f32."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * ITERS)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(grad + offs, mask=offs < n, other=0.0).to(tl.float32)
        acc += x * x
    tl.store(partials + pid, tl.sum(acc, axis=0))


@triton.jit
def grad_sumsq_total_kernel(partials, out, n_partials, BLOCK: tl.constexpr):
    """``out[0] = Σ partials`` in f64, in a fixed order (grid: one program)."""
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(0, n_partials, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(partials + offs, mask=offs < n_partials, other=0.0).to(tl.float64)
    tl.store(out, tl.sum(acc, axis=0))


ADAMW_BLOCK = 1024
SUMSQ_BLOCK = 1024
SUMSQ_ITERS = 16  # one partial per 16 Ki elements
TOTAL_BLOCK = 1024

_SCALARS = {k: "fp32" for k in ("grad_scale", "beta1", "one_minus_beta1", "beta2",
                                "one_minus_beta2", "lr", "decay", "inv_bc1", "inv_bc2", "eps")}


def _adamw(name, grad, copy):
    sig = {"param": "*fp32", "grad": f"*{grad}", "exp_avg": "*fp32", "exp_avg_sq": "*fp32",
           "copy": "*bf16" if copy else "constexpr", "n": "i64", **_SCALARS, "BLOCK": "constexpr"}
    constexprs = {"BLOCK": ADAMW_BLOCK}
    if not copy:
        constexprs["copy"] = None
    return Variant(name, adamw_kernel, sig, constexprs, num_warps=8, num_stages=1)


def _sumsq(name, grad):
    sig = {"grad": f"*{grad}", "partials": "*fp32", "n": "i64", "BLOCK": "constexpr",
           "ITERS": "constexpr"}
    return Variant(name, grad_sumsq_kernel, sig, {"BLOCK": SUMSQ_BLOCK, "ITERS": SUMSQ_ITERS},
                   num_warps=4, num_stages=1)


VARIANTS = [
    # f32 parameter, f32 gradient (the f32 model).
    _adamw("adamw_f32", "fp32", copy=False),
    # bf16 parameter through its f32 master: the master updated, the bf16 copy written.
    _adamw("adamw_master_bf16", "fp32", copy=True),
    _adamw("adamw_master_bf16_gbf16", "bf16", copy=True),
    _sumsq("grad_sumsq_f32", "fp32"),
    _sumsq("grad_sumsq_bf16", "bf16"),
    # Aligned twins (``_a16``): every pointer 16-byte aligned and ``n % 16 == 0`` (the mask then
    # keeps whole 16-element groups, so loads and stores are 128-bit). The launcher's first choice.
    aligned(_adamw("adamw_f32", "fp32", copy=False), ("n",)),
    aligned(_adamw("adamw_master_bf16", "fp32", copy=True), ("n",)),
    aligned(_adamw("adamw_master_bf16_gbf16", "bf16", copy=True), ("n",)),
    # (``partials`` is written one f32 per program at the caller's slot: not assumed aligned.)
    aligned(_sumsq("grad_sumsq_f32", "fp32"), ("n",), ptrs=("grad",)),
    aligned(_sumsq("grad_sumsq_bf16", "bf16"), ("n",), ptrs=("grad",)),
    Variant("grad_sumsq_total", grad_sumsq_total_kernel,
            {"partials": "*fp32", "out": "*fp64", "n_partials": "i32", "BLOCK": "constexpr"},
            {"BLOCK": TOTAL_BLOCK}, num_warps=4, num_stages=1),
]
