//! The checkpoint stage of a run: composes the stages' own records (the trainer's
//! [`TrainerRecord`], the feed's [`FeedState`], the best evaluation, the run's position) into the
//! format [`crate::store::checkpoint`] writes; the resume side is `setup.rs`, which hands each
//! stage its record back.

use std::path::{Path, PathBuf};

use rlvr_model::{Model, TokenizerBundle};

use crate::config::ResolvedConfig;
use crate::feed::FeedState;
use crate::store::checkpoint::{rotate, save, CheckpointParts, TrainerState};
use crate::update::TrainerRecord;

/// Where the run itself stands (its own record): the last completed step and the non-finite
/// steps in a row before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    /// Completed trainer steps (= policy version).
    pub step: u64,
    /// Skipped (non-finite) steps in a row at this point.
    pub skipped_in_row: u32,
}

/// Everything a checkpoint of the run records, each part as its stage gave it.
pub(crate) struct Records<'a> {
    /// The run's position.
    pub position: Position,
    /// The trainer's optimizer state and LoRA-dropout round.
    pub trainer: TrainerRecord,
    /// The best held-out accuracy so far and its step (the evaluator's record).
    pub best: Option<(f64, u64)>,
    /// The feed's cursor, explorer and in-flight batches.
    pub feed: FeedState<'a>,
    /// Data-parallel ranks of the run.
    pub world_size: usize,
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

/// Writes checkpoint `step-N` of the run (`model`'s weights with its tokenizer, and `records`)
/// and rotates old ones (`train.keep_last`, the best kept). Data parallel, rank 0 alone calls it
/// (every rank holds the same weights; a sharded optimizer's record was gathered to rank 0).
/// The caller has checked that every weight is finite.
///
/// # Errors
/// I/O errors.
pub(crate) fn save_run(
    cfg: &ResolvedConfig,
    run_dir: &Path,
    model: &Model,
    tokenizer: &TokenizerBundle,
    records: Records,
) -> anyhow::Result<PathBuf> {
    let Records {
        position,
        trainer,
        best,
        feed,
        world_size,
    } = records;
    let st = TrainerState {
        step: position.step,
        optimizer_step: trainer.optimizer_step,
        explorer_version: feed.explorer_version,
        cursor: feed.cursor,
        rng_seed: cfg.raw.train.seed,
        skipped_in_row: position.skipped_in_row,
        best,
        explorer_weights: false,
        lora_dropout_round: trainer.lora_dropout_round,
        world_size: world_size as u64,
        optimizer_saved: cfg.raw.train.save_optimizer,
    };
    let dir = save(
        run_dir,
        &st,
        &CheckpointParts {
            model,
            tokenizer,
            optimizer: cfg.raw.train.save_optimizer.then_some(&trainer.optimizer),
            explorer: feed.explorer,
            buffer: &feed.buffer,
            inputs: run_inputs(cfg),
        },
    )?;
    rotate(run_dir, cfg.raw.train.keep_last, best.map(|b| b.1))?;
    Ok(dir)
}
