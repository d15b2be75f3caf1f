//! The shared-prefix training forward: the K completions of a group share one prompt,
//! so the prompt's hidden states and keys/values are computed once per layer instead of K times.
//!
//! Layout: one flat forward `[1, N]` over N = G·P + R·C positions, where G prompts (groups, or parts
//! of a split group) are padded on the right to P (the longest prompt) and R completion rows to C
//! (the longest completion minus its last token, whose hidden state predicts nothing). The
//! projections, norms and MLP run over all N positions at once; only attention tells the two parts
//! apart (the private `layers::SharedLayout`): each prompt attends causally within itself, each
//! completion row to its group's prompt keys/values (gathered per row, so the backward sums the K
//! rows' gradients into the one prompt computation) and causally to its own keys. Rotary positions
//! of a completion continue its prompt's (P_g, P_g + 1, …). Activation checkpointing checkpoints
//! the flat `[1, N, hidden]` state per layer ([`crate::recompute`]); LoRA runs through the same
//! linear layers. With LoRA dropout > 0 the masks are drawn over the flat layout (one draw per
//! adapter per forward, as before), so they are not the unshared path's masks token for token.
//!
//! The log-prob of a row's first completion token comes from its prompt's last position, the
//! others from the completion part; only those positions reach the final norm and the lm_head.
//! Values and gradients equal the unshared path ([`Model::token_logprobs_at`] over right-padded
//! `[prompt, completion]` rows) up to float reassociation: masked keys get weight exactly 0 in
//! both, and the same keys are visible to every scored query (`tests/it/shared_prefix.rs`).
//!
//! Cost: [`SharedPrefixBatch::decoder_positions`] positions through the decoder instead of
//! [`SharedPrefixBatch::unshared_positions`] (110-token prompt, K = 8, 64-token completions: 614
//! instead of 1392); the lm_head work is the same (the completion tokens only).

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::Tensor;

use crate::error::{ModelError, Result};
use crate::head::LogProbs;
use crate::layers::{AttnMask, SharedLayout};
use crate::model::{Model, MASK_BIAS};
use crate::ops::upcast;

/// One prompt and the completions that continue it: a group, or a part of a split group (every
/// part carries the prompt).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PromptGroup {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// The completions' token ids, one list per row (any length, 0 included).
    pub completions: Vec<Vec<u32>>,
}

/// A micro-batch for [`Model::shared_prefix_logprobs`]: whole groups, or parts of split groups,
/// each part sharing its prompt. Its rows are the groups' completions in order (group 0's, then
/// group 1's, …).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SharedPrefixBatch {
    /// The prompts with their completions.
    pub groups: Vec<PromptGroup>,
}

impl SharedPrefixBatch {
    /// Groups `(prompt, completion)` rows by identical prompt ids: rows with equal prompts (wherever
    /// they are in `rows`) join one group, groups in order of first appearance, completions in row
    /// order. Returns the batch and, for each input row, its row index in the batch's row order.
    /// Rows whose prompt no other row has become groups of one (the unshared computation).
    pub fn from_rows(rows: &[(&[u32], &[u32])]) -> (Self, Vec<usize>) {
        let mut index: HashMap<&[u32], usize> = HashMap::new();
        let mut groups: Vec<PromptGroup> = Vec::new();
        let mut member: Vec<(usize, usize)> = Vec::with_capacity(rows.len());
        for (p, c) in rows {
            let gi = *index.entry(p).or_insert_with(|| {
                groups.push(PromptGroup {
                    prompt: p.to_vec(),
                    completions: Vec::new(),
                });
                groups.len() - 1
            });
            member.push((gi, groups[gi].completions.len()));
            groups[gi].completions.push(c.to_vec());
        }
        let mut first = Vec::with_capacity(groups.len());
        let mut acc = 0;
        for g in &groups {
            first.push(acc);
            acc += g.completions.len();
        }
        let order = member.iter().map(|&(g, j)| first[g] + j).collect();
        (Self { groups }, order)
    }

    /// R: completion rows over all groups.
    pub fn rows(&self) -> usize {
        self.groups.iter().map(|g| g.completions.len()).sum()
    }

    /// The longest completion (tokens): the width of [`Model::shared_prefix_logprobs`]' output.
    pub fn longest_completion(&self) -> usize {
        self.completions().map(Vec::len).max().unwrap_or(0)
    }

    /// Positions the shared forward runs through the decoder: G·P + R·C, P the longest prompt and
    /// C the longest completion minus one (padding included). The memory model's count.
    pub fn decoder_positions(&self) -> usize {
        let (g, p, r, c) = self.geometry();
        g * p + r * c
    }

    /// Positions the unshared path runs for the same rows: R · max over rows of (prompt +
    /// completion), the right-padded `[R, T]` batch.
    pub fn unshared_positions(&self) -> usize {
        let t = self
            .groups
            .iter()
            .flat_map(|g| g.completions.iter().map(|c| g.prompt.len() + c.len()))
            .max()
            .unwrap_or(0);
        self.rows() * t
    }

    /// (G, P, R, C) of the flat layout (module docs).
    fn geometry(&self) -> (usize, usize, usize, usize) {
        let p = self
            .groups
            .iter()
            .map(|g| g.prompt.len())
            .max()
            .unwrap_or(0);
        let c = self.longest_completion().saturating_sub(1);
        (self.groups.len(), p, self.rows(), c)
    }

    fn completions(&self) -> impl Iterator<Item = &Vec<u32>> {
        self.groups.iter().flat_map(|g| g.completions.iter())
    }

    /// Checks the batch against a vocabulary of `vocab` ids.
    fn validate(&self, vocab: usize) -> Result<()> {
        let bad = |m: String| Err(ModelError::Invalid(format!("shared-prefix batch: {m}")));
        if self.rows() == 0 {
            return bad("no completion rows".into());
        }
        if let Some(i) = self.groups.iter().position(|g| g.prompt.is_empty()) {
            return bad(format!("group {i} has an empty prompt"));
        }
        let ids = self
            .groups
            .iter()
            .flat_map(|g| g.prompt.iter().chain(g.completions.iter().flatten()));
        for &id in ids {
            if id as usize >= vocab {
                return bad(format!(
                    "token id {id} is outside the vocabulary (size {vocab})"
                ));
            }
        }
        Ok(())
    }
}

/// LoRA dropout's token keys of a shared forward's `N` flat positions
/// (`crate::lora::DropoutKeys`): each prompt's tokens chain its ids; each completion row's
/// tokens continue its prompt's chain; padding gets 0. The keys a row's tokens get in an
/// unshared forward of `[prompt, completion]` ([`crate::lora::row_keys`]), so both forwards
/// draw the same masks.
fn shared_keys(batch: &SharedPrefixBatch, layout: &SharedLayout) -> Vec<u64> {
    use crate::lora::{chain_key, CHAIN_START};
    let (g, p, c) = (layout.groups, layout.prompt_len, layout.comp_len);
    let mut keys = vec![0u64; layout.positions()];
    let mut ri = 0;
    for (gi, grp) in batch.groups.iter().enumerate().take(g) {
        let mut k = CHAIN_START;
        for (i, &id) in grp.prompt.iter().enumerate() {
            k = chain_key(k, id);
            keys[gi * p + i] = k;
        }
        for comp in &grp.completions {
            let mut kc = k;
            // The row holds the completion without its last token.
            for (j, &id) in comp.iter().take(comp.len().saturating_sub(1)).enumerate() {
                kc = chain_key(kc, id);
                keys[g * p + ri * c + j] = kc;
            }
            ri += 1;
        }
    }
    keys
}

/// The flat inputs of one shared forward: ids and positions `N` long, the layout, and the head's
/// gather: per scored token its flat position and target, and the `[R, C_out]` placement.
struct Plan {
    ids: Vec<u32>,
    positions: Vec<u32>,
    layout: SharedLayout,
    sel: Vec<u32>,
    targets: Vec<u32>,
    back: Vec<u32>,
    width: usize,
}

impl Model {
    /// Per-token log-probs (and entropies) of each completion of `batch` given its prompt, with the
    /// prompt computed once per group (module [`crate::shared_prefix`]): the training forward of
    /// group-relative RL.
    ///
    /// Returns [`LogProbs`] of shape `[R, C]`, rows in the batch's row order (group 0's completions,
    /// then group 1's, …), C = [`SharedPrefixBatch::longest_completion`]: entry `[r, j]` is
    /// `log_softmax(logits / temperature)` at completion token j of row r given the prompt and the
    /// tokens before it (f32; f64 for an f64 model), exact 0 after the row's last token; the
    /// entropy (nats) alike when `with_entropy`. These are the values and the layout
    /// [`Model::token_logprobs_at`] gives for right-padded rows `[prompt, completion]` at the
    /// completion positions. `grad` builds the autograd graph (backpropagate with
    /// [`crate::recompute::backward`] when checkpointing is on).
    ///
    /// # Errors
    /// No rows, an empty prompt, a token id outside the vocabulary, a temperature that is not
    /// positive and finite, tensor errors.
    pub fn shared_prefix_logprobs(
        &self,
        batch: &SharedPrefixBatch,
        temperature: f64,
        with_entropy: bool,
        grad: bool,
    ) -> Result<LogProbs> {
        if temperature <= 0.0 || !temperature.is_finite() {
            return Err(ModelError::Invalid(format!(
                "temperature must be positive, got {temperature}"
            )));
        }
        batch.validate(self.config().vocab_size)?;
        // LongRoPE picks its factors per sequence: one flat forward cannot hold a prompt whose
        // rows sit on both sides of the switch (`shared_prefix_logprobs_rows` scores such rows
        // unshared).
        let c = self.config();
        let long: Vec<bool> = (batch.groups.iter())
            .flat_map(|g| {
                (g.completions.iter()).map(|q| c.rope_is_long_at(g.prompt.len() + q.len()))
            })
            .collect();
        if long.iter().any(|&l| l) && !long.iter().all(|&l| l) {
            return Err(ModelError::Invalid(
                "shared-prefix batch with rows on both sides of LongRoPE's switch \
                 (original_max_position_embeddings): score them with \
                 shared_prefix_logprobs_rows, which takes the unshared path for them"
                    .into(),
            ));
        }
        let plan = self.plan(batch)?;
        let (r, width) = (plan.layout.rows, plan.width);
        let dev = self.device();
        let k = plan.sel.len();
        let back = Tensor::from_vec(plan.back, r * width, dev)?;
        if k == 0 {
            // No completion token to score: nothing reaches the head (or needs the decoder).
            let entropy = match with_entropy {
                true => Some(self.place_rows(None, &back, r, width)?),
                false => None,
            };
            return Ok(LogProbs {
                logprobs: self.place_rows(None, &back, r, width)?,
                entropy,
            });
        }
        let n = plan.ids.len();
        let ids = Tensor::from_vec(plan.ids, (1, n), dev)?;
        let keys = (grad && self.lora_dropout_active()).then(|| shared_keys(batch, &plan.layout));
        let mask = AttnMask::Shared(Arc::new(plan.layout));
        let x = self.stack(&ids, &plan.positions, &mask, None, grad, keys)?;
        let sel = Tensor::from_vec(plan.sel, k, dev)?;
        let h = x.squeeze(0)?.index_select(&sel, 0)?;
        let h = self.final_norm(&h, grad)?;
        let targets = Tensor::from_vec(plan.targets, k, dev)?;
        let (lp, ent) = self.head(&h, &targets, temperature, with_entropy, grad)?;
        let entropy = match with_entropy {
            true => Some(self.place_rows(ent, &back, r, width)?),
            false => None,
        };
        Ok(LogProbs {
            logprobs: self.place_rows(Some(lp), &back, r, width)?,
            entropy,
        })
    }

    /// [`Model::shared_prefix_logprobs`] over `(prompt, completion)` rows in any order: rows with
    /// identical prompt ids share one prompt computation ([`SharedPrefixBatch::from_rows`]). When
    /// sharing would not run fewer decoder positions than the unshared batch
    /// ([`SharedPrefixBatch::decoder_positions`] ≥ [`SharedPrefixBatch::unshared_positions`], e.g.
    /// no two rows share a prompt), the rows take the unshared path instead: exactly
    /// [`Model::token_logprobs_at`] over the right-padded rows at their completion positions. The
    /// output `[b, C]` keeps the input row order, so either way it is a drop-in for that call.
    ///
    /// # Errors
    /// As [`Model::shared_prefix_logprobs`].
    pub fn shared_prefix_logprobs_rows(
        &self,
        rows: &[(&[u32], &[u32])],
        temperature: f64,
        with_entropy: bool,
        grad: bool,
    ) -> Result<LogProbs> {
        let (batch, order) = SharedPrefixBatch::from_rows(rows);
        batch.validate(self.config().vocab_size)?;
        // LongRoPE: a sequence past original_max_position_embeddings rotates with the long
        // factors, its prompt's keys too; a prompt shared by rows on both sides of the switch
        // cannot be computed once, so such a batch takes the unshared path.
        let c = self.config();
        let long = |(p, q): &(&[u32], &[u32])| c.rope_is_long_at(p.len() + q.len());
        let mixed = rows.iter().any(long) && !rows.iter().all(long);
        if mixed
            || batch.longest_completion() > 0
                && batch.decoder_positions() >= batch.unshared_positions()
        {
            return self.unshared_rows(rows, temperature, with_entropy, grad);
        }
        let out = self.shared_prefix_logprobs(&batch, temperature, with_entropy, grad)?;
        if order.iter().enumerate().all(|(i, &o)| i == o) {
            return Ok(out);
        }
        let idx: Vec<u32> = order.iter().map(|&o| o as u32).collect();
        let idx = Tensor::from_vec(idx, order.len(), self.device())?;
        Ok(LogProbs {
            logprobs: out.logprobs.index_select(&idx, 0)?,
            entropy: out.entropy.map(|e| e.index_select(&idx, 0)).transpose()?,
        })
    }

    /// The unshared path over validated rows with at least one completion token: rows `[prompt,
    /// completion]` right-padded with id 0, scored from the shortest prompt − 1 at each row's
    /// completion positions (rlvr-train's `pack_rows` layout).
    fn unshared_rows(
        &self,
        rows: &[(&[u32], &[u32])],
        temperature: f64,
        with_entropy: bool,
        grad: bool,
    ) -> Result<LogProbs> {
        let t = rows
            .iter()
            .map(|(p, c)| p.len() + c.len())
            .max()
            .unwrap_or(0);
        let start = rows.iter().map(|(p, _)| p.len()).min().unwrap_or(1) - 1;
        let (mut ids, mut mask, mut at) = (vec![], vec![], vec![]);
        for (p, c) in rows {
            let n = p.len() + c.len();
            let mut row = [*p, *c].concat();
            row.resize(t, 0);
            ids.push(row);
            mask.push([vec![1u32; n], vec![0; t - n]].concat());
            at.push((0..c.len()).map(|j| p.len() + j - 1 - start).collect());
        }
        self.token_logprobs_at(&ids, &mask, start, &at, temperature, with_entropy, grad)
    }

    /// The flat ids, positions, masks and head gather of `batch` (validated).
    fn plan(&self, batch: &SharedPrefixBatch) -> Result<Plan> {
        let (g, p, r, c) = batch.geometry();
        let width = batch.longest_completion();
        let mut ids = Vec::with_capacity(g * p + r * c);
        let mut positions = Vec::with_capacity(g * p + r * c);
        // Prompts, right-padded with id 0 (padding is never visible to a real query).
        let mut pbias = vec![MASK_BIAS; g * p * p];
        for (gi, grp) in batch.groups.iter().enumerate() {
            let len = grp.prompt.len();
            for i in 0..p {
                ids.push(grp.prompt.get(i).copied().unwrap_or(0));
                positions.push(i.min(len - 1) as u32);
                let row = &mut pbias[(gi * p + i) * p..][..p];
                row[..=i.min(len - 1)].fill(0.0);
            }
        }
        // Completion rows without their last token, positions continuing the prompt's.
        let s = p + c;
        let mut cbias = vec![MASK_BIAS; r * c * s];
        let mut row_group = Vec::with_capacity(r);
        let (mut sel, mut targets) = (Vec::new(), Vec::new());
        let mut back = Vec::with_capacity(r * width);
        let mut ri = 0;
        for (gi, grp) in batch.groups.iter().enumerate() {
            let plen = grp.prompt.len();
            for comp in &grp.completions {
                let own = comp.len().saturating_sub(1);
                for j in 0..c {
                    ids.push(if j < own { comp[j] } else { 0 });
                    positions.push((plen + j) as u32);
                    let row = &mut cbias[(ri * c + j) * s..][..s];
                    row[..plen].fill(0.0);
                    row[p..p + 1 + j.min(own.saturating_sub(1))].fill(0.0);
                }
                // Token 0 from the prompt's last position, token j from completion position j − 1.
                for (j, &tok) in comp.iter().enumerate() {
                    let at = match j {
                        0 => gi * p + plen - 1,
                        _ => g * p + ri * c + j - 1,
                    };
                    back.push(sel.len() as u32);
                    sel.push(at as u32);
                    targets.push(tok);
                }
                back.extend(std::iter::repeat_n(u32::MAX, width - comp.len()));
                row_group.push(gi as u32);
                ri += 1;
            }
        }
        let k = sel.len() as u32;
        for x in back.iter_mut().filter(|x| **x == u32::MAX) {
            *x = k; // the exact zero of place_rows
        }
        let dev = self.device();
        let dt = upcast(self.dtype());
        let bias = |v: Vec<f32>, q: usize, s: usize, b: usize| -> Result<Tensor> {
            Ok(Tensor::from_vec(v, (b, 1, 1, q, s), dev)?.to_dtype(dt)?)
        };
        let comp_bias = if c > 0 {
            Some(bias(cbias, c, s, r)?)
        } else {
            None
        };
        let fused = self.fused_attention().then(|| {
            let prompt_lens: Vec<usize> = batch.groups.iter().map(|g| g.prompt.len()).collect();
            let (mut comp_lens, mut groups) = (Vec::with_capacity(r), Vec::with_capacity(r));
            for (gi, grp) in batch.groups.iter().enumerate() {
                for comp in &grp.completions {
                    comp_lens.push(comp.len().saturating_sub(1));
                    groups.push(gi);
                }
            }
            let seqs = crate::kernels::shared_seqs(p, c, &prompt_lens, &comp_lens, &groups);
            self.fused_layout(g * p + r * c, seqs)
        });
        let prompt_bias = bias(pbias, p, p, g)?;
        // The sliding layers' masks: each query's `size` last visible keys (positions count
        // the prompt's tokens, then the row's own).
        let window = |b: Option<&Tensor>| -> Result<Option<Tensor>> {
            match (&self.config().sliding_window, b) {
                (Some(w), Some(b)) => crate::layers::window_bias(b, w.size),
                _ => Ok(None),
            }
        };
        let layout = SharedLayout {
            groups: g,
            prompt_len: p,
            rows: r,
            comp_len: c,
            row_group: Tensor::from_vec(row_group, r, dev)?,
            prompt_bias_window: window(Some(&prompt_bias))?,
            comp_bias_window: window(comp_bias.as_ref())?,
            prompt_bias,
            comp_bias,
            fused,
        };
        Ok(Plan {
            ids,
            positions,
            layout,
            sel,
            targets,
            back,
            width,
        })
    }
}
