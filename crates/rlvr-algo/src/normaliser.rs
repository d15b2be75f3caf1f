//! The loss normaliser, fixed once per optimizer update (DESIGN.md section 4).
//!
//! Every aggregation mode is a weighted sum of per-token terms with one weight per *sequence*:
//!
//! ```text
//! loss = Σ_i w_i · Σ_t m_it · L_it
//! token-mean           w_i = 1 / Σ_j n_j                 (n_j = completion tokens of row j)
//! seq-mean-token-mean  w_i = 1 / (N · n_i)               (N = rows in the normaliser)
//! seq-mean-token-sum   w_i = 1 / N
//! constant             w_i = 1 / (B·K · max_new_tokens)  (Dr.GRPO: the fixed budget, not the longest row)
//! ```
//!
//! For `constant`, B·K counts **every** row of the update, those that leave the normaliser included:
//! the denominator is then a constant of the config (Dr.GRPO, arXiv 2503.20783, divides each
//! sequence's token sum by the generation budget and averages over the whole batch), not a count
//! that shrinks when zero-variance groups or null rewards are excluded.
//!
//! with w_i = 0 for rows that leave the normaliser (null rewards, RED-Drop drops, zero-variance groups
//! when excluded, truncated completions under `overlong = "mask"`), and the sums taken over the
//! **whole update batch**. Because the loss is linear in the rows once the w_i are fixed, the loss of a
//! micro-batch is Σ over its rows only, and the micro-batch losses (and gradients) sum exactly to the
//! full-batch ones, whatever the split, gradient accumulation or (later) data-parallel sharding.
//!
//! Usage: build one [`UpdateNormaliser`] from all rows of the update, then pass
//! [`UpdateNormaliser::rows`] of each micro-batch's row indices to [`crate::policy_loss`] and
//! `backward()` each micro-batch loss as it is: no further division by the number of micro-batches.

use crate::config::{Aggregation, Algorithm, OverlongRule};
use crate::error::{AlgoError, Result};

/// What the normaliser needs to know of one row (completion) of the update batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowInfo {
    /// Completion tokens of the row (Σ_t m_it of its completion mask; the EOS it generated included).
    pub completion_tokens: usize,
    /// Whether the completion was truncated (hit `rollout.max_new_tokens` without EOS).
    pub truncated: bool,
    /// Whether the advantage step kept the row ([`crate::Advantages::in_normaliser`]).
    pub in_normaliser: bool,
}

impl RowInfo {
    /// One [`RowInfo`] per row from the update's completion mask `[N, T]` (token counts = row sums, so
    /// they cannot disagree with the mask the loss sees), truncation flags `[N]` and
    /// [`crate::Advantages::in_normaliser`] `[N]`.
    ///
    /// # Errors
    /// [`AlgoError::Shape`] when the lengths disagree with the mask's N; candle errors.
    pub fn from_mask(
        mask: &candle_core::Tensor,
        truncated: &[bool],
        in_normaliser: &[bool],
    ) -> Result<Vec<RowInfo>> {
        let (n, _) = mask.dims2()?;
        for (what, len) in [
            ("truncated", truncated.len()),
            ("in_normaliser", in_normaliser.len()),
        ] {
            if len != n {
                return Err(AlgoError::Shape {
                    op: "RowInfo::from_mask",
                    what,
                    got: vec![len],
                    expected: vec![n],
                });
            }
        }
        let counts = mask
            .to_dtype(candle_core::DType::F64)?
            .sum(1)?
            .to_vec1::<f64>()?;
        Ok(counts
            .iter()
            .zip(truncated.iter().zip(in_normaliser))
            .map(|(&c, (&truncated, &in_normaliser))| RowInfo {
                completion_tokens: c.round() as usize,
                truncated,
                in_normaliser,
            })
            .collect())
    }
}

/// Per-row weights of one optimizer update. Cheap to clone; hold one per update.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateNormaliser {
    weights: Vec<f64>,
    denominator: f64,
    tokens_total: usize,
    tokens_trained: usize,
}

impl UpdateNormaliser {
    /// Builds the normaliser over **every** row of one optimizer update (before micro-batching).
    ///
    /// `max_new_tokens` is `rollout.max_new_tokens` (used by `constant` only). A row leaves the
    /// normaliser when `!in_normaliser`, when it has no completion tokens, or when it is truncated and
    /// `alg.overlong` is `mask`. If no row is left, every weight is 0 (the loss is 0).
    ///
    /// # Errors
    /// [`AlgoError::InvalidConfig`] for `constant` with `max_new_tokens == 0`.
    pub fn new(alg: &Algorithm, rows: &[RowInfo], max_new_tokens: usize) -> Result<Self> {
        if alg.aggregation == Aggregation::Constant && max_new_tokens == 0 {
            return Err(AlgoError::InvalidConfig {
                key: "aggregation",
                value: "\"constant\"".into(),
                why: "the constant normaliser needs rollout.max_new_tokens > 0".into(),
            });
        }
        let live = |r: &RowInfo| {
            r.in_normaliser
                && r.completion_tokens > 0
                && !(r.truncated && alg.overlong == OverlongRule::Mask)
        };
        let n_rows = rows.iter().filter(|r| live(r)).count();
        let tokens_trained: usize = rows
            .iter()
            .filter(|r| live(r))
            .map(|r| r.completion_tokens)
            .sum();
        let tokens_total: usize = rows.iter().map(|r| r.completion_tokens).sum();
        // DESIGN.md section 4: token-mean (DAPO, arXiv 2503.14476), per-sequence means (GRPO, arXiv
        // 2402.03300 Eq. 3), constant B·L (Dr.GRPO, arXiv 2503.20783), all fixed per update.
        let denominator = match alg.aggregation {
            Aggregation::TokenMean => tokens_trained as f64,
            Aggregation::SeqMeanTokenMean | Aggregation::SeqMeanTokenSum => n_rows as f64,
            Aggregation::Constant => (rows.len() * max_new_tokens) as f64,
        };
        let weights = rows
            .iter()
            .map(|r| {
                if !live(r) || denominator == 0.0 {
                    0.0
                } else if alg.aggregation == Aggregation::SeqMeanTokenMean {
                    1.0 / (denominator * r.completion_tokens as f64)
                } else {
                    1.0 / denominator
                }
            })
            .collect();
        Ok(UpdateNormaliser {
            weights,
            denominator,
            tokens_total,
            tokens_trained,
        })
    }

    /// w_i for every row of the update, `[N]`.
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// The weights of the micro-batch made of `rows` (indices into the update batch, in the order the
    /// micro-batch tensors hold them). Pass the result to [`crate::policy_loss`].
    ///
    /// # Panics
    /// If an index is out of range (a caller bug).
    pub fn rows(&self, rows: &[usize]) -> Vec<f64> {
        rows.iter().map(|&i| self.weights[i]).collect()
    }

    /// The weights of the contiguous micro-batch `range`.
    ///
    /// # Panics
    /// If the range is out of bounds.
    pub fn range(&self, range: std::ops::Range<usize>) -> Vec<f64> {
        self.weights[range].to_vec()
    }

    /// The denominator of the aggregation (total trained tokens, rows, or rows·max_new_tokens).
    pub fn denominator(&self) -> f64 {
        self.denominator
    }

    /// `masked_frac` (DESIGN.md section 10): share of the update's completion tokens that get no gradient because
    /// their row left the normaliser; `None` without tokens.
    pub fn masked_frac(&self) -> Option<f64> {
        (self.tokens_total > 0)
            .then(|| (self.tokens_total - self.tokens_trained) as f64 / self.tokens_total as f64)
    }
}
