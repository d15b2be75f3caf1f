//! Scoring without gradient: the training forward's log-probs of experiences' completion tokens
//! under some weights. The trainer scores the step's batch with the weights at the start of the
//! step (the sampler/trainer mismatch correction), the explorer with the behaviour weights
//! (`train.recompute_behaviour`); both go through [`score_rows`], so the two passes cannot drift
//! apart in how they chunk rows or place the results.

use rlvr_model::Model;

use crate::pack::{micro_batches, pack_rows, MicroBatchLimit};
use crate::store::experience::Experience;

/// Training-forward log-probs of the completion tokens of `rows` of `exps` under `model`, without
/// gradient, at temperature `t`: one `Vec<f32>` per row, as long as its completion. `pad` fills
/// the right-padded rows ([`crate::pack`]). With `share_prompt`, rows with identical prompt ids
/// share one prompt computation (`Model::shared_prefix_logprobs_rows`: the same values up to float
/// reassociation); otherwise every row is the `[prompt, completion]` row of the unshared batch.
///
/// # Errors
/// Tensor errors.
pub fn completion_logprobs(
    model: &Model,
    exps: &[Experience],
    rows: &[usize],
    t: f64,
    pad: u32,
    share_prompt: bool,
) -> anyhow::Result<Vec<Vec<f32>>> {
    let packed: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|&i| (&exps[i].prompt_ids[..], &exps[i].completion_ids[..]))
        .collect();
    if share_prompt {
        // `[b, C]`, entry j of row r at completion token j.
        let out = model.shared_prefix_logprobs_rows(&packed, t, false, false)?;
        let lp: Vec<Vec<f32>> = out.logprobs.to_dtype(candle_core::DType::F32)?.to_vec2()?;
        return Ok(lp
            .into_iter()
            .zip(&packed)
            .map(|(mut l, (_, c))| {
                l.truncate(c.len());
                l
            })
            .collect());
    }
    let p = pack_rows(&packed, pad);
    let out = model.token_logprobs(&p.ids, &p.mask, p.start, t, false, false)?;
    let lp: Vec<Vec<f32>> = out.logprobs.to_dtype(candle_core::DType::F32)?.to_vec2()?;
    Ok(p.at
        .iter()
        .enumerate()
        .map(|(r, at)| at.iter().map(|&k| lp[r][k]).collect())
        .collect())
}

/// [`completion_logprobs`] of every experience of `exps`, in micro-batches of whole groups of at
/// most `micro_batch_size` rows ([`crate::pack::micro_batches`]; rows without a completion are
/// not forwarded and get an empty vector): entry i belongs to `exps[i]`.
///
/// # Errors
/// Tensor errors.
pub fn score_rows(
    model: &Model,
    exps: &[Experience],
    micro_batch_size: usize,
    t: f64,
    pad: u32,
    share_prompt: bool,
) -> anyhow::Result<Vec<Vec<f32>>> {
    let mut out = vec![Vec::new(); exps.len()];
    let rows: Vec<usize> = (0..exps.len())
        .filter(|&i| !exps[i].completion_ids.is_empty())
        .collect();
    let limit = MicroBatchLimit {
        rows: micro_batch_size.max(1),
        tokens: None,
        share_prompt,
    };
    for chunk in micro_batches(exps, &rows, limit) {
        let lp = completion_logprobs(model, exps, &chunk, t, pad, share_prompt)?;
        for (&i, l) in chunk.iter().zip(lp) {
            out[i] = l;
        }
    }
    Ok(out)
}
