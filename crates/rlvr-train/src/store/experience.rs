//! Experiences: scored completions with their behaviour log-probs and version (DESIGN.md sections 2
//! and 10), and the offline experiences JSONL reader.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One scored completion: the unit of the buffer and of offline files.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Experience {
    /// Prompt token ids (non-empty).
    pub prompt_ids: Vec<u32>,
    /// Completion token ids; a generated EOS is included.
    pub completion_ids: Vec<u32>,
    /// ℓ_old per completion token (nats), recorded at sampling time at the sampling temperature.
    pub behaviour_logprobs: Vec<f32>,
    /// Reward; `None` = unscorable (A = 0, outside every statistic).
    pub reward: Option<f64>,
    /// Whether the verifier judged the answer correct (format bonus excluded); `None` when unknown
    /// (offline files: then `reward > 0` is used for `accuracy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correct: Option<bool>,
    /// Group id (compares as a string).
    pub group_id: String,
    /// Policy version of the weights that sampled it; `None` = unknown (staleness null).
    #[serde(default)]
    pub version: Option<u64>,
    /// True when the completion hit `max_new_tokens` without EOS (`finish_reason = "length"`).
    #[serde(default)]
    pub truncated: bool,
    /// The reward's parts, one per `[[reward.components]]` entry (then `format` when the format
    /// reward is on); empty when unknown (offline files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<RewardPart>,
    /// The loss mask of a multi-turn episode (docs/DESIGN.md section 14), one entry per
    /// completion token: 1 on tokens the policy sampled, 0 on the environment's bridge tokens
    /// (read by nothing but their position). `None`: every token sampled (single-turn rows, old
    /// files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_mask: Option<Vec<u8>>,
    /// Assistant turns of a multi-turn episode; `None` for a single-turn row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<u32>,
    /// The rewards the environment gave, in order (each step's, then `finish`'s), `None` where
    /// a reply gave none; empty for a single-turn row.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn_rewards: Vec<Option<f64>>,
    /// The environment's own numbers for a multi-turn episode (`"metrics"` on its last reply,
    /// [`rlvr_env::protocol::Metrics`]), by name; logged as `env/metrics/<name>/mean`, never part
    /// of the reward. Empty for a single-turn row and for an episode the environment failed.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env_metrics: std::collections::BTreeMap<String, f64>,
}

/// One part of an experience's reward: a reward component, or the format term.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardPart {
    /// The component's name (`format` for the format term).
    pub name: String,
    /// Its raw (unweighted) reward.
    pub raw: f64,
    /// What it adds to the reward (weight × raw; the format term as is).
    pub weighted: f64,
    /// The extra numbers its verifier reported beside the reward, by name
    /// ([`rlvr_reward::Score::extra`]: an external program's `extra`, a verl function's numeric
    /// keys besides `score`); logged as `reward/<name>/<key>/mean`, never part of the reward.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub extra: std::collections::BTreeMap<String, f64>,
}

impl Experience {
    /// Staleness at trainer step `step` (1-based): (step − 1) − version, `None` without a version.
    pub fn staleness(&self, step: u64) -> Option<u64> {
        self.version.map(|v| (step - 1).saturating_sub(v))
    }

    /// Whether it counts as correct for `accuracy`: `correct` when known, else reward > 0.
    pub fn is_correct(&self) -> Option<bool> {
        self.correct.or(self.reward.map(|r| r > 0.0))
    }

    /// Whether completion token `j` was sampled by the policy (1 in the mask; every token of a
    /// row without a mask).
    pub fn sampled(&self, j: usize) -> bool {
        self.completion_mask.as_ref().is_none_or(|m| m[j] != 0)
    }

    /// The loss mask as f32 (1 on sampled tokens, 0 on bridge tokens), one per completion token.
    pub fn loss_mask(&self) -> Vec<f32> {
        match &self.completion_mask {
            None => vec![1.0; self.completion_ids.len()],
            Some(m) => m.iter().map(|&x| f32::from(x != 0)).collect(),
        }
    }

    /// Completion tokens the policy sampled (bridge tokens left out): what the normaliser,
    /// lengths, DAPO's overlong shaping and tokens/s count.
    pub fn sampled_tokens(&self) -> usize {
        match &self.completion_mask {
            None => self.completion_ids.len(),
            Some(m) => m.iter().filter(|&&x| x != 0).count(),
        }
    }
}

/// The lowest behaviour log-prob an experiences line may hold, in nats: e^−10⁴ is far below any
/// probability a sampler draws (f32's smallest is e^−103), so a lower value is a unit or sign
/// error, and the importance ratio exp(ℓ − ℓ_old) it makes is meaningless. Log-probs above 0
/// (probabilities above 1) and non-finite ones are refused too.
pub const MIN_BEHAVIOUR_LOGPROB: f64 = -1e4;

/// A malformed line of an experiences file.
#[derive(Debug, thiserror::Error)]
#[error("{}:{line}: field `{field}`: {why}", file.display())]
pub struct ExperienceError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line number.
    pub line: usize,
    /// The offending field (`-` for the line as a whole).
    pub field: String,
    /// What is wrong and what is expected.
    pub why: String,
}

/// Parses one line of the experiences format (DESIGN.md section 10).
///
/// # Errors
/// [`ExperienceError`] naming file, line and field: invalid JSON, a missing or ill-typed field,
/// `behaviour_logprobs` of a different length than `completion_ids`, an empty prompt.
pub fn parse_line(text: &str, file: &Path, line: usize) -> Result<Experience, ExperienceError> {
    let err = |field: &str, why: String| ExperienceError {
        file: file.to_path_buf(),
        line,
        field: field.to_string(),
        why,
    };
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        // Name the field whose value does not parse (NaN, Infinity, a bare word) when there is one.
        let at = byte_offset(text, e.column());
        let bad_value = [
            "expected value",
            "expected ident",
            "invalid number",
            "number out of range",
        ]
        .iter()
        .any(|m| e.to_string().starts_with(m));
        match key_before(text, at).filter(|_| bad_value) {
            Some(field) => {
                let word = token_at(text, at);
                let hint = if ["nan", "infinity", "-infinity", "inf", "-inf"]
                    .contains(&word.to_ascii_lowercase().as_str())
                {
                    format!(
                        " (`{word}` is not a JSON number: NaN and infinities cannot be trained on; \
                         write a finite number, or null for an unscored reward)"
                    )
                } else {
                    String::new()
                };
                err(&field, format!("invalid JSON: {e}{hint}"))
            }
            None => err("-", format!("invalid JSON: {e}")),
        }
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| err("-", "expected a JSON object".into()))?;
    let ids = |field: &str| -> Result<Vec<u32>, ExperienceError> {
        let a = obj
            .get(field)
            .ok_or_else(|| err(field, "missing (expected an array of token ids)".into()))?
            .as_array()
            .ok_or_else(|| err(field, "expected an array of token ids".into()))?;
        a.iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_u64()
                    .filter(|&n| n <= u32::MAX as u64)
                    .map(|n| n as u32)
                    .ok_or_else(|| err(field, format!("entry {i} is {x}, expected a token id")))
            })
            .collect()
    };
    let prompt_ids = ids("prompt_ids")?;
    if prompt_ids.is_empty() {
        return Err(err("prompt_ids", "empty prompt".into()));
    }
    let completion_ids = ids("completion_ids")?;
    let lp = obj
        .get("behaviour_logprobs")
        .ok_or_else(|| err("behaviour_logprobs", "missing".into()))?
        .as_array()
        .ok_or_else(|| err("behaviour_logprobs", "expected an array of floats".into()))?;
    let behaviour_logprobs = lp
        .iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_f64()
                .filter(|f| f.is_finite() && (MIN_BEHAVIOUR_LOGPROB..=0.0).contains(f))
                .map(|f| f as f32)
                .ok_or_else(|| {
                    err(
                        "behaviour_logprobs",
                        format!(
                            "entry {i} is {x}, expected a log-prob: a finite number in \
                             [{MIN_BEHAVIOUR_LOGPROB:e}, 0]"
                        ),
                    )
                })
        })
        .collect::<Result<Vec<f32>, _>>()?;
    if behaviour_logprobs.len() != completion_ids.len() {
        return Err(err(
            "behaviour_logprobs",
            format!(
                "has {} entries but completion_ids has {}: one log-prob per completion token",
                behaviour_logprobs.len(),
                completion_ids.len()
            ),
        ));
    }
    let reward = match obj.get("reward") {
        None => return Err(err("reward", "missing (use null for unscorable)".into())),
        Some(serde_json::Value::Null) => None,
        Some(x) => Some(
            x.as_f64()
                .filter(|f| f.is_finite())
                .ok_or_else(|| err("reward", format!("{x} is not a finite number or null")))?,
        ),
    };
    let group_id = match obj.get("group_id") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        Some(x) => {
            return Err(err(
                "group_id",
                format!("{x}: expected a string or integer"),
            ))
        }
        None => return Err(err("group_id", "missing".into())),
    };
    let version = match obj.get("version") {
        None | Some(serde_json::Value::Null) => None,
        Some(x) => Some(
            x.as_u64()
                .ok_or_else(|| err("version", format!("{x}: expected a non-negative integer")))?,
        ),
    };
    let truncated = match obj.get("finish_reason") {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::String(s)) if s == "eos" => false,
        Some(serde_json::Value::String(s)) if s == "length" => true,
        Some(x) => {
            return Err(err(
                "finish_reason",
                format!("{x}: expected \"eos\" or \"length\""),
            ))
        }
    };
    let completion_mask = match obj.get("completion_mask") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Array(a)) => {
            let m = a
                .iter()
                .enumerate()
                .map(|(i, x)| match x.as_u64() {
                    Some(0) => Ok(0u8),
                    Some(1) => Ok(1u8),
                    _ => Err(err(
                        "completion_mask",
                        format!("entry {i} is {x}, expected 0 (environment token) or 1 (sampled)"),
                    )),
                })
                .collect::<Result<Vec<u8>, _>>()?;
            if m.len() != completion_ids.len() {
                return Err(err(
                    "completion_mask",
                    format!(
                        "has {} entries but completion_ids has {}: one per completion token",
                        m.len(),
                        completion_ids.len()
                    ),
                ));
            }
            Some(m)
        }
        Some(x) => {
            return Err(err(
                "completion_mask",
                format!("{x}: expected an array of 0 and 1"),
            ))
        }
    };
    Ok(Experience {
        prompt_ids,
        completion_ids,
        behaviour_logprobs,
        reward,
        correct: None,
        group_id,
        version,
        truncated,
        components: Vec::new(),
        completion_mask,
        turns: None,
        turn_rewards: Vec::new(),
        env_metrics: Default::default(),
    })
}

/// The byte offset in the one-line `text` of serde_json's 1-based byte `column` (the position its
/// error points at), clamped to the text and moved back to a character boundary.
fn byte_offset(text: &str, column: usize) -> usize {
    let mut at = column.saturating_sub(1).min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The bare word (letters, digits, `+-.`) of `text` around byte `at`, at most 20 characters: the
/// value serde_json stopped at (`NaN`, `-Infinity`, `nan`).
fn token_at(text: &str, at: usize) -> String {
    let word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '.');
    let start = text[..at]
        .char_indices()
        .rev()
        .take_while(|&(_, c)| word(c))
        .last()
        .map_or(at, |(i, _)| i);
    text[start..]
        .chars()
        .take_while(|&c| word(c))
        .take(20)
        .collect()
}

/// The object key whose value is being read at byte `at` of the JSON `text`: the last string
/// before `at` that is followed by `:` (skipping strings that are values), read without decoding
/// escapes. `None` before the first key.
fn key_before(text: &str, at: usize) -> Option<String> {
    let bytes = text.as_bytes();
    let end = at.min(bytes.len());
    let mut key = None;
    let mut i = 0;
    while i < end {
        if bytes[i] != b'"' {
            i += 1;
            continue;
        }
        let start = i + 1;
        let mut j = start;
        while j < bytes.len() && bytes[j] != b'"' {
            j += if bytes[j] == b'\\' { 2 } else { 1 };
        }
        let close = j.min(bytes.len());
        let mut k = close + 1;
        while k < bytes.len() && bytes[k].is_ascii_whitespace() {
            k += 1;
        }
        if k < end && bytes[k] == b':' {
            key = text.get(start..close).map(|k| k.chars().take(60).collect());
        }
        i = close + 1;
    }
    key
}

/// Reads a whole experiences file (split on `\n` only; blank lines skipped).
///
/// # Errors
/// As [`read_experience_lines`].
pub fn read_experiences(path: &Path) -> anyhow::Result<Vec<Experience>> {
    Ok(read_experience_lines(path)?
        .into_iter()
        .map(|(_, e)| e)
        .collect())
}

/// Reads a whole experiences file (split on `\n` only; blank lines skipped), each experience
/// with its 1-based line number. A group's rows must be consecutive lines.
///
/// # Errors
/// I/O errors naming the file; [`ExperienceError`] for the first malformed line, or for the
/// first row of a group id that already appeared before another group (field `group_id`, naming
/// the line where that group began).
pub fn read_experience_lines(path: &Path) -> anyhow::Result<Vec<(usize, Experience)>> {
    let f = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("opening experiences file {}: {e}", path.display()))?;
    let mut r = std::io::BufReader::new(f);
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut line = 0;
    let mut started: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    loop {
        buf.clear();
        let n = r
            .read_until(b'\n', &mut buf)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        line += 1;
        let text = std::str::from_utf8(&buf).map_err(|_| ExperienceError {
            file: path.to_path_buf(),
            line,
            field: "-".into(),
            why: "not UTF-8".into(),
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let e = parse_line(text.trim_end_matches(['\n', '\r']), path, line)?;
        let continues = out
            .last()
            .is_some_and(|(_, p): &(usize, Experience)| p.group_id == e.group_id);
        if !continues {
            if let Some(first) = started.insert(e.group_id.clone(), line) {
                return Err(ExperienceError {
                    file: path.to_path_buf(),
                    line,
                    field: "group_id".into(),
                    why: format!(
                        "group `{}` began at line {first} and another group came between: a \
                         group's rows must be consecutive lines",
                        e.group_id
                    ),
                }
                .into());
            }
        }
        out.push((line, e));
    }
    Ok(out)
}

/// Refuses a row whose prompt and completion together exceed `max_positions` tokens (the policy's
/// `max_position_embeddings`: the training forward could not place it).
///
/// # Errors
/// [`ExperienceError`] naming `file`, the row's line, field `completion_ids`, the length and the
/// limit.
pub fn check_lengths(
    rows: &[(usize, Experience)],
    file: &Path,
    max_positions: usize,
) -> Result<(), ExperienceError> {
    for (line, e) in rows {
        let (p, c) = (e.prompt_ids.len(), e.completion_ids.len());
        if p + c > max_positions {
            return Err(ExperienceError {
                file: file.to_path_buf(),
                line: *line,
                field: "completion_ids".into(),
                why: format!(
                    "prompt ({p}) + completion ({c}) = {} tokens, more than the model's \
                     max_position_embeddings ({max_positions})",
                    p + c
                ),
            });
        }
    }
    Ok(())
}

/// Checks offline experiences against the model before training (issue 49 item 15): every token
/// id of `prompt_ids` and `completion_ids` must be below `vocab_size` (an id past the embedding
/// used to fail late, in the forward pass, without the file's line). Returns the warning about
/// rewards beyond 1e6 in magnitude that an online verifier's reward gets (once per file, naming
/// the first such line and how many rows have one), `None` when there is none.
///
/// # Errors
/// The first out-of-vocabulary token id, naming the file, line, field and the model's vocabulary.
pub fn check_against_model(
    rows: &[(usize, Experience)],
    file: &Path,
    vocab_size: usize,
) -> Result<Option<String>, ExperienceError> {
    let most = rlvr_reward::combine::MAX_REWARD_WEIGHT;
    let mut large: Option<(usize, f64)> = None;
    let mut count = 0usize;
    for (line, e) in rows {
        for (field, ids) in [
            ("prompt_ids", &e.prompt_ids),
            ("completion_ids", &e.completion_ids),
        ] {
            if let Some((i, id)) = ids
                .iter()
                .enumerate()
                .find(|(_, &id)| id as usize >= vocab_size)
            {
                return Err(ExperienceError {
                    file: file.to_path_buf(),
                    line: *line,
                    field: field.into(),
                    why: format!(
                        "token id {id} (position {i}) is not in the model's vocabulary of \
                         {vocab_size} ids (0 to {}): the experiences were tokenized for another \
                         model",
                        vocab_size.saturating_sub(1)
                    ),
                });
            }
        }
        if let Some(r) = e.reward.filter(|r| r.abs() > most) {
            count += 1;
            large.get_or_insert((*line, r));
        }
    }
    Ok(large.map(|(line, r)| {
        format!(
            "{}:{line}: field `reward`: {r:e} exceeds {most:e} in magnitude ({} of the file): \
             the statistics and advantages of its batches are not meaningful",
            file.display(),
            crate::log::counted(count as u64, "row")
        )
    }))
}

/// Splits experiences into groups (consecutive runs of one group id, in file order). A group id that
/// reappears after another group starts a new group.
pub fn groups_in_order(exps: Vec<Experience>) -> Vec<Vec<Experience>> {
    let mut out: Vec<Vec<Experience>> = Vec::new();
    for e in exps {
        match out.last_mut() {
            Some(g) if g[0].group_id == e.group_id => g.push(e),
            _ => out.push(vec![e]),
        }
    }
    out
}

/// One run of an episode's `completion_ids` (`rlvr generate --env`'s token accounting): an
/// assistant turn (mask 1) or a bridge (mask 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Segment {
    /// `assistant` or `bridge`.
    pub kind: &'static str,
    /// The assistant turn it is or follows, from 1.
    pub turn: u32,
    /// Its first index in `completion_ids`.
    pub start: usize,
    /// Its ids.
    pub len: usize,
}

/// The runs of `mask` (an episode's `completion_mask`) in order: assistant turns (1) and the
/// bridges (0) after them. A turn's ids are never empty (each holds at least its stop id or one
/// token), so consecutive runs alternate.
pub fn segments(mask: &[u8]) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    let mut turn = 0;
    for (i, &m) in mask.iter().enumerate() {
        let kind = if m == 1 { "assistant" } else { "bridge" };
        match out.last_mut() {
            Some(s) if s.kind == kind => s.len += 1,
            _ => {
                if m == 1 {
                    turn += 1;
                }
                out.push(Segment {
                    kind,
                    turn,
                    start: i,
                    len: 1,
                });
            }
        }
    }
    out
}
