//! Guards of the directories rlvr writes (DESIGN.md section 12).
//!
//! One writer per run directory: an exclusive `flock` on the run directory itself, held for the
//! whole `rlvr train` (fresh or `--resume`), see [`RunLock`] (rlvr-rundir's, shared with the
//! lab); `RUN_DIR/.lock` holds the holder's
//! pid, host and start time for the refusal message. Locking the directory, not the file, means
//! that deleting `.lock` during a run no longer lets a second writer in (it used to: the second
//! process created and locked a new `.lock`, and both wrote metrics.jsonl). Model output
//! directories (`rlvr init --out`, `rlvr sft --out`, `rlvr merge --out`) are not overwritten unless
//! told `--force` and have one writer too (a `flock` on a `.NAME.lock` sibling), see
//! [`StagedOutput`].
//!
//! The operating system releases the lock when the holder's file descriptor closes, which includes
//! the holder dying by SIGKILL, so a killed run can always be resumed and no stale-lock cleanup is
//! ever needed. The lock file's content only serves the refusal message; the lock itself is the
//! truth. A holder that lets go normally removes its lock file (`.lock`, `.NAME.lock`); a killed
//! one's stays until the next holder lets go (rlvr-rundir's `lock` module says why that is safe).

use std::path::{Path, PathBuf};

use anyhow::Context;
use rlvr_rundir::lock::FileLock;

pub use rlvr_rundir::lock::{RunLock, LOCK_FILE, LOCK_GRACE};

/// Checks a model output directory before `flag` (e.g. `--out`) writes a model into it: a missing
/// or empty directory is fine (the temporaries a killed writer left in it are removed first,
/// [`rlvr_rundir::fs::remove_stale_temporaries`]); a non-empty one (or a file) is refused unless `force`. With `force`,
/// the weight files a loader could prefer over the new ones (`*.safetensors`,
/// `*.safetensors.index.json` at the top level, e.g. the shards of a HuggingFace model) are removed
/// first; other files are overwritten or left.
///
/// # Errors
/// A non-empty directory without `force` (the message names up to three of its entries and
/// `--force`); `out` is a file; I/O errors.
pub fn prepare_model_output(out: &Path, force: bool, flag: &str) -> anyhow::Result<()> {
    if !out.exists() {
        return Ok(());
    }
    anyhow::ensure!(
        out.is_dir(),
        "{flag} {} is a file, not a directory",
        out.display()
    );
    // What an earlier writer killed mid-write left (`.NAME.tmp-PID`) is no content: a rerun of
    // the killed command into the same directory needs no --force.
    rlvr_rundir::fs::remove_stale_temporaries(out);
    let mut names: Vec<String> = std::fs::read_dir(out)
        .with_context(|| format!("reading {}", out.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    if !force {
        let shown: Vec<&str> = names.iter().take(3).map(String::as_str).collect();
        anyhow::bail!(
            "{flag} {} is not empty (it holds {}{}); refusing to overwrite it: choose a new or empty \
             directory, or add --force to write the new model over it",
            out.display(),
            shown.join(", "),
            if names.len() > 3 { ", ..." } else { "" }
        );
    }
    for n in &names {
        let p = out.join(n);
        if p.is_file() && (n.ends_with(".safetensors") || n.ends_with(".safetensors.index.json")) {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    Ok(())
}

/// Where a command writes a model directory for `--out`: straight into it when it is missing or
/// empty, or, with `--force` over a non-empty one, into a staging sibling
/// (`.NAME.staging`) that [`StagedOutput::commit`] moves into place only once the command has
/// succeeded, so a `--force` run that fails leaves the old model whole.
///
/// One writer per `--out`: an exclusive `flock` on the sibling `.NAME.lock` (beside `--out`, as
/// `--out` itself may not exist yet or be replaced), held until the value is dropped, which
/// removes the file (a killed writer's stays, naming a process that is gone, and blocks nothing). Two `rlvr
/// sft --force --out X` at once used to share one staging directory and interleave their metrics.
#[derive(Debug)]
pub struct StagedOutput {
    out: PathBuf,
    staging: Option<PathBuf>,
    // Keeping it keeps the lock; dropped last (after `commit`'s moves), it removes `.NAME.lock`.
    _lock: FileLock,
}

/// Takes the one-writer lock of model output directory `out` ([`StagedOutput`]): its sibling
/// `.NAME.lock`, parents created ([`FileLock`]: removed when released; a killed writer's stays and
/// blocks nothing).
///
/// # Errors
/// Another process holds it (named, with `flag`); I/O errors.
fn lock_output(out: &Path, flag: &str) -> anyhow::Result<FileLock> {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let path = out.with_file_name(format!(".{name}.lock"));
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    match FileLock::acquire(&path)? {
        Ok(lock) => Ok(lock),
        Err(holder) => anyhow::bail!(
            "{flag} {} is being written by another rlvr process ({holder}); an output directory \
             has one writer at a time: wait for it to finish, stop it, or choose another {flag} \
             (lock file {})",
            out.display(),
            path.display()
        ),
    }
}

impl StagedOutput {
    /// Checks `out` as [`prepare_model_output`] does (a non-empty directory only with `force`, never
    /// a file) without removing anything from it; over a non-empty one, prepares a fresh, empty
    /// staging sibling (replacing one a failed earlier run left).
    ///
    /// # Errors
    /// As [`prepare_model_output`]; I/O errors naming the staging directory.
    pub fn prepare(out: &Path, force: bool, flag: &str) -> anyhow::Result<StagedOutput> {
        let lock = lock_output(out, flag)?;
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "out".into());
        let staging = out.with_file_name(format!(".{name}.staging"));
        // With the lock held no other process writes this staging directory: one that exists
        // was left by a `--force` run that was killed or failed. It goes first, whatever this
        // run does (it used to stay until the next `--force` over a non-empty `--out`).
        if staging.exists() {
            std::fs::remove_dir_all(&staging)
                .with_context(|| format!("removing {}", staging.display()))?;
            eprintln!(
                "removed {}, left by an earlier {flag} {} run with --force that was killed or failed",
                staging.display(),
                out.display()
            );
        }
        let non_empty = out.is_dir()
            && std::fs::read_dir(out)
                .with_context(|| format!("reading {}", out.display()))?
                .next()
                .is_some();
        if !(non_empty && force) {
            prepare_model_output(out, force, flag)?;
            return Ok(StagedOutput {
                out: out.to_path_buf(),
                staging: None,
                _lock: lock,
            });
        }
        std::fs::create_dir_all(&staging)
            .with_context(|| format!("creating {}", staging.display()))?;
        Ok(StagedOutput {
            out: out.to_path_buf(),
            staging: Some(staging),
            _lock: lock,
        })
    }

    /// The directory to write the model into now.
    pub fn path(&self) -> &Path {
        self.staging.as_deref().unwrap_or(&self.out)
    }

    /// The staging directory, when there is one (the output goes to `--out` on commit).
    pub fn staging(&self) -> Option<&Path> {
        self.staging.as_deref()
    }

    /// Moves a staged model into `--out`: each entry renamed over its namesake (a rename replaces
    /// a file atomically, so the new weights are in place before anything old goes), then the
    /// weight files of the old model the new one did not write (`*.safetensors`,
    /// `*.safetensors.index.json`, e.g. stale shards a loader could prefer) removed, then the
    /// staging directory. Other files of `--out` are left. Nothing to do without staging.
    ///
    /// # Errors
    /// I/O errors naming the paths.
    pub fn commit(self) -> anyhow::Result<()> {
        let Some(staging) = &self.staging else {
            return Ok(());
        };
        let mut written = Vec::new();
        for e in
            std::fs::read_dir(staging).with_context(|| format!("reading {}", staging.display()))?
        {
            let e = e?;
            let dest = self.out.join(e.file_name());
            if dest.is_dir() && !dest.is_symlink() {
                std::fs::remove_dir_all(&dest)
                    .with_context(|| format!("removing {}", dest.display()))?;
            }
            std::fs::rename(e.path(), &dest)
                .with_context(|| format!("moving {} to {}", e.path().display(), dest.display()))?;
            written.push(e.file_name());
        }
        for e in std::fs::read_dir(&self.out)
            .with_context(|| format!("reading {}", self.out.display()))?
        {
            let e = e?;
            let n = e.file_name().to_string_lossy().into_owned();
            let weights = n.ends_with(".safetensors") || n.ends_with(".safetensors.index.json");
            if weights && e.path().is_file() && !written.contains(&e.file_name()) {
                std::fs::remove_file(e.path())
                    .with_context(|| format!("removing {}", e.path().display()))?;
            }
        }
        std::fs::remove_dir_all(staging)
            .with_context(|| format!("removing {}", staging.display()))?;
        Ok(())
    }
}

/// Refuses an output directory that is the input model directory itself (`rlvr sft --model X
/// --out X` would overwrite its input while reading it), whatever `--force` says.
///
/// # Errors
/// `out` and `model` are the same directory.
pub fn refuse_same_dir(model: &Path, out: &Path) -> anyhow::Result<()> {
    if let (Ok(m), Ok(o)) = (model.canonicalize(), out.canonicalize()) {
        anyhow::ensure!(
            m != o,
            "--out {} is the --model directory: writing there would overwrite the model being \
             trained from (--force does not change this); choose another --out",
            out.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_output_is_refused_when_not_empty_unless_forced() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("m");
        prepare_model_output(&out, false, "--out").unwrap(); // missing
        std::fs::create_dir(&out).unwrap();
        prepare_model_output(&out, false, "--out").unwrap(); // empty
        for f in [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model.safetensors.index.json",
            "notes.txt",
        ] {
            std::fs::write(out.join(f), "x").unwrap();
        }
        let e = prepare_model_output(&out, false, "--out")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not empty") && e.contains("--force"), "{e}");
        assert!(e.contains("config.json"), "{e}");
        // Nothing was removed by the refusal.
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 4);
        prepare_model_output(&out, true, "--out").unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["config.json", "notes.txt"]);
        let e = refuse_same_dir(&out, &d.path().join("m/../m")).unwrap_err();
        assert!(e.to_string().contains("is the --model directory"), "{e}");
        refuse_same_dir(&out, &d.path().join("other")).unwrap();
    }

    /// The staging directory a killed or failed `--force` run left (`.NAME.staging`, a model's
    /// worth) is removed by the next start for the same `--out`, under its lock, whether that run
    /// writes in place, stages, or is refused (it used to stay unless the next run was a
    /// `--force` over a non-empty `--out`).
    #[test]
    fn a_staging_directory_left_behind_goes_at_the_next_start() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("m");
        let staging = d.path().join(".m.staging");
        let leave = || {
            std::fs::create_dir_all(&staging).unwrap();
            std::fs::write(staging.join("model.safetensors"), "half").unwrap();
        };
        // --out missing: written in place.
        leave();
        let s = StagedOutput::prepare(&out, false, "--out").unwrap();
        assert!(s.staging().is_none() && !staging.exists());
        drop(s);
        // --out not empty, no --force: refused, and the leftover still goes.
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("config.json"), "{}").unwrap();
        leave();
        let e = StagedOutput::prepare(&out, false, "--out").unwrap_err();
        assert!(e.to_string().contains("is not empty"), "{e}");
        assert!(!staging.exists());
        // --force over it: a fresh, empty staging directory.
        leave();
        let s = StagedOutput::prepare(&out, true, "--out").unwrap();
        assert_eq!(s.staging(), Some(staging.as_path()));
        assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);
    }

    /// `.NAME.lock` goes when the writer lets go (in place, or after a `--force` commit); a killed
    /// writer's file (here written by hand, nobody holding it) blocks nothing and is taken over;
    /// a live writer's blocks a second one, which is refused naming it. The file used to stay
    /// beside every model directory written.
    #[test]
    fn the_output_lock_file_goes_when_the_writer_lets_go() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("m");
        let lock = d.path().join(".m.lock");
        std::fs::write(&lock, "pid 4242\nhost h\nstarted then\n").unwrap();
        let s = StagedOutput::prepare(&out, false, "--out").unwrap();
        let me = format!("pid {}", std::process::id());
        assert!(std::fs::read_to_string(&lock).unwrap().starts_with(&me));
        let e = StagedOutput::prepare(&out, false, "--out")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "being written by another rlvr process ({me}, host "
            )),
            "{e}"
        );
        drop(s);
        assert!(
            !lock.exists(),
            "the lock file stayed after the writer let go"
        );
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("config.json"), "{}").unwrap();
        let s = StagedOutput::prepare(&out, true, "--out").unwrap();
        std::fs::write(s.path().join("model.safetensors"), "new").unwrap();
        assert!(lock.exists());
        s.commit().unwrap();
        assert!(!lock.exists(), "the lock file stayed after a commit");
        assert_eq!(
            std::fs::read_to_string(out.join("model.safetensors")).unwrap(),
            "new"
        );
    }
}
