//! The resolved algorithm as values that carry their own parameters: the advantage (its baseline
//! with the log-mean-exp temperature, its std division with level and ε, its shift, RED-Drop with
//! its rule), the policy loss ([`Policy`]), the regulariser with its τ, the KL term, the overlong
//! treatment with its buffer and penalty, and the mismatch correction with its bounds. Code reads a
//! knob through the value of the part that has it, so it cannot read a knob the chosen part does
//! not have (a regulariser's τ without a regulariser, a std ε without a std division, the
//! log-mean-exp temperature under another baseline). The anchor is Trinity-RFT's registered
//! algorithm parts, each built with its own arguments (`trinity/algorithm/advantage_fn/`,
//! `policy_loss_fn/`).
//!
//! The TOML surface stays flat ([`AlgorithmConfig`]): `Knobs::build` makes these values once, at
//! resolve, and [`Algorithm::to_config`] writes them back as the flat table (a knob the chosen
//! part does not read is written with its default: rlvr-train leaves such knobs out of
//! `config.toml` anyway, and the loss options of other losses are unset as before).

use super::policy::{Cispo, Policy, Rec, RecKeep, RecScale, Surrogate};
use super::{
    Aggregation, AlgorithmConfig, Baseline, KeepMask, KlEstimator, Knobs, Overlong, PolicyLoss,
    RecWeight, RedDropRule, Regulariser, StdLevel, StdNorm, LOSS_OPTIONS,
};
use crate::{IsCorrection, MismatchCorrection};

/// The group baseline b, with the parameter only log-mean-exp has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GroupBaseline {
    /// The group mean ([`Baseline::Mean`]).
    Mean,
    /// T·log(mean_j exp(r_j / T)) ([`Baseline::LogMeanExp`]).
    LogMeanExp {
        /// T (`lme_temperature`), > 0.
        temperature: f64,
    },
    /// The mean of the other K−1 rewards ([`Baseline::LeaveOneOut`]).
    LeaveOneOut,
}

impl GroupBaseline {
    /// The flat choice this value is (`algorithm.baseline`).
    pub fn kind(self) -> Baseline {
        match self {
            GroupBaseline::Mean => Baseline::Mean,
            GroupBaseline::LogMeanExp { .. } => Baseline::LogMeanExp,
            GroupBaseline::LeaveOneOut => Baseline::LeaveOneOut,
        }
    }
}

/// The division of the centred reward by a std: A = (r − b)/(σ + ε).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StdDivision {
    /// Which std (`std_norm`): [`StdNorm::Sample`] or [`StdNorm::Population`], never
    /// [`StdNorm::None`] (no division is `Advantage::std = None`).
    pub norm: StdNorm,
    /// Over which rows σ is taken (`std_level`).
    pub level: StdLevel,
    /// ε (`std_eps`), ≥ 0.
    pub eps: f64,
}

/// RED-Drop (paper B, arXiv 2509.24203) with its own knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RedDrop {
    /// How the dropped rows are chosen (`red_drop_rule`).
    pub rule: RedDropRule,
    /// Whether dropped rows stay in the normaliser with A = 0 (`red_drop_in_normaliser`).
    pub in_normaliser: bool,
}

/// The advantage: A = (r − b − δ)/(σ + ε) per group, with RED-Drop and the zero-variance rule
/// ([`crate::compute_advantages`] applies it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Advantage {
    /// The baseline b.
    pub baseline: GroupBaseline,
    /// The std division; `None` for `std_norm = "none"`.
    pub std: Option<StdDivision>,
    /// δ (`baseline_shift`), subtracted from every advantage (reward units).
    pub shift: f64,
    /// Zero-variance groups leave the normaliser (`exclude_zero_std`).
    pub exclude_zero_std: bool,
    /// RED-Drop; `None` when `red_drop = false`.
    pub red_drop: Option<RedDrop>,
}

/// The regulariser with its τ (paper B's REP family).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RegTerm {
    /// No regulariser.
    None,
    /// OPMD: +τ·(ℓ − ℓ_old)².
    Opmd {
        /// τ, ≥ 0.
        tau: f64,
    },
    /// AsymRE: −τ·ℓ.
    Asymre {
        /// τ, ≥ 0.
        tau: f64,
    },
}

impl RegTerm {
    /// The flat choice this value is (`algorithm.regulariser`).
    pub fn kind(self) -> Regulariser {
        match self {
            RegTerm::None => Regulariser::None,
            RegTerm::Opmd { .. } => Regulariser::Opmd,
            RegTerm::Asymre { .. } => Regulariser::Asymre,
        }
    }
}

/// The KL-to-reference term β·k(ℓ_ref − ℓ). Kept whole when β = 0: the trainer still reports the
/// KL to a reference it was given, with this estimator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Kl {
    /// β (`kl_coef`), ≥ 0; 0 turns the term (and the reference model) off.
    pub coef: f64,
    /// The estimator (`kl_estimator`).
    pub estimator: KlEstimator,
    /// The term is multiplied by the detached ratio ρ̄ (`kl_ratio_weighted`).
    pub ratio_weighted: bool,
}

/// The treatment of truncated completions, with the soft penalty's own knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OverlongRule {
    /// Truncated completions train like any other.
    None,
    /// They get no gradient and leave the normaliser.
    Mask,
    /// DAPO's soft penalty added to the reward ([`crate::overlong_penalty`]).
    Soft {
        /// L_cache as a fraction of `rollout.max_new_tokens` (`overlong_buffer_frac`), in (0, 1].
        buffer_frac: f64,
        /// The penalty at the limit, reward units (`overlong_penalty_factor`), ≥ 0.
        penalty_factor: f64,
    },
}

impl OverlongRule {
    /// The flat choice this value is (`algorithm.overlong`).
    pub fn kind(self) -> Overlong {
        match self {
            OverlongRule::None => Overlong::None,
            OverlongRule::Mask => Overlong::Mask,
            OverlongRule::Soft { .. } => Overlong::Soft,
        }
    }
}

/// The sampler/trainer mismatch correction with the bounds its kind reads ([`crate::mismatch`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Correction {
    /// No correction.
    Off,
    /// A truncation (`token-`, `sequence-`, `geometric-truncate`) with its cap C.
    Truncate {
        /// Which truncation.
        kind: MismatchCorrection,
        /// C (`mismatch_cap`).
        cap: f64,
    },
    /// A mask (`token-`, `sequence-`, `geometric-mask`) or IcePop, on [lo, C].
    Bounded {
        /// Which mask.
        kind: MismatchCorrection,
        /// C (`mismatch_cap`).
        cap: f64,
        /// lo (`mismatch_low`); unset: 1/C.
        low: Option<f64>,
    },
    /// `sequence-k3-mask` with its threshold τ (`mismatch_k3_threshold`, nats).
    K3Mask {
        /// τ.
        threshold: f64,
    },
}

impl Correction {
    /// The flat choice this value is (`algorithm.mismatch_correction`).
    pub fn kind(self) -> MismatchCorrection {
        match self {
            Correction::Off => MismatchCorrection::None,
            Correction::Truncate { kind, .. } | Correction::Bounded { kind, .. } => kind,
            Correction::K3Mask { .. } => MismatchCorrection::SequenceK3Mask,
        }
    }

    /// The correction as [`crate::correction_weights`] takes it; `None` when off.
    pub fn weights(self) -> Option<IsCorrection> {
        match self {
            Correction::Off => None,
            // The k3 threshold is not read by a truncation or a mask.
            Correction::Truncate { kind, cap } => kind.with_bounds(cap, None, 0.0),
            Correction::Bounded { kind, cap, low } => kind.with_bounds(cap, low, 0.0),
            Correction::K3Mask { threshold } => Some(IsCorrection::K3Mask { threshold }),
        }
    }
}

/// The resolved algorithm: what every function of this crate reads, each choice a value with its
/// own parameters (module docs). Build it with [`AlgorithmConfig::resolve`];
/// [`Algorithm::to_config`] gives back the flat table (for `RUN_DIR/config.toml`).
#[derive(Debug, Clone, PartialEq)]
pub struct Algorithm {
    /// The preset it was resolved from (`"none"` for none).
    pub preset: String,
    /// The advantage.
    pub advantage: Advantage,
    /// The policy-gradient term with its parameters.
    pub policy: Policy,
    /// The regulariser.
    pub regulariser: RegTerm,
    /// The clamp of log-ratios before exp (`log_ratio_clamp`), > 0.
    pub log_ratio_clamp: f64,
    /// The KL-to-reference term.
    pub kl: Kl,
    /// The entropy bonus coefficient (`entropy_coef`).
    pub entropy_coef: f64,
    /// OPSM's δ (`opsm_delta`, nats); `None`: off.
    pub opsm_delta: Option<f64>,
    /// The mismatch correction.
    pub mismatch: Correction,
    /// The loss aggregation.
    pub aggregation: Aggregation,
    /// The treatment of truncated completions.
    pub overlong: OverlongRule,
    /// DAPO dynamic sampling (read by the trainer).
    pub dynamic_sampling: bool,
}

impl Default for Algorithm {
    /// The config defaults (`Knobs::default`, the only place they are written), preset `"none"`.
    fn default() -> Self {
        Knobs::default().build()
    }
}

impl Knobs {
    /// The typed values of these (validated) knobs.
    pub(crate) fn build(&self) -> Algorithm {
        let k = self;
        let surrogate = Surrogate {
            clip_low: k.clip_low,
            clip_high: k.clip_high,
            dual_clip: k.dual_clip,
            is_cap: k.is_cap,
        };
        let policy = match k.loss {
            PolicyLoss::Ppo => Policy::Ppo(surrogate),
            PolicyLoss::Gspo => Policy::Gspo(surrogate),
            PolicyLoss::Cispo => Policy::Cispo(Cispo {
                clip_high: k.clip_high,
                is_cap: k.is_cap,
            }),
            PolicyLoss::Reinforce => Policy::Reinforce,
            PolicyLoss::Rec => Policy::Rec(Rec {
                keep: match k.keep_mask {
                    KeepMask::None => RecKeep::None,
                    KeepMask::OneSide => RecKeep::OneSide,
                    KeepMask::TwoSide => RecKeep::TwoSide,
                    KeepMask::Ring => RecKeep::Ring {
                        clip_low_prime: k.clip_low_prime,
                        clip_high_prime: k.clip_high_prime,
                    },
                    KeepMask::GspoOneSide => RecKeep::GspoOneSide,
                },
                scale: match k.rec_weight {
                    RecWeight::None => RecScale::None,
                    RecWeight::Is => RecScale::Is,
                    RecWeight::SeqIs => RecScale::SeqIs,
                    RecWeight::AdvantageExp => RecScale::AdvantageExp {
                        temperature: k.adv_temperature,
                    },
                },
                clip_low: k.clip_low,
                clip_high: k.clip_high,
                is_cap: k.is_cap,
            }),
        };
        let advantage = Advantage {
            baseline: match k.baseline {
                Baseline::Mean => GroupBaseline::Mean,
                Baseline::LogMeanExp => GroupBaseline::LogMeanExp {
                    temperature: k.lme_temperature,
                },
                Baseline::LeaveOneOut => GroupBaseline::LeaveOneOut,
            },
            std: (k.std_norm != StdNorm::None).then_some(StdDivision {
                norm: k.std_norm,
                level: k.std_level,
                eps: k.std_eps,
            }),
            shift: k.baseline_shift,
            exclude_zero_std: k.exclude_zero_std,
            red_drop: k.red_drop.then_some(RedDrop {
                rule: k.red_drop_rule,
                in_normaliser: k.red_drop_in_normaliser,
            }),
        };
        let mc = k.mismatch_correction;
        let mismatch = if mc == MismatchCorrection::SequenceK3Mask {
            Correction::K3Mask {
                threshold: k.mismatch_k3_threshold,
            }
        } else if mc.has_lower_bound() {
            Correction::Bounded {
                kind: mc,
                cap: k.mismatch_cap,
                low: k.mismatch_low,
            }
        } else if mc.reads_cap() {
            Correction::Truncate {
                kind: mc,
                cap: k.mismatch_cap,
            }
        } else {
            Correction::Off
        };
        Algorithm {
            preset: k.preset.clone(),
            advantage,
            policy,
            regulariser: match k.regulariser {
                Regulariser::None => RegTerm::None,
                Regulariser::Opmd => RegTerm::Opmd { tau: k.tau },
                Regulariser::Asymre => RegTerm::Asymre { tau: k.tau },
            },
            log_ratio_clamp: k.log_ratio_clamp,
            kl: Kl {
                coef: k.kl_coef,
                estimator: k.kl_estimator,
                ratio_weighted: k.kl_ratio_weighted,
            },
            entropy_coef: k.entropy_coef,
            opsm_delta: k.opsm_delta,
            mismatch,
            aggregation: k.aggregation,
            overlong: match k.overlong {
                Overlong::None => OverlongRule::None,
                Overlong::Mask => OverlongRule::Mask,
                Overlong::Soft => OverlongRule::Soft {
                    buffer_frac: k.overlong_buffer_frac,
                    penalty_factor: k.overlong_penalty_factor,
                },
            },
            dynamic_sampling: k.dynamic_sampling,
        }
    }
}

impl Algorithm {
    /// The flat knobs of these values: each part's own knobs from the part, every knob the chosen
    /// parts do not have at its default.
    fn knobs(&self) -> Knobs {
        let mut k = Knobs {
            preset: self.preset.clone(),
            ..Knobs::default()
        };
        let a = &self.advantage;
        k.baseline = a.baseline.kind();
        if let GroupBaseline::LogMeanExp { temperature } = a.baseline {
            k.lme_temperature = temperature;
        }
        match a.std {
            Some(s) => (k.std_norm, k.std_level, k.std_eps) = (s.norm, s.level, s.eps),
            None => k.std_norm = StdNorm::None,
        }
        k.baseline_shift = a.shift;
        k.exclude_zero_std = a.exclude_zero_std;
        if let Some(r) = a.red_drop {
            (k.red_drop, k.red_drop_rule, k.red_drop_in_normaliser) =
                (true, r.rule, r.in_normaliser);
        }
        k.loss = self.policy.loss();
        match self.policy {
            Policy::Ppo(s) | Policy::Gspo(s) => {
                (k.clip_low, k.clip_high) = (s.clip_low, s.clip_high);
                (k.dual_clip, k.is_cap) = (s.dual_clip, s.is_cap);
            }
            Policy::Cispo(c) => (k.clip_high, k.is_cap) = (c.clip_high, c.is_cap),
            Policy::Rec(r) => {
                (k.clip_low, k.clip_high, k.is_cap) = (r.clip_low, r.clip_high, r.is_cap);
                k.keep_mask = r.keep.kind();
                k.rec_weight = r.scale.kind();
                if let RecKeep::Ring {
                    clip_low_prime,
                    clip_high_prime,
                } = r.keep
                {
                    (k.clip_low_prime, k.clip_high_prime) = (clip_low_prime, clip_high_prime);
                }
                if let RecScale::AdvantageExp { temperature } = r.scale {
                    k.adv_temperature = temperature;
                }
            }
            Policy::Reinforce => {}
        }
        k.regulariser = self.regulariser.kind();
        if let RegTerm::Opmd { tau } | RegTerm::Asymre { tau } = self.regulariser {
            k.tau = tau;
        }
        k.log_ratio_clamp = self.log_ratio_clamp;
        (k.kl_coef, k.kl_estimator, k.kl_ratio_weighted) =
            (self.kl.coef, self.kl.estimator, self.kl.ratio_weighted);
        k.entropy_coef = self.entropy_coef;
        k.opsm_delta = self.opsm_delta;
        k.mismatch_correction = self.mismatch.kind();
        match self.mismatch {
            Correction::Off => {}
            Correction::Truncate { cap, .. } => k.mismatch_cap = cap,
            Correction::Bounded { cap, low, .. } => (k.mismatch_cap, k.mismatch_low) = (cap, low),
            Correction::K3Mask { threshold } => k.mismatch_k3_threshold = threshold,
        }
        k.aggregation = self.aggregation;
        k.overlong = self.overlong.kind();
        if let OverlongRule::Soft {
            buffer_frac,
            penalty_factor,
        } = self.overlong
        {
            (k.overlong_buffer_frac, k.overlong_penalty_factor) = (buffer_frac, penalty_factor);
        }
        k.dynamic_sampling = self.dynamic_sampling;
        k
    }

    /// An [`AlgorithmConfig`] that resolves back to `self`: the same preset, every knob of the
    /// chosen parts set (the optional ones when `Some`), the knobs no chosen part reads at their
    /// defaults, and the loss-specific knobs of other losses unset (resolving fills them from the
    /// preset and the defaults as before, and the loss never reads them).
    pub fn to_config(&self) -> AlgorithmConfig {
        let mut c = self.knobs().to_config();
        let loss = self.policy.loss();
        for key in LOSS_OPTIONS {
            if !loss.reads(key) {
                c.unset_loss_option(key);
            }
        }
        c
    }

    /// Whether the loss needs reference log-probs (`kl_coef` ≠ 0).
    pub fn needs_reference(&self) -> bool {
        self.kl.coef != 0.0
    }

    /// Whether the loss needs per-token entropies (`entropy_coef` ≠ 0).
    pub fn needs_entropy(&self) -> bool {
        self.entropy_coef != 0.0
    }
}
