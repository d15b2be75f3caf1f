//! The run directory's protocol, written once for the three programs that speak it: the trainer
//! (rlvr-train, which writes a run directory), the plotter (`rlvr plot`) and the lab (rlvr-lab,
//! which reads run directories and must not link the tensor crates). DESIGN.md section 10 is the
//! specification of the files; this crate is its code.
//!
//! - [`files`]: the names of the files in a run directory.
//! - [`key`]: the metric keys of metrics.jsonl and eval.jsonl as typed values ([`key::Metric`],
//!   [`key::Eval`]); no reader names a key as a string of its own.
//! - [`jsonl`]: the metrics line writer ([`jsonl::MetricsLine`]), appends, the resume cut-back,
//!   and the readers (strict, with file and line in the error; lenient, for a run still being
//!   written or killed mid-line).
//! - [`lock`]: the one-writer `flock` (the run directory's lock, taken by `rlvr train` and the lab;
//!   the same primitive holds rlvr-vllm's server leases and model output locks).
//! - [`schedule`]: s(t), the policy version that samples the batch of step t
//!   (DESIGN.md section 3), and the staleness and sync-window ends that follow from it.
//! - [`fs`]: the atomic replacement of a file (written beside it, synced, renamed).
//! - [`stamp`]: the host name and the UTC time that run.json and the lock records carry.
//! - [`spawn`]: child processes forked from one thread that lives as long as the process (the
//!   parent-death signal that rlvr's template worker asks for follows the forking thread); not
//!   the run directory's protocol, but this is the light crate below rlvr-model. rlvr-reward,
//!   which sits beside this crate in layer 0, keeps its own copy for its guard processes.
//!
//! Light: no tensor library; serde_json, anyhow and fs4 (the `flock` call) only.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod files;
pub mod fs;
pub mod jsonl;
pub mod key;
pub mod lock;
pub mod schedule;
pub mod spawn;
pub mod stamp;
