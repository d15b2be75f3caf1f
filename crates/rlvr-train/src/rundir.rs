//! Run-directory records: run.json (git commit, seed, host, start time, version), the progress bar,
//! the lock and `train.log` held while a run is open ([`RunGuard`]), the finite-weights check of
//! checkpoints and the save-after-error bookkeeping ([`LastGood`]).

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::json;

use crate::explorer::SourceCursor;
use crate::lock::RunLock;
use crate::metrics::MetricsLine;
use crate::run::RunSummary;

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// The commit this binary was built from (build.rs embeds `git rev-parse HEAD`), `None` when the
/// build had no git repository.
pub(crate) fn git_commit() -> Option<String> {
    Some(env!("RLVR_GIT_COMMIT"))
        .filter(|c| !c.is_empty())
        .map(str::to_string)
}

/// This machine's host name.
pub(crate) fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Writes RUN_DIR/run.json (git commit, seed, host, start time, rlvr version); on resume, adds the
/// resume time to `resumed_at`.
pub(crate) fn write_run_json(run_dir: &Path, seed: u64, resume: bool) -> anyhow::Result<()> {
    let path = run_dir.join("run.json");
    let mut v = if resume {
        std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .unwrap_or_else(|| json!({}))
    } else {
        json!({})
    };
    if !resume || v.get("start_time").is_none() {
        v = json!({
            "git_commit": git_commit(),
            "seed": seed,
            "host": host(),
            "start_time": now_rfc3339(),
            "version": env!("CARGO_PKG_VERSION"),
            "resumed_at": [],
        });
    } else if let Some(a) = v.get_mut("resumed_at").and_then(|a| a.as_array_mut()) {
        a.push(json!(now_rfc3339()));
    }
    rlvr_model::weights::atomic_write(&path, serde_json::to_string_pretty(&v)?.as_bytes())?;
    Ok(())
}

pub(crate) fn progress_bar(
    enabled: bool,
    start: u64,
    steps: u64,
) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !enabled || !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::new(steps);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta}] {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b.set_position(start);
    Some(b)
}

thread_local! {
    // train.log of the run open on this thread (train() runs on one thread; tests run several
    // runs at once on different threads, so the log is per thread, not per process).
    static TRAIN_LOG: RefCell<Option<File>> = const { RefCell::new(None) };
}

/// Appends `msg` to the open run's `train.log` (nothing when no run is open on this thread).
pub(crate) fn log_only(msg: &str) {
    TRAIN_LOG.with(|l| {
        if let Some(f) = l.borrow_mut().as_mut() {
            // The log must never stop a run: a write error here is dropped.
            let _ = writeln!(f, "{msg}");
        }
    });
}

thread_local! {
    // The progress bar of the run on this thread, while it is drawn ([`set_bar`]).
    static BAR: RefCell<Option<indicatif::ProgressBar>> = const { RefCell::new(None) };
}

/// Makes `bar` the progress bar that [`phase`] labels (`None` when the run ends).
pub(crate) fn set_bar(bar: Option<&indicatif::ProgressBar>) {
    BAR.with(|b| *b.borrow_mut() = bar.cloned());
}

/// Labels a long phase (loading, evaluating, saving) before it starts, so a silent minute has a
/// name: on the progress bar's message while one is drawn, else as a line on stderr; always in
/// `train.log`.
pub(crate) fn phase(msg: &str) {
    let drawn = BAR.with(|b| {
        b.borrow().as_ref().map(|bar| {
            bar.set_message(format!("{msg}…"));
        })
    });
    if drawn.is_none() {
        eprintln!("{msg}…");
    }
    log_only(&format!("{msg}…"));
}

/// Prints `msg` on stderr and appends it to `train.log`.
pub(crate) fn say(msg: &str) {
    eprintln!("{msg}");
    log_only(msg);
}

/// Appends step `t`'s line to train.log: what the progress bar shows (loss, mean reward) plus the
/// held-out accuracy when evaluated.
pub(crate) fn log_step(t: u64, steps: u64, line: &MetricsLine) {
    let f = |k: &str| line.get(k).and_then(|v| v.as_f64());
    let mut s = format!("step {t}/{steps}");
    for (k, name) in [
        ("loss", "loss"),
        ("reward/mean", "reward"),
        ("eval/accuracy", "eval accuracy"),
    ] {
        if let Some(v) = f(k) {
            s.push_str(&format!(" {name} {v:.4}"));
        }
    }
    log_only(&s);
}

/// What an open run holds: the run directory's lock (one writer, DESIGN.md section 12) and its
/// `train.log`, which keeps what the terminal showed (warnings, notes, one line per step, the
/// interruption, the final error or summary). Dropping it closes the log and releases the lock.
pub(crate) struct RunGuard {
    _lock: RunLock,
}

impl RunGuard {
    /// Creates `run_dir`, takes its lock and opens `train.log` (appended to on resume).
    ///
    /// # Errors
    /// The directory cannot be created, another process holds it (named), train.log cannot be
    /// opened.
    pub(crate) fn open(run_dir: &Path, resume: bool) -> anyhow::Result<RunGuard> {
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("creating run directory {}", run_dir.display()))?;
        let lock = RunLock::acquire(run_dir)?;
        let path = run_dir.join("train.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        TRAIN_LOG.with(|l| *l.borrow_mut() = Some(file));
        let args: Vec<String> = std::env::args().collect();
        log_only(&format!(
            "== {} {} (pid {}, host {}, rlvr {}): {}",
            now_rfc3339(),
            if resume { "resumed" } else { "started" },
            std::process::id(),
            host(),
            env!("CARGO_PKG_VERSION"),
            args.join(" ")
        ));
        Ok(RunGuard { _lock: lock })
    }

    /// Logs how the run ended (the error as `rlvr` prints it, the interruption, or the summary) and
    /// passes `r` through.
    pub(crate) fn finish(self, r: anyhow::Result<RunSummary>) -> anyhow::Result<RunSummary> {
        match &r {
            Err(e) => log_only(&format!("error: {e:#}")),
            Ok(s) => log_only(&format!(
                "{} after step {}; last checkpoint {}",
                if s.interrupted {
                    match crate::signals::received() {
                        Some(sig) => format!("interrupted by {}", crate::signals::name(sig)),
                        None => "interrupted".to_string(),
                    }
                } else {
                    "finished".to_string()
                },
                s.steps,
                s.last_checkpoint
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "none".into())
            )),
        }
        r
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        TRAIN_LOG.with(|l| *l.borrow_mut() = None);
    }
}

/// Refuses to write a checkpoint whose weights hold a NaN or an infinity (`latest` then keeps
/// naming the previous, good one).
///
/// # Errors
/// Names the first non-finite tensor; tensor errors.
pub(crate) fn ensure_finite(model: &rlvr_model::Model) -> anyhow::Result<()> {
    if let Some(name) = non_finite_weight(model)? {
        anyhow::bail!(
            "weight {name} holds a non-finite value (NaN or inf): this checkpoint is not written and \
             checkpoints/latest still names the last good one"
        );
    }
    Ok(())
}

/// Refuses a policy loaded from `dir` with a NaN or infinite weight at the start of a run: it would
/// train on silently (identical completions make zero-variance groups, so no loss is ever checked).
///
/// # Errors
/// Names `dir` and the first non-finite weight; tensor errors.
pub(crate) fn refuse_non_finite_policy(
    model: &rlvr_model::Model,
    dir: &Path,
) -> anyhow::Result<()> {
    if let Some(name) = non_finite_weight(model)? {
        anyhow::bail!(
            "the policy loaded from {} holds a non-finite value (NaN or inf) in weight {name}: \
             nothing can be learned from it; start from another model.path or checkpoint",
            dir.display()
        );
    }
    Ok(())
}

/// The name of the first weight of `model` that holds a NaN or an infinity, if any.
///
/// # Errors
/// Tensor errors.
pub(crate) fn non_finite_weight(model: &rlvr_model::Model) -> anyhow::Result<Option<String>> {
    for (name, v) in model.named_vars() {
        let t = v.as_tensor();
        // x − x is 0 for every finite x and NaN for NaN and ±inf: the sum is finite iff all are.
        let s = t
            .sub(t)?
            .sum_all()?
            .to_dtype(candle_core::DType::F32)?
            .to_scalar::<f32>()?;
        if !s.is_finite() {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// The last completed step whose state can be saved after an error: the trainer's weights are
/// those of step `step` and `cursor` is the source cursor right after it. [`begin_update`]
/// marks the trainer as changing (an error then saves nothing: the weights would be half a step).
///
/// [`begin_update`]: LastGood::begin_update
pub(crate) struct LastGood {
    step: u64,
    cursor: SourceCursor,
    saved: u64,
    updating: bool,
}

impl LastGood {
    /// At the run's start (`step` = the resumed checkpoint's step, or 0).
    pub(crate) fn new(step: u64, cursor: SourceCursor) -> Self {
        LastGood {
            step,
            cursor,
            saved: step,
            updating: false,
        }
    }

    /// The trainer starts changing the weights of the step after `self.step`.
    pub(crate) fn begin_update(&mut self) {
        self.updating = true;
    }

    /// Step `t` completed (metrics written); `cursor` is the source's cursor after it.
    pub(crate) fn completed(&mut self, t: u64, cursor: SourceCursor) {
        self.step = t;
        self.cursor = cursor;
        self.updating = false;
    }

    /// A checkpoint of step `t` was written.
    pub(crate) fn saved(&mut self, t: u64) {
        self.saved = self.saved.max(t);
    }

    /// On an error after step 1, saves the last good state with `save(step, cursor)` (as Ctrl-C
    /// does) unless it is already saved, and says so in the error.
    pub(crate) fn save_after_error<T>(
        &self,
        r: anyhow::Result<T>,
        save: impl FnOnce(u64, SourceCursor) -> anyhow::Result<PathBuf>,
    ) -> anyhow::Result<T> {
        let e = match r {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if self.updating || self.step == 0 || self.step <= self.saved {
            return Err(e);
        }
        match save(self.step, self.cursor) {
            Ok(dir) => Err(e.context(format!(
                "stopped by an error after step {}; its state was saved to {} (continue with `rlvr train \
                 --resume` once the cause is fixed)",
                self.step,
                dir.display()
            ))),
            // Saving again can fail exactly as the step did (a full disk while checkpointing):
            // say so instead of printing the same chain twice.
            Err(se) if format!("{se:#}") == format!("{e:#}") => Err(e.context(format!(
                "stopped by an error after step {}; saving its state again failed the same way",
                self.step
            ))),
            Err(se) => Err(e.context(format!(
                "stopped by an error after step {}; saving its state failed too: {se:#}",
                self.step
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor};

    #[test]
    fn a_checkpoint_with_a_nan_or_inf_weight_is_refused() {
        let config = rlvr_model::ModelConfig::from_json(
            &serde_json::json!({"model_type": "qwen2", "vocab_size": 16, "hidden_size": 8,
                "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                "num_key_value_heads": 1, "max_position_embeddings": 32}),
            "inline".as_ref(),
        )
        .unwrap();
        let m = rlvr_model::Model::random(config, 0.02, 0, DType::F32, &Device::Cpu).unwrap();
        ensure_finite(&m).unwrap();
        for bad in [f32::NAN, f32::INFINITY] {
            let (name, v) = m.named_vars().into_iter().last().unwrap();
            let good = v.as_tensor().copy().unwrap();
            let mut data = good.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            data[3] = bad;
            v.set(&Tensor::from_vec(data, good.dims().to_vec(), &Device::Cpu).unwrap())
                .unwrap();
            let e = ensure_finite(&m).unwrap_err().to_string();
            assert!(e.contains(&name) && e.contains("non-finite"), "{e}");
            v.set(&good).unwrap();
        }
    }

    /// A full disk while checkpointing fails the step and then the save after the error the same
    /// way: the message says it once (issue 13 item 11; it printed the whole chain twice, and the
    /// I/O cause twice within each).
    #[test]
    fn a_save_that_fails_like_the_step_is_reported_once() {
        let disk_full = || {
            let io =
                std::io::Error::new(std::io::ErrorKind::StorageFull, "No space left on device");
            anyhow::Error::from(rlvr_model::ModelError::Io {
                path: "/run/checkpoints/.tmp-step-1/model.safetensors".into(),
                err: io,
            })
            .context("writing the model to /run/checkpoints/.tmp-step-1")
        };
        let mut g = LastGood::new(0, SourceCursor::Offline { groups: 0 });
        g.begin_update();
        g.completed(1, SourceCursor::Offline { groups: 2 });
        let r: anyhow::Result<()> = Err(disk_full());
        let msg = format!(
            "{:#}",
            g.save_after_error(r, |_, _| Err(disk_full())).unwrap_err()
        );
        assert_eq!(msg.matches("No space left on device").count(), 1, "{msg}");
        assert!(
            msg.contains("saving its state again failed the same way"),
            "{msg}"
        );
        // A different failure of the save is still reported beside the step's.
        let r: anyhow::Result<()> = Err(anyhow::anyhow!("verifier broke"));
        let msg = format!(
            "{:#}",
            g.save_after_error(r, |_, _| Err(disk_full())).unwrap_err()
        );
        assert!(
            msg.contains("saving its state failed too") && msg.contains("verifier broke"),
            "{msg}"
        );
        assert_eq!(msg.matches("No space left on device").count(), 1, "{msg}");
    }

    #[test]
    fn an_error_saves_the_last_completed_step_only_when_it_is_whole_and_unsaved() {
        let c = |g| SourceCursor::Offline { groups: g };
        let err = || -> anyhow::Result<()> { Err(anyhow::anyhow!("verifier broke")) };
        let mut g = LastGood::new(0, c(0));
        // Nothing completed yet: nothing to save.
        let r = g.save_after_error(err(), |_, _| panic!("saved step 0"));
        assert_eq!(r.unwrap_err().to_string(), "verifier broke");
        g.begin_update();
        g.completed(4, c(8));
        g.saved(2);
        // Step 4 completed, step 2 saved: step 4 is saved with the cursor right after it.
        let r = g.save_after_error(err(), |step, cur| {
            assert_eq!((step, cur), (4, c(8)));
            Ok(PathBuf::from("ckpt/step-4"))
        });
        let e = format!("{:#}", r.unwrap_err());
        assert!(
            e.contains("after step 4; its state was saved to ckpt/step-4"),
            "{e}"
        );
        assert!(e.ends_with("verifier broke"), "{e}");
        // Mid-update (weights half way to step 5): no save.
        g.begin_update();
        let r = g.save_after_error(err(), |_, _| panic!("saved a half step"));
        assert!(r.is_err());
        // Already saved: no second save; and Ok passes through.
        g.completed(5, c(10));
        g.saved(5);
        assert!(g
            .save_after_error(err(), |_, _| panic!("saved twice"))
            .is_err());
        assert!(g
            .save_after_error(Ok(()), |_, _| panic!("no error"))
            .is_ok());
    }
}
