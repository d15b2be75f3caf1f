//! How a stage saves and restores its own state (torch's and prime-rl's `state_dict` pattern):
//! each stage returns a typed record of what it needs to continue, and takes one back; the run's
//! checkpoint (`run/save.rs`) composes the records into the checkpoint's files
//! ([`crate::store::checkpoint`]) and its resume hands each stage its own, so no stage's fields
//! are read from outside it.
//!
//! Implemented by the trainer (`crate::update::Trainer`: the optimizer's update count, moments
//! and masters, the LoRA-dropout round), the best held-out evaluation (`crate::eval::Best`) and the
//! run's own position (`crate::run`). The feed's state (the data cursor, the explorer's version and
//! weights, the in-flight batches) is a typed record too (`crate::feed::FeedState`), taken where
//! the feed is built, because its explorer thread starts from it.

/// A stage whose state a checkpoint saves and a resume restores.
pub trait Stateful {
    /// The stage's record: plain typed data (tensors included) that the checkpoint stores.
    type State;

    /// This stage's state now.
    ///
    /// # Errors
    /// State that cannot be saved now (e.g. a sharded optimizer whose state was not gathered).
    fn state_dict(&self) -> anyhow::Result<Self::State>;

    /// Continues from `state` (one [`Stateful::state_dict`] returned, read back from a
    /// checkpoint).
    ///
    /// # Errors
    /// A state that does not fit this stage (e.g. moments of other shapes).
    fn load_state_dict(&mut self, state: Self::State) -> anyhow::Result<()>;
}
