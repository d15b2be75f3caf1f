//! The learning-rate schedule over optimizer steps, shared by RL and SFT: linear warm-up from 0,
//! then constant, linear or cosine decay to a floor at the last step.

use rlvr_algo::parts::{Knob, Part, Registered};
use serde::{Deserialize, Serialize};

/// Learning-rate schedule over trainer steps (all start with `train.warmup_steps` of linear warm-up
/// from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    /// lr after the warm-up.
    Constant,
    /// Linear decay from lr to `train.min_lr` at the last step.
    Linear,
    /// Cosine decay from lr to `train.min_lr` at the last step.
    Cosine,
}

/// The decays read their floor.
const MIN_LR: &[Knob] = &[Knob {
    key: "min_lr",
    default: "0.0",
}];

impl Registered for Schedule {
    const KEY: &'static str = "schedule";
    const PARTS: &'static [Part] = &[
        Part {
            name: "constant",
            knobs: &[],
            metrics: &[],
        },
        Part {
            name: "linear",
            knobs: MIN_LR,
            metrics: &[],
        },
        Part {
            name: "cosine",
            knobs: MIN_LR,
            metrics: &[],
        },
    ];
}

/// A learning-rate schedule (the `train.lr`, `train.min_lr`, `train.warmup_steps`,
/// `train.schedule` and `train.steps` keys).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub lr: f64,
    /// Floor of the linear and cosine decays.
    pub min_lr: f64,
    /// Steps of linear warm-up from 0 to `lr`.
    pub warmup_steps: u64,
    /// The shape after the warm-up.
    pub schedule: Schedule,
    /// The last step (where the decays reach `min_lr`).
    pub steps: u64,
}

impl LrSchedule {
    /// The constant rate `lr` over `steps` steps, without warm-up.
    pub fn constant(lr: f64, steps: u64) -> Self {
        LrSchedule {
            lr,
            min_lr: 0.0,
            warmup_steps: 0,
            schedule: Schedule::Constant,
            steps,
        }
    }

    /// The learning rate of step `step` (1-based): lr·step/warmup for step ≤ warmup, then
    /// constant, linear or cosine decay to `min_lr` at `steps`.
    pub fn at(&self, step: u64) -> f64 {
        if self.warmup_steps > 0 && step <= self.warmup_steps {
            return self.lr * step as f64 / self.warmup_steps as f64;
        }
        let span = self.steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = (step.saturating_sub(self.warmup_steps) as f64 / span).clamp(0.0, 1.0);
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::Linear => self.min_lr + (self.lr - self.min_lr) * (1.0 - progress),
            Schedule::Cosine => {
                self.min_lr
                    + (self.lr - self.min_lr)
                        * 0.5
                        * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}
