//! The log-prob head of the training forward: per-token log π(x_{t+1} | x_{≤t}) and entropy
//! at a temperature, through the fused CPU op (`rlvr_kernels::LmHeadLogprobOp`) or the unfused
//! reference elsewhere.

use candle_core::{DType, Tensor, D};
use rlvr_kernels::{FrozenHeadLogprobOp, LmHeadLogprobOp, LogitStash, STASH_MAX_BYTES};

use crate::error::{ModelError, Result};
use crate::model::{position_ids, Model};
use crate::ops::{log_softmax, upcast};

/// Output of [`Model::token_logprobs`].
pub struct LogProbs {
    /// `[B, T-1-start]`, f32 (f64 for an f64 model): log π(x_{t+1} | x_{≤t}) at temperature T for t = start..T-2, i.e.
    /// `log_softmax(logits_t / T)[x_{t+1}]`. Positions whose token or predicted token is padding
    /// hold finite garbage: mask them with the attention mask shifted by one.
    pub logprobs: Tensor,
    /// `[B, T-1-start]` entropy of softmax(logits_t / T), in nats, when asked for.
    pub entropy: Option<Tensor>,
}

impl Model {
    /// Per-token log-probs of the next token for a padded batch — the training forward.
    ///
    /// - `ids`: `[B][T]` token ids, left or right padded (any pad id).
    /// - `mask`: `[B][T]`, 1 for real tokens, 0 for padding.
    /// - `start`: first position t whose next token is scored; positions before it get no
    ///   lm_head logits (pass the shortest prompt length − 1 to score completions only).
    /// - `temperature`: logits are divided by it before the log-softmax (DESIGN.md section 3).
    /// - `with_entropy`: also return per-token entropy.
    /// - `grad`: build the autograd graph (training); false for scoring only.
    ///
    /// Returns `[B, T-1-start]` tensors (f32; f64 for an f64 model); see [`LogProbs`].
    pub fn token_logprobs(
        &self,
        ids: &[Vec<u32>],
        mask: &[Vec<u32>],
        start: usize,
        temperature: f64,
        with_entropy: bool,
        grad: bool,
    ) -> Result<LogProbs> {
        self.logprobs_impl(ids, mask, start, None, temperature, with_entropy, grad)
    }

    /// [`Model::token_logprobs`] at chosen positions only: row r's outputs are the log-probs (and
    /// entropies) at positions `start + at[r][j]` (j-th entry; each `< T − 1 − start`), packed to
    /// `[B, C]` with C = the longest `at[r]` and exact 0 after each row's last entry.
    ///
    /// Only those positions reach the lm_head: the trainer passes each row's completion positions,
    /// so neither the padding of shorter completions nor a longer prompt's own positions cost
    /// lm_head work (the head is most of a training step at a 151936-token vocabulary). Values and
    /// gradients at the listed positions equal [`Model::token_logprobs`]' (tested).
    ///
    /// # Errors
    /// As [`Model::token_logprobs`], and a position past the scored ones.
    #[allow(clippy::too_many_arguments)]
    pub fn token_logprobs_at(
        &self,
        ids: &[Vec<u32>],
        mask: &[Vec<u32>],
        start: usize,
        at: &[Vec<usize>],
        temperature: f64,
        with_entropy: bool,
        grad: bool,
    ) -> Result<LogProbs> {
        if at.len() != ids.len() {
            return Err(ModelError::Invalid(format!(
                "token_logprobs_at: {} position lists for {} rows",
                at.len(),
                ids.len()
            )));
        }
        self.logprobs_impl(ids, mask, start, Some(at), temperature, with_entropy, grad)
    }

    #[allow(clippy::too_many_arguments)]
    // The fused CPU path and the chunked path share the argument checks and the row/position
    // gather; one function keeps the two in step.
    fn logprobs_impl(
        &self,
        ids: &[Vec<u32>],
        mask: &[Vec<u32>],
        start: usize,
        at: Option<&[Vec<usize>]>,
        temperature: f64,
        with_entropy: bool,
        grad: bool,
    ) -> Result<LogProbs> {
        let b = ids.len();
        let t = ids.first().map(|r| r.len()).unwrap_or(0);
        if b == 0 || t < 2 || start + 1 >= t {
            return Err(ModelError::Invalid(format!(
                "token_logprobs needs B >= 1 and start + 1 < T (B {b}, T {t}, start {start})"
            )));
        }
        if ids.iter().any(|r| r.len() != t) || mask.len() != b || mask.iter().any(|r| r.len() != t)
        {
            return Err(ModelError::Invalid(
                "ids and mask must both be [B, T]".into(),
            ));
        }
        if temperature <= 0.0 || !temperature.is_finite() {
            return Err(ModelError::Invalid(format!(
                "temperature must be positive, got {temperature}"
            )));
        }
        let vocab = self.config().vocab_size as u32;
        if let Some(&bad) = ids.iter().flatten().find(|&&x| x >= vocab) {
            return Err(ModelError::Invalid(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        let flat: Vec<u32> = ids.iter().flatten().copied().collect();
        let ids_t = Tensor::from_vec(flat, (b, t), self.device())?;
        let pos = position_ids(mask);
        let bias = self.attention_bias(mask, 0, t)?;
        let flat_pos: Vec<u32> = pos.iter().flatten().copied().collect();
        let hidden = self.forward_masked(&ids_t, &flat_pos, &bias, Some(mask), None, grad)?;
        let n = t - 1 - start;
        let h = hidden
            .narrow(1, start, n)?
            .reshape((b * n, self.config().hidden_size))?;
        let targets = ids_t.narrow(1, start + 1, n)?.contiguous()?.flatten_all()?;
        match at {
            None => {
                let (lp, ent) = self.head(&h, &targets, temperature, with_entropy, grad)?;
                Ok(LogProbs {
                    logprobs: lp.reshape((b, n))?,
                    entropy: ent.map(|e| e.reshape((b, n))).transpose()?,
                })
            }
            Some(at) => {
                // Only the listed positions reach the lm_head; the rest of [B, C] is 0.
                let c = at.iter().map(Vec::len).max().unwrap_or(0);
                let mut sel = Vec::new();
                let mut back = Vec::with_capacity(b * c);
                for (r, row) in at.iter().enumerate() {
                    for &p in row {
                        if p >= n {
                            return Err(ModelError::Invalid(format!(
                                "token_logprobs_at: position {p} of row {r} is past the {n} scored positions"
                            )));
                        }
                        back.push(sel.len() as u32);
                        sel.push((r * n + p) as u32);
                    }
                    back.extend(std::iter::repeat_n(u32::MAX, c - row.len()));
                }
                let k = sel.len();
                for x in back.iter_mut().filter(|x| **x == u32::MAX) {
                    *x = k as u32; // the zero row appended below
                }
                let sel = Tensor::from_vec(sel, k, self.device())?;
                let back = Tensor::from_vec(back, b * c, self.device())?;
                let (lp, ent) = if k == 0 {
                    (None, None)
                } else {
                    let (lp, ent) = self.head(
                        &h.index_select(&sel, 0)?,
                        &targets.index_select(&sel, 0)?,
                        temperature,
                        with_entropy,
                        grad,
                    )?;
                    (Some(lp), ent)
                };
                let place = |x: Option<Tensor>| self.place_rows(x, &back, b, c);
                let entropy = if with_entropy {
                    Some(place(ent)?)
                } else {
                    None
                };
                Ok(LogProbs {
                    logprobs: place(lp)?,
                    entropy,
                })
            }
        }
    }

    /// Packs the head's outputs `x` `[k]` (`None` when k = 0) into `[b, c]` (upcast dtype):
    /// entry i is `x[back[i]]`, and `back[i] == k` gives an exact 0 (`back` holds `b·c` indices).
    pub(crate) fn place_rows(
        &self,
        x: Option<Tensor>,
        back: &Tensor,
        b: usize,
        c: usize,
    ) -> Result<Tensor> {
        let dt = upcast(self.dtype());
        let zero = Tensor::zeros(1, dt, self.device())?;
        let x = match x {
            Some(x) => Tensor::cat(&[&x.to_dtype(dt)?, &zero], 0)?,
            None => zero,
        };
        Ok(x.index_select(back, 0)?.reshape((b, c))?)
    }

    /// The log-prob/entropy head on `h` `[N, H]` at `targets` `[N]`: `[N]` log-probs and, when
    /// asked, `[N]` entropies, of the logits after Gemma 2's final softcapping when the model has
    /// one (fused on the CPU in f32, softcap included, [`crate::chunked`] elsewhere, the Triton
    /// chunk kernels on CUDA with `kernels.logprob_head`; the chunked op equals
    /// [`Model::logprobs_unfused`], tested).
    pub(crate) fn head(
        &self,
        h: &Tensor,
        targets: &Tensor,
        temperature: f64,
        with_entropy: bool,
        grad: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let n = h.dim(0)?;
        // Gemma 2's final-logit softcapping is applied by either head.
        let softcap = self.final_logit_softcap();
        if self.device().is_cpu() && self.dtype() == DType::F32 && !crate::chunked::forced_on_cpu()
        {
            // Fused lm_head + log-softmax + gather + entropy over vocabulary chunks: the
            // [N, V] logits never exist (rlvr_kernels::LmHeadLogprobOp).
            // The head weight trains only without LoRA (frozen: no ∂W, FrozenHeadLogprobOp).
            let train_w = grad && self.lora.is_none();
            let w = self.lm_head.weight.get(train_w);
            // Training keeps the logits for the backward when they fit in STASH_MAX_BYTES.
            let stash = if grad {
                let v = self.config().vocab_size;
                LogitStash::within(n, v, STASH_MAX_BYTES)
            } else {
                None
            };
            let op = LmHeadLogprobOp {
                targets: std::sync::Arc::new(targets.to_vec1()?),
                inv_t: (1.0 / temperature) as f32,
                entropy: with_entropy,
                stash,
                softcap: softcap.map(|c| c as f32),
            };
            let hc = h.contiguous()?;
            let out = if train_w || !grad {
                hc.apply_op2(w, op)?
            } else {
                hc.apply_op2(w, FrozenHeadLogprobOp(op))?
            };
            // Under the launch recorder with `kernels.logprob_head = "on"`: the fused head's
            // launches, from this forward (and its backward).
            let out = if self.fused_head() {
                let ys = targets.to_vec1()?;
                crate::kernels::head::tap(&hc, w, &ys, temperature, with_entropy, softcap, &out)?
            } else {
                out
            };
            let lp = out.narrow(1, 0, 1)?.squeeze(1)?.contiguous()?;
            let ent = if with_entropy {
                Some(out.narrow(1, 1, 1)?.squeeze(1)?.contiguous()?)
            } else {
                None
            };
            Ok((lp, ent))
        } else {
            // Every other device/dtype: lm_head + log-softmax over vocabulary chunks, so the
            // [N, V] logits never exist either (crate::chunked; equal to logprobs_unfused); on
            // CUDA with `kernels.logprob_head` the chunk kernels (crate::kernels::head).
            // A frozen head (LoRA) gets no ∂W.
            let train_w = self.lora.is_none();
            let w = self.lm_head.weight.get(grad && train_w);
            let elems = crate::chunked::chunk_elems(self.device());
            let v = self.config().vocab_size;
            let ys = targets.to_vec1()?;
            let hc = h.contiguous()?;
            #[cfg(feature = "cuda")]
            if self.fused_head() && self.device().is_cuda() {
                if let Some(&y) = ys.iter().find(|&&y| y as usize >= v) {
                    return Err(ModelError::Invalid(format!(
                        "log-prob head: target {y} outside the vocabulary ({v})"
                    )));
                }
                let chunk = crate::kernels::head::chunk_width(n, v, elems);
                let op = (temperature, with_entropy, chunk);
                if let Some(out) =
                    crate::kernels::cuda_head(&hc, w, &ys, op, softcap, grad, train_w)?
                {
                    let lp = out.narrow(1, 0, 1)?.squeeze(1)?;
                    let ent = if with_entropy {
                        Some(out.narrow(1, 1, 1)?.squeeze(1)?)
                    } else {
                        None
                    };
                    return Ok((lp, ent));
                }
                crate::kernels::log_once(format!(
                    "kernels.logprob_head = on: the {:?} head is not covered; the chunked head \
                     runs",
                    hc.dtype()
                ));
            }
            let chunk = crate::chunked::chunk_width(n, v, elems);
            let out = crate::chunked::chunked_head_out(
                &hc,
                w,
                &ys,
                (temperature, with_entropy, chunk),
                softcap,
                grad,
                train_w,
            )?;
            let out = if self.fused_head() {
                crate::kernels::head::tap(&hc, w, &ys, temperature, with_entropy, softcap, &out)?
            } else {
                out
            };
            let lp = out.narrow(1, 0, 1)?.squeeze(1)?;
            let ent = if with_entropy {
                Some(out.narrow(1, 1, 1)?.squeeze(1)?)
            } else {
                None
            };
            Ok((lp, ent))
        }
    }

    /// Reference implementation of the log-prob/entropy head: `log_softmax(logits / T)` gathered
    /// at `targets` `[B, n]`, entropy `−Σ p·log p`. Used off-CPU and for f64; the fused CPU op is
    /// tested against it.
    pub fn logprobs_unfused(
        logits: &Tensor,
        targets: &Tensor,
        temperature: f64,
        with_entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let logits = if temperature != 1.0 {
            (logits / temperature)?
        } else {
            logits.clone()
        };
        let logp = log_softmax(&logits)?; // [B, n, V]
        let lp = logp.gather(&targets.unsqueeze(2)?, 2)?.squeeze(2)?;
        let entropy = if with_entropy {
            Some((logp.exp()? * &logp)?.sum(D::Minus1)?.neg()?)
        } else {
            None
        };
        Ok((lp, entropy))
    }
}
