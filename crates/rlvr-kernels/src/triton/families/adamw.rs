//! AdamW in one pass, and the gradient norm's fixed-order sum of squares
//! (`kernels/src/adamw.py`).
//!
//! `adamw_kernel` updates `n` elements in place: `param` (f32, the master weight of a bf16
//! parameter), `exp_avg`, `exp_avg_sq` (f32), from `grad` (f32 or bf16), and writes `copy`
//! (bf16) in the master-weight variants; grid `cdiv(n, BLOCK)`. `grad_sumsq_kernel` writes one
//! f32 partial sum per `BLOCK·ITERS` elements of `grad` into `partials` from slot
//! `partials_offset` (the host launches it per gradient tensor into consecutive slots);
//! `grad_sumsq_total_kernel` adds `n_partials` partials in f64 into `out[0]`, one program.

use super::super::manifest::KernelEntry;
use super::super::plan::{cdiv, LaunchPlan, PlanBuilder};
use super::super::{Result, TritonError};

/// The f32 scalars of one AdamW step, computed on the host as the CPU optimizer does
/// (`rlvr_model::optim::AdamW::step`): see [`AdamwScalars::new`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamwScalars {
    /// The gradient's scale (the clipping factor; 1 when not clipping).
    pub grad_scale: f32,
    /// β₁.
    pub beta1: f32,
    /// 1 − β₁, in f32.
    pub one_minus_beta1: f32,
    /// β₂.
    pub beta2: f32,
    /// 1 − β₂, in f32.
    pub one_minus_beta2: f32,
    /// The learning rate.
    pub lr: f32,
    /// 1 − lr·λ (decoupled weight decay), computed in f64.
    pub decay: f32,
    /// 1 / (1 − β₁ᵗ), computed in f64.
    pub inv_bc1: f32,
    /// 1 / (1 − β₂ᵗ), computed in f64.
    pub inv_bc2: f32,
    /// ε.
    pub eps: f32,
}

impl AdamwScalars {
    /// The scalars of step `t` (1-based, after the increment) for learning rate `lr`, betas,
    /// `eps`, weight decay `wd` and gradient scale `grad_scale`.
    pub fn new(
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        wd: f64,
        t: i32,
        grad_scale: f32,
    ) -> Self {
        let (b1, b2) = (beta1 as f32, beta2 as f32);
        AdamwScalars {
            grad_scale,
            beta1: b1,
            one_minus_beta1: 1.0 - b1,
            beta2: b2,
            one_minus_beta2: 1.0 - b2,
            lr: lr as f32,
            decay: (1.0 - lr * wd) as f32,
            inv_bc1: (1.0 / (1.0 - beta1.powi(t))) as f32,
            inv_bc2: (1.0 / (1.0 - beta2.powi(t))) as f32,
            eps: eps as f32,
        }
    }
}

/// The shapes (and scalars) of one launch of the family.
#[derive(Clone, Copy, Debug)]
pub enum Adamw {
    /// One AdamW step over `n` elements.
    Step {
        /// Elements.
        n: usize,
        /// The step's scalars.
        scalars: AdamwScalars,
    },
    /// The sum of squares of one gradient tensor of `n` elements into `partials` from slot
    /// `partials_offset`.
    SumSq {
        /// Elements of the gradient.
        n: usize,
        /// The first partial's slot.
        partials_offset: usize,
    },
    /// The total of `n_partials` partials into `out[0]`.
    Total {
        /// Partials to add.
        n_partials: usize,
    },
}

/// Partial sums `grad_sumsq_kernel` writes for `n` elements under `entry` (its
/// `BLOCK·ITERS` per partial).
pub fn partials_for(entry: &KernelEntry, n: usize) -> Result<usize> {
    let span = (entry.constexpr_int("BLOCK")? * entry.constexpr_int("ITERS")?) as usize;
    Ok(n.div_ceil(span))
}

/// The plan for `entry` at `s`. Errors: a shape for another kernel of the family, another
/// family's entry, [`PlanBuilder`]'s checks.
pub fn plan(entry: &KernelEntry, s: &Adamw) -> Result<LaunchPlan> {
    let name = &entry.name;
    let mismatch = || TritonError::Plan {
        name: name.clone(),
        why: format!("{s:?} is not a launch of {}", entry.entry),
    };
    match (entry.entry.as_str(), s) {
        ("adamw_kernel", Adamw::Step { n, scalars: c }) => {
            let block = entry.constexpr_int("BLOCK")? as usize;
            let mut b = PlanBuilder::new(entry)
                .buf("param", "param")
                .buf("grad", "grad")
                .buf("exp_avg", "exp_avg")
                .buf("exp_avg_sq", "exp_avg_sq");
            // The f32 variants bind `copy` to None as a constexpr: no such parameter.
            if entry.params.iter().any(|p| p.name == "copy") {
                b = b.buf("copy", "copy");
            }
            b.i64("n", *n as i64)
                .f32("grad_scale", c.grad_scale)
                .f32("beta1", c.beta1)
                .f32("one_minus_beta1", c.one_minus_beta1)
                .f32("beta2", c.beta2)
                .f32("one_minus_beta2", c.one_minus_beta2)
                .f32("lr", c.lr)
                .f32("decay", c.decay)
                .f32("inv_bc1", c.inv_bc1)
                .f32("inv_bc2", c.inv_bc2)
                .f32("eps", c.eps)
                .finish([cdiv(name, *n, block)?, 1, 1])
        }
        ("grad_sumsq_kernel", Adamw::SumSq { n, partials_offset }) => PlanBuilder::new(entry)
            .buf("grad", "grad")
            .buf_at("partials", "partials", *partials_offset)
            .i64("n", *n as i64)
            .finish([cdiv(name, partials_for(entry, *n)?, 1)?, 1, 1]),
        ("grad_sumsq_total_kernel", Adamw::Total { n_partials }) => PlanBuilder::new(entry)
            .buf("partials", "partials")
            .buf("out", "out")
            .i32("n_partials", *n_partials)
            .finish([1, 1, 1]),
        _ => Err(mismatch()),
    }
}

/// [`plan`] at a small shape: 2500 elements (a partial last block).
pub fn example(entry: &KernelEntry) -> Result<LaunchPlan> {
    let s = match entry.entry.as_str() {
        "grad_sumsq_kernel" => Adamw::SumSq {
            n: 40_000,
            partials_offset: 1,
        },
        "grad_sumsq_total_kernel" => Adamw::Total { n_partials: 2500 },
        _ => Adamw::Step {
            n: super::example_len(entry, 2500),
            scalars: AdamwScalars::new(1e-3, 0.9, 0.999, 1e-8, 0.01, 3, 1.0),
        },
    };
    plan(entry, &s)
}
