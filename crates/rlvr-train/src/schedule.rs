//! The staleness and sync schedule stage (DESIGN.md section 3): which policy version samples the
//! batch of each step, when the trainer's weights reach the explorer, which experiences are too
//! stale to train on, and where a step's batch comes from (the explorer inline for o = 0, on its
//! own thread for o ≥ 1, or an offline experiences file).
//!
//! Source: paper A, "Revisiting Group Relative Policy Optimization: Insights into On-Policy and
//! Off-Policy Training" (arXiv 2505.22257), off-policy GRPO: the behaviour policy's weights are
//! refreshed from the trainer only every v steps, so the batch of step t is sampled by version
//! v·⌊(t−1)/v⌋ and is 0..v−1 steps stale; v = 1 is on-policy GRPO (DESIGN.md section 3 summarises
//! it). The sync offset o and `sync.max_staleness` have the meaning of Trinity-RFT's
//! `sync_offset` / `max_staleness` (DESIGN.md section 3): the explorer runs o steps ahead, adding o
//! to every staleness, and experiences staler than the bound are dropped.

use std::path::Path;
use std::sync::mpsc;

use anyhow::Context;
use candle_core::Tensor;
use rlvr_data::config::PromptStyle;
use rlvr_data::generate::Split;
use rlvr_data::sampler::PromptSampler;
use rlvr_model::{Model, TokenizerBundle};
use rlvr_reward::combine::RewardFunction;
use rlvr_rollout::{named_tensors, SamplingParams};

use crate::checkpoint::TrainerState;
use crate::config::ResolvedConfig;
use crate::experience::{groups_in_order, read_experiences, Experience};
use crate::explorer::{Batch, Explorer, ExplorerSettings};
use crate::source::{prepare_prompts, OfflineSource, SourceCursor};

/// Named weights sent from the trainer to the explorer at a sync (checkpoint names).
pub type NamedWeights = Vec<(String, Tensor)>;

/// Policy version whose weights sample the batch of step `t` (1-based) under interval `v`, offset `o`:
/// s(t) = v·⌊(t−1−o)/v⌋, and 0 while t − 1 < o (DESIGN.md section 3; o = 0 is paper A's
/// off-policy GRPO, arXiv 2505.22257), so the staleness (t − 1) − s(t) lies in [o, o + v − 1].
pub fn behaviour_version(t: u64, v: u64, o: u64) -> u64 {
    if t < 1 + o {
        0
    } else {
        v * ((t - 1 - o) / v)
    }
}

/// Where batches come from.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Feed {
    Inline(Box<Explorer>),
    Offline(OfflineSource),
    Threaded {
        batches: mpsc::Receiver<anyhow::Result<Batch>>,
        weights: Option<mpsc::Sender<WeightsMsg>>,
        handle: Option<std::thread::JoinHandle<()>>,
        last_cursor: SourceCursor,
    },
}

impl Feed {
    pub(crate) fn next(&mut self, t: u64) -> anyhow::Result<Batch> {
        match self {
            Feed::Inline(e) => e.produce(t),
            Feed::Offline(o) => o.produce(t),
            Feed::Threaded {
                batches,
                last_cursor,
                ..
            } => {
                let b = batches.recv().context("the explorer thread stopped")??;
                *last_cursor = b.cursor;
                Ok(b)
            }
        }
    }

    /// After step `t` completed: the explorer sees the new weights when t is a multiple of v
    /// (paper A, arXiv 2505.22257: the behaviour policy is refreshed every v steps). train.log gets
    /// the sync's time (the whole refresh with the vLLM backend; the hand-over to the explorer's
    /// thread with an offset); an offline source has no explorer and logs nothing.
    pub(crate) fn publish(&mut self, t: u64, v: u64, model: &Model) -> anyhow::Result<()> {
        if !t.is_multiple_of(v) || matches!(self, Feed::Offline(_)) {
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        self.push(t, model)?;
        crate::rundir::log_only(&format!(
            "sync: version {t} handed to the explorer in {:.2} s",
            t0.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    fn push(&mut self, t: u64, model: &Model) -> anyhow::Result<()> {
        match self {
            Feed::Inline(e) => e.set_weights(t, &rlvr_rollout::named_tensors(model)),
            Feed::Offline(_) => Ok(()),
            Feed::Threaded { weights, .. } => {
                // A copy: the trainer keeps updating its weights while the explorer loads these.
                let w: NamedWeights = model
                    .named_vars()
                    .into_iter()
                    .map(|(n, v)| Ok((n, v.as_tensor().copy()?)))
                    .collect::<candle_core::Result<_>>()?;
                if let Some(tx) = weights {
                    // A closed channel means the explorer already finished its last batch.
                    let _ = tx.send((t, w));
                }
                Ok(())
            }
        }
    }

    pub(crate) fn cursor(&self) -> SourceCursor {
        match self {
            Feed::Inline(e) => e.cursor(),
            Feed::Offline(o) => o.cursor(),
            Feed::Threaded { last_cursor, .. } => *last_cursor,
        }
    }

    pub(crate) fn shutdown(&mut self) {
        if let Feed::Threaded {
            weights,
            handle,
            batches,
            ..
        } = self
        {
            weights.take();
            // Unblock an explorer waiting to send.
            while batches.try_recv().is_ok() {}
            if let Some(h) = handle.take() {
                drop(std::mem::replace(batches, mpsc::sync_channel(0).1));
                let _ = h.join();
            }
        }
    }
}

pub(crate) type WeightsMsg = (u64, NamedWeights);
pub(crate) type ExplorerThread = (
    mpsc::Receiver<anyhow::Result<Batch>>,
    mpsc::Sender<WeightsMsg>,
    std::thread::JoinHandle<()>,
);

/// The explorer thread of o ≥ 1: batch t waits for version s(t).
pub(crate) fn spawn_explorer(
    mut ex: Explorer,
    first_step: u64,
    last_step: u64,
    v: u64,
    o: u64,
) -> ExplorerThread {
    let (btx, brx) = mpsc::sync_channel::<anyhow::Result<Batch>>(o.max(1) as usize);
    let (wtx, wrx) = mpsc::channel::<WeightsMsg>();
    let handle = std::thread::spawn(move || {
        for t in first_step..=last_step {
            let need = behaviour_version(t, v, o);
            while ex.version() < need {
                let Ok((ver, w)) = wrx.recv() else { return };
                if let Err(e) = ex.set_weights(ver, &w) {
                    let _ = btx.send(Err(e));
                    return;
                }
            }
            let r = ex.produce(t);
            let failed = r.is_err();
            if btx.send(r).is_err() || failed {
                return;
            }
        }
    });
    (brx, wtx, handle)
}

/// Drops experiences whose staleness (t − 1) − version exceeds `max` (`sync.max_staleness`; those
/// without a version are kept; DESIGN.md section 3, Trinity-RFT's `max_staleness`).
/// Returns the kept ones and how many were dropped.
pub fn filter_stale(
    exps: Vec<Experience>,
    step: u64,
    max: Option<u64>,
) -> (Vec<Experience>, usize) {
    let Some(max) = max else {
        return (exps, 0);
    };
    let n = exps.len();
    let kept: Vec<Experience> = exps
        .into_iter()
        .filter(|e| e.staleness(step).is_none_or(|s| s <= max))
        .collect();
    let d = n - kept.len();
    (kept, d)
}

/// Builds the experience source of a run: the offline file, or the explorer (inline for o = 0,
/// on its own thread for o ≥ 1) at the checkpoint's cursor. The explorer's backend is the one
/// `rollout.backend` names ([`crate::backend::build`]: the native engine over its own copy of the
/// policy, or vLLM servers); the run then loads the starting weights into it through
/// the [`rlvr_rollout::Rollout`] boundary, as a remote backend must be told them: the policy's
/// (version = completed steps), or, when the checkpoint holds them, the explorer's own.
///
/// # Errors
/// Data, tokenizer, verifier and weight-loading errors.
// Long (about 100 lines) on purpose: the feed is offline experiences, the explorer inline, or the
// explorer on its own thread; the set-up the two explorer arms share (prompts, backend, starting
// weights) stays above the branch that picks one.
pub(crate) fn build_feed(
    cfg: &ResolvedConfig,
    state: Option<&TrainerState>,
    ckpt: Option<&Path>,
    policy: (&Model, &TokenizerBundle),
    load_tok: &dyn Fn() -> anyhow::Result<TokenizerBundle>,
) -> anyhow::Result<Feed> {
    let (model, tokenizer) = policy;
    let c = &cfg.raw;
    let (v, o) = (c.sync.interval, c.sync.offset);
    let start = state.map(|s| s.step).unwrap_or(0);
    if let Some(path) = &c.data.experiences {
        let groups = groups_in_order(read_experiences(path)?);
        let consumed = match state.map(|s| s.cursor) {
            Some(SourceCursor::Offline { groups }) => groups,
            _ => 0,
        };
        return Ok(Feed::Offline(OfflineSource::new(
            groups,
            consumed,
            c.data.prompts_per_step,
            Some(load_tok()?),
            c.train.log_rollouts,
        )?));
    }
    let train_p = prepare_prompts(&c.data, Split::Train, tokenizer)?;
    let sampler = match state.map(|s| s.cursor) {
        Some(SourceCursor::Online { cursor }) => {
            PromptSampler::resume(cursor, train_p.texts.len())?
        }
        _ => PromptSampler::new(train_p.texts.len(), c.data.seed)?,
    };
    let reward = RewardFunction::from_config(&c.reward, &c.data.verifier()?)?;
    let ex_tok = load_tok()?;
    let add_special = c.data.style == PromptStyle::Plain;
    let longest = if c.rollout.backend == crate::config::RolloutBackend::Vllm {
        let mut m = 0;
        for t in &train_p.texts {
            m = m.max(tokenizer.encode(t, add_special)?.len());
        }
        m
    } else {
        0
    };
    crate::backend::record_in_run_json(&c.rollout, &c.output.dir)?;
    let backend = crate::backend::build(&c.rollout, &c.output.dir, model, &ex_tok, start, longest)?;
    let mut stop_ids = tokenizer.eos_ids.clone();
    stop_ids.sort_unstable();
    stop_ids.dedup();
    let mut explorer = Explorer::new(
        backend,
        ex_tok,
        train_p.texts,
        train_p.references,
        sampler,
        reward,
        ExplorerSettings {
            params: SamplingParams {
                group_size: c.rollout.group_size,
                temperature: c.rollout.temperature,
                top_p: c.rollout.top_p,
                top_k: (c.rollout.top_k > 0).then_some(c.rollout.top_k),
                max_new_tokens: c.rollout.max_new_tokens,
                min_new_tokens: c.rollout.min_new_tokens,
                stop_ids,
                stop_strings: c.rollout.stop.clone(),
                max_batch_rows: c.rollout.max_batch_rows,
            },
            prompts_per_step: c.data.prompts_per_step,
            seed: c.train.seed,
            dynamic_sampling: cfg.algorithm.dynamic_sampling,
            max_rounds: c.train.dynamic_sampling_max_rounds,
            short_batch: c.train.dynamic_sampling_short_batch,
            recompute_behaviour: c.train.recompute_behaviour,
            micro_batch_size: c.train.micro_batch_size,
            log_rollouts: c.train.log_rollouts,
            add_special_tokens: add_special,
        },
    )?;
    // The starting weights cross the boundary once, at start and on resume.
    match (state, ckpt) {
        (Some(st), Some(dir)) if st.explorer_weights => {
            let ex_dir = dir.join("trainer_state/explorer");
            let w = Model::load(&ex_dir, model.dtype(), model.device()).with_context(|| {
                format!("loading the explorer weights from {}", ex_dir.display())
            })?;
            explorer.set_weights(st.explorer_version, &named_tensors(&w))?;
        }
        _ => explorer.set_weights(start, &named_tensors(model))?,
    }
    Ok(if o == 0 {
        Feed::Inline(Box::new(explorer))
    } else {
        let cursor = explorer.cursor();
        let (brx, wtx, h) = spawn_explorer(explorer, start + 1, c.train.steps, v, o);
        Feed::Threaded {
            batches: brx,
            weights: Some(wtx),
            handle: Some(h),
            last_cursor: cursor,
        }
    })
}
