//! The offline feed: the experiences of a file in place of the explorer, B whole groups per
//! step in file order, wrapping around at the end.

use std::time::Instant;

use rlvr_model::TokenizerBundle;

use super::explorer::Batch;
use crate::store::checkpoint::SourceCursor;
use crate::store::experience::Experience;
use crate::store::rollouts::RolloutRecord;

/// The offline source: batches of B whole groups in file order, wrapping around at the end.
pub struct OfflineSource {
    groups: Vec<Vec<Experience>>,
    consumed: u64,
    prompts_per_step: usize,
    decode: Option<TokenizerBundle>,
    log_rollouts: usize,
}

impl OfflineSource {
    /// A source over `groups` (see [`crate::store::experience::groups_in_order`]) having consumed `consumed`.
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
            score_s: None,
            cursor: SourceCursor::Offline {
                groups: self.consumed,
            },
            rollouts,
            dropped_groups: 0,
            short_groups: 0,
        })
    }
}
