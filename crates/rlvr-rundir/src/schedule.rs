//! s(t), the staleness schedule (DESIGN.md section 3): which policy version samples the batch of
//! each step. The trainer's feed samples by it; the lab finds the end of each sync window by it
//! (the lab may not depend on rlvr-train, so the rule lives here, once).
//!
//! Source: paper A, "Revisiting Group Relative Policy Optimization: Insights into On-Policy and
//! Off-Policy Training" (arXiv 2505.22257): the behaviour policy's weights are refreshed from the
//! trainer only every v steps; the sync offset o has the meaning of Trinity-RFT's `sync_offset`
//! (the explorer runs o steps ahead, adding o to every staleness).

/// Policy version whose weights sample the batch of step `t` (1-based) under interval `v` (≥ 1),
/// offset `o`: s(t) = v·⌊(t−1−o)/v⌋, and 0 while t − 1 < o (DESIGN.md section 3; o = 0 is paper
/// A's off-policy GRPO, arXiv 2505.22257), so the staleness (t − 1) − s(t) lies in [o, o + v − 1].
///
/// # Panics
/// `v` = 0 with t ≥ 1 + o (the config refuses an interval of 0).
pub fn behaviour_version(t: u64, v: u64, o: u64) -> u64 {
    if t < 1 + o {
        0
    } else {
        v * ((t - 1 - o) / v)
    }
}

/// The staleness of step `t`'s batch (1-based t ≥ 1): (t − 1) − s(t), in [0, o + v − 1] (below o
/// only for the first o steps, which the initial weights sample).
pub fn staleness(t: u64, v: u64, o: u64) -> u64 {
    (t - 1) - behaviour_version(t, v, o)
}

/// Whether step `t` (1-based) is the last step of a sync window under interval `v` (0 read as 1)
/// and offset `o`: the step whose batch is the stalest of its window, staleness o + v − 1, which
/// is t ≥ 1 + o and (t − o) mod v = 0. With v = 1 every step from 1 + o ends a window.
pub fn window_end(t: u64, v: u64, o: u64) -> bool {
    let v = v.max(1);
    t >= 1 && staleness(t, v, o) == o + v - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_of_paper_a_with_an_offset() {
        // v = 4, o = 0: versions 0,0,0,0,4,4,4,4,8; staleness 0,1,2,3,0,...
        let s: Vec<u64> = (1..=9).map(|t| behaviour_version(t, 4, 0)).collect();
        assert_eq!(s, [0, 0, 0, 0, 4, 4, 4, 4, 8]);
        let st: Vec<u64> = (1..=9).map(|t| staleness(t, 4, 0)).collect();
        assert_eq!(st, [0, 1, 2, 3, 0, 1, 2, 3, 0]);
        // v = 1, o = 1: version t − 2 from step 2, staleness 1 throughout after step 1.
        assert_eq!(behaviour_version(6, 1, 1), 4);
        assert_eq!(behaviour_version(1, 1, 1), 0);
        // Window ends: the closed form (t > o and (t − o) mod v = 0) for every small case.
        for v in 0..6u64 {
            for o in 0..5u64 {
                for t in 1..40u64 {
                    let closed = t > o && (t - o).is_multiple_of(v.max(1));
                    assert_eq!(window_end(t, v, o), closed, "t {t} v {v} o {o}");
                }
            }
        }
        assert!(!window_end(0, 1, 0));
    }
}
