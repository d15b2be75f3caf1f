//! The trainer update stage (DESIGN.md sections 3 and 4): advantages over the step batch, then
//! μ epochs × mini-batches of optimizer updates, each update split into micro-batches of whole groups
//! (by row count or token budget, [`crate::pack::micro_batches`]) under one update-level
//! normaliser; each update ends in the shared optimizer step ([`super::optimizer`]: reduce hook,
//! global-norm clipping, AdamW). With `share_prompt` (the default) each micro-batch's forward
//! computes a group's prompt once for all its completions (`rlvr_model::shared_prefix`), in the
//! training pass, the reference pass and the start-of-step scoring alike.
//! The losses, advantages and normalisers themselves, with their paper equations, are rlvr-algo's
//! (`compute_advantages`, `policy_loss`, `UpdateNormaliser`).
//!
//! Reads like the algorithm box:
//!
//! ```text
//! A ← compute_advantages(rewards, groups)                  once per step
//! for epoch in 1..=μ:
//!   for mini-batch M (whole groups):                       one optimizer update each
//!     w ← UpdateNormaliser(M)                              fixed before micro-batching
//!     for micro-batch m ⊂ M (whole groups):              prompt computed once per group
//!       g += ∇ policy_loss(m, w_m)                         no division by #micro-batches
//!     if !finite(g): skip;  g ← g·min(1, c/‖g‖);  AdamW(g, lr)
//! ```

use std::collections::HashMap;

use candle_core::{DType, Tensor};
use rlvr_algo::{
    compute_advantages, policy_loss, shape_rewards, AdvantageStats, Algorithm, LossInputs,
    LossStats, MismatchSums, RowInfo, UpdateNormaliser,
};
use rlvr_model::optim::AdamWConfig;
use rlvr_model::Model;

use super::dp::reduce_stats;
use super::optimizer::OptimizerStep;
use crate::job::{GlobalView, Job};
use crate::pack::{micro_batches, pack_rows, MicroBatchLimit};
use crate::store::checkpoint::OptimizerRecord;
use crate::store::experience::Experience;
use crate::store::state::Stateful;

/// How the trainer splits and optimises a step (the `train.*` keys of the same names document
/// each).
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateSettings {
    /// Peak learning rate (AdamW's base rate; each update gets the schedule's value).
    pub lr: f64,
    /// AdamW decoupled weight decay λ.
    pub weight_decay: f64,
    /// AdamW β₁.
    pub beta1: f64,
    /// AdamW β₂.
    pub beta2: f64,
    /// AdamW ε.
    pub adam_eps: f64,
    /// Global gradient-norm clip (0 = off).
    pub grad_clip: f64,
    /// Rows per micro-batch.
    pub micro_batch_size: usize,
    /// Token budget per micro-batch (decoder positions: [`crate::pack::forward_cost`]), replacing
    /// `micro_batch_size` when set.
    pub micro_batch_tokens: Option<usize>,
    /// Compute each group's prompt once for all its completions (prefix-shared forward and
    /// backward, `rlvr_model::shared_prefix`; rows that share no prompt fall back to the unshared
    /// batch). Off: every row is its own `[prompt, completion]` row (for checking).
    pub share_prompt: bool,
    /// Leave rows whose gradient is exactly zero out of forward and backward.
    pub skip_zero_gradient_rows: bool,
    /// Activation checkpointing.
    pub gradient_checkpointing: bool,
    /// Optimizer updates per epoch (mini-batches of whole groups).
    pub mini_batches: usize,
    /// μ: passes over the step's batch.
    pub epochs: usize,
}

/// What the trainer needs of the config, worked out once.
#[derive(Debug, Clone)]
pub struct TrainerSettings {
    /// The resolved algorithm.
    pub algorithm: Algorithm,
    /// Splitting and optimising.
    pub train: UpdateSettings,
    /// Sampling temperature T (the trainer scores with the same T).
    pub temperature: f64,
    /// `rollout.max_new_tokens` (the constant normaliser's L and the overlong penalty's limit).
    pub max_new_tokens: usize,
    /// Pad id used to fill right-padded micro-batches.
    pub pad_id: u32,
}

/// The trainer: the policy being optimised, its optimizer and an optional frozen reference.
pub struct Trainer {
    /// The policy π_θ (version = completed steps).
    pub model: Model,
    /// Frozen reference policy for the KL term (when `kl_coef` ≠ 0).
    pub reference: Option<Model>,
    /// The optimizer step (AdamW over `model.named_vars()` in order, clipping, reduce hook).
    pub optimizer: OptimizerStep,
    /// Settings.
    pub settings: TrainerSettings,
    /// The job this rank belongs to ([`Trainer::data_parallel`]): its communicator is shared with
    /// the optimizer's gradient reduction; [`Job::single`] in one process.
    job: Job,
}

/// The trainer's state in a checkpoint ([`Stateful`]): what continues its optimization exactly.
#[derive(Debug, Clone)]
pub struct TrainerRecord {
    /// AdamW updates applied (bias correction continues from it).
    pub optimizer_step: u64,
    /// The optimizer's moments and masters.
    pub optimizer: OptimizerRecord,
    /// The LoRA-dropout round: optimizer updates so far (0 without LoRA;
    /// [`rlvr_model::Model::lora_dropout_round`]).
    pub lora_dropout_round: u64,
}

impl Stateful for Trainer {
    type State = TrainerRecord;

    /// The optimizer's state (sharded: as gathered by [`Trainer::gather_for_checkpoint`]) and the
    /// LoRA-dropout round.
    fn state_dict(&self) -> anyhow::Result<TrainerRecord> {
        Ok(TrainerRecord {
            optimizer_step: self.optimizer.update_count(),
            optimizer: self.optimizer.record()?,
            lora_dropout_round: self.model.lora_dropout_round().unwrap_or(0),
        })
    }

    fn load_state_dict(&mut self, state: TrainerRecord) -> anyhow::Result<()> {
        self.model.set_lora_dropout_round(state.lora_dropout_round);
        self.optimizer
            .load_record(state.optimizer, state.optimizer_step)
    }
}

/// Result of one trainer step.
#[derive(Debug, Clone, Default)]
pub struct StepReport {
    /// Loss diagnostics merged over every update of the step (`loss` = mean update loss).
    pub loss: Option<rlvr_algo::LossMetrics>,
    /// Advantage counts (zero-variance groups, nulls, drops).
    pub adv: AdvantageStats,
    /// Mean, min and max of the rows' advantages over the step's rows with a scored reward, every
    /// rank's (`advantage/mean`, `advantage/min`, `advantage/max`; verl's `critic/advantages/*`,
    /// which weighs rows by their tokens); None without scored rows.
    pub advantage: Option<[f64; 3]>,
    /// Mean global gradient L2 norm before clipping over the updates (None if no update ran).
    pub grad_norm: Option<f64>,
    /// True when a non-finite loss or gradient skipped an update.
    pub skipped: bool,
    /// Optimizer updates applied.
    pub updates: usize,
    /// Mean |ℓ_sampler − ℓ_trainer| over completion tokens of staleness-0 rows, measured before the
    /// step's first update (DESIGN.md section 3); None when no such row.
    pub logprob_diff_s0: Option<f64>,
    /// k3 estimate of KL(π_sampler ‖ π_trainer) over the same tokens: mean of e^r − r − 1 with
    /// r = ℓ_trainer − ℓ_sampler (verl's `rollout_corr/kl_k3`, see `rlvr_algo::mismatch`);
    /// None when no staleness-0 row.
    pub logprob_k3_s0: Option<f64>,
    /// Token counts of r = ℓ_trainer − ℓ_sampler over `rlvr_algo::RATIO_HIST_EDGES`, on the same
    /// tokens as `logprob_diff_s0` (`hist/mismatch`); None when no staleness-0 row.
    pub mismatch_hist: Option<[f64; rlvr_algo::RATIO_BUCKETS]>,
    /// RED-Drop's share of the scored rows dropped (`red_drop/dropped_frac`); None when
    /// `algorithm.red_drop` is off.
    pub dropped_frac: Option<f64>,
    /// Completion tokens trained on (summed over updates).
    pub tokens: usize,
    /// Rows left out of forward/backward because their gradient is exactly zero (summed over
    /// updates; see [`UpdateSettings::skip_zero_gradient_rows`]).
    pub rows_skipped: usize,
}

/// One micro-batch's tensors: completion-aligned `[b, C]`.
struct MicroBatch {
    logp: Tensor,
    entropy: Option<Tensor>,
    logp_ref: Option<Tensor>,
    logp_old: Tensor,
    mask: Tensor,
    mask_host: Vec<Vec<f32>>,
}

impl Trainer {
    /// A trainer over `model` with a fresh AdamW.
    ///
    /// # Errors
    /// Tensor allocation errors.
    pub fn new(
        mut model: Model,
        reference: Option<Model>,
        settings: TrainerSettings,
    ) -> anyhow::Result<Self> {
        let t = &settings.train;
        model.set_gradient_checkpointing(t.gradient_checkpointing);
        let optimizer = OptimizerStep::new(
            &model,
            AdamWConfig {
                lr: t.lr,
                beta1: t.beta1,
                beta2: t.beta2,
                eps: t.adam_eps,
                weight_decay: t.weight_decay,
            },
            t.grad_clip,
        )?;
        Ok(Trainer {
            model,
            reference,
            optimizer,
            settings,
            job: Job::single(),
        })
    }

    /// Makes this trainer one rank of `job`: the optimizer's gradients are summed over the ranks
    /// (`rlvr_dist::DistReduce`, with the non-finite flag), and [`Trainer::step`] takes this
    /// rank's whole groups of the step batch (ranks in order: rank 0's rows first), gathers the
    /// per-row metadata, and computes the advantages, normalisers and reported statistics of the
    /// whole batch, as one process would. Every rank must call `step` for every step, also with no
    /// rows. A job of one process leaves the trainer as it is.
    ///
    /// # Errors
    /// Tensor errors building the reduction's buffers.
    pub fn data_parallel(self, job: Job) -> anyhow::Result<Self> {
        self.data_parallel_with(job, 0)
    }

    /// The fused GPU kernels (`[kernels]`) for the policy ([`Model::set_kernels`]: resolved
    /// against its device, dtype and shapes) and its optimizer (`kernels.adamw` as the policy
    /// resolved it: `rlvr_model::optim::AdamW::set_fused`).
    pub fn set_kernels(&mut self, switches: rlvr_model::KernelSwitches) {
        self.model.set_kernels(switches);
        let fused = self.model.fused_adamw();
        self.optimizer.adamw.set_fused(fused);
    }

    /// [`Trainer::data_parallel`] at ZeRO stage `zero`: 0 as it; 1 the optimizer state sharded
    /// over the ranks (`rlvr_dist::ZeroReduce`: gradients reduced to each parameter's owner, the
    /// global norm summed over the shards, each owner's new weights broadcast); 2 the gradients
    /// too (each micro-batch's reduced to the owners, who alone accumulate them). The steps and
    /// reports are the same (stage 2's sums in another order: `rlvr_dist::zero`).
    ///
    /// # Errors
    /// As [`Trainer::data_parallel`]; a stage above 2.
    pub fn data_parallel_with(mut self, job: Job, zero: u8) -> anyhow::Result<Self> {
        anyhow::ensure!(zero <= 2, "ZeRO stage {zero}: expected 0, 1 or 2");
        if !job.is_parallel() {
            return Ok(self);
        }
        let params: Vec<Tensor> = self
            .model
            .named_vars()
            .iter()
            .map(|(_, v)| v.as_tensor().clone())
            .collect();
        let comm = job.comm();
        let reduce: Box<dyn crate::update::GradReduce> = match zero {
            0 => Box::new(rlvr_dist::DistReduce::new(Box::new(comm), &params)?),
            1 => Box::new(rlvr_dist::ZeroReduce::new(Box::new(comm), &params)?),
            _ => Box::new(
                rlvr_dist::ZeroReduce::new(Box::new(comm), &params)?.with_sharded_gradients(),
            ),
        };
        // The optimizer built by `new` (no update has run yet), with the ranks' reduction.
        self.optimizer = self.optimizer.with_reduce(reduce)?;
        self.job = job;
        Ok(self)
    }

    /// Before a checkpoint, on every rank together: a sharded optimizer's state brought to rank 0
    /// for [`Stateful::state_dict`] (nothing to do unsharded).
    ///
    /// # Errors
    /// A failed collective.
    pub fn gather_for_checkpoint(&mut self) -> anyhow::Result<()> {
        self.optimizer.gather_for_checkpoint()
    }

    /// One trainer step on `batch` (B groups × K, any order), at trainer step `step` (1-based) with
    /// learning rate `lr`. `seed` is the run seed (RED-Drop). Data parallel
    /// ([`Trainer::data_parallel`]), `batch` is this rank's whole groups and the report is the
    /// whole batch's, the same on every rank.
    ///
    /// # Errors
    /// Shape or tensor errors, invalid rewards; a non-finite loss is not an error (the update is
    /// skipped and reported).
    pub fn step(
        &mut self,
        batch: &[Experience],
        step: u64,
        lr: f64,
        seed: u64,
    ) -> anyhow::Result<StepReport> {
        let alg = self.settings.algorithm.clone();
        let mut report = StepReport::default();
        // Every rank's rows, as far as the advantages and normalisers need them.
        let view = self.job.gather_view(batch)?;
        if view.rows.is_empty() {
            return Ok(report);
        }
        // 1. Advantages over the whole step batch (groups by id).
        let mut rewards: Vec<Option<f64>> = view.rows.iter().map(|e| e.reward).collect();
        let lens: Vec<usize> = view.rows.iter().map(|e| e.completion_tokens).collect();
        shape_rewards(&mut rewards, &lens, self.settings.max_new_tokens, &alg)?;
        let groups: Vec<&str> = view.rows.iter().map(|e| e.group_id.as_str()).collect();
        let adv = compute_advantages(&rewards, &groups, &alg, seed)?;
        report.adv = adv.stats;
        let scored: Vec<f64> = (adv.values.iter().zip(&rewards))
            .filter(|(_, r)| r.is_some())
            .map(|(a, _)| *a)
            .collect();
        report.advantage = (!scored.is_empty()).then(|| {
            let mean = scored.iter().sum::<f64>() / scored.len() as f64;
            let (lo, hi) = scored
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), a| {
                    (l.min(*a), h.max(*a))
                });
            [mean, lo, hi]
        });
        report.dropped_frac = adv
            .stats
            .dropped_frac()
            .filter(|_| alg.advantage.red_drop.is_some());

        // Sampler/trainer mismatch correction: ℓ_trainer of every row at the start of the step.
        let start_lp = self.start_logprobs(batch, &alg)?;

        // 2. Mini-batches of whole groups (first-appearance order).
        let minis = split_groups(&groups, self.settings.train.mini_batches);
        let mut stats = LossStats::default();
        let mut norms = Vec::new();
        let mut diff = MismatchSums::default();
        for epoch in 0..self.settings.train.epochs {
            for (m, rows) in minis.iter().enumerate() {
                let first = epoch == 0 && m == 0;
                let out = self.update(
                    (batch, &view),
                    rows,
                    (&adv, start_lp.as_deref()),
                    step,
                    lr,
                    first.then_some(&mut diff),
                )?;
                stats.merge(&out.stats);
                report.updates += 1;
                report.rows_skipped += out.rows_skipped;
                match out.grad_norm {
                    Some(g) => norms.push(g),
                    None => report.skipped = true,
                }
            }
        }
        reduce_stats(&mut self.job, &mut stats, &mut diff)?;
        report.tokens = stats.tokens as usize;
        // 3. Metrics.
        let mut metrics = stats.finalise(Some(&adv.stats));
        metrics.loss = stats.loss / report.updates.max(1) as f64;
        // Its two parts alike (pg_loss + reg_loss = loss).
        metrics.pg_loss = stats.pg_loss / report.updates.max(1) as f64;
        metrics.reg_loss = stats.reg_loss / report.updates.max(1) as f64;
        report.loss = Some(metrics);
        report.grad_norm =
            (!norms.is_empty()).then(|| norms.iter().sum::<f64>() / norms.len() as f64);
        let mismatch = diff.stats();
        report.logprob_diff_s0 = mismatch.map(|m| m.mean_abs_diff);
        report.logprob_k3_s0 = mismatch.map(|m| m.k3_kl);
        report.mismatch_hist = mismatch.map(|_| diff.hist());
        Ok(report)
    }

    /// With `algorithm.mismatch_correction` on, every row's completion log-probs under the weights
    /// at the start of the step (no gradient): ℓ_trainer of ρ_mismatch ([`rlvr_algo::mismatch`]).
    fn start_logprobs(
        &self,
        batch: &[Experience],
        alg: &rlvr_algo::Algorithm,
    ) -> anyhow::Result<Option<Vec<Vec<f32>>>> {
        if alg.mismatch == rlvr_algo::Correction::Off {
            return Ok(None);
        }
        let lp = crate::score::score_rows(
            &self.model,
            batch,
            self.settings.train.micro_batch_size,
            self.settings.temperature.max(1e-6),
            self.settings.pad_id,
            self.settings.train.share_prompt,
        )?;
        Ok(Some(lp))
    }

    /// One optimizer update over the global `rows` of `view`, of which this rank trains those in
    /// `batch`. Returns this rank's merged loss stats, the gradient norm (None when the update was
    /// skipped as non-finite) and the rows skipped of all ranks.
    ///
    /// The steps: the update's normaliser (fixed before micro-batching), the rows that reach
    /// forward and backward, then per micro-batch of this rank's rows its forward, loss and
    /// gradient, summed; finally the optimizer step ([`OptimizerStep::apply`]).
    fn update(
        &mut self,
        (batch, view): (&[Experience], &GlobalView),
        rows: &[usize],
        (adv, start_lp): (&rlvr_algo::Advantages, Option<&[Vec<f32>]>),
        step: u64,
        lr: f64,
        mut diff: Option<&mut MismatchSums>,
    ) -> anyhow::Result<UpdateOut> {
        let infos = row_infos(view, rows, adv);
        let norm = UpdateNormaliser::new(
            &self.settings.algorithm,
            &infos,
            self.settings.max_new_tokens,
        )?;
        let trained = self.trained_rows(rows, &norm, adv);
        let rows_skipped = rows.len() - trained.len();
        let index = UpdateIndex::new(view, rows);
        let mut grads = self.optimizer.gradients();
        let mut stats = LossStats::default();
        let mbs = micro_batches(batch, &index.local_rows(&trained), self.micro_batch_limit());
        // ZeRO-2 reduces every micro-batch's gradients: every rank runs the ranks' largest count,
        // those past its own (or skipped below) with no gradient.
        let rounds = self.optimizer.agree_micro_batches(mbs.len())?;
        let mut mbs = mbs.into_iter();
        for _ in 0..rounds {
            let Some(mb) = mbs.next() else {
                self.optimizer.accumulate_nothing(&mut grads)?;
                continue;
            };
            let weights = norm.rows(&index.places(&mb));
            let Some(t) = self.forward(batch, &mb)? else {
                self.optimizer.accumulate_nothing(&mut grads)?;
                continue;
            };
            if let Some(d) = diff.as_deref_mut() {
                accumulate_diff(batch, &mb, &t, step, d)?;
            }
            let advantages = index.advantages(&mb, &adv.values);
            let out = self.micro_batch_loss(batch, &mb, &t, &weights, advantages, start_lp)?;
            stats.merge(&out.stats);
            stats.mismatch.merge(&out.corrected);
            if !out.stats.loss.is_finite() {
                grads.mark_non_finite();
                self.optimizer.accumulate_nothing(&mut grads)?;
                continue;
            }
            self.optimizer.accumulate(&mut grads, &out.loss)?;
        }
        let grad_norm = self.optimizer.apply(grads, lr)?;
        // The next update's LoRA-dropout masks are a new draw (the same for any micro-batching,
        // padding or number of ranks: they are keyed by the round and the tokens).
        if let Some(r) = self.model.lora_dropout_round() {
            self.model.set_lora_dropout_round(r + 1);
        }
        Ok(UpdateOut {
            stats,
            grad_norm,
            rows_skipped,
        })
    }

    /// The global rows of `rows` that reach forward and backward, in order: all of them, or with
    /// [`UpdateSettings::skip_zero_gradient_rows`] those whose loss term can have a nonzero
    /// gradient. A row's gradient is exactly zero at weight 0 (out of the normaliser), or at
    /// advantage 0 when every term of the loss is proportional to the advantage; such a row would
    /// cost a full forward and backward for nothing (TRL and verl pay it).
    fn trained_rows(
        &self,
        rows: &[usize],
        norm: &UpdateNormaliser,
        adv: &rlvr_algo::Advantages,
    ) -> Vec<usize> {
        let alg = &self.settings.algorithm;
        let all_w = norm.rows(&(0..rows.len()).collect::<Vec<_>>());
        let only_pg = alg.regulariser == rlvr_algo::RegTerm::None
            && alg.kl.coef == 0.0
            && alg.entropy_coef == 0.0;
        rows.iter()
            .zip(&all_w)
            .filter(|&(&i, &w)| {
                !self.settings.train.skip_zero_gradient_rows
                    || (w != 0.0 && !(only_pg && adv.values[i] == 0.0))
            })
            .map(|(&i, _)| i)
            .collect()
    }

    /// How micro-batches are cut ([`crate::pack::micro_batches`]).
    fn micro_batch_limit(&self) -> MicroBatchLimit {
        let t = &self.settings.train;
        MicroBatchLimit {
            rows: t.micro_batch_size,
            tokens: t.micro_batch_tokens,
            share_prompt: t.share_prompt,
        }
    }

    /// The policy loss of one micro-batch `mb` (local rows of `batch`, forward `t`) with its rows'
    /// normaliser `weights` and `advantages`: with `start_lp` (the mismatch correction) the
    /// correction weights c_it weigh the loss, Σ_i w_i Σ_t m_it c_it L_it, and their counts are
    /// returned beside the loss statistics.
    fn micro_batch_loss(
        &self,
        batch: &[Experience],
        mb: &[usize],
        t: &MicroBatch,
        weights: &[f64],
        advantages: Vec<f32>,
        start_lp: Option<&[Vec<f32>]>,
    ) -> anyhow::Result<MicroBatchLoss> {
        let alg = &self.settings.algorithm;
        let mut corrected = rlvr_algo::CorrectionCounts::default();
        let is_weights = match start_lp {
            Some(lp) => Some(
                super::mismatch::corrected_mask(
                    batch,
                    mb,
                    &t.mask_host,
                    lp,
                    alg,
                    weights,
                    &mut corrected,
                )?
                .to_dtype(t.mask.dtype())?
                .to_device(t.mask.device())?,
            ),
            None => None,
        };
        let a = Tensor::from_vec(advantages, mb.len(), self.model.device())?;
        let (loss, stats) = policy_loss(
            alg,
            &LossInputs {
                logp: &t.logp,
                logp_behaviour: &t.logp_old,
                logp_ref: t.logp_ref.as_ref(),
                entropy: t.entropy.as_ref(),
                mask: &t.mask,
                is_weights: is_weights.as_ref(),
                advantages: &a,
                row_weights: weights,
            },
        )?;
        Ok(MicroBatchLoss {
            loss,
            stats,
            corrected,
        })
    }

    /// Training forward of one micro-batch: completion-aligned ℓ (with gradient), entropy, reference
    /// ℓ, ℓ_old and mask, all `[b, C]` (C = longest completion). None when no row has a completion.
    fn forward(&self, batch: &[Experience], mb: &[usize]) -> anyhow::Result<Option<MicroBatch>> {
        let c_max = mb
            .iter()
            .map(|&i| batch[i].completion_ids.len())
            .max()
            .unwrap_or(0);
        if c_max == 0 {
            return Ok(None);
        }
        let rows: Vec<(&[u32], &[u32])> = mb
            .iter()
            .map(|&i| (&batch[i].prompt_ids[..], &batch[i].completion_ids[..]))
            .collect();
        let dev = self.model.device();
        let b = mb.len();
        let need_entropy = true;
        let temperature = self.settings.temperature;
        // Only completion positions reach the lm_head ([b, C], 0 after each completion); shared:
        // each distinct prompt once (same layout and values up to float reassociation).
        let packed =
            (!self.settings.train.share_prompt).then(|| pack_rows(&rows, self.settings.pad_id));
        let score = |m: &Model, entropy: bool, grad: bool| -> anyhow::Result<_> {
            Ok(match &packed {
                None => m.shared_prefix_logprobs_rows(&rows, temperature, entropy, grad)?,
                Some(p) => m.token_logprobs_at(
                    &p.ids,
                    &p.mask,
                    p.start,
                    &p.at,
                    temperature,
                    entropy,
                    grad,
                )?,
            })
        };
        let out = score(&self.model, need_entropy, true)?;
        let logp = out.logprobs;
        let entropy = out.entropy;
        let logp_ref = match (&self.reference, self.settings.algorithm.needs_reference()) {
            (Some(r), true) => Some(score(r, false, false)?.logprobs),
            (None, true) => anyhow::bail!(
                "algorithm.kl_coef = {} needs a reference model, but none was loaded",
                self.settings.algorithm.kl.coef
            ),
            _ => None,
        };
        let mut old = vec![0f32; b * c_max];
        let mut m = vec![0f32; b * c_max];
        let mut mask_host = Vec::with_capacity(b);
        // The loss mask: 1 on sampled tokens, 0 on padding and on a multi-turn episode's
        // bridge tokens (docs/DESIGN.md section 14), whose ℓ_old placeholder nothing reads.
        for (r, &i) in mb.iter().enumerate() {
            let e = &batch[i];
            let mut row = e.loss_mask();
            for (j, &mj) in row.iter().enumerate() {
                old[r * c_max + j] = if mj > 0.0 {
                    e.behaviour_logprobs[j]
                } else {
                    0.0
                };
                m[r * c_max + j] = mj;
            }
            row.resize(c_max, 0.0);
            mask_host.push(row);
        }
        Ok(Some(MicroBatch {
            logp,
            entropy,
            logp_ref,
            logp_old: Tensor::from_vec(old, (b, c_max), dev)?,
            mask: Tensor::from_vec(m, (b, c_max), dev)?,
            mask_host,
        }))
    }
}

struct UpdateOut {
    stats: LossStats,
    grad_norm: Option<f64>,
    rows_skipped: usize,
}

/// One micro-batch's loss (with its graph), its statistics and the mismatch correction's counts.
struct MicroBatchLoss {
    loss: Tensor,
    stats: LossStats,
    corrected: rlvr_algo::CorrectionCounts,
}

/// What the update's normaliser needs of each of its global `rows`.
fn row_infos(view: &GlobalView, rows: &[usize], adv: &rlvr_algo::Advantages) -> Vec<RowInfo> {
    rows.iter()
        .map(|&i| RowInfo {
            completion_tokens: view.rows[i].completion_tokens,
            truncated: view.rows[i].truncated,
            in_normaliser: adv.in_normaliser[i],
        })
        .collect()
}

/// One update's rows in the three index spaces it moves between: *global* (the step batch of
/// every rank, [`GlobalView`]: advantages and row metadata), *place* (position in the update's
/// `rows`: the normaliser's weights) and *local* (this rank's `batch`: the tensors).
struct UpdateIndex<'a> {
    view: &'a GlobalView,
    /// Each global row of the update → its place.
    place: HashMap<usize, usize>,
}

impl<'a> UpdateIndex<'a> {
    /// The index of the update over the global `rows` of `view`.
    fn new(view: &'a GlobalView, rows: &[usize]) -> Self {
        let place = rows.iter().enumerate().map(|(p, &g)| (g, p)).collect();
        Self { view, place }
    }

    /// The global `rows` this rank holds, as local indices (in order).
    fn local_rows(&self, rows: &[usize]) -> Vec<usize> {
        rows.iter()
            .filter_map(|&g| self.view.local_index(g))
            .collect()
    }

    /// The places of the local rows `mb`.
    fn places(&self, mb: &[usize]) -> Vec<usize> {
        mb.iter()
            .map(|&i| self.place[&self.view.global(i)])
            .collect()
    }

    /// The global per-row `values` (advantages) of the local rows `mb`, as f32.
    fn advantages(&self, mb: &[usize], values: &[f64]) -> Vec<f32> {
        mb.iter()
            .map(|&i| values[self.view.global(i)] as f32)
            .collect()
    }
}

/// Adds the completion tokens of the micro-batch's staleness-0 rows (ℓ vs ℓ_old) to `d`.
fn accumulate_diff(
    batch: &[Experience],
    mb: &[usize],
    t: &MicroBatch,
    step: u64,
    d: &mut MismatchSums,
) -> anyhow::Result<()> {
    let lp = t.logp.detach().to_dtype(DType::F32)?.to_vec2::<f32>()?;
    let old = t.logp_old.to_vec2::<f32>()?;
    for (r, &i) in mb.iter().enumerate() {
        if batch[i].staleness(step) != Some(0) {
            continue;
        }
        for j in 0..batch[i].completion_ids.len() {
            if t.mask_host[r][j] > 0.0 {
                d.add(lp[r][j], old[r][j]);
            }
        }
    }
    Ok(())
}

/// Splits the rows into `n` mini-batches of whole groups (first-appearance order, sizes differing by
/// at most one group). Fewer groups than `n` give fewer mini-batches.
pub fn split_groups(groups: &[&str], n: usize) -> Vec<Vec<usize>> {
    let rows = crate::pack::group_positions(groups.iter().copied());
    let n = n.clamp(1, rows.len().max(1));
    let mut out = vec![Vec::new(); n];
    let per = rows.len() / n;
    let extra = rows.len() % n;
    let mut k = 0;
    for (m, chunk) in out.iter_mut().enumerate() {
        let take = per + usize::from(m < extra);
        for g in &rows[k..k + take] {
            chunk.extend_from_slice(g);
        }
        k += take;
    }
    out.retain(|c| !c.is_empty());
    out
}
