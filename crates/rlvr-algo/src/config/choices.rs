//! The choices of the `[algorithm]` table: one enum per choice knob (baseline, std normalisation,
//! policy loss, REC keep-mask and weight, regulariser, KL estimator, aggregation, overlong
//! treatment), and the grouping of the loss-specific knobs by the loss that reads them
//! ([`LOSS_OPTIONS`], [`PolicyLoss::options`]). Each choice that decides whether another knob is
//! read registers its values as [`Part`]s beside its type ([`Registered`]): the knobs each value
//! reads, with their defaults, and the metrics it reports.

use serde::{Deserialize, Serialize};

use crate::parts::{Knob, Part, Registered};

/// A part that reads nothing and reports nothing of its own.
const fn plain(name: &'static str) -> Part {
    Part {
        name,
        knobs: &[],
        metrics: &[],
    }
}

const CLIP_LOW: Knob = Knob {
    key: "clip_low",
    default: "0.2",
};
const CLIP_HIGH: Knob = Knob {
    key: "clip_high",
    default: "0.2",
};
const IS_CAP: Knob = Knob {
    key: "is_cap",
    default: "unset",
};

/// Baseline subtracted from each reward inside its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Baseline {
    /// b = mean of the group's scored rewards (GRPO, arXiv 2402.03300 §4.1.2; paper B's group-relative REINFORCE).
    Mean,
    /// b = T·log(mean_j exp(r_j / T)), T = `lme_temperature` (Kimi k1.5, arXiv 2501.12599, the
    /// optimal value of the KL-regularised objective used with OPMD).
    LogMeanExp,
    /// b_i = mean of the *other* K−1 rewards of the group (RLOO, arXiv 2402.14740):
    /// A_i = K/(K−1)·(r_i − mean).
    LeaveOneOut,
}

impl Registered for Baseline {
    const KEY: &'static str = "baseline";
    const PARTS: &'static [Part] = &[
        plain("mean"),
        Part {
            name: "log-mean-exp",
            knobs: &[Knob {
                key: "lme_temperature",
                default: "1.0",
            }],
            metrics: &[],
        },
        plain("leave-one-out"),
    ];
}

/// How the centred reward is divided by a standard deviation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StdNorm {
    /// Bessel-corrected std (divide by n−1), as GRPO implementations (TRL, verl) use; A = (r − b)/(σ + ε).
    Sample,
    /// Population std (divide by n); RED-Drop uses it on the kept rows.
    Population,
    /// No division (Dr.GRPO, REINFORCE, the REC family).
    None,
}

/// The knobs of a std division.
const STD_KNOBS: &[Knob] = &[
    Knob {
        key: "std_eps",
        default: "1e-6",
    },
    Knob {
        key: "std_level",
        default: "\"group\"",
    },
];

impl Registered for StdNorm {
    const KEY: &'static str = "std_norm";
    const PARTS: &'static [Part] = &[
        Part {
            name: "sample",
            knobs: STD_KNOBS,
            metrics: &[],
        },
        Part {
            name: "population",
            knobs: STD_KNOBS,
            metrics: &[],
        },
        plain("none"),
    ];
}

/// Over which rows the std of [`StdNorm`] is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StdLevel {
    /// Each group's own std (GRPO).
    Group,
    /// One std of all scored, non-dropped rewards of the batch (the "group mean, batch std" variant).
    Batch,
}

/// The per-token policy-gradient term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyLoss {
    /// PPO clipped surrogate, −min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A), ρ = exp(ℓ − ℓ_old), with optional
    /// dual-clip (Schulman et al. arXiv 1707.06347 Eq. 7; paper A's off-policy GRPO uses it with ρ = π_θ/α).
    Ppo,
    /// REC family of paper B (arXiv 2509.24203): −A′·k·ℓ with keep-mask k from the detached ratio and
    /// weight A′ ([`KeepMask`], [`RecWeight`]).
    Rec,
    /// GSPO (arXiv 2507.18071): clipped surrogate on s = exp(mean_t(ℓ − ℓ_old)), gradient through s.
    Gspo,
    /// CISPO (MiniMax-M1, arXiv 2506.13585): −sg(min(ρ, 1+ε_high))·A·ℓ.
    Cispo,
    /// Plain REINFORCE with a baseline: −A·ℓ (no ratio; equals REC with keep-mask and weight `none`).
    Reinforce,
}

/// The loss-specific `[algorithm]` keys: those some losses read and others do not (from the
/// losses' [`Part`]s), in the order of [`crate::AlgorithmConfig`]'s fields. Every other knob
/// applies to every loss. Iterate it (`for key in LOSS_OPTIONS`).
pub const LOSS_OPTIONS: LossOptions = LossOptions;

/// The type of [`LOSS_OPTIONS`]: iterating it gives the keys.
#[derive(Debug, Clone, Copy)]
pub struct LossOptions;

impl LossOptions {
    /// The keys, in the order of [`crate::AlgorithmConfig`]'s fields.
    pub fn keys(self) -> Vec<&'static str> {
        let gated: Vec<&str> = PolicyLoss::PARTS
            .iter()
            .flat_map(|p| p.knobs)
            .map(|k| k.key)
            .filter(|k| !PolicyLoss::PARTS.iter().all(|p| p.reads(k)))
            .collect();
        crate::parts::table_keys::<crate::AlgorithmConfig>()
            .iter()
            .copied()
            .filter(|k| gated.contains(k))
            .collect()
    }

    /// Whether `key` is one of them.
    pub fn contains(self, key: &str) -> bool {
        self.keys().contains(&key)
    }
}

impl IntoIterator for LossOptions {
    type Item = &'static str;
    type IntoIter = std::vec::IntoIter<&'static str>;

    fn into_iter(self) -> Self::IntoIter {
        self.keys().into_iter()
    }
}

impl Registered for PolicyLoss {
    const KEY: &'static str = "loss";
    // Each loss's own keys, as its formula in `loss.rs` reads them. PPO and GSPO: ε_low, ε_high,
    // dual-clip c, IS cap C. CISPO: −sg(min(ρ, 1+ε_high))·A·ℓ reads ε_high and C only. REC:
    // keep-mask (ε_low, ε_high; the ring's ε′_low, ε′_high) and weight (the `is`/`seq-is` IS cap
    // C, the `advantage-exp` temperature T). REINFORCE (−A·ℓ): none.
    // No loss has metrics of its own: every loss's runs fill in the clip fractions (`clip_frac`,
    // `clip_frac/low`, ...; 0 where the loss clips nothing, as REINFORCE), the part-metrics test
    // (rlvr-train tests/it/part_metrics.rs) holds it.
    const PARTS: &'static [Part] = &[
        Part {
            name: "ppo",
            knobs: PPO_KNOBS,
            metrics: &[],
        },
        Part {
            name: "rec",
            knobs: &[
                Knob {
                    key: "keep_mask",
                    default: "\"none\"",
                },
                Knob {
                    key: "rec_weight",
                    default: "\"none\"",
                },
                CLIP_LOW,
                CLIP_HIGH,
                CLIP_LOW_PRIME,
                CLIP_HIGH_PRIME,
                ADV_TEMPERATURE,
                IS_CAP,
            ],
            metrics: &[],
        },
        Part {
            name: "gspo",
            knobs: PPO_KNOBS,
            metrics: &[],
        },
        Part {
            name: "cispo",
            knobs: &[CLIP_HIGH, IS_CAP],
            metrics: &[],
        },
        plain("reinforce"),
    ];
}

/// The keys of the clipped surrogate (PPO, GSPO).
const PPO_KNOBS: &[Knob] = &[
    CLIP_LOW,
    CLIP_HIGH,
    Knob {
        key: "dual_clip",
        default: "unset",
    },
    IS_CAP,
];
const CLIP_LOW_PRIME: Knob = Knob {
    key: "clip_low_prime",
    default: "0.6",
};
const CLIP_HIGH_PRIME: Knob = Knob {
    key: "clip_high_prime",
    default: "2.0",
};
const ADV_TEMPERATURE: Knob = Knob {
    key: "adv_temperature",
    default: "1.0",
};

impl PolicyLoss {
    /// Every loss, in the order of the enum.
    pub const ALL: [PolicyLoss; 5] = [
        PolicyLoss::Ppo,
        PolicyLoss::Rec,
        PolicyLoss::Gspo,
        PolicyLoss::Cispo,
        PolicyLoss::Reinforce,
    ];

    /// The config name (`algorithm.loss = "ppo"`).
    pub fn name(self) -> &'static str {
        self.part().name
    }

    /// This loss's group of [`LOSS_OPTIONS`]: the loss-specific keys its formula reads, from its
    /// registered [`Part`] (the keys every loss reads are not listed).
    pub fn options(self) -> Vec<&'static str> {
        let keys = LOSS_OPTIONS.keys();
        self.part()
            .knobs
            .iter()
            .map(|k| k.key)
            .filter(|k| keys.contains(k))
            .collect()
    }

    /// Whether `key` (an `[algorithm]` key) is read by this loss: true for every key that is not in
    /// [`LOSS_OPTIONS`], else whether its part lists it.
    pub fn reads(self, key: &str) -> bool {
        !LOSS_OPTIONS.contains(key) || self.part().reads(key)
    }
}

/// REC keep-mask k ∈ {0, 1} from the detached ratio ρ̄ (paper B, arXiv 2509.24203, REC family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeepMask {
    /// k = 1.
    None,
    /// (A ≥ 0 and ρ̄ ≤ 1+ε_high) or (A ≤ 0 and ρ̄ ≥ 1−ε_low): the tokens PPO's clip keeps.
    OneSide,
    /// 1−ε_low ≤ ρ̄ ≤ 1+ε_high.
    TwoSide,
    /// two-side, or (A ≥ 0 and ρ̄ ≤ 1−ε′_low), or (A ≤ 0 and ρ̄ ≥ 1+ε′_high).
    Ring,
    /// one-side applied to the detached sequence ratio s̄ = exp(mean_t(ℓ − ℓ_old)).
    GspoOneSide,
}

impl Registered for KeepMask {
    const KEY: &'static str = "keep_mask";
    const PARTS: &'static [Part] = &[
        plain("none"),
        plain("one-side"),
        plain("two-side"),
        Part {
            name: "ring",
            knobs: &[CLIP_LOW_PRIME, CLIP_HIGH_PRIME],
            metrics: &[],
        },
        plain("gspo-one-side"),
    ];
}

/// REC weight: what multiplies −k·ℓ (paper B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecWeight {
    /// A′ = A.
    None,
    /// A′ = A·ρ̄ (token IS weight, detached; capped by `is_cap` when set).
    Is,
    /// A′ = A·s̄, s̄ = exp(mean_t(ℓ − ℓ_old)) detached (sequence IS weight).
    SeqIs,
    /// A′ = A·exp(A/T), T = `adv_temperature` (RED-Weight).
    AdvantageExp,
}

impl Registered for RecWeight {
    const KEY: &'static str = "rec_weight";
    const PARTS: &'static [Part] = &[
        plain("none"),
        plain("is"),
        plain("seq-is"),
        Part {
            name: "advantage-exp",
            knobs: &[ADV_TEMPERATURE],
            metrics: &[],
        },
    ];
}

/// Regulariser added per token with coefficient τ (paper B's REP family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Regulariser {
    /// No regulariser.
    None,
    /// OPMD: +τ·(ℓ − ℓ_old)². Kimi k1.5 (arXiv 2501.12599) writes τ/2·(…)²; we follow Trinity-RFT,
    /// which absorbs the ½ (its τ = 0.1 is Kimi's 0.2).
    Opmd,
    /// AsymRE: −τ·ℓ, i.e. the baseline lowered by τ (exactly so only without std normalisation).
    Asymre,
}

/// τ of a regulariser.
const TAU: &[Knob] = &[Knob {
    key: "tau",
    default: "0.1",
}];

impl Registered for Regulariser {
    const KEY: &'static str = "regulariser";
    const PARTS: &'static [Part] = &[
        plain("none"),
        Part {
            name: "opmd",
            knobs: TAU,
            metrics: &[],
        },
        Part {
            name: "asymre",
            knobs: TAU,
            metrics: &[],
        },
    ];
}

/// KL-to-reference estimator, per token, with x = ℓ_ref − ℓ (Schulman, "Approximating KL divergence",
/// <http://joschu.net/blog/kl-approx.html>).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KlEstimator {
    /// k1 = −x. Unbiased value; zero expected gradient as a loss term.
    K1,
    /// k2 = x²/2. Its gradient is the gradient of KL(π_θ‖π_ref).
    K2,
    /// k3 = exp(x) − x − 1 (GRPO, TRL). On-policy, its expected gradient is that of KL(π_ref‖π_θ).
    K3,
}

/// Loss aggregation: how per-token terms L_it (mask m_it) become one scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Aggregation {
    /// Σ m·L / Σ m over the whole update batch (DAPO).
    TokenMean,
    /// mean over sequences of (Σ_t m·L / Σ_t m) (original GRPO).
    SeqMeanTokenMean,
    /// mean over sequences of Σ_t m·L.
    SeqMeanTokenSum,
    /// Σ m·L / (B·max_new_tokens), B = rows in the normaliser (Dr.GRPO, arXiv 2503.20783).
    Constant,
}

/// How RED-Drop (paper B, arXiv 2509.24203) chooses which negatives (r < group mean) to drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RedDropRule {
    /// Exactly the surplus (negatives − others), chosen uniformly at random; the baseline (and the
    /// std) recomputed on the kept rows. Trinity-RFT as released (PR #292, `rec_advantage.py`).
    Surplus,
    /// Each negative dropped independently with probability 1 − pos/neg (pos = rows with r ≥ mean,
    /// neg = the others; nothing when neg ≤ pos); the baseline (and the std) of all the group's
    /// rows kept. Trinity-RFT as first written (yaochaorui/Trinity-RFT commit 8a0e9e81,
    /// 2025-09-12).
    Bernoulli,
}

/// Treatment of truncated completions (no EOS within `rollout.max_new_tokens`), DAPO arXiv 2503.14476.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overlong {
    /// Train on truncated completions like any other.
    None,
    /// Overlong filtering: truncated completions get no gradient and leave the normaliser.
    Mask,
    /// Soft overlong punishment added to the reward ([`crate::overlong_penalty`]).
    Soft,
}

impl Registered for Overlong {
    const KEY: &'static str = "overlong";
    const PARTS: &'static [Part] = &[
        plain("none"),
        plain("mask"),
        Part {
            name: "soft",
            knobs: &[
                Knob {
                    key: "overlong_buffer_frac",
                    default: "0.2",
                },
                Knob {
                    key: "overlong_penalty_factor",
                    default: "1.0",
                },
            ],
            metrics: &[],
        },
    ];
}
