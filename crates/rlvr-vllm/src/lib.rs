//! `rlvr-vllm`: rlvr's rollouts on vLLM OpenAI-compatible servers (DESIGN.md sections 3 and 12),
//! so that generation, most of an RL step, can run on machines other than the trainer's.
//!
//! - [`VllmClient`]: a blocking client for one or several servers serving the policy. Each group
//!   is one `/v1/completions` request (prompt as token ids, `n` = group size, `logprobs: 0`,
//!   `return_token_ids`); groups run concurrently over the servers. The result is the native
//!   engine's record, [`rlvr_rollout::Completion`]: ids (a generated stop id kept), one behaviour
//!   log-prob per id, finish reason, policy version. A request that fails (down, slow, 5xx,
//!   malformed) is retried with back-off, then the call fails naming the server and its answer.
//! - [`checks`]: start-up checks (health, served name and context length, tokenizer agreement)
//!   and the log-prob-mode check (`--logprobs-mode processed_logprobs`).
//! - [`layout`]: how a refresh names the weights for the architecture the servers were started
//!   on ([`ServedLayout`]: a causal LM's own names, or the multimodal Gemma 3 wrapper's).
//! - [`refresh`]: the policy written as a checkpoint per version and reloaded on every server,
//!   verified by scoring a fixed sequence ([`fingerprint`]).
//! - [`lora`]: with LoRA, each version's adapter written in PEFT's format and loaded by name
//!   (`/v1/load_lora_adapter`), requests naming it, older versions unloaded.
//! - [`lease`]: one run per server: a lease per server URL (a `flock`ed file naming the holding
//!   run and its version) and, after every sampling call, the weights' fingerprint checked again.
//! - [`VllmRollout`]: all of the above behind `rlvr_rollout::Rollout`, the explorer's boundary
//!   (`rollout.backend = "vllm"` in rlvr-train).
//!
//! Servers must run with `--logprobs-mode processed_logprobs` (behaviour log-probs after
//! temperature) and, for refreshes, `VLLM_SERVER_DEV_MODE=1`: see `scripts/vllm_server.sh` and
//! this crate's README.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod checks;
pub mod client;
pub mod completion;
pub mod error;
pub mod fingerprint;
pub mod http;
pub mod layout;
pub mod lease;
pub mod lora;
pub mod refresh;
pub mod rollout;

pub use checks::{trainer_logprobs, ServerInfo};
pub use client::{adapter_name, ClientConfig, VllmClient};
pub use error::{Result, VllmError};
pub use fingerprint::RefreshCheck;
pub use http::{RetryPolicy, Server};
pub use lease::{LeaseHolder, ServerLease};
pub use lora::{write_adapter, LORA_SERVER_FLAGS};
pub use refresh::{
    prune_versions, version_dir, write_weights, write_weights_as, RefreshTimings, ServedLayout,
};
pub use rollout::{VllmRollout, VllmRolloutConfig};
