//! The one error type of `rlvr-algo`.

/// Everything that can go wrong in `rlvr-algo`. Each variant carries the context needed to fix it.
#[derive(Debug, thiserror::Error)]
pub enum AlgoError {
    /// `algorithm.preset` names no known preset.
    #[error("unknown algorithm preset `{name}`{hint}; valid presets: {valid} (run `rlvr algorithms` to list them)")]
    UnknownPreset {
        /// The name the user gave.
        name: String,
        /// "did you mean" with the nearest preset, or TRL's name it is; empty when none is close.
        hint: String,
        /// Comma-separated list of valid names.
        valid: String,
    },
    /// A configuration value is out of its valid range.
    #[error("invalid `algorithm.{key}` = {value}: {why}")]
    InvalidConfig {
        /// The key under `[algorithm]`.
        key: &'static str,
        /// The offending value, formatted.
        value: String,
        /// What the valid range is and how to fix it.
        why: String,
    },
    /// Two inputs that must agree in shape do not.
    #[error("{op}: shape mismatch: {what} has shape {got:?}, expected {expected:?}")]
    Shape {
        /// The function that checked.
        op: &'static str,
        /// Which input is wrong.
        what: &'static str,
        /// Shape received.
        got: Vec<usize>,
        /// Shape expected.
        expected: Vec<usize>,
    },
    /// Inputs are inconsistent in some way other than shape (lengths, NaN rewards, ...).
    #[error("{op}: {why}")]
    Input {
        /// The function that checked.
        op: &'static str,
        /// What is wrong and how to fix it.
        why: String,
    },
    /// An error from candle while building the loss graph.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// `Result` with [`AlgoError`].
pub type Result<T, E = AlgoError> = std::result::Result<T, E>;
