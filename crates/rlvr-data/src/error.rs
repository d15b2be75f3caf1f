//! Errors of the data layer. Every variant that comes from a file names the file, the 1-based line
//! (or Parquet row) and, where one is at fault, the field.

use std::path::PathBuf;

/// A data-layer error.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("{}: {source}", file.display())]
    Io {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A whole file cannot be read by this build (a Parquet codec that is not compiled in).
    #[error("{}: {reason}", file.display())]
    Unreadable {
        /// The file.
        file: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A line (or Parquet row) is not a JSON object / readable record.
    #[error("{}:{line}: malformed record: {reason}", file.display())]
    Malformed {
        /// The file.
        file: PathBuf,
        /// 1-based line (JSONL) or row (Parquet).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A required field is absent (or null).
    #[error("{}:{line}: missing field `{field}` ({}set data.{key} to the field that holds it)", file.display(), fields_note(fields))]
    MissingField {
        /// The file.
        file: PathBuf,
        /// 1-based line or row.
        line: usize,
        /// The field looked for.
        field: String,
        /// The config key that names this field.
        key: &'static str,
        /// The row's top-level fields when the field is absent (empty when it is there but null),
        /// so that the message shows which field to name.
        fields: Vec<String>,
    },
    /// A dotted field path (`reward_model.ground_truth`) does not reach a value: the record has no
    /// top-level key of that name, and a part of the path is absent, null or not an object.
    #[error("{}:{line}: missing field `{path}`: {reason} (set data.{key} to the field that holds it)", file.display())]
    MissingPath {
        /// The file.
        file: PathBuf,
        /// 1-based line or row.
        line: usize,
        /// The whole path looked for.
        path: String,
        /// Which part was missing, or what was found instead of an object.
        reason: String,
        /// The config key that names this field.
        key: &'static str,
    },
    /// A field has the wrong type.
    #[error("{}:{line}: field `{field}` {reason}", file.display())]
    BadField {
        /// The file.
        file: PathBuf,
        /// 1-based line or row.
        line: usize,
        /// The field.
        field: String,
        /// What was expected and found.
        reason: String,
    },
    /// A saved data cursor does not fit the dataset (a position past its end, another length):
    /// the checkpoint holding it was written for other data, or edited.
    #[error("the data cursor {0}")]
    Cursor(String),
    /// The `[data]` config is inconsistent (the message names the key and the fix).
    #[error("invalid data config: {0}")]
    Config(String),
    /// A line of a JSONL file is longer than [`crate::read::MAX_LINE_BYTES`].
    #[error("{}:{line}: line longer than {limit} bytes; rlvr reads lines of at most that size (split or shorten the record)", file.display())]
    LineTooLong {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// A prompt has more tokens than the model has positions.
    #[error("{source_}: the prompt has {size}, more than the model's max_position_embeddings = {limit}: it cannot be sampled or trained on; drop such prompts with data.max_prompt_len (e.g. {suggest}) or shorten them")]
    PromptTooLong {
        /// The problem's source (`FILE:LINE`).
        source_: String,
        /// Its size: `N tokens`, or `N bytes (over 64 a position)` when too large to tokenize.
        size: String,
        /// The model's positions.
        limit: usize,
        /// A max_prompt_len to suggest (half the positions, leaving room to generate).
        suggest: usize,
    },
    /// A prompt template refers to an unknown placeholder or is malformed.
    #[error("prompt template: {0}")]
    Template(String),
}

/// Result alias of this crate.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// `the row's fields: [..]; ` for [`DataError::MissingField`], or nothing when none are listed.
fn fields_note(fields: &[String]) -> String {
    if fields.is_empty() {
        String::new()
    } else {
        format!("the row's fields: {fields:?}; ")
    }
}
