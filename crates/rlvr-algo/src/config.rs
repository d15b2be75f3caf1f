//! The `[algorithm]` configuration: every knob of advantages, losses and aggregation.
//!
//! Two types:
//! - [`AlgorithmConfig`] is what the user wrote (TOML `[algorithm]` table, `--set algorithm.*`): every
//!   knob is an `Option`, `None` meaning "not set here".
//! - [`Algorithm`] is the resolved value the loss code reads: each choice a typed part carrying
//!   only its own parameters (the advantage, the policy loss, the regulariser, the KL term, the
//!   overlong rule, the mismatch correction; `typed.rs`).
//!
//! [`AlgorithmConfig::resolve`] applies the precedence **defaults < preset < user-set values**: a
//! preset fills only the knobs the user left unset, and the defaults fill the rest, giving the
//! flat resolved knobs (`Knobs`, private), which are validated and then built into the typed
//! [`Algorithm`]. The defaults are written once, in `Knobs::default` ([`AlgorithmConfig::defaults`]
//! shows them); presets are data ([`mod@crate::presets`]).
//!
//! Loss-specific knobs are grouped by the loss they belong to ([`PolicyLoss::options`]): PPO and
//! GSPO take the clip range, dual-clip and IS cap; CISPO the upper clip and IS cap; REC its
//! keep-mask, weight, clip ranges (ε, ε′), the RED-Weight temperature and IS cap; REINFORCE none.
//! A knob the user set for another loss is an error naming the key and the loss (a preset's value
//! for another loss is not: presets are partial tables shared by several losses). The TOML keys stay
//! flat (`algorithm.clip_low`, DESIGN.md section 10), and [`Algorithm::to_config`] writes only the knobs of
//! the chosen loss.

use serde::{Deserialize, Serialize};

use crate::parts::{Choice, Knob, Part, Registered};
use crate::MismatchCorrection;

mod choices;
mod policy;
mod typed;
mod validate;
pub use choices::{
    Aggregation, Baseline, KeepMask, KlEstimator, Overlong, PolicyLoss, RecWeight, RedDropRule,
    Regulariser, StdLevel, StdNorm, LOSS_OPTIONS,
};
pub use policy::{Cispo, Policy, Rec, RecKeep, RecScale, Surrogate};
pub use typed::{
    Advantage, Algorithm, Correction, GroupBaseline, Kl, OverlongRule, RedDrop, RegTerm,
    StdDivision,
};

/// The user's `[algorithm]` table. Every knob is optional: `None` means "take the preset's value,
/// else the default" (see [`AlgorithmConfig::resolve`]). Unknown keys are rejected.
///
/// Defaults quoted below are those of [`Algorithm::default`], used when neither the user nor the
/// preset sets a knob.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlgorithmConfig {
    /// Preset name (`rlvr algorithms` lists them); `"none"` applies no preset. Default `"grpo"`.
    pub preset: String,

    // ----- advantages -----
    /// Group baseline. Default `mean`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Baseline>,
    /// Std normalisation of the centred reward. Default `sample`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub std_norm: Option<StdNorm>,
    /// Where the std is taken (group or batch). Default `group`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub std_level: Option<StdLevel>,
    /// ε added to the std: A = (r − b)/(σ + ε). Default 1e-6.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub std_eps: Option<f64>,
    /// δ added to the baseline before std division: A = (r − b − δ)/(σ + ε). δ = −τ reproduces AsymRE.
    /// Zero-variance groups get A = −δ/(…) too (their centred reward is exactly 0). Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_shift: Option<f64>,
    /// Temperature T of the log-mean-exp baseline. Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lme_temperature: Option<f64>,
    /// Zero-variance groups (all scored rewards equal, including K = 1) leave the normaliser: their rows
    /// get weight 0 (no PG, KL, entropy or regulariser term) and are not counted. Default `true`
    /// (DESIGN.md section 5: counting them in the token denominator is a known peer fault). `false` is what TRL,
    /// verl and Trinity-RFT do (their token mean runs over every row of the batch, A = 0 rows
    /// included: Trinity's `rec_policy_loss.py` `masked_mean(pg_losses, action_mask)`), a smaller
    /// step at the same learning rate; the presets that follow paper B's Trinity recipes set it, and
    /// `opmd`/`asymre` need it anyway (their regulariser acts on every sample).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exclude_zero_std: Option<bool>,
    /// RED-Drop (paper B): in each group, drop surplus negatives (r < group mean) at random (seeded)
    /// until negatives ≤ non-negatives; recompute mean/std on the kept rows; dropped rows get A = 0
    /// and leave the normaliser unless `red_drop_in_normaliser`. Requires `baseline = mean`. Default
    /// `false`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub red_drop: Option<bool>,
    /// RED-Drop's dropped rows stay in the normaliser with A = 0 (they are in the batch, as in
    /// Trinity-RFT, whose `RECGroupedAdvantage` (`trinity/algorithm/advantage_fn/rec_advantage.py`)
    /// zeroes their advantage and whose REC loss takes the token mean over every row). `false`:
    /// they leave it, as if removed from the batch. Only read with `red_drop`. Default `false`; the
    /// `red_drop` preset sets `true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub red_drop_in_normaliser: Option<bool>,
    /// How RED-Drop chooses the dropped rows. `surplus`: exactly the surplus negatives, chosen at
    /// random, then mean (and std) recomputed on the kept rows (Trinity-RFT as released, PR #292,
    /// `rec_advantage.py` `drop = "balance"`). `bernoulli`: each negative dropped independently
    /// with probability 1 − pos/neg, the mean (and std) of all the group's rows kept (Trinity-RFT
    /// as first written, yaochaorui/Trinity-RFT commit 8a0e9e81). Only read with `red_drop`.
    /// Default `surplus`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub red_drop_rule: Option<RedDropRule>,

    // ----- policy loss, then its group of options (LOSS_OPTIONS; see PolicyLoss::options) -----
    /// Policy-gradient term. Default `ppo`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss: Option<PolicyLoss>,
    /// ε_low: lower clip range (ratio ≥ 1 − ε_low). Losses: ppo, gspo, rec. Default 0.2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_low: Option<f64>,
    /// ε_high: upper clip range (ratio ≤ 1 + ε_high). Losses: ppo, gspo, cispo, rec. Default 0.2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_high: Option<f64>,
    /// ε′_low of the ring keep-mask (must be ≥ ε_low, ≤ 1). Loss: rec. Default 0.6.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_low_prime: Option<f64>,
    /// ε′_high of the ring keep-mask (must be ≥ ε_high). Loss: rec. Default 2.0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_high_prime: Option<f64>,
    /// Dual-clip constant c > 1 (Ye et al., arXiv 1912.09729): for A < 0 the PPO/GSPO loss is capped at −c·A.
    /// Losses: ppo, gspo. Unset: off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dual_clip: Option<f64>,
    /// REC keep-mask. Loss: rec. Default `none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_mask: Option<KeepMask>,
    /// REC weight. Loss: rec. Default `none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rec_weight: Option<RecWeight>,
    /// T of the `advantage-exp` REC weight A·exp(A/T) (RED-Weight). Loss: rec. Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adv_temperature: Option<f64>,
    /// Truncated-IS cap C > 0 on the ratio: ρ becomes min(ρ, C) wherever it weights a gradient (the
    /// value is capped, the gradient direction kept). Losses: ppo, gspo, cispo, rec (`is`, `seq-is`
    /// weights). Unset: off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_cap: Option<f64>,

    // ----- applying to every loss -----
    /// Regulariser (OPMD, AsymRE). Default `none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regulariser: Option<Regulariser>,
    /// τ of the regulariser. Default 0.1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tau: Option<f64>,
    /// Log-ratios ℓ − ℓ_old and ℓ_ref − ℓ are clamped to ±this before exp, for numerical safety
    /// (a token clamped there gets no gradient through the ratio). Default 20 (as verl).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_ratio_clamp: Option<f64>,

    // ----- KL and entropy -----
    /// β, coefficient of the KL-to-reference term. 0 disables it (no reference log-probs needed). Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kl_coef: Option<f64>,
    /// KL estimator. Default `k3`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kl_estimator: Option<KlEstimator>,
    /// Multiply the KL term by the detached ratio ρ̄ = π_θ/π_old, correcting for off-policy samples
    /// (DeepSeek-V3.2's corrected k3). Default `false`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kl_ratio_weighted: Option<bool>,
    /// Entropy bonus coefficient: the loss gets −coef·H_t per token. Default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entropy_coef: Option<f64>,
    /// Off-policy sequence masking (OPSM, DeepSeek-V3.2 arXiv 2512.02556 Eq. 9; TRL's
    /// `off_policy_mask_threshold`): a row with A < 0 whose mean per-token log-ratio
    /// mean_t(ℓ_old − ℓ) (a k1 estimate of KL(π_behaviour ‖ π_θ), nats, with ℓ the current weights
    /// of the training forward, detached) exceeds δ gets no policy-gradient term; it stays in the
    /// normaliser, and its KL, entropy and regulariser terms are kept (as TRL). Any loss. Unset: off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opsm_delta: Option<f64>,
    /// Sampler/trainer mismatch correction, any loss, on ρ = exp(ℓ_trainer − ℓ_sampler) with
    /// ℓ_trainer taken at the start of the step (verl's `rollout_correction` semantics, stale rows
    /// included: [`crate::mismatch`]): `none`; `token-truncate`, `sequence-truncate`,
    /// `geometric-truncate` (weight min(ρ, C) on the token, product or geometric-mean ratio);
    /// `token-mask`, `sequence-mask`, `geometric-mask` (weight 0 where that ratio ∉ [lo, C], else
    /// 1); `icepop` (token weight ρ on [lo, C], else 0); `sequence-k3-mask` (a row whose mean
    /// per-token k3 exceeds `mismatch_k3_threshold` dropped). Default `none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatch_correction: Option<crate::MismatchCorrection>,
    /// C of `mismatch_correction`: the truncation cap, and the upper bound of the masks and of
    /// IcePop (its authors' β = 5). Default 2 (verl's `rollout_is_threshold`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatch_cap: Option<f64>,
    /// lo: lower bound of the kept ratios of `token-mask`, `sequence-mask`, `geometric-mask` and
    /// `icepop` (IcePop's authors: α = 0.5), in (0, C]; refused with the other corrections. Unset:
    /// 1/C (verl's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatch_low: Option<f64>,
    /// τ of `sequence-k3-mask`: the largest mean per-token k3 = ρ − 1 − log ρ a row may have (nats,
    /// ≥ 0). Default 0.01 (verl's `bypass_ppo_clip_k3_rs` preset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatch_k3_threshold: Option<f64>,

    // ----- aggregation and shaping -----
    /// Loss aggregation (normaliser). Default `token-mean`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregation: Option<Aggregation>,
    /// Truncated completions: `none`, `mask` or `soft` penalty. Default `none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlong: Option<Overlong>,
    /// Soft overlong buffer L_cache as a fraction of `rollout.max_new_tokens` (DAPO: 4096/20480 = 0.2).
    /// Default 0.2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlong_buffer_frac: Option<f64>,
    /// Scale of the soft overlong penalty (reward units; −factor at the limit). Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlong_penalty_factor: Option<f64>,
    /// DAPO dynamic sampling: the trainer drops zero-variance groups and samples more prompts to refill
    /// the batch. Read by the trainer, not by this crate. Default `false`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_sampling: Option<bool>,
}

/// The `[algorithm]` keys as rows of a Markdown table (`| `algorithm.KEY` | meaning |`), one per
/// field of [`AlgorithmConfig`] in its order, generated from the fields' `///` comments (rlvr-train's
/// README embeds them in its config reference, which a test keeps in sync).
pub fn reference_rows() -> String {
    let src = include_str!("config.rs");
    let start = src
        .find("pub struct AlgorithmConfig {")
        .expect("AlgorithmConfig is defined here");
    let mut out = String::new();
    let mut doc: Vec<&str> = Vec::new();
    for line in src[start..].lines().skip(1) {
        let l = line.trim();
        if l == "}" {
            break;
        }
        if let Some(d) = l.strip_prefix("///") {
            doc.push(d.trim());
        } else if let Some((field, _)) = l.strip_prefix("pub ").and_then(|r| r.split_once(':')) {
            if !doc.is_empty() {
                out.push_str(&format!(
                    "| `algorithm.{}` | {} |\n",
                    field.trim(),
                    doc.join(" ").replace('|', "\\|")
                ));
            }
            doc.clear();
        } else if !l.starts_with("#[") {
            doc.clear();
        }
    }
    out
}

impl Default for AlgorithmConfig {
    fn default() -> Self {
        Self::empty("grpo")
    }
}

/// Calls `$m!(field, ...)` with every `Option` knob of [`AlgorithmConfig`] whose resolved type in
/// [`Knobs`] is not an `Option`. The one list that keeps the two structs in step.
macro_rules! required_knobs {
    ($m:ident, $($args:tt)*) => {
        $m!($($args)*; baseline, std_norm, std_level, std_eps, baseline_shift, lme_temperature,
            exclude_zero_std, red_drop, red_drop_in_normaliser, red_drop_rule, loss, clip_low, clip_high, clip_low_prime, clip_high_prime,
            keep_mask, rec_weight, adv_temperature, regulariser, tau, log_ratio_clamp, kl_coef,
            kl_estimator, kl_ratio_weighted, entropy_coef, aggregation, overlong, overlong_buffer_frac,
            overlong_penalty_factor, dynamic_sampling, mismatch_correction, mismatch_cap,
            mismatch_k3_threshold)
    };
}
/// The knobs that stay `Option` after resolution.
macro_rules! optional_knobs {
    ($m:ident, $($args:tt)*) => {
        $m!($($args)*; dual_clip, is_cap, opsm_delta, mismatch_low)
    };
}
pub(crate) use {optional_knobs, required_knobs};

impl AlgorithmConfig {
    /// A config with preset `preset` and no knob set.
    pub fn empty(preset: &str) -> Self {
        AlgorithmConfig {
            preset: preset.to_string(),
            baseline: None,
            std_norm: None,
            std_level: None,
            std_eps: None,
            baseline_shift: None,
            lme_temperature: None,
            exclude_zero_std: None,
            red_drop: None,
            red_drop_in_normaliser: None,
            red_drop_rule: None,
            loss: None,
            clip_low: None,
            clip_high: None,
            clip_low_prime: None,
            clip_high_prime: None,
            dual_clip: None,
            keep_mask: None,
            rec_weight: None,
            adv_temperature: None,
            regulariser: None,
            tau: None,
            is_cap: None,
            log_ratio_clamp: None,
            kl_coef: None,
            kl_estimator: None,
            kl_ratio_weighted: None,
            entropy_coef: None,
            aggregation: None,
            overlong: None,
            overlong_buffer_frac: None,
            overlong_penalty_factor: None,
            dynamic_sampling: None,
            opsm_delta: None,
            mismatch_correction: None,
            mismatch_cap: None,
            mismatch_low: None,
            mismatch_k3_threshold: None,
        }
    }

    /// Every knob at its default (the optional ones unset), preset `"none"`: what resolution gives
    /// a knob neither the user nor the preset sets, the loss options of every loss included.
    pub fn defaults() -> Self {
        Knobs::default().to_config()
    }

    /// Fills every knob that is `None` here with `lower`'s value (the preset's). Values set here win.
    pub fn fill_unset_from(&mut self, lower: &AlgorithmConfig) {
        macro_rules! fill {
            ($s:ident, $l:ident; $($f:ident),*) => { $( if $s.$f.is_none() { $s.$f = $l.$f; } )* };
        }
        required_knobs!(fill, self, lower);
        optional_knobs!(fill, self, lower);
    }

    /// The knobs set here, as `(key, TOML-style value)` pairs in alphabetical order (no `preset`).
    pub fn set_values(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let value = serde_json::to_value(self).expect("AlgorithmConfig serialises to JSON");
        if let serde_json::Value::Object(map) = value {
            for (k, v) in map {
                if k == "preset" {
                    continue;
                }
                let s = match v {
                    serde_json::Value::String(s) => format!("\"{s}\""),
                    other => other.to_string(),
                };
                out.push((k, s));
            }
        }
        out
    }

    /// The loss-specific knobs ([`LOSS_OPTIONS`]) set here that `loss` does not read.
    pub fn inapplicable(&self, loss: PolicyLoss) -> Vec<&'static str> {
        let set = self.set_values();
        LOSS_OPTIONS
            .into_iter()
            .filter(|k| !loss.reads(k) && set.iter().any(|(s, _)| s == k))
            .collect()
    }

    /// Unsets the loss-specific knob `key` (one of [`LOSS_OPTIONS`]; other names are ignored).
    pub fn unset_loss_option(&mut self, key: &str) {
        match key {
            "clip_low" => self.clip_low = None,
            "clip_high" => self.clip_high = None,
            "clip_low_prime" => self.clip_low_prime = None,
            "clip_high_prime" => self.clip_high_prime = None,
            "dual_clip" => self.dual_clip = None,
            "keep_mask" => self.keep_mask = None,
            "rec_weight" => self.rec_weight = None,
            "adv_temperature" => self.adv_temperature = None,
            "is_cap" => self.is_cap = None,
            _ => {}
        }
    }
}

/// The `[algorithm]` choices that gate other knobs, in the order their gates are checked (the
/// policy loss is not among them: [`AlgorithmConfig::resolve`] checks its knobs with its
/// own message). Bare knob keys are `[algorithm]` keys.
pub const ALGORITHM_CHOICES: &[Choice<Algorithm>] = &[
    Choice::of::<Baseline>(|a| a.advantage.baseline.kind().part()),
    Choice::of::<StdNorm>(|a| match a.advantage.std {
        Some(s) => s.norm.part(),
        None => StdNorm::None.part(),
    }),
    Choice {
        key: "red_drop",
        quoted: false,
        parts: RED_DROP_PARTS,
        selected: |a| &RED_DROP_PARTS[usize::from(a.advantage.red_drop.is_none())],
        says: &[],
    },
    Choice::of::<KeepMask>(|a| match a.policy {
        Policy::Rec(r) => r.keep.kind().part(),
        _ => KeepMask::None.part(),
    }),
    Choice::of::<RecWeight>(|a| match a.policy {
        Policy::Rec(r) => r.scale.kind().part(),
        _ => RecWeight::None.part(),
    }),
    Choice::of::<Regulariser>(|a| a.regulariser.kind().part()),
    Choice {
        key: "kl_coef",
        quoted: false,
        parts: KL_PARTS,
        selected: |a| &KL_PARTS[usize::from(!a.needs_reference())],
        says: &[(
            "model.reference",
            "≠ 0 (the reference is loaded for the KL term)",
        )],
    },
    Choice::of::<MismatchCorrection>(|a: &Algorithm| a.mismatch.kind().part())
        .saying(&[("mismatch_cap", "a truncation, a mask or \"icepop\"")]),
    Choice::of::<Overlong>(|a| a.overlong.kind().part()),
];

/// The parts of `red_drop` (a switch): `true` reads its rule and whether dropped rows stay in the
/// normaliser, and reports what it dropped.
pub const RED_DROP_PARTS: &[Part] = &[
    Part {
        name: "true",
        knobs: &[
            Knob {
                key: "red_drop_in_normaliser",
                default: "false",
            },
            Knob {
                key: "red_drop_rule",
                default: "\"surplus\"",
            },
        ],
        metrics: &["red_drop/dropped_frac"],
    },
    Part {
        name: "false",
        knobs: &[],
        metrics: &[],
    },
];

/// The parts of `kl_coef` (β): a non-zero β reads the estimator, the ratio weighting and the
/// reference model (which the trainer loads for it), and reports the KL to the reference.
pub const KL_PARTS: &[Part] = &[
    Part {
        name: "≠ 0",
        knobs: &[
            Knob {
                key: "kl_estimator",
                default: "\"k3\"",
            },
            Knob {
                key: "kl_ratio_weighted",
                default: "false",
            },
            Knob {
                key: "model.reference",
                default: "unset",
            },
        ],
        metrics: &["kl_ref"],
    },
    Part {
        name: "0",
        knobs: &[],
        metrics: &[],
    },
];

/// The resolved knobs, flat: defaults < preset < user values, every knob filled. The resolve
/// step validates them ([`Knobs::validate`]) and builds the typed [`Algorithm`] from them
/// ([`Knobs::build`]); nothing else reads them. Field meanings and units: see the same-named
/// fields of [`AlgorithmConfig`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Knobs {
    pub preset: String,
    pub baseline: Baseline,
    pub std_norm: StdNorm,
    pub std_level: StdLevel,
    pub std_eps: f64,
    pub baseline_shift: f64,
    pub lme_temperature: f64,
    pub exclude_zero_std: bool,
    pub red_drop: bool,
    pub red_drop_in_normaliser: bool,
    pub red_drop_rule: RedDropRule,
    pub loss: PolicyLoss,
    pub clip_low: f64,
    pub clip_high: f64,
    pub clip_low_prime: f64,
    pub clip_high_prime: f64,
    pub dual_clip: Option<f64>,
    pub keep_mask: KeepMask,
    pub rec_weight: RecWeight,
    pub adv_temperature: f64,
    pub regulariser: Regulariser,
    pub tau: f64,
    pub is_cap: Option<f64>,
    pub log_ratio_clamp: f64,
    pub kl_coef: f64,
    pub kl_estimator: KlEstimator,
    pub kl_ratio_weighted: bool,
    pub entropy_coef: f64,
    pub aggregation: Aggregation,
    pub overlong: Overlong,
    pub overlong_buffer_frac: f64,
    pub overlong_penalty_factor: f64,
    pub dynamic_sampling: bool,
    pub opsm_delta: Option<f64>,
    pub mismatch_correction: crate::MismatchCorrection,
    pub mismatch_cap: f64,
    pub mismatch_low: Option<f64>,
    pub mismatch_k3_threshold: f64,
}

impl Default for Knobs {
    /// The config defaults (the only place they are written): GRPO-shaped advantages, PPO clip 0.2/0.2,
    /// token-mean, no KL, no entropy bonus, zero-variance groups out of the normaliser.
    fn default() -> Self {
        Knobs {
            preset: "none".into(),
            baseline: Baseline::Mean,
            std_norm: StdNorm::Sample,
            std_level: StdLevel::Group,
            std_eps: 1e-6,
            baseline_shift: 0.0,
            lme_temperature: 1.0,
            exclude_zero_std: true,
            red_drop: false,
            red_drop_in_normaliser: false,
            red_drop_rule: RedDropRule::Surplus,
            loss: PolicyLoss::Ppo,
            clip_low: 0.2,
            clip_high: 0.2,
            clip_low_prime: 0.6,
            clip_high_prime: 2.0,
            dual_clip: None,
            keep_mask: KeepMask::None,
            rec_weight: RecWeight::None,
            adv_temperature: 1.0,
            regulariser: Regulariser::None,
            tau: 0.1,
            is_cap: None,
            log_ratio_clamp: 20.0,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            kl_ratio_weighted: false,
            entropy_coef: 0.0,
            aggregation: Aggregation::TokenMean,
            overlong: Overlong::None,
            overlong_buffer_frac: 0.2,
            overlong_penalty_factor: 1.0,
            dynamic_sampling: false,
            opsm_delta: None,
            mismatch_correction: crate::MismatchCorrection::None,
            mismatch_cap: 2.0,
            mismatch_low: None,
            mismatch_k3_threshold: 0.01,
        }
    }
}

impl Knobs {
    /// Every knob set (the optional ones when `Some`), with this preset.
    pub(crate) fn to_config(&self) -> AlgorithmConfig {
        let mut c = AlgorithmConfig::empty(&self.preset);
        macro_rules! put {
            ($c:ident, $a:ident; $($f:ident),*) => { $( $c.$f = Some($a.$f); )* };
        }
        required_knobs!(put, c, self);
        macro_rules! put_opt {
            ($c:ident, $a:ident; $($f:ident),*) => { $( $c.$f = $a.$f; )* };
        }
        optional_knobs!(put_opt, c, self);
        c
    }
}
