//! The sampler's inputs and outputs: [`SamplingParams`] (`rollout.*` in the config), one
//! [`Completion`] per sample with its [`FinishReason`], and [`Detokenize`] for stop strings.

use crate::error::{Result, RolloutError};
use crate::select::Selection;

/// The token ids of one prompt (already rendered and encoded).
pub type PromptIds = Vec<u32>;

/// Sampling parameters of one [`crate::Sampler::sample`] call (`rollout.*` in the config).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Group size K: completions per prompt (≥ 1). Default 1.
    pub group_size: usize,
    /// Softmax temperature T (≥ 0); 0 = greedy (argmax, first maximum on ties). Default 1.
    pub temperature: f64,
    /// Nucleus mass in (0, 1]; 1 = off. Measured after top-k. Default 1.
    pub top_p: f64,
    /// Keep only the k most likely tokens; `None` (or 0) = off. Default off.
    pub top_k: Option<usize>,
    /// Most tokens generated per completion (≥ 1), a generated stop id included. Default 256.
    pub max_new_tokens: usize,
    /// Fewest new tokens before a completion may end: until a row has this many tokens its stop
    /// ids are never drawn (their probability is removed before top-k/top-p, as transformers'
    /// `min_new_tokens` and vLLM's `min_tokens`) and stop strings are not checked. Behaviour
    /// log-probs stay those of the full distribution (see [`crate::select::choose`]).
    /// `min_new_tokens = max_new_tokens` gives fixed-length completions (benchmarks). Default 0.
    pub min_new_tokens: usize,
    /// Token ids that end a completion (the tokenizer's EOS ids plus any extra stop ids). The
    /// generated stop id is kept in the completion. Default empty.
    pub stop_ids: Vec<u32>,
    /// Strings that end a completion when its decoded text contains one (checked after every
    /// token on a window of the last tokens; needs [`crate::Sampler::with_tokenizer`]). The token that
    /// completes the string is kept, and nothing after it is generated. Default empty.
    pub stop_strings: Vec<String>,
    /// Most rows (sequences) decoded together; groups are never split across waves unless
    /// K alone exceeds it. Bounds KV-cache memory: rows × (prompt + max_new_tokens) columns.
    /// Default 64.
    pub max_batch_rows: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            group_size: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            max_new_tokens: 256,
            min_new_tokens: 0,
            stop_ids: Vec::new(),
            stop_strings: Vec::new(),
            max_batch_rows: 64,
        }
    }
}

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// It generated one of `stop_ids` (kept as its last token).
    Eos,
    /// Its text came to contain one of `stop_strings`.
    StopString,
    /// It reached `max_new_tokens` (truncated).
    Length,
}

impl FinishReason {
    /// The value written in `finish_reason` fields (DESIGN.md section 10 allows "eos" | "length").
    ///
    /// A stop string maps to "eos": the completion ended on its own terms and is not truncated,
    /// which is what consumers of the field act on (e.g. DAPO's overlong shaping treats only
    /// "length" as truncated). Library callers that need the difference match on the enum.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos | FinishReason::StopString => "eos",
            FinishReason::Length => "length",
        }
    }
}

/// One sampled completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Global prompt index: `first_prompt_index` + position of the prompt in the slice.
    pub prompt_index: usize,
    /// Index of this completion in its group, `0..K`.
    pub sample_index: usize,
    /// Generated token ids, a generated stop id included; never padded.
    pub token_ids: Vec<u32>,
    /// One behaviour log-prob ℓ_old per token of `token_ids` (nats, f32):
    /// `log_softmax(logits / T)` over the full vocabulary at the sampled token, recorded at
    /// sampling time (DESIGN.md section 3). With top-p/top-k the token was drawn from a truncated
    /// distribution, so these are the untruncated policy's log-probs and even "on-policy" data is
    /// slightly off-policy. Greedy (T = 0) records T = 1 log-probs.
    pub behaviour_logprobs: Vec<f32>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Policy version of the weights that sampled it (the sampler's [`crate::Sampler::version`]).
    pub version: u64,
}

/// Something that turns token ids back into text, for stop strings.
pub trait Detokenize: Send + Sync {
    /// Decodes `ids` (special tokens kept).
    fn detokenize(&self, ids: &[u32]) -> std::result::Result<String, String>;
}

impl Detokenize for tokenizers::Tokenizer {
    fn detokenize(&self, ids: &[u32]) -> std::result::Result<String, String> {
        self.decode(ids, false).map_err(|e| e.to_string())
    }
}

/// The most completions per prompt one sampling call accepts (`group_size`, `rlvr generate -n`):
/// GRPO uses 8 to 64; far beyond it the row buffers of one group exhaust memory.
pub const MAX_GROUP_SIZE: usize = 4096;

/// The most new tokens of one completion accepted before a model is loaded (2^24, beyond every
/// model's context; once it is, prompt + new tokens must also fit its `max_position_embeddings`).
pub const MAX_NEW_TOKENS: usize = 1 << 24;

/// The highest sampling temperature: at 1000 every logit of a real model is within a few
/// hundredths of the others, so sampling is already uniform.
pub const MAX_TEMPERATURE: f64 = 1000.0;

fn invalid(name: &'static str, value: impl std::fmt::Debug, hint: &'static str) -> RolloutError {
    RolloutError::InvalidParam {
        name,
        value: format!("{value:?}"),
        hint,
    }
}

impl SamplingParams {
    /// Checks every field's range.
    ///
    /// Errors: [`RolloutError::InvalidParam`] naming the field and the accepted range.
    pub fn validate(&self) -> Result<()> {
        if self.group_size == 0 {
            return Err(invalid(
                "group_size",
                self.group_size,
                "K must be at least 1",
            ));
        }
        if self.group_size > MAX_GROUP_SIZE {
            return Err(invalid(
                "group_size",
                self.group_size,
                "K must be at most 4096 (MAX_GROUP_SIZE)",
            ));
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(invalid(
                "temperature",
                self.temperature,
                "use a finite T >= 0 (0 = greedy)",
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(invalid("top_p", self.top_p, "use 0 < top_p <= 1 (1 = off)"));
        }
        if self.max_new_tokens == 0 {
            return Err(invalid(
                "max_new_tokens",
                self.max_new_tokens,
                "use at least 1",
            ));
        }
        if self.max_batch_rows == 0 {
            return Err(invalid(
                "max_batch_rows",
                self.max_batch_rows,
                "use at least 1",
            ));
        }
        if self.stop_strings.iter().any(String::is_empty) {
            return Err(invalid(
                "stop_strings",
                &self.stop_strings,
                "stop strings must not be empty",
            ));
        }
        Ok(())
    }

    pub(crate) fn selection(&self) -> Selection {
        Selection {
            temperature: self.temperature,
            top_k: self.top_k.filter(|&k| k > 0),
            top_p: self.top_p,
        }
    }
}
