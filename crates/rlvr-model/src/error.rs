//! Errors of the model crate. Every variant names the file (and tensor or field) at fault.

use std::path::{Path, PathBuf};

/// Errors from loading, saving or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read or written.
    // The I/O error is part of the message, not a `source`: anyhow's `{:#}` would print it twice.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    /// A required file of a model directory is absent.
    #[error("{path}: missing file ({what})")]
    MissingFile { path: PathBuf, what: String },
    /// config.json (or another JSON config) is malformed or names something unsupported.
    #[error("{file}: {msg}")]
    Config { file: PathBuf, msg: String },
    /// A weight is absent from every safetensors file of the checkpoint.
    #[error("{file}: missing tensor `{tensor}`")]
    MissingTensor { file: PathBuf, tensor: String },
    /// The weights hold a tensor the model config.json describes has no place for (config.json
    /// and the weights disagree, e.g. `num_hidden_layers` edited down).
    #[error(
        "{file}: tensor `{tensor}` is not part of the model {config} describes ({count} such \
         tensors in all): config.json and the weights disagree (config.json edited, or another \
         model's weights); fix config.json (e.g. num_hidden_layers) or use the matching weights"
    )]
    UnexpectedTensor {
        file: PathBuf,
        tensor: String,
        count: usize,
        config: PathBuf,
    },
    /// A weight has a shape other than config.json implies.
    #[error("{file}: tensor `{tensor}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        file: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    /// A weight has a dtype rlvr cannot load.
    #[error("{file}: tensor `{tensor}` has unsupported dtype {dtype}")]
    UnsupportedDtype {
        file: PathBuf,
        tensor: String,
        dtype: String,
    },
    /// A weight holds NaN or ±∞ (a diverged or corrupted checkpoint): refused at load, so that
    /// sampling and training never run on it.
    #[error(
        "{file} holds a non-finite value (NaN or inf) in weight {tensor} ({count} such values, the \
         first at flat index {first}): the checkpoint is diverged or corrupted; load an earlier one"
    )]
    NonFinite {
        file: PathBuf,
        tensor: String,
        count: usize,
        first: usize,
    },
    /// The safetensors container itself is malformed.
    #[error("{file}: invalid safetensors file: {msg}")]
    Safetensors { file: PathBuf, msg: String },
    /// Tokenizer loading or encoding failed.
    #[error("{file}: tokenizer error: {msg}")]
    Tokenizer { file: PathBuf, msg: String },
    /// A chat template failed to parse or render.
    #[error("chat template ({source_name}): {msg}")]
    Template { source_name: String, msg: String },
    /// Bad arguments to a model function (shapes, lengths, ids out of range).
    #[error("{0}")]
    Invalid(String),
    /// An error from the tensor library.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias of the model crate.
pub type Result<T> = std::result::Result<T, ModelError>;

/// Refuses `path` unless it is a regular file (or a link to one), before it is opened: opening a
/// FIFO for reading blocks until a writer comes (a load that hangs for ever), and a device or
/// socket is no model file either.
///
/// # Errors
/// [`ModelError::Io`] naming the file and what it is instead, or why its metadata is unreadable.
pub(crate) fn check_regular_file(path: &std::path::Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|err| ModelError::Io {
        path: path.to_path_buf(),
        err,
    })?;
    let ty = meta.file_type();
    if ty.is_file() {
        return Ok(());
    }
    let what = if ty.is_dir() {
        "a directory"
    } else {
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if ty.is_fifo() {
                "a FIFO (named pipe)"
            } else if ty.is_socket() {
                "a socket"
            } else if ty.is_char_device() || ty.is_block_device() {
                "a device"
            } else {
                "something else"
            }
        }
        #[cfg(not(unix))]
        "something else"
    };
    Err(ModelError::Io {
        path: path.to_path_buf(),
        err: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "is {what}, not a regular file: rlvr reads model files from regular files only"
            ),
        ),
    })
}

/// The largest tokenizer or config file read (256 MiB; real tokenizer.json files are 2-35 MB).
pub const MAX_TOKENIZER_FILE_BYTES: u64 = 256 << 20;

/// Reads the text file `path` of a model directory: a regular file (a FIFO would block the read
/// for ever) of at most [`MAX_TOKENIZER_FILE_BYTES`].
///
/// # Errors
/// [`ModelError::Io`] naming the file: not a regular file, too large, unreadable, not UTF-8.
pub fn read_model_text(path: &Path) -> Result<String> {
    check_regular_file(path)?;
    let io = |err| ModelError::Io {
        path: path.to_path_buf(),
        err,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_TOKENIZER_FILE_BYTES {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "is {len} bytes, more than the {MAX_TOKENIZER_FILE_BYTES} a tokenizer or config \
                 file may hold"
            ),
        )));
    }
    std::fs::read_to_string(path).map_err(io)
}
