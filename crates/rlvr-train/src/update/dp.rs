//! The trainer step's data-parallel pieces (DISTRIBUTED.md): each rank holds whole groups of the
//! step's batch, ranks in order; the per-row data the loss needs globally is gathered
//! ([`crate::job::Job::gather_view`]) so that every rank computes the advantages and every
//! update's normaliser one process would compute for the whole batch, then trains its own rows;
//! gradients are summed by the optimizer's reduce hook (`rlvr_dist::DistReduce`), the loss
//! statistics here.
//!
//! Invariants: every rank calls the same collectives in the same order (one gather per step, one
//! reduction of the statistics per step, one gradient reduction per update, even with no local
//! rows); the global row order is rank 0's rows, then rank 1's, …, which is the one-process batch
//! when the ranks hold consecutive slices of it; a group id on two ranks is an error.

use rlvr_algo::{LossStats, MismatchSums};

use crate::job::Job;

/// Sums `stats` and `diff` over the ranks in place (the ratio's min and max by min and max):
/// two `all_reduce_f64` calls; in one process nothing changes. The fields that add are
/// [`LossStats::to_sums`]'s and [`MismatchSums::to_parts`]'s (counts and histogram buckets included), so a new statistic is
/// reduced where it is defined.
///
/// # Errors
/// A failed collective.
pub fn reduce_stats(
    job: &mut Job,
    stats: &mut LossStats,
    diff: &mut MismatchSums,
) -> anyhow::Result<()> {
    if !job.is_parallel() {
        return Ok(());
    }
    let mut sums = stats.to_sums();
    let n = sums.len();
    sums.extend(diff.to_parts());
    job.sum_f64(&mut sums)?;
    let mut ext = stats.extrema();
    job.max_f64(&mut ext)?;
    *stats = LossStats::from_sums(&sums[..n], ext);
    *diff = MismatchSums::from_parts(&sums[n..]);
    Ok(())
}
