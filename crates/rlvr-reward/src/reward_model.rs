//! A reward model served over HTTP: each (prompt, completion) is sent to a server that returns a
//! scalar score, the way TRL advises serving a learned reward model behind its own engine and
//! Trinity-RFT, verl and OpenRLHF call one.
//!
//! The protocol is vLLM's pooling API (a server started with `vllm serve MODEL --runner pooling`
//! on a `*ForSequenceClassification` checkpoint with one label, as TRL's `RewardTrainer` saves
//! them, or a `*ForRewardModel` one):
//! - `endpoint = "pooling"` (default): `POST /pooling` with `{"model", "input": [TEXT, ...]}` (a
//!   batch per request) or, with `input = "chat"`, `{"model", "messages": [...]}` (one
//!   conversation per request: the prompt as the user's message, the completion as the
//!   assistant's, rendered by the server's chat template), and `"use_activation": false`: the raw
//!   output, which is the reward a Bradley-Terry reward model was trained to give (vLLM otherwise
//!   applies the classifier's activation, a sigmoid for one label; `activation = true` asks for
//!   it). The answer's `data[i].data` is a number,
//!   a vector (one value per label; sequence pooling) or a matrix (one vector per token; a
//!   `*ForRewardModel`'s per-token pooling, whose last token scores the sequence).
//! - `endpoint = "classify"`: `POST /classify`, the same inputs; `data[i].probs` is the vector
//!   (after the model's activation: a sigmoid for one label, a softmax for several).
//!
//! The reward is the vector's value at `label` (default 0), times `scale` plus `shift`
//! (defaults 1 and 0); a completion is counted correct when the reward exceeds `correct_above`
//! (default 0). Text input is the `template` (default `{prompt}{completion}`, the names of
//! [`crate::judge`]'s template). Requests: at most `in_flight` at once, `batch_size` texts per
//! request, a timeout each, retries as the judge's; a missing, non-numeric or non-finite score,
//! or a count that differs from the request's, fails the batch naming the server.

use crate::bounds::MOST_IN_FLIGHT;
pub use crate::bounds::MOST_RETRIES;
use crate::http::{self, Failure};
use crate::judge::{prompt_for, render};
use crate::{truncate, RewardError, Sample, Score, Verifier};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Which pooling route the reward model is asked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RewardModelEndpoint {
    /// `/pooling`: the model's output, raw unless `activation = true`.
    #[default]
    Pooling,
    /// `/classify`: the output after the model's activation (`probs`).
    Classify,
}

/// How the (prompt, completion) pair reaches the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RewardModelInput {
    /// One text, the `template` rendered: batched, `batch_size` texts per request.
    #[default]
    Text,
    /// A conversation (user: prompt, assistant: completion) rendered by the server's chat
    /// template: one request per completion.
    Chat,
}

/// The settings of a reward model (`verifier = { kind = "reward_model", ... }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardModelConfig {
    /// Base URL of the server, `http://host:port` (plain HTTP). Required.
    pub server: String,
    /// Model name sent with every request. Required.
    pub model: String,
    /// `pooling` (`POST /pooling`, the model's raw output unless `activation`) or `classify`
    /// (`POST /classify`, after the model's activation). Default `pooling`.
    #[serde(default)]
    pub endpoint: RewardModelEndpoint,
    /// With `endpoint = "pooling"`: apply the model's activation (vLLM's `use_activation`) to
    /// the score; default false, the raw output.
    #[serde(default)]
    pub activation: bool,
    /// `text` (the `template` rendered, `batch_size` texts per request) or `chat` (user: prompt,
    /// assistant: completion, rendered by the server's chat template; one request each). Default
    /// `text`.
    #[serde(default)]
    pub input: RewardModelInput,
    /// The text sent with `input = "text"`, with the judge's `template` names. Default
    /// `{prompt}{completion}`.
    #[serde(default = "default_template")]
    pub template: String,
    /// Which value of the model's output vector is the score, below 2²⁰, default 0.
    #[serde(default)]
    pub label: usize,
    /// reward = scale · score + shift, in [-1e6, 1e6]; default 1.
    #[serde(default = "default_scale")]
    pub scale: f64,
    /// See `scale`; in [-1e6, 1e6], default 0.
    #[serde(default)]
    pub shift: f64,
    /// A completion counts as correct (the `accuracy` metric) when its reward exceeds this,
    /// default 0.
    #[serde(default)]
    pub correct_above: f64,
    /// Texts per request with `input = "text"`, default 16.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Most requests in flight at once, default 4.
    #[serde(default = "default_in_flight")]
    pub in_flight: usize,
    /// Seconds allowed per request, default 60.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Retries of a request after a timeout, a transport error, HTTP 5xx, 429 or 408 or a
    /// malformed answer, at most 100, default 2.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// The name of an environment variable holding the server's API key, sent as
    /// `Authorization: Bearer KEY` (a hosted OpenAI-compatible server); the key itself never
    /// reaches config.toml, train.log or a message. Default none. Credentials in `server`'s URL
    /// are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Extra JSON keys merged into every request body.
    #[serde(default)]
    pub extra_body: BTreeMap<String, Value>,
}

fn default_template() -> String {
    "{prompt}{completion}".into()
}
fn default_scale() -> f64 {
    1.0
}
fn default_batch_size() -> usize {
    16
}
fn default_in_flight() -> usize {
    4
}
fn default_timeout() -> f64 {
    60.0
}
fn default_retries() -> u32 {
    2
}

/// The largest `label` (an index into the model's output vector: a classifier's classes or a
/// pooling model's output width, which no model has 2^20 of).
pub const MOST_LABEL: usize = (1 << 20) - 1;

/// Most texts per request (a bound on what a config can allocate).
const MOST_PER_REQUEST: usize = 4096;

/// Names this verifier in messages.
const OWNER: &str = "reward model";

/// A built reward-model verifier.
pub struct RewardModelVerifier {
    cfg: RewardModelConfig,
    url: String,
    agent: ureq::Agent,
    /// From `api_key_env`'s variable, read once at build.
    api_key: Option<String>,
}

impl RewardModelConfig {
    /// Checks the settings and builds the verifier.
    ///
    /// # Errors
    /// [`RewardError::Config`] for a URL that is not `http://`, `in_flight` or `batch_size` of 0
    /// or above their bounds (256 and 4096), a timeout outside (0, 1e6] seconds, a
    /// `scale`, `shift` or `correct_above` not finite or beyond 1e6 in magnitude, a `label` above
    /// [`MOST_LABEL`], or a template with an unclosed brace.
    pub fn build(&self) -> Result<RewardModelVerifier, RewardError> {
        self.check()?;
        let base = self.server.trim_end_matches('/');
        let path = match self.endpoint {
            RewardModelEndpoint::Pooling => "/pooling",
            RewardModelEndpoint::Classify => "/classify",
        };
        Ok(RewardModelVerifier {
            cfg: self.clone(),
            url: format!("{base}{path}"),
            agent: http::agent(
                crate::bounds::timeout_duration("timeout_s", self.timeout_s)?,
                self.in_flight,
            ),
            api_key: http::api_key(OWNER, self.api_key_env.as_deref())
                .map_err(RewardError::Config)?,
        })
    }

    /// Checks the settings [`RewardModelConfig::build`] would refuse, without building the
    /// client (for the config check at start-up).
    ///
    /// # Errors
    /// As [`RewardModelConfig::build`].
    pub fn check(&self) -> Result<(), RewardError> {
        let bad = |m: String| {
            Err(RewardError::Config(format!(
                "reward model at {}: {m}",
                http::redact(&self.server)
            )))
        };
        if let Err(m) = http::check_server(&self.server) {
            return bad(m);
        }
        if !(1..=MOST_IN_FLIGHT).contains(&self.in_flight) {
            return bad(format!(
                "in_flight must be in 1..={MOST_IN_FLIGHT}, got {}",
                self.in_flight
            ));
        }
        if self.retries > MOST_RETRIES {
            return bad(format!(
                "retries = {} is out of range: at most {MOST_RETRIES}",
                self.retries
            ));
        }
        if !(1..=MOST_PER_REQUEST).contains(&self.batch_size) {
            return bad(format!(
                "batch_size must be in 1..={MOST_PER_REQUEST}, got {}",
                self.batch_size
            ));
        }
        if let Err(e) = crate::bounds::timeout_duration("timeout_s", self.timeout_s) {
            return bad(e.to_string());
        }
        for (k, v) in [
            ("scale", self.scale),
            ("shift", self.shift),
            ("correct_above", self.correct_above),
        ] {
            if !v.is_finite() {
                return bad(format!("{k} must be a finite number, got {v}"));
            }
            if v.abs() > 1e6 {
                return bad(format!(
                    "{k} = {v:e} is out of range: expected a number in [-1e6, 1e6] (rewards \
                     beyond 1e6 in magnitude are warned about as broken)"
                ));
            }
        }
        if self.label > MOST_LABEL {
            return bad(format!(
                "label = {} is out of range: at most {MOST_LABEL} (an index into the model's \
                 output vector)",
                self.label
            ));
        }
        render(&self.template, &|_| Some(String::new())).map_err(|e| {
            RewardError::Config(format!("reward model at {}: template: {e}", self.server))
        })?;
        Ok(())
    }
}

/// The score in one `data[i]` entry: `data` (pooling: number, vector, or per-token matrix whose
/// last row scores the sequence) or `probs` (classify), at `label`.
pub fn score_of(entry: &Value, endpoint: RewardModelEndpoint, label: usize) -> Result<f64, String> {
    let key = match endpoint {
        RewardModelEndpoint::Pooling => "data",
        RewardModelEndpoint::Classify => "probs",
    };
    let mut v = entry.get(key).ok_or_else(|| {
        format!(
            "an entry without `{key}`: {}",
            truncate(&entry.to_string(), 200)
        )
    })?;
    // Per-token output: the last token's vector.
    if let Some(last) = v.as_array().and_then(|a| a.last()).filter(|x| x.is_array()) {
        v = last;
    }
    let x = match v {
        Value::Number(n) if label == 0 => n.as_f64(),
        Value::Array(a) => match a.get(label) {
            Some(x) => x.as_f64(),
            None => {
                return Err(format!(
                    "`{key}` has {} values and label = {label} is beyond them",
                    a.len()
                ))
            }
        },
        _ => None,
    };
    match x {
        Some(x) if x.is_finite() => Ok(x),
        _ => Err(format!(
            "`{key}` is not a finite number at label {label}: {}",
            truncate(&v.to_string(), 200)
        )),
    }
}

impl RewardModelVerifier {
    fn fail(&self, reason: String) -> RewardError {
        RewardError::Judge {
            server: self.cfg.server.clone(),
            reason: format!("reward model: {reason}"),
        }
    }

    /// One request's body for `n` items: texts, or one conversation.
    fn body(&self, texts: Option<&[String]>, chat: Option<&Sample<'_>>) -> Value {
        let mut body = json!({"model": self.cfg.model});
        if self.cfg.endpoint == RewardModelEndpoint::Pooling {
            body["use_activation"] = json!(self.cfg.activation);
        }
        if let Some(t) = texts {
            body["input"] = json!(t);
        }
        if let Some(s) = chat {
            body["messages"] = json!([
                {"role": "user", "content": s.prompt},
                {"role": "assistant", "content": s.completion},
            ]);
        }
        for (k, v) in &self.cfg.extra_body {
            body[k] = v.clone();
        }
        body
    }

    /// The scores of one request that carries `n` items, in order.
    fn request(&self, body: &Value, n: usize) -> Result<Vec<f64>, RewardError> {
        let cfg = &self.cfg;
        http::with_retries(cfg.retries, || {
            let v = http::post_json(
                &self.agent,
                &self.url,
                self.api_key.as_deref(),
                body,
                cfg.timeout_s,
            )?;
            let data = v["data"].as_array().ok_or_else(|| {
                Failure::Retry(format!(
                    "HTTP 200 without a `data` list: {}",
                    truncate(&v.to_string(), 200)
                ))
            })?;
            if data.len() != n {
                return Err(Failure::Retry(format!(
                    "{} scores for {n} inputs",
                    data.len()
                )));
            }
            // Entries may come in any order; `index` places them.
            let mut out = vec![f64::NAN; n];
            for (i, e) in data.iter().enumerate() {
                let k = e["index"].as_u64().map_or(i, |k| k as usize);
                let slot = out
                    .get_mut(k)
                    .ok_or_else(|| Failure::Retry(format!("index {k} for {n} inputs")))?;
                *slot = score_of(e, cfg.endpoint, cfg.label).map_err(Failure::Retry)?;
            }
            if out.iter().any(|x| x.is_nan()) {
                return Err(Failure::Retry("an input was given no score".into()));
            }
            Ok(out)
        })
        .map_err(|m| self.fail(m))
    }
}

impl Verifier for RewardModelVerifier {
    fn score(&self, sample: &Sample<'_>) -> Result<Score, RewardError> {
        let mut v = self.score_batch(std::slice::from_ref(sample))?;
        v.pop()
            .ok_or_else(|| self.fail("no score for the sample".into()))
    }

    fn score_batch(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        let cfg = &self.cfg;
        let scores: Vec<f64> = match cfg.input {
            RewardModelInput::Text => {
                let texts: Vec<String> = samples
                    .iter()
                    .map(|s| prompt_for(&cfg.template, s))
                    .collect::<Result<_, _>>()
                    .map_err(|e| RewardError::Config(format!("reward model template: {e}")))?;
                let chunks: Vec<&[String]> = texts.chunks(cfg.batch_size).collect();
                let parts = http::in_pool(chunks.len(), cfg.in_flight, |k| {
                    self.request(&self.body(Some(chunks[k]), None), chunks[k].len())
                });
                let mut out = Vec::with_capacity(samples.len());
                for p in parts {
                    out.extend(p.ok_or_else(|| self.fail("a request failed".into()))??);
                }
                out
            }
            RewardModelInput::Chat => {
                let parts = http::in_pool(samples.len(), cfg.in_flight, |k| {
                    self.request(&self.body(None, Some(&samples[k])), 1)
                });
                let mut out = Vec::with_capacity(samples.len());
                for p in parts {
                    out.extend(p.ok_or_else(|| self.fail("a request failed".into()))??);
                }
                out
            }
        };
        Ok(scores
            .into_iter()
            .map(|x| {
                let reward = cfg.scale * x + cfg.shift;
                Score {
                    reward,
                    correct: reward > cfg.correct_above,
                    extracted: Some(format!("{x}")),
                    gold: None,
                    extra: Default::default(),
                }
            })
            .collect())
    }
}
