//! The checkpoint stage of a run: what a checkpoint of the run holds (the policy, the optimizer
//! state, the explorer's version and, when it lags the policy, the explorer's weights, the source
//! cursor and the run's position), in the format [`crate::store::checkpoint`] writes.

use std::path::{Path, PathBuf};

use rlvr_model::TokenizerBundle;

use crate::config::ResolvedConfig;
use crate::feed::Feed;
use crate::store::checkpoint::{
    ensure_finite, rotate, save, CheckpointParts, SourceCursor, TrainerState,
};
use crate::update::{FullState, Trainer};

/// What a checkpoint records besides the trainer: the source cursor, the world size, and under
/// ZeRO-1 the optimizer state gathered to rank 0 ([`crate::update::OptimizerStep::gather_state`]).
pub(crate) struct SaveSource<'a> {
    /// The source cursor after the saved step.
    pub cursor: SourceCursor,
    /// Data-parallel ranks of the run.
    pub world_size: usize,
    /// The gathered optimizer state (`None` unsharded).
    pub gathered: Option<&'a FullState>,
    /// The in-flight batches (`Feed::in_flight`, as JSON); `cursor` is then the source's after the
    /// last of them.
    pub buffer: &'a [serde_json::Value],
}

/// The identity of the run's inputs for the checkpoint's manifest: the dataset files the config
/// names and, with LoRA, the base model's files (`crate::store::manifest::inputs`).
pub(crate) fn run_inputs(cfg: &ResolvedConfig) -> serde_json::Value {
    let d = &cfg.raw.data;
    let data: Vec<(&str, &Path)> = [
        ("data.train", d.train.as_deref()),
        ("data.test", d.test.as_deref()),
        ("data.experiences", d.experiences.as_deref()),
    ]
    .into_iter()
    .filter_map(|(k, p)| p.filter(|p| p.is_file()).map(|p| (k, p)))
    .collect();
    let base = (cfg.raw.model.lora_rank > 0).then_some(cfg.raw.model.path.as_path());
    crate::store::manifest::inputs(&data, base)
}

/// Where a run stands besides its weights: `(step, skipped steps in a row, best (accuracy, step))`.
pub(crate) type RunPosition = (u64, u32, Option<(f64, u64)>);

/// Writes checkpoint `step-N` of the run and rotates old ones (`train.keep_last`, the best kept).
/// Data parallel, rank 0 alone calls it (every rank holds the same weights and optimizer state);
/// `world_size` (ranks of the run) is recorded beside the source `cursor`. A sharded optimizer
/// (ZeRO-1) saves `gathered`, its state brought to rank 0 ([`crate::update::OptimizerStep::gather_state`]).
///
/// # Errors
/// A non-finite weight (nothing is written); I/O errors; an explorer whose version differs from
/// the policy's but whose backend keeps no local weights to save.
pub(crate) fn save_run(
    cfg: &ResolvedConfig,
    run_dir: &Path,
    trainer: &Trainer,
    tokenizer: &TokenizerBundle,
    feed: &Feed,
    (step, skipped_in_row, best): RunPosition,
    SaveSource {
        cursor,
        world_size,
        gathered,
        buffer,
    }: SaveSource,
) -> anyhow::Result<PathBuf> {
    ensure_finite(&trainer.model)?;
    if trainer.optimizer.is_sharded() && gathered.is_none() {
        anyhow::bail!(
            "the optimizer state is sharded over the ranks (distributed.zero = 1) and was not \
             gathered: a checkpoint needs every rank (the last one written stays the last good one)"
        );
    }
    let (ex_version, ex_model) = feed.explorer_state(step)?;
    let st = TrainerState {
        step,
        optimizer_step: trainer.optimizer.adamw.step,
        explorer_version: ex_version,
        cursor,
        rng_seed: cfg.raw.train.seed,
        skipped_in_row,
        best,
        explorer_weights: false,
        lora_dropout_draws: trainer.model.lora_dropout_draws().unwrap_or(0),
        world_size: world_size as u64,
    };
    let (m, v) = match gathered {
        Some(f) => (&f.m[..], &f.v[..]),
        None => trainer.optimizer.adamw.moments(),
    };
    let masters = match gathered {
        Some(f) => &f.masters[..],
        None => trainer.optimizer.adamw.masters(),
    };
    let dir = save(
        run_dir,
        &st,
        &CheckpointParts {
            model: &trainer.model,
            tokenizer,
            moments: (m, v),
            masters,
            explorer: ex_model,
            buffer,
            inputs: run_inputs(cfg),
        },
    )?;
    rotate(run_dir, cfg.raw.train.keep_last, best.map(|b| b.1))?;
    Ok(dir)
}
