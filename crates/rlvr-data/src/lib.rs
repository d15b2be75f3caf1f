//! Datasets and tasks for RLVR (no tensor library).
//!
//! - [`config::DataConfig`]: the `[data]` config table (task, files, field names, template, B, seed).
//! - [`read`]: JSONL (split on `\n` only) and Parquet records, fields by name or dotted path
//!   (verl's `reward_model.ground_truth`), a question as text or chat messages (TRL's and verl's
//!   conversational `prompt`); errors name file, line and field.
//! - [`dataset`]: problems of the tasks `gsm8k`, `math500`, `countdown`, `arithmetic` and `jsonl`
//!   (a custom file naming its verifier), rendered into prompts with `max_prompt_len` filtering.
//! - [`template`]: plain or chat prompts (the chat template is a caller-supplied renderer), optional
//!   system prompt and few-shot examples.
//! - [`generate`]: seeded countdown and arithmetic generators with difficulty knobs.
//! - [`sampler`]: deterministic shuffling and epochs with a resumable [`sampler::DataCursor`].
//!
//! ```
//! use rlvr_data::{config::{DataConfig, TaskKind}, dataset, generate::Split, sampler::PromptSampler,
//!     template::PromptBuilder};
//! let cfg = DataConfig { task: TaskKind::Arithmetic, ..DataConfig::default() };
//! let train = dataset::load_split(&cfg, Split::Train).unwrap();
//! let prompts = dataset::build_prompts(&train, &PromptBuilder::from_config(&cfg), None, None, None).unwrap();
//! let mut sampler = PromptSampler::new(prompts.prompts.len(), cfg.seed).unwrap();
//! let batch = sampler.next_batch(cfg.prompts_per_step);
//! let p = &train.problems[prompts.prompts[batch[0]].problem];
//! assert!(p.question().ends_with('=') && !p.reference.is_empty());
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod config;
pub mod dataset;
pub mod error;
pub mod generate;
pub mod placeholders;
pub mod read;
pub mod sampler;
pub mod template;

pub use error::{DataError, Result};
pub use template::ChatMessage;
