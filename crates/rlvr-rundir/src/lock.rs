//! One writer: the exclusive `flock` that every directory rlvr writes is guarded by (DESIGN.md
//! section 12), written once.
//!
//! - [`try_flock`]: the primitive (fs4's `try_lock`, i.e. `flock(LOCK_EX | LOCK_NB)`), also taken
//!   by rlvr-vllm's server leases, rlvr-train's model output locks and its checkpoint rotation;
//!   [`flock_shared`], a checkpoint reader's side of the rotation.
//! - [`RunLock`]: the run directory's lock, an `flock` on the directory itself, held for the whole
//!   `rlvr train` ([`RunLock::acquire`], which writes the holder's pid, host and start time into
//!   `RUN_DIR/.lock` for the refusal message) and by the lab while it decides about a run
//!   ([`RunLock::try_hold`]). Locking the directory, not the file, means that deleting `.lock`
//!   during a run does not let a second writer in.
//!
//! The operating system releases the lock when the holder's file descriptor closes, which includes
//! the holder dying by SIGKILL, so a killed run can always be resumed and no stale-lock cleanup is
//! ever needed. The lock file's content only serves the refusal message; the lock itself is the
//! truth.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use fs4::{FileExt, TryLockError};

pub use crate::files::LOCK as LOCK_FILE;

/// How long a busy lock is retried by [`flock_with_grace`] before the refusal (a holder that was
/// just killed needs a moment to release it).
pub const LOCK_GRACE: Duration = Duration::from_secs(2);

/// Takes an exclusive `flock` on `file` without waiting: `Ok(true)` when taken, `Ok(false)` when
/// another open file description holds it (another process, or another open in this one).
///
/// # Errors
/// A locking error other than "held".
pub fn try_flock(file: &File) -> std::io::Result<bool> {
    // Called through the trait: std's inherent File::try_lock has the same name.
    match FileExt::try_lock(file) {
        Ok(()) => Ok(true),
        Err(TryLockError::WouldBlock) => Ok(false),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// Takes a shared `flock` on `file`, waiting while an exclusive one is held: what a reader of a
/// checkpoint holds (`rlvr eval --model RUN`) so that the run's rotation, which deletes a
/// checkpoint only under [`try_flock`], leaves it in place.
///
/// # Errors
/// A locking error.
pub fn flock_shared(file: &File) -> std::io::Result<()> {
    FileExt::lock_shared(file)
}

/// [`try_flock`], trying a busy lock again every 50 ms for up to [`LOCK_GRACE`] (a holder that was
/// just killed, e.g. by the SIGKILL of a parent `rlvr lab` reaching its children, releases it only
/// once the kernel has closed its files). `Ok(false)` when another process still holds it.
///
/// # Errors
/// A locking error other than "held", naming `what`.
pub fn flock_with_grace(file: &File, what: &Path) -> anyhow::Result<bool> {
    let t0 = std::time::Instant::now();
    loop {
        match try_flock(file).with_context(|| format!("locking {}", what.display()))? {
            true => return Ok(true),
            false if t0.elapsed() < LOCK_GRACE => std::thread::sleep(Duration::from_millis(50)),
            false => return Ok(false),
        }
    }
}

/// What the holder of a lock wrote into `info` (`pid …, host …, started …`), or why it is unknown
/// (the file was removed; nothing written yet).
pub fn holder_of(info: &Path) -> String {
    let mut holder = String::new();
    match File::open(info) {
        Ok(mut f) => {
            let _ = f.read_to_string(&mut holder);
        }
        Err(_) => return format!("its {} was removed", info.display()),
    }
    match holder.trim() {
        "" => "it has not written its pid yet".to_string(),
        h => h.replace('\n', ", "),
    }
}

/// Writes this process's pid, host and start time into `path` (created or truncated, synced).
///
/// # Errors
/// I/O errors naming the file.
pub fn write_holder(path: &Path) -> anyhow::Result<()> {
    let info = format!(
        "pid {}\nhost {}\nstarted {}\n",
        std::process::id(),
        crate::stamp::host(),
        crate::stamp::now_rfc3339()
    );
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    file.set_len(0)
        .and_then(|_| file.seek(SeekFrom::Start(0)))
        .and_then(|_| file.write_all(info.as_bytes()))
        .and_then(|_| file.sync_data())
        .with_context(|| format!("writing {}", path.display()))
}

/// An exclusive lock on a run directory; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct RunLock {
    // Keeping the descriptor open keeps the lock.
    _dir: File,
    path: PathBuf,
}

impl RunLock {
    /// Takes the lock of `run_dir` (which must exist: the `flock` is on the directory), waiting
    /// at most [`LOCK_GRACE`] for a busy one, and writes this process's pid, host and start time
    /// into `RUN_DIR/.lock`. What `rlvr train` holds for the whole run.
    ///
    /// # Errors
    /// Another process holds the lock: the message names its pid, host and start time as it
    /// wrote them. I/O errors name the directory or the lock file.
    pub fn acquire(run_dir: &Path) -> anyhow::Result<RunLock> {
        let path = run_dir.join(LOCK_FILE);
        let dir = open_dir(run_dir)?;
        if !flock_with_grace(&dir, run_dir)? {
            anyhow::bail!(
                "{} is in use by another rlvr process ({}); a run directory has one writer at a \
                 time: wait for it to finish, stop it, or choose another output.dir (lock file {})",
                run_dir.display(),
                holder_of(&path),
                path.display()
            );
        }
        write_holder(&path)?;
        Ok(RunLock { _dir: dir, path })
    }

    /// Takes the lock of the existing run directory `run_dir` without waiting and without writing
    /// a holder record (the lab holds it only while it decides about the run): `Ok(Ok(lock))`
    /// when it was free, `Ok(Err(holder))` when another process holds it (`holder`: what
    /// [`holder_of`] reads from `RUN_DIR/.lock`).
    ///
    /// # Errors
    /// Opening the directory, or a locking error other than "held".
    pub fn try_hold(run_dir: &Path) -> anyhow::Result<Result<RunLock, String>> {
        let path = run_dir.join(LOCK_FILE);
        let dir = open_dir(run_dir)?;
        if try_flock(&dir).with_context(|| format!("locking {}", run_dir.display()))? {
            Ok(Ok(RunLock { _dir: dir, path }))
        } else {
            Ok(Err(holder_of(&path)))
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn open_dir(run_dir: &Path) -> anyhow::Result<File> {
    File::open(run_dir)
        .with_context(|| format!("opening the run directory {} to lock it", run_dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_and_names_the_holder() {
        let d = tempfile::tempdir().unwrap();
        let a = RunLock::acquire(d.path()).unwrap();
        // flock locks belong to the open file description: a second open in this process conflicts.
        let e = RunLock::acquire(d.path()).unwrap_err().to_string();
        assert!(e.contains("in use by another rlvr process"), "{e}");
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        assert!(e.contains("host "), "{e}");
        assert!(e.contains("started 20"), "{e}");
        let held = RunLock::try_hold(d.path()).unwrap().unwrap_err();
        assert!(
            held.starts_with(&format!("pid {}, host ", std::process::id())),
            "{held}"
        );
        drop(a);
        // Released on drop.
        let b = RunLock::acquire(d.path()).unwrap();
        assert_eq!(b.path(), d.path().join(LOCK_FILE));
        drop(b);
        let h = RunLock::try_hold(d.path()).unwrap().unwrap();
        std::fs::remove_file(d.path().join(LOCK_FILE)).unwrap();
        let e = RunLock::try_hold(d.path()).unwrap().unwrap_err();
        assert!(e.contains(".lock was removed"), "{e}");
        drop(h);
        // A missing directory is an error naming it.
        let e = RunLock::try_hold(&d.path().join("none")).unwrap_err();
        assert!(format!("{e:#}").contains("to lock it"), "{e:#}");
    }
}
