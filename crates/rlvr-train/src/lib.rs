//! # rlvr-train: the training system of rlvr
//!
//! The explorer/trainer loop of DESIGN.md section 3 (sync interval v, sync offset o, max staleness,
//! one code path), offline training from experiences files, supervised warm start, held-out
//! evaluation, checkpoints with exact resume, metrics and plots. The `rlvr` binary wires
//! [`cli`]'s `Args` and `run` functions into `rlvr train`, `rlvr sft`, `rlvr eval`, `rlvr generate`,
//! `rlvr plan`, `rlvr merge` and `rlvr plot`.
//!
//! Layers, every import pointing down (`tests/it/module_graph.rs` checks it):
//! - bottom, knowing no stage and no config: [`log`] (train.log and the progress bar), [`store`]
//!   (the on-disk records and the binary row codec), [`pack`] (rows into padded batches),
//!   [`score`] (log-probs without gradient), [`job`] (one process or one rank of a
//!   data-parallel run: the launch, the communicator and the job's collectives, always present);
//! - the stages, which do not import each other: [`feed`] (where a step's batch comes from, and
//!   the one place that picks the rollout backend), [`update`] (trainer, optimizer, mismatch),
//!   [`eval`] (the one evaluator), [`lora`]; beside them [`plot`];
//! - [`config`]: the TOML config, its checks, and [`config::settings`], the one translation of the
//!   resolved config into each stage's settings;
//! - top: [`run`] (the loop and its composition root), [`sft`], then [`cli`].
//!
//! ```
//! use rlvr_train::config::{lr_at, Schedule, TrainSection};
//! use rlvr_train::feed::behaviour_version;
//! // v = 4, o = 0: step 6 is trained on data sampled by version 4 (staleness 1).
//! assert_eq!(behaviour_version(6, 4, 0), 4);
//! // v = 1, o = 1 (one-step off-policy): step 6 uses version 4, staleness 1.
//! assert_eq!(behaviour_version(6, 1, 1), 4);
//! let t = TrainSection { lr: 1.0, warmup_steps: 2, steps: 10, schedule: Schedule::Constant, ..Default::default() };
//! assert_eq!(lr_at(&t, 1), 0.5);
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod eval;
pub mod feed;
pub mod job;
mod log;
pub use log::counted;
pub mod lora;
pub mod pack;
pub mod plot;
pub mod run;
pub mod score;
pub mod sft;
pub mod store;
pub mod update;
