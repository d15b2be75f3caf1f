//! The evaluator stage: held-out evaluation for every caller (`eval/*` metrics during training and
//! SFT, `rlvr eval`, the quickstart): greedy with one sample per problem by default, temperature 1
//! with n > 1 (mean@k and pass@k). Completions come through the [`Rollout`] boundary.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rlvr_model::{Model, TokenizerBundle};
use rlvr_reward::combine::RewardFunction;
use rlvr_reward::Sample;
use rlvr_rollout::{NativeRollout, Rollout, Sampler, SamplingParams};
use serde::Serialize;

use crate::job::Job;
use crate::store::metrics::append_line;
use crate::store::state::Stateful;

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
    /// The prompt text: the rendered prompt the sample (or, with `--env`, the episode) started
    /// from; an environment's `reset` messages that replace the dataset's prompt, rendered.
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
    /// Each reward component's raw (unweighted) reward, in `[[reward.components]]` order (the
    /// task's verifier alone without components), written as `"rewards": {name: value}`; empty
    /// (and not written) for an episode, whose reward is the environment's.
    #[serde(
        rename = "rewards",
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "ordered_map"
    )]
    pub components: Vec<(String, f64)>,
    /// The extra numbers reward components reported ([`rlvr_reward::Score::extra`], verl's
    /// `reward_extra_info`): (component, its numbers by key) for each component, in
    /// `components` order, that reported some; written as `"reward_extra": {component: {key:
    /// value}}`, absent when none did.
    #[serde(
        rename = "reward_extra",
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "ordered_map"
    )]
    pub extra: Vec<(String, std::collections::BTreeMap<String, f64>)>,
    /// A multi-turn episode's turns and environment replies (`rlvr eval --env`); absent for a
    /// single-turn sample.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub episode: Option<EpisodeRecord>,
}

/// `(name, value)` pairs as a JSON object in their order (serde_json's map would sort them).
fn ordered_map<S: serde::Serializer, V: Serialize>(
    v: &[(String, V)],
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(v.len()))?;
    for (k, x) in v {
        m.serialize_entry(k, x)?;
    }
    m.end()
}

/// What `rlvr eval` reports of the rewards, under training's names (metrics.jsonl): `reward/mean`
/// (the mean reward over `items`: samples, or episodes the environment did not fail) and, for
/// each reward component the samples carry, `reward/<name>/mean` (its raw reward's mean, as a
/// training step's `reward/<name>/mean`; TRL's `rewards/<name>/mean`), then each extra number a
/// component reported, `reward/<name>/<key>/mean` (its mean over the items that carry the key,
/// as a training step's), in key order. Null means where nothing was scored.
pub fn reward_summary(items: &[EvalItem]) -> Vec<(String, serde_json::Value)> {
    let mean = |xs: &[f64]| (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64);
    let scored: Vec<&EvalItem> = items
        .iter()
        .filter(|it| it.episode.as_ref().is_none_or(|e| e.error.is_none()))
        .collect();
    let rewards: Vec<f64> = scored.iter().map(|it| it.reward).collect();
    let mut out = vec![("reward/mean".to_string(), serde_json::json!(mean(&rewards)))];
    if let Some(first) = scored.iter().find(|it| !it.components.is_empty()) {
        for (k, (name, _)) in first.components.iter().enumerate() {
            let raw: Vec<f64> = scored
                .iter()
                .filter_map(|it| it.components.get(k).map(|c| c.1))
                .collect();
            out.push((format!("reward/{name}/mean"), serde_json::json!(mean(&raw))));
        }
    }
    let extra = scored.iter().flat_map(|it| {
        it.extra.iter().flat_map(|(name, numbers)| {
            numbers
                .iter()
                .map(move |(key, x)| (format!("reward/{name}/{key}/mean"), *x))
        })
    });
    out.extend(
        crate::store::metrics::keyed_means(extra)
            .into_iter()
            .map(|(k, x)| (k, serde_json::json!(x))),
    );
    out
}

/// What one evaluated episode did (`rlvr eval --env`, docs/environments.md): its assistant
/// turns, the rewards the environment gave, how it ended, and the transcript.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpisodeRecord {
    /// Assistant turns.
    pub turns: u32,
    /// The rewards the environment gave, in order (null: a turn it gave none for).
    pub turn_rewards: Vec<Option<f64>>,
    /// `done`, `max_turns`, `length`, `budget`, `eos` or `error`.
    pub finish: String,
    /// The environment's error, when it failed the episode (reward 0, not correct).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The transcript: `{"role", "content"}` per assistant turn and environment message.
    pub transcript: Vec<serde_json::Value>,
    /// The turn structure of the episode's completion tokens: each assistant turn (sampled, its
    /// mask 1s) and each bridge (the environment's reply rendered, its mask 0s) in order, with
    /// its turn, first index and length in tokens (as `rlvr generate --env`'s `segments`).
    pub segments: Vec<crate::store::experience::Segment>,
    /// The environment's own numbers for the episode (`"metrics"` on its last reply), by name;
    /// absent when it gave none or failed the episode. Averaged into `env/metrics/<name>/mean`.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metrics: rlvr_env::protocol::Metrics,
}

impl EpisodeRecord {
    /// The episode's `completion_mask` (1 on sampled ids, 0 on bridge ids), read off
    /// [`EpisodeRecord::segments`].
    pub fn completion_mask(&self) -> Vec<u8> {
        let mut mask = Vec::new();
        for s in &self.segments {
            mask.resize(s.start + s.len, u8::from(s.kind == "assistant"));
        }
        mask
    }

    /// Completion tokens, assistant turns and bridges together.
    pub fn completion_len(&self) -> usize {
        self.segments.last().map_or(0, |s| s.start + s.len)
    }
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

impl EvalSettings {
    /// The sampling of an evaluation: `samples` completions per prompt, greedy for one and at
    /// temperature 1 for more, stopped at `eos_ids` or the settings' stop strings.
    pub fn sampling(&self, eos_ids: &[u32]) -> SamplingParams {
        SamplingParams {
            group_size: self.samples,
            temperature: if self.samples > 1 { 1.0 } else { 0.0 },
            top_p: 1.0,
            top_k: None,
            max_new_tokens: self.max_new_tokens,
            min_new_tokens: 0,
            stop_ids: eos_ids.to_vec(),
            stop_strings: self.stop.clone(),
            max_batch_rows: self.max_batch_rows,
        }
    }
}

/// The held-out set and how it is scored: the one evaluator of rlvr-train.
pub struct Evaluator {
    /// Rendered prompt texts.
    pub texts: Vec<String>,
    /// The verifier reference of each prompt.
    pub references: Vec<String>,
    /// The index of each prompt's dataset row in the test split.
    pub rows: Vec<usize>,
    /// The columns of each prompt's dataset row (for the verifier).
    pub columns: Vec<Vec<(String, String)>>,
    /// The reward function (the run's verifier and shaping, shared with its explorer).
    pub reward: Arc<RewardFunction>,
    /// Sampling settings.
    pub settings: EvalSettings,
    /// Task name (in results).
    pub task: &'static str,
}

impl Evaluator {
    /// Evaluates the policy behind `rollout`.
    ///
    /// # Errors
    /// Tokenizer, sampling and verifier errors.
    pub fn run(
        &self,
        rollout: &mut dyn Rollout,
        tok: &TokenizerBundle,
    ) -> anyhow::Result<(EvalResult, Vec<EvalItem>)> {
        evaluate(
            rollout,
            tok,
            self.task,
            &Problems {
                texts: &self.texts,
                references: &self.references,
                rows: &self.rows,
                columns: &self.columns,
            },
            &self.reward,
            &self.settings,
        )
    }

    /// As [`Evaluator::run`], with the items appended to `items` chunk by chunk of problems
    /// (`rollout.max_batch_rows` rows of samples at a time): on an error, `items` holds those of
    /// the chunks sampled and scored before it (`rlvr eval --out` keeps them).
    ///
    /// # Errors
    /// As [`Evaluator::run`].
    pub fn run_into(
        &self,
        rollout: &mut dyn Rollout,
        tok: &TokenizerBundle,
        items: &mut Vec<EvalItem>,
    ) -> anyhow::Result<EvalResult> {
        let n = self.texts.len();
        items.clear();
        sample_problems_into(
            rollout,
            tok,
            &self.problems(),
            &self.reward,
            &self.settings,
            0..n,
            items,
        )?;
        let per = correct_per_problem(items, n);
        Ok(summarise(self.task, &per, self.settings.samples))
    }

    /// Evaluates `model` with the native engine (sharing its weights).
    ///
    /// # Errors
    /// As [`Evaluator::run`].
    pub fn run_model(
        &self,
        model: &Model,
        tok: &TokenizerBundle,
    ) -> anyhow::Result<(EvalResult, Vec<EvalItem>)> {
        let sampler = Sampler::new(model, 0).with_tokenizer(tok.tokenizer.clone());
        self.run(&mut NativeRollout::new(sampler), tok)
    }

    /// Evaluates `model` at trainer step `step` and records it: appends `{EvalResult…, "step"}`
    /// to `dir/eval.jsonl` and returns the result, whose [`EvalResult::metrics`] go to the
    /// metrics line.
    ///
    /// # Errors
    /// As [`Evaluator::run`], and I/O errors.
    pub fn record(
        &self,
        model: &Model,
        tok: &TokenizerBundle,
        step: u64,
        dir: &Path,
    ) -> anyhow::Result<EvalResult> {
        self.record_split(model, tok, step, Some(dir), &mut Job::single())
    }

    /// [`Evaluator::record`] split over data-parallel ranks: each rank samples and scores its
    /// [`Job::my_range`] of the problems, the per-problem correct counts are summed over the
    /// ranks (exact: small integers in f64), so every rank returns the one-process result; only
    /// a caller passing `dir` (rank 0) appends to eval.jsonl. A job of one process evaluates
    /// every problem. A rank whose share fails (sampling, the verifier) tells the others first
    /// (one `any`), so every rank ends the evaluation with an error at the same point instead of
    /// the others waiting for its counts.
    ///
    /// # Errors
    /// As [`Evaluator::record`], on the rank that met it; on the others, that another rank's
    /// share failed; a failed collective.
    pub fn record_split(
        &self,
        model: &Model,
        tok: &TokenizerBundle,
        step: u64,
        dir: Option<&Path>,
        job: &mut Job,
    ) -> anyhow::Result<EvalResult> {
        let n = self.texts.len();
        let range = job.my_range(n);
        let sampler = Sampler::new(model, 0).with_tokenizer(tok.tokenizer.clone());
        let items = sample_problems(
            &mut NativeRollout::new(sampler),
            tok,
            &self.problems(),
            &self.reward,
            &self.settings,
            range,
        );
        if job.any(items.is_err())? {
            return Err(items.err().unwrap_or_else(|| {
                anyhow::anyhow!(
                    "another rank's share of the evaluation of step {step} failed (its error, in \
                     its log, says why)"
                )
            }));
        }
        let items = items?;
        let mut per = correct_per_problem(&items, n);
        job.sum_f64(&mut per)?;
        let r = summarise(self.task, &per, self.settings.samples);
        if let Some(dir) = dir {
            let mut e = serde_json::to_value(&r)?;
            e["step"] = step.into();
            append_line(&dir.join("eval.jsonl"), &e.to_string())?;
        }
        Ok(r)
    }

    fn problems(&self) -> Problems<'_> {
        Problems {
            texts: &self.texts,
            references: &self.references,
            rows: &self.rows,
            columns: &self.columns,
        }
    }
}

/// The best held-out accuracy of a run so far and its step: the evaluator's state in a
/// checkpoint ([`Stateful`]), which names the `best` checkpoint and keeps it from rotation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Best(Option<(f64, u64)>);

impl Best {
    /// Records the accuracy of the evaluation at step `t`; returns whether it is a new best.
    /// Step 0 (the initial policy) sets the first best without counting as one.
    pub fn observe(&mut self, t: u64, accuracy: f64) -> bool {
        if t == 0 {
            self.0 = Some((accuracy, 0));
            return false;
        }
        let better = self.0.is_none_or(|b| accuracy > b.0);
        if better {
            self.0 = Some((accuracy, t));
        }
        better
    }

    /// The best (accuracy, step) so far; `None` before any evaluation.
    pub fn get(&self) -> Option<(f64, u64)> {
        self.0
    }
}

impl Stateful for Best {
    type State = Option<(f64, u64)>;

    fn state_dict(&self) -> anyhow::Result<Self::State> {
        Ok(self.0)
    }

    fn load_state_dict(&mut self, state: Self::State) -> anyhow::Result<()> {
        self.0 = state;
        Ok(())
    }
}

impl EvalResult {
    /// The `eval/*` metrics keys (DESIGN.md section 10) and their values (`eval/n` an integer).
    pub fn metrics(&self) -> [(&'static str, serde_json::Value); 4] {
        use rlvr_rundir::key::Eval;
        [
            (Eval::Accuracy.key(), self.accuracy.into()),
            (Eval::MeanAtK.key(), self.mean_at_k.into()),
            (Eval::PassAtK.key(), self.pass_at_k.into()),
            (Eval::N.key(), self.n.into()),
        ]
    }
}

/// The held-out problems as [`evaluate`] reads them: one entry per prompt in each list.
pub struct Problems<'a> {
    /// Rendered prompt texts.
    pub texts: &'a [String],
    /// The verifier reference of each prompt.
    pub references: &'a [String],
    /// The index of each prompt's dataset row.
    pub rows: &'a [usize],
    /// The columns of each prompt's dataset row.
    pub columns: &'a [Vec<(String, String)>],
}

/// Evaluates the policy behind `rollout` on `problems` (rendered texts, references, rows).
///
/// # Errors
/// Tokenizer, sampling and verifier errors (a failed group fails the evaluation).
pub fn evaluate(
    rollout: &mut dyn Rollout,
    tokenizer: &TokenizerBundle,
    task: &str,
    problems: &Problems<'_>,
    reward: &RewardFunction,
    s: &EvalSettings,
) -> anyhow::Result<(EvalResult, Vec<EvalItem>)> {
    let n = problems.texts.len();
    let items = sample_problems(rollout, tokenizer, problems, reward, s, 0..n)?;
    let per = correct_per_problem(&items, n);
    Ok((summarise(task, &per, s.samples), items))
}

/// Samples and scores the problems `range` of `problems` (sampling seeds and chunks indexed by
/// the problem's place in the whole list, so a part gives the items the whole would).
fn sample_problems(
    rollout: &mut dyn Rollout,
    tokenizer: &TokenizerBundle,
    problems: &Problems<'_>,
    reward: &RewardFunction,
    s: &EvalSettings,
    range: std::ops::Range<usize>,
) -> anyhow::Result<Vec<EvalItem>> {
    let mut items = Vec::new();
    sample_problems_into(rollout, tokenizer, problems, reward, s, range, &mut items)?;
    Ok(items)
}

/// [`sample_problems`] appending to `items` one whole chunk at a time (sampled and scored), so
/// that an error leaves there the items of the chunks before it.
fn sample_problems_into(
    rollout: &mut dyn Rollout,
    tokenizer: &TokenizerBundle,
    problems: &Problems<'_>,
    reward: &RewardFunction,
    s: &EvalSettings,
    range: std::ops::Range<usize>,
    items: &mut Vec<EvalItem>,
) -> anyhow::Result<()> {
    let Problems {
        texts: prompts,
        references,
        rows,
        columns,
    } = *problems;
    anyhow::ensure!(
        prompts.len() == references.len()
            && references.len() == rows.len()
            && rows.len() == columns.len(),
        "{} eval prompts, {} references, {} row indices and {} column sets",
        prompts.len(),
        references.len(),
        rows.len(),
        columns.len()
    );
    let ids: Vec<Vec<u32>> = prompts[range.clone()]
        .iter()
        .map(|t| tokenizer.encode(t, s.add_special_tokens))
        .collect::<Result<_, _>>()
        .context("encoding eval prompts")?;
    let base = range.start;
    let params = s.sampling(&tokenizer.eos_ids);
    let chunk = (s.max_batch_rows / s.samples).max(1);
    for start in (0..ids.len()).step_by(chunk) {
        let end = (start + chunk).min(ids.len());
        let (first, last) = (base + start, base + end);
        let out = rlvr_rollout::flatten(
            rollout
                .sample(&ids[start..end], first, &params, s.seed)
                .context("sampling eval completions")?,
        )
        .with_context(|| format!("sampling the groups of eval problems {first}..{last}"))?;
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
                columns: &columns[c.prompt_index],
                index: Some(rows[c.prompt_index]),
            })
            .collect();
        let scores = reward
            .score_batch(&samples)
            .with_context(|| format!("scoring the completions of eval problems {first}..{last}"))?;
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
                extra: (sc.components.iter().map(|c| c.0.clone()))
                    .zip(sc.extra)
                    .filter(|(_, e)| !e.is_empty())
                    .collect(),
                components: sc.components,
                episode: None,
            });
        }
    }
    Ok(())
}

/// Correct samples per problem (indexed over the whole list of `n`).
pub fn correct_per_problem(items: &[EvalItem], n: usize) -> Vec<f64> {
    let mut per = vec![0.0; n];
    for it in items {
        per[it.index] += f64::from(u8::from(it.correct));
    }
    per
}

/// The result over `per` (correct samples of each of the n problems, k samples each).
pub fn summarise(task: &str, per: &[f64], k: usize) -> EvalResult {
    let n = per.len();
    let frac = |x: f64| if n == 0 { 0.0 } else { x / n as f64 };
    let mean_at_k = frac(per.iter().map(|&c| c / k as f64).sum());
    let pass_at_k = frac(per.iter().filter(|&&c| c > 0.0).count() as f64);
    EvalResult {
        task: task.to_string(),
        n,
        accuracy: mean_at_k,
        mean_at_k,
        pass_at_k,
        k,
    }
}
