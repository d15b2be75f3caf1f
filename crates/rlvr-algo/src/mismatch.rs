//! `algorithm.mismatch_correction`: importance-sampling corrections for the sampler/trainer
//! mismatch (issue 15 item 6), usable with any loss. The weight of a token multiplies its loss
//! term as a constant (no gradient): Σ_i w_i Σ_t m_it c_it L_it, the normaliser unchanged.
//!
//! ρ_mismatch = exp(ℓ_trainer − ℓ_sampler), with ℓ_trainer the trainer's log-prob at the start of
//! the step (no gradient) and ℓ_sampler the behaviour log-prob the sampler recorded. Semantics
//! follow verl's `rollout_correction` (volcengine/verl `verl/trainer/ppo/rollout_corr_helper.py`
//! at commit 0b4e2a81: truncated IS lines 318–399, masked IS lines 82–164), not AReaL's decoupled
//! objective: for a stale row (staleness s > 0) ρ_mismatch covers both the kernel mismatch and the
//! s steps of policy change, as verl's `old_log_prob` is the current weights' recomputation. The
//! formulas are `rlvr_vllm::correction_weights` (reference tests in
//! crates/rlvr-vllm/tests/correction.rs); the trainer applies them.

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
