//! An LLM judge over HTTP: a prompt built from a template is sent to an OpenAI-compatible server
//! (`/v1/chat/completions` or `/v1/completions`) and a score is read from its answer by a stated
//! rule.
//!
//! - Template: `{prompt}`, `{completion}`, `{reference}`, `{index}` and any column of the row
//!   (`{question}`, `{NAME}`, [`Sample::columns`]); `{{` and `}}` are literal braces. A name that
//!   is none of these is an error.
//! - Parse rule ([`JudgeParse`]): the first number of the answer within `[min, max]`, or the first
//!   word of the answer among the given labels (case-insensitive), mapped to its value.
//! - An answer that does not parse is a counted failure ([`JudgeVerifier::parse_failures`], and a
//!   warning per batch on stderr): with `on_parse_failure = "zero"` it scores 0, not correct; with
//!   `"error"` the batch fails.
//! - Requests: at most `in_flight` at once, each with a timeout; a timeout, a transport error or
//!   an HTTP 5xx, 429 or 408 is retried `retries` times (waiting 0.1 s · 2^i, or the server's
//!   `Retry-After` capped at `timeout_s` when longer); another HTTP 4xx or a redirect (3xx, never
//!   followed) fails at once.
//!   Every error names the server. The judge samples at `temperature` with `seed` (sent to the
//!   server) and at most `max_tokens` tokens.

use crate::http::{self, Failure};
use crate::{truncate, RewardError, Sample, Score, Verifier};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Which OpenAI-compatible route the judge uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JudgeEndpoint {
    /// `/v1/chat/completions`, the prompt as one user message.
    #[default]
    Chat,
    /// `/v1/completions`, the prompt as is.
    Completions,
}

/// How a score is read from the judge's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "kebab-case", deny_unknown_fields)]
pub enum JudgeParse {
    /// The first number of the answer; it must lie in `[min, max]` and is the reward.
    Number {
        /// Smallest accepted value, in [-1e6, 1e6] and below `max`.
        min: f64,
        /// Largest accepted value, in [-1e6, 1e6].
        max: f64,
    },
    /// The answer's first word (letters, digits, `_` and `-`), compared case-insensitively with
    /// the labels; the reward is the label's value.
    Labels {
        /// The first word's reward per label, e.g. `{ yes = 1.0, no = 0.0 }`.
        labels: BTreeMap<String, f64>,
    },
}

/// What a judge does with an answer it cannot parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ParseFailure {
    /// Reward 0, not correct, counted and reported.
    #[default]
    Zero,
    /// The batch fails (the run stops with a checkpoint).
    Error,
}

/// The settings of a judge (`verifier = { kind = "judge", ... }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeConfig {
    /// Base URL of the server, `http://host:port` (plain HTTP). Required.
    pub server: String,
    /// Model name sent with every request. Required.
    pub model: String,
    /// The judge's prompt: `{prompt}`, `{completion}`, `{reference}`, `{index}` and any column of
    /// the row (`{question}`, `{NAME}`); `{{`/`}}` for literal braces. Required.
    pub template: String,
    /// How the score is read from the answer, an inline table tagged by `rule`. Required.
    pub parse: JudgeParse,
    /// `chat` (`/v1/chat/completions`, the prompt as one user message) or `completions`
    /// (`/v1/completions`, the prompt as is). Default `chat`.
    #[serde(default)]
    pub endpoint: JudgeEndpoint,
    /// An answer that does not parse: `zero` (reward 0, not correct, counted and warned about) or
    /// `error` (the batch fails). Default `zero`.
    #[serde(default)]
    pub on_parse_failure: ParseFailure,
    /// Most tokens of the judge's answer, 1 to 2²⁰, default 8.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// The judge's sampling temperature, in [0, 1000], default 0 (greedy).
    #[serde(default)]
    pub temperature: f64,
    /// The judge's sampling seed, default 0.
    #[serde(default)]
    pub seed: u64,
    /// Most requests in flight at once, 1 to 256, default 8.
    #[serde(default = "default_in_flight")]
    pub in_flight: usize,
    /// Seconds allowed per request, default 60.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Retries of a request after a timeout, a transport error or HTTP 5xx, 429 or 408, at most
    /// 100, default 2.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// The name of an environment variable holding the server's API key, sent as
    /// `Authorization: Bearer KEY` (a hosted OpenAI-compatible server); the key itself never
    /// reaches config.toml, train.log or a message. Default none. Credentials in `server`'s URL
    /// are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Extra JSON keys merged into every request body (e.g. vLLM's `allowed_token_ids`).
    #[serde(default)]
    pub extra_body: BTreeMap<String, Value>,
}

fn default_max_tokens() -> u32 {
    8
}
fn default_in_flight() -> usize {
    8
}
fn default_timeout() -> f64 {
    60.0
}
fn default_retries() -> u32 {
    2
}

/// Names this verifier in messages.
const OWNER: &str = "judge";

/// A built judge.
pub struct JudgeVerifier {
    cfg: JudgeConfig,
    url: String,
    agent: ureq::Agent,
    /// From `api_key_env`'s variable, read once at build.
    api_key: Option<String>,
    failures: AtomicU64,
}

impl JudgeConfig {
    /// Checks the settings and builds the judge.
    ///
    /// # Errors
    /// [`RewardError::Config`] for a URL that is not `http://`, an `in_flight` of 0 or above 256,
    /// a `max_tokens` of 0 or above [`MOST_ANSWER_TOKENS`], a `temperature` outside [0, 1000], a
    /// timeout that is not positive, a `parse` range that is empty or beyond ±1e6, no labels, or a
    /// template naming an unclosed brace.
    pub fn build(&self) -> Result<JudgeVerifier, RewardError> {
        self.check()?;
        let base = self.server.trim_end_matches('/');
        let path = match self.endpoint {
            JudgeEndpoint::Chat => "/v1/chat/completions",
            JudgeEndpoint::Completions => "/v1/completions",
        };
        Ok(JudgeVerifier {
            cfg: self.clone(),
            url: format!("{base}{path}"),
            agent: http::agent(
                crate::bounds::timeout_duration("timeout_s", self.timeout_s)?,
                self.in_flight,
            ),
            api_key: http::api_key(OWNER, self.api_key_env.as_deref())
                .map_err(RewardError::Config)?,
            failures: AtomicU64::new(0),
        })
    }

    /// Checks the settings [`JudgeConfig::build`] would refuse, without building the client.
    ///
    /// # Errors
    /// As [`JudgeConfig::build`].
    pub fn check(&self) -> Result<(), RewardError> {
        let bad = |m: String| {
            Err(RewardError::Config(format!(
                "judge at {}: {m}",
                http::redact(&self.server)
            )))
        };
        if let Err(m) = http::check_server(&self.server) {
            return bad(m);
        }
        if self.in_flight == 0 {
            return bad("in_flight must be at least 1".into());
        }
        let most = crate::bounds::MOST_IN_FLIGHT;
        if self.in_flight > most {
            return bad(format!(
                "in_flight = {} is out of range: at most {most}",
                self.in_flight
            ));
        }
        let most = crate::bounds::MOST_RETRIES;
        if self.retries > most {
            return bad(format!(
                "retries = {} is out of range: at most {most}",
                self.retries
            ));
        }
        if !(1..=MOST_ANSWER_TOKENS).contains(&self.max_tokens) {
            return bad(format!(
                "max_tokens = {} is out of range: expected 1 to {MOST_ANSWER_TOKENS} (the judge's \
                 answer is a score or a label)",
                self.max_tokens
            ));
        }
        if !(self.temperature.is_finite() && (0.0..=1000.0).contains(&self.temperature)) {
            return bad(format!(
                "temperature = {:e} is out of range: expected a finite number in [0, 1000] (0 = \
                 greedy)",
                self.temperature
            ));
        }
        if let Err(e) = crate::bounds::timeout_duration("timeout_s", self.timeout_s) {
            return bad(e.to_string());
        }
        match &self.parse {
            JudgeParse::Number { min, max }
                if !(min.is_finite()
                    && max.is_finite()
                    && min < max
                    && min.abs() <= 1e6
                    && max.abs() <= 1e6) =>
            {
                let shown = |x: f64| {
                    if x.is_finite() && x.abs() < 1e7 {
                        x.to_string()
                    } else {
                        format!("{x:e}")
                    }
                };
                return bad(format!(
                    "parse range [parse.min, parse.max] = [{}, {}] is empty, not finite or beyond \
                     ±1e6: expected parse.min < parse.max within [-1e6, 1e6] (the range a judge's \
                     score must lie in)",
                    shown(*min),
                    shown(*max)
                ));
            }
            JudgeParse::Labels { labels } if labels.is_empty() => {
                return bad("parse.labels is empty".into())
            }
            JudgeParse::Labels { labels } if labels.values().any(|v| !v.is_finite()) => {
                return bad("a label's value is not finite".into())
            }
            _ => {}
        }
        // The template's syntax, with every name present (names are checked per sample).
        render(&self.template, &|_| Some(String::new()))
            .map_err(|e| RewardError::Config(format!("judge at {}: template: {e}", self.server)))?;
        Ok(())
    }
}

/// The most tokens a judge's answer may ask for (`max_tokens`).
pub const MOST_ANSWER_TOKENS: u32 = 1 << 20;

/// Fills `{name}` from `lookup`; `{{` and `}}` are literal braces.
pub(crate) fn render(
    template: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
        } else if tail.starts_with('}') {
            return Err("a lone `}` (write `}}` for a literal brace)".into());
        } else {
            let end = tail
                .find('}')
                .ok_or("a `{` without its `}` (write `{{` for a literal brace)")?;
            let name = tail[1..end].trim();
            let v = lookup(name).ok_or_else(|| {
                format!(
                    "`{{{name}}}` is not prompt, completion, reference, index or a column of the row"
                )
            })?;
            out.push_str(&v);
            rest = &tail[end + 1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The judge prompt for one sample.
pub(crate) fn prompt_for(template: &str, s: &Sample<'_>) -> Result<String, String> {
    render(template, &|name| match name {
        "prompt" => Some(s.prompt.to_string()),
        "completion" => Some(s.completion.to_string()),
        "reference" => Some(s.reference.to_string()),
        "index" => Some(s.index.map_or_else(String::new, |i| i.to_string())),
        _ => s
            .columns
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone()),
    })
}

/// The first decimal number in `text` (sign, digits, optional fraction).
fn first_number(text: &str) -> Option<f64> {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let start = if i > 0 && (b[i - 1] == b'-' || b[i - 1] == b'+') {
                i - 1
            } else {
                i
            };
            let mut j = i;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j + 1 < b.len() && b[j] == b'.' && b[j + 1].is_ascii_digit() {
                j += 1;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
            }
            return text[start..j].parse().ok();
        }
        i += 1;
    }
    None
}

/// The reward that `rule` reads from `answer`, or `None` when it does not parse.
pub fn parse_answer(rule: &JudgeParse, answer: &str) -> Option<f64> {
    match rule {
        JudgeParse::Number { min, max } => first_number(answer).filter(|x| x >= min && x <= max),
        JudgeParse::Labels { labels } => {
            let word: String = answer
                .trim_start_matches(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '-')
                .collect();
            labels
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(&word))
                .map(|(_, v)| *v)
        }
    }
}

impl JudgeVerifier {
    /// Answers that could not be parsed so far (over every batch).
    pub fn parse_failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    fn fail(&self, reason: String) -> RewardError {
        RewardError::Judge {
            server: self.cfg.server.clone(),
            reason,
        }
    }

    fn body(&self, prompt: &str) -> Value {
        let c = &self.cfg;
        let mut body = json!({
            "model": c.model, "max_tokens": c.max_tokens, "temperature": c.temperature,
            "seed": c.seed, "n": 1,
        });
        match c.endpoint {
            JudgeEndpoint::Chat => body["messages"] = json!([{"role": "user", "content": prompt}]),
            JudgeEndpoint::Completions => body["prompt"] = json!(prompt),
        }
        for (k, v) in &c.extra_body {
            body[k] = v.clone();
        }
        body
    }

    /// One attempt: the answer's text.
    fn once(&self, body: &Value) -> Result<String, Failure> {
        let v = http::post_json(
            &self.agent,
            &self.url,
            self.api_key.as_deref(),
            body,
            self.cfg.timeout_s,
        )?;
        let choice = &v["choices"][0];
        let (answer, field) = match self.cfg.endpoint {
            JudgeEndpoint::Chat => (choice["message"]["content"].as_str(), "message.content"),
            JudgeEndpoint::Completions => (choice["text"].as_str(), "text"),
        };
        answer.map(str::to_string).ok_or_else(|| {
            Failure::Retry(format!(
                "HTTP 200 without choices[0].{field}: {}",
                truncate(&v.to_string(), 200)
            ))
        })
    }

    /// The answer to `prompt`, retried per the settings.
    fn ask(&self, prompt: &str) -> Result<String, RewardError> {
        let body = self.body(prompt);
        http::with_retries(self.cfg.retries, || self.once(&body)).map_err(|m| self.fail(m))
    }
}

impl Verifier for JudgeVerifier {
    fn score(&self, sample: &Sample<'_>) -> Result<Score, RewardError> {
        let mut v = self.score_batch(std::slice::from_ref(sample))?;
        v.pop()
            .ok_or_else(|| self.fail("no answer for the sample".into()))
    }

    fn score_batch(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        let prompts: Vec<String> = samples
            .iter()
            .map(|s| prompt_for(&self.cfg.template, s))
            .collect::<Result<_, _>>()
            .map_err(|e| RewardError::Config(format!("judge template: {e}")))?;
        let answers = http::in_pool(prompts.len(), self.cfg.in_flight, |k| self.ask(&prompts[k]));
        let mut out = Vec::with_capacity(samples.len());
        let mut failed = Vec::new();
        for (k, slot) in answers.into_iter().enumerate() {
            let answer = match slot {
                Some(a) => a?,
                None => continue, // not sent after an earlier failure, reported below
            };
            match parse_answer(&self.cfg.parse, &answer) {
                Some(r) => out.push(Score {
                    reward: r,
                    correct: r > 0.0,
                    extracted: Some(answer),
                    gold: None,
                    extra: Default::default(),
                }),
                None => {
                    failed.push((k, answer.clone()));
                    out.push(Score {
                        reward: 0.0,
                        correct: false,
                        extracted: Some(answer),
                        gold: None,
                        extra: Default::default(),
                    });
                }
            }
        }
        if out.len() != samples.len() {
            return Err(self.fail("a request failed; the batch is incomplete".into()));
        }
        if let Some((k, a)) = failed.first() {
            let total = self
                .failures
                .fetch_add(failed.len() as u64, Ordering::Relaxed)
                + failed.len() as u64;
            let what = format!(
                "{} of {} answers could not be parsed ({total} in this run), e.g. item {}: {:?}",
                failed.len(),
                samples.len(),
                k + 1,
                truncate(a, 100)
            );
            match self.cfg.on_parse_failure {
                ParseFailure::Error => {
                    return Err(self.fail(format!("{what} (on_parse_failure = \"error\")")))
                }
                ParseFailure::Zero => eprintln!(
                    "warning: judge at {}: {what}; they score 0 (on_parse_failure = \"zero\")",
                    self.cfg.server
                ),
            }
        }
        Ok(out)
    }
}
