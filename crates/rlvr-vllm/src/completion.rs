//! One group as one `/v1/completions` request: the request body, the seed, and the answer turned
//! into the native engine's [`Completion`] records (ids, behaviour log-probs, finish reason).

use rlvr_rollout::{Completion, Detokenize, FinishReason, SamplingParams};
use serde::Deserialize;
use serde_json::{json, Value};

/// vLLM's largest accepted seed + 1 (it validates seeds as signed 64-bit integers).
const SEED_SPACE: u64 = 1 << 63;

/// SplitMix64's finaliser: a fixed bijection of u64 (Steele et al. 2014).
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The `seed` of the request for the group of global prompt index `prompt_index` (the index the
/// native engine keys its streams by: `first_prompt_index` + position, so a DAPO refill, drawn at
/// new indices, is a new draw) with group size `group_size`.
///
/// vLLM seeds sample j of a request with `seed + j`, so a request owns the seed range
/// `[seed, seed + K)`. The seed is `(mix64(run_seed) + prompt_index · K) mod 2^63`: the run seed
/// only picks where the run's ranges start, and requests of distinct prompt indices own disjoint
/// ranges (up to 2^63 / K prompts, which no run reaches). A fresh hash per request could not
/// promise that.
pub fn request_seed(run_seed: u64, prompt_index: usize, group_size: usize) -> u64 {
    let base = mix64(run_seed) % SEED_SPACE;
    let offset = (prompt_index as u64).wrapping_mul(group_size as u64) % SEED_SPACE;
    (base + offset) % SEED_SPACE
}

/// The `seed` of the request that continues one multi-turn episode by its assistant turn `turn`
/// (from 2; DESIGN.md section 14): turn 1 is the group's request ([`request_seed`]), later turns
/// are one request each with `n = 1`, so each owns the single seed
/// `mix64(mix64(mix64(mix64(run_seed) ⊕ prompt_index) ⊕ sample_index) ⊕ turn) mod 2^63`.
///
/// The seed depends on the episode's (run seed, prompt draw index, sample index, turn) only,
/// never on which other episodes share the call, as the native engine's [`rlvr_rollout::turn_rng`]
/// stream. Unlike group seeds these are hashed, not ranges: two keys share a seed with
/// probability about 2^-63 per pair (then they draw the same uniforms over different contexts).
pub fn turn_seed(run_seed: u64, prompt_index: usize, sample_index: usize, turn: u64) -> u64 {
    let mut z = mix64(run_seed);
    z = mix64(z ^ prompt_index as u64);
    z = mix64(z ^ sample_index as u64);
    mix64(z ^ turn) % SEED_SPACE
}

/// Whether `params` make vLLM's processed log-probs renormalised over a truncated distribution,
/// unlike DESIGN.md section 3's ℓ_old over the full vocabulary (which the native engine records):
/// top-p < 1, top-k, or `min_new_tokens > 0` with stop ids (vLLM masks the stop ids before the
/// log-softmax; measured on vLLM 0.32: a masked stop id of probability p shifts every log-prob
/// by −log(1 − p) until `min_tokens`).
pub fn is_truncated(params: &SamplingParams) -> bool {
    params.top_p < 1.0
        || params.top_k.is_some_and(|k| k > 0)
        || (params.min_new_tokens > 0 && !params.stop_ids.is_empty())
}

/// The JSON body of the request for one group.
///
/// `ignore_eos` is set and the stop ids are sent as `stop_token_ids`, so the server stops on
/// exactly `params.stop_ids` (the native engine's rule) and not also on an EOS id of its own;
/// `min_tokens` withholds those ids like the native `min_new_tokens`. Stop strings are sent with
/// `include_stop_str_in_output`, and the client cuts the ids after the completing token
/// ([`stop_string_cut`]), as the native engine keeps that token. `salt`, when given, is sent as
/// `cache_salt` (vLLM shares prefix-cache blocks only between requests of the same salt:
/// [`crate::client::cache_salt`]).
pub fn request_body(
    model: &str,
    prompt: &[u32],
    params: &SamplingParams,
    seed: u64,
    salt: Option<&str>,
) -> Value {
    let mut body = json!({
        "model": model,
        "prompt": prompt,
        "n": params.group_size,
        "max_tokens": params.max_new_tokens,
        "min_tokens": params.min_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "seed": seed,
        "logprobs": 0,
        "return_token_ids": true,
        "ignore_eos": true,
        "stop_token_ids": params.stop_ids,
        "skip_special_tokens": false,
    });
    if let Some(k) = params.top_k.filter(|&k| k > 0) {
        body["top_k"] = json!(k);
    }
    if !params.stop_strings.is_empty() {
        body["stop"] = json!(params.stop_strings);
        body["include_stop_str_in_output"] = json!(true);
    }
    if let Some(salt) = salt {
        body["cache_salt"] = json!(salt);
    }
    body
}

/// The parts of a `/v1/completions` answer the client reads, parsed by serde derive: the texts,
/// token strings, top log-probs and text offsets vLLM also sends are skipped without being held,
/// so an answer of N tokens takes about 12·N bytes besides its body, up to twice that while its
/// vectors grow (a `serde_json::Value` of it takes several times the body).
#[derive(Debug, Deserialize)]
pub struct CompletionAnswer {
    /// `choices`, one per sample (`None` when absent).
    #[serde(default)]
    pub choices: Option<Vec<RawChoice>>,
}

/// One element of `choices` as sent, before [`parse_group`] checks it.
#[derive(Debug, Deserialize)]
pub struct RawChoice {
    /// `index`: prompt position · n + sample index.
    #[serde(default)]
    pub index: Option<u64>,
    /// `token_ids` (with `return_token_ids`).
    #[serde(default)]
    pub token_ids: Option<Vec<u32>>,
    /// `logprobs`.
    #[serde(default)]
    pub logprobs: Option<RawLogprobs>,
    /// `finish_reason`.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// `stop_reason`: the stop id (number), the stop string (string) or null.
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
}

/// A choice's `logprobs` object: only `token_logprobs` is read, as f32 (what the records keep;
/// null entries kept as `None`).
#[derive(Debug, Deserialize)]
pub struct RawLogprobs {
    /// One log-prob per generated token.
    #[serde(default)]
    pub token_logprobs: Option<Vec<Option<f32>>>,
}

/// Why a choice stopped, as vLLM's `stop_reason` says.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum StopReason {
    /// A stop token id.
    Id(i64),
    /// A stop string.
    Text(String),
}

/// One choice of the answer, checked: ids and log-probs of equal length, finite log-probs.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// `choices[i].index`: prompt position · n + sample index.
    pub index: usize,
    /// Generated ids (a generated stop id included).
    pub token_ids: Vec<u32>,
    /// One log-prob per id.
    pub logprobs: Vec<f32>,
    /// `finish_reason`: "stop" or "length" (anything else is refused).
    pub finish_reason: String,
    /// `stop_reason`: the stop id, the stop string or `None` (EOS / length).
    pub stop_reason: Option<StopReason>,
}

fn parse_choice(c: RawChoice) -> Result<Choice, String> {
    let index = c.index.ok_or("a choice without an integer `index`")? as usize;
    let token_ids = c.token_ids.ok_or_else(|| {
        format!("choice {index} has no `token_ids` (does the server support return_token_ids?)")
    })?;
    let lps = c
        .logprobs
        .and_then(|l| l.token_logprobs)
        .ok_or_else(|| format!("choice {index} has no `logprobs.token_logprobs`"))?;
    let logprobs: Vec<f32> = lps
        .into_iter()
        .collect::<Option<_>>()
        .ok_or_else(|| format!("choice {index}: a log-prob is null"))?;
    if token_ids.len() != logprobs.len() {
        return Err(format!(
            "choice {index} has {} token ids but {} log-probs",
            token_ids.len(),
            logprobs.len()
        ));
    }
    if let Some(x) = logprobs.iter().find(|x| !x.is_finite() || **x > 1e-4) {
        return Err(format!(
            "choice {index}: log-prob {x} is not a log-probability"
        ));
    }
    let finish_reason = c.finish_reason.unwrap_or_default();
    if finish_reason != "stop" && finish_reason != "length" {
        return Err(format!("choice {index}: finish_reason {finish_reason:?}"));
    }
    Ok(Choice {
        index,
        token_ids,
        logprobs,
        finish_reason,
        stop_reason: c.stop_reason,
    })
}

/// Parses the answer to a one-prompt request with `n = group_size`: exactly K choices with
/// indices 0..K, each checked ([`Choice`]). Sorted by index.
///
/// # Errors
/// A message naming what is missing or inconsistent (the caller retries, then reports it).
pub fn parse_group(
    answer: CompletionAnswer,
    group_size: usize,
    max_new_tokens: usize,
) -> Result<Vec<Choice>, String> {
    let choices = answer.choices.ok_or("the answer has no `choices` array")?;
    if choices.len() != group_size {
        return Err(format!("{} choices for n = {group_size}", choices.len()));
    }
    let mut out: Vec<Choice> = choices
        .into_iter()
        .map(parse_choice)
        .collect::<Result<_, _>>()?;
    out.sort_by_key(|c| c.index);
    for (j, c) in out.iter().enumerate() {
        if c.index != j {
            return Err(format!(
                "choice indices are not 0..{group_size} (found {})",
                c.index
            ));
        }
        if c.token_ids.len() > max_new_tokens {
            return Err(format!(
                "choice {j} has {} tokens, more than max_tokens = {max_new_tokens}",
                c.token_ids.len()
            ));
        }
    }
    Ok(out)
}

/// Where the first stop string ends in `ids`: the smallest t ≥ `min_new_tokens` such that the
/// decoded text of `ids[..=t]` contains one of `stop_strings` (the native engine's rule: the token
/// that completes the string is kept). `None` if no prefix contains one.
///
/// # Errors
/// The detokenizer's error message.
pub fn stop_string_cut(
    ids: &[u32],
    stop_strings: &[String],
    min_new_tokens: usize,
    detok: &dyn Detokenize,
) -> Result<Option<usize>, String> {
    if stop_strings.is_empty() {
        return Ok(None);
    }
    for t in min_new_tokens.saturating_sub(1)..ids.len() {
        let text = detok.detokenize(&ids[..=t])?;
        if stop_strings.iter().any(|s| text.contains(s.as_str())) {
            return Ok(Some(t));
        }
    }
    Ok(None)
}

/// Turns checked choices into the native engine's records for the group of `prompt_index`.
///
/// Finish reasons: "length" → [`FinishReason::Length`]; "stop" with a string `stop_reason` →
/// [`FinishReason::StopString`]; "stop" otherwise (a stop id) → [`FinishReason::Eos`]. With stop
/// strings and a detokenizer, the ids and log-probs are cut together after the token that
/// completes the first stop string, so the stop text is part of the completion (as natively) and
/// the two stay aligned whatever the server returned past it.
///
/// # Errors
/// The detokenizer's error message.
pub fn to_completions(
    choices: Vec<Choice>,
    prompt_index: usize,
    params: &SamplingParams,
    version: u64,
    detok: Option<&dyn Detokenize>,
) -> Result<Vec<Completion>, String> {
    choices
        .into_iter()
        .map(|c| {
            let mut finish_reason = match (c.finish_reason.as_str(), &c.stop_reason) {
                ("length", _) => FinishReason::Length,
                (_, Some(StopReason::Text(_))) => FinishReason::StopString,
                _ => FinishReason::Eos,
            };
            let (mut token_ids, mut behaviour_logprobs) = (c.token_ids, c.logprobs);
            if let Some(d) = detok {
                if let Some(t) =
                    stop_string_cut(&token_ids, &params.stop_strings, params.min_new_tokens, d)?
                {
                    token_ids.truncate(t + 1);
                    behaviour_logprobs.truncate(t + 1);
                    finish_reason = FinishReason::StopString;
                }
            }
            Ok(Completion {
                prompt_index,
                sample_index: c.index,
                token_ids,
                behaviour_logprobs,
                finish_reason,
                version,
            })
        })
        .collect()
}
