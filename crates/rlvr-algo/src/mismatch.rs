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
//! - IcePop (arXiv 2510.18855, its IcePop objective; OpenRLHF `openrlhf/models/loss.py` at
//!   3c3be623, `vllm_is_correction_type = "icepop"`): a token is kept when lo ≤ ρ_t ≤ hi and then
//!   weighted by ρ_t itself, else dropped: M(k) = k on [α, β], 0 outside (the authors' α = 0.5,
//!   β = 5);
//! - geometric-mean truncation and mask (verl 999905206 `mismatch_helper.py` "geometric" level;
//!   verl 0b4e2a81 `rollout_rs = "geometric"`, renamed `seq_mean_k1` at b178a3cd): the ratio of a
//!   completion is g = exp(mean_t log ρ_t), then truncated (min(g, C)) or masked (lo ≤ g ≤ hi);
//! - k3 sequence rejection (verl b178a3cd `rollout_rs = "seq_mean_k3"`): a completion is dropped
//!   when mean_t (ρ_t − 1 − log ρ_t) > τ;
//! - k3 KL (`compute_offpolicy_metrics`, 0b4e2a81 line 768): mean over tokens of
//!   exp(r) − r − 1 with r = ℓ_trainer − ℓ_sampler, an estimate of KL(π_sampler ‖ π_trainer).
//!
//! Stale rows: like verl (whose `old_log_prob` is recomputed at the current weights) and AReaL's
//! decoupled objective (its proximal policy), ℓ_trainer is always taken at the start of the step,
//! so for a row of staleness s > 0 the ratio covers both the kernel mismatch and the s steps of
//! policy change. The diagnostics, which measure the kernel mismatch alone, use the staleness-0 rows
//! only. Reference values worked out by hand: `tests/it/mismatch.rs`.
//!
//! Which ratio, therefore: at staleness 0, ρ is the trainer/sampler ratio at the behaviour version
//! (IcePop's π_train(θ_old)/π_infer(θ_old) exactly); for a stale row it is the ratio of the current
//! weights to the sampler (verl's decoupled mode). With `train.recompute_behaviour` the sampler's
//! log-probs are replaced by the trainer's at the behaviour version before the step, so ρ is then
//! the policy drift alone (1 at staleness 0). The off-policy sequence mask (OPSM,
//! `algorithm.opsm_delta`) is not here: it reads the current weights against ℓ_old inside the loss
//! (`crate::loss`).

use serde::{Deserialize, Serialize};

use crate::metrics::{ratio_bucket, RATIO_BUCKETS};
use crate::parts::{Knob, Part, Registered};

/// Which correction the trainer applies to the sampler/trainer ratio ρ_t = exp(ℓ_trainer − ℓ_sampler)
/// (module docs), with `algorithm.mismatch_cap` = C (the upper bound), `algorithm.mismatch_low` = lo
/// (the lower bound of the masks and IcePop; unset: 1/C) and `algorithm.mismatch_k3_threshold` = τ.
/// Every weight is a constant factor on the token's loss terms (no gradient); the normaliser is
/// unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MismatchCorrection {
    /// No correction.
    #[default]
    None,
    /// Truncated IS per token: c_t = min(ρ_t, C) (verl `rollout_is = "token"`).
    TokenTruncate,
    /// Truncated IS per completion: c = min(∏_t ρ_t, C) on all its tokens (verl `rollout_is =
    /// "sequence"`).
    SequenceTruncate,
    /// Masked IS per token: c_t = 1 when lo ≤ ρ_t ≤ C, else 0 (verl 0b4e2a81 `rollout_rs = "token"`).
    TokenMask,
    /// Masked IS per completion: c = 1 when lo ≤ ∏_t ρ_t ≤ C, else 0 (the completion is dropped;
    /// verl 0b4e2a81 `rollout_rs = "sequence"`).
    SequenceMask,
    /// IcePop (Ling team, "Every Step Evolves: Scaling RL for Trillion-Scale Thinking Model",
    /// arXiv 2510.18855, Eq. of IcePop; OpenRLHF `vllm_is_correction_type = "icepop"`): a
    /// two-sided token mask that keeps the ratio as the weight, c_t = ρ_t when lo ≤ ρ_t ≤ C,
    /// else 0. The authors' bounds are lo = 0.5, C = 5.
    Icepop,
    /// Truncated IS on the geometric mean of the completion's token ratios, g = exp(mean_t log ρ_t):
    /// c = min(g, C) on all its tokens (verl 999905206 `mismatch_helper.py`,
    /// `rollout_is_level = "geometric"`, `rollout_is_mode = "truncate"`).
    GeometricTruncate,
    /// Geometric-mean sequence mask ("Geo-RS"): c = 1 when lo ≤ g ≤ C, else 0 (verl 0b4e2a81
    /// `rollout_rs = "geometric"`; verl b178a3cd `rollout_rs = "seq_mean_k1"` with symmetric
    /// bounds, whose preset uses lo = 0.999, C = 1.001).
    GeometricMask,
    /// k3 sequence rejection ("K3-RS"): c = 0 for a completion whose mean per-token
    /// k3 = ρ_t − 1 − log ρ_t (an estimate of KL(π_sampler ‖ π_trainer), nats) exceeds τ, else 1
    /// (verl b178a3cd `rollout_rs = "seq_mean_k3"`, preset threshold 0.01).
    SequenceK3Mask,
}

const MISMATCH_CAP: Knob = Knob {
    key: "mismatch_cap",
    default: "2.0",
};
const MISMATCH_LOW: Knob = Knob {
    key: "mismatch_low",
    default: "unset",
};
/// What a correction did (diagnostics.jsonl): every correction but `none` fills in the masked and
/// the truncated shares (0 for what it does not do); `none` leaves them null.
const MISMATCH_METRICS: &[&str] = &[
    "mismatch/masked_frac",
    "mismatch/masked_rows_frac",
    "mismatch/truncated_frac",
    "mismatch/truncated_rows_frac",
];
const TRUNCATE: Part = Part {
    name: "",
    knobs: &[MISMATCH_CAP],
    metrics: MISMATCH_METRICS,
};
const MASK: Part = Part {
    name: "",
    knobs: &[MISMATCH_CAP, MISMATCH_LOW],
    metrics: MISMATCH_METRICS,
};

impl Registered for MismatchCorrection {
    const KEY: &'static str = "mismatch_correction";
    // In the order an error lists them: the truncations, the masks with a lower bound, the k3 mask.
    const PARTS: &'static [Part] = &[
        Part {
            name: "none",
            knobs: &[],
            metrics: &[],
        },
        Part {
            name: "token-truncate",
            ..TRUNCATE
        },
        Part {
            name: "sequence-truncate",
            ..TRUNCATE
        },
        Part {
            name: "geometric-truncate",
            ..TRUNCATE
        },
        Part {
            name: "token-mask",
            ..MASK
        },
        Part {
            name: "sequence-mask",
            ..MASK
        },
        Part {
            name: "geometric-mask",
            ..MASK
        },
        Part {
            name: "icepop",
            ..MASK
        },
        Part {
            name: "sequence-k3-mask",
            knobs: &[Knob {
                key: "mismatch_k3_threshold",
                default: "0.01",
            }],
            metrics: MISMATCH_METRICS,
        },
    ];
}

impl MismatchCorrection {
    /// Every value, in the order of the enum.
    pub const ALL: [MismatchCorrection; 9] = [
        MismatchCorrection::None,
        MismatchCorrection::TokenTruncate,
        MismatchCorrection::SequenceTruncate,
        MismatchCorrection::TokenMask,
        MismatchCorrection::SequenceMask,
        MismatchCorrection::Icepop,
        MismatchCorrection::GeometricTruncate,
        MismatchCorrection::GeometricMask,
        MismatchCorrection::SequenceK3Mask,
    ];

    /// Whether a correction is applied.
    pub fn is_on(self) -> bool {
        self != MismatchCorrection::None
    }

    /// Whether the correction weighs each token by its own ratio.
    pub fn token_level(self) -> bool {
        matches!(
            self,
            MismatchCorrection::TokenTruncate
                | MismatchCorrection::TokenMask
                | MismatchCorrection::Icepop
        )
    }

    /// Whether the correction has a lower bound on the ratio (`algorithm.mismatch_low` applies).
    pub fn has_lower_bound(self) -> bool {
        self.part().reads("mismatch_low")
    }

    /// Whether the correction reads `algorithm.mismatch_cap` (every one but `none` and the k3 mask).
    pub fn reads_cap(self) -> bool {
        self.part().reads("mismatch_cap")
    }

    /// The correction with its bounds, as [`correction_weights`] takes it (`None` when off):
    /// `cap` = C, `low` = lo (unset: 1/C), `k3` = τ.
    pub fn with_bounds(self, cap: f64, low: Option<f64>, k3: f64) -> Option<IsCorrection> {
        let lo = low.unwrap_or(1.0 / cap);
        let (level, mask) = match self {
            MismatchCorrection::None => return None,
            MismatchCorrection::TokenTruncate => (IsLevel::Token, false),
            MismatchCorrection::SequenceTruncate => (IsLevel::Sequence, false),
            MismatchCorrection::GeometricTruncate => (IsLevel::Geometric, false),
            MismatchCorrection::TokenMask => (IsLevel::Token, true),
            MismatchCorrection::SequenceMask => (IsLevel::Sequence, true),
            MismatchCorrection::GeometricMask => (IsLevel::Geometric, true),
            MismatchCorrection::Icepop => return Some(IsCorrection::IcePop { lo, hi: cap }),
            MismatchCorrection::SequenceK3Mask => {
                return Some(IsCorrection::K3Mask { threshold: k3 })
            }
        };
        Some(if mask {
            IsCorrection::Mask { level, lo, hi: cap }
        } else {
            IsCorrection::Truncate { level, cap }
        })
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
    hist: [f64; RATIO_BUCKETS],
}

impl MismatchSums {
    /// Adds one token with trainer log-prob `trainer` and sampler log-prob `sampler` (nats):
    /// r = ℓ_trainer − ℓ_sampler adds |r|, exp(r) − r − 1 and one count to r's bucket of
    /// [`crate::RATIO_HIST_EDGES`].
    pub fn add(&mut self, trainer: f32, sampler: f32) {
        let r = trainer as f64 - sampler as f64;
        self.abs += r.abs();
        self.k3 += r.exp() - r - 1.0;
        self.n += 1;
        self.hist[ratio_bucket(r)] += 1.0;
    }

    /// Token counts of r = ℓ_trainer − ℓ_sampler over [`crate::RATIO_HIST_EDGES`] (`hist/mismatch`).
    pub fn hist(&self) -> [f64; RATIO_BUCKETS] {
        self.hist
    }

    /// The sums as `[Σ|r|, Σ(e^r − r − 1), tokens, histogram counts…]`, to be summed across
    /// processes (data-parallel training) and rebuilt with [`MismatchSums::from_parts`].
    pub fn to_parts(&self) -> Vec<f64> {
        let mut v = vec![self.abs, self.k3, self.n as f64];
        v.extend_from_slice(&self.hist);
        v
    }

    /// The sums of [`MismatchSums::to_parts`] (the token count rounded to an integer).
    ///
    /// # Panics
    /// When `p` is not as long as [`MismatchSums::to_parts`]'s vector.
    pub fn from_parts(p: &[f64]) -> Self {
        assert_eq!(p.len(), 3 + RATIO_BUCKETS, "MismatchSums::from_parts");
        let mut hist = [0.0; RATIO_BUCKETS];
        hist.copy_from_slice(&p[3..]);
        MismatchSums {
            abs: p[0],
            k3: p[1],
            n: p[2].round().max(0.0) as usize,
            hist,
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

/// Which ratio a correction reads: each token's own, the completion's product, or the completion's
/// geometric mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsLevel {
    /// ρ_t per token.
    Token,
    /// ∏_t ρ_t = exp(Σ_t log ρ_t) per completion, the same weight on all its tokens.
    Sequence,
    /// g = exp(mean_t log ρ_t) per completion (the geometric mean of its token ratios), the same
    /// weight on all its tokens.
    Geometric,
}

/// The correction applied to the loss of every token (a constant factor, no gradient).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum IsCorrection {
    /// Truncated IS: weight min(ρ, cap) (cap > 0).
    Truncate {
        /// Token, sequence or geometric-mean ratio.
        level: IsLevel,
        /// C: the largest weight.
        cap: f64,
    },
    /// Masked IS: weight 1 when lo ≤ ρ ≤ hi, else 0 (the token or completion is dropped).
    Mask {
        /// Token, sequence or geometric-mean ratio.
        level: IsLevel,
        /// Lower bound of the kept ratios (verl's default: 1/hi).
        lo: f64,
        /// Upper bound of the kept ratios.
        hi: f64,
    },
    /// IcePop: per token, weight ρ_t when lo ≤ ρ_t ≤ hi, else 0.
    IcePop {
        /// α: lower bound of the kept ratios.
        lo: f64,
        /// β: upper bound of the kept ratios.
        hi: f64,
    },
    /// k3 sequence rejection: weight 0 on a completion whose mean per-token
    /// k3 = ρ_t − 1 − log ρ_t exceeds `threshold` (nats), else 1.
    K3Mask {
        /// τ (nats, ≥ 0).
        threshold: f64,
    },
}

/// One completion's correction: the weight of each token and what it did.
#[derive(Debug, Clone, PartialEq)]
pub struct Corrected {
    /// c_t, one per token.
    pub weights: Vec<f32>,
    /// Tokens whose weight is 0 (masked).
    pub masked: usize,
    /// Tokens whose weight was capped (the ratio it reads was above the cap).
    pub truncated: usize,
}

/// The correction weights of one completion, one per token: see [`IsCorrection`] and the module
/// docs for the formulas and their source. `trainer` and `sampler` are per-token log-probs (nats) of
/// the same tokens. Shorthand for [`correct`]`(..).weights`.
///
/// # Panics
/// As [`correct`].
pub fn correction_weights(trainer: &[f32], sampler: &[f32], c: IsCorrection) -> Vec<f32> {
    correct(trainer, sampler, c).weights
}

/// The correction of one completion: its per-token weights c_t (a constant factor on each token's
/// loss terms) and how many tokens it masked (c_t = 0) or truncated (c_t = the cap). Log-ratios are
/// clamped to ±[`LOG_RATIO_BOUND`] before every exp (verl's SAFETY_BOUND); the sequence ratio clamps
/// the sum, the geometric one the mean. An empty completion gets no weights.
///
/// # Panics
/// When the slices differ in length, or a cap / bound is not positive, lo > hi, or a k3 threshold
/// is negative or not finite (the config's `resolve` refuses all of these first).
pub fn correct(trainer: &[f32], sampler: &[f32], c: IsCorrection) -> Corrected {
    assert_eq!(
        trainer.len(),
        sampler.len(),
        "sampler and trainer log-probs differ in length"
    );
    let n = trainer.len();
    let log_ratios: Vec<f64> = trainer
        .iter()
        .zip(sampler)
        .map(|(&t, &s)| t as f64 - s as f64)
        .collect();
    let exp = |x: f64| x.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp();
    let count = |w: &[f32]| w.iter().filter(|&&x| x == 0.0).count();
    let level_log = |level: IsLevel, lr: &[f64]| -> Vec<f64> {
        match level {
            IsLevel::Token => lr.to_vec(),
            IsLevel::Sequence => vec![lr.iter().sum::<f64>(); lr.len()],
            IsLevel::Geometric => {
                let m = lr.iter().sum::<f64>() / lr.len().max(1) as f64;
                vec![m; lr.len()]
            }
        }
    };
    match c {
        IsCorrection::Truncate { level, cap } => {
            assert!(cap > 0.0, "truncated IS needs a positive cap, got {cap}");
            let rho: Vec<f64> = level_log(level, &log_ratios).into_iter().map(exp).collect();
            let truncated = rho.iter().filter(|&&r| r > cap).count();
            let weights = rho.iter().map(|&r| r.min(cap) as f32).collect();
            Corrected {
                weights,
                masked: 0,
                truncated,
            }
        }
        IsCorrection::Mask { level, lo, hi } => {
            assert!(
                lo > 0.0 && lo <= hi,
                "masked IS needs 0 < lo ≤ hi, got [{lo}, {hi}]"
            );
            let weights: Vec<f32> = level_log(level, &log_ratios)
                .into_iter()
                .map(|x| f32::from(u8::from((lo..=hi).contains(&exp(x)))))
                .collect();
            Corrected {
                masked: count(&weights),
                weights,
                truncated: 0,
            }
        }
        IsCorrection::IcePop { lo, hi } => {
            assert!(
                lo > 0.0 && lo <= hi,
                "IcePop needs 0 < lo ≤ hi, got [{lo}, {hi}]"
            );
            let weights: Vec<f32> = log_ratios
                .iter()
                .map(|&x| {
                    let r = exp(x);
                    if (lo..=hi).contains(&r) {
                        r as f32
                    } else {
                        0.0
                    }
                })
                .collect();
            Corrected {
                masked: count(&weights),
                weights,
                truncated: 0,
            }
        }
        IsCorrection::K3Mask { threshold } => {
            assert!(
                threshold.is_finite() && threshold >= 0.0,
                "k3 rejection needs a finite threshold >= 0, got {threshold}"
            );
            let k3 = log_ratios
                .iter()
                .map(|&x| {
                    let x = x.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND);
                    x.exp() - 1.0 - x
                })
                .sum::<f64>()
                / n.max(1) as f64;
            let keep = k3 <= threshold;
            Corrected {
                weights: vec![f32::from(u8::from(keep)); n],
                masked: if keep { 0 } else { n },
                truncated: 0,
            }
        }
    }
}
