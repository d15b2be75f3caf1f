//! The names of the files and folders of a run directory (DESIGN.md section 10).

use std::path::{Path, PathBuf};

/// One JSON object per step: the keys of [`crate::key::Metric`], plus `eval/*` at evaluation steps.
pub const METRICS: &str = "metrics.jsonl";
/// One JSON object per evaluation.
pub const EVAL: &str = "eval.jsonl";
/// Per-step distributions (histograms) and diagnostics.
pub const DIAGNOSTICS: &str = "diagnostics.jsonl";
/// Sampled completions with their rewards.
pub const ROLLOUTS: &str = "rollouts.jsonl";
/// The resolved config of the run.
pub const CONFIG: &str = "config.toml";
/// Git commit, seed, host, start and resume times.
pub const RUN_JSON: &str = "run.json";
/// Where the holder of the run directory's lock writes its pid, host and start time (the lock
/// itself is a `flock` on the directory: [`crate::lock::RunLock`]).
pub const LOCK: &str = ".lock";
/// The folder of a run's checkpoints (`step-N/` each, and `latest` naming the newest).
pub const CHECKPOINTS: &str = "checkpoints";

/// `run_dir/metrics.jsonl`.
pub fn metrics(run_dir: &Path) -> PathBuf {
    run_dir.join(METRICS)
}

/// `run_dir/eval.jsonl`.
pub fn eval(run_dir: &Path) -> PathBuf {
    run_dir.join(EVAL)
}

/// `run_dir/diagnostics.jsonl`.
pub fn diagnostics(run_dir: &Path) -> PathBuf {
    run_dir.join(DIAGNOSTICS)
}
