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

/// One sampling round's groups with their rollout records, in rank order once gathered.
pub type Round = (
    Vec<Vec<crate::store::experience::Experience>>,
    Vec<crate::store::rollouts::RolloutRecord>,
);

/// What the explorer thread sends the run's thread, in order: a batch (this rank's share of it,
/// or, with a [`RoundLink`], the whole batch), or a round of DAPO's dynamic sampling to gather.
pub enum FromExplorer {
    /// The batch of a step, or the explorer's error.
    Batch(anyhow::Result<super::explorer::Batch>),
    /// This rank's share of one sampling round, to be gathered on the run's thread
    /// ([`RoundLink`]).
    Round(RoundShare),
}

/// This rank's share of one sampling round, sent to the run's thread to gather ([`RoundLink`]).
pub struct RoundShare {
    /// The share's groups and rollout records.
    pub round: Round,
    /// `env.max_error_frac` (multi-turn runs): the share's failed and run episodes with the
    /// limit, checked on the whole round once summed over the ranks
    /// ([`super::check_over_ranks`]), as the explorer on the run's thread checks it.
    pub budget: Option<(super::episodes::ErrorBudget, f64)>,
}

/// Data parallel with DAPO's dynamic sampling on the explorer's own thread (`sync.offset` ≥ 1):
/// the keep decision needs every rank's groups of each round, and collectives stay on the run's
/// thread (MPI is initialised `MPI_THREAD_SERIALIZED`, and a collective the run's thread is in
/// would interleave with the explorer's). So the explorer sends its share of each round to the
/// run's thread, in order with its batches ([`FromExplorer::Round`]); the run's thread gathers it
/// while it waits for the next batch (`crate::feed::Feed::next`) and sends the whole round
/// back. Every rank's explorer decides on the same gathered groups, so every rank sends the same
/// sequence of rounds and batches, and the run's threads meet in the same collectives.
pub struct RoundLink {
    /// To the run's thread (the channel the batches take).
    pub to_run: std::sync::mpsc::SyncSender<FromExplorer>,
    /// The whole round back, gathered in rank order.
    pub back: std::sync::mpsc::Receiver<Round>,
}

impl RoundLink {
    /// Sends this rank's share of a round (with its error budget) and waits for the whole round.
    ///
    /// # Errors
    /// The run's thread stopped serving rounds (it met an error, e.g. `env.max_error_frac` on
    /// this round, or shut the feed down).
    pub fn gather(
        &self,
        round: Round,
        budget: Option<(super::episodes::ErrorBudget, f64)>,
    ) -> anyhow::Result<Round> {
        let gone = || anyhow::anyhow!("the run's thread stopped gathering sampling rounds");
        self.to_run
            .send(FromExplorer::Round(RoundShare { round, budget }))
            .map_err(|_| gone())?;
        self.back.recv().map_err(|_| gone())
    }
}
