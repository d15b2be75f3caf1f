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

/// The steps a resume from the checkpoint of step `t` samples with other weights than an
/// uninterrupted run did, each with the version that sampled it there: the resumed explorer
/// starts at step `first` (after the checkpoint's buffered batches) holding version
/// `explorer_version`, and only ever loads newer versions, the policy's (t) and those of the
/// resumed run's own syncs. A step j in `first..=last_step` whose s(j) (interval `v`, offset
/// `o`) is at most t but neither the explorer's nor t is sampled with other weights (or waits
/// for a version no step sends). Empty for an exact resume.
pub fn resampled_steps(
    t: u64,
    first: u64,
    explorer_version: u64,
    (v, o): (u64, u64),
    last_step: u64,
) -> Vec<(u64, u64)> {
    (first..=last_step)
        .map(|j| (j, behaviour_version(j, v, o)))
        .take_while(|&(_, s)| s <= t)
        .filter(|&(_, s)| s != explorer_version && s != t)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: v = 1, o = 1, a checkpoint of step 2 without its in-flight batch (first = 3,
    /// explorer at version 2, the policy's): step 3 was sampled by version 1. With the buffer
    /// (first = 4) nothing is re-sampled. v = 2, o = 1, step 4 (s(5) = 2, s(6) = 4): without the
    /// buffer and with the explorer at the last sync (4), step 5 is re-sampled; at step 3 (s(4)
    /// = 2, the explorer kept at version 2) nothing is. A run extended past step 4 at v = 4,
    /// o = 1: s(5) = 0 while the explorer holds 4.
    #[test]
    fn resampled_steps_by_hand() {
        assert_eq!(resampled_steps(2, 3, 2, (1, 1), 6), [(3, 1)]);
        assert_eq!(resampled_steps(2, 4, 2, (1, 1), 6), []);
        assert_eq!(resampled_steps(4, 5, 4, (2, 1), 8), [(5, 2)]);
        assert_eq!(resampled_steps(3, 4, 2, (2, 1), 8), []);
        assert_eq!(resampled_steps(4, 5, 4, (4, 1), 9), [(5, 0)]);
        assert_eq!(resampled_steps(2, 3, 2, (1, 2), 6), [(3, 0), (4, 1)]);
        // Nothing left to sample: exact.
        assert_eq!(resampled_steps(6, 7, 6, (1, 1), 6), []);
    }
}
