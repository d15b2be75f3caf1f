//! The offline feed: the experiences of a file in place of the explorer, B whole groups per
//! step in file order, wrapping around at the end.

use std::path::PathBuf;
use std::time::Instant;

use rlvr_model::TokenizerBundle;

use super::explorer::Batch;
use crate::store::checkpoint::SourceCursor;
use crate::store::experience::{Experience, ExperienceError};
use crate::store::rollouts::RolloutRecord;

/// The offline source: batches of B whole groups in file order, wrapping around at the end.
pub struct OfflineSource {
    groups: Vec<Vec<Experience>>,
    /// Each row's line in `file`, in the shape of `groups`.
    lines: Vec<Vec<usize>>,
    file: PathBuf,
    consumed: u64,
    prompts_per_step: usize,
    decode: Option<TokenizerBundle>,
    log_rollouts: usize,
}

impl OfflineSource {
    /// A source over the rows of `file` with their line numbers
    /// ([`crate::store::experience::read_experience_lines`]; consecutive rows of one group id form
    /// a group) having consumed `consumed` groups.
    ///
    /// # Errors
    /// An empty file.
    pub fn new(
        rows: Vec<(usize, Experience)>,
        file: PathBuf,
        consumed: u64,
        prompts_per_step: usize,
        decode: Option<TokenizerBundle>,
        log_rollouts: usize,
    ) -> anyhow::Result<Self> {
        let mut groups: Vec<Vec<Experience>> = Vec::new();
        let mut lines: Vec<Vec<usize>> = Vec::new();
        for (line, e) in rows {
            let last =
                (groups.len().checked_sub(1)).filter(|&i| groups[i][0].group_id == e.group_id);
            match last {
                Some(i) => {
                    groups[i].push(e);
                    lines[i].push(line);
                }
                None => {
                    groups.push(vec![e]);
                    lines.push(vec![line]);
                }
            }
        }
        anyhow::ensure!(
            !groups.is_empty(),
            "the experiences file holds no experience"
        );
        Ok(OfflineSource {
            groups,
            lines,
            file,
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

    /// The next B groups, for trainer step `step` (1-based).
    ///
    /// # Errors
    /// A row whose `version` is `step` or more: it claims weights this run has not made yet (at
    /// step t the trainer holds version t − 1), named by file, line and field.
    pub fn produce(&mut self, step: u64) -> anyhow::Result<Batch> {
        let t0 = Instant::now();
        let n = self.groups.len() as u64;
        let mut experiences = Vec::new();
        for _ in 0..self.prompts_per_step {
            let g = (self.consumed % n) as usize;
            for (e, &line) in self.groups[g].iter().zip(&self.lines[g]) {
                if let Some(v) = e.version.filter(|&v| v >= step) {
                    return Err(ExperienceError {
                        file: self.file.clone(),
                        line,
                        field: "version".into(),
                        why: format!(
                            "{v} is from the future: step {step} trains the policy of version {} \
                             (a completion sampled by version v is trained at step v + 1 or later)",
                            step.saturating_sub(1)
                        ),
                    }
                    .into());
                }
            }
            experiences.extend(self.groups[g].iter().cloned());
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
                    turns: e.turns,
                    turn_rewards: e.turns.map(|_| e.turn_rewards.clone()),
                    metrics: e.env_metrics.clone(),
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
            env: None,
            env_check: None,
        })
    }
}
