//! The environment protocol's records (docs/DESIGN.md section 14, version [`PROTOCOL_VERSION`]):
//! typed requests rlvr writes and the replies it reads, one JSON object per line each way.
//!
//! Requests are built as [`Json`] (keys in the order §14 shows them) by [`request_line`]. Replies
//! are parsed from one line by [`parse_reply`] and then per episode by [`parse_reset`],
//! [`parse_step`] and [`parse_finish`]: a reply that breaks the protocol is a
//! [`crate::EnvError::Protocol`] (the run stops), while an episode's `{"id", "error"}` is that
//! episode's [`EpisodeResult`] `Err` (the episode is unscorable).

use crate::json::Json;
pub use crate::message::{Message, ToolCall};
use crate::EnvError;

/// The protocol version written in every request and required in `hello`'s reply.
pub const PROTOCOL_VERSION: i64 = 1;

/// One episode of a `reset` request.
#[derive(Debug, Clone, PartialEq)]
pub struct ResetEpisode {
    /// Unique within the run (`"12:3"`: group 12, sample 3).
    pub id: String,
    /// The group (prompt) id; the K episodes of a group share it and [`ResetEpisode::seed`].
    pub group: String,
    /// The sample index within the group, 0..K.
    pub sample: u32,
    /// The environment's seed, the same for the whole group.
    pub seed: u64,
    /// The dataset row's fields (an object).
    pub row: Json,
    /// The dataset's prompt as chat messages, or `None` for a plain-text prompt.
    pub prompt: Option<Vec<Message>>,
}

impl ResetEpisode {
    fn to_json(&self) -> Json {
        Json::object([
            ("id", Json::from(self.id.as_str())),
            ("group", Json::from(self.group.as_str())),
            ("sample", Json::Int(i64::from(self.sample))),
            ("seed", Json::UInt(self.seed)),
            ("row", self.row.clone()),
            (
                "prompt",
                self.prompt.as_ref().map_or(Json::Null, |m| {
                    Json::Array(m.iter().map(Message::to_json).collect())
                }),
            ),
        ])
    }
}

/// One episode of a `step` request: the assistant turn that just ended on the end-of-turn token.
#[derive(Debug, Clone, PartialEq)]
pub struct StepEpisode {
    /// The episode id.
    pub id: String,
    /// Assistant turns so far, from 1.
    pub turn: u32,
    /// The turn as decoded (special tokens skipped, the stop id not included).
    pub text: String,
    /// The calls `env.tool_format` parsed from it.
    pub tool_calls: Vec<ToolCall>,
    /// What did not parse, one message per failed call.
    pub tool_call_errors: Vec<String>,
}

impl StepEpisode {
    fn to_json(&self) -> Json {
        Json::object([
            ("id", Json::from(self.id.as_str())),
            ("turn", Json::Int(i64::from(self.turn))),
            ("text", Json::from(self.text.as_str())),
            (
                "tool_calls",
                Json::Array(self.tool_calls.iter().map(ToolCall::to_json).collect()),
            ),
            (
                "tool_call_errors",
                Json::Array(
                    self.tool_call_errors
                        .iter()
                        .map(|e| Json::from(e.as_str()))
                        .collect(),
                ),
            ),
        ])
    }
}

/// Why rlvr ended an episode without the environment's `done`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// `env.max_turns` assistant turns were taken.
    MaxTurns,
    /// A turn was cut by `rollout.max_new_tokens`.
    Length,
    /// `env.max_episode_tokens` would be exceeded.
    Budget,
    /// A stop id other than the end-of-turn token ended the turn.
    Eos,
    /// rlvr failed the episode (unscorable) while the program still holds its state, so the
    /// program can free what it keeps for it (an addition to DESIGN.md section 14, "Closing
    /// failed replays"): sent by the process client to a restarted program for an episode whose
    /// replay differed ([`crate::replay`]) and for one whose observation it refused (a special
    /// token), and by the episode runner for one it failed after the reply (an observation too
    /// long, ...). Never for an episode the program failed itself. Its reply is not read.
    Error,
}

impl FinishReason {
    /// The protocol's name: `max_turns`, `length`, `budget`, `eos`, `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::MaxTurns => "max_turns",
            FinishReason::Length => "length",
            FinishReason::Budget => "budget",
            FinishReason::Eos => "eos",
            FinishReason::Error => "error",
        }
    }
}

/// One episode of a `finish` request.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishEpisode {
    /// The episode id.
    pub id: String,
    /// Why rlvr ended it.
    pub reason: FinishReason,
}

/// A `reset` reply for one episode.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResetReply {
    /// `None` keeps the dataset's prompt; a list replaces it: the reply's `messages`
    /// (system/user messages), or its `dialogue` (system, user, assistant messages, these with
    /// optional `tool_calls`, and tool messages answering them, ending with a user one: a
    /// few-shot dialogue, an addition to DESIGN.md section 14), rendered by the chat template
    /// as the prompt either way.
    pub messages: Option<Vec<Message>>,
    /// OpenAI-style function schemas for the chat template's `tools`, keys in their order.
    pub tools: Option<Vec<Json>>,
}

/// A `step` reply for one episode.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepReply {
    /// The environment's answer (roles `tool` or `user`), appended as a bridge.
    pub messages: Vec<Message>,
    /// This turn's reward, when given (a missing reward counts as 0 in a sum).
    pub reward: Option<f64>,
    /// The episode ends here.
    pub done: bool,
    /// The environment's own numbers for the episode (`"metrics"`, an addition to DESIGN.md
    /// section 14), by name: read only on a reply with `done` (refused on any other, [`parse_step`]);
    /// logged per step as `env/metrics/<name>/mean`, never part of the reward. Empty when none.
    pub metrics: Metrics,
}

/// A `finish` reply for one episode.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FinishReply {
    /// The episode's final reward, when given.
    pub reward: Option<f64>,
    /// The environment's own numbers for the episode, as [`StepReply::metrics`].
    pub metrics: Metrics,
}

/// An episode's metrics (`"metrics": {"name": number}` on its last reply): finite numbers by
/// name, in name order.
pub type Metrics = std::collections::BTreeMap<String, f64>;

/// The most keys one reply's `metrics` may hold (a reply over it stops the run: what rlvr keeps
/// and logs per episode stays bounded whatever the program writes).
pub const MAX_METRICS: usize = 64;

/// The most UTF-8 bytes of one metric's name.
pub const MAX_METRIC_NAME_BYTES: usize = 128;

/// One episode's outcome: its reply, or the environment's error for it (the episode is then
/// unscorable).
pub type EpisodeResult<T> = Result<T, String>;

/// What a reply line that is not JSON most likely is, for the error: Python's `json.dumps` writes
/// `NaN` and `Infinity` (not JSON) unless `allow_nan=False`; a line that does not start with `{`
/// is most often a debug print, which belongs on stderr.
fn not_json_hint(line: &str) -> &'static str {
    let t = line.trim_start();
    if ["NaN", "Infinity"].iter().any(|w| line.contains(w)) && t.starts_with('{') {
        " (NaN and Infinity are not JSON: a reward must be a finite number)"
    } else if !t.starts_with('{') {
        " (log to stderr: stdout carries the replies only)"
    } else {
        ""
    }
}

/// A request kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The start-up handshake.
    Hello,
    /// Episodes begin.
    Reset,
    /// Assistant turns ended.
    Step,
    /// rlvr ended episodes.
    Finish,
}

impl Kind {
    /// The `"type"` of the request.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Hello => "hello",
            Kind::Reset => "reset",
            Kind::Step => "step",
            Kind::Finish => "finish",
        }
    }
}

/// The `hello` request line (newline included) with the `[env.options]` table.
pub fn hello_line(options: &Json) -> String {
    let v = Json::object([
        ("version", Json::Int(PROTOCOL_VERSION)),
        ("type", Json::from("hello")),
        ("options", options.clone()),
    ]);
    format!("{}\n", v.to_compact())
}

/// A batch request's line: `{"version": 1, "type": KIND, "episodes": [...]}` and a newline.
pub fn request_line(kind: Kind, episodes: Vec<Json>) -> String {
    let v = Json::object([
        ("version", Json::Int(PROTOCOL_VERSION)),
        ("type", Json::from(kind.as_str())),
        ("episodes", Json::Array(episodes)),
    ]);
    format!("{}\n", v.to_compact())
}

/// The episodes of a `reset` request as JSON.
pub fn reset_episodes(e: &[ResetEpisode]) -> Vec<Json> {
    e.iter().map(ResetEpisode::to_json).collect()
}

/// The episodes of a `step` request as JSON.
pub fn step_episodes(e: &[StepEpisode]) -> Vec<Json> {
    e.iter().map(StepEpisode::to_json).collect()
}

/// The episodes of a `finish` request as JSON.
pub fn finish_episodes(e: &[FinishEpisode]) -> Vec<Json> {
    e.iter()
        .map(|f| {
            Json::object([
                ("id", Json::from(f.id.as_str())),
                ("reason", Json::from(f.reason.as_str())),
            ])
        })
        .collect()
}

fn shown(line: &str) -> String {
    let mut s: String = line.chars().take(200).collect();
    if s.len() < line.len() {
        s.push('…');
    }
    s
}

/// The `error` of a reply or an episode entry: absent or `null` is no error (a serialiser that
/// writes every field, Python's `dataclasses.asdict` or pydantic's `model_dump`, writes
/// `"error": null` beside a good reply).
fn error_of(v: &Json) -> Option<&Json> {
    v.get("error").filter(|e| !matches!(e, Json::Null))
}

/// Checks `hello`'s reply line: `{"version": 1}`.
///
/// # Errors
/// [`EnvError::Protocol`] for a line that is not JSON, an `error` reply, or another version.
pub fn check_hello(line: &str) -> Result<(), EnvError> {
    // A byte order mark opening the stream (.NET's UTF-8 console writes one) is ignored, as
    // RFC 8259 section 8.1 allows.
    let line = line.strip_prefix('\u{feff}').unwrap_or(line);
    let v = Json::parse(line).map_err(|e| {
        EnvError::Protocol(format!(
            "hello's reply {:?} is not JSON ({e}); expected {{\"version\": {PROTOCOL_VERSION}}}",
            shown(line)
        ))
    })?;
    if let Some(e) = error_of(&v) {
        return Err(EnvError::Protocol(format!(
            "the environment reported an error at start-up: {}",
            e.as_str().map_or_else(|| e.to_compact(), str::to_string)
        )));
    }
    match v.get("version") {
        Some(Json::Int(PROTOCOL_VERSION)) => Ok(()),
        // The right number written as a string or a float: a serialisation slip, said so.
        Some(other)
            if other.as_f64() == Some(PROTOCOL_VERSION as f64)
                || other.as_str() == Some(PROTOCOL_VERSION.to_string().as_str()) =>
        {
            Err(EnvError::Protocol(format!(
                "hello's reply gives \"version\": {}; it must be the JSON integer \
                 {PROTOCOL_VERSION} ({{\"version\": {PROTOCOL_VERSION}}}), not a string or a float",
                other.to_compact()
            )))
        }
        Some(other) => Err(EnvError::Protocol(format!(
            "the environment speaks protocol version {other}; this rlvr speaks version \
             {PROTOCOL_VERSION} (docs/DESIGN.md section 14)"
        ))),
        None => Err(EnvError::Protocol(format!(
            "hello's reply {:?} has no \"version\" (expected {{\"version\": {PROTOCOL_VERSION}}})",
            shown(line)
        ))),
    }
}

/// The episodes of a batch reply line, in the order of `ids` (the request's), each the episode's
/// object or its error.
///
/// # Errors
/// [`EnvError::Protocol`] for a line that is not a JSON object, a top-level `error` (the
/// environment's message), another `version`, no `episodes` array, or episode ids that are not
/// exactly the request's (one reply per id, in any order).
pub fn parse_reply(
    kind: Kind,
    line: &str,
    ids: &[&str],
) -> Result<Vec<EpisodeResult<Json>>, EnvError> {
    let what = kind.as_str();
    let v = Json::parse(line).map_err(|e| {
        EnvError::Protocol(format!(
            "the reply to {what} {:?} is not JSON ({e}); one JSON object per line expected{}",
            shown(line),
            not_json_hint(line)
        ))
    })?;
    if let Some(e) = error_of(&v) {
        return Err(EnvError::Reported(format!(
            "{what}: {}",
            e.as_str().map_or_else(|| e.to_compact(), str::to_string)
        )));
    }
    match v.get("version") {
        None | Some(Json::Int(PROTOCOL_VERSION)) => {}
        Some(other) => {
            return Err(EnvError::Protocol(format!(
                "the reply to {what} carries protocol version {other}; this rlvr speaks version \
                 {PROTOCOL_VERSION}"
            )))
        }
    }
    let Some(Json::Array(eps)) = v.get("episodes") else {
        return Err(EnvError::Protocol(format!(
            "the reply to {what} {:?} has no \"episodes\" array",
            shown(line)
        )));
    };
    let mut out: Vec<Option<EpisodeResult<Json>>> = vec![None; ids.len()];
    for e in eps {
        let id = e.get("id").and_then(Json::as_str).ok_or_else(|| {
            EnvError::Protocol(format!(
                "an episode of the reply to {what} has no string \"id\": {}",
                shown(&e.to_compact())
            ))
        })?;
        let k = ids.iter().position(|i| *i == id).ok_or_else(|| {
            EnvError::Protocol(format!(
                "the reply to {what} names episode {id:?}, which the request did not carry"
            ))
        })?;
        if out[k].is_some() {
            return Err(EnvError::Protocol(format!(
                "the reply to {what} answers episode {id:?} twice"
            )));
        }
        out[k] = Some(match error_of(e) {
            Some(err) => Err(err
                .as_str()
                .map_or_else(|| err.to_compact(), str::to_string)),
            None => Ok(e.clone()),
        });
    }
    out.into_iter()
        .zip(ids)
        .map(|(r, id)| {
            r.ok_or_else(|| {
                EnvError::Protocol(format!(
                    "the reply to {what} has no entry for episode {id:?} (one per episode of the \
                     request expected)"
                ))
            })
        })
        .collect()
}

fn reward_of(e: &Json, what: &str, id: &str) -> Result<Option<f64>, EnvError> {
    match e.get("reward") {
        None | Some(Json::Null) => Ok(None),
        Some(r) => match r.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(EnvError::Protocol(format!(
                "{what} reply for episode {id:?}: \"reward\" must be a finite number, not {}",
                shown(&r.to_compact())
            ))),
        },
    }
}

/// The `metrics` of an episode entry (absent or null: none): an object of at most
/// [`MAX_METRICS`] keys, each a non-empty name of at most [`MAX_METRIC_NAME_BYTES`] bytes
/// without control characters ([`check_metric_name`]), whose value is a finite number (a
/// boolean is not one). Any other shape stops the run, as a bad `reward` does.
fn metrics_of(e: &Json, what: &str, id: &str) -> Result<Metrics, EnvError> {
    let bad = |why: String| {
        EnvError::Protocol(format!(
            "{what} reply for episode {id:?}: \"metrics\" {why}"
        ))
    };
    let kv = match e.get("metrics") {
        None | Some(Json::Null) => return Ok(Metrics::new()),
        Some(Json::Object(kv)) => kv,
        Some(other) => {
            return Err(bad(format!(
                "must be an object of numbers ({{\"name\": 0.5}}), not {}",
                other.kind()
            )))
        }
    };
    if kv.len() > MAX_METRICS {
        return Err(bad(format!(
            "holds {} keys; at most {MAX_METRICS} are read",
            kv.len()
        )));
    }
    let mut out = Metrics::new();
    for (k, v) in kv {
        check_metric_name(k).map_err(|why| bad(format!("key {:?}: {why}", shown(k))))?;
        // `as_f64` reads numbers only (a boolean is not one).
        let x = v.as_f64().filter(|x| x.is_finite()).ok_or_else(|| {
            bad(format!(
                "{k:?} must be a finite number, not {}",
                shown(&v.to_compact())
            ))
        })?;
        // The JSON reader keeps one value per key (the last), so no name repeats here.
        out.insert(k.clone(), x);
    }
    Ok(out)
}

/// Checks a metric's name: non-empty, at most [`MAX_METRIC_NAME_BYTES`] bytes, no control
/// characters (it becomes part of a metrics.jsonl key, `env/metrics/<name>/mean`).
fn check_metric_name(k: &str) -> Result<(), String> {
    if k.is_empty() {
        Err("a name must not be empty".into())
    } else if k.len() > MAX_METRIC_NAME_BYTES {
        Err(format!(
            "a name of {} bytes; at most {MAX_METRIC_NAME_BYTES}",
            k.len()
        ))
    } else if k.chars().any(char::is_control) {
        Err("a name must not hold control characters".into())
    } else {
        Ok(())
    }
}

fn messages_of(
    e: &Json,
    (key, allowed): (&str, &[&str]),
    what: &str,
    id: &str,
) -> Result<Option<Vec<Message>>, EnvError> {
    match e.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Array(ms)) => ms
            .iter()
            .enumerate()
            .map(|(i, m)| {
                Message::from_reply(m, allowed).map_err(|why| {
                    EnvError::Protocol(format!(
                        "{what} reply for episode {id:?}, {key}[{i}]: {why}"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(EnvError::Protocol(format!(
            "{what} reply for episode {id:?}: \"{key}\" must be a list or null, not {}",
            other.kind()
        ))),
    }
}

/// The keys rlvr reads in an episode entry of a reply to `kind` (`error` included; `hello`'s
/// reply has no episodes).
pub fn reply_keys(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Hello => &[],
        Kind::Reset => &["id", "error", "messages", "dialogue", "tools"],
        Kind::Step => &["id", "error", "messages", "reward", "done", "metrics"],
        Kind::Finish => &["id", "error", "reward", "metrics"],
    }
}

/// The keys of an episode entry `e` of a reply to `kind` that rlvr does not read, in the
/// entry's order, each with the key it probably stands for: the nearest of [`reply_keys`] (a
/// typo: `rewrad`, `Done`), or the protocol's name for another framework's (Gymnasium's
/// `terminated`/`truncated`, `observation`). Such keys are allowed (an environment may add
/// fields), but a misspelt `done` or `reward` would otherwise pass silently as false or 0.
pub fn unread_keys(kind: Kind, e: &Json) -> Vec<(String, Option<&'static str>)> {
    let Json::Object(kv) = e else {
        return Vec::new();
    };
    let known = reply_keys(kind);
    kv.iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !known.contains(k))
        .map(|k| (k.to_string(), meant(k, known)))
        .collect()
}

/// The key of `known` that `key` probably stands for (see [`unread_keys`]).
fn meant(key: &str, known: &[&'static str]) -> Option<&'static str> {
    let lower = key.to_ascii_lowercase();
    let alias: &[(&str, &str)] = &[
        ("terminated", "done"),
        ("truncated", "done"),
        ("is_done", "done"),
        ("finished", "done"),
        ("observation", "messages"),
        ("observations", "messages"),
        ("obs", "messages"),
        ("message", "messages"),
        ("score", "reward"),
        ("rewards", "reward"),
        ("tool", "tools"),
    ];
    if let Some(&(_, k)) = alias.iter().find(|(a, _)| *a == lower) {
        return known.iter().copied().find(|x| *x == k);
    }
    known
        .iter()
        .copied()
        .filter(|k| *k != "id" && *k != "error")
        .map(|k| (edit_distance(&lower, k), k))
        .filter(|(d, k)| *d <= 2 && *d < k.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance of two short ASCII-ish strings (by chars).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// Checks the `tool` messages of a reset `dialogue`: each follows an assistant message with
/// `tool_calls` (or another `tool` message after one) and, when it gives a `tool_call_id`, names
/// one of those calls.
fn check_tool_answers(dialogue: &[Message], id: &str) -> Result<(), EnvError> {
    let mut calls: Option<&[crate::message::ToolCall]> = None;
    for (i, m) in dialogue.iter().enumerate() {
        match m.role.as_str() {
            "assistant" if !m.tool_calls.is_empty() => calls = Some(&m.tool_calls),
            "tool" => {
                let Some(cs) = calls else {
                    return Err(EnvError::Protocol(format!(
                        "reset reply for episode {id:?}, dialogue[{i}]: a \"tool\" message must \
                         answer the tool_calls of the assistant message before it (or follow \
                         another tool message that does)"
                    )));
                };
                if let Some(t) = &m.tool_call_id {
                    if !cs.iter().any(|c| &c.id == t) {
                        return Err(EnvError::Protocol(format!(
                            "reset reply for episode {id:?}, dialogue[{i}]: its tool_call_id \
                             {t:?} names none of the calls it answers ({})",
                            cs.iter()
                                .map(|c| format!("{:?}", c.id))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )));
                    }
                }
            }
            _ => calls = None,
        }
    }
    Ok(())
}

/// A `reset` reply of episode `id`.
///
/// # Errors
/// [`EnvError::Protocol`]: messages that are not a list of system/user messages (an assistant
/// one: the error names `dialogue`), a `dialogue` that is not a non-empty list of system, user,
/// assistant (with optional `tool_calls`) and tool messages ending with a user one (a tool
/// message answers the calls of the assistant message before it), both `messages` and `dialogue`, tools that are
/// not a list of objects.
pub fn parse_reset(e: &Json, id: &str) -> Result<ResetReply, EnvError> {
    let messages = messages_of(e, ("messages", &["system", "user"]), "reset", id).map_err(
        |err| match err {
            EnvError::Protocol(m) if m.contains("role is \"assistant\"") => {
                EnvError::Protocol(format!(
                    "{m} (a prompt with assistant turns, a few-shot dialogue, goes in \
                     \"dialogue\" instead of \"messages\")"
                ))
            }
            other => other,
        },
    )?;
    let dialogue = messages_of(
        e,
        ("dialogue", &["system", "user", "assistant", "tool"]),
        "reset",
        id,
    )?;
    if let Some(d) = &dialogue {
        check_tool_answers(d, id)?;
    }
    let messages = match (messages, dialogue) {
        (Some(_), Some(_)) => {
            return Err(EnvError::Protocol(format!(
                "reset reply for episode {id:?} gives both \"messages\" and \"dialogue\": \
                 give one (\"dialogue\" when the prompt holds assistant turns)"
            )))
        }
        (None, Some(d)) => match d.last().map(|m| m.role.as_str()) {
            Some("user") => Some(d),
            last => {
                return Err(EnvError::Protocol(format!(
                    "reset reply for episode {id:?}: \"dialogue\" must end with a user message \
                     (the model answers it); {}",
                    last.map_or("it is empty".to_string(), |r| format!(
                        "its last message's role is {r:?}"
                    ))
                )))
            }
        },
        (m, None) => m,
    };
    let tools = match e.get("tools") {
        None | Some(Json::Null) => None,
        Some(Json::Array(ts)) => {
            if let Some(t) = ts.iter().find(|t| !matches!(t, Json::Object(_))) {
                return Err(EnvError::Protocol(format!(
                    "reset reply for episode {id:?}: each tool must be an object \
                     ({{\"type\": \"function\", \"function\": {{...}}}}), not {}",
                    t.kind()
                )));
            }
            Some(ts.clone())
        }
        Some(other) => {
            return Err(EnvError::Protocol(format!(
                "reset reply for episode {id:?}: \"tools\" must be a list or null, not {}",
                other.kind()
            )))
        }
    };
    Ok(ResetReply { messages, tools })
}

/// A `step` reply of episode `id`.
///
/// # Errors
/// [`EnvError::Protocol`]: messages that are not tool/user messages, a reward that is not a
/// finite number, a `done` that is not a boolean, `metrics` that are not an object of finite
/// numbers within [`MAX_METRICS`] and [`MAX_METRIC_NAME_BYTES`], or `metrics` on a reply without
/// `done: true` (an episode's metrics come with its last reply: that `done` one, or `finish`'s).
pub fn parse_step(e: &Json, id: &str) -> Result<StepReply, EnvError> {
    let messages = messages_of(e, ("messages", &["tool", "user"]), "step", id)?.unwrap_or_default();
    let done = match e.get("done") {
        None | Some(Json::Null) => false,
        Some(Json::Bool(b)) => *b,
        Some(other) => {
            return Err(EnvError::Protocol(format!(
                "step reply for episode {id:?}: \"done\" must be true or false, not {}",
                other.kind()
            )))
        }
    };
    let metrics = metrics_of(e, "step", id)?;
    if !done && !metrics.is_empty() {
        return Err(EnvError::Protocol(format!(
            "step reply for episode {id:?} gives \"metrics\" without \"done\": true; an \
             episode's metrics are read from its last reply only (the step reply with done, or \
             the finish reply): send them there"
        )));
    }
    Ok(StepReply {
        messages,
        reward: reward_of(e, "step", id)?,
        done,
        metrics,
    })
}

/// A `finish` reply of episode `id`.
///
/// # Errors
/// [`EnvError::Protocol`]: a reward that is not a finite number, `metrics` as [`parse_step`]
/// refuses them.
pub fn parse_finish(e: &Json, id: &str) -> Result<FinishReply, EnvError> {
    Ok(FinishReply {
        reward: reward_of(e, "finish", id)?,
        metrics: metrics_of(e, "finish", id)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dialogue` (an addition to section 14): a reset prompt with assistant turns, read into
    /// [`ResetReply::messages`] in its order; `messages` still refuses an assistant message
    /// (naming `dialogue`); both at once, a dialogue not ending with a user message, or a tool
    /// message in it that answers no tool call are refused; an old reply without it reads as
    /// before.
    #[test]
    fn a_reset_dialogue_carries_assistant_turns_into_the_prompt() {
        let parse = |s: &str| parse_reset(&Json::parse(s).unwrap(), "0:0");
        let r = parse(
            r#"{"id":"0:0","dialogue":[{"role":"system","content":"Add."},
                {"role":"user","content":"1+1"},{"role":"assistant","content":"2"},
                {"role":"user","content":"2+3"}],"tools":null}"#,
        )
        .unwrap();
        let got: Vec<(&str, &str)> = r
            .messages
            .as_deref()
            .unwrap()
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("system", "Add."),
                ("user", "1+1"),
                ("assistant", "2"),
                ("user", "2+3")
            ]
        );
        // Old replies: unchanged.
        let old = parse(r#"{"id":"0:0","messages":[{"role":"user","content":"q"}]}"#).unwrap();
        assert_eq!(old.messages.unwrap()[0].content, "q");
        assert_eq!(parse(r#"{"id":"0:0"}"#).unwrap(), ResetReply::default());
        assert_eq!(
            parse(r#"{"id":"0:0","messages":null,"dialogue":null}"#).unwrap(),
            ResetReply::default()
        );
        let err = |s: &str| parse(s).unwrap_err().to_string();
        let e = err(r#"{"id":"0:0","messages":[{"role":"assistant","content":"2"}]}"#);
        assert!(
            e.contains("messages[0]") && e.contains("goes in \"dialogue\""),
            "{e}"
        );
        let e = err(r#"{"id":"0:0","messages":[{"role":"user","content":"q"}],
                "dialogue":[{"role":"user","content":"q"}]}"#);
        assert!(e.contains("both \"messages\" and \"dialogue\""), "{e}");
        let e = err(r#"{"id":"0:0","dialogue":[{"role":"user","content":"q"},
                {"role":"assistant","content":"a"}]}"#);
        assert!(
            e.contains("must end with a user message") && e.contains("\"assistant\""),
            "{e}"
        );
        let e = err(r#"{"id":"0:0","dialogue":[]}"#);
        assert!(e.contains("it is empty"), "{e}");
        let e = err(r#"{"id":"0:0","dialogue":[{"role":"tool","content":"21"}]}"#);
        assert!(e.contains("dialogue[0]") && e.contains("\"tool\""), "{e}");
        let e = err(r#"{"id":"0:0","dialogue":"q"}"#);
        assert!(e.contains("\"dialogue\" must be a list or null"), "{e}");
        // Read, so never warned about as an unknown key.
        let v = Json::parse(r#"{"id":"0:0","dialogue":null}"#).unwrap();
        assert!(unread_keys(Kind::Reset, &v).is_empty());
    }

    #[test]
    fn requests_are_written_in_the_documented_shape() {
        let r = ResetEpisode {
            id: "12:3".into(),
            group: "12".into(),
            sample: 3,
            seed: 913375,
            row: Json::object([("q", Json::from("2+2"))]),
            prompt: Some(vec![Message::new("user", "2+2?")]),
        };
        assert_eq!(
            request_line(Kind::Reset, reset_episodes(&[r])),
            "{\"version\":1,\"type\":\"reset\",\"episodes\":[{\"id\":\"12:3\",\"group\":\"12\",\
             \"sample\":3,\"seed\":913375,\"row\":{\"q\":\"2+2\"},\"prompt\":[{\"role\":\"user\",\
             \"content\":\"2+2?\"}]}]}\n"
        );
        assert_eq!(
            hello_line(&Json::Object(vec![])),
            "{\"version\":1,\"type\":\"hello\",\"options\":{}}\n"
        );
    }

    #[test]
    fn replies_are_matched_by_id_and_checked() {
        let line = r#"{"episodes":[{"id":"b","messages":[{"role":"tool","content":"21","name":"calc"}],"reward":0.5,"done":true},{"id":"a","error":"boom"}]}"#;
        let r = parse_reply(Kind::Step, line, &["a", "b"]).unwrap();
        assert_eq!(r[0], Err("boom".to_string()));
        let s = parse_step(r[1].as_ref().unwrap(), "b").unwrap();
        assert_eq!((s.reward, s.done, s.messages.len()), (Some(0.5), true, 1));
        assert_eq!(s.messages[0].name.as_deref(), Some("calc"));
        let e = parse_reply(Kind::Step, line, &["a"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("did not carry"), "{e}");
        let e = parse_reply(Kind::Step, r#"{"episodes":[]}"#, &["a"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no entry for episode \"a\""), "{e}");
        let bad =
            Json::parse(r#"{"id":"a","messages":[{"role":"assistant","content":"x"}]}"#).unwrap();
        let e = parse_step(&bad, "a").unwrap_err().to_string();
        assert!(
            e.contains("messages[0]") && e.contains("\"assistant\""),
            "{e}"
        );
        let e = check_hello(r#"{"version":2}"#).unwrap_err().to_string();
        assert!(e.contains("version 2"), "{e}");
        check_hello(r#"{"version":1}"#).unwrap();
    }

    /// `metrics` (an addition to section 14): finite numbers by name on a `done` step reply or a
    /// `finish` reply, read in name order; refused (the run stops, as for a bad `reward`) when a
    /// value is not a finite number, a name is empty or too long, there are too many keys, or
    /// the step reply does not end the episode. Absent or null: none.
    #[test]
    fn metrics_are_read_from_an_episodes_last_reply_and_checked() {
        let step = |s: &str| parse_step(&Json::parse(s).unwrap(), "3:1");
        let r = step(r#"{"id":"3:1","done":true,"reward":1,"metrics":{"turns_used":2,"format":0.5,"exact":-1e-3}}"#)
            .unwrap();
        let got: Vec<(&str, f64)> = r.metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(
            got,
            [("exact", -1e-3), ("format", 0.5), ("turns_used", 2.0)]
        );
        assert!(step(r#"{"id":"3:1","done":true,"metrics":null}"#)
            .unwrap()
            .metrics
            .is_empty());
        assert!(step(r#"{"id":"3:1","done":false}"#)
            .unwrap()
            .metrics
            .is_empty());
        let f = parse_finish(
            &Json::parse(r#"{"id":"3:1","reward":0,"metrics":{"gave_up":1}}"#).unwrap(),
            "3:1",
        )
        .unwrap();
        assert_eq!(f.metrics.get("gave_up"), Some(&1.0));
        let err = |s: &str| step(s).unwrap_err().to_string();
        let e = err(r#"{"id":"3:1","done":true,"metrics":{"ok":"yes"}}"#);
        assert_eq!(
            e,
            "environment protocol: step reply for episode \"3:1\": \"metrics\" \
             \"ok\" must be a finite number, not \"yes\""
        );
        let e = err(r#"{"id":"3:1","done":true,"metrics":{"ok":true}}"#);
        assert!(
            e.contains("\"ok\" must be a finite number, not true"),
            "{e}"
        );
        let e = err(r#"{"id":"3:1","done":true,"metrics":[1,2]}"#);
        assert!(
            e.contains("must be an object of numbers") && e.contains("array"),
            "{e}"
        );
        let e = err(r#"{"id":"3:1","done":true,"metrics":{"":1}}"#);
        assert!(e.contains("must not be empty"), "{e}");
        let long = "n".repeat(MAX_METRIC_NAME_BYTES + 1);
        let e = err(&format!(
            r#"{{"id":"3:1","done":true,"metrics":{{"{long}":1}}}}"#
        ));
        assert!(e.contains("a name of 129 bytes; at most 128"), "{e}");
        let many: Vec<String> = (0..=MAX_METRICS).map(|i| format!("\"m{i}\":{i}")).collect();
        let e = err(&format!(
            r#"{{"id":"3:1","done":true,"metrics":{{{}}}}}"#,
            many.join(",")
        ));
        assert!(e.contains("holds 65 keys; at most 64"), "{e}");
        // Exactly the bounds: accepted.
        let most: Vec<String> = (0..MAX_METRICS).map(|i| format!("\"m{i}\":{i}")).collect();
        let r = step(&format!(
            r#"{{"id":"3:1","done":true,"metrics":{{{},"{}":1}}}}"#,
            most[1..].join(","),
            "n".repeat(MAX_METRIC_NAME_BYTES)
        ))
        .unwrap();
        assert_eq!(r.metrics.len(), MAX_METRICS);
        // On a reply that does not end the episode: refused, naming where they go.
        let e = err(r#"{"id":"3:1","done":false,"messages":[],"metrics":{"a":1}}"#);
        assert!(
            e.contains("\"metrics\" without \"done\": true") && e.contains("finish reply"),
            "{e}"
        );
        let e = parse_finish(
            &Json::parse(r#"{"id":"3:1","metrics":{"x":null}}"#).unwrap(),
            "3:1",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("finish reply for episode \"3:1\"") && e.contains("not null"),
            "{e}"
        );
        // Read, so never warned about as an unknown key.
        let v = Json::parse(r#"{"id":"3:1","metrics":{}}"#).unwrap();
        assert!(unread_keys(Kind::Step, &v).is_empty() && unread_keys(Kind::Finish, &v).is_empty());
    }

    #[test]
    fn a_byte_order_mark_before_hellos_reply_is_ignored() {
        check_hello("\u{feff}{\"version\":1}").unwrap();
        let e = check_hello("\u{feff}{\"version\":2}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("version 2"), "{e}");
    }

    #[test]
    fn an_error_of_null_is_no_error() {
        // Python's dataclasses and pydantic write every field: "error": null means none.
        check_hello(r#"{"version":1,"error":null}"#).unwrap();
        let line = r#"{"error":null,"episodes":[{"id":"a","error":null,"reward":1,"done":true}]}"#;
        let r = parse_reply(Kind::Step, line, &["a"]).unwrap();
        let step = parse_step(r[0].as_ref().unwrap(), "a").unwrap();
        assert_eq!((step.reward, step.done), (Some(1.0), true));
        // Any other value is an error, as before.
        let r = parse_reply(
            Kind::Step,
            r#"{"episodes":[{"id":"a","error":{"code":3}}]}"#,
            &["a"],
        );
        assert_eq!(r.unwrap()[0], Err(r#"{"code":3}"#.to_string()));
        let e = parse_reply(Kind::Step, r#"{"error":"down","episodes":[]}"#, &["a"]).unwrap_err();
        assert!(e.to_string().contains("down"), "{e}");
    }

    #[test]
    fn a_version_written_as_a_string_or_a_float_is_named_as_such() {
        // Not "speaks protocol version 1.0; this rlvr speaks version 1".
        for (line, shown) in [
            (r#"{"version":"1"}"#, "\"1\""),
            (r#"{"version":1.0}"#, "1.0"),
        ] {
            let e = check_hello(line).unwrap_err().to_string();
            assert!(
                e.contains(&format!(
                    "gives \"version\": {shown}; it must be the JSON integer 1"
                )),
                "{e}"
            );
        }
        let e = check_hello(r#"{"version":"2"}"#).unwrap_err().to_string();
        assert!(e.contains("speaks protocol version \"2\""), "{e}");
    }
}
