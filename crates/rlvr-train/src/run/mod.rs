//! The run loop: one trainer step after another through the stages of the pipeline, under the
//! staleness regime of DESIGN.md section 3, with metrics, evaluation, checkpoints and resume.
//!
//! Stages: feed ([`crate::feed`]: prompts, the explorer sampling through the
//! [`rlvr_rollout::Rollout`] boundary, the staleness rule) → trainer update ([`crate::update`]:
//! advantages, micro-batches, the optimizer step) → evaluator ([`crate::eval`]) → checkpoint
//! ([`save`], in [`crate::store::checkpoint`]'s format). [`setup`] builds them from the config;
//! [`guard`] holds the run directory and saves what was done after an error; [`report`] writes
//! each step's lines; [`signals`] turns Ctrl-C into a checkpoint.
//!
//! Architecture invariant: this folder, `config/` and `cli.rs` are the only places that name the
//! whole config; the loop below is one screen, one labelled line per stage.
//!
//! One code path for every regime: the batch of step t is sampled by the weights of version
//! s(t) = v·⌊(t−1−o)/v⌋ (0 while t−1 < o), so staleness = (t−1) − s(t) ∈ [o, o+v−1] (paper A,
//! arXiv 2505.22257, off-policy GRPO, is o = 0). The explorer runs inline when o = 0
//! (deterministic and exactly resumable) and on its own thread when o ≥ 1, where the trainer
//! publishes its weights after every step that is a multiple of v and the explorer waits for
//! version s(t) before sampling batch t. Both give the same batches (the explorer's input is the
//! weights, the data cursor and the seed); only the timing differs.

mod guard;
mod memory;
mod preflight;
pub mod report;
pub(crate) mod same_config;
mod save;
mod setup;
pub(crate) mod signals;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;
use rlvr_model::TokenizerBundle;

use crate::config::ResolvedConfig;
use crate::eval::{Best, Evaluator};
use crate::feed::{filter_stale, Feed, InFlight, Next, StopFound};
use crate::job::Job;
use crate::log::progress_bar;
use crate::store::checkpoint::{self, SourceCursor};
use crate::store::metrics::{append_line, MetricsLine};
use crate::store::state::Stateful;
use crate::store::tensorboard::{EventWriter, Source};
use crate::update::optimizer::NonFiniteWeight;
use crate::update::{StepReport, Trainer};
use guard::LastGood;
use report::{eval_text, show_progress, step_metrics, step_text, write_step_logs};
use save::save_run;

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
    /// Test hook: the trainer's update of this step fails with an error before it changes any
    /// weight (as an out-of-memory forward would), so a test can check the save after it. Also
    /// read from `RLVR_DEBUG_FAIL_UPDATE_AT_STEP` (`T`, or `R:T` for rank R alone).
    pub fail_update_at_step: Option<u64>,
    /// Test hook: `(R, T)` makes rank R's evaluation of step T fail after its counts were summed,
    /// as a failed write of rank 0's eval.jsonl would (an evaluation error of one rank alone).
    pub fail_eval_at: Option<(usize, u64)>,
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
    best: Best,
    skipped_in_row: u32,
    last_ckpt: Option<PathBuf>,
    start: u64,
    /// The TensorBoard event file (`output.tensorboard`).
    tb: Option<EventWriter>,
    /// When the first step of this process began (elapsed time and ETA of the console lines).
    began: Instant,
    /// Steps in a row without learning signal, and with one reward for the whole batch.
    no_signal: (u64, u64),
    /// The job: one process, or this rank of a data-parallel run.
    job: Job,
    /// The stop flag (Ctrl-C, SIGTERM) as the waits for the explorer thread watch it: a wait
    /// ends when it is set ([`Feed::next`], [`Feed::state`]). `None` under data parallel, where
    /// the ranks decide together after each step.
    stop: Option<Arc<AtomicBool>>,
}

/// Runs (or resumes) training as `cfg` says, writing everything under `cfg.raw.output.dir`.
///
/// Launched by `mpirun`, `srun --mpi=pmix` or torchrun (rank and world size read from the
/// launcher's environment, [`Job::launch`]), every process is one rank of a data-parallel run
/// ([`train_on`]); `model.device = "cuda"` then means `cuda:{local rank}`.
///
/// # Errors
/// Config, data, model and I/O errors with context; `train.max_skipped_in_row` non-finite steps in a
/// row abort with a message naming the step whose weights the run still has and its last
/// checkpoint (the save after the error then writes the last skipped step's state); a launcher environment that
/// contradicts itself; a world size above 1 in a build without the `mpi` feature.
pub fn train(cfg: &ResolvedConfig, opts: &RunOptions) -> anyhow::Result<RunSummary> {
    let d = &cfg.raw.distributed;
    let (job, device) = Job::launch(&cfg.raw.model.device.to_string(), d.backend.into(), || {
        d.timeout()
    })?;
    let Some(device) = device else {
        return train_on(cfg, opts, job);
    };
    let mut cfg = cfg.clone();
    cfg.raw.model.device = device
        .parse()
        .map_err(|e| anyhow::anyhow!("model.device {device:?} for rank {}: {e}", job.rank()))?;
    train_on(&cfg, opts, job)
}

/// [`train`] as one rank of `job` ([`Job::single`]: one process).
///
/// Data parallel (ARCHITECTURE.md, "Data parallel"): every rank draws the same prompts, samples and scores
/// its share of the groups and gathers the rest, so every rank holds the whole batch; the trainer
/// trains the rank's share of the groups and sums the gradients over the ranks, with the
/// advantages and normalisers of the whole batch; evaluation is split and its counts summed.
/// Rank 0 alone writes the run directory (lock, train.log, JSONL files, TensorBoard, checkpoints);
/// rank r > 0 writes only `RUN/ranks/rank-r.log`. Every metric is the whole batch's, so rank 0's
/// lines are the one-process lines within rounding (timings: the slowest rank's).
///
/// # Errors
/// As [`train`]; a failed collective (a rank that died or hung: named after
/// `RLVR_DIST_TIMEOUT_S`).
pub fn train_on(cfg: &ResolvedConfig, opts: &RunOptions, job: Job) -> anyhow::Result<RunSummary> {
    let dir = &cfg.raw.output.dir;
    let mut j = job.clone();
    // Rank 0 takes the directory (its lock and train.log, held for the whole run) first; the
    // others learn whether it could. Before that, every rank checks that it runs rank 0's config.
    let res = (|| {
        same_config::check(cfg, &mut j)?;
        let what = format!("open the run directory {}", dir.display());
        let guard = match j.rank0_tries(&what, || guard::RunGuard::open(dir, opts.resume))? {
            Some(g) => g,
            None => guard::RunGuard::open_rank(dir, j.rank(), j.world())?,
        };
        guard.finish(train_locked(cfg, opts, job))
    })();
    j.leave_on_error(res)
}

fn train_locked(cfg: &ResolvedConfig, opts: &RunOptions, job: Job) -> anyhow::Result<RunSummary> {
    let writer = job.writer();
    let mut run = Run::start(cfg, opts, job)?;
    signals::started();
    let bar = progress_bar(opts.progress && writer, run.start, cfg.raw.train.steps);
    crate::log::set_bar(bar.as_ref());
    // What an error after step 1 saves (rank 0 alone writes checkpoints).
    let mut good = LastGood::new(run.start, run.feed.cursor());
    let result = run.steps(opts, bar.as_ref(), &mut good);
    // More than env.max_error_frac of a batch's episodes failed, or DAPO dynamic sampling came
    // up short with train.dynamic_sampling_short_batch = "error": data parallel, every rank
    // decided it on the whole batch (its counts, its gathered groups), at the same point.
    if result.as_ref().is_err_and(met_by_every_rank) {
        good.stopped_together();
    }
    // An error every rank met at the same point: the ranks gather the ZeRO-1 shards for rank
    // 0's save, as a checkpoint does; otherwise they cannot.
    if let (Err(_), Some(step), true) = (&result, good.gather_due(), run.job.is_parallel()) {
        if let Err(e) = run.gather_for_save() {
            crate::log::log_only(&format!(
                "note: the ranks could not gather the state of step {step} for its save after \
                 the error ({e:#})"
            ));
        }
    }
    let result = if writer {
        // The in-flight batches too, unless the explorer failed: the resume then trains on what
        // the uninterrupted run would have (they were sampled with weights it no longer has).
        // ZeRO-1: rank 0 holds only its shard of the optimizer state, and the gather of the
        // others needs every rank at the same point, which an error does not leave them in.
        let cannot = (!run.trainer.optimizer.can_record()).then(|| {
            format!(
                "distributed.zero = {} shards the optimizer state over the ranks, and gathering \
                 it needs every rank, which the error left in different places",
                cfg.raw.distributed.zero
            )
        });
        good.save_after_error(result, cannot, |step, cursor| {
            run.save(step, Some(cursor), InFlight::TryWait)
        })
    } else {
        result
    };
    // A stop by a signal does not wait for the explorer's batch in progress (dropped anyway).
    run.feed.shutdown(!matches!(result, Ok((_, true))));
    crate::log::set_bar(None);
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
        let (cfg, mut done) = (self.cfg, self.start);
        let c = &cfg.raw;
        self.began = Instant::now();
        for t in (self.start + 1)..=c.train.steps {
            let comm0 = self.job.busy();
            // explorer: the batch of step t, sampled by version s(t) (prompt source inside); a
            // stop before the explorer thread's batch is handed out stops after step t − 1
            let batch = match self.feed.next(t, self.stop.as_deref())? {
                Next::Batch(b) => b,
                Next::Stopped(f) => return self.stop_before_step(t, f, good),
            };
            // staleness: drop experiences older than sync.max_staleness
            let (exps, stale) = filter_stale(batch.experiences.clone(), t, c.sync.max_staleness);
            // trainer update: advantages, mini-batches, micro-batches, optimizer steps (this
            // rank's share of the groups, the whole batch's normalisers)
            let (rep, lr, train_s, mem) = self.update(t, &exps, good, opts)?;
            // the weights are step t's: whatever fails from here on saves step t
            done = t;
            good.completed(t, self.feed.cursor());
            self.feed.completed(t);
            let (sample_s, train_s) = self.slowest(batch.sample_s, train_s)?;
            // evaluator (every train.eval_every steps; a failed one is null in the step's line),
            // then metrics and the JSONL logs
            let mut line = step_metrics(t, &exps, &rep, lr, sample_s, train_s);
            let env = self.env_over_ranks(batch.env.as_ref())?;
            report::set_env_metrics(&mut line, &exps, env.as_ref(), c.env.max_turns);
            let (eval, stopping) = self.evaluate_agreed(t, &mut line, opts, good)?;
            self.write_logs(t, &batch, &rep, (exps.len(), stale), &line, (comm0, mem))?;
            let Some(is_best) = eval_outcome(t, eval, stopping)? else {
                // a signal arrived while evaluating (e.g. a hung reward model): the interruption
                self.checkpoint(t, rep.skipped, false, true)?;
                return Ok((done, true));
            };
            // sync: the explorer gets version t when v divides t (after the step counts as
            // completed, so that a failed push, e.g. to a dead vLLM server, saves step t)
            self.sync(t)?;
            // console, progress bar and the run's own checks
            self.console(t, &line);
            show_progress(bar, t, &rep, &line);
            self.check_signal(t, &rep, &line)?;
            self.check_skipped(t, &rep, good)?;
            // checkpoint: every train.save_every steps, at the end, at a new best, on stop (on
            // every rank when any rank was asked to stop)
            let stop = self.job.any(opts.stop.load(Ordering::SeqCst))?;
            if self.checkpoint(t, rep.skipped, is_best, stop)? {
                good.saved(t);
            }
            if stop {
                return Ok((done, true));
            }
            hang_if_asked(opts, t, self.job.rank())?;
        }
        Ok((done, false))
    }

    /// What the environment did for the whole batch of a multi-turn step (`None` for a
    /// single-turn run): data parallel, each rank ran its share of the episodes, so the counts
    /// (episodes, errors, tool calls, tool-call errors, restarts, replays, truncations) are
    /// summed over the ranks (whole numbers below 2^53: exact in f64, whatever order the
    /// collective adds them in) and `time/env_s` is the slowest rank's, as `time/sample_s` is. One process: the batch's own. Every rank calls
    /// this at every step of a run with `[env]` (a rank without stats counts zeros).
    ///
    /// # Errors
    /// A failed collective.
    fn env_over_ranks(
        &mut self,
        env: Option<&crate::feed::episodes::EnvStats>,
    ) -> anyhow::Result<Option<crate::feed::episodes::EnvStats>> {
        if !self.cfg.raw.env.is_on() {
            return Ok(env.cloned());
        }
        let e = env.cloned().unwrap_or_default();
        crate::feed::env_over_ranks(&mut self.job, &e).map(Some)
    }

    /// The trainer's step `t` on `exps` (this rank's whole groups of them) at the schedule's
    /// learning rate: its report, the learning rate, the seconds it took and its memory.
    ///
    /// # Errors
    /// The trainer's (e.g. out of memory); one that came before the optimizer changed any weight
    /// leaves `good` at step t − 1, whose state the save after the error then writes with step
    /// t's batch ([`Feed::completed`]); a weight the update made NaN or infinite, as
    /// [`LastGood::diverged`] says it (nothing saved); the [`RunOptions::fail_update_at_step`]
    /// hook.
    fn update(
        &mut self,
        t: u64,
        exps: &[crate::store::experience::Experience],
        good: &mut LastGood,
        opts: &RunOptions,
    ) -> anyhow::Result<(StepReport, f64, f64, memory::MemoryReport)> {
        let (lr, t0) = (self.cfg.lr_at(t), Instant::now());
        good.begin_update();
        let mem = memory::UpdateMemory::begin();
        let mine = self.job.my_rows(exps);
        let updates = self.trainer.optimizer.update_count();
        let rep = fail_update_if_asked(opts, t, self.job.rank())
            .and_then(|()| self.trainer.step(&mine, t, lr, self.cfg.raw.train.seed));
        let rep = match rep {
            Ok(r) => r,
            Err(e) => {
                // No optimizer update began (each one counts itself before writing a weight):
                // the weights and the optimizer state are still step t − 1's.
                if self.trainer.optimizer.update_count() == updates {
                    good.update_undone();
                }
                // An update made a weight NaN or infinite (every rank meets it on the same
                // weights): the run's whole error, nothing saved after it.
                let bad = e.chain().find_map(|c| c.downcast_ref::<NonFiniteWeight>());
                if let Some(w) = bad {
                    let ckpts = checkpoint::checkpoints_dir(&self.run_dir);
                    let clip = self.cfg.raw.train.grad_clip;
                    return Err(good.diverged(t, &w.weight, &ckpts, clip));
                }
                return Err(e);
            }
        };
        let mem = mem.end();
        Ok((rep, lr, t0.elapsed().as_secs_f64(), mem))
    }

    /// Rank 0 (the writer) appends step `t`'s lines: metrics.jsonl, rollouts.jsonl and
    /// diagnostics.jsonl ([`write_step_logs`], with `rows` trained on and `stale` dropped, and
    /// the time in collectives since `comm0`), and the TensorBoard events.
    fn write_logs(
        &mut self,
        t: u64,
        batch: &crate::feed::explorer::Batch,
        rep: &StepReport,
        (rows, stale): (usize, usize),
        line: &MetricsLine,
        (comm0, mem): (Option<std::time::Duration>, memory::MemoryReport),
    ) -> anyhow::Result<()> {
        if !self.job.writer() {
            return Ok(());
        }
        append_line(&self.run_dir.join("metrics.jsonl"), &line.to_json())?;
        let comm_s = (self.job.busy().zip(comm0)).map(|(now, b)| (now - b).as_secs_f64());
        let diag = write_step_logs(&self.run_dir, t, batch, rep, rows, stale, (comm_s, mem))?;
        self.tensorboard(&[
            (Source::Metrics, &line.to_json()),
            (Source::Diagnostics, &diag),
        ])
    }

    /// After step `t`: the explorer gets version t when `sync.interval` divides t, and no rank
    /// samples until every rank (rank 0's push to vLLM servers) has it.
    fn sync(&mut self, t: u64) -> anyhow::Result<()> {
        let v = self.cfg.raw.sync.interval;
        self.feed.publish(t, v, &self.trainer.model)?;
        if t.is_multiple_of(v) {
            self.job.barrier()?;
        }
        Ok(())
    }

    /// Whether this process writes the run directory (one process, or rank 0).
    fn writer(&self) -> bool {
        self.job.writer()
    }

    /// The step's sampling and training seconds of the slowest rank (a step waits for it).
    fn slowest(&mut self, sample_s: f64, train_s: f64) -> anyhow::Result<(f64, f64)> {
        let mut t = [sample_s, train_s];
        self.job.max_f64(&mut t)?;
        Ok((t[0], t[1]))
    }

    /// At step 0 and every `train.eval_every` steps: evaluates the policy, adds `eval/*` to `line`,
    /// appends eval.jsonl. Returns whether this is the best accuracy so far (step 0 sets the first
    /// best without counting as one).
    ///
    /// # Errors
    /// The evaluation's (sampling, the verifier, eval.jsonl): `eval/accuracy` is then null in
    /// `line`, whose other `eval/*` keys stay unset.
    fn evaluate(&mut self, t: u64, line: &mut MetricsLine) -> anyhow::Result<bool> {
        let r = self.evaluate_into(t, line);
        if r.is_err() {
            line.set("eval/accuracy", None);
        }
        r
    }

    fn evaluate_into(&mut self, t: u64, line: &mut MetricsLine) -> anyhow::Result<bool> {
        let every = self.cfg.raw.train.eval_every;
        let Some(ev) = &self.evaluator else {
            return Ok(false);
        };
        let last = t == self.cfg.raw.train.steps;
        if t > 0 && (every == 0 || !(t.is_multiple_of(every) || last)) {
            return Ok(false);
        }
        crate::log::phase(&format!(
            "evaluating step {t} on {} held-out problems ({} new tokens at most)",
            ev.texts.len(),
            self.cfg.raw.rollout.max_new_tokens
        ));
        // Data parallel: every rank evaluates its share of the problems; rank 0 records.
        let dir = self.job.writer().then_some(self.run_dir.as_path());
        let r = ev.record_split(&self.trainer.model, &self.tokenizer, t, dir, &mut self.job)?;
        for (k, v) in r.metrics() {
            line.set_value(k, v);
        }
        if let Some(tb) = &mut self.tb {
            // The eval.jsonl record as `record` wrote it.
            let mut e = serde_json::to_value(&r)?;
            e["step"] = t.into();
            tb.line(Source::Eval, &e.to_string())?;
        }
        Ok(self.best.observe(t, r.accuracy))
    }

    /// [`Run::evaluate`] of step `t`, every rank taking the same way after it: data parallel, a
    /// failed evaluation is every rank's ([`Run::agree_on_eval`]: a share's failure is agreed
    /// inside it, rank 0's eval.jsonl or TensorBoard line here), and so is the stop that decides
    /// what follows (the second value: asked for on any rank, read only after a failure); an
    /// error with no stop is one every rank meets here, which `good` is told. With the
    /// [`RunOptions::fail_eval_at`] hook.
    ///
    /// # Errors
    /// A failed collective.
    fn evaluate_agreed(
        &mut self,
        t: u64,
        line: &mut MetricsLine,
        opts: &RunOptions,
        good: &mut LastGood,
    ) -> anyhow::Result<(anyhow::Result<bool>, bool)> {
        let rank = self.job.rank();
        let eval = self
            .evaluate(t, line)
            .and_then(|best| match opts.fail_eval_at {
                Some((r, s)) if (r, s) == (rank, t) => Err(anyhow::anyhow!(
                    "rank {r}: a deliberate error after the evaluation of step {t}"
                )),
                _ => Ok(best),
            });
        let (eval, failed) = self.agree_on_eval(t, eval)?;
        if failed {
            line.set("eval/accuracy", None);
        }
        let stopping = failed && self.job.any(opts.stop.load(Ordering::SeqCst))?;
        if failed && !stopping {
            good.stopped_together();
        }
        Ok((eval, stopping))
    }

    /// Data parallel, with an evaluator: whether step `t`'s evaluation failed on any rank (one
    /// `any` at every step, on every rank), and on a rank where it succeeded, the error saying
    /// that another rank's failed. One process, or no evaluator: `eval` and whether it failed.
    ///
    /// # Errors
    /// A failed collective.
    fn agree_on_eval(
        &mut self,
        t: u64,
        eval: anyhow::Result<bool>,
    ) -> anyhow::Result<(anyhow::Result<bool>, bool)> {
        if self.evaluator.is_none() || !self.job.is_parallel() {
            let failed = eval.is_err();
            return Ok((eval, failed));
        }
        if !self.job.any(eval.is_err())? {
            return Ok((eval, false));
        }
        let eval = eval.and_then(|_| {
            Err(anyhow::anyhow!(
                "another rank's evaluation of step {t} failed (its error, in its log, says why)"
            ))
        });
        Ok((eval, true))
    }

    /// Appends JSONL lines just written to the TensorBoard event file (when on).
    fn tensorboard(&mut self, lines: &[(Source, &str)]) -> anyhow::Result<()> {
        if let Some(tb) = &mut self.tb {
            for (source, l) in lines {
                tb.line(*source, l)?;
            }
        }
        Ok(())
    }

    /// Step `t`'s console line ([`step_text`]: train.log always, stderr every `output.log_every`
    /// steps and at the last when no bar is drawn) and its evaluation's line.
    fn console(&self, t: u64, line: &MetricsLine) {
        let c = &self.cfg.raw;
        let elapsed = self.began.elapsed().as_secs_f64();
        let eta = elapsed / (t - self.start) as f64 * (c.train.steps - t) as f64;
        // Data parallel, rank r > 0 keeps its lines in its own log.
        let due = (t.is_multiple_of(c.output.log_every) || t == c.train.steps) && self.writer();
        crate::log::line(&step_text(t, c.train.steps, line, elapsed, eta), due);
        if let Some(e) = eval_text(t, line) {
            crate::log::line(&e, self.writer());
        }
    }

    /// Warns (console and train.log) when the run cannot learn: `output.warn_no_signal_steps`
    /// steps in a row where every group had one reward for all its completions (or every row was
    /// skipped), or where the whole batch had one reward; and when the held-out accuracy is
    /// exactly 0 at step 0 and at the last step.
    fn check_signal(&mut self, t: u64, rep: &StepReport, line: &MetricsLine) -> anyhow::Result<()> {
        if !self.writer() {
            return Ok(());
        }
        let n = self.cfg.raw.output.warn_no_signal_steps;
        let f = |k: &str| line.get(k).and_then(|v| v.as_f64());
        let no_signal = f("zero_std_frac").is_none_or(|z| z == 1.0) || rep.skipped;
        let constant = f("reward/std") == Some(0.0);
        self.no_signal = (
            if no_signal { self.no_signal.0 + 1 } else { 0 },
            if constant { self.no_signal.1 + 1 } else { 0 },
        );
        if n > 0 && self.no_signal.1 == n {
            crate::log::say(&format!(
                "warning: steps {}-{t}: every completion of the batch got the same reward ({}), so \
                 every advantage is 0 and the policy does not change. Check the verifier on a few \
                 completions (rollouts.jsonl; `rlvr reward --explain`), and that the prompt asks for \
                 the answer form the verifier reads",
                t + 1 - n,
                f("reward/mean").map_or("none".into(), |r| format!("{r}")),
            ));
        } else if n > 0 && self.no_signal.0 == n && self.no_signal.1 < n {
            crate::log::say(&format!(
                "warning: steps {}-{t}: no learning signal: every group's completions got the same \
                 reward (zero_std_frac = 1) or every row was skipped, so the policy does not change. \
                 Try a larger rollout.group_size, a warm start (`rlvr sft`), an easier task, or a \
                 softer reward (partial credit, a format reward)",
                t + 1 - n,
            ));
        }
        let evaluated = f("eval/n").is_some_and(|n| n > 0.0);
        if t == self.cfg.raw.train.steps && evaluated && f("eval/accuracy") == Some(0.0) {
            let at0 = crate::store::metrics::read_metrics(&self.run_dir.join("eval.jsonl"))?
                .into_iter()
                .find(|r| r.get("step").and_then(|v| v.as_u64()) == Some(0))
                .and_then(|r| r.get("accuracy").and_then(|v| v.as_f64()));
            if at0 == Some(0.0) {
                // `rlvr sft` writes its metrics.jsonl beside the model it trains: a model that
                // is one already needs a longer warm start, not advice to do one.
                let warm = std::path::Path::new(&self.cfg.raw.model.path).join("metrics.jsonl");
                let advice = if warm.is_file() {
                    "or warm-start longer: model.path is an `rlvr sft` model already (its \
                     eval.jsonl has its held-out accuracy)"
                } else {
                    "or warm-start with `rlvr sft`"
                };
                crate::log::say(&format!(
                    "warning: the held-out accuracy was exactly 0 at step 0 and at step {t}: the \
                     model never solved a held-out problem. Check the answer format on a few \
                     completions (eval.jsonl, rollouts.jsonl), raise rollout.max_new_tokens if they \
                     are cut off, {advice}"
                ));
            }
        }
        Ok(())
    }

    /// Counts non-finite (skipped) steps in a row and stops at `train.max_skipped_in_row`: an
    /// error every rank meets at the same point (the report is the whole batch's), which `good`
    /// is told ([`LastGood::stopped_together`]).
    fn check_skipped(
        &mut self,
        t: u64,
        rep: &StepReport,
        good: &mut LastGood,
    ) -> anyhow::Result<()> {
        self.skipped_in_row = if rep.skipped {
            self.skipped_in_row + 1
        } else {
            0
        };
        if self.skipped_in_row >= self.cfg.raw.train.max_skipped_in_row {
            good.stopped_together();
            bail!(
                "{} in a row (the last: step {t}) had a non-finite loss or gradient; \
                 stopping. A skipped step changes no weight and no optimizer moment, so the \
                 weights are still step {}'s (the last checkpoint written: {}). Lower train.lr, set \
                 train.grad_clip, or check the rewards and behaviour log-probs of the data",
                crate::log::counted(u64::from(self.skipped_in_row), "step"),
                t - u64::from(self.skipped_in_row),
                self.last_ckpt
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "none (no checkpoint was written yet)".into())
            );
        }
        Ok(())
    }

    /// A stop (Ctrl-C, SIGTERM) that came before step `t`'s batch was handed out by the
    /// explorer thread ([`Feed::next`]; `found`: whether the step was waiting for it, it was
    /// ready, or the explorer was still sampling it when the stop came before the step): says
    /// which, then the checkpoint of step `done` = t − 1 as on any stop, unless it is written
    /// already (a resumed run's first wait: its checkpoint is the one resumed from) or `done` was
    /// skipped (the last good checkpoint stays the last). Nothing of step `t` ran, so the resume
    /// is exact as after any stop; the batch (ready or being sampled) is dropped, unless the
    /// checkpoint needs it ([`Feed::resumes_exactly_without_buffer`]), when it keeps or waits
    /// for it (and says so). Returns what the loop returns: step `done`, stopped.
    ///
    /// # Errors
    /// The checkpoint's.
    fn stop_before_step(
        &mut self,
        t: u64,
        found: StopFound,
        good: &mut LastGood,
    ) -> anyhow::Result<(u64, bool)> {
        let done = t - 1;
        crate::log::say(&match found {
            StopFound::Waiting => {
                format!("stop: step {t} was waiting for the explorer; stopping after step {done}")
            }
            StopFound::Ready => format!(
                "stop: stopping after step {done}; the batch of step {t} was already sampled \
                 and is not trained on"
            ),
            StopFound::Sampling => format!(
                "stop: stopping after step {done}, before step {t} began (the explorer was \
                 still sampling its batch)"
            ),
        });
        if done == 0 || good.saved_step() >= done {
            return Ok((done, true));
        }
        if self.checkpoint(done, self.skipped_in_row > 0, false, true)? {
            good.saved(done);
        }
        Ok((done, true))
    }

    /// Saves a checkpoint when one is due: every `train.save_every` steps, at the last step, at a
    /// new best evaluation, and when stopping. A skipped step writes none: the last one stays the
    /// last good one. Returns whether a checkpoint was written.
    fn checkpoint(
        &mut self,
        t: u64,
        skipped: bool,
        is_best: bool,
        stop: bool,
    ) -> anyhow::Result<bool> {
        let cfg = self.cfg;
        let tr = &cfg.raw.train;
        let due = !skipped
            && ((tr.save_every > 0 && t.is_multiple_of(tr.save_every))
                || t == tr.steps
                || is_best
                || stop);
        if !due {
            return Ok(false);
        }
        // ZeRO-1: every rank brings its share of the optimizer state to rank 0 first.
        self.trainer.gather_for_checkpoint()?;
        // o ≥ 1: the batches already sampled for the next steps go into the buffer (when
        // stopping, only if the resume could not re-sample them with the weights they need: a
        // stop waits for the explorer no longer than exactness requires). Data parallel, every
        // rank gathers its shares of them first (the same decision on every rank: `stop` is).
        let in_flight = match !stop || !self.feed.resumes_exactly_without_buffer(t) {
            true => InFlight::Wait,
            false => InFlight::Drop,
        };
        if in_flight == InFlight::Wait {
            self.feed.gather_in_flight(t, tr.steps)?;
        }
        if !self.writer() {
            self.last_ckpt =
                Some(checkpoint::checkpoints_dir(&self.run_dir).join(format!("step-{t}")));
            return Ok(true);
        }
        crate::log::phase(&format!("saving checkpoint step-{t}"));
        self.last_ckpt = Some(self.save(t, None, in_flight)?);
        if is_best {
            checkpoint::mark_best(&self.run_dir, t)?;
        }
        Ok(true)
    }

    /// Data parallel, on every rank together after an error they all met at the same point
    /// ([`LastGood::gather_due`]): a sharded optimizer's state brought to rank 0 for the save
    /// of the step, as [`Run::checkpoint`] does. Not the shares of the batches in flight: an
    /// explorer thread sampling with diverged weights (the error is `train.max_skipped_in_row`)
    /// may fail while the others wait for its share, which would leave them in the gather and
    /// lose the save (the resume then samples those batches again, and says so).
    ///
    /// # Errors
    /// A failed collective.
    fn gather_for_save(&mut self) -> anyhow::Result<()> {
        self.trainer.gather_for_checkpoint()
    }

    /// Writes the checkpoint of completed step `t` from every stage's record (rank 0):
    /// `cursor` replaces the feed's (after an error: the cursor right after step `t`);
    /// `in_flight` says what becomes of the explorer's in-flight batches ([`Feed::state`]; they
    /// follow the feed's cursor after its last completed step, so none are kept when `cursor`
    /// differs from it).
    ///
    /// # Errors
    /// A non-finite weight (nothing is written); a sharded optimizer state not gathered; the
    /// feed's and the store's errors.
    fn save(
        &mut self,
        t: u64,
        cursor: Option<SourceCursor>,
        in_flight: InFlight,
    ) -> anyhow::Result<PathBuf> {
        checkpoint::ensure_finite(&self.trainer.model)?;
        let trainer = self.trainer.state_dict()?;
        let in_flight = match cursor {
            Some(c) if c != self.feed.completed_cursor() => InFlight::Drop,
            _ => in_flight,
        };
        let steps = self.cfg.raw.train.steps;
        let mut feed = self.feed.state(t, steps, in_flight, self.stop.as_deref())?;
        if let (Some(c), true) = (cursor, feed.buffer.is_empty()) {
            feed.cursor = c;
        }
        let records = save::Records {
            position: save::Position {
                step: t,
                skipped_in_row: self.skipped_in_row,
            },
            trainer,
            best: self.best.state_dict()?,
            feed,
            world_size: self.job.world(),
        };
        save_run(
            self.cfg,
            &self.run_dir,
            &self.trainer.model,
            &self.tokenizer,
            records,
        )
    }
}

/// Whether `e` is an error that every rank of a data-parallel run meets at the same point,
/// whatever context it carries: [`crate::feed::episodes::ErrorBudgetExceeded`] (the counts
/// summed over the ranks: `crate::feed::check_over_ranks`) or
/// [`crate::feed::explorer::ShortBatchStop`] (decided on the gathered groups).
fn met_by_every_rank(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<crate::feed::episodes::ErrorBudgetExceeded>()
            || c.is::<crate::feed::explorer::ShortBatchStop>()
    })
}

/// What a step does after its evaluation `eval` (whose step line is already written): `Some(is
/// best)` when it succeeded (or was not due), `None` when it failed after a stop was asked for
/// (`stop`: asked for on any rank, as every rank agrees when the evaluation failed; a signal
/// during a hung evaluation ends the run as an interruption, saving step `t`).
///
/// # Errors
/// The evaluation's error, naming step `t`, when no stop was asked for: the run stops and the
/// save after an error writes step `t`, whose update is complete (DESIGN.md section 12).
fn eval_outcome(t: u64, eval: anyhow::Result<bool>, stop: bool) -> anyhow::Result<Option<bool>> {
    match eval {
        Ok(best) => Ok(Some(best)),
        Err(e) if stop => {
            crate::log::say(&format!(
                "the evaluation of step {t} ended with an error after the stop was asked for \
                 ({e:#}); it is null in metrics.jsonl"
            ));
            Ok(None)
        }
        Err(e) => Err(e.context(format!(
            "evaluating step {t} (its eval/accuracy is null in metrics.jsonl; `rlvr eval --model` \
             on the saved checkpoint evaluates it again)"
        ))),
    }
}

/// The failed-update test hook ([`RunOptions::fail_update_at_step`]): an error for step `t` on
/// rank `rank` when asked, before the trainer runs.
fn fail_update_if_asked(opts: &RunOptions, t: u64, rank: usize) -> anyhow::Result<()> {
    let asked = opts.fail_update_at_step == Some(t)
        || std::env::var("RLVR_DEBUG_FAIL_UPDATE_AT_STEP")
            .is_ok_and(|s| s == t.to_string() || s == format!("{rank}:{t}"));
    if asked {
        bail!(
            "rank {rank}: a deliberate error while training step {t}, before any weight changed \
             (RLVR_DEBUG_FAIL_UPDATE_AT_STEP)"
        );
    }
    Ok(())
}

/// The SIGKILL-resume test hook ([`RunOptions::hang_after_step`]), and the data-parallel ones:
/// `RLVR_DEBUG_EXIT_RANK_AFTER_STEP=R:T` makes rank R exit with code 3 after step T (a rank that
/// dies), `R:T:error` makes it fail with an error of its own (a rank that fails alone).
fn hang_if_asked(opts: &RunOptions, t: u64, rank: usize) -> anyhow::Result<()> {
    if let Ok(spec) = std::env::var("RLVR_DEBUG_EXIT_RANK_AFTER_STEP") {
        if spec == format!("{rank}:{t}") {
            crate::log::say(&format!(
                "rank {rank}: exiting after step {t} (RLVR_DEBUG_EXIT_RANK_AFTER_STEP)"
            ));
            std::process::exit(3);
        }
        if spec == format!("{rank}:{t}:error") {
            bail!(
                "rank {rank}: a deliberate error after step {t} (RLVR_DEBUG_EXIT_RANK_AFTER_STEP)"
            );
        }
    }
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
    Ok(())
}
