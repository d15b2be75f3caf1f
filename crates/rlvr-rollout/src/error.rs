//! Errors of the rollout engine. Each variant carries the offending value and says what to fix.

/// Errors from [`crate::Sampler::sample`] and the decode forward.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// A sampling parameter is out of range (e.g. `top_p` outside (0, 1], `group_size` 0).
    #[error("invalid sampling parameter `{name}` = {value}: {hint}")]
    InvalidParam {
        /// The parameter's name, as in [`crate::SamplingParams`].
        name: &'static str,
        /// The value given, formatted.
        value: String,
        /// What is accepted.
        hint: &'static str,
    },
    /// A prompt is empty or holds a token id outside the model's vocabulary.
    #[error("prompt {prompt_index}: {msg}")]
    InvalidPrompt {
        /// Global index of the prompt (`first_prompt_index` + position in the slice).
        prompt_index: usize,
        /// What is wrong with it.
        msg: String,
    },
    /// Stop strings were given but the sampler has no tokenizer to decode completions with.
    #[error("stop strings need a tokenizer: call `Sampler::with_tokenizer` first")]
    NoTokenizer,
    /// Decoding generated ids to text (for stop strings) failed.
    #[error("tokenizer error while checking stop strings: {0}")]
    Tokenizer(String),
    /// The model's logits were not finite (NaN or ±∞) where a token was chosen: the weights hold a
    /// non-finite value, or an activation overflowed (f16/bf16).
    #[error(
        "non-finite logits while sampling completion {sample_index} of prompt {prompt_index} at \
         generated token {position} (log-prob of the chosen token: {logprob}): the model's weights \
         or activations are not finite (check the checkpoint for NaN/inf, or use model.dtype = \"f32\")"
    )]
    NonFinite {
        /// Draw index of the prompt.
        prompt_index: usize,
        /// Which of its K completions.
        sample_index: usize,
        /// 0-based position in the completion.
        position: usize,
        /// The chosen token's log-prob (NaN or −∞).
        logprob: f32,
    },
    /// A remote backend failed (a vLLM server down or answering wrongly, a failed weight refresh):
    /// the backend's own error, which names the server and what it answered.
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
    /// An error from the model crate (weights, shapes).
    #[error(transparent)]
    Model(#[from] rlvr_model::ModelError),
    /// An error from the tensor library.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias of the rollout crate.
pub type Result<T> = std::result::Result<T, RolloutError>;
