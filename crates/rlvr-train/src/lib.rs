//! # rlvr-train: the training system of rlvr
//!
//! The explorer/trainer loop of DESIGN.md section 3 (sync interval v, sync offset o, max staleness,
//! one code path), offline training from experiences files, supervised warm start, held-out
//! evaluation, checkpoints with exact resume, metrics and plots. The `rlvr` binary wires
//! [`cli`]'s `Args` and `run` functions into `rlvr train`, `rlvr sft`, `rlvr eval` and `rlvr plot`.
//!
//! Code map, one module per stage of the data flow:
//! - [`source`] (prompt source): the `[data]` split rendered with the policy's tokenizer; offline,
//!   the experiences file in place of the explorer; the cursor checkpoints save.
//! - [`explorer`]: sampling through the [`rlvr_rollout::Rollout`] boundary and scoring one step's
//!   batch (rlvr-reward), DAPO dynamic sampling, behaviour log-prob recomputation.
//! - [`schedule`] (staleness and sync schedule, paper A's sync interval v and the offset o): which
//!   version samples each step, weight sync to the explorer, inline or threaded explorer,
//!   stale-experience filter; [`backend`]: the explorer's engine (`rollout.backend`: native or
//!   vLLM servers through rlvr-vllm).
//! - [`trainer`] (trainer update): advantages, mini-batches × epochs, micro-batches under the
//!   update normaliser, on the rows packed by [`pack`].
//! - [`optimizer`] (optimizer step): accumulate → reduce hook → global norm → clip → AdamW, shared
//!   by RL and SFT; [`optimizer::GradReduce`] is where a data-parallel all-reduce plugs in.
//! - [`eval`] (evaluator): the one held-out evaluator of training, SFT, `rlvr eval` and the
//!   quickstart.
//! - [`checkpoint`]: checkpoints with exact resume.
//! - [`lora`]: LoRA in a run (`model.lora_*`: fresh adapters, the shared-base KL reference) and
//!   `rlvr merge`.
//! - [`run`] (run loop): set-up and the loop, one labelled line per stage.
//! - Around them: [`config`] (TOML config, LR schedules), [`experience`], [`metrics`], [`sft`]
//!   (supervised warm start on the same optimizer step and evaluator), [`plot`], [`cli`].
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

pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod eval;
pub mod experience;
pub mod explorer;
mod limits;
pub mod lock;
pub mod lora;
pub mod metrics;
pub mod mismatch;
pub mod optimizer;
pub mod pack;
pub mod plan;
pub mod plot;
pub mod run;
mod rundir;
pub mod schedule;
pub mod sft;
mod signals;
pub mod source;
pub mod trainer;
