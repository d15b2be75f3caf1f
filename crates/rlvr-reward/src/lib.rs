//! Verifiable rewards for RLVR: answer extraction and verifiers, in pure Rust (no tensor library).
//!
//! A [`Verifier`] turns a [`Sample`] (prompt, completion, reference) into a [`Score`]: the reward, whether
//! the answer was judged correct, and the extracted and gold answers as text (the fields of the
//! `rlvr reward` output, DESIGN.md section 10). Verifiers:
//! - [`gsm8k::Gsm8kVerifier`]: numeric answers, strict (`#### N`) or flexible extraction;
//! - [`math::MathVerifier`]: the last `\boxed{}` (every box for a multi-answer gold), LaTeX
//!   normalisation, equivalence of numbers, lists and sets, tuples, intervals and relations, equations,
//!   matrices and expressions (seeded numeric sampling); the policies and where they follow or differ
//!   from Math-Verify are in the [`math`] module docs;
//! - [`countdown::CountdownVerifier`]: an arithmetic expression using each given number exactly once,
//!   evaluated exactly by a real parser (never an eval);
//! - [`arithmetic::ArithmeticVerifier`]: exact numeric answers to generated arithmetic problems;
//! - [`external::ExternalVerifier`]: a user command speaking JSON lines, started once per batch;
//! - [`judge::JudgeVerifier`]: an LLM judge on an OpenAI-compatible server, its answer parsed by
//!   a stated rule;
//! - [`persistent::PersistentVerifier`]: a user program started once per run, one JSON line per
//!   batch in and out;
//! - [`reward_model::RewardModelVerifier`]: a learned reward model's scalar score from a server
//!   speaking vLLM's pooling API.
//!
//! [`combine::RewardFunction`] adds an optional format reward (reported apart from correctness) and
//! weighted sums of components, each logged.
//!
//! Every extraction reads the whole completion in linear time; parsers return errors or `None`, never
//! panic (property-tested).
//!
//! ```
//! use rlvr_reward::{gsm8k::{Gsm8kMode, Gsm8kVerifier}, Sample, Verifier};
//! let v = Gsm8kVerifier { mode: Gsm8kMode::Flexible };
//! let s = v.score(&Sample::new("So she pays **$1,000.00**.", "Half of 2000 is 1000.\n#### 1000")).unwrap();
//! assert_eq!((s.reward, s.extracted.as_deref(), s.gold.as_deref()), (1.0, Some("1000"), Some("1000")));
//! ```
#![warn(missing_docs)]
#![deny(unsafe_code)] // one audited exception: `pre_exec` in guard.rs (`PR_SET_PDEATHSIG`)

pub mod answer;
pub mod arithmetic;
mod bounds;
pub mod cli;
pub mod combine;
pub mod countdown;
pub mod expr;
pub mod expr_fns;
pub mod external;
pub mod extract;
pub mod format;
pub mod forms;
pub mod gsm8k;
#[cfg(target_os = "linux")]
pub mod guard;
mod http;
pub mod judge;
pub mod latex;
mod latex_marks;
pub mod latex_rules;
pub mod math;
pub mod number;
pub mod persistent;
pub mod process;
pub mod reference;
pub mod reward_model;
pub mod sampling;
pub mod trl;
pub mod verl;

use serde::Serialize;

/// One completion to score.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample<'a> {
    /// The prompt text the completion answers (only external verifiers look at it).
    pub prompt: &'a str,
    /// The model's completion text.
    pub completion: &'a str,
    /// The reference: a full solution, a bare answer, or a task-specific encoding (countdown: JSON
    /// `{"numbers": [..], "target": N}`).
    pub reference: &'a str,
    /// The dataset row's columns as (name, text) pairs: `question`, and for a `jsonl` task every
    /// string or number field of the row (numbers as text), plus, when the row has fields that
    /// are not strings, the hidden column [`TYPED_COLUMNS`] holding those fields with their JSON
    /// types; empty when unknown. Only external verifiers, judges and environments look at them.
    pub columns: &'a [(String, String)],
    /// The row's index in its split (0-based, in file order), when known.
    pub index: Option<usize>,
}

impl<'a> Sample<'a> {
    /// A sample with an empty prompt.
    pub fn new(completion: &'a str, reference: &'a str) -> Self {
        Sample {
            prompt: "",
            completion,
            reference,
            columns: &[],
            index: None,
        }
    }
}

/// The name of the hidden column that carries a row's fields which are not strings (numbers,
/// booleans, lists, objects, nulls) with their JSON types: its value is the JSON text of one object
/// (`{"tags": ["a"], "hard": true, "points": 2}`). A template cannot name it (braces end a
/// placeholder); [`visible_columns`] leaves it out and [`typed_columns`] reads it.
pub const TYPED_COLUMNS: &str = "{typed}";

/// The columns a template, a judge or a listing shows: all but [`TYPED_COLUMNS`].
pub fn visible_columns(columns: &[(String, String)]) -> impl Iterator<Item = &(String, String)> {
    columns.iter().filter(|(k, _)| k != TYPED_COLUMNS)
}

/// The row's columns with their JSON types: each visible column as a string, then the fields of
/// [`TYPED_COLUMNS`] (when present and a JSON object) replacing or adding to them, so a number
/// column is a number, a list a list, a boolean a boolean. Order: the columns' order.
pub fn typed_columns(columns: &[(String, String)]) -> serde_json::Map<String, serde_json::Value> {
    let mut out: serde_json::Map<String, serde_json::Value> = visible_columns(columns)
        .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
        .collect();
    let typed = columns.iter().find(|(k, _)| k == TYPED_COLUMNS);
    if let Some(Ok(serde_json::Value::Object(m))) =
        typed.map(|(_, v)| serde_json::from_str::<serde_json::Value>(v))
    {
        for (k, v) in m {
            out.insert(k, v);
        }
    }
    out
}

/// The verdict on one completion.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Score {
    /// The reward (1.0 / 0.0 for the built-in verifiers; any finite value from external ones).
    pub reward: f64,
    /// Whether the answer was judged correct (feeds the `accuracy` metric; never includes a format bonus).
    pub correct: bool,
    /// The answer read from the completion, normalised; `None` when none was found.
    pub extracted: Option<String>,
    /// The gold answer read from the reference, normalised; `None` when it could not be read.
    pub gold: Option<String>,
    /// Extra numbers the verifier reported beside the reward, by name (an external program's
    /// `"extra"` object: verl's `reward_extra_info`, the numeric keys of a `compute_score` dict
    /// besides `score`); logged as per-step means, never part of the reward. Empty for the
    /// built-in verifiers (and then not written).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub extra: std::collections::BTreeMap<String, f64>,
}

impl Score {
    /// Reward 1.0 when `correct`, else 0.0.
    pub fn binary(correct: bool, extracted: Option<String>, gold: Option<String>) -> Self {
        Score {
            reward: if correct { 1.0 } else { 0.0 },
            correct,
            extracted,
            gold,
            extra: Default::default(),
        }
    }
}

/// Errors of the verifiers. Wrong answers are not errors (they score 0); these are problems with the
/// reference, the configuration or an external command.
#[derive(Debug, thiserror::Error)]
pub enum RewardError {
    /// The reference cannot be read for this task.
    #[error("{task} reference {reference:?} is invalid: {reason}")]
    BadReference {
        /// Task name (`countdown`, ...).
        task: &'static str,
        /// The reference text (truncated to 200 characters).
        reference: String,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// An external verifier command failed: did not start, exited non-zero, timed out or wrote
    /// malformed output.
    #[error("external verifier `{command}` failed: {reason}")]
    External {
        /// The command line.
        command: String,
        /// What happened (exit status, stderr tail, timeout, bad line number and text).
        reason: String,
    },
    /// An LLM judge's or a reward model's server failed: no answer in time after the retries, a refusal (HTTP 4xx),
    /// a malformed answer, or an answer that could not be parsed under `on_parse_failure = "error"`.
    #[error("judge at {server} failed: {reason}")]
    Judge {
        /// The server's base URL.
        server: String,
        /// What happened.
        reason: String,
    },
    /// A reward configuration is invalid.
    #[error("invalid reward config: {0}")]
    Config(String),
}

pub(crate) fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Something that scores completions.
pub trait Verifier: Send + Sync {
    /// Scores one sample. A wrong or missing answer is a `Score` with reward 0, not an error.
    ///
    /// # Errors
    /// [`RewardError`] when the reference is unreadable or an external command fails.
    fn score(&self, sample: &Sample<'_>) -> Result<Score, RewardError>;

    /// Scores many samples, in order. The default calls [`Verifier::score`] on each; external verifiers
    /// send the whole batch to one process.
    ///
    /// # Errors
    /// The first error of any sample.
    fn score_batch(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        samples.iter().map(|s| self.score(s)).collect()
    }
}
