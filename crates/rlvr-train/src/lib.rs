//! # rlvr-train: the training system of rlvr
//!
//! The explorer/trainer loop of DESIGN.md section 3 (sync interval v, sync offset o, max staleness,
//! one code path), offline training from experiences files, supervised warm start, held-out
//! evaluation, checkpoints with exact resume, metrics and plots. The `rlvr` binary wires
//! [`cli`]'s `Args` and `run` functions into `rlvr train`, `rlvr sft`, `rlvr eval` and `rlvr plot`.
//!
//! Code map:
//! - [`config`]: the TOML config (defaults < preset < file < `--set`), resolve step, LR schedules.
//! - [`experience`]: the experience record and the offline JSONL reader.
//! - [`explorer`]: sampling + scoring one step's batch (rlvr-rollout, rlvr-reward), DAPO dynamic
//!   sampling, behaviour log-prob recomputation; the offline source.
//! - [`trainer`]: one trainer step (advantages, mini-batches × epochs, micro-batches under the
//!   update normaliser, gradient clipping, AdamW).
//! - [`run`]: the loop, run directory, staleness regimes, evaluation, checkpoints, resume.
//! - [`checkpoint`], [`metrics`], [`eval`], [`sft`], [`plot`], [`cli`].
//!
//! ```
//! use rlvr_train::config::{lr_at, Schedule, TrainSection};
//! use rlvr_train::run::behaviour_version;
//! // v = 4, o = 0: step 6 is trained on data sampled by version 4 (staleness 1).
//! assert_eq!(behaviour_version(6, 4, 0), 4);
//! // v = 1, o = 1 (one-step off-policy): step 6 uses version 4, staleness 1.
//! assert_eq!(behaviour_version(6, 1, 1), 4);
//! let t = TrainSection { lr: 1.0, warmup_steps: 2, steps: 10, schedule: Schedule::Constant, ..Default::default() };
//! assert_eq!(lr_at(&t, 1), 0.5);
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod eval;
pub mod experience;
pub mod explorer;
mod feed;
pub mod metrics;
pub mod plan;
pub mod plot;
pub mod run;
mod rundir;
pub mod sft;
pub mod trainer;
