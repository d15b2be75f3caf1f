//! Deterministic shuffling and epochs, with a cursor that checkpoints save and restore.
//!
//! Epoch `e` visits the prompts in a Fisher–Yates permutation drawn from the [`SplitMix64`] stream
//! `(seed, e)`: the order depends only on (seed, epoch, number of prompts), never on the batch size or
//! on when the run was resumed. A batch that runs past the end of an epoch continues with the next
//! epoch's order, so every batch holds exactly B prompts and every prompt is seen once per epoch.

use crate::generate::SplitMix64;
use crate::{DataError, Result};
use serde::{Deserialize, Serialize};

/// Where the sampler stands: saved in `trainer_state/` and restored on resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataCursor {
    /// The shuffling seed (`data.seed`).
    pub seed: u64,
    /// How many prompts there are (a resume with a different dataset is refused).
    pub len: usize,
    /// The current epoch, from 0.
    pub epoch: u64,
    /// Prompts of the current epoch already handed out.
    pub position: usize,
}

/// Hands out batches of prompt indices in a seeded order, epoch after epoch.
#[derive(Debug, Clone)]
pub struct PromptSampler {
    cursor: DataCursor,
    order: Vec<usize>,
}

/// The permutation of `0..len` used in `epoch`.
pub fn epoch_order(seed: u64, epoch: u64, len: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    let mut rng = SplitMix64::stream(seed, 0xE90C, epoch);
    for i in (1..len).rev() {
        let j = rng.below(i + 1);
        order.swap(i, j);
    }
    order
}

impl PromptSampler {
    /// A sampler at the start of epoch 0.
    ///
    /// # Errors
    /// [`DataError::Config`] when `len` is 0 (nothing to train on).
    pub fn new(len: usize, seed: u64) -> Result<Self> {
        Self::from_cursor(DataCursor {
            seed,
            len,
            epoch: 0,
            position: 0,
        })
    }

    /// A sampler resumed from a saved cursor.
    ///
    /// # Errors
    /// [`DataError::Config`] when the cursor is empty; [`DataError::Cursor`] when its position
    /// is past its length.
    pub fn from_cursor(cursor: DataCursor) -> Result<Self> {
        if cursor.len == 0 {
            return Err(DataError::Config(
                "the dataset has no prompts (check data.train and data.max_prompt_len)".into(),
            ));
        }
        if cursor.position > cursor.len {
            return Err(DataError::Cursor(format!(
                "stands at position {} of an epoch of {} prompts, past its end",
                cursor.position, cursor.len
            )));
        }
        Ok(PromptSampler {
            order: epoch_order(cursor.seed, cursor.epoch, cursor.len),
            cursor,
        })
    }

    /// Resumes from `cursor`, checking that it was saved for a dataset of `len` prompts.
    ///
    /// # Errors
    /// [`DataError::Cursor`] when the lengths differ (the data changed since the checkpoint) or
    /// the position is past the end.
    pub fn resume(cursor: DataCursor, len: usize) -> Result<Self> {
        if cursor.len != len {
            return Err(DataError::Cursor(format!(
                "is for {} prompts but the dataset now has {len}; resume with the same data and max_prompt_len",
                cursor.len
            )));
        }
        Self::from_cursor(cursor)
    }

    /// The cursor to save.
    pub fn cursor(&self) -> DataCursor {
        self.cursor
    }

    /// The next `b` prompt indices (crossing into the next epoch when needed).
    pub fn next_batch(&mut self, b: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(b);
        while out.len() < b {
            if self.cursor.position == self.cursor.len {
                self.cursor.epoch += 1;
                self.cursor.position = 0;
                self.order = epoch_order(self.cursor.seed, self.cursor.epoch, self.cursor.len);
            }
            out.push(self.order[self.cursor.position]);
            self.cursor.position += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_permutations_and_resume_matches() {
        let mut s = PromptSampler::new(10, 3).unwrap();
        let mut seen: Vec<usize> = (0..5).flat_map(|_| s.next_batch(2)).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        let mut a = PromptSampler::new(10, 3).unwrap();
        a.next_batch(7);
        let saved = serde_json::to_string(&a.cursor()).unwrap();
        let mut b = PromptSampler::resume(serde_json::from_str(&saved).unwrap(), 10).unwrap();
        assert_eq!(a.next_batch(25), b.next_batch(25));
        assert_ne!(epoch_order(3, 0, 10), epoch_order(3, 1, 10));
        assert!(PromptSampler::resume(a.cursor(), 11).is_err());
    }
}
