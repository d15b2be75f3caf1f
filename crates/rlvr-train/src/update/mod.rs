//! The trainer update (DESIGN.md sections 3 and 4): advantages, mini-batches × epochs of optimizer
//! updates under one update-level normaliser, the sampler/trainer mismatch correction, and the
//! optimizer step that RL and SFT share.
//!
//! - [`trainer`]: one trainer step on a batch of experiences;
//! - [`optimizer`]: accumulate → reduce hook → global norm → clip → AdamW;
//! - [`mismatch`]: the per-token correction weights of `algorithm.mismatch_correction`;
//! - [`lr`]: the learning-rate schedule;
//! - [`dp`]: data parallel: the gathered row metadata and the reduced loss statistics.
//!
//! Architecture invariant: an update's gradient does not depend on how its rows are split into
//! micro-batches (the normaliser is fixed over the whole update before micro-batching, and
//! micro-batch gradients are summed, never averaged), and a non-finite loss or gradient skips the
//! whole update; data parallel, the same holds for how the step's groups are split over ranks
//! (every rank computes the one-process normaliser from gathered metadata). The trainer receives the built policy, reference and its own settings; it never
//! sees the config, the feed or the run directory.

pub mod dp;
pub mod lr;
pub mod mismatch;
pub mod optimizer;
pub mod trainer;

pub use lr::{LrSchedule, Schedule};
pub use optimizer::{GradReduce, LocalReduce, OptimizerStep};
pub use trainer::{StepReport, Trainer, TrainerRecord, TrainerSettings, UpdateSettings};
