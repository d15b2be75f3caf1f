//! `RUN_DIR/rollouts.jsonl`: a few sampled completions of every step, as text, for a person to
//! read (the run loop adds `step` and `staleness` to each line).

use serde::{Deserialize, Serialize};

/// One sampled completion kept for rollouts.jsonl.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    /// Group id.
    pub group_id: String,
    /// Prompt text.
    pub prompt: String,
    /// Completion text (special tokens kept).
    pub completion: String,
    /// Reward (null = unscorable).
    pub reward: Option<f64>,
    /// Judged correct.
    pub correct: Option<bool>,
    /// Behaviour version.
    pub version: Option<u64>,
    /// "eos" or "length".
    pub finish_reason: String,
}
