//! What guards an open run: the run directory's lock (one writer) and its `train.log`, held from
//! start to end ([`RunGuard`]), and the save-after-error bookkeeping ([`LastGood`]): an error
//! after step 1 saves the last completed step, as Ctrl-C does.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::RunSummary;
use crate::store::checkpoint::SourceCursor;
use crate::store::lock::RunLock;
use crate::store::run_json;

/// What an open run holds: the run directory's lock (one writer, DESIGN.md section 12) and its
/// `train.log`, which keeps what the terminal showed (warnings, notes, one line per step, the
/// interruption, the final error or summary). Dropping it closes the log and releases the lock.
pub(crate) struct RunGuard {
    /// `None` on data-parallel ranks above 0 (rank 0 holds the lock).
    _lock: Option<RunLock>,
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
        refuse_foreign_checkpoints(run_dir)?;
        let path = run_dir.join("train.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        crate::log::open(file);
        let args: Vec<String> = std::env::args().collect();
        crate::log::log_only(&format!(
            "== {} {} (pid {}, host {}, rlvr {}): {}",
            run_json::now_rfc3339(),
            if resume { "resumed" } else { "started" },
            std::process::id(),
            run_json::host(),
            env!("CARGO_PKG_VERSION"),
            args.join(" ")
        ));
        Ok(RunGuard { _lock: Some(lock) })
    }

    /// Data parallel, rank `rank` > 0 of `world`: no lock (rank 0 holds it), its lines in
    /// `run_dir/ranks/rank-{rank}.log` (appended to), started with the same header as train.log.
    ///
    /// # Errors
    /// The log cannot be created.
    pub(crate) fn open_rank(run_dir: &Path, rank: usize, world: usize) -> anyhow::Result<RunGuard> {
        let dir = run_dir.join("ranks");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("rank-{rank}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        crate::log::open(file);
        crate::log::set_quiet(true);
        crate::log::log_only(&format!(
            "== {} rank {rank} of {world} (pid {}, host {}, rlvr {})",
            run_json::now_rfc3339(),
            std::process::id(),
            run_json::host(),
            env!("CARGO_PKG_VERSION"),
        ));
        Ok(RunGuard { _lock: None })
    }

    /// Logs how the run ended (the error as `rlvr` prints it, the interruption, or the summary) and
    /// passes `r` through.
    pub(crate) fn finish(self, r: anyhow::Result<RunSummary>) -> anyhow::Result<RunSummary> {
        match &r {
            Err(e) => crate::log::log_only(&format!("error: {e:#}")),
            Ok(s) => crate::log::log_only(&format!(
                "{} after step {}; last checkpoint {}",
                if s.interrupted {
                    match super::signals::received() {
                        Some(sig) => format!("interrupted by {}", super::signals::name(sig)),
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

/// Refuses a run directory whose `checkpoints` is a symbolic link into another run directory (one
/// holding a `run.json`): `--resume` would continue that run and rotate (delete) its checkpoints.
/// A link to a plain directory elsewhere (checkpoints on a bigger disk) is fine.
///
/// # Errors
/// The link points into another run, named with its target.
fn refuse_foreign_checkpoints(run_dir: &Path) -> anyhow::Result<()> {
    let ckpts = crate::store::checkpoint::checkpoints_dir(run_dir);
    let is_link = std::fs::symlink_metadata(&ckpts).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return Ok(());
    }
    let (Ok(target), Ok(here)) = (ckpts.canonicalize(), run_dir.canonicalize()) else {
        return Ok(());
    };
    let owner = target
        .parent()
        .filter(|p| *p != here && p.join("run.json").is_file());
    if let Some(other) = owner {
        anyhow::bail!(
            "{} is a symbolic link to {}, the checkpoints of another run ({}): training here would \
             continue that run and delete its older checkpoints; remove the link, or resume that \
             run itself",
            ckpts.display(),
            target.display(),
            other.display()
        );
    }
    Ok(())
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        crate::log::close();
    }
}

/// The last completed step whose state can be saved after an error: the trainer's weights are
/// those of step `step` and `cursor` is the source cursor right after it. [`begin_update`]
/// marks the trainer as changing (an error then saves nothing: the weights would be half a step).
/// Where nothing is saved though steps were completed since the last checkpoint, the error
/// says which checkpoint `--resume` starts from.
///
/// [`begin_update`]: LastGood::begin_update
pub(crate) struct LastGood {
    step: u64,
    cursor: SourceCursor,
    saved: u64,
    updating: bool,
    /// The error about to end the run is one every rank met at the same point.
    together: bool,
    /// An update made a weight NaN or infinite ([`LastGood::diverged`]): nothing can be saved.
    diverged: bool,
}

/// Why a save after an error is not tried although the state is whole (the caller knows it
/// cannot succeed): a phrase completing "its state is not saved: ...".
pub(crate) type CannotSave = Option<String>;

impl LastGood {
    /// At the run's start (`step` = the resumed checkpoint's step, or 0).
    pub(crate) fn new(step: u64, cursor: SourceCursor) -> Self {
        LastGood {
            step,
            cursor,
            saved: step,
            updating: false,
            together: false,
            diverged: false,
        }
    }

    /// The error about to end the run is one every rank of a data-parallel run meets at the same
    /// point (`train.max_skipped_in_row`: the step's report is the whole batch's;
    /// `env.max_error_frac`: checked on the whole batch's counts; DAPO dynamic sampling's short
    /// batch with `train.dynamic_sampling_short_batch = "error"`: decided on the gathered
    /// groups), so the ranks
    /// can still gather together what the save after it needs ([`LastGood::gather_due`]).
    pub(crate) fn stopped_together(&mut self) {
        self.together = true;
    }

    /// The step whose save after the error the ranks gather for together, when they stopped
    /// together and a save is due (a whole step after step 0, not saved yet): the same answer on
    /// every rank, which all keep the same record.
    pub(crate) fn gather_due(&self) -> Option<u64> {
        (self.together && !self.updating && self.step > 0 && self.step > self.saved)
            .then_some(self.step)
    }

    /// Step `t`'s update made `weight` NaN or infinite
    /// ([`crate::update::optimizer::NonFiniteWeight`]): the error that ends the run, short and
    /// complete (the save after it is not tried: the weights are no longer any step's, and a save
    /// would refuse them). It says which step's weights the last checkpoint (in `checkpoints`)
    /// holds and what to change; `grad_clip` is `train.grad_clip` (0: off).
    pub(crate) fn diverged(
        &mut self,
        t: u64,
        weight: &str,
        checkpoints: &Path,
        grad_clip: f64,
    ) -> anyhow::Error {
        self.diverged = true;
        let last = match self.saved {
            0 => "no checkpoint was written yet (`rlvr train --resume` starts over from step 0)"
                .to_string(),
            s => format!(
                "the last checkpoint, {}, holds step {s}'s weights (`rlvr train --resume` \
                 continues from it)",
                checkpoints.join(format!("step-{s}")).display()
            ),
        };
        let clip = match grad_clip > 0.0 {
            true => format!("lower train.grad_clip (now {grad_clip})"),
            false => "set train.grad_clip (e.g. 1.0)".to_string(),
        };
        anyhow::anyhow!(
            "the training diverged at step {t}: its update made weight {weight} NaN or infinite, \
             so step {t} is not saved; {last}. Lower train.lr or {clip}"
        )
    }

    /// The trainer starts changing the weights of the step after `self.step`.
    pub(crate) fn begin_update(&mut self) {
        self.updating = true;
    }

    /// The update begun by [`LastGood::begin_update`] failed before it changed any weight (or
    /// the optimizer's state): the state is still the last completed step's, which an error
    /// then saves.
    pub(crate) fn update_undone(&mut self) {
        self.updating = false;
    }

    /// Step `t`'s update completed (the weights are step `t`'s, whatever fails after it:
    /// evaluation, logs, the push to the explorer); `cursor` is the source's cursor after it.
    pub(crate) fn completed(&mut self, t: u64, cursor: SourceCursor) {
        self.step = t;
        self.cursor = cursor;
        self.updating = false;
    }

    /// A checkpoint of step `t` was written.
    pub(crate) fn saved(&mut self, t: u64) {
        self.saved = self.saved.max(t);
    }

    /// The latest step with a checkpoint (the resumed one's at the start, 0 for none).
    pub(crate) fn saved_step(&self) -> u64 {
        self.saved
    }

    /// What `rlvr train --resume` starts from when nothing more is saved: the checkpoint of
    /// the latest saved step, or step 0 when there is none.
    fn resume_point(&self) -> String {
        match self.saved {
            0 => "`rlvr train --resume` starts the run over from step 0 (it has no checkpoint \
                  yet)"
                .to_string(),
            s if s + 1 == self.step => format!(
                "`rlvr train --resume` starts from the last checkpoint, step-{s}, and trains step \
                 {} again",
                self.step
            ),
            s => format!(
                "`rlvr train --resume` starts from the last checkpoint, step-{s}, and trains \
                 steps {}..={} again",
                s + 1,
                self.step
            ),
        }
    }

    /// On an error after step 1, saves the last good state with `save(step, cursor)` (as Ctrl-C
    /// does) unless it is already saved, and says so in the error. `cannot`: why the save is not
    /// tried though the state is whole (ZeRO-1 under data parallel: gathering the optimizer's
    /// shards needs every rank, which an error leaves in different places); the error then says
    /// plainly which checkpoint the resume starts from, as it does after an error in the middle
    /// of an optimizer update (the weights half a step, nothing saved).
    pub(crate) fn save_after_error<T>(
        &self,
        r: anyhow::Result<T>,
        cannot: CannotSave,
        save: impl FnOnce(u64, SourceCursor) -> anyhow::Result<PathBuf>,
    ) -> anyhow::Result<T> {
        let e = match r {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if self.step == 0 || self.step <= self.saved || self.diverged {
            return Err(e);
        }
        if self.updating {
            return Err(e.context(format!(
                "stopped by an error during the optimizer update of step {} (the weights are \
                 part way from step {} to it, so nothing is saved); {}",
                self.step + 1,
                self.step,
                self.resume_point()
            )));
        }
        if let Some(why) = cannot {
            return Err(e.context(format!(
                "stopped by an error after step {}; its state is not saved ({why}); {}",
                self.step,
                self.resume_point()
            )));
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

    /// A full disk while checkpointing fails the step and then the save after the error the same
    /// way: the message says it once (it used to print the whole chain twice, and the I/O cause
    /// twice within each).
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
            g.save_after_error(r, None, |_, _| Err(disk_full()))
                .unwrap_err()
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
            g.save_after_error(r, None, |_, _| Err(disk_full()))
                .unwrap_err()
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
        let r = g.save_after_error(err(), None, |_, _| panic!("saved step 0"));
        assert_eq!(r.unwrap_err().to_string(), "verifier broke");
        g.begin_update();
        g.completed(4, c(8));
        g.saved(2);
        // Step 4 completed, step 2 saved: step 4 is saved with the cursor right after it.
        let r = g.save_after_error(err(), None, |step, cur| {
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
        let r = g.save_after_error(err(), None, |_, _| panic!("saved a half step"));
        let e = format!("{:#}", r.unwrap_err());
        assert!(
            e.contains(
                "during the optimizer update of step 5 (the weights are part way from step 4 to \
                 it, so nothing is saved); `rlvr train --resume` starts from the last checkpoint, \
                 step-2, and trains steps 3..=4 again"
            ) && e.ends_with("verifier broke"),
            "{e}"
        );
        // An update that failed before changing any weight: step 4 is still whole, and saved.
        g.update_undone();
        let r = g.save_after_error(err(), None, |step, cur| {
            assert_eq!((step, cur), (4, c(8)));
            Ok(PathBuf::from("ckpt/step-4"))
        });
        assert!(format!("{:#}", r.unwrap_err()).contains("after step 4"));
        // Already saved: no second save; and Ok passes through.
        g.completed(5, c(10));
        g.saved(5);
        assert!(g
            .save_after_error(err(), None, |_, _| panic!("saved twice"))
            .is_err());
        assert!(g
            .save_after_error(Ok(()), None, |_, _| panic!("no error"))
            .is_ok());
    }

    /// A whole state the caller knows cannot be saved (ZeRO-1 under data parallel) is not
    /// tried: the error says why and which checkpoint the resume starts from (step-2, or step 0
    /// without one), never "saving its state failed too".
    #[test]
    fn a_state_that_cannot_be_saved_is_not_tried_and_the_resume_point_is_named() {
        let c = |g| SourceCursor::Offline { groups: g };
        let err = || -> anyhow::Result<()> { Err(anyhow::anyhow!("out of memory")) };
        let why = || Some("the optimizer state is sharded".to_string());
        let mut g = LastGood::new(0, c(0));
        g.begin_update();
        g.completed(3, c(6));
        g.saved(2);
        let r = g.save_after_error(err(), why(), |_, _| panic!("tried a save it cannot make"));
        let e = format!("{:#}", r.unwrap_err());
        assert_eq!(
            e,
            "stopped by an error after step 3; its state is not saved (the optimizer state is \
             sharded); `rlvr train --resume` starts from the last checkpoint, step-2, and trains \
             step 3 again: out of memory"
        );
        let mut g = LastGood::new(0, c(0));
        g.completed(1, c(2));
        let e = format!(
            "{:#}",
            g.save_after_error(err(), why(), |_, _| panic!("saved"))
                .unwrap_err()
        );
        assert!(
            e.contains("starts the run over from step 0 (it has no checkpoint yet)"),
            "{e}"
        );
        assert!(!e.contains("failed too"), "{e}");
        // Step 3 already saved: nothing to say beyond the error.
        let mut g = LastGood::new(3, c(6));
        g.saved(3);
        let e = g.save_after_error(err(), why(), |_, _| panic!("saved"));
        assert_eq!(e.unwrap_err().to_string(), "out of memory");
    }
}
