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
//! - [`FileLock`]: an exclusive `flock` on a lock file of its own (`.NAME.lock` beside a model
//!   output directory, rlvr-train's `StagedOutput`), for what cannot be locked itself (a
//!   directory that may not exist yet or is replaced).
//!
//! The operating system releases the lock when the holder's file descriptor closes, which includes
//! the holder dying by SIGKILL, so a dead holder's lock never blocks: a killed run can always be
//! resumed, and a live holder's always does. The lock file's content only serves the refusal
//! message; the lock itself is the truth.
//!
//! What stays on disk: a holder that lets go normally (a clean exit, an error, an interrupted run
//! that saved and stopped) removes its lock file while it still holds the lock (`RUN_DIR/.lock`,
//! `.NAME.lock`); a killed one's stays, naming a process that is gone, and blocks nothing. The next
//! holder takes it over and removes it in turn. Removing a lock file is safe because a
//! [`FileLock`] taken on a file that was meanwhile removed (or replaced) is let go and taken again
//! on the file the path names now, so two processes never hold locks on two different files of
//! one path; the run directory's lock is the directory's own, so its `.lock` can go at any time.

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

/// An exclusive lock on a run directory; released when dropped (or when the process ends). Dropping
/// it removes `RUN_DIR/.lock` first (the lock is the directory's, so no other process can be
/// relying on that file while this one holds it): a run that ends, fails or is stopped leaves no
/// lock file; a killed one's stays and blocks nothing.
#[derive(Debug)]
pub struct RunLock {
    // Keeping the descriptor open keeps the lock.
    _dir: File,
    path: PathBuf,
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Still held here (the descriptor closes after this body): removing the holder record
        // cannot race another writer's.
        let _ = std::fs::remove_file(&self.path);
    }
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

/// An exclusive `flock` on a lock file of its own (e.g. `.NAME.lock` beside a model output
/// directory), holding the holder's pid, host and start time for the refusal message; released
/// when dropped (or when the process ends). Dropping it removes the file while the lock is still
/// held; a killed holder's file stays and is taken over by the next [`FileLock::acquire`].
#[derive(Debug)]
pub struct FileLock {
    // Keeping the descriptor open keeps the lock.
    file: File,
    path: PathBuf,
}

impl FileLock {
    /// Takes the lock of `path` (created when missing; its parent must exist), waiting at most
    /// [`LOCK_GRACE`] for a busy one, and writes this process's pid, host and start time into it.
    /// `Ok(Err(holder))` when another process holds it (`holder`: what [`holder_of`] reads).
    ///
    /// A lock taken on a file that its holder removed meanwhile (it let go while this process
    /// waited) is let go and taken again on the file `path` names now, so that two processes
    /// never hold locks on two different files of one path.
    ///
    /// # Errors
    /// Opening or writing the file, or a locking error other than "held", naming it.
    pub fn acquire(path: &Path) -> anyhow::Result<Result<FileLock, String>> {
        for _ in 0..100 {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .with_context(|| format!("opening the lock file {}", path.display()))?;
            if !flock_with_grace(&file, path)? {
                return Ok(Err(holder_of(path)));
            }
            if same_file(&file, path) {
                write_holder(path)?;
                return Ok(Ok(FileLock {
                    file,
                    path: path.to_path_buf(),
                }));
            }
            // The file this lock is on is no longer the one `path` names: try again.
        }
        anyhow::bail!(
            "{}: the lock file kept being replaced while it was being locked",
            path.display()
        )
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // Still held here. Only our own file goes (never one that replaced it by hand).
        if same_file(&self.file, &self.path) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether the open `file` is the file `path` names now (same device and inode); `false` when
/// `path` is gone.
fn same_file(file: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        path.exists()
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
        // Released on drop, and the holder record with it.
        assert!(!d.path().join(LOCK_FILE).exists());
        let b = RunLock::acquire(d.path()).unwrap();
        assert_eq!(b.path(), d.path().join(LOCK_FILE));
        std::fs::remove_file(d.path().join(LOCK_FILE)).unwrap();
        let e = RunLock::try_hold(d.path()).unwrap().unwrap_err();
        assert!(e.contains(".lock was removed"), "{e}");
        drop(b);
        // A killed holder's record stays behind and blocks nothing; the next holder's drop
        // removes it.
        std::fs::write(d.path().join(LOCK_FILE), "pid 4242\nhost h\nstarted then\n").unwrap();
        let h = RunLock::try_hold(d.path()).unwrap().unwrap();
        drop(h);
        assert!(!d.path().join(LOCK_FILE).exists());
        // A missing directory is an error naming it.
        let e = RunLock::try_hold(&d.path().join("none")).unwrap_err();
        assert!(format!("{e:#}").contains("to lock it"), "{e:#}");
    }

    /// A clean release removes the lock file; a live holder blocks (named); a holder killed by
    /// SIGKILL blocks nothing, its file is taken over and removed at the next release. The holder
    /// is this test binary run again as [`hold_a_file_lock_for_the_parent`].
    #[cfg(target_os = "linux")]
    #[test]
    fn a_file_lock_goes_on_release_blocks_while_its_holder_lives_and_not_after_a_kill() {
        use std::io::BufRead;
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(".out.lock");
        let mine = FileLock::acquire(&path).unwrap().unwrap();
        assert_eq!(mine.path(), path);
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .starts_with(&format!("pid {}\n", std::process::id())));
        drop(mine);
        assert!(!path.exists(), "a released lock file stayed");

        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "lock::tests::hold_a_file_lock_for_the_parent",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOLD_ENV, &path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.contains("held") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the holder ended");
        }
        let holder = FileLock::acquire(&path).unwrap().unwrap_err();
        assert!(
            holder.starts_with(&format!("pid {}, host ", child.id())),
            "{holder}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        // The dead holder's file is still there, and blocks nothing.
        assert!(path.exists());
        let t0 = std::time::Instant::now();
        let next = FileLock::acquire(&path).unwrap().unwrap();
        assert!(t0.elapsed() < LOCK_GRACE, "{:?}", t0.elapsed());
        drop(next);
        assert!(!path.exists());
    }

    const HOLD_ENV: &str = "RLVR_TEST_HOLD_FILE_LOCK";

    /// Not a test of its own: run by the test above as a separate process, it takes the lock
    /// named by `RLVR_TEST_HOLD_FILE_LOCK`, says `held` and waits to be killed.
    #[test]
    fn hold_a_file_lock_for_the_parent() {
        let Ok(p) = std::env::var(HOLD_ENV) else {
            return;
        };
        let _held = FileLock::acquire(Path::new(&p)).unwrap().unwrap();
        println!("held");
        std::thread::sleep(Duration::from_secs(120));
    }

    /// The release's removal cannot let two processes in: a waiter that locked the removed file
    /// takes the lock again on the path's new file, and a third is refused (before, the waiter
    /// kept a lock on the removed file while the third created and locked a new one).
    #[test]
    fn a_waiter_on_a_released_and_removed_lock_file_locks_the_new_one() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join(".out.lock");
        let first = FileLock::acquire(&path).unwrap().unwrap();
        let p2 = path.clone();
        // Waits within the grace period, its descriptor on the first holder's file.
        let waiter = std::thread::spawn(move || FileLock::acquire(&p2).unwrap().unwrap());
        std::thread::sleep(Duration::from_millis(300));
        drop(first);
        let second = waiter.join().unwrap();
        assert!(
            same_file(&second.file, &path),
            "the waiter holds a removed file"
        );
        let third = FileLock::acquire(&path).unwrap();
        assert!(third.is_err(), "a second holder got in");
        drop(second);
        assert!(!path.exists());
    }
}
