//! Per-token policy losses, KL and entropy terms, aggregated with the update normaliser.
//!
//! Notation (DESIGN.md section 2): ℓ = log π_θ(token) (with gradient), ℓ_old = behaviour log-prob (the ratio's
//! denominator, always: the weights that *sampled* the token), x = clamp(ℓ − ℓ_old, ±c) with
//! c = `log_ratio_clamp`, ρ = exp(x), ρ̄ = detached ρ, A = advantage of the row, ε_l/ε_h = clip range.
//! With a truncated-IS cap C, ρ is replaced by ρ·sg(min(1, C/ρ)) (value min(ρ, C), gradient direction
//! kept) wherever it weights the gradient.
//!
//! Per-token PG term L_it (to be minimised):
//!
//! ```text
//! ppo        −min(ρA, clip(ρ, 1−ε_l, 1+ε_h)A); dual-clip c: for A < 0, min(that, −cA)
//! rec        −A′·k·ℓ,  k = keep-mask(ρ̄ or s̄), A′ ∈ {A, A·min(ρ̄,C), A·s̄, A·exp(A/T)}
//! gspo       −min(sA, clip(s, 1−ε_l, 1+ε_h)A) per row, s = exp(Σ_t m·x / Σ_t m), same value on its tokens
//! cispo      −sg(min(ρ, 1+ε_h))·A·ℓ
//! reinforce  −A·ℓ
//! ```
//!
//! With `opsm_delta` = δ the PG term of a row with A < 0 and mean_t(ℓ_old − ℓ) > δ is removed
//! (off-policy sequence masking, DeepSeek-V3.2 arXiv 2512.02556 Eq. 9, as TRL applies it).
//!
//! plus the regulariser (OPMD +τx², AsymRE −τℓ), β·k(ℓ_ref − ℓ) (optionally ·ρ̄), and −c_H·H. The
//! scalar is Σ_i w_i Σ_t m_it L_it with w from [`crate::UpdateNormaliser`]; the diagnostics split
//! it into the PG term's part (`pg_loss`, verl's `actor/pg_loss`) and the rest (`reg_loss`: the
//! regulariser, KL penalty and entropy bonus), aggregated alike. Clip decisions are
//! taken on detached values and applied with `where_cond`, so a clipped token has exactly zero
//! PG gradient and ties never split a gradient.
//!
//! Numerical safety: padding positions (mask 0) are replaced by 0 before any arithmetic, so they may
//! hold anything (even −∞); log-ratios are clamped to ±`log_ratio_clamp` (default 20, as verl) before
//! `exp`, and a clamped token gets no gradient through its ratio.

use candle_core::{DType, Tensor, D};

use crate::config::{Algorithm, Policy, RecKeep, RecScale, RegTerm};
use crate::error::{AlgoError, Result};
use crate::kl::kl_estimate;
use crate::metrics::{LossStats, RATIO_BUCKETS, RATIO_HIST_EDGES};

/// Inputs of one micro-batch. All per-token tensors are `[B, T]` (B rows of the micro-batch, T padded
/// completion length), on `logp`'s device (any float dtype; they are cast to the compute dtype);
/// padding is wherever `mask` is 0.
#[derive(Debug, Clone, Copy)]
pub struct LossInputs<'a> {
    /// ℓ: log π_θ of each completion token, with gradient (nats), `[B, T]`.
    pub logp: &'a Tensor,
    /// ℓ_old: behaviour log-probs recorded at sampling (nats), `[B, T]`. No gradient is taken.
    pub logp_behaviour: &'a Tensor,
    /// ℓ_ref: reference-policy log-probs, `[B, T]`; required when `kl_coef` ≠ 0.
    pub logp_ref: Option<&'a Tensor>,
    /// Per-token entropy H_t of π_θ (nats, with gradient), `[B, T]`; required when `entropy_coef` ≠ 0,
    /// else only reported.
    pub entropy: Option<&'a Tensor>,
    /// Completion mask, 1 for completion tokens (a generated EOS included), 0 for padding, `[B, T]`.
    pub mask: &'a Tensor,
    /// Per-token importance weights c_t ≥ 0 multiplying every loss term of the token, `[B, T]`
    /// (the trainer's sampler/trainer mismatch correction, [`crate::mismatch`]); `None` = 1. They
    /// change the loss only: the normaliser, the sequence ratios and every diagnostic (ratio
    /// statistics, histogram, clip fractions) still see the whole completion mask.
    pub is_weights: Option<&'a Tensor>,
    /// Per-row advantages A, `[B]` (gradients flow into it if it is a variable).
    pub advantages: &'a Tensor,
    /// Per-row normaliser weights w_i, `[B]`, from [`crate::UpdateNormaliser::rows`].
    pub row_weights: &'a [f64],
}

/// The micro-batch loss Σ_i w_i Σ_t m_it L_it (a scalar tensor: f64 for f64 inputs, else f32, since the
/// loss is computed in f32 at least) and its diagnostics.
///
/// Call `backward()` on each micro-batch loss and accumulate: the sum over micro-batches is the
/// full-update gradient (see [`crate::normaliser`]).
///
/// # Errors
/// [`AlgoError::Shape`] when a tensor's shape differs from `logp`'s `[B, T]` (or `[B]` for advantages,
/// `row_weights.len()` ≠ B); [`AlgoError::Input`] when `kl_coef` ≠ 0 without `logp_ref` or
/// `entropy_coef` ≠ 0 without `entropy`; candle errors.
// One function so that it reads as the module docs' formula top to bottom (input checks, ratio,
// PG term, regulariser, KL, entropy, aggregation).
pub fn policy_loss(alg: &Algorithm, inp: &LossInputs) -> Result<(Tensor, LossStats)> {
    const OP: &str = "policy_loss";
    let (b, t) = inp.logp.dims2()?;
    let dt = inp.logp.dtype();
    check_shape(OP, "logp_behaviour", inp.logp_behaviour, &[b, t])?;
    check_shape(OP, "mask", inp.mask, &[b, t])?;
    check_shape(OP, "advantages", inp.advantages, &[b])?;
    if let Some(r) = inp.logp_ref {
        check_shape(OP, "logp_ref", r, &[b, t])?;
    }
    if let Some(e) = inp.entropy {
        check_shape(OP, "entropy", e, &[b, t])?;
    }
    if let Some(w) = inp.is_weights {
        check_shape(OP, "is_weights", w, &[b, t])?;
    }
    if inp.row_weights.len() != b {
        return Err(AlgoError::Shape {
            op: OP,
            what: "row_weights",
            got: vec![inp.row_weights.len()],
            expected: vec![b],
        });
    }
    if alg.needs_reference() && inp.logp_ref.is_none() {
        return Err(AlgoError::Input {
            op: OP,
            why: format!(
                "kl_coef = {} needs reference log-probs (logp_ref)",
                alg.kl.coef
            ),
        });
    }
    if alg.needs_entropy() && inp.entropy.is_none() {
        return Err(AlgoError::Input {
            op: OP,
            why: format!(
                "entropy_coef = {} needs per-token entropies",
                alg.entropy_coef
            ),
        });
    }

    let dev = inp.logp.device();
    // Compute in f32 at least: bf16/f16 sums over long completions are inexact (bf16 counts stop being
    // exact above 256). `to_dtype` is differentiable, so gradients reach a bf16 ℓ unchanged in shape.
    let dt = match dt {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let mask = inp.mask.to_dtype(dt)?;
    let keep_pos = mask.ne(0.0)?; // u8 [B, T]
    let zeros = mask.zeros_like()?;
    let clean =
        |x: &Tensor| -> Result<Tensor> { Ok(keep_pos.where_cond(&x.to_dtype(dt)?, &zeros)?) };
    let logp = clean(inp.logp)?;
    let logp_old = clean(inp.logp_behaviour)?.detach();
    let adv = inp
        .advantages
        .to_dtype(dt)?
        .reshape((b, 1))?
        .broadcast_as((b, t))?;
    let adv_d = adv.detach();
    let c = alg.log_ratio_clamp;

    // Token log-ratio x (clamped), ratio ρ (with grad) and ρ̄ (detached).
    let x = clamp_with_grad(&(&logp - &logp_old)?, c)?;
    let ratio = x.exp()?;
    let ratio_d = ratio.detach();

    let pos = adv_d.gt(0.0)?;
    let neg = adv_d.lt(0.0)?;
    let pg = pg_term(
        &alg.policy,
        &logp,
        &x,
        &mask,
        &adv,
        &ratio,
        &ratio_d,
        &pos,
        &neg,
    )?;

    // Off-policy sequence masking (DeepSeek-V3.2, arXiv 2512.02556 Eq. 9; TRL's
    // `get_off_policy_mask`): a row with A < 0 whose mean_t(ℓ_old − ℓ) exceeds δ loses its PG term
    // (ℓ detached, the current weights; x is 0 on padding). Its other terms and its place in the
    // normaliser stay.
    let opsm_drop = match alg.opsm_delta {
        Some(delta) => {
            let n = mask.sum_keepdim(D::Minus1)?.clamp(1.0, f64::INFINITY)?;
            let kl = (x.detach().neg()?.sum_keepdim(D::Minus1)? / n)?;
            let far = kl.gt(delta)?.to_dtype(dt)?.broadcast_as((b, t))?;
            Some((far * neg.to_dtype(dt)?)?)
        }
        None => None,
    };
    let pg_loss = match &opsm_drop {
        Some(d) => (pg.loss * (d.ones_like()? - d)?)?,
        None => pg.loss,
    };

    // Regulariser, KL, entropy. `reg` is what they add to the PG term, detached, for the
    // `reg_loss` diagnostic (the loss itself is summed as before, term by term).
    let pg_d = pg_loss.detach();
    let mut reg: Option<Tensor> = None;
    let mut add_reg = |term: &Tensor| -> Result<()> {
        let term = term.detach();
        reg = Some(match reg.take() {
            Some(r) => (r + term)?,
            None => term,
        });
        Ok(())
    };
    let mut per_token = pg_loss;
    // Paper B's REP regularisers (arXiv 2509.24203; DESIGN.md section 4): OPMD +τ·(ℓ − ℓ_old)² (Kimi k1.5,
    // arXiv 2501.12599, with Trinity-RFT's convention), AsymRE −τ·ℓ.
    match alg.regulariser {
        RegTerm::None => {}
        RegTerm::Opmd { tau } => {
            let term = (x.sqr()? * tau)?;
            add_reg(&term)?;
            per_token = (per_token + term)?;
        }
        RegTerm::Asymre { tau } => {
            let term = (&logp * tau)?;
            add_reg(&term.neg()?)?;
            per_token = (per_token - term)?;
        }
    }
    // β·k(ℓ_ref − ℓ) with k1/k2/k3 of DESIGN.md section 4 (k3: arXiv 2402.03300 Eq. 4); ·ρ̄ is the off-policy
    // "corrected k3" of DeepSeek-V3.2 (DESIGN.md section 4).
    let mut kl_ref_value = None;
    if let Some(lr) = inp.logp_ref {
        let xr = clamp_with_grad(&(clean(lr)?.detach() - &logp)?, c)?;
        let k = kl_estimate(&xr, alg.kl.estimator)?;
        kl_ref_value = Some(k.detach());
        if alg.kl.coef != 0.0 {
            let k = if alg.kl.ratio_weighted {
                (k * &ratio_d)?
            } else {
                k
            };
            let term = (k * alg.kl.coef)?;
            add_reg(&term)?;
            per_token = (per_token + term)?;
        }
    }
    let entropy = inp.entropy.map(&clean).transpose()?;
    if let (Some(h), true) = (&entropy, alg.entropy_coef != 0.0) {
        let term = (h * alg.entropy_coef)?;
        add_reg(&term.neg()?)?;
        per_token = (per_token - term)?;
    }

    // Aggregate: Σ_i w_i Σ_t m_it L_it, w fixed per update before micro-batching (DESIGN.md section 4).
    let w = Tensor::from_vec(inp.row_weights.to_vec(), b, dev)?.to_dtype(dt)?;
    let weighted_mask = match inp.is_weights {
        Some(c) => (&mask * c.to_dtype(dt)?.detach())?,
        None => mask.clone(),
    };
    let aggregate = |x: &Tensor| -> Result<Tensor> {
        Ok(((x * &weighted_mask)?.sum(D::Minus1)? * &w)?.sum_all()?)
    };
    let loss = aggregate(&per_token)?;
    let pg_part = aggregate(&pg_d)?;
    let reg_part = match &reg {
        Some(r) => aggregate(r)?,
        None => pg_part.zeros_like()?,
    };

    let stats = diagnostics(&Diag {
        mask: &mask,
        w: &w,
        ratio_d: &ratio_d,
        x_d: &x.detach(),
        pos: &pos,
        neg: &neg,
        clipped_low: &pg.clipped_low,
        clipped_high: &pg.clipped_high,
        kl_ref: kl_ref_value.as_ref(),
        entropy: entropy.as_ref().map(|e| e.detach()).as_ref(),
        opsm_drop: opsm_drop.as_ref(),
        loss: &loss,
        pg_loss: &pg_part,
        reg_loss: &reg_part,
        dual_clipped: pg.dual_clipped.as_ref(),
    })?;
    Ok((loss, stats))
}

/// The PG term and which tokens it zeroed (f 0/1 masks, `[B, T]`, detached).
struct Pg {
    loss: Tensor,
    clipped_low: Tensor,
    clipped_high: Tensor,
    /// With a dual clip (PPO, GSPO): the tokens whose term the dual-clip bound −c·A set (A < 0,
    /// ratio > c; counted in `clipped_high` too). `None` without a dual clip.
    dual_clipped: Option<Tensor>,
}

#[allow(clippy::too_many_arguments)]
// One match arm per loss of the module docs' table, each with its paper and reading only its own
// parameters; splitting per arm would scatter the shared clip and keep-mask inputs. `ratio` is ρ
// with its gradient, uncapped; each arm applies its own truncated-IS cap (value min(ρ, C),
// gradient through ρ).
fn pg_term(
    policy: &Policy,
    logp: &Tensor,
    x: &Tensor,
    mask: &Tensor,
    adv: &Tensor,
    ratio: &Tensor,
    ratio_d: &Tensor,
    pos: &Tensor,
    neg: &Tensor,
) -> Result<Pg> {
    let dt = logp.dtype();
    let zeros = logp.zeros_like()?;
    let f = |m: &Tensor| -> Result<Tensor> { Ok(m.to_dtype(dt)?) };
    match *policy {
        // PPO clipped surrogate (Schulman et al., arXiv 1707.06347 Eq. 7) per token with ρ against
        // the behaviour policy: GRPO (arXiv 2402.03300 Eq. 3) and paper A's off-policy GRPO
        // (arXiv 2505.22257, ρ = π_θ/α with α the stale sampler; DESIGN.md section 1).
        Policy::Ppo(s) => {
            let ratio_w = cap_ratio(ratio, s.is_cap)?;
            let ratio_wd = ratio_w.detach();
            let (lo, hi) = (1.0 - s.clip_low, 1.0 + s.clip_high);
            let (loss, cl, ch, dual) =
                clipped_surrogate(adv, &ratio_w, &ratio_wd, pos, neg, lo, hi, s.dual_clip)?;
            Ok(Pg {
                loss,
                clipped_low: cl,
                clipped_high: ch,
                dual_clipped: dual,
            })
        }
        // GSPO (arXiv 2507.18071, its sequence-level objective): the clipped surrogate on the
        // length-normalised sequence ratio s, gradient through s.
        Policy::Gspo(g) => {
            // s = exp(Σ_t m·x / Σ_t m) per row (x is already clamped and 0 on padding).
            let (b, t) = logp.dims2()?;
            let (lo, hi) = (1.0 - g.clip_low, 1.0 + g.clip_high);
            let n = mask
                .sum_keepdim(D::Minus1)?
                .clamp(1.0, f64::INFINITY)?
                .detach();
            let s = (x.sum_keepdim(D::Minus1)? / n)?.exp()?;
            let s = cap_ratio(&s, g.is_cap)?.broadcast_as((b, t))?;
            let sd = s.detach();
            let (loss, cl, ch, dual) =
                clipped_surrogate(adv, &s, &sd, pos, neg, lo, hi, g.dual_clip)?;
            Ok(Pg {
                loss,
                clipped_low: cl,
                clipped_high: ch,
                dual_clipped: dual,
            })
        }
        // CISPO (MiniMax-M1, arXiv 2506.13585): −sg(min(ρ, 1+ε_h))·A·ℓ, the IS weight clipped and
        // detached so every token keeps a gradient.
        Policy::Cispo(c) => {
            let ratio_wd = cap_ratio(ratio, c.is_cap)?.detach();
            let hi = 1.0 + c.clip_high;
            let w = ratio_wd.clamp(f64::NEG_INFINITY, hi)?;
            let capped = f(&ratio_wd.gt(hi)?)?;
            let loss = ((w * adv)? * logp)?.neg()?;
            Ok(Pg {
                loss,
                clipped_low: zeros,
                clipped_high: capped,
                dual_clipped: None,
            })
        }
        // Group-relative REINFORCE (paper B, arXiv 2509.24203): −A·ℓ.
        Policy::Reinforce => Ok(Pg {
            loss: (adv * logp)?.neg()?,
            clipped_low: zeros.clone(),
            clipped_high: zeros,
            dual_clipped: None,
        }),
        // Paper B's REC family (arXiv 2509.24203; DESIGN.md section 1): −A′·k·ℓ with keep-mask k from the
        // detached ratio and weight A′ (reference: Trinity-RFT rec_policy_loss.py).
        Policy::Rec(r) => {
            let (b, t) = logp.dims2()?;
            let (lo, hi) = (1.0 - r.clip_low, 1.0 + r.clip_high);
            // Detached sequence ratio s̄ (uncapped), for gspo-one-side and seq-is.
            let n = mask.sum_keepdim(D::Minus1)?.clamp(1.0, f64::INFINITY)?;
            let seq_ratio = (x.detach().sum_keepdim(D::Minus1)? / n)?
                .exp()?
                .broadcast_as((b, t))?;
            // The keep-mask reads the uncapped ratio; only the IS weights are capped.
            let keep_ratio = match r.keep {
                RecKeep::GspoOneSide => seq_ratio.clone(),
                _ => ratio_d.clone(),
            };
            let adv_zero = f(&pos.eq(0u8)?.mul(&neg.eq(0u8)?)?)?; // A == 0
            let (posf, negf) = (&(f(pos)? + &adv_zero)?, &(f(neg)? + &adv_zero)?); // A ≥ 0, A ≤ 0
            let le_hi = f(&keep_ratio.le(hi)?)?;
            let ge_lo = f(&keep_ratio.ge(lo)?)?;
            let one_side = || -> Result<Tensor> {
                Ok(((posf * &le_hi)? + (negf * &ge_lo)?)?.clamp(0.0, 1.0)?)
            };
            // Keep-masks (paper B; DESIGN.md section 1): one-side is PPO's own pattern, two-side keeps
            // 1−ε_l ≤ ρ̄ ≤ 1+ε_h, ring adds the far tails beyond ε′.
            let keep = match r.keep {
                RecKeep::None => logp.ones_like()?,
                RecKeep::OneSide | RecKeep::GspoOneSide => one_side()?,
                RecKeep::TwoSide => (&le_hi * &ge_lo)?,
                RecKeep::Ring {
                    clip_low_prime,
                    clip_high_prime,
                } => {
                    let far_lo = f(&keep_ratio.le(1.0 - clip_low_prime)?)?;
                    let far_hi = f(&keep_ratio.ge(1.0 + clip_high_prime)?)?;
                    let two = (&le_hi * &ge_lo)?;
                    ((two + (posf * far_lo)?)? + (negf * far_hi)?)?.clamp(0.0, 1.0)?
                }
            };
            // A′ (paper B): A, A·ρ̄ (IS), A·s̄ (sequence IS), A·exp(A/T) (RED-Weight).
            let weight = match r.scale {
                RecScale::None => adv.clone(),
                RecScale::Is => (adv * cap_ratio(ratio, r.is_cap)?.detach())?,
                RecScale::SeqIs => (adv * cap_ratio(&seq_ratio, r.is_cap)?)?,
                RecScale::AdvantageExp { temperature } => (adv * (adv / temperature)?.exp()?)?,
            };
            let loss = ((weight * &keep)? * logp)?.neg()?;
            // Zeroed tokens, by side of the ratio; tokens with A = 0 carry no PG term and are not counted.
            let dropped = ((keep.ones_like()? - &keep)? * (f(pos)? + f(neg)?)?)?;
            let below = f(&keep_ratio.lt(1.0)?)?;
            let clipped_low = (&dropped * &below)?;
            let clipped_high = (&dropped - &clipped_low)?;
            Ok(Pg {
                loss,
                clipped_low,
                clipped_high,
                dual_clipped: None,
            })
        }
    }
}

/// −min(ρA, clip(ρ, lo, hi)A) with optional dual-clip, on any ratio tensor (token or broadcast
/// sequence ratio). Returns the loss, the low/high zeroed masks (f, detached) and, with a dual
/// clip, the mask of the tokens it bounded (f, detached; also in the high mask).
#[allow(clippy::too_many_arguments)]
fn clipped_surrogate(
    adv: &Tensor,
    ratio: &Tensor,
    ratio_d: &Tensor,
    pos: &Tensor,
    neg: &Tensor,
    lo: f64,
    hi: f64,
    dual_clip: Option<f64>,
) -> Result<(Tensor, Tensor, Tensor, Option<Tensor>)> {
    let dt = ratio.dtype();
    // Zeroed when the clipped branch is the (strictly) smaller objective.
    let clip_hi = pos.mul(&ratio_d.gt(hi)?)?;
    let clip_lo = neg.mul(&ratio_d.lt(lo)?)?;
    let unclipped = (adv * ratio)?.neg()?;
    let clipped_value = (adv * ratio_d.clamp(lo, hi)?)?.neg()?; // no ρ gradient; A's kept
    let any_clip = clip_hi.add(&clip_lo)?; // disjoint (A > 0 vs A < 0)
    let mut loss = any_clip.where_cond(&clipped_value, &unclipped)?;
    let mut high = clip_hi.to_dtype(dt)?;
    let mut dual_mask = None;
    // Dual-clip (Ye et al., arXiv 1912.09729): for A < 0 the loss is at most −c·A.
    if let Some(cd) = dual_clip {
        // A < 0 and ρ > c: the loss −ρA exceeds −cA; dual-clip caps it at the constant −cA.
        let dual = neg.mul(&ratio_d.gt(cd)?)?;
        let capped = (adv * cd)?.neg()?;
        loss = dual.where_cond(&capped, &loss)?;
        let dual = dual.to_dtype(dt)?;
        high = (high + &dual)?;
        dual_mask = Some(dual);
    }
    Ok((loss, clip_lo.to_dtype(dt)?, high, dual_mask))
}

/// x clamped to [−c, c]; gradient 1 inside, 0 where clamped.
fn clamp_with_grad(x: &Tensor, c: f64) -> Result<Tensor> {
    let inside = x.abs()?.le(c)?;
    let clamped = x.detach().clamp(-c, c)?;
    Ok(inside.where_cond(x, &clamped)?)
}

/// ρ·sg(min(1, C/ρ)): value min(ρ, C), gradient of ρ scaled by the same factor: truncated importance
/// sampling (DESIGN.md section 3 "train/sampler mismatch"; `algorithm.is_cap`).
fn cap_ratio(ratio: &Tensor, cap: Option<f64>) -> Result<Tensor> {
    match cap {
        None => Ok(ratio.clone()),
        Some(cap) => {
            let factor = ratio
                .detach()
                .recip()?
                .affine(cap, 0.0)?
                .clamp(f64::NEG_INFINITY, 1.0)?;
            Ok((ratio * factor)?)
        }
    }
}

fn check_shape(op: &'static str, what: &'static str, t: &Tensor, expected: &[usize]) -> Result<()> {
    if t.dims() != expected {
        return Err(AlgoError::Shape {
            op,
            what,
            got: t.dims().to_vec(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}

struct Diag<'a> {
    mask: &'a Tensor,
    w: &'a Tensor,
    ratio_d: &'a Tensor,
    x_d: &'a Tensor,
    pos: &'a Tensor,
    neg: &'a Tensor,
    clipped_low: &'a Tensor,
    clipped_high: &'a Tensor,
    kl_ref: Option<&'a Tensor>,
    entropy: Option<&'a Tensor>,
    opsm_drop: Option<&'a Tensor>,
    loss: &'a Tensor,
    /// The PG term's part of `loss` (detached scalar).
    pg_loss: &'a Tensor,
    /// The regulariser's, KL penalty's and entropy bonus's part of `loss` (detached scalar).
    reg_loss: &'a Tensor,
    /// Tokens the dual clip bounded (`None`: no dual clip).
    dual_clipped: Option<&'a Tensor>,
}

/// Declares [`Sums`] from one list of named fields, so that the stacking order and the read-back
/// order are the same list by construction (no field is read by position).
macro_rules! named_sums {
    ($(#[$doc:meta])* struct $name:ident { $($(#[$fdoc:meta])* $field:ident,)* [$(#[$hdoc:meta])* $hist:ident] }) => {
        $(#[$doc])*
        struct $name<T> {
            $($(#[$fdoc])* $field: T,)*
            $(#[$hdoc])*
            $hist: [T; RATIO_HIST_EDGES.len()],
        }

        impl<T> $name<T> {
            /// Every field, named ones in declaration order, then the histogram's.
            fn into_vec(self) -> Vec<T> {
                let mut v = vec![$(self.$field),*];
                v.extend(self.$hist);
                v
            }

            /// The record whose [`Self::into_vec`] is `v`; `None` when `v` has the wrong length.
            fn from_vec(v: Vec<T>) -> Option<Self> {
                let mut it = v.into_iter();
                let rec = $name {
                    $($field: it.next()?,)*
                    $hist: it.collect::<Vec<T>>().try_into().ok()?,
                };
                Some(rec)
            }
        }
    };
}

named_sums! {
    /// The diagnostic sums of one micro-batch: scalar f64 tensors on the device (`Sums<Tensor>`),
    /// stacked and copied to the host in one transfer (`Sums<f64>`). "Over trained tokens" means
    /// completion tokens of rows in the normaliser.
    struct Sums {
        /// The detached micro-batch loss.
        loss,
        /// Its PG term's part.
        pg_loss,
        /// Its regulariser's, KL penalty's and entropy bonus's part.
        reg_loss,
        /// Σ mask: every completion token, trained or not.
        tokens_total,
        /// Trained tokens.
        tokens,
        /// Trained tokens the PG term zeroed with ρ̄ < 1.
        clipped_low,
        /// Trained tokens the PG term zeroed with ρ̄ ≥ 1.
        clipped_high,
        /// Trained tokens the dual clip bounded (0 without a dual clip).
        dual_clipped,
        /// Trained tokens with A > 0.
        pos_tokens,
        /// Of those, zeroed.
        clipped_pos,
        /// Trained tokens with A < 0.
        neg_tokens,
        /// Of those, zeroed.
        clipped_neg,
        /// Σ ρ̄.
        ratio_sum,
        /// Σ ρ̄².
        ratio_sq_sum,
        /// min ρ̄ (1e30 when no token is trained).
        ratio_min,
        /// max ρ̄ (−1e30 when no token is trained).
        ratio_max,
        /// Σ (ρ̄ − 1 − log ρ̄).
        kl_behaviour_sum,
        /// Σ of the KL-to-reference estimate (0 without reference log-probs).
        kl_ref_sum,
        /// Σ entropy (0 without entropies).
        entropy_sum,
        /// Tokens OPSM removed the PG term of (0 without OPSM).
        opsm_masked_tokens,
        /// Rows with a trained token (0 without OPSM).
        opsm_rows,
        /// Rows OPSM removed the PG term of (0 without OPSM).
        opsm_masked_rows,
        [
            /// Trained tokens with log ρ̄ ≥ each of [`RATIO_HIST_EDGES`].
            ratio_at_least
        ]
    }
}

/// All sums in one device→host copy.
fn diagnostics(d: &Diag) -> Result<LossStats> {
    let dt = d.mask.dtype();
    let (b, t) = d.mask.dims2()?;
    let live =
        d.w.ne(0.0)?
            .to_dtype(dt)?
            .reshape((b, 1))?
            .broadcast_as((b, t))?;
    // Trained tokens: completion tokens (mask not 0) of rows in the normaliser.
    let support = d.mask.ne(0.0)?.to_dtype(dt)?;
    let tm = (&support * live)?;
    let s = |x: &Tensor| -> Result<Tensor> { Ok((x * &tm)?.sum_all()?.to_dtype(DType::F64)?) };
    let f64_of = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(DType::F64)?) };
    let posf = d.pos.to_dtype(dt)?;
    let negf = d.neg.to_dtype(dt)?;
    let clipped = (d.clipped_low + d.clipped_high)?;
    let big = 1e30;
    let on = tm.ne(0.0)?;
    let rmin = on
        .where_cond(d.ratio_d, &d.ratio_d.ones_like()?.affine(0.0, big)?)?
        .min_all()?;
    let rmax = on
        .where_cond(d.ratio_d, &d.ratio_d.ones_like()?.affine(0.0, -big)?)?
        .max_all()?;
    let one = tm.ones_like()?;
    let kl_b = ((d.ratio_d - 1.0)? - d.x_d)?;
    let zero = Tensor::zeros((), DType::F64, d.mask.device())?;
    let or_zero = |x: Option<&Tensor>| -> Result<Tensor> {
        Ok(x.map(&s).transpose()?.unwrap_or_else(|| zero.clone()))
    };
    // Rows with trained tokens, and (OPSM) tokens and rows it masked.
    let rows = |x: &Tensor| -> Result<Tensor> {
        Ok((x * &tm)?
            .sum(D::Minus1)?
            .gt(0.0)?
            .to_dtype(DType::F64)?
            .sum_all()?)
    };
    let on_device = Sums {
        loss: f64_of(&d.loss.detach())?,
        pg_loss: f64_of(d.pg_loss)?,
        reg_loss: f64_of(d.reg_loss)?,
        tokens_total: f64_of(&support.sum_all()?)?,
        tokens: s(&one)?,
        clipped_low: s(d.clipped_low)?,
        clipped_high: s(d.clipped_high)?,
        dual_clipped: or_zero(d.dual_clipped)?,
        pos_tokens: s(&posf)?,
        clipped_pos: s(&(&clipped * &posf)?)?,
        neg_tokens: s(&negf)?,
        clipped_neg: s(&(&clipped * &negf)?)?,
        ratio_sum: s(d.ratio_d)?,
        ratio_sq_sum: s(&d.ratio_d.sqr()?)?,
        ratio_min: f64_of(&rmin)?,
        ratio_max: f64_of(&rmax)?,
        kl_behaviour_sum: s(&kl_b)?,
        kl_ref_sum: or_zero(d.kl_ref)?,
        entropy_sum: or_zero(d.entropy)?,
        opsm_masked_tokens: or_zero(d.opsm_drop)?,
        opsm_rows: match d.opsm_drop {
            Some(_) => rows(&one)?,
            None => zero.clone(),
        },
        opsm_masked_rows: match d.opsm_drop {
            Some(o) => rows(o)?,
            None => zero.clone(),
        },
        // Ratio histogram: tokens with log ρ̄ ≥ each edge.
        ratio_at_least: RATIO_HIST_EDGES
            .iter()
            .map(|&e| s(&d.x_d.ge(e)?.to_dtype(dt)?))
            .collect::<Result<Vec<_>>>()?
            .try_into()
            .expect("one sum per histogram edge"),
    };
    let host = Tensor::stack(&on_device.into_vec(), 0)?.to_vec1::<f64>()?;
    let v = Sums::from_vec(host).expect("the stacked vector has one value per field");
    let tokens = v.tokens;
    let mut opsm = crate::metrics::CorrectionCounts::default();
    if d.opsm_drop.is_some() {
        opsm.tokens = tokens;
        opsm.masked_tokens = v.opsm_masked_tokens;
        opsm.rows = v.opsm_rows;
        opsm.masked_rows = v.opsm_masked_rows;
    }
    Ok(LossStats {
        loss: v.loss,
        pg_loss: v.pg_loss,
        reg_loss: v.reg_loss,
        tokens_total: v.tokens_total,
        tokens,
        clipped_low: v.clipped_low,
        clipped_high: v.clipped_high,
        dual_clipped: v.dual_clipped,
        dual_clip_tokens: if d.dual_clipped.is_some() {
            tokens
        } else {
            0.0
        },
        pos_tokens: v.pos_tokens,
        clipped_pos: v.clipped_pos,
        neg_tokens: v.neg_tokens,
        clipped_neg: v.clipped_neg,
        ratio_sum: v.ratio_sum,
        ratio_sq_sum: v.ratio_sq_sum,
        ratio_min: if tokens > 0.0 {
            v.ratio_min
        } else {
            f64::INFINITY
        },
        ratio_max: if tokens > 0.0 {
            v.ratio_max
        } else {
            f64::NEG_INFINITY
        },
        kl_behaviour_sum: v.kl_behaviour_sum,
        kl_ref_sum: v.kl_ref_sum,
        kl_ref_tokens: if d.kl_ref.is_some() { tokens } else { 0.0 },
        entropy_sum: v.entropy_sum,
        entropy_tokens: if d.entropy.is_some() { tokens } else { 0.0 },
        ratio_hist: histogram(tokens, &v.ratio_at_least),
        mismatch: crate::metrics::CorrectionCounts::default(),
        opsm,
    })
}

/// Bucket counts of [`RATIO_HIST_EDGES`] from `tokens` and the counts of tokens at or above each
/// edge (`at_least`, non-increasing): bucket 0 is below the first edge, the last at or above the last.
fn histogram(tokens: f64, at_least: &[f64; RATIO_HIST_EDGES.len()]) -> [f64; RATIO_BUCKETS] {
    let below = std::iter::once(tokens).chain(at_least.iter().copied());
    let above = at_least.iter().copied().chain(std::iter::once(0.0));
    let mut hist = [0.0; RATIO_BUCKETS];
    for (h, (b, a)) in hist.iter_mut().zip(below.zip(above)) {
        *h = b - a;
    }
    hist
}
