//! The sampler/trainer mismatch: `algorithm.mismatch_correction` ([`MismatchCorrection`]), the
//! importance-sampling corrections it selects ([`IsCorrection`], [`correction_weights`]) and the
//! diagnostics logged per step ([`MismatchStats`]), as pure functions on per-token log-probs (nats).
//! A sampler that is not the trainer's own forward (a vLLM server, other kernels, another dtype)
//! records behaviour log-probs that differ slightly from the trainer's for the same weights; these
//! measure that gap and, when asked, correct for it under any loss.
//!
//! The ratio is ρ_mismatch = exp(ℓ_trainer − ℓ_sampler), where ℓ_trainer is the trainer's log-prob
//! of the token at the start of the step (the current weights, no gradient) and ℓ_sampler the
//! behaviour log-prob the sampler recorded. The weight of a token multiplies its loss term as a
//! constant (no gradient): Σ_i w_i Σ_t m_it c_it L_it, the normaliser unchanged. Semantics follow
//! verl's `rollout_correction`, not AReaL's decoupled objective (volcengine/verl,
//! `verl/trainer/ppo/rollout_corr_helper.py` at commit 0b4e2a81: `log_ratio = old_log_prob −
//! rollout_log_prob` at line 623, where `old_log_prob` is the actor's recomputation at the current
//! weights):
//! - truncated IS (`compute_rollout_correction_weights`, 0b4e2a81 lines 318–399): token level
//!   w_t = min(exp(clamp(log ρ_t, ±20)), C); sequence level one weight per completion,
//!   w = min(exp(clamp(Σ_t log ρ_t, ±20)), C), on all its tokens;
//! - masked IS (`compute_rollout_rejection_mask`, 0b4e2a81 lines 82–164, "token" / "sequence"):
//!   a token (or a whole completion, by its summed log-ratio) is kept (weight 1) when
//!   lo ≤ ρ ≤ hi and dropped (weight 0) otherwise; lo defaults to 1/hi (line 131);
//! - k3 KL (`compute_offpolicy_metrics`, 0b4e2a81 line 768): mean over tokens of
//!   exp(r) − r − 1 with r = ℓ_trainer − ℓ_sampler, an estimate of KL(π_sampler ‖ π_trainer).
//!
//! Stale rows: like verl (whose `old_log_prob` is recomputed at the current weights) and AReaL's
//! decoupled objective (its proximal policy), ℓ_trainer is always taken at the start of the step,
//! so for a row of staleness s > 0 the ratio covers both the kernel mismatch and the s steps of
//! policy change. The diagnostics, which measure the kernel mismatch alone, use the staleness-0 rows
//! only. Reference values worked out by hand: `tests/mismatch.rs`.

use serde::{Deserialize, Serialize};

/// Which correction the trainer applies (with `algorithm.mismatch_cap` = C).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MismatchCorrection {
    /// No correction.
    #[default]
    None,
    /// Truncated IS per token: c_t = min(ρ_t, C).
    TokenTruncate,
    /// Truncated IS per completion: c = min(∏_t ρ_t, C) on all its tokens.
    SequenceTruncate,
    /// Masked IS per token: c_t = 1 when 1/C ≤ ρ_t ≤ C, else 0.
    TokenMask,
    /// Masked IS per completion: c = 1 when 1/C ≤ ∏_t ρ_t ≤ C, else 0 (the completion is dropped).
    SequenceMask,
}

impl MismatchCorrection {
    /// Whether a correction is applied.
    pub fn is_on(self) -> bool {
        self != MismatchCorrection::None
    }

    /// Whether the correction weighs each token by its own ratio.
    pub fn token_level(self) -> bool {
        matches!(
            self,
            MismatchCorrection::TokenTruncate | MismatchCorrection::TokenMask
        )
    }
}

/// Tokens whose |log ρ| exceeds this are clamped before exponentiating (verl's SAFETY_BOUND,
/// 0b4e2a81 line 79).
pub const LOG_RATIO_BOUND: f64 = 20.0;

/// Mismatch diagnostics of one step (`diagnostics.jsonl`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MismatchStats {
    /// Mean over tokens of |ℓ_sampler − ℓ_trainer| (nats).
    pub mean_abs_diff: f64,
    /// Mean over tokens of exp(r) − r − 1, r = ℓ_trainer − ℓ_sampler (k3 estimate of
    /// KL(π_sampler ‖ π_trainer), nats).
    pub k3_kl: f64,
    /// Tokens counted (those of the staleness-0 rows).
    pub tokens: usize,
}

/// The running sums behind [`MismatchStats`]: tokens are added one at a time (from any number of
/// micro-batches, in a fixed order), then [`MismatchSums::stats`] divides. The trainer's
/// per-step diagnostics and [`mismatch_stats`] both use it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MismatchSums {
    abs: f64,
    k3: f64,
    n: usize,
}

impl MismatchSums {
    /// Adds one token with trainer log-prob `trainer` and sampler log-prob `sampler` (nats):
    /// r = ℓ_trainer − ℓ_sampler adds |r| and exp(r) − r − 1.
    pub fn add(&mut self, trainer: f32, sampler: f32) {
        let r = trainer as f64 - sampler as f64;
        self.abs += r.abs();
        self.k3 += r.exp() - r - 1.0;
        self.n += 1;
    }

    /// The sums as `[Σ|r|, Σ(e^r − r − 1), tokens]`, to be summed across processes (data-parallel
    /// training) and rebuilt with [`MismatchSums::from_parts`].
    pub fn to_parts(&self) -> [f64; 3] {
        [self.abs, self.k3, self.n as f64]
    }

    /// The sums of [`MismatchSums::to_parts`] (the token count rounded to an integer).
    pub fn from_parts(p: [f64; 3]) -> Self {
        MismatchSums {
            abs: p[0],
            k3: p[1],
            n: p[2].round().max(0.0) as usize,
        }
    }

    /// The token means; `None` when no token was added.
    pub fn stats(&self) -> Option<MismatchStats> {
        (self.n > 0).then(|| MismatchStats {
            mean_abs_diff: self.abs / self.n as f64,
            k3_kl: self.k3 / self.n as f64,
            tokens: self.n,
        })
    }
}

/// One completion's log-probs for the diagnostics.
#[derive(Debug, Clone, Copy)]
pub struct MismatchRow<'a> {
    /// Behaviour log-probs recorded by the sampler, one per completion token.
    pub sampler: &'a [f32],
    /// The trainer's log-probs of the same tokens at the start of the step.
    pub trainer: &'a [f32],
    /// Trainer version − behaviour version (DESIGN.md section 3).
    pub staleness: u64,
}

/// [`MismatchStats`] over the tokens of the staleness-0 rows (token mean, as verl's
/// `masked_mean`); `None` when there is no such token.
///
/// # Panics
/// When a row's two slices differ in length.
pub fn mismatch_stats(rows: &[MismatchRow]) -> Option<MismatchStats> {
    let mut sums = MismatchSums::default();
    for row in rows.iter().filter(|r| r.staleness == 0) {
        assert_eq!(
            row.sampler.len(),
            row.trainer.len(),
            "sampler and trainer log-probs differ in length"
        );
        for (&s, &t) in row.sampler.iter().zip(row.trainer) {
            sums.add(t, s);
        }
    }
    sums.stats()
}

/// Whether a correction weighs each token by its own ratio or a whole completion by the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsLevel {
    /// ρ_t per token.
    Token,
    /// ∏_t ρ_t per completion, the same weight on all its tokens.
    Sequence,
}

/// The correction applied to the loss of every token (a constant factor, no gradient).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum IsCorrection {
    /// Truncated IS: weight min(ρ, cap) (cap > 0).
    Truncate {
        /// Token or sequence ratio.
        level: IsLevel,
        /// C: the largest weight.
        cap: f64,
    },
    /// Masked IS: weight 1 when lo ≤ ρ ≤ hi, else 0 (the token or completion is dropped).
    Mask {
        /// Token or sequence ratio.
        level: IsLevel,
        /// Lower bound of the kept ratios (verl's default: 1/hi).
        lo: f64,
        /// Upper bound of the kept ratios.
        hi: f64,
    },
}

/// The correction weights of one completion, one per token: see [`IsCorrection`] and the module
/// docs for the formulas and their source. `trainer` and `sampler` are per-token log-probs of the
/// same tokens.
///
/// # Panics
/// When the slices differ in length, or a cap / bound is not positive or lo > hi.
pub fn correction_weights(trainer: &[f32], sampler: &[f32], c: IsCorrection) -> Vec<f32> {
    assert_eq!(
        trainer.len(),
        sampler.len(),
        "sampler and trainer log-probs differ in length"
    );
    let log_ratios: Vec<f64> = trainer
        .iter()
        .zip(sampler)
        .map(|(&t, &s)| t as f64 - s as f64)
        .collect();
    let level = match c {
        IsCorrection::Truncate { level, cap } => {
            assert!(cap > 0.0, "truncated IS needs a positive cap, got {cap}");
            level
        }
        IsCorrection::Mask { level, lo, hi } => {
            assert!(
                lo > 0.0 && lo <= hi,
                "masked IS needs 0 < lo ≤ hi, got [{lo}, {hi}]"
            );
            level
        }
    };
    let weight = |log_ratio: f64| -> f32 {
        let rho = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp();
        match c {
            IsCorrection::Truncate { cap, .. } => rho.min(cap) as f32,
            IsCorrection::Mask { lo, hi, .. } => f32::from(u8::from(rho >= lo && rho <= hi)),
        }
    };
    match level {
        IsLevel::Token => log_ratios.into_iter().map(weight).collect(),
        IsLevel::Sequence => {
            let w = weight(log_ratios.iter().sum());
            vec![w; trainer.len()]
        }
    }
}
