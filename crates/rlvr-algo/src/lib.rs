//! # rlvr-algo: advantages, policy losses and the normaliser of RLVR
//!
//! Everything between scored completions and a scalar loss, on tensors only: this crate knows
//! nothing of models, tokenizers or sampling (Architecture Invariant).
//!
//! The trainer's path through it, once per optimizer update:
//!
//! 1. [`AlgorithmConfig::resolve`] (defaults < preset < user values) gives an [`Algorithm`].
//! 2. [`shape_rewards`] (DAPO soft overlong penalty, if configured), then [`compute_advantages`]
//!    from rewards and group ids: per-row advantages and which rows stay in the normaliser.
//! 3. [`UpdateNormaliser::new`] over **all** rows of the update fixes one weight per row.
//! 4. For each micro-batch, [`policy_loss`] with that micro-batch's tensors and
//!    [`UpdateNormaliser::rows`]; `backward()` each loss and sum the gradients as they are.
//! 5. [`LossStats::merge`] the diagnostics and [`LossStats::finalise`] them into DESIGN.md section 10 metrics.
//!
//! When the sampler is not the trainer's own forward (a vLLM server), [`mismatch`] measures the gap
//! between the two log-probs of each token ([`MismatchSums`]) and gives the truncated or masked
//! importance weights that `algorithm.mismatch_correction` applies to any loss
//! ([`correction_weights`]).
//!
//! Sources: paper A (off-policy GRPO, arXiv 2505.22257), paper B (REC/REP/RED, arXiv 2509.24203),
//! and the peers cited on each item. Presets: [`presets()`], printed by [`print_algorithms`].
//!
//! ```
//! use rlvr_algo::{compute_advantages, AlgorithmConfig};
//!
//! let alg = AlgorithmConfig::default().resolve()?; // preset "grpo"
//! // Two groups, interleaved: 1 of 2 correct in each.
//! let rewards = [Some(1.0), Some(0.0), Some(0.0), Some(1.0)];
//! let groups = ["a", "b", "a", "b"];
//! let adv = compute_advantages(&rewards, &groups, &alg, 0)?;
//! assert!((adv.values[0] - 0.7071).abs() < 1e-4); // (1 − 0.5) / sample std 0.7071
//! assert!((adv.values[2] + 0.7071).abs() < 1e-4);
//! # Ok::<(), rlvr_algo::AlgoError>(())
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod advantage;
pub mod config;
pub mod error;
pub mod kl;
pub mod loss;
pub mod metrics;
pub mod mismatch;
pub mod normaliser;
pub mod parts;
pub mod presets;
mod resolve;

pub use advantage::{
    advantage_exp_weight, compute_advantages, overlong_penalty, shape_rewards, AdvantageStats,
    Advantages,
};
pub use config::reference_rows;
pub use config::{
    Advantage, Aggregation, Algorithm, AlgorithmConfig, Baseline, Correction, GroupBaseline,
    KeepMask, Kl, KlEstimator, Overlong, OverlongRule, Policy, PolicyLoss, RecWeight, RedDrop,
    RedDropRule, RegTerm, Regulariser, StdDivision, StdLevel, StdNorm,
};
pub use error::{AlgoError, Result};
pub use kl::{kl_estimate, kl_estimate_f64};
pub use loss::{policy_loss, LossInputs};
pub use metrics::{
    ratio_bucket, ratio_bucket_label, CorrectionCounts, LossMetrics, LossStats, RATIO_BUCKETS,
    RATIO_HIST_EDGES,
};
pub use mismatch::{
    correct, correction_weights, mismatch_stats, Corrected, IsCorrection, IsLevel,
    MismatchCorrection, MismatchRow, MismatchStats, MismatchSums,
};
pub use normaliser::{RowInfo, UpdateNormaliser};
pub use parts::{Choice, Knob, Part, Registered};
pub use presets::{find_preset, follows_table, preset_hint, presets, print_algorithms, Preset};
