//! The resolved policy loss as a value that carries its own parameters ([`Policy`]): the
//! policy-gradient term reads its knobs from here, so it cannot read one its loss does not have
//! (CISPO has no ε_low, REINFORCE no clip at all, only REC's ring keep-mask has ε′). The TOML
//! surface stays flat (`algorithm.clip_low`, ...); the resolve step builds the value once
//! ([`crate::Algorithm::policy`]).

use super::{KeepMask, PolicyLoss, RecWeight};

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
    /// A′ = A·min(ρ̄, C), C = [`Rec::is_cap`].
    Is,
    /// A′ = A·min(s̄, C), C = [`Rec::is_cap`].
    SeqIs,
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
    /// The truncated-IS cap C of the `is` and `seq-is` weights (REC reads `is_cap` whatever its
    /// weight, as its registered part says; only those two weights apply it).
    pub is_cap: Option<f64>,
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

impl Policy {
    /// The flat choice this value is (`algorithm.loss`).
    pub fn loss(&self) -> PolicyLoss {
        match self {
            Policy::Ppo(_) => PolicyLoss::Ppo,
            Policy::Gspo(_) => PolicyLoss::Gspo,
            Policy::Cispo(_) => PolicyLoss::Cispo,
            Policy::Rec(_) => PolicyLoss::Rec,
            Policy::Reinforce => PolicyLoss::Reinforce,
        }
    }
}

impl RecKeep {
    /// The flat choice this value is (`algorithm.keep_mask`).
    pub fn kind(self) -> KeepMask {
        match self {
            RecKeep::None => KeepMask::None,
            RecKeep::OneSide => KeepMask::OneSide,
            RecKeep::TwoSide => KeepMask::TwoSide,
            RecKeep::Ring { .. } => KeepMask::Ring,
            RecKeep::GspoOneSide => KeepMask::GspoOneSide,
        }
    }
}

impl RecScale {
    /// The flat choice this value is (`algorithm.rec_weight`).
    pub fn kind(self) -> RecWeight {
        match self {
            RecScale::None => RecWeight::None,
            RecScale::Is => RecWeight::Is,
            RecScale::SeqIs => RecWeight::SeqIs,
            RecScale::AdvantageExp { .. } => RecWeight::AdvantageExp,
        }
    }
}
