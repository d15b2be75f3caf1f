//! Loss diagnostics: sums that accumulate over micro-batches (and updates), then finalise to DESIGN §10
//! metric values.

use crate::advantage::AdvantageStats;

/// Additive sums behind the loss metrics of one or more micro-batches. Counts are in completion tokens
/// of rows that are in the normaliser ("trained tokens") unless said otherwise. Merge with
/// [`LossStats::merge`]; finish with [`LossStats::finalise`].
#[derive(Debug, Clone, PartialEq)]
pub struct LossStats {
    /// Σ of the scalar losses returned (each already normalised), i.e. the update loss.
    pub loss: f64,
    /// All completion tokens (Σ mask), trained or not.
    pub tokens_total: f64,
    /// Trained tokens.
    pub tokens: f64,
    /// Trained tokens with A ≠ 0 whose PG term the clip or keep-mask zeroed, with ρ̄ < 1.
    pub clipped_low: f64,
    /// Same with ρ̄ ≥ 1 (includes dual-clipped tokens). CISPO zeroes nothing: it counts here the tokens
    /// whose IS weight was capped at 1 + ε_high (their gradient is scaled, not zeroed).
    pub clipped_high: f64,
    /// Trained tokens with A > 0.
    pub pos_tokens: f64,
    /// Of those, clipped (zeroed).
    pub clipped_pos: f64,
    /// Trained tokens with A < 0.
    pub neg_tokens: f64,
    /// Of those, clipped (zeroed).
    pub clipped_neg: f64,
    /// Σ ρ̄ over trained tokens (ρ̄ = exp(clamped ℓ − ℓ_old), before any truncated-IS cap).
    pub ratio_sum: f64,
    /// Σ ρ̄².
    pub ratio_sq_sum: f64,
    /// min ρ̄ (+∞ when empty).
    pub ratio_min: f64,
    /// max ρ̄ (−∞ when empty).
    pub ratio_max: f64,
    /// Σ (ρ̄ − 1 − log ρ̄): k3 estimate of KL(π_old‖π_θ) on behaviour samples.
    pub kl_behaviour_sum: f64,
    /// Σ of the configured KL-to-reference estimate (unweighted), over trained tokens.
    pub kl_ref_sum: f64,
    /// Trained tokens that had reference log-probs.
    pub kl_ref_tokens: f64,
    /// Σ per-token entropy (nats).
    pub entropy_sum: f64,
    /// Trained tokens that had entropies.
    pub entropy_tokens: f64,
}

impl Default for LossStats {
    fn default() -> Self {
        LossStats {
            loss: 0.0,
            tokens_total: 0.0,
            tokens: 0.0,
            clipped_low: 0.0,
            clipped_high: 0.0,
            pos_tokens: 0.0,
            clipped_pos: 0.0,
            neg_tokens: 0.0,
            clipped_neg: 0.0,
            ratio_sum: 0.0,
            ratio_sq_sum: 0.0,
            ratio_min: f64::INFINITY,
            ratio_max: f64::NEG_INFINITY,
            kl_behaviour_sum: 0.0,
            kl_ref_sum: 0.0,
            kl_ref_tokens: 0.0,
            entropy_sum: 0.0,
            entropy_tokens: 0.0,
        }
    }
}

/// Finalised loss metrics; `None` where undefined (DESIGN §10: undefined values are null).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LossMetrics {
    /// `loss`: the summed (normalised) loss.
    pub loss: f64,
    /// `clip_frac`: share of trained tokens whose PG term the clip or keep-mask zeroed.
    pub clip_frac: Option<f64>,
    /// `clip_frac/low`: share clipped with ρ̄ < 1.
    pub clip_frac_low: Option<f64>,
    /// `clip_frac/high`: share clipped with ρ̄ ≥ 1.
    pub clip_frac_high: Option<f64>,
    /// `clip_frac/adv_pos`: share of A > 0 tokens clipped.
    pub clip_frac_adv_pos: Option<f64>,
    /// `clip_frac/adv_neg`: share of A < 0 tokens clipped.
    pub clip_frac_adv_neg: Option<f64>,
    /// `ratio/mean`.
    pub ratio_mean: Option<f64>,
    /// `ratio/min`.
    pub ratio_min: Option<f64>,
    /// `ratio/max`.
    pub ratio_max: Option<f64>,
    /// `kl_behaviour`: mean k3 estimate of KL(π_old‖π_θ).
    pub kl_behaviour: Option<f64>,
    /// `kl_ref`: mean KL-to-reference estimate (configured estimator).
    pub kl_ref: Option<f64>,
    /// `entropy`: mean per-token entropy.
    pub entropy: Option<f64>,
    /// `ess`: normalised effective sample size of the token IS weights, (Σρ̄)²/(n·Σρ̄²) ∈ (0, 1].
    pub ess: Option<f64>,
    /// `masked_frac`: share of completion tokens outside the normaliser.
    pub masked_frac: Option<f64>,
    /// `zero_std_frac`: share of zero-variance groups (from the advantages).
    pub zero_std_frac: Option<f64>,
}

impl LossStats {
    /// Adds `other`'s sums into `self`.
    pub fn merge(&mut self, other: &LossStats) {
        self.loss += other.loss;
        self.tokens_total += other.tokens_total;
        self.tokens += other.tokens;
        self.clipped_low += other.clipped_low;
        self.clipped_high += other.clipped_high;
        self.pos_tokens += other.pos_tokens;
        self.clipped_pos += other.clipped_pos;
        self.neg_tokens += other.neg_tokens;
        self.clipped_neg += other.clipped_neg;
        self.ratio_sum += other.ratio_sum;
        self.ratio_sq_sum += other.ratio_sq_sum;
        self.ratio_min = self.ratio_min.min(other.ratio_min);
        self.ratio_max = self.ratio_max.max(other.ratio_max);
        self.kl_behaviour_sum += other.kl_behaviour_sum;
        self.kl_ref_sum += other.kl_ref_sum;
        self.kl_ref_tokens += other.kl_ref_tokens;
        self.entropy_sum += other.entropy_sum;
        self.entropy_tokens += other.entropy_tokens;
    }

    /// Metric values; `adv` supplies `zero_std_frac` when given.
    pub fn finalise(&self, adv: Option<&AdvantageStats>) -> LossMetrics {
        let frac = |num: f64, den: f64| (den > 0.0).then(|| num / den);
        let n = self.tokens;
        LossMetrics {
            loss: self.loss,
            clip_frac: frac(self.clipped_low + self.clipped_high, n),
            clip_frac_low: frac(self.clipped_low, n),
            clip_frac_high: frac(self.clipped_high, n),
            clip_frac_adv_pos: frac(self.clipped_pos, self.pos_tokens),
            clip_frac_adv_neg: frac(self.clipped_neg, self.neg_tokens),
            ratio_mean: frac(self.ratio_sum, n),
            ratio_min: (n > 0.0).then_some(self.ratio_min),
            ratio_max: (n > 0.0).then_some(self.ratio_max),
            kl_behaviour: frac(self.kl_behaviour_sum, n),
            kl_ref: frac(self.kl_ref_sum, self.kl_ref_tokens),
            entropy: frac(self.entropy_sum, self.entropy_tokens),
            ess: frac(self.ratio_sum * self.ratio_sum, n * self.ratio_sq_sum),
            masked_frac: frac(self.tokens_total - self.tokens, self.tokens_total),
            zero_std_frac: adv.and_then(|a| a.zero_std_frac()),
        }
    }
}

impl LossMetrics {
    /// `(DESIGN §10 name, value)` pairs, ready for metrics.jsonl (`None` → null).
    pub fn pairs(&self) -> Vec<(&'static str, Option<f64>)> {
        vec![
            ("loss", Some(self.loss)),
            ("clip_frac", self.clip_frac),
            ("clip_frac/low", self.clip_frac_low),
            ("clip_frac/high", self.clip_frac_high),
            ("clip_frac/adv_pos", self.clip_frac_adv_pos),
            ("clip_frac/adv_neg", self.clip_frac_adv_neg),
            ("ratio/mean", self.ratio_mean),
            ("ratio/min", self.ratio_min),
            ("ratio/max", self.ratio_max),
            ("kl_behaviour", self.kl_behaviour),
            ("kl_ref", self.kl_ref),
            ("entropy", self.entropy),
            ("ess", self.ess),
            ("masked_frac", self.masked_frac),
            ("zero_std_frac", self.zero_std_frac),
        ]
    }
}
