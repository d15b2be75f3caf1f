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
    /// "eos" or "length"; a multi-turn episode's end: "done", "max_turns", "length", "budget",
    /// "eos" or "error".
    pub finish_reason: String,
    /// Assistant turns of a multi-turn episode; absent for a single-turn completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<u32>,
    /// The rewards the environment gave the episode, in order: each `step` reply's (null where
    /// it gave none), then `finish`'s when it gave one; absent for a single-turn completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_rewards: Option<Vec<Option<f64>>>,
    /// The environment's own numbers for the episode (`"metrics"` on its last reply), by name;
    /// absent when it gave none, for a failed episode and for a single-turn completion.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metrics: std::collections::BTreeMap<String, f64>,
}
