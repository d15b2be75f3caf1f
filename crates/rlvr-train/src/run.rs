//! The training run: run directory, explorer/trainer orchestration under the staleness regime of
//! DESIGN.md section 3, metrics, evaluation, checkpoints and resume.
//!
//! One code path for every regime: the batch of step t is sampled by the weights of version
//! s(t) = v·⌊(t−1−o)/v⌋ (0 while t−1 < o), so staleness = (t−1) − s(t) ∈ [o, o+v−1]. The explorer
//! runs inline when o = 0 (deterministic and exactly resumable) and on its own thread when o ≥ 1,
//! where the trainer publishes its weights after every step that is a multiple of v and the explorer
//! waits for version s(t) before sampling batch t. Both give the same batches (the explorer's input
//! is the weights, the data cursor and the seed); only the timing differs.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use candle_core::DType;
use rlvr_data::config::PromptStyle;
use rlvr_data::dataset::prepare_split;
use rlvr_data::generate::Split;
use rlvr_data::sampler::PromptSampler;
use rlvr_data::ChatMessage;
use rlvr_model::checkpoint::Policy;
use rlvr_model::{Message, Model, TokenizerBundle};
use rlvr_reward::combine::RewardFunction;
use rlvr_rollout::SamplingParams;
use serde_json::json;

use crate::checkpoint::{self, CheckpointParts, TrainerState};
use crate::config::ResolvedConfig;
use crate::eval::{evaluate, EvalSettings};
use crate::experience::{groups_in_order, read_experiences};
use crate::explorer::{Explorer, ExplorerSettings, OfflineSource, SourceCursor};
pub use crate::feed::{behaviour_version, filter_stale};
use crate::feed::{spawn_explorer, Feed};
pub use crate::metrics::step_metrics;
use crate::metrics::{append_line, truncate_after, MetricsLine};
use crate::rundir::{progress_bar, write_run_json};
use crate::trainer::{StepReport, Trainer, TrainerSettings};

/// Options of a run that are not part of the config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Continue the run in the run directory from its latest checkpoint.
    pub resume: bool,
    /// Show a progress bar (only drawn when stderr is a terminal).
    pub progress: bool,
    /// Set (e.g. by Ctrl-C) to save a checkpoint and stop after the current step.
    pub stop: Arc<AtomicBool>,
    /// Test hook: stop making progress (sleep forever) after this step's metrics are written, so a
    /// test can SIGKILL the process at a known point. Also read from `RLVR_DEBUG_HANG_AFTER_STEP`.
    pub hang_after_step: Option<u64>,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// RUN_DIR.
    pub run_dir: PathBuf,
    /// Completed steps.
    pub steps: u64,
    /// True when stopped early by the stop flag (Ctrl-C).
    pub interrupted: bool,
    /// Last checkpoint written.
    pub last_checkpoint: Option<PathBuf>,
}

/// A train or test split as prompt texts and verifier references.
pub struct PreparedPrompts {
    /// Rendered prompt texts.
    pub texts: Vec<String>,
    /// Reference of each prompt.
    pub references: Vec<String>,
}

/// Loads and renders a split of `[data]` with the policy tokenizer (chat template, token counter).
///
/// # Errors
/// Data errors (files, templates, all prompts filtered).
pub fn prepare_prompts(
    cfg: &rlvr_data::config::DataConfig,
    split: Split,
    tok: &TokenizerBundle,
) -> anyhow::Result<PreparedPrompts> {
    let render = |msgs: &[ChatMessage], gen: bool| -> anyhow::Result<String> {
        let m: Vec<Message> = msgs
            .iter()
            .map(|m| Message::new(&m.role, &m.content))
            .collect();
        Ok(tok.apply_chat_template(&m, gen)?)
    };
    let count = |t: &str| -> anyhow::Result<usize> { Ok(tok.encode(t, true)?.len()) };
    let prep = prepare_split(cfg, split, Some(&render), Some(&count))
        .map_err(|e| anyhow::anyhow!("[data] {split:?} split: {e}"))?;
    if prep.prompts.dropped > 0 {
        eprintln!(
            "note: {} {split:?} prompts longer than data.max_prompt_len were dropped",
            prep.prompts.dropped
        );
    }
    Ok(PreparedPrompts {
        references: prep
            .prompts
            .prompts
            .iter()
            .map(|p| prep.dataset.problems[p.problem].reference.clone())
            .collect(),
        texts: prep.prompts.prompts.into_iter().map(|p| p.text).collect(),
    })
}

/// Runs (or resumes) training as `cfg` says, writing everything under `cfg.raw.output.dir`.
///
/// # Errors
/// Config, data, model and I/O errors with context; `train.max_skipped_in_row` non-finite steps in a
/// row abort with a message naming the last good checkpoint.
// Note: `train` is long (set-up, then the loop); the loop body reads in the order of DESIGN.md
// section 3 (sample, filter, train, sync, log, evaluate, checkpoint) and delegates each stage.
pub fn train(cfg: &ResolvedConfig, opts: &RunOptions) -> anyhow::Result<RunSummary> {
    let c = &cfg.raw;
    let run_dir = c.output.dir.clone();
    std::fs::create_dir_all(&run_dir)
        .with_context(|| format!("creating run directory {}", run_dir.display()))?;
    let metrics_path = run_dir.join("metrics.jsonl");
    if !opts.resume && metrics_path.exists() && std::fs::metadata(&metrics_path)?.len() > 0 {
        bail!(
            "{} already holds a run; continue it with `rlvr train --resume {}` or choose another output.dir",
            run_dir.display(),
            run_dir.display()
        );
    }
    for w in &cfg.warnings {
        eprintln!("warning: {w}");
    }
    rlvr_model::weights::atomic_write(&run_dir.join("config.toml"), cfg.to_toml()?.as_bytes())?;
    write_run_json(&run_dir, c.train.seed, opts.resume)?;

    let device = c.model.open_device()?;
    let dtype = c.model.dtype.dtype();
    let ckpt = if opts.resume {
        checkpoint::latest(&run_dir)?
    } else {
        None
    };
    let policy_dir = ckpt.clone().unwrap_or_else(|| c.model.path.clone());
    let policy = Policy::load(&policy_dir, dtype, &device)
        .with_context(|| format!("loading the policy from {}", policy_dir.display()))?;
    let (state, moments, buffer) = match &ckpt {
        Some(dir) => {
            let (st, m, v, buf) = checkpoint::load_state(dir, &device)?;
            (Some(st), Some((m, v)), buf)
        }
        None => (None, None, Vec::new()),
    };
    let start = state.as_ref().map(|s| s.step).unwrap_or(0);
    for f in [
        "metrics.jsonl",
        "rollouts.jsonl",
        "eval.jsonl",
        "diagnostics.jsonl",
    ] {
        let path = run_dir.join(f);
        if state.is_some() {
            truncate_after(&path, start)?;
        } else if path.exists() {
            // A resume without any checkpoint starts over: drop what the lost run wrote.
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    let reference = if cfg.algorithm.needs_reference() {
        let p = c
            .model
            .reference
            .clone()
            .unwrap_or_else(|| c.model.path.clone());
        Some(
            Model::load(&p, dtype, &device)
                .with_context(|| format!("loading the reference model from {}", p.display()))?,
        )
    } else {
        None
    };
    let tokenizer = policy.tokenizer;
    // TokenizerBundle is not Clone: the explorer and the offline source load their own copy.
    let load_tok = || {
        TokenizerBundle::load(&policy_dir)
            .with_context(|| format!("loading the tokenizer of {}", policy_dir.display()))
    };
    let settings = TrainerSettings {
        algorithm: cfg.algorithm.clone(),
        train: c.train.clone(),
        temperature: c.rollout.temperature,
        max_new_tokens: c.rollout.max_new_tokens,
        pad_id: tokenizer.pad_id,
    };
    let mut trainer = Trainer::new(policy.model, reference, settings)?;
    if let (Some((m, v)), Some(st)) = (moments, &state) {
        trainer.optimizer.set_moments(m, v, st.optimizer_step)?;
    }
    if let Some(dir) = &ckpt {
        let n = trainer.model.named_vars().len();
        let masters = checkpoint::load_masters(dir, n, &device)?;
        trainer.optimizer.set_masters(masters)?;
    }

    // The experience source.
    let mut feed = build_feed(
        cfg,
        state.as_ref(),
        ckpt.as_deref(),
        &tokenizer,
        &load_tok,
        (dtype, &device),
    )?;
    // o = 0 keeps no buffer between steps; o ≥ 1 re-samples the in-flight batches after a resume.
    drop(buffer);

    // Held-out evaluation.
    let evaluator = Evaluator::new(cfg, &tokenizer)?;
    let mut best = state.as_ref().and_then(|s| s.best);
    let run_eval = |model: &Model, step: u64, line: &mut MetricsLine| {
        evaluator.run(model, &tokenizer, step, line, &run_dir)
    };
    if start == 0 && evaluator.enabled() {
        let mut line = MetricsLine::new(0);
        if let Some(acc) = run_eval(&trainer.model, 0, &mut line)? {
            best = Some((acc, 0));
        }
        append_line(&metrics_path, &line.to_json())?;
    }

    // The loop.
    let bar = progress_bar(opts.progress, start, c.train.steps);
    let hang = opts.hang_after_step.or_else(|| {
        std::env::var("RLVR_DEBUG_HANG_AFTER_STEP")
            .ok()
            .and_then(|s| s.parse().ok())
    });
    let mut skipped_in_row = state.as_ref().map(|s| s.skipped_in_row).unwrap_or(0);
    let mut last_ckpt = ckpt.clone();
    let mut interrupted = false;
    let mut done = start;
    let save = |trainer: &Trainer, feed: &Feed, step: u64, skipped: u32, best| {
        save_checkpoint(
            cfg,
            &run_dir,
            trainer,
            &tokenizer,
            feed,
            (step, skipped, best),
        )
    };
    let result = (|| -> anyhow::Result<()> {
        for t in (start + 1)..=c.train.steps {
            // Explorer: the batch of step t, sampled by version s(t).
            let batch = feed.next(t)?;
            let (exps, dropped_stale) =
                filter_stale(batch.experiences.clone(), t, c.sync.max_staleness);
            // Trainer: advantages, updates.
            let lr = cfg.lr_at(t);
            let t1 = Instant::now();
            let rep = trainer.step(&exps, t, lr, c.train.seed)?;
            let train_s = t1.elapsed().as_secs_f64();
            feed.publish(t, c.sync.interval, &trainer.model)?;
            // Metrics.
            let mut line = step_metrics(t, &exps, &rep, lr, batch.sample_s, train_s);
            skipped_in_row = if rep.skipped { skipped_in_row + 1 } else { 0 };
            let mut is_best = false;
            if c.train.eval_every > 0 && t % c.train.eval_every == 0 {
                if let Some(acc) = run_eval(&trainer.model, t, &mut line)? {
                    if best.is_none_or(|b| acc > b.0) {
                        best = Some((acc, t));
                        is_best = true;
                    }
                }
            }
            append_line(&metrics_path, &line.to_json())?;
            write_step_logs(&run_dir, t, &batch, &rep, exps.len(), dropped_stale)?;
            done = t;
            if let Some(b) = &bar {
                b.set_position(t);
                b.set_message(format!(
                    "loss {:.4} reward {:.3}",
                    rep.loss.as_ref().map(|l| l.loss).unwrap_or(f64::NAN),
                    line.get("reward/mean")
                        .and_then(|v| v.as_f64())
                        .unwrap_or(f64::NAN)
                ));
            }
            if skipped_in_row >= c.train.max_skipped_in_row {
                bail!(
                    "{skipped_in_row} steps in a row (the last: step {t}) had a non-finite loss or gradient; \
                     stopping. The last good checkpoint is {}. Lower train.lr, set train.grad_clip, or check \
                     the rewards and behaviour log-probs of the data",
                    last_ckpt
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "none (no checkpoint was written yet)".into())
                );
            }
            let stop = opts.stop.load(Ordering::SeqCst);
            // A skipped step writes no checkpoint: the last one stays the last good one.
            let due = !rep.skipped
                && ((c.train.save_every > 0 && t % c.train.save_every == 0)
                    || t == c.train.steps
                    || is_best
                    || stop);
            if due {
                last_ckpt = Some(save(&trainer, &feed, t, skipped_in_row, best)?);
                if is_best {
                    checkpoint::mark_best(&run_dir, t)?;
                }
            }
            if stop {
                interrupted = true;
                break;
            }
            if hang == Some(t) {
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
        }
        Ok(())
    })();
    feed.shutdown();
    if let Some(b) = &bar {
        b.finish();
    }
    result?;
    Ok(RunSummary {
        run_dir,
        steps: done,
        interrupted,
        last_checkpoint: last_ckpt,
    })
}

/// Held-out evaluation during training (`eval/*` metrics and eval.jsonl).
struct Evaluator {
    set: Option<(PreparedPrompts, RewardFunction)>,
    settings: EvalSettings,
    task: &'static str,
}

impl Evaluator {
    fn new(cfg: &ResolvedConfig, tokenizer: &TokenizerBundle) -> anyhow::Result<Self> {
        let c = &cfg.raw;
        let set = if c.train.eval_every > 0 && c.data.experiences.is_none() {
            let mut p = prepare_prompts(&c.data, Split::Test, tokenizer)?;
            if let Some(n) = c.eval.limit {
                p.texts.truncate(n);
                p.references.truncate(n);
            }
            let reward = RewardFunction::from_config(&c.reward, &c.data.verifier()?)?;
            Some((p, reward))
        } else {
            None
        };
        Ok(Evaluator {
            set,
            settings: EvalSettings {
                samples: c.eval.samples,
                max_new_tokens: c.eval.max_new_tokens.unwrap_or(c.rollout.max_new_tokens),
                seed: c.train.seed,
                max_batch_rows: c.rollout.max_batch_rows,
                stop: c.rollout.stop.clone(),
                add_special_tokens: c.data.style == PromptStyle::Plain,
            },
            task: c.data.task.name(),
        })
    }

    fn enabled(&self) -> bool {
        self.set.is_some()
    }

    /// Evaluates `model`, adds `eval/*` to `line`, appends to eval.jsonl; returns the accuracy.
    fn run(
        &self,
        model: &Model,
        tokenizer: &TokenizerBundle,
        step: u64,
        line: &mut MetricsLine,
        run_dir: &std::path::Path,
    ) -> anyhow::Result<Option<f64>> {
        let Some((p, reward)) = &self.set else {
            return Ok(None);
        };
        let (r, _) = evaluate(
            model,
            tokenizer,
            self.task,
            &p.texts,
            &p.references,
            reward,
            &self.settings,
        )?;
        line.set("eval/accuracy", Some(r.accuracy));
        line.set("eval/mean@k", Some(r.mean_at_k));
        line.set("eval/pass@k", Some(r.pass_at_k));
        line.set("eval/n", Some(r.n as f64));
        let mut e = serde_json::to_value(&r)?;
        e["step"] = json!(step);
        append_line(&run_dir.join("eval.jsonl"), &e.to_string())?;
        Ok(Some(r.accuracy))
    }
}

/// Writes checkpoint `step-N` (policy, optimizer moments, explorer version and, when it differs from
/// the policy's, the explorer's weights, the source cursor) and rotates old ones.
fn save_checkpoint(
    cfg: &ResolvedConfig,
    run_dir: &std::path::Path,
    trainer: &Trainer,
    tokenizer: &TokenizerBundle,
    feed: &Feed,
    (step, skipped_in_row, best): (u64, u32, Option<(f64, u64)>),
) -> anyhow::Result<PathBuf> {
    let (ex_version, ex_model) = match feed {
        Feed::Inline(e) => (e.version, (e.version != step).then_some(&e.model)),
        _ => (step, None),
    };
    let st = TrainerState {
        step,
        optimizer_step: trainer.optimizer.step,
        explorer_version: ex_version,
        cursor: feed.cursor(),
        rng_seed: cfg.raw.train.seed,
        skipped_in_row,
        best,
        explorer_weights: false,
    };
    let (m, v) = trainer.optimizer.moments();
    let dir = checkpoint::save(
        run_dir,
        &st,
        &CheckpointParts {
            model: &trainer.model,
            tokenizer,
            moments: (m, v),
            masters: trainer.optimizer.masters(),
            explorer: ex_model,
            buffer: &[],
        },
    )?;
    checkpoint::rotate(run_dir, cfg.raw.train.keep_last, best.map(|b| b.1))?;
    Ok(dir)
}

/// Appends the step's rollouts.jsonl and diagnostics.jsonl lines.
fn write_step_logs(
    run_dir: &std::path::Path,
    t: u64,
    batch: &crate::explorer::Batch,
    rep: &StepReport,
    rows: usize,
    dropped_stale: usize,
) -> anyhow::Result<()> {
    for r in &batch.rollouts {
        let mut v = serde_json::to_value(r)?;
        v["step"] = json!(t);
        v["staleness"] = json!(r.version.map(|ver| (t - 1).saturating_sub(ver)));
        append_line(&run_dir.join("rollouts.jsonl"), &v.to_string())?;
    }
    let diag = json!({
        "step": t,
        "logprob_diff/staleness0": rep.logprob_diff_s0,
        "clip_frac/adv_pos": rep.loss.as_ref().and_then(|l| l.clip_frac_adv_pos),
        "clip_frac/adv_neg": rep.loss.as_ref().and_then(|l| l.clip_frac_adv_neg),
        "dynamic_sampling/dropped_groups": batch.dropped_groups,
        "stale_dropped": dropped_stale,
        "updates": rep.updates,
        "rows": rows,
        "rows_skipped_zero_gradient": rep.rows_skipped,
    });
    append_line(&run_dir.join("diagnostics.jsonl"), &diag.to_string())
}

/// Builds the experience source: the offline file, or the explorer (inline for o = 0, on its own
/// thread for o ≥ 1) at the checkpoint's cursor and explorer weights.
fn build_feed(
    cfg: &ResolvedConfig,
    state: Option<&TrainerState>,
    ckpt: Option<&std::path::Path>,
    tokenizer: &TokenizerBundle,
    load_tok: &dyn Fn() -> anyhow::Result<TokenizerBundle>,
    (dtype, device): (DType, &candle_core::Device),
) -> anyhow::Result<Feed> {
    let c = &cfg.raw;
    let (v, o) = (c.sync.interval, c.sync.offset);
    let start = state.map(|s| s.step).unwrap_or(0);
    let add_special_tokens = c.data.style == PromptStyle::Plain;
    Ok(if let Some(path) = &c.data.experiences {
        let groups = groups_in_order(read_experiences(path)?);
        let consumed = match state.map(|s| s.cursor) {
            Some(SourceCursor::Offline { groups }) => groups,
            _ => 0,
        };
        Feed::Offline(OfflineSource::new(
            groups,
            consumed,
            c.data.prompts_per_step,
            Some(load_tok()?),
            c.train.log_rollouts,
        )?)
    } else {
        let train_p = prepare_prompts(&c.data, Split::Train, tokenizer)?;
        let sampler = match state.map(|s| s.cursor) {
            Some(SourceCursor::Online { cursor }) => {
                PromptSampler::resume(cursor, train_p.texts.len())?
            }
            _ => PromptSampler::new(train_p.texts.len(), c.data.seed)?,
        };
        let verifier = c.data.verifier()?;
        let reward = RewardFunction::from_config(&c.reward, &verifier)?;
        let (ex_dir, ex_version) = match (state, ckpt) {
            (Some(st), Some(dir)) if st.explorer_weights => {
                (dir.join("trainer_state/explorer"), st.explorer_version)
            }
            (Some(st), Some(dir)) => (dir.to_path_buf(), st.step),
            _ => (c.model.path.clone(), 0),
        };
        let ex_model = Model::load(&ex_dir, dtype, device)
            .with_context(|| format!("loading the explorer weights from {}", ex_dir.display()))?;
        let mut stop_ids = tokenizer.eos_ids.clone();
        stop_ids.sort_unstable();
        stop_ids.dedup();
        let explorer = Explorer::new(
            ex_model,
            ex_version,
            load_tok()?,
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
                recompute_behaviour: c.train.recompute_behaviour,
                micro_batch_size: c.train.micro_batch_size,
                log_rollouts: c.train.log_rollouts,
                add_special_tokens,
            },
        )?;
        if o == 0 {
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
        }
    })
}
