//! Held-out evaluation (`eval/*` metrics during training, and `rlvr eval`): greedy with one sample per
//! problem by default, temperature 1 with n > 1 (mean@k and pass@k).

use anyhow::Context;
use rlvr_model::{Model, TokenizerBundle};
use rlvr_reward::combine::RewardFunction;
use rlvr_reward::Sample;
use rlvr_rollout::{Sampler, SamplingParams};
use serde::Serialize;

use crate::experience::Experience;

/// Result of one evaluation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalResult {
    /// Task name.
    pub task: String,
    /// Problems evaluated.
    pub n: usize,
    /// Share of all samples judged correct (= mean@k; with n = 1 greedy, plain accuracy).
    pub accuracy: f64,
    /// Mean over problems of the share of their k samples that are correct.
    #[serde(rename = "mean@k")]
    pub mean_at_k: f64,
    /// Share of problems with at least one correct sample among k.
    #[serde(rename = "pass@k")]
    pub pass_at_k: f64,
    /// Samples per problem (k).
    pub k: usize,
}

/// One evaluated sample (for `--out` / eval items).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalItem {
    /// Index of the problem in the evaluated list.
    pub index: usize,
    /// Sample index within the problem.
    pub sample_index: usize,
    /// The prompt text.
    pub prompt: String,
    /// The completion text.
    pub completion: String,
    /// Reward.
    pub reward: f64,
    /// Judged correct.
    pub correct: bool,
    /// Extracted answer.
    pub extracted: Option<String>,
    /// Gold answer.
    pub gold: Option<String>,
}

/// Evaluation settings.
#[derive(Debug, Clone)]
pub struct EvalSettings {
    /// Samples per problem k (1 = greedy, > 1 = temperature 1).
    pub samples: usize,
    /// Most new tokens.
    pub max_new_tokens: usize,
    /// Seed of the sampling (k > 1).
    pub seed: u64,
    /// Rows decoded together.
    pub max_batch_rows: usize,
    /// Extra stop strings.
    pub stop: Vec<String>,
    /// Encode prompts with the tokenizer's added special tokens (false for chat-rendered prompts).
    pub add_special_tokens: bool,
}

/// Evaluates `model` on `prompts` (rendered texts) against `references`.
///
/// # Errors
/// Tokenizer, sampling and verifier errors.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    model: &Model,
    tokenizer: &TokenizerBundle,
    task: &str,
    prompts: &[String],
    references: &[String],
    reward: &RewardFunction,
    s: &EvalSettings,
) -> anyhow::Result<(EvalResult, Vec<EvalItem>)> {
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|t| tokenizer.encode(t, s.add_special_tokens))
        .collect::<Result<_, _>>()
        .context("encoding eval prompts")?;
    let params = SamplingParams {
        group_size: s.samples,
        temperature: if s.samples > 1 { 1.0 } else { 0.0 },
        top_p: 1.0,
        top_k: None,
        max_new_tokens: s.max_new_tokens,
        min_new_tokens: 0,
        stop_ids: tokenizer.eos_ids.clone(),
        stop_strings: s.stop.clone(),
        max_batch_rows: s.max_batch_rows,
    };
    let sampler = Sampler::new(model, 0).with_tokenizer(tokenizer.tokenizer.clone());
    let mut items = Vec::new();
    let chunk = (s.max_batch_rows / s.samples).max(1);
    for start in (0..ids.len()).step_by(chunk) {
        let end = (start + chunk).min(ids.len());
        let out = sampler
            .sample(&ids[start..end], &params, s.seed, start)
            .context("sampling eval completions")?;
        let texts: Vec<String> = out
            .iter()
            .map(|c| tokenizer.decode(&c.token_ids, true))
            .collect::<Result<_, _>>()?;
        let samples: Vec<Sample> = out
            .iter()
            .zip(&texts)
            .map(|(c, t)| Sample {
                prompt: &prompts[c.prompt_index],
                completion: t,
                reference: &references[c.prompt_index],
            })
            .collect();
        let scores = reward
            .score_batch(&samples)
            .context("scoring eval completions")?;
        for ((c, sc), t) in out.iter().zip(scores).zip(texts) {
            items.push(EvalItem {
                index: c.prompt_index,
                sample_index: c.sample_index,
                prompt: prompts[c.prompt_index].clone(),
                completion: t,
                reward: sc.reward,
                correct: sc.correct,
                extracted: sc.extracted,
                gold: sc.gold,
            });
        }
    }
    let n = prompts.len();
    let k = s.samples;
    let mut per = vec![0usize; n];
    for it in &items {
        per[it.index] += usize::from(it.correct);
    }
    let frac = |x: f64| if n == 0 { 0.0 } else { x / n as f64 };
    let mean_at_k = frac(per.iter().map(|&c| c as f64 / k as f64).sum());
    let pass_at_k = frac(per.iter().filter(|&&c| c > 0).count() as f64);
    Ok((
        EvalResult {
            task: task.to_string(),
            n,
            accuracy: mean_at_k,
            mean_at_k,
            pass_at_k,
            k,
        },
        items,
    ))
}

/// Training-forward log-probs of the completion tokens of `rows` of `exps` under `model`, without
/// gradient, at temperature `t`: one `Vec<f32>` per row, as long as its completion.
///
/// # Errors
/// Tensor errors.
pub fn completion_logprobs(
    model: &Model,
    exps: &[Experience],
    rows: &[usize],
    t: f64,
    pad: u32,
) -> anyhow::Result<Vec<Vec<f32>>> {
    let len = rows
        .iter()
        .map(|&i| exps[i].prompt_ids.len() + exps[i].completion_ids.len())
        .max()
        .unwrap_or(0)
        .max(2);
    let start = rows
        .iter()
        .map(|&i| exps[i].prompt_ids.len())
        .min()
        .unwrap_or(1)
        .saturating_sub(1);
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for &i in rows {
        let mut r = exps[i].prompt_ids.clone();
        r.extend_from_slice(&exps[i].completion_ids);
        let n = r.len();
        r.resize(len, pad);
        let mut m = vec![1u32; n];
        m.resize(len, 0);
        ids.push(r);
        mask.push(m);
    }
    let out = model.token_logprobs(&ids, &mask, start, t, false, false)?;
    let lp: Vec<Vec<f32>> = out.logprobs.to_vec2()?;
    Ok(rows
        .iter()
        .enumerate()
        .map(|(r, &i)| {
            let p = exps[i].prompt_ids.len();
            (0..exps[i].completion_ids.len())
                .map(|j| lp[r][p + j - 1 - start])
                .collect()
        })
        .collect())
}
