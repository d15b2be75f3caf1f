//! Data parallel sampling (ARCHITECTURE.md, "Data parallel"): every rank draws the same B
//! prompts of a step from the one prompt sampler (same seed, same cursor), samples and scores only
//! its share of the groups ([`crate::pack::rank_range`]: consecutive, rank order), and the groups
//! are then gathered, so that every rank holds the whole batch, exactly as one process would have
//! sampled it: each completion's randomness is seeded by (run seed, prompt draw index, sample
//! index), never by the rank or the split. DAPO's dynamic sampling then decides on the gathered
//! groups, the same on every rank; the trainer takes its own share of the result.
//!
//! Architecture invariant: a rank's share depends only on the batch size, the rank and the world
//! size; the gathered batch is the ranks' shares concatenated in rank order; the wire format
//! ([`crate::store::wire`]) carries every field bit for bit (f32 and f64 as their bits, NaN
//! included).

use crate::job::Job;

/// Which share of each step's groups this process samples, and whether it gathers them itself.
#[derive(Clone)]
pub struct Share {
    /// The job: this rank, the world size and the communicator.
    pub job: Job,
    /// Whether the explorer gathers every round itself ([`Job::gather_round`]); `false` where the
    /// caller gathers (the explorer on its own thread: collectives stay on the run's thread).
    pub gathers: bool,
}
