//! Errors of the vLLM backend. Each variant names the server and what it answered, so a failed
//! run says which machine to look at.

/// Errors from [`crate::VllmClient`] and the weight refresh.
#[derive(Debug, thiserror::Error)]
pub enum VllmError {
    /// A request failed on every attempt (down, slow, 5xx, malformed answer): the last answer.
    #[error(
        "vLLM server {server}: {what} failed after {attempts} attempt(s); last answer: {answer}"
    )]
    Server {
        /// The server's base URL.
        server: String,
        /// The request, e.g. `POST /v1/completions`.
        what: String,
        /// Attempts made (1 + retries).
        attempts: usize,
        /// What the server answered last (status and body, a transport error, or the malformed part).
        answer: String,
    },
    /// The server refused the request itself (HTTP 4xx, or a redirect: none is followed): retrying
    /// would not help.
    #[error("vLLM server {server}: {what} was refused with HTTP {status}: {body}")]
    Refused {
        /// The server's base URL.
        server: String,
        /// The request, e.g. `POST /v1/completions`.
        what: String,
        /// The HTTP status (400..500, or 300..400 for a redirect, which is never followed).
        status: u16,
        /// The answer's body (cut to 500 characters), or for a redirect where it pointed.
        body: String,
    },
    /// A start-up or refresh check found the server unfit (wrong model, tokenizer, log-prob mode,
    /// stale weights).
    #[error("vLLM server {server}: {msg}")]
    Check {
        /// The server's base URL.
        server: String,
        /// What is wrong and how to fix it.
        msg: String,
    },
    /// A setting of the client or of the sampling parameters is not usable with vLLM.
    #[error("vLLM backend: {0}")]
    Config(String),
    /// Writing or deleting a weights directory failed.
    #[error("vLLM backend: {path}: {source}")]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An error from the model crate (writing tensors, scoring).
    #[error(transparent)]
    Model(#[from] rlvr_model::ModelError),
    /// An error from the tensor library.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias of the vLLM crate.
pub type Result<T> = std::result::Result<T, VllmError>;

/// The [`VllmError::Io`] of an I/O error at `path` (for `map_err`).
pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> VllmError + '_ {
    move |source| VllmError::Io {
        path: path.to_path_buf(),
        source,
    }
}
