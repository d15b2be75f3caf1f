//! The one error type of the crate.

use crate::env::EnvError;

/// What a collective, the launcher environment or the set-up can fail with.
///
/// Every variant names the operation and, where one is to blame, the rank.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// The launcher's environment is incomplete or contradictory ([`crate::env::resolve`]).
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The launcher asked for several processes but this build has no multi-process engine.
    #[error(
        "world size {world_size} (from {source_var}) needs the `mpi` feature, and this build \
         does not have it: rebuild with `cargo build --release -p rlvr --features mpi` \
         (needs an MPI and libclang: apt-get install libopenmpi-dev openmpi-bin libclang-dev)"
    )]
    FeatureMissing {
        /// The world size the launcher set.
        world_size: usize,
        /// The environment variable it came from.
        source_var: String,
    },
    /// An argument is wrong on this rank alone (a root out of range, a non-contiguous tensor, a
    /// dtype the operation does not support, a length that does not divide).
    #[error("{op}: {detail}")]
    Invalid {
        /// The collective (`all_reduce`, `broadcast`, …).
        op: &'static str,
        /// What is wrong and with which value.
        detail: String,
    },
    /// The ranks called different collectives, or the same one with different layouts (shapes,
    /// dtypes, roots). Detected by [`crate::ThreadComm`] always and by the MPI engine where it
    /// exchanges sizes anyway (`all_gather`).
    #[error("{op}: ranks disagree: {detail}")]
    Mismatch {
        /// The collective this rank called.
        op: &'static str,
        /// Each disagreeing rank with what it passed.
        detail: String,
    },
    /// A collective did not complete within the timeout.
    #[error(
        "{op} (collective #{seq}) did not complete within {timeout_s} s on rank {rank}; \
         ranks that had not reached it: {missing:?}"
    )]
    Timeout {
        /// The collective.
        op: &'static str,
        /// Its sequence number on this communicator (0 is the first collective).
        seq: u64,
        /// The rank that gave up.
        rank: usize,
        /// The timeout, in seconds.
        timeout_s: f64,
        /// The ranks that had not arrived when the timeout fired.
        missing: Vec<usize>,
    },
    /// A peer left the group (its thread ended or panicked, its communicator was dropped) while
    /// this rank needed it for a collective.
    #[error("{op} (collective #{seq}): rank {rank} has left the group, so the collective cannot complete")]
    PeerGone {
        /// The collective.
        op: &'static str,
        /// Its sequence number.
        seq: u64,
        /// The rank that left.
        rank: usize,
    },
    /// An earlier failure (a timeout, a departed peer) left the communicator unusable.
    #[error("communicator unusable after an earlier failure: {0}")]
    Broken(String),
    /// The MPI library could not be set up, or disagrees with the launcher.
    #[error("MPI: {0}")]
    Mpi(String),
    /// A tensor operation (staging, packing) failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, DistError>;
