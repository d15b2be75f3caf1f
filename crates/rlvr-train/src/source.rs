//! The prompt source stage: where the prompts of a step come from (the `[data]` split rendered
//! with the policy's tokenizer, drawn by `rlvr_data`'s seeded prompt sampler inside the explorer),
//! or, offline, the experiences of a file in place of the explorer; and the cursor a checkpoint
//! saves for either.

use std::time::Instant;

use rlvr_data::dataset::prepare_split;
use rlvr_data::generate::Split;
use rlvr_data::sampler::DataCursor;
use rlvr_data::ChatMessage;
use rlvr_model::{Message, TokenizerBundle};
use serde::{Deserialize, Serialize};

use crate::experience::Experience;
use crate::explorer::{Batch, RolloutRecord};

/// Where the experience source stands: saved in checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum SourceCursor {
    /// Online: the prompt sampler's cursor.
    Online {
        /// The data cursor.
        cursor: DataCursor,
    },
    /// Offline: groups of the experiences file consumed so far (wrapping around at the end).
    Offline {
        /// Groups consumed.
        groups: u64,
    },
}

/// A train or test split as prompt texts and verifier references.
pub struct PreparedPrompts {
    /// Rendered prompt texts.
    pub texts: Vec<String>,
    /// Reference of each prompt.
    pub references: Vec<String>,
}

/// Loads and renders a split of `[data]` with the policy tokenizer (chat template, token counter).
///
/// # Errors
/// Data errors (files, templates, all prompts filtered).
pub fn prepare_prompts(
    cfg: &rlvr_data::config::DataConfig,
    split: Split,
    tok: &TokenizerBundle,
) -> anyhow::Result<PreparedPrompts> {
    let render = |msgs: &[ChatMessage], gen: bool| -> anyhow::Result<String> {
        let m: Vec<Message> = msgs
            .iter()
            .map(|m| Message::new(&m.role, &m.content))
            .collect();
        Ok(tok.apply_chat_template(&m, gen)?)
    };
    let count = |t: &str| -> anyhow::Result<usize> { Ok(tok.encode(t, true)?.len()) };
    let prep = prepare_split(cfg, split, Some(&render), Some(&count))
        .map_err(|e| anyhow::anyhow!("[data] {split:?} split: {e}"))?;
    // No prompt longer than the model's positions (limits.rs).
    crate::limits::check_prompts(&prep, tok, &count)
        .map_err(|e| anyhow::anyhow!("[data] {split:?} split: {e:#}"))?;
    if prep.prompts.dropped > 0 {
        crate::rundir::say(&format!(
            "note: {} {split:?} prompts longer than data.max_prompt_len were dropped",
            prep.prompts.dropped
        ));
    }
    Ok(PreparedPrompts {
        references: prep
            .prompts
            .prompts
            .iter()
            .map(|p| prep.dataset.problems[p.problem].reference.clone())
            .collect(),
        texts: prep.prompts.prompts.into_iter().map(|p| p.text).collect(),
    })
}

/// The offline source: batches of B whole groups in file order, wrapping around at the end.
pub struct OfflineSource {
    groups: Vec<Vec<Experience>>,
    consumed: u64,
    prompts_per_step: usize,
    decode: Option<TokenizerBundle>,
    log_rollouts: usize,
}

impl OfflineSource {
    /// A source over `groups` (see [`crate::experience::groups_in_order`]) having consumed `consumed`.
    ///
    /// # Errors
    /// An empty file.
    pub fn new(
        groups: Vec<Vec<Experience>>,
        consumed: u64,
        prompts_per_step: usize,
        decode: Option<TokenizerBundle>,
        log_rollouts: usize,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !groups.is_empty(),
            "the experiences file holds no experience"
        );
        Ok(OfflineSource {
            groups,
            consumed,
            prompts_per_step,
            decode,
            log_rollouts,
        })
    }

    /// The source cursor (groups consumed).
    pub fn cursor(&self) -> SourceCursor {
        SourceCursor::Offline {
            groups: self.consumed,
        }
    }

    /// The next B groups.
    pub fn produce(&mut self, step: u64) -> anyhow::Result<Batch> {
        let t0 = Instant::now();
        let n = self.groups.len() as u64;
        let mut experiences = Vec::new();
        for _ in 0..self.prompts_per_step {
            experiences.extend(self.groups[(self.consumed % n) as usize].iter().cloned());
            self.consumed += 1;
        }
        let mut rollouts = Vec::new();
        if let Some(tok) = &self.decode {
            for e in experiences.iter().take(self.log_rollouts) {
                rollouts.push(RolloutRecord {
                    group_id: e.group_id.clone(),
                    prompt: tok.decode(&e.prompt_ids, false).unwrap_or_default(),
                    completion: tok.decode(&e.completion_ids, false).unwrap_or_default(),
                    reward: e.reward,
                    correct: e.is_correct(),
                    version: e.version,
                    finish_reason: if e.truncated { "length" } else { "eos" }.into(),
                });
            }
        }
        Ok(Batch {
            step,
            experiences,
            sample_s: t0.elapsed().as_secs_f64(),
            cursor: SourceCursor::Offline {
                groups: self.consumed,
            },
            rollouts,
            dropped_groups: 0,
            short_groups: 0,
        })
    }
}
