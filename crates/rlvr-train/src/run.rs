//! The run loop: one trainer step after another through the stages of the pipeline, under the
//! staleness regime of DESIGN.md section 3, with metrics, evaluation, checkpoints and resume.
//!
//! Stages (one module each): prompt source ([`crate::source`]) → explorer ([`crate::explorer`],
//! sampling through the [`rlvr_rollout::Rollout`] boundary) → staleness and sync schedule
//! ([`crate::schedule`]) → trainer update ([`crate::trainer`]) → optimizer step
//! ([`crate::optimizer`]) → evaluator ([`crate::eval`]) → checkpoint ([`crate::checkpoint`]).
//!
//! One code path for every regime: the batch of step t is sampled by the weights of version
//! s(t) = v·⌊(t−1−o)/v⌋ (0 while t−1 < o), so staleness = (t−1) − s(t) ∈ [o, o+v−1] (paper A,
//! arXiv 2505.22257, off-policy GRPO, is o = 0). The explorer runs inline when o = 0
//! (deterministic and exactly resumable) and on its own thread when o ≥ 1, where the trainer
//! publishes its weights after every step that is a multiple of v and the explorer waits for
//! version s(t) before sampling batch t. Both give the same batches (the explorer's input is the
//! weights, the data cursor and the seed); only the timing differs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use rlvr_model::checkpoint::Policy;
use rlvr_model::{Model, TokenizerBundle};
use serde_json::json;

use crate::checkpoint;
use crate::config::ResolvedConfig;
use crate::eval::Evaluator;
use crate::explorer::Batch;
pub use crate::metrics::step_metrics;
use crate::metrics::{append_line, truncate_after, MetricsLine};
use crate::rundir::{progress_bar, write_run_json, LastGood};
pub use crate::schedule::{behaviour_version, filter_stale};
use crate::schedule::{build_feed, Feed};
pub use crate::source::{prepare_prompts, PreparedPrompts};
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

/// A run between set-up and shutdown: every stage's state.
struct Run<'a> {
    cfg: &'a ResolvedConfig,
    run_dir: PathBuf,
    trainer: Trainer,
    tokenizer: TokenizerBundle,
    feed: Feed,
    evaluator: Option<Evaluator>,
    /// Best held-out accuracy so far and its step.
    best: Option<(f64, u64)>,
    skipped_in_row: u32,
    last_ckpt: Option<PathBuf>,
    start: u64,
}

/// Runs (or resumes) training as `cfg` says, writing everything under `cfg.raw.output.dir`.
///
/// # Errors
/// Config, data, model and I/O errors with context; `train.max_skipped_in_row` non-finite steps in a
/// row abort with a message naming the last good checkpoint.
pub fn train(cfg: &ResolvedConfig, opts: &RunOptions) -> anyhow::Result<RunSummary> {
    // The run directory's lock (one writer) and train.log, held for the whole run (rundir.rs).
    let guard = crate::rundir::RunGuard::open(&cfg.raw.output.dir, opts.resume)?;
    guard.finish(train_locked(cfg, opts))
}

fn train_locked(cfg: &ResolvedConfig, opts: &RunOptions) -> anyhow::Result<RunSummary> {
    let mut run = Run::start(cfg, opts)?;
    let bar = progress_bar(opts.progress, run.start, cfg.raw.train.steps);
    crate::rundir::set_bar(bar.as_ref());
    // What an error after step 1 saves (rundir.rs).
    let mut good = LastGood::new(run.start, run.feed.cursor());
    let result = run.steps(opts, bar.as_ref(), &mut good);
    let result = good.save_after_error(result, |step, cursor| {
        let pos = (step, run.skipped_in_row, run.best);
        checkpoint::save_run(
            cfg,
            &run.run_dir,
            &run.trainer,
            &run.tokenizer,
            &run.feed,
            pos,
            cursor,
        )
    });
    run.feed.shutdown();
    crate::rundir::set_bar(None);
    if let Some(b) = &bar {
        b.finish();
    }
    let (steps, interrupted) = result?;
    Ok(RunSummary {
        run_dir: run.run_dir,
        steps,
        interrupted,
        last_checkpoint: run.last_ckpt,
    })
}

impl Run<'_> {
    /// The loop, one labelled line per stage (DESIGN.md section 3). Returns the last completed
    /// step and whether the stop flag ended the run.
    fn steps(
        &mut self,
        opts: &RunOptions,
        bar: Option<&indicatif::ProgressBar>,
        good: &mut LastGood,
    ) -> anyhow::Result<(u64, bool)> {
        let cfg = self.cfg;
        let c = &cfg.raw;
        let (v, max_stale, seed) = (c.sync.interval, c.sync.max_staleness, c.train.seed);
        let mut done = self.start;
        for t in (self.start + 1)..=c.train.steps {
            // explorer: the batch of step t, sampled by version s(t) (prompt source inside)
            let batch = self.feed.next(t)?;
            // staleness: drop experiences older than sync.max_staleness
            let (exps, stale) = filter_stale(batch.experiences.clone(), t, max_stale);
            // trainer update: advantages, mini-batches, micro-batches, optimizer steps
            let (lr, t0) = (cfg.lr_at(t), Instant::now());
            good.begin_update();
            let rep = self.trainer.step(&exps, t, lr, seed)?;
            let train_s = t0.elapsed().as_secs_f64();
            // evaluator (every train.eval_every steps), then metrics and the JSONL logs
            let mut line = step_metrics(t, &exps, &rep, lr, batch.sample_s, train_s);
            let is_best = self.evaluate(t, &mut line)?;
            append_line(&self.run_dir.join("metrics.jsonl"), &line.to_json())?;
            write_step_logs(&self.run_dir, t, &batch, &rep, exps.len(), stale)?;
            done = t;
            good.completed(t, self.feed.cursor());
            // sync: the explorer gets version t when v divides t (after the step counts as
            // completed, so that a failed push, e.g. to a dead vLLM server, saves step t)
            self.feed.publish(t, v, &self.trainer.model)?;
            crate::rundir::log_step(t, c.train.steps, &line);
            show_progress(bar, t, &rep, &line);
            self.check_skipped(t, &rep)?;
            // checkpoint: every train.save_every steps, at the end, at a new best, on stop
            let stop = opts.stop.load(Ordering::SeqCst);
            if self.checkpoint(t, &rep, is_best, stop)? {
                good.saved(t);
            }
            if stop {
                return Ok((done, true));
            }
            hang_if_asked(opts, t);
        }
        Ok((done, false))
    }

    /// Set-up: the run directory, the policy and optimizer state (from the latest checkpoint on
    /// resume), the reference policy, the experience source and the evaluator; evaluates the
    /// initial policy on a fresh start.
    // Long (about 110 lines) on purpose: set-up in dependency order (run directory, policy,
    // optimizer state, reference, experience source, evaluator), each piece using those before it.
    fn start<'a>(cfg: &'a ResolvedConfig, opts: &RunOptions) -> anyhow::Result<Run<'a>> {
        let c = &cfg.raw;
        let run_dir = c.output.dir.clone();
        prepare_run_dir(cfg, &run_dir, opts.resume)?;
        let device = c.model.open_device()?;
        let dtype = c.model.dtype.dtype();
        let ckpt = if opts.resume {
            checkpoint::latest(&run_dir)?
        } else {
            None
        };
        let policy_dir = ckpt.clone().unwrap_or_else(|| c.model.path.clone());
        if opts.resume && ckpt.is_none() {
            crate::rundir::say(&format!(
                "note: {} holds no checkpoint yet: --resume starts the run over from step 0",
                run_dir.display()
            ));
        }
        crate::rundir::phase(&format!(
            "loading the policy from {} ({} on {})",
            policy_dir.display(),
            c.model.dtype.name(),
            c.model.device
        ));
        let mut policy = Policy::load(&policy_dir, dtype, &device)
            .with_context(|| format!("loading the policy from {}", policy_dir.display()))?;
        crate::lora::attach(&mut policy.model, &c.model, &policy_dir, c.train.seed)?;
        crate::rundir::refuse_non_finite_policy(&policy.model, &policy_dir)?;
        let (state, moments) = match &ckpt {
            // o = 0 keeps no buffer between steps; o ≥ 1 re-samples the in-flight batches.
            Some(dir) => {
                let (st, m, v, _buffer) = checkpoint::load_state(dir, &device)?;
                (Some(st), Some((m, v)))
            }
            None => (None, None),
        };
        let start = state.as_ref().map(|s| s.step).unwrap_or(0);
        reset_logs(&run_dir, state.as_ref().map(|_| start))?;
        let reference = if cfg.algorithm.needs_reference() {
            let p = c.model.reference.as_ref().unwrap_or(&c.model.path);
            // LoRA: the base with the adapters off, sharing the policy's base weights.
            Some(
                match crate::lora::shared_reference(&policy.model, &c.model) {
                    Some(m) => m,
                    None => Model::load(p, dtype, &device).with_context(|| {
                        format!("loading the reference model from {}", p.display())
                    })?,
                },
            )
        } else {
            None
        };
        let tokenizer = policy.tokenizer;
        let settings = TrainerSettings {
            algorithm: cfg.algorithm.clone(),
            train: c.train.clone(),
            temperature: c.rollout.temperature,
            max_new_tokens: c.rollout.max_new_tokens,
            pad_id: tokenizer.pad_id,
        };
        let mut trainer = Trainer::new(policy.model, reference, settings)?;
        if let (Some((m, v)), Some(st)) = (moments, &state) {
            trainer
                .optimizer
                .adamw
                .set_moments(m, v, st.optimizer_step)?;
            trainer.model.set_lora_dropout_draws(st.lora_dropout_draws);
        }
        if let Some(dir) = &ckpt {
            // bf16 weights resume from their f32 masters (none for f32 weights).
            let n = trainer.model.named_vars().len();
            let masters = checkpoint::load_masters(dir, n, &device)?;
            trainer.optimizer.adamw.set_masters(masters)?;
        }
        // TokenizerBundle is not Clone: the explorer and the offline source load their own copy.
        let load_tok = || {
            TokenizerBundle::load(&policy_dir)
                .with_context(|| format!("loading the tokenizer of {}", policy_dir.display()))
        };
        let feed = build_feed(
            cfg,
            state.as_ref(),
            ckpt.as_deref(),
            (&trainer.model, &tokenizer),
            &load_tok,
        )?;
        let evaluator = if c.train.eval_every > 0 && c.data.experiences.is_none() {
            Some(Evaluator::from_config(c, &tokenizer)?)
        } else {
            None
        };
        let mut run = Run {
            cfg,
            run_dir,
            trainer,
            tokenizer,
            feed,
            evaluator,
            best: state.as_ref().and_then(|s| s.best),
            skipped_in_row: state.as_ref().map(|s| s.skipped_in_row).unwrap_or(0),
            last_ckpt: ckpt,
            start,
        };
        if start == 0 && run.evaluator.is_some() {
            let mut line = MetricsLine::new(0);
            run.evaluate(0, &mut line)?;
            append_line(&run.run_dir.join("metrics.jsonl"), &line.to_json())?;
        }
        Ok(run)
    }

    /// At step 0 and every `train.eval_every` steps: evaluates the policy, adds `eval/*` to `line`,
    /// appends eval.jsonl. Returns whether this is the best accuracy so far (step 0 sets the first
    /// best without counting as one).
    fn evaluate(&mut self, t: u64, line: &mut MetricsLine) -> anyhow::Result<bool> {
        let every = self.cfg.raw.train.eval_every;
        let Some(ev) = &self.evaluator else {
            return Ok(false);
        };
        if t > 0 && (every == 0 || !t.is_multiple_of(every)) {
            return Ok(false);
        }
        crate::rundir::phase(&format!(
            "evaluating step {t} on {} held-out problems ({} new tokens at most)",
            ev.texts.len(),
            self.cfg.raw.rollout.max_new_tokens
        ));
        let r = ev.record(&self.trainer.model, &self.tokenizer, t, &self.run_dir)?;
        for (k, v) in r.metrics() {
            line.set_value(k, v);
        }
        if t == 0 {
            self.best = Some((r.accuracy, 0));
            return Ok(false);
        }
        let better = self.best.is_none_or(|b| r.accuracy > b.0);
        if better {
            self.best = Some((r.accuracy, t));
        }
        Ok(better)
    }

    /// Counts non-finite (skipped) steps in a row and stops at `train.max_skipped_in_row`.
    fn check_skipped(&mut self, t: u64, rep: &StepReport) -> anyhow::Result<()> {
        self.skipped_in_row = if rep.skipped {
            self.skipped_in_row + 1
        } else {
            0
        };
        if self.skipped_in_row >= self.cfg.raw.train.max_skipped_in_row {
            bail!(
                "{} steps in a row (the last: step {t}) had a non-finite loss or gradient; \
                 stopping. The last good checkpoint is {}. Lower train.lr, set train.grad_clip, or check \
                 the rewards and behaviour log-probs of the data",
                self.skipped_in_row,
                self.last_ckpt
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "none (no checkpoint was written yet)".into())
            );
        }
        Ok(())
    }

    /// Saves a checkpoint when one is due: every `train.save_every` steps, at the last step, at a
    /// new best evaluation, and when stopping. A skipped step writes none: the last one stays the
    /// last good one. Returns whether a checkpoint was written.
    fn checkpoint(
        &mut self,
        t: u64,
        rep: &StepReport,
        is_best: bool,
        stop: bool,
    ) -> anyhow::Result<bool> {
        let cfg = self.cfg;
        let tr = &cfg.raw.train;
        let due = !rep.skipped
            && ((tr.save_every > 0 && t.is_multiple_of(tr.save_every))
                || t == tr.steps
                || is_best
                || stop);
        if due {
            let pos = (t, self.skipped_in_row, self.best);
            crate::rundir::phase(&format!("saving checkpoint step-{t}"));
            let dir = checkpoint::save_run(
                cfg,
                &self.run_dir,
                &self.trainer,
                &self.tokenizer,
                &self.feed,
                pos,
                self.feed.cursor(),
            )?;
            self.last_ckpt = Some(dir);
            if is_best {
                checkpoint::mark_best(&self.run_dir, t)?;
            }
        }
        Ok(due)
    }
}

/// Creates the run directory (refusing one that holds a run unless resuming), prints the config
/// warnings and writes config.toml and run.json.
fn prepare_run_dir(cfg: &ResolvedConfig, run_dir: &Path, resume: bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(run_dir)
        .with_context(|| format!("creating run directory {}", run_dir.display()))?;
    let metrics_path = run_dir.join("metrics.jsonl");
    if !resume && metrics_path.exists() && std::fs::metadata(&metrics_path)?.len() > 0 {
        bail!(
            "{} already holds a run; continue it with `rlvr train --resume {}` or choose another output.dir",
            run_dir.display(),
            run_dir.display()
        );
    }
    for w in &cfg.warnings {
        crate::rundir::say(&format!("warning: {w}"));
    }
    rlvr_model::weights::atomic_write(&run_dir.join("config.toml"), cfg.to_toml()?.as_bytes())?;
    write_run_json(run_dir, cfg.raw.train.seed, resume)
}

/// On resume from a checkpoint at step `resumed`, cuts the JSONL logs after that step; without a
/// checkpoint, removes what an earlier (lost) run wrote.
fn reset_logs(run_dir: &Path, resumed: Option<u64>) -> anyhow::Result<()> {
    for f in [
        "metrics.jsonl",
        "rollouts.jsonl",
        "eval.jsonl",
        "diagnostics.jsonl",
    ] {
        let path = run_dir.join(f);
        if let Some(start) = resumed {
            truncate_after(&path, start)?;
        } else if path.exists() {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

fn show_progress(
    bar: Option<&indicatif::ProgressBar>,
    t: u64,
    rep: &StepReport,
    line: &MetricsLine,
) {
    if let Some(b) = bar {
        b.set_position(t);
        b.set_message(format!(
            "loss {:.4} reward {:.3}",
            rep.loss.as_ref().map(|l| l.loss).unwrap_or(f64::NAN),
            line.get("reward/mean")
                .and_then(|v| v.as_f64())
                .unwrap_or(f64::NAN)
        ));
    }
}

/// The SIGKILL-resume test hook ([`RunOptions::hang_after_step`]).
fn hang_if_asked(opts: &RunOptions, t: u64) {
    let hang = opts.hang_after_step.or_else(|| {
        std::env::var("RLVR_DEBUG_HANG_AFTER_STEP")
            .ok()
            .and_then(|s| s.parse().ok())
    });
    if hang == Some(t) {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Appends the step's rollouts.jsonl and diagnostics.jsonl lines.
fn write_step_logs(
    run_dir: &Path,
    t: u64,
    batch: &Batch,
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
        "logprob_k3/staleness0": rep.logprob_k3_s0,
        "clip_frac/adv_pos": rep.loss.as_ref().and_then(|l| l.clip_frac_adv_pos),
        "clip_frac/adv_neg": rep.loss.as_ref().and_then(|l| l.clip_frac_adv_neg),
        "dynamic_sampling/dropped_groups": batch.dropped_groups,
        "dynamic_sampling/short_groups": batch.short_groups,
        "stale_dropped": dropped_stale,
        "updates": rep.updates,
        "rows": rows,
        "rows_skipped_zero_gradient": rep.rows_skipped,
    });
    append_line(&run_dir.join("diagnostics.jsonl"), &diag.to_string())
}
