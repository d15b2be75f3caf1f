//! The trainer's side of `algorithm.mismatch_correction` ([`rlvr_algo::mismatch`]): the
//! per-token correction weights c_it of a micro-batch, multiplied into its completion mask, and
//! what they did (masked and truncated tokens and rows, [`CorrectionCounts`]).

use candle_core::{Device, Tensor};
use rlvr_algo::{correct, Algorithm, CorrectionCounts, IsCorrection};

use crate::store::experience::Experience;

/// The correction `alg` selects, as `rlvr_algo::correct` takes it; `None` when off.
pub fn is_correction(alg: &Algorithm) -> Option<IsCorrection> {
    alg.mismatch.weights()
}

/// The micro-batch `mb`'s mask `[b, C]` (f32, on the CPU) with each completion token's 1 replaced
/// by its correction weight c_it from `start_lp[i]` (ℓ_trainer at the start of the step) and the
/// row's behaviour log-probs (ℓ_sampler); padding stays 0. The rows whose normaliser weight in
/// `row_weights` is not 0 (the trained rows) are counted into `counts`.
///
/// # Errors
/// Tensor errors; a row whose start log-probs and completion differ in length.
pub(crate) fn corrected_mask(
    batch: &[Experience],
    mb: &[usize],
    mask_host: &[Vec<f32>],
    start_lp: &[Vec<f32>],
    alg: &Algorithm,
    row_weights: &[f64],
    counts: &mut CorrectionCounts,
) -> anyhow::Result<Tensor> {
    let c_max = mask_host.first().map_or(0, |r| r.len());
    let mut m = vec![0f32; mb.len() * c_max];
    let corr = is_correction(alg);
    for (r, &i) in mb.iter().enumerate() {
        let e = &batch[i];
        let n = e.completion_ids.len();
        let w = match corr {
            Some(c) if n > 0 => {
                anyhow::ensure!(
                    start_lp[i].len() == n && e.behaviour_logprobs.len() == n,
                    "row {i}: {} start log-probs and {} behaviour log-probs for {n} tokens",
                    start_lp[i].len(),
                    e.behaviour_logprobs.len()
                );
                // Over sampled tokens only: a sequence-level correction (geometric, sequence
                // TIS/MIS) must not see a multi-turn episode's bridge tokens.
                let sampled: Vec<usize> = (0..n).filter(|&j| e.sampled(j)).collect();
                let pick = |v: &[f32]| -> Vec<f32> { sampled.iter().map(|&j| v[j]).collect() };
                let out = correct(&pick(&start_lp[i]), &pick(&e.behaviour_logprobs), c);
                if row_weights.get(r).is_some_and(|&w| w != 0.0) {
                    counts.add_row(sampled.len(), out.masked, out.truncated);
                }
                let mut w = vec![0.0; n];
                for (&j, x) in sampled.iter().zip(out.weights) {
                    w[j] = x;
                }
                w
            }
            _ => vec![1.0; n],
        };
        for j in 0..n.min(c_max) {
            m[r * c_max + j] = mask_host[r][j] * w[j];
        }
    }
    Ok(Tensor::from_vec(m, (mb.len(), c_max), &Device::Cpu)?)
}
