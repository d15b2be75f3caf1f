//! The checks of the resolved knobs ([`Knobs`]), before they become an [`super::Algorithm`]: one per key, each with its own message naming the key
//! and the accepted range, including the combinations that make no sense (a lower bound for a
//! correction without one, a token-level correction under GSPO, a RED-Drop rule without RED-Drop).

use super::{Baseline, KeepMask, Knobs, PolicyLoss, RedDropRule};
use crate::error::{AlgoError, Result};

/// The largest magnitude of a real-valued `[algorithm]` knob (coefficients, clips, caps,
/// temperatures, thresholds): every default and published setting is within 1e3, and beyond 1e6
/// a knob only turns into overflow or an effective "off" that unsetting it says plainly.
pub const MAX_MAGNITUDE: f64 = 1e6;

fn bad(key: &'static str, value: impl std::fmt::Display, why: &str) -> AlgoError {
    AlgoError::InvalidConfig {
        key,
        value: value.to_string(),
        why: why.to_string(),
    }
}

/// `v` is finite, in [0, 1e6].
fn finite_nonneg(key: &'static str, v: f64) -> Result<()> {
    if v.is_finite() && (0.0..=MAX_MAGNITUDE).contains(&v) {
        Ok(())
    } else {
        Err(bad(key, v, "must be finite and >= 0, at most 1e6"))
    }
}

/// `v` is finite, in (0, 1e6].
fn positive(key: &'static str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 && v <= MAX_MAGNITUDE {
        Ok(())
    } else {
        Err(bad(key, v, "must be finite and > 0, at most 1e6"))
    }
}

/// `v` is finite, in [-1e6, 1e6].
fn bounded(key: &'static str, v: f64) -> Result<()> {
    if v.is_finite() && v.abs() <= MAX_MAGNITUDE {
        Ok(())
    } else {
        Err(bad(key, v, "must be finite, in [-1e6, 1e6]"))
    }
}

impl Knobs {
    /// The named checks, in the order their keys' errors are reported (the first failing one is
    /// the error).
    pub(crate) fn validate(&self) -> Result<()> {
        self.check_advantage()?;
        self.check_policy()?;
        finite_nonneg("tau", self.tau)?;
        positive("log_ratio_clamp", self.log_ratio_clamp)?;
        self.check_mismatch()?;
        if let Some(d) = self.opsm_delta {
            finite_nonneg("opsm_delta", d)?;
        }
        finite_nonneg("kl_coef", self.kl_coef)?;
        bounded("entropy_coef", self.entropy_coef)?;
        self.check_overlong()?;
        self.check_red_drop()
    }

    /// The advantage's numbers: ε, δ and the log-mean-exp temperature.
    fn check_advantage(&self) -> Result<()> {
        finite_nonneg("std_eps", self.std_eps)?;
        bounded("baseline_shift", self.baseline_shift)?;
        positive("lme_temperature", self.lme_temperature)
    }

    /// The policy loss's knobs, each checked only where the loss reads it: CISPO reads ε_high
    /// alone (its cap 1 + ε_high may be any value above 1: TRL's recommended `epsilon_high = 5`
    /// is clip_high = 4), PPO and GSPO ε_low and ε_high, and only REC's ring keep-mask ε′_low and
    /// ε′_high (its bounds tie them to ε_low and ε_high). Then dual-clip, the IS cap and the
    /// RED-Weight temperature.
    fn check_policy(&self) -> Result<()> {
        if self.loss.reads("clip_low")
            && !(self.clip_low.is_finite() && (0.0..1.0).contains(&self.clip_low))
        {
            return Err(bad(
                "clip_low",
                self.clip_low,
                "must be in [0, 1) so that 1 - clip_low > 0",
            ));
        }
        if self.loss.reads("clip_high") {
            finite_nonneg("clip_high", self.clip_high)?;
        }
        if self.loss == PolicyLoss::Rec && self.keep_mask == KeepMask::Ring {
            self.check_ring()?;
        }
        if let Some(c) = self.dual_clip {
            if !(c.is_finite() && c > 1.0 && c <= MAX_MAGNITUDE) {
                return Err(bad(
                    "dual_clip",
                    c,
                    "must be finite and > 1, at most 1e6 (typical: 3); unset it to disable",
                ));
            }
        }
        if let Some(c) = self.is_cap {
            positive("is_cap", c)?;
        }
        positive("adv_temperature", self.adv_temperature)
    }

    /// REC's ring keep-mask: ε_low ≤ ε′_low ≤ 1 and ε′_high ≥ ε_high.
    fn check_ring(&self) -> Result<()> {
        if !(self.clip_low_prime >= self.clip_low && self.clip_low_prime <= 1.0) {
            return Err(bad(
                "clip_low_prime",
                self.clip_low_prime,
                &format!(
                    "must be in [clip_low = {}, 1] (ring keep-mask)",
                    self.clip_low
                ),
            ));
        }
        if !(self.clip_high_prime.is_finite() && self.clip_high_prime >= self.clip_high) {
            return Err(bad(
                "clip_high_prime",
                self.clip_high_prime,
                &format!(
                    "must be finite and >= clip_high = {} (ring keep-mask)",
                    self.clip_high
                ),
            ));
        }
        Ok(())
    }

    /// The mismatch correction's bounds: C > 0, lo only for a correction with a lower bound and
    /// in (0, C], C ≥ 1 when lo is 1/C, τ ≥ 0, and no token-level correction under GSPO.
    fn check_mismatch(&self) -> Result<()> {
        positive("mismatch_cap", self.mismatch_cap)?;
        let mc = self.mismatch_correction;
        if let Some(lo) = self.mismatch_low {
            if !mc.has_lower_bound() {
                return Err(bad(
                    "mismatch_low",
                    lo,
                    "only token-mask, sequence-mask, geometric-mask and icepop have a lower bound; \
                     remove it, or choose one of those as mismatch_correction",
                ));
            }
            positive("mismatch_low", lo)?;
            if lo > self.mismatch_cap {
                return Err(bad(
                    "mismatch_low",
                    lo,
                    &format!(
                        "must be <= mismatch_cap = {} (the kept ratios are [mismatch_low, mismatch_cap])",
                        self.mismatch_cap
                    ),
                ));
            }
        } else if mc.has_lower_bound() && self.mismatch_cap < 1.0 {
            return Err(bad(
                "mismatch_cap",
                self.mismatch_cap,
                "must be >= 1 when mismatch_low is unset (the kept ratios are then [1/C, C])",
            ));
        }
        finite_nonneg("mismatch_k3_threshold", self.mismatch_k3_threshold)?;
        if mc.token_level() && self.loss == PolicyLoss::Gspo {
            return Err(bad(
                "mismatch_correction",
                "token-level",
                "gspo's sequence ratio averages over the completion mask, which a token weight would \
                 distort: use a sequence or geometric correction, or sequence-k3-mask",
            ));
        }
        Ok(())
    }

    /// The soft overlong penalty's buffer in (0, 1] and its factor ≥ 0.
    fn check_overlong(&self) -> Result<()> {
        if !(self.overlong_buffer_frac > 0.0 && self.overlong_buffer_frac <= 1.0) {
            return Err(bad(
                "overlong_buffer_frac",
                self.overlong_buffer_frac,
                "must be in (0, 1]",
            ));
        }
        finite_nonneg("overlong_penalty_factor", self.overlong_penalty_factor)
    }

    /// RED-Drop's rule only with RED-Drop, and RED-Drop only with the mean baseline.
    fn check_red_drop(&self) -> Result<()> {
        if !self.red_drop && self.red_drop_rule != RedDropRule::Surplus {
            return Err(bad(
                "red_drop_rule",
                "bernoulli",
                "it chooses RED-Drop's dropped rows: set red_drop = true, or remove it",
            ));
        }
        if self.red_drop && self.baseline != Baseline::Mean {
            return Err(bad(
                "red_drop",
                true,
                "RED-Drop recomputes the group mean on the kept rows: it needs `baseline = \"mean\"`",
            ));
        }
        Ok(())
    }
}
