//! The crate's error type.

/// Why an environment request (or a bridge) failed. Every variant stops the run; per-episode
/// failures are not errors but an episode's [`crate::protocol::EpisodeResult`] `Err`.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// The environment's reply broke the protocol (docs/DESIGN.md section 14): what and where.
    #[error("environment protocol: {0}")]
    Protocol(String),
    /// The environment answered a request with a top-level `{"error": ...}`.
    #[error("the environment reported an error on {0}")]
    Reported(String),
    /// The process could not be started, timed out at start-up, or died past its restarts:
    /// the command, what happened, and its exit status and stderr tail.
    #[error("environment `{command}`: {reason}")]
    Process {
        /// The command line.
        command: String,
        /// What happened, with the exit status and stderr tail.
        reason: String,
    },
    /// The K episodes of a group got different `reset` replies.
    #[error("{0}")]
    Group(String),
    /// The chat template cannot bridge turns, or failed to render: why.
    #[error("chat template: {0}")]
    Template(String),
    /// A configuration value is refused: the key and why.
    #[error("{0}")]
    Config(String),
}
