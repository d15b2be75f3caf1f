//! The explorer stage (DESIGN.md section 3): samples B prompts × K completions through a
//! [`Rollout`] backend holding the weights of its policy version, scores them with the verifier,
//! and hands out one [`Batch`] of experiences per trainer step. DAPO's dynamic sampling (arXiv
//! 2503.14476, "Dynamic Sampling": drop groups whose rewards are all equal and draw more prompts)
//! lives here; the offline replacement is [`super::offline::OfflineSource`].
//!
//! Randomness is seeded per (run seed, prompt draw index, sample index) through rlvr-rollout, where
//! the draw index counts prompts handed out since the start of the run (epoch·N + position of the
//! data cursor), so a batch depends only on the weights, the cursor and the seed: a resumed run
//! draws the same completions.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use candle_core::Tensor;
use rlvr_data::sampler::PromptSampler;
use rlvr_model::{Model, TokenizerBundle};
use rlvr_reward::combine::RewardFunction;
use rlvr_reward::Sample;
use rlvr_rollout::{FinishReason, Rollout, SamplingParams};
use serde::{Deserialize, Serialize};

use super::episodes::{EnvStats, EpisodePrompt, EpisodeRunner, ErrorBudget, RetryVerifier};
use super::share::{RoundLink, Share};
use crate::store::checkpoint::SourceCursor;
use crate::store::experience::Experience;
use crate::store::rollouts::RolloutRecord;

/// What DAPO dynamic sampling does when the refill rounds end with fewer than B groups that have
/// reward variance (`train.dynamic_sampling_short_batch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShortBatch {
    /// Train on the groups found (fewer than B); `dynamic_sampling/short_groups` in
    /// diagnostics.jsonl counts the missing ones. DAPO's paper does not say; this keeps a run going
    /// on tasks where most groups are all-correct or all-wrong.
    Train,
    /// Stop the run (the last good state is saved) with an error naming the key, as verl's DAPO
    /// trainer does when `max_num_gen_batches` is reached (`recipe/dapo/dapo_ray_trainer.py`).
    Error,
}

/// DAPO dynamic sampling ended its refill rounds with fewer than B groups that have reward
/// variance and `train.dynamic_sampling_short_batch = "error"`: the run stops before step `step`.
/// Under data parallel every rank decides it on the same gathered groups
/// ([`Explorer::with_share`]), so every rank meets it at the same point and the run knows it may
/// gather what the save after it needs together (`crate::run`, as for
/// [`super::episodes::ErrorBudgetExceeded`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortBatchStop {
    /// The trainer step whose batch came up short (1-based).
    pub step: u64,
    /// Groups with reward variance found.
    pub found: usize,
    /// Groups wanted: `data.prompts_per_step`.
    pub wanted: usize,
    /// Sampling rounds run: 1 + `train.dynamic_sampling_max_rounds`.
    pub rounds: usize,
    /// Zero-variance groups dropped over those rounds.
    pub dropped: usize,
}

impl std::fmt::Display for ShortBatchStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {}: DAPO dynamic sampling found only {} of {} groups with reward variance in {} \
             sampling rounds ({} zero-variance groups dropped); \
             train.dynamic_sampling_short_batch = \"error\" stops here. Raise \
             train.dynamic_sampling_max_rounds, or set it to \"train\" to train on the short batch",
            self.step, self.found, self.wanted, self.rounds, self.dropped
        )
    }
}

impl std::error::Error for ShortBatchStop {}

/// The experiences of one trainer step (a line of a checkpoint's `trainer_state/buffer.jsonl`
/// when it was sampled but not yet trained on).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Batch {
    /// The trainer step it is for (1-based).
    pub step: u64,
    /// B groups × K experiences.
    pub experiences: Vec<Experience>,
    /// Seconds spent sampling and scoring.
    pub sample_s: f64,
    /// Of which seconds spent scoring (the reward function over every round's completions);
    /// `None` when nothing was scored here (offline experiences).
    pub score_s: Option<f64>,
    /// The source cursor after this batch.
    pub cursor: SourceCursor,
    /// A few completions for rollouts.jsonl.
    pub rollouts: Vec<RolloutRecord>,
    /// Groups dropped by dynamic sampling.
    pub dropped_groups: usize,
    /// Groups missing from B after dynamic sampling's last round (the batch trained short).
    pub short_groups: usize,
    /// What the environment did (multi-turn runs; this rank's share under data parallel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<super::episodes::EnvStats>,
    /// Data parallel with the explorer on its own thread: `env.max_error_frac` is not checked
    /// on this rank's share; the run's thread checks the whole batch once the shares are
    /// gathered ([`super::gather_batch`]). `None` otherwise, and in a checkpoint's buffer (its
    /// batches are whole and were checked).
    #[serde(skip)]
    pub env_check: Option<ShareCheck>,
}

/// What the run's thread needs of a rank's share to check `env.max_error_frac` on the gathered
/// batch ([`Batch::env_check`]): the share's first failed episode and the limit (the counts are
/// in [`Batch::env`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ShareCheck {
    /// The share's first failed episode's message, `None` when none failed.
    pub first: Option<String>,
    /// `env.max_error_frac`.
    pub max_error_frac: f64,
}

/// Sampling settings of the online explorer.
#[derive(Debug, Clone)]
pub struct ExplorerSettings {
    /// rlvr-rollout parameters (K, T, top-p, top-k, max new tokens, stop ids/strings).
    pub params: SamplingParams,
    /// B.
    pub prompts_per_step: usize,
    /// Run seed.
    pub seed: u64,
    /// DAPO dynamic sampling: drop zero-variance groups and sample more.
    pub dynamic_sampling: bool,
    /// Most extra rounds for dynamic sampling.
    pub max_rounds: usize,
    /// What dynamic sampling does when the rounds end short of B groups.
    pub short_batch: ShortBatch,
    /// Recompute ℓ_old with the training forward at the behaviour version.
    pub recompute_behaviour: bool,
    /// Rows per recomputation forward (micro-batches of whole groups).
    pub micro_batch_size: usize,
    /// Compute each group's prompt once in the recomputation (`train.share_prompt`).
    pub share_prompt: bool,
    /// Completions per batch kept for rollouts.jsonl.
    pub log_rollouts: usize,
}

/// The train prompts as the explorer needs them: token ids to sample from, rendered texts and
/// references for the verifier, one entry per prompt in each.
pub struct TrainPrompts {
    /// Token ids of each prompt (see [`super::prompts::PreparedPrompts::encode`]).
    pub ids: Vec<Vec<u32>>,
    /// Rendered prompt texts.
    pub texts: Vec<String>,
    /// The verifier reference of each prompt.
    pub references: Vec<String>,
    /// The index of each prompt's dataset row in the train split.
    pub rows: Vec<usize>,
    /// The columns of each prompt's dataset row.
    pub columns: Vec<Vec<(String, String)>>,
}

/// The online explorer: a rollout backend holding the policy at its version, the train prompts and
/// the verifier.
pub struct Explorer {
    rollout: Box<dyn Rollout>,
    tokenizer: TokenizerBundle,
    prompts: Vec<Vec<u32>>,
    texts: Vec<String>,
    references: Vec<String>,
    rows: Vec<usize>,
    columns: Vec<Vec<(String, String)>>,
    sampler: PromptSampler,
    reward: Arc<RewardFunction>,
    settings: ExplorerSettings,
    /// Data parallel: this rank's share of every round's groups ([`super::share`]); `None` in one
    /// process.
    share: Option<Share>,
    /// Multi-turn episodes (`[env]`); `None` for single-turn completions.
    episodes: Option<EpisodeRunner>,
    /// Whether the environment is the built-in `retry` (its rows carry the verifier's inputs).
    retry_rows: bool,
    /// What the environment did in the batch being produced.
    env_stats: Option<EnvStats>,
    /// Data parallel: the failed episodes of this rank's share of the round being sampled,
    /// checked against `env.max_error_frac` once summed over the ranks ([`ErrorBudget`]).
    share_budget: Option<ErrorBudget>,
    /// Data parallel on the explorer's thread: the share's check, handed to the run's thread with
    /// the batch ([`Batch::env_check`]).
    env_check: Option<ShareCheck>,
    /// Data parallel with dynamic sampling on the explorer's thread: each round gathered through
    /// the run's thread ([`RoundLink`]); `None` otherwise.
    rounds: Option<RoundLink>,
    /// Data parallel on servers every rank samples from (vLLM: rank 0 pushes each version, the
    /// others follow), [`Explorer::with_shared_servers`].
    shared_servers: bool,
}

impl Explorer {
    /// An explorer sampling through `rollout` (its weights loaded by the caller, see
    /// [`Explorer::set_weights`]) over `prompts`, drawn by a prompt sampler at `sampler`'s cursor
    /// and scored by `reward`; `tokenizer` decodes completions for the verifier.
    ///
    /// # Errors
    /// The prompt lists differ in length.
    pub fn new(
        rollout: Box<dyn Rollout>,
        tokenizer: TokenizerBundle,
        prompts: TrainPrompts,
        sampler: PromptSampler,
        reward: Arc<RewardFunction>,
        settings: ExplorerSettings,
    ) -> anyhow::Result<Self> {
        let TrainPrompts {
            ids: prompts,
            texts,
            references,
            rows,
            columns,
        } = prompts;
        anyhow::ensure!(
            prompts.len() == texts.len()
                && texts.len() == references.len()
                && references.len() == rows.len()
                && rows.len() == columns.len(),
            "{} prompt ids, {} texts, {} references, {} row indices and {} column sets",
            prompts.len(),
            texts.len(),
            references.len(),
            rows.len(),
            columns.len()
        );
        Ok(Explorer {
            rollout,
            tokenizer,
            prompts,
            texts,
            references,
            rows,
            columns,
            sampler,
            reward,
            settings,
            share: None,
            episodes: None,
            retry_rows: false,
            env_stats: None,
            share_budget: None,
            env_check: None,
            rounds: None,
            shared_servers: false,
        })
    }

    /// Makes this explorer run multi-turn episodes through `runner` (docs/DESIGN.md section 14)
    /// instead of single-turn completions; `retry_rows` when the environment is the built-in
    /// `retry` (its reset rows then carry the verifier's inputs).
    pub fn with_episodes(mut self, runner: EpisodeRunner, retry_rows: bool) -> Self {
        self.episodes = Some(runner);
        self.retry_rows = retry_rows;
        self
    }

    /// Makes this explorer one rank of a data-parallel run: it samples, scores (and, with
    /// `recompute_behaviour`, rescores) only `share`'s part of every round's groups. With
    /// `share.gathers` it gathers every round, so [`Explorer::produce`] returns the whole
    /// batch, the same on every rank (DAPO's dynamic sampling decides on the gathered groups);
    /// with a round link ([`Explorer::with_round_link`]) the run's thread gathers every round
    /// for it, with the same result; with neither it returns this rank's groups only, for the
    /// caller to gather. A job of one process leaves the explorer as it is.
    ///
    /// # Errors
    /// Dynamic sampling on several ranks with neither (its decision needs every rank's groups).
    pub fn with_share(mut self, share: Share) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !share.job.is_parallel()
                || share.gathers
                || self.rounds.is_some()
                || !self.settings.dynamic_sampling,
            "DAPO dynamic sampling under data parallel needs every round gathered, on the \
             explorer's thread (sync.offset = 0) or through a round link: its keep decision \
             needs every rank's groups"
        );
        self.share = share.job.is_parallel().then_some(share);
        Ok(self)
    }

    /// Makes the run's thread gather each sampling round of this explorer, which runs on its own
    /// thread ([`RoundLink`]): data parallel with DAPO's dynamic sampling and `sync.offset` ≥ 1.
    pub fn with_round_link(mut self, link: RoundLink) -> Self {
        self.rounds = Some(link);
        self
    }

    /// Says that this explorer is one rank's of a data-parallel run whose ranks sample from the
    /// same servers, which rank 0 alone loads each version into (the vLLM backend): no rank may
    /// sample while rank 0 loads, and no rank may sample with a version before rank 0 loaded it
    /// (with an explorer thread, `crate::feed::Feed::online` orders the loads).
    pub fn with_shared_servers(mut self) -> Self {
        self.shared_servers = true;
        self
    }

    /// [`Explorer::with_shared_servers`] was called.
    pub fn shared_servers(&self) -> bool {
        self.shared_servers
    }

    /// Whether DAPO's dynamic sampling is on (`algorithm.dynamic_sampling`).
    pub fn dynamic_sampling(&self) -> bool {
        self.settings.dynamic_sampling
    }

    /// Loads `weights` (named as in the checkpoint) as policy version `version` into the backend:
    /// at start, on resume and at every sync (DESIGN.md section 3).
    ///
    /// # Errors
    /// A name or shape mismatch, a backend failure.
    pub fn set_weights(
        &mut self,
        version: u64,
        weights: &[(String, Tensor)],
    ) -> anyhow::Result<()> {
        self.rollout
            .load_weights(version, weights)
            .with_context(|| format!("loading the weights of version {version} into the explorer"))
    }

    /// Whether `env.max_error_frac` can stop the run: multi-turn episodes with a limit below 1.
    pub fn env_budget_can_stop(&self) -> bool {
        self.episodes
            .as_ref()
            .is_some_and(|r| r.max_error_frac() < 1.0)
    }

    /// Policy version of the weights it samples with.
    pub fn version(&self) -> u64 {
        self.rollout.version()
    }

    /// The behaviour weights as a local model, when the backend has one (the native engine).
    pub fn behaviour_model(&self) -> Option<&Model> {
        self.rollout.local_model()
    }

    /// The source cursor.
    pub fn cursor(&self) -> SourceCursor {
        SourceCursor::Online {
            cursor: self.sampler.cursor(),
        }
    }

    /// Samples, scores and returns the batch of trainer step `step`.
    ///
    /// # Errors
    /// Sampling, tokenizer and verifier errors.
    pub fn produce(&mut self, step: u64) -> anyhow::Result<Batch> {
        let t0 = Instant::now();
        self.env_stats = self.episodes.as_ref().map(|_| EnvStats::default());
        self.env_check = None;
        let b = self.settings.prompts_per_step;
        let mut groups: Vec<Vec<Experience>> = Vec::new();
        let mut rollouts = Vec::new();
        let mut dropped = 0;
        let mut score_s = 0.0;
        let rounds = if self.settings.dynamic_sampling {
            1 + self.settings.max_rounds
        } else {
            1
        };
        for _ in 0..rounds {
            let c = self.sampler.cursor();
            let first = (c.epoch as usize) * c.len + c.position;
            let idx = self.sampler.next_batch(b);
            let new = match self.share.clone() {
                None => self.sample_groups(&idx, first, &mut rollouts, &mut score_s)?,
                Some(share) => {
                    self.sample_share(&idx, first, share, &mut rollouts, &mut score_s)?
                }
            };
            for g in new {
                if self.settings.dynamic_sampling && zero_variance(&g) {
                    dropped += 1;
                } else {
                    groups.push(g);
                }
            }
            if groups.len() >= b {
                break;
            }
        }
        groups.truncate(b);
        let short = b - groups.len();
        if self.settings.dynamic_sampling
            && short > 0
            && self.settings.short_batch == ShortBatch::Error
        {
            return Err(ShortBatchStop {
                step,
                found: groups.len(),
                wanted: b,
                rounds,
                dropped,
            }
            .into());
        }
        let mut experiences: Vec<Experience> = groups.into_iter().flatten().collect();
        // Data parallel, each rank rescored its own share before the gather.
        if self.settings.recompute_behaviour && self.share.is_none() {
            self.recompute(&mut experiences)?;
        }
        Ok(Batch {
            step,
            experiences,
            sample_s: t0.elapsed().as_secs_f64(),
            score_s: Some(score_s),
            cursor: self.cursor(),
            rollouts,
            dropped_groups: dropped,
            short_groups: if self.settings.dynamic_sampling {
                short
            } else {
                0
            },
            env: self.env_stats.take(),
            env_check: self.env_check.take(),
        })
    }

    /// Data parallel: samples this rank's share of the groups of draws `idx` (draw indices from
    /// `first`), rescores them when `recompute_behaviour` is on, and gathers every rank's groups
    /// and rollout records when `share.gathers`.
    fn sample_share(
        &mut self,
        idx: &[usize],
        first: usize,
        mut share: Share,
        rollouts: &mut Vec<RolloutRecord>,
        score_s: &mut f64,
    ) -> anyhow::Result<Vec<Vec<Experience>>> {
        let mine = share.job.my_range(idx.len());
        let mut recs = Vec::new();
        self.share_budget = None;
        let mut groups = if mine.is_empty() {
            Vec::new()
        } else {
            self.sample_groups(&idx[mine.clone()], first + mine.start, &mut recs, score_s)?
        };
        // env.max_error_frac is the whole round's: on the run's thread every rank sums the
        // counts now (the same decision on every rank, at every world size); on the explorer's
        // thread the run's thread does it with the gather of the round (a round link) or of the
        // batch.
        let mut round_budget = None;
        if let Some(runner) = &self.episodes {
            let max_error_frac = runner.max_error_frac();
            let budget = self.share_budget.take().unwrap_or_default();
            if share.gathers {
                super::check_over_ranks(&mut share.job, budget, max_error_frac)?;
            } else if self.rounds.is_some() {
                round_budget = Some((budget, max_error_frac));
            } else {
                self.env_check = Some(ShareCheck {
                    first: budget.first,
                    max_error_frac,
                });
            }
        }
        if self.settings.recompute_behaviour && !groups.is_empty() {
            let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
            let mut rows: Vec<Experience> = groups.into_iter().flatten().collect();
            self.recompute(&mut rows)?;
            let mut it = rows.into_iter();
            groups = sizes
                .iter()
                .map(|&n| it.by_ref().take(n).collect())
                .collect();
        }
        if share.gathers {
            (groups, recs) = share.job.gather_round(groups, recs)?;
        } else if let Some(link) = &self.rounds {
            (groups, recs) = link.gather((groups, recs), round_budget)?;
        }
        let room = self.settings.log_rollouts.saturating_sub(rollouts.len());
        rollouts.extend(recs.into_iter().take(room));
        Ok(groups)
    }

    /// Samples and scores the groups of the prompts `idx` ([`Self::sample_groups_of`]). Logits
    /// that are not finite at a trained version (≥ 1) say the training diverged: the error says
    /// so, with what to do, beside the sampler's own advice (which is about a checkpoint).
    fn sample_groups(
        &mut self,
        idx: &[usize],
        first: usize,
        rollouts: &mut Vec<RolloutRecord>,
        score_s: &mut f64,
    ) -> anyhow::Result<Vec<Vec<Experience>>> {
        let version = self.version();
        self.sample_groups_of(idx, first, rollouts, score_s)
            .map_err(|e| diverged(e, version))
    }

    fn sample_groups_of(
        &mut self,
        idx: &[usize],
        first: usize,
        rollouts: &mut Vec<RolloutRecord>,
        score_s: &mut f64,
    ) -> anyhow::Result<Vec<Vec<Experience>>> {
        if self.episodes.is_some() {
            return self.sample_episodes(idx, first, rollouts, score_s);
        }
        let prompts: Vec<Vec<u32>> = idx.iter().map(|&i| self.prompts[i].clone()).collect();
        let groups = self
            .rollout
            .sample(&prompts, first, &self.settings.params, self.settings.seed)
            .context("sampling completions")?;
        // Nothing is trained on a partial batch: a failed group fails the step.
        let completions = rlvr_rollout::flatten(groups).with_context(|| {
            format!(
                "sampling the groups of prompts {first}..{} (draw indices)",
                first + idx.len()
            )
        })?;
        let texts: Vec<String> = completions
            .iter()
            .map(|c| self.tokenizer.decode(&c.token_ids, true))
            .collect::<Result<_, _>>()?;
        let samples: Vec<Sample> = completions
            .iter()
            .zip(&texts)
            .map(|(c, t)| {
                let p = idx[c.prompt_index - first];
                Sample {
                    prompt: &self.texts[p],
                    completion: t,
                    reference: &self.references[p],
                    columns: &self.columns[p],
                    index: Some(self.rows[p]),
                }
            })
            .collect();
        let t0 = Instant::now();
        let scores = self
            .reward
            .score_batch(&samples)
            .context("scoring completions")?;
        *score_s += t0.elapsed().as_secs_f64();
        let weights = self.reward.component_weights();
        let mut groups: Vec<Vec<Experience>> = vec![Vec::new(); idx.len()];
        for ((c, s), text) in completions.iter().zip(scores).zip(&texts) {
            let p = idx[c.prompt_index - first];
            let e = Experience {
                prompt_ids: self.prompts[p].clone(),
                completion_ids: c.token_ids.clone(),
                behaviour_logprobs: c.behaviour_logprobs.clone(),
                reward: Some(s.reward),
                correct: Some(s.correct),
                group_id: c.prompt_index.to_string(),
                version: Some(c.version),
                truncated: c.finish_reason == FinishReason::Length,
                components: reward_parts(&weights, &s),
                ..Default::default()
            };
            if rollouts.len() < self.settings.log_rollouts {
                rollouts.push(RolloutRecord {
                    group_id: e.group_id.clone(),
                    prompt: self.texts[p].clone(),
                    completion: text.clone(),
                    reward: e.reward,
                    correct: e.correct,
                    version: e.version,
                    finish_reason: c.finish_reason.as_str().into(),
                    turns: None,
                    turn_rewards: None,
                    metrics: Default::default(),
                });
            }
            groups[c.prompt_index - first].push(e);
        }
        Ok(groups)
    }

    /// The episodes of the prompts of draws `idx` (from `first`), one experience each: the
    /// episode's row with its loss mask, its reward from the environment (docs/DESIGN.md
    /// section 14). The environment's time counts as scoring time.
    fn sample_episodes(
        &mut self,
        idx: &[usize],
        first: usize,
        rollouts: &mut Vec<RolloutRecord>,
        score_s: &mut f64,
    ) -> anyhow::Result<Vec<Vec<Experience>>> {
        let prompts: Vec<EpisodePrompt<'_>> = idx
            .iter()
            .enumerate()
            .map(|(i, &p)| EpisodePrompt {
                draw: first + i,
                ids: &self.prompts[p],
                row: if self.retry_rows {
                    RetryVerifier::row(
                        &self.texts[p],
                        &self.references[p],
                        &self.columns[p],
                        self.rows[p],
                    )
                } else {
                    super::episodes::program_row(&self.references[p], &self.columns[p])
                },
            })
            .collect();
        let runner = self.episodes.as_mut().expect("episodes");
        let max_error_frac = runner.max_error_frac();
        let (eps, stats, first_error) = runner.run_tallied(
            self.rollout.as_mut(),
            &self.tokenizer,
            &prompts,
            &self.settings.params,
            self.settings.seed,
        )?;
        // env.max_error_frac: in one process on this call's episodes (the round's); data
        // parallel on the whole round's, once summed over the ranks ([`Self::sample_share`]).
        let budget = ErrorBudget::of(&stats, first_error);
        match self.share {
            None => budget.check(max_error_frac)?,
            Some(_) => self.share_budget = Some(budget),
        }
        *score_s += stats.env_s;
        if let Some(s) = self.env_stats.as_mut() {
            s.merge(&stats);
        }
        let mut groups: Vec<Vec<Experience>> = vec![Vec::new(); idx.len()];
        for ep in eps {
            let p = idx[ep.draw - first];
            let e = Experience {
                prompt_ids: ep.prompt_ids,
                completion_ids: ep.completion_ids,
                behaviour_logprobs: ep.behaviour_logprobs,
                reward: ep.reward,
                correct: None,
                group_id: ep.draw.to_string(),
                version: Some(ep.version),
                truncated: matches!(ep.finish, "length" | "budget"),
                components: Vec::new(),
                completion_mask: Some(ep.completion_mask),
                turns: Some(ep.turns),
                turn_rewards: ep.turn_rewards,
                env_metrics: ep.metrics,
            };
            if rollouts.len() < self.settings.log_rollouts {
                let completion = ep
                    .transcript
                    .iter()
                    .map(|(role, text)| format!("[{role}] {text}"))
                    .collect::<Vec<_>>()
                    .join("\n");
                // The prompt the episode started from: the dataset's, or the environment's
                // replacement (its `reset` messages) rendered, as `rlvr eval --env` names it.
                let prompt = match e.prompt_ids == self.prompts[p] {
                    true => self.texts[p].clone(),
                    false => self.tokenizer.decode(&e.prompt_ids, false)?,
                };
                rollouts.push(RolloutRecord {
                    group_id: e.group_id.clone(),
                    prompt,
                    completion,
                    reward: e.reward,
                    correct: e.correct,
                    version: e.version,
                    finish_reason: ep.finish.into(),
                    turns: e.turns,
                    turn_rewards: Some(e.turn_rewards.clone()),
                    metrics: e.env_metrics.clone(),
                });
            }
            groups[ep.draw - first].push(e);
        }
        Ok(groups)
    }

    /// Replaces ℓ_old by the training forward's log-probs under the explorer's weights (the behaviour
    /// version), at the sampling temperature.
    fn recompute(&self, exps: &mut [Experience]) -> anyhow::Result<()> {
        let model = self.behaviour_model().context(
            "train.recompute_behaviour needs the behaviour weights on this process, \
             which this rollout backend does not keep",
        )?;
        let t = self.settings.params.temperature.max(1e-6);
        let lp = crate::score::score_rows(
            model,
            exps,
            self.settings.micro_batch_size,
            t,
            self.tokenizer.pad_id,
            self.settings.share_prompt,
        )?;
        for (e, l) in exps.iter_mut().zip(lp) {
            if e.completion_ids.is_empty() {
                continue;
            }
            match &e.completion_mask {
                None => e.behaviour_logprobs = l,
                // Only sampled positions: a bridge's placeholder stays 0.0.
                Some(m) => {
                    for (j, (&mj, x)) in m.iter().zip(l).enumerate() {
                        if mj != 0 {
                            e.behaviour_logprobs[j] = x;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether every scored reward of the group is equal (DAPO drops these groups).
pub fn zero_variance(g: &[Experience]) -> bool {
    let r: Vec<f64> = g.iter().filter_map(|e| e.reward).collect();
    r.windows(2).all(|w| w[0] == w[1])
}

/// The parts of one reward: each component (raw and weighted by its `weights` entry, with its
/// extra numbers), then the format term when on.
fn reward_parts(
    weights: &[(String, f64)],
    b: &rlvr_reward::combine::RewardBreakdown,
) -> Vec<crate::store::experience::RewardPart> {
    use crate::store::experience::RewardPart;
    let mut parts: Vec<RewardPart> = b
        .components
        .iter()
        .zip(weights)
        .enumerate()
        .map(|(k, ((name, raw), (_, w)))| RewardPart {
            name: name.clone(),
            raw: *raw,
            weighted: w * raw,
            extra: b.extra.get(k).cloned().unwrap_or_default(),
        })
        .collect();
    if let Some(f) = b.format {
        parts.push(RewardPart {
            name: "format".into(),
            raw: f,
            weighted: f,
            extra: Default::default(),
        });
    }
    parts
}

/// `e` with what it means when its cause is logits that are not finite
/// ([`rlvr_rollout::RolloutError::NonFinite`]) at policy `version` ≥ 1: the trainer's updates
/// made the weights overflow (a loss or gradient that is not finite skips its step and counts
/// toward `train.max_skipped_in_row`, but finite, huge weights reach the sampler first).
fn diverged(e: anyhow::Error, version: u64) -> anyhow::Error {
    let non_finite = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<rlvr_rollout::RolloutError>(),
            Some(rlvr_rollout::RolloutError::NonFinite { .. })
        )
    });
    if version == 0 || !non_finite {
        return e;
    }
    e.context(format!(
        "the explorer samples with version {version} of the policy (the trainer's weights after \
         step {version}), whose logits are not finite: the training diverged. Lower train.lr or \
         set train.grad_clip and start again (a checkpoint from before it can be model.path)"
    ))
}
