//! The resolved policy loss as a value that carries its own parameters ([`Policy`]): the
//! policy-gradient term reads its knobs from here, so it cannot read one its loss does not have
//! (CISPO has no ε_low, REINFORCE no clip at all, only REC's ring keep-mask has ε′). The TOML
//! surface stays flat (`algorithm.clip_low`, ...); [`Algorithm::policy`] builds the value from the
//! resolved knobs.

use super::{Algorithm, KeepMask, PolicyLoss, RecWeight};

/// A clipped surrogate's parameters (PPO, GSPO).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Surrogate {
    /// ε_low: the ratio is clipped below at 1 − ε_low.
    pub clip_low: f64,
    /// ε_high: the ratio is clipped above at 1 + ε_high.
    pub clip_high: f64,
    /// Dual-clip c > 1: for A < 0 the loss is at most −c·A.
    pub dual_clip: Option<f64>,
    /// Truncated-IS cap C on the ratio.
    pub is_cap: Option<f64>,
}

/// CISPO's parameters: the IS weight is sg(min(ρ, 1 + ε_high)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cispo {
    /// ε_high of the weight's cap.
    pub clip_high: f64,
    /// Truncated-IS cap C on the ratio before the weight is taken.
    pub is_cap: Option<f64>,
}

/// REC's keep-mask, with the ring's own far bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RecKeep {
    /// k = 1.
    None,
    /// The tokens PPO's clip keeps.
    OneSide,
    /// 1 − ε_low ≤ ρ̄ ≤ 1 + ε_high.
    TwoSide,
    /// Two-side plus the far tails beyond ε′.
    Ring {
        /// ε′_low.
        clip_low_prime: f64,
        /// ε′_high.
        clip_high_prime: f64,
    },
    /// One-side on the detached sequence ratio.
    GspoOneSide,
}

/// REC's weight A′, with the parameters each reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RecScale {
    /// A′ = A.
    None,
    /// A′ = A·min(ρ̄, C).
    Is {
        /// The truncated-IS cap C.
        is_cap: Option<f64>,
    },
    /// A′ = A·min(s̄, C).
    SeqIs {
        /// The truncated-IS cap C.
        is_cap: Option<f64>,
    },
    /// A′ = A·exp(A/T).
    AdvantageExp {
        /// T.
        temperature: f64,
    },
}

/// REC's parameters (paper B, arXiv 2509.24203).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rec {
    /// The keep-mask.
    pub keep: RecKeep,
    /// The weight.
    pub scale: RecScale,
    /// ε_low of the keep-mask.
    pub clip_low: f64,
    /// ε_high of the keep-mask.
    pub clip_high: f64,
}

/// The policy-gradient term with its own parameters (module docs; the formulas are `loss.rs`'s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    /// PPO's clipped surrogate on the token ratio.
    Ppo(Surrogate),
    /// The clipped surrogate on the sequence ratio.
    Gspo(Surrogate),
    /// CISPO.
    Cispo(Cispo),
    /// The REC family.
    Rec(Rec),
    /// −A·ℓ: no parameters.
    Reinforce,
}

impl Algorithm {
    /// The policy loss with the parameters it reads, from the resolved knobs.
    pub fn policy(&self) -> Policy {
        let surrogate = Surrogate {
            clip_low: self.clip_low,
            clip_high: self.clip_high,
            dual_clip: self.dual_clip,
            is_cap: self.is_cap,
        };
        match self.loss {
            PolicyLoss::Ppo => Policy::Ppo(surrogate),
            PolicyLoss::Gspo => Policy::Gspo(surrogate),
            PolicyLoss::Cispo => Policy::Cispo(Cispo {
                clip_high: self.clip_high,
                is_cap: self.is_cap,
            }),
            PolicyLoss::Reinforce => Policy::Reinforce,
            PolicyLoss::Rec => Policy::Rec(Rec {
                keep: match self.keep_mask {
                    KeepMask::None => RecKeep::None,
                    KeepMask::OneSide => RecKeep::OneSide,
                    KeepMask::TwoSide => RecKeep::TwoSide,
                    KeepMask::Ring => RecKeep::Ring {
                        clip_low_prime: self.clip_low_prime,
                        clip_high_prime: self.clip_high_prime,
                    },
                    KeepMask::GspoOneSide => RecKeep::GspoOneSide,
                },
                scale: match self.rec_weight {
                    RecWeight::None => RecScale::None,
                    RecWeight::Is => RecScale::Is {
                        is_cap: self.is_cap,
                    },
                    RecWeight::SeqIs => RecScale::SeqIs {
                        is_cap: self.is_cap,
                    },
                    RecWeight::AdvantageExp => RecScale::AdvantageExp {
                        temperature: self.adv_temperature,
                    },
                },
                clip_low: self.clip_low,
                clip_high: self.clip_high,
            }),
        }
    }
}
