//! Start-up checks (health, served model, context length, tokenizer, log-prob mode) and the
//! scoring of a fixed sequence on a server (`prompt_logprobs`) and by the trainer.

use candle_core::IndexOp;
use rlvr_model::{Model, ModelConfig, RopeScaling, TokenizerBundle};
use rlvr_rollout::SamplingParams;
use serde_json::json;

use crate::client::VllmClient;
use crate::completion::parse_group;
use crate::error::{Result, VllmError};
use crate::http::Server;

/// Mean |ℓ_vLLM − ℓ_trainer| (nats) above which [`VllmClient::check_logprob_mode`] fails. Raw
/// log-probs at T = 0.7 were 0.4–0.76 nats away (this crate's docs/VLLM-CPU.md); processed ones
/// ~1e-6 in f32, ~1e-2 in bf16.
pub const LOGPROB_MODE_TOLERANCE: f64 = 0.05;

/// What one server reported at start-up.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerInfo {
    /// Base URL.
    pub url: String,
    /// `max_model_len` of the served model.
    pub max_model_len: usize,
}

/// Refuses a model vLLM 0.32 cannot serve as the trainer computes it, whatever the servers' flags,
/// with the reason: an untied Gemma 2 (`tie_word_embeddings` false), whose vLLM model
/// (`Gemma2ForCausalLM`, vllm/model_executor/models/gemma2.py) has no `lm_head` and takes its
/// logits from the embedding (its loader refuses the checkpoint's `lm_head.weight`). Every
/// released Gemma 2 is tied. Checked by [`crate::VllmRollout::connect`] before any request.
///
/// # Errors
/// [`VllmError::Config`] naming the architecture and the reason.
pub fn check_servable(config: &ModelConfig) -> Result<()> {
    if config.arch == rlvr_model::Arch::Gemma2 && !config.tie_word_embeddings {
        return Err(VllmError::Config(
            "an untied Gemma 2 (tie_word_embeddings false) cannot be served by vLLM 0.32: its \
             Gemma2ForCausalLM has no lm_head and takes the logits from the embedding, and its \
             loader refuses the checkpoint's lm_head.weight; sample it with rollout.backend = \
             \"native\", or tie the head"
                .into(),
        ));
    }
    Ok(())
}

/// Refuses a LongRoPE model (Phi-3, Phi-4-mini: [`RopeScaling::LongRope`]) on servers that would
/// rotate it otherwise than the trainer, naming the server and the fix.
///
/// vLLM 0.32's LongRoPE (`Phi3LongRoPEScaledRotaryEmbedding`, read in vllm/model_executor/layers/
/// rotary_embedding/phi3_long_rope_scaled_rope.py) decides once per server, not per sequence:
/// with `--max-model-len` above `original_max_position_embeddings` every sequence turns with the
/// long factors, while rlvr (as transformers for one sequence) turns a sequence that fits the
/// original context with the short ones, so every behaviour log-prob would be off (0.68 nats on
/// the tiny test model); at or below it, every sequence turns with the short ones, as rlvr's do
/// (none can pass the switch). It also ignores config.json's `factor` and `attention_factor`,
/// scaling cos/sin by `√(1 + ln s / ln original)` with `s = max_position_embeddings / original`
/// (1 when `s ≤ 1`): a model whose [`ModelConfig::rope_attention_factor`] differs is refused too.
/// Other rope types pass.
///
/// # Errors
/// [`VllmError::Check`] naming the first server that disagrees and what to change.
pub fn check_longrope(config: &ModelConfig, servers: &[ServerInfo]) -> Result<()> {
    let Some(RopeScaling::LongRope {
        original_max_position_embeddings: original,
        ..
    }) = &config.rope_scaling
    else {
        return Ok(());
    };
    let s = config.max_position_embeddings as f64 / original;
    let vllm_factor = if s <= 1.0 {
        1.0
    } else {
        (1.0 + s.ln() / original.ln()).sqrt()
    };
    let ours = config.rope_attention_factor();
    for info in servers {
        if info.max_model_len as f64 > *original {
            return Err(VllmError::Check {
                server: info.url.clone(),
                msg: format!(
                    "its max_model_len {} is above the model's LongRoPE                      original_max_position_embeddings {original}: vLLM 0.32 then rotates every                      sequence with the long factors, where the trainer uses the short ones for a                      sequence within {original} tokens, so the behaviour log-probs would not be                      the trainer's; start the server with --max-model-len {original} or less",
                    info.max_model_len
                ),
            });
        }
        if (ours - vllm_factor).abs() > 1e-9 * vllm_factor {
            return Err(VllmError::Check {
                server: info.url.clone(),
                msg: format!(
                    "the model's LongRoPE attention factor is {ours} (config.json's `factor` or                      `attention_factor`), but vLLM 0.32 ignores both and scales by {vllm_factor}                      (from max_position_embeddings / original_max_position_embeddings), so its                      log-probs would not be the trainer's; the native engine samples this model"
                ),
            });
        }
    }
    Ok(())
}

/// The trainer's log-probs of `completion` after `prompt`: `log_softmax(logits / T)` at each
/// completion token ([`Model::token_logprobs`], no gradient), f32, one per completion token.
///
/// # Errors
/// An empty prompt or completion ([`VllmError::Config`]); model errors.
pub fn trainer_logprobs(
    model: &Model,
    prompt: &[u32],
    completion: &[u32],
    temperature: f64,
) -> Result<Vec<f32>> {
    if prompt.is_empty() || completion.is_empty() {
        return Err(VllmError::Config(
            "scoring needs a non-empty prompt and completion".into(),
        ));
    }
    let ids: Vec<u32> = prompt.iter().chain(completion).copied().collect();
    let mask = vec![vec![1u32; ids.len()]];
    let lp = model.token_logprobs(&[ids], &mask, prompt.len() - 1, temperature, false, false)?;
    Ok(lp
        .logprobs
        .i(0)?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1::<f32>()?)
}

/// `server`'s prompt log-probs (T = 1) of `ids` under `model`, the request salted with `salt`
/// (vLLM 0.32 never reads the prefix cache for a request with `prompt_logprobs`, so the salt only
/// keeps the blocks it writes to this run and version).
fn server_logprobs(
    server: &Server,
    model: &str,
    ids: &[u32],
    salt: Option<&str>,
) -> Result<Vec<f32>> {
    let mut body = json!({"model": model, "prompt": ids, "max_tokens": 1, "temperature": 1.0,
                      "prompt_logprobs": 0, "logprobs": 0});
    if let Some(salt) = salt {
        body["cache_salt"] = json!(salt);
    }
    server.call("POST", "/v1/completions", Some(&body), |a| {
        let pl = a["choices"][0]["prompt_logprobs"]
            .as_array()
            .ok_or("no `choices[0].prompt_logprobs`")?;
        if pl.len() != ids.len() {
            return Err(format!(
                "{} prompt log-prob entries for {} ids",
                pl.len(),
                ids.len()
            ));
        }
        ids.iter()
            .zip(pl)
            .skip(1)
            .map(|(id, e)| {
                e[id.to_string()]["logprob"]
                    .as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| format!("no prompt log-prob for token {id}"))
            })
            .collect()
    })
}

/// The tokenizer probe of [`VllmClient::check_servers`]: a text holding plain text, the
/// highest token id's text and every EOS token, and our ids for it (special tokens parsed, none
/// added).
///
/// # Errors
/// [`VllmError::Config`] when our ids for the probe do not contain the last id and the EOS ids
/// (the check could not see them); tokenizer errors.
pub fn tokenizer_probe(tokenizer: &TokenizerBundle) -> Result<(String, Vec<u32>)> {
    let last_id = tokenizer.vocab_size() as u32 - 1;
    let mut probe = String::from("rlvr tokenizer check: 12 + 30 = 42. Ünïcödé ✓ ");
    probe.push_str(&tokenizer.decode(&[last_id], false)?);
    for &e in &tokenizer.eos_ids {
        probe.push_str(&tokenizer.decode(&[e], false)?);
    }
    let ours = tokenizer.encode(&probe, false)?;
    if !ours.contains(&last_id) || tokenizer.eos_ids.iter().any(|e| !ours.contains(e)) {
        return Err(VllmError::Config(format!(
            "the tokenizer probe {probe:?} does not encode to its last id {last_id} and EOS ids {:?} \
             (ours: {ours:?}); the check cannot run with this tokenizer",
            tokenizer.eos_ids
        )));
    }
    Ok((probe, ours))
}

impl VllmClient {
    /// Each server's log-probs (T = 1) of `completion` after `prompt`, scored as a prompt
    /// (`prompt_logprobs: 0, max_tokens: 1`) by [`VllmClient::model_name`] (the served model, or
    /// the current LoRA adapter): one vector per server, in [`VllmClient::server_urls`] order, one
    /// value per completion token.
    ///
    /// # Errors
    /// As [`crate::Server::call`]; an empty prompt or completion.
    pub fn score(&self, prompt: &[u32], completion: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.score_as(&self.model_name, prompt, completion)
    }

    /// As [`VllmClient::score`], naming `model` in the request (e.g. `served_model_name` for the
    /// base weights while a LoRA adapter is current).
    ///
    /// # Errors
    /// As [`VllmClient::score`].
    pub fn score_as(
        &self,
        model: &str,
        prompt: &[u32],
        completion: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        self.score_salted(model, prompt, completion, self.cache_salt().as_deref())
    }

    /// As [`VllmClient::score_as`], the requests carrying `salt` as their `cache_salt` (a
    /// refresh scores the new version under that version's salt before the client takes it).
    pub(crate) fn score_salted(
        &self,
        model: &str,
        prompt: &[u32],
        completion: &[u32],
        salt: Option<&str>,
    ) -> Result<Vec<Vec<f32>>> {
        if prompt.is_empty() || completion.is_empty() {
            return Err(VllmError::Config(
                "scoring needs a non-empty prompt and completion".into(),
            ));
        }
        let ids: Vec<u32> = prompt.iter().chain(completion).copied().collect();
        self.servers
            .iter()
            .map(|s| {
                let all = server_logprobs(s, model, &ids, salt)?;
                Ok(all[prompt.len() - 1..].to_vec())
            })
            .collect()
    }

    /// Start-up checks on every server: `/health` answers; `/v1/models` lists
    /// `served_model_name` with a `max_model_len` ≥ `longest_prompt + room`, `room` being the
    /// most tokens a request may add after its prompt, named by the config key `room_key` in the
    /// error (`rollout.max_new_tokens`, or `env.max_episode_tokens` for multi-turn episodes,
    /// docs/DESIGN.md section 14); and the
    /// server's tokenizer agrees with `tokenizer` on one `/tokenize` request of a probe text that
    /// holds plain text, every EOS token and the highest token id's text — the same ids come back,
    /// so the vocabulary (up to its last id) and the EOS ids agree.
    ///
    /// # Errors
    /// [`VllmError::Check`] naming the server and the disagreement; request errors.
    pub fn check_servers(
        &self,
        tokenizer: &TokenizerBundle,
        longest_prompt: usize,
        room: usize,
        room_key: &str,
    ) -> Result<Vec<ServerInfo>> {
        let name = &self.config.served_model_name;
        let (probe, ours) = tokenizer_probe(tokenizer)?;
        let mut infos = Vec::new();
        for s in &self.servers {
            s.health()?;
            let models: Vec<(String, Option<u64>)> = s.call("GET", "/v1/models", None, |a| {
                let data = a["data"].as_array().ok_or("no `data` array")?;
                Ok(data
                    .iter()
                    .map(|m| {
                        (
                            m["id"].as_str().unwrap_or("").to_string(),
                            m["max_model_len"].as_u64(),
                        )
                    })
                    .collect())
            })?;
            let check = |msg: String| VllmError::Check {
                server: s.url.clone(),
                msg,
            };
            let Some((_, len)) = models.iter().find(|(id, _)| id == name) else {
                let ids: Vec<&str> = models.iter().map(|(id, _)| id.as_str()).collect();
                return Err(check(format!(
                    "serves {ids:?}, not rollout.served_model_name = {name:?} (start it with --served-model-name {name})"
                )));
            };
            let max_model_len =
                len.ok_or_else(|| check("/v1/models gives no max_model_len".into()))? as usize;
            if max_model_len < longest_prompt + room {
                return Err(check(format!(
                    "max_model_len {max_model_len} < longest prompt {longest_prompt} + {room_key} \
                     {room}: restart it with --max-model-len {}",
                    longest_prompt + room
                )));
            }
            let body = json!({"model": name, "prompt": probe, "add_special_tokens": false});
            let theirs: Vec<u32> = s.call("POST", "/tokenize", Some(&body), |a| {
                serde_json::from_value(a["tokens"].clone()).map_err(|e| format!("`tokens`: {e}"))
            })?;
            if theirs != ours {
                return Err(check(format!(
                    "its tokenizer disagrees with ours on {probe:?}: it gives {theirs:?}, we give {ours:?} \
                     (serve the policy's own tokenizer files)"
                )));
            }
            infos.push(ServerInfo {
                url: s.url.clone(),
                max_model_len,
            });
        }
        Ok(infos)
    }

    /// The log-prob-mode check: on every server, one completion of `prompt` (`tokens` tokens, no
    /// stop id, `ignore_eos`, no `min_tokens`) sampled at T = 0.7, top-p 1, top-k off by [`VllmClient::model_name`], whose behaviour log-probs are compared with
    /// the trainer's ([`trainer_logprobs`] at T = 0.7 on `model`, the weights the servers hold).
    /// Returns the mean |ℓ_vLLM − ℓ_trainer| per server.
    ///
    /// # Errors
    /// [`VllmError::Check`] when a mean gap exceeds [`LOGPROB_MODE_TOLERANCE`]: the server returns
    /// log-probs before temperature (vLLM's default) and must run with
    /// `--logprobs-mode processed_logprobs`. Request and model errors.
    pub fn check_logprob_mode(
        &self,
        model: &Model,
        prompt: &[u32],
        tokens: usize,
    ) -> Result<Vec<f64>> {
        let params = SamplingParams {
            group_size: 1,
            temperature: 0.7,
            max_new_tokens: tokens,
            // No `min_tokens`: the request's `ignore_eos` with no stop ids already runs it to
            // `tokens`, and vLLM's `min_tokens` masks the model's EOS id before the log-softmax
            // (renormalised log-probs), so a policy likely to end a turn failed this check.
            min_new_tokens: 0,
            ..Default::default()
        };
        let salt = self.cache_salt();
        let body =
            crate::completion::request_body(&self.model_name, prompt, &params, 7, salt.as_deref());
        let mut gaps = Vec::new();
        for s in &self.servers {
            let c = s.call_typed("POST", "/v1/completions", Some(&body), |a| {
                parse_group(a, 1, tokens).map(|mut v| v.remove(0))
            })?;
            let ours = trainer_logprobs(model, prompt, &c.token_ids, 0.7)?;
            let gap = c
                .logprobs
                .iter()
                .zip(&ours)
                .map(|(a, b)| (a - b).abs() as f64)
                .sum::<f64>()
                / ours.len().max(1) as f64;
            if gap > LOGPROB_MODE_TOLERANCE {
                return Err(VllmError::Check {
                    server: s.url.clone(),
                    msg: format!(
                        "its behaviour log-probs at T = 0.7 are {gap:.3} nats from the trainer's on average: \
                         it returns log-probs before temperature; restart it with \
                         `--logprobs-mode processed_logprobs`"
                    ),
                });
            }
            gaps.push(gap);
        }
        Ok(gaps)
    }
}
