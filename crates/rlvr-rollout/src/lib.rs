//! `rlvr-rollout`: the sampling engine of rlvr (the explorer's side of DESIGN.md section 3).
//!
//! - [`engine`]: [`Sampler`] turns B prompts × group size K into B·K [`Completion`]s, each with
//!   its token ids, behaviour log-probs ℓ_old (DESIGN.md section 3), finish reason and policy
//!   version. One prefill per prompt shared by its group, a preallocated KV cache, finished rows
//!   compacted away, randomness seeded per (seed, prompt index, sample index).
//! - [`decode`]: the preallocated in-place KV cache the model's forward writes through, and the
//!   last-position logits of a step (same as `rlvr_model::Model::forward_cached`'s).
//! - [`select`]: greedy / temperature / top-k / top-p selection by partial selection, no sort
//!   (the host path: the logits copied to the host; used on the CPU).
//! - [`device_select`]: greedy and plain sampling with the logits left on the device (GPU):
//!   block sums and one block per row cross to the host instead of `[rows, V]` logits.
//! - [`backend`]: the [`Rollout`] boundary the explorer, evaluation and `rlvr generate` sample
//!   through, and [`NativeRollout`], the engine above behind it.
//! - [`cli`]: `rlvr generate` (DESIGN.md section 10).
//!
//! ```
//! use candle_core::{DType, Device};
//! use rlvr_model::{Model, ModelConfig};
//! use rlvr_rollout::{Sampler, SamplingParams};
//!
//! let config = ModelConfig::from_json(
//!     &serde_json::json!({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 16,
//!         "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
//!         "num_key_value_heads": 1, "max_position_embeddings": 64}),
//!     "inline".as_ref(),
//! ).unwrap();
//! let model = Model::random(config, 0.02, 0, DType::F32, &Device::Cpu).unwrap();
//! let sampler = Sampler::new(&model, 0);
//! let params = SamplingParams { group_size: 4, max_new_tokens: 8, ..Default::default() };
//! let out = sampler.sample(&[vec![1, 2, 3], vec![4, 5]], 0, &params, 42).unwrap();
//! assert_eq!(out.len(), 8);
//! assert!(out.iter().all(|c| c.token_ids.len() == c.behaviour_logprobs.len()));
//! ```
//!
//! A custom backend implements [`Rollout`]; this one answers every prompt with its first token
//! (a stand-in for a remote server's answer):
//!
//! ```
//! use candle_core::Tensor;
//! use rlvr_rollout::{
//!     Completion, FinishReason, GroupResult, PromptIds, Result, Rollout, SamplingParams,
//! };
//!
//! struct Echo {
//!     version: u64,
//! }
//!
//! impl Rollout for Echo {
//!     fn version(&self) -> u64 {
//!         self.version
//!     }
//!     fn load_weights(&mut self, version: u64, _weights: &[(String, Tensor)]) -> Result<()> {
//!         self.version = version; // a server would reload its checkpoint here
//!         Ok(())
//!     }
//!     fn sample(
//!         &mut self,
//!         prompts: &[PromptIds],
//!         first_index: usize,
//!         params: &SamplingParams,
//!         _seed: u64,
//!     ) -> Result<Vec<GroupResult>> {
//!         let group = |(i, p): (usize, &PromptIds)| -> GroupResult {
//!             Ok((0..params.group_size)
//!                 .map(|j| Completion {
//!                     prompt_index: first_index + i,
//!                     sample_index: j,
//!                     token_ids: vec![p[0]],
//!                     behaviour_logprobs: vec![0.0],
//!                     finish_reason: FinishReason::Length,
//!                     version: self.version,
//!                 })
//!                 .collect())
//!         };
//!         Ok(prompts.iter().enumerate().map(group).collect())
//!     }
//! }
//!
//! let mut echo = Echo { version: 0 };
//! echo.load_weights(3, &[]).unwrap();
//! let params = SamplingParams { group_size: 2, ..Default::default() };
//! let groups = echo.sample(&[vec![7, 8], vec![9]], 5, &params, 0).unwrap();
//! let g1 = groups[1].as_ref().unwrap();
//! assert_eq!((g1[0].prompt_index, g1[1].sample_index, g1[0].token_ids[0]), (6, 1, 9));
//! assert_eq!(g1[0].version, 3);
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod backend;
pub mod cli;
pub mod decode;
pub mod device_select;
pub mod engine;
pub mod error;
pub mod fused;
#[cfg(feature = "cuda")]
mod fused_cuda;
pub mod params;
pub mod select;

pub use backend::{flatten, named_tensors, GroupResult, NativeRollout, Rollout};
pub use decode::{DecodePath, KvBuffer};
pub use engine::{
    completion_rng, turn_rng, Completion, DecodeTimings, Detokenize, FinishReason, PromptIds,
    Sampler, SamplingParams, TurnCache, TurnCacheStats, TurnRow, DEFAULT_TURN_CACHE_BYTES,
    FUSED_MIN_BUCKET_ROWS,
};
pub use error::{Result, RolloutError};
pub use rlvr_kernels::graph::CaptureBlock;

#[cfg(test)]
mod parity_tests;
