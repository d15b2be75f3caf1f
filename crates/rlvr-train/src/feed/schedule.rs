//! The staleness rule (DESIGN.md section 3): which policy version samples the batch of each step,
//! and which experiences are too stale to train on.
//!
//! Source: paper A, "Revisiting Group Relative Policy Optimization: Insights into On-Policy and
//! Off-Policy Training" (arXiv 2505.22257), off-policy GRPO: the behaviour policy's weights are
//! refreshed from the trainer only every v steps, so the batch of step t is sampled by version
//! v·⌊(t−1)/v⌋ and is 0..v−1 steps stale; v = 1 is on-policy GRPO (DESIGN.md section 3 summarises
//! it). The sync offset o and `sync.max_staleness` have the meaning of Trinity-RFT's
//! `sync_offset` / `max_staleness` (DESIGN.md section 3): the explorer runs o steps ahead, adding o
//! to every staleness, and experiences staler than the bound are dropped.

use crate::store::experience::Experience;

/// Policy version whose weights sample the batch of step `t` (1-based) under interval `v`, offset
/// `o`: s(t) = v·⌊(t−1−o)/v⌋ (DESIGN.md section 3), written once in rlvr-rundir, which the lab
/// shares.
pub use rlvr_rundir::schedule::behaviour_version;

/// Drops experiences whose staleness (t − 1) − version exceeds `max` (`sync.max_staleness`; those
/// without a version are kept; DESIGN.md section 3, Trinity-RFT's `max_staleness`).
/// Returns the kept ones and how many were dropped.
pub fn filter_stale(
    exps: Vec<Experience>,
    step: u64,
    max: Option<u64>,
) -> (Vec<Experience>, usize) {
    let Some(max) = max else {
        return (exps, 0);
    };
    let n = exps.len();
    let kept: Vec<Experience> = exps
        .into_iter()
        .filter(|e| e.staleness(step).is_none_or(|s| s <= max))
        .collect();
    let d = n - kept.len();
    (kept, d)
}
