//! Atomic file replacement.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Replaces `path` with `bytes` atomically: written to `.NAME.tmp-PID` beside it, synced, renamed
/// over it, then the directory synced, so a reader (or a crash) sees the old file or the new one,
/// never a part. The temporary file is removed when a step fails.
///
/// # Errors
/// The I/O error of the step that failed (the caller names the file).
pub fn atomic_write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    atomic_write_with(path, &mut |w| w.write_all(bytes))
}

/// [`atomic_write`] of what `write` writes, streamed through a buffered writer into the temporary
/// file: a large file (a checkpoint's weights) is never built in memory. Renamed over `path` only
/// when `write` and the sync succeed; on any error the temporary file is removed and `path` keeps
/// its old content.
///
/// # Errors
/// The error of `write`, or the I/O error of the step that failed (the caller names the file).
pub fn atomic_write_with(
    path: &Path,
    write: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let res = (|| -> std::io::Result<()> {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
        write(&mut w)?;
        let f = w
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Removes from `dir` the temporary files [`atomic_write`] left behind when its process was
/// killed between writing and renaming (`.NAME.tmp-PID`; `rlvr sft`, a checkpoint or an export
/// stopped by `kill -9`, possibly as large as the weights). Only those whose process is gone are
/// removed: on Linux, no `/proc/PID`; where there is no `/proc`, none is removed. A live one's
/// (another writer's, this process's) stays. Never read as the real file (another name), they
/// only take room. Returns the paths removed; `dir` missing or unreadable removes nothing.
pub fn remove_stale_temporaries(dir: &Path) -> Vec<PathBuf> {
    remove_stale_entries(dir, temporary_pid)
        .into_iter()
        .filter_map(|(p, kind)| (kind == StaleKind::File).then_some(p))
        .collect()
}

/// [`remove_stale_temporaries`] for one file: removes beside `path` only the temporaries of
/// `path` itself (`.NAME.tmp-PID` for `path`'s NAME) whose writer is gone, what a command that owns
/// one output file but not its directory may clean (`rlvr eval --out FILE`: a kill during its
/// atomic write left one, possibly large). Other files and other names' temporaries stay. Returns
/// the paths removed.
pub fn remove_stale_temporaries_of(path: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = format!(".{name}.tmp-");
    let pid_of = |n: &str| temporary_pid(n).filter(|_| n.starts_with(&prefix));
    remove_stale_entries(dir, pid_of)
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

/// What [`remove_stale_entries`] removed: a file or a whole directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StaleKind {
    /// A regular file.
    File,
    /// A directory, removed with everything in it.
    Dir,
}

/// Whether the process `pid`, which wrote a temporary named after it, is gone: on Linux, no
/// `/proc/PID`. `false` where there is no `/proc` (nothing can be told gone, so nothing is removed).
pub fn writer_gone(pid: u32) -> bool {
    Path::new("/proc/self").exists() && !Path::new("/proc").join(pid.to_string()).exists()
}

/// The rule of [`remove_stale_temporaries`] for any naming scheme: removes from `dir` each regular
/// file and each directory (with its contents) whose name `pid_of` maps to the PID of its writer,
/// when that process is gone ([`writer_gone`]). Symbolic links and entries of live writers (this
/// process's, another running one's) stay. Used for the vLLM backend's weight-refresh folders
/// (`.tmp-version-N-PID`) and `rlvr eval`/`generate`'s private temporary directories. Returns
/// what was removed, sorted; `dir` missing or unreadable removes nothing.
pub fn remove_stale_entries(
    dir: &Path,
    pid_of: impl Fn(&str) -> Option<u32>,
) -> Vec<(PathBuf, StaleKind)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(&pid_of) else {
            continue;
        };
        if !writer_gone(pid) {
            continue;
        }
        let Ok(t) = e.file_type() else { continue };
        let (ok, kind) = if t.is_file() {
            (std::fs::remove_file(e.path()).is_ok(), StaleKind::File)
        } else if t.is_dir() {
            (std::fs::remove_dir_all(e.path()).is_ok(), StaleKind::Dir)
        } else {
            continue;
        };
        if ok {
            removed.push((e.path(), kind));
        }
    }
    removed.sort();
    removed
}

/// The PID of an [`atomic_write`] temporary's name (`.NAME.tmp-PID`), `None` for any other name.
fn temporary_pid(name: &str) -> Option<u32> {
    let (stem, pid) = name.rsplit_once(".tmp-")?;
    if !stem.starts_with('.')
        || stem.len() < 2
        || pid.is_empty()
        || !pid.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.json");
        std::fs::write(&p, "old").unwrap();
        atomic_write(&p, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
        // A missing directory fails and leaves nothing behind.
        assert!(atomic_write(&d.path().join("no/a.json"), b"x").is_err());
    }

    /// A streamed write lands whole; one whose writer fails part-way leaves the old file and no
    /// temporary.
    #[test]
    fn a_failed_streamed_write_keeps_the_old_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("w.bin");
        atomic_write_with(&p, &mut |w| (0..3u8).try_for_each(|i| w.write_all(&[i; 4]))).unwrap();
        assert_eq!(
            std::fs::read(&p).unwrap(),
            [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
        );
        let err = atomic_write_with(&p, &mut |w| {
            w.write_all(b"partial")?;
            Err(std::io::Error::other("the third tensor failed"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "the third tensor failed");
        assert_eq!(std::fs::read(&p).unwrap().len(), 12);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    /// A killed writer's temporaries go; a live process's, look-alikes and other files stay.
    /// Linux only (the liveness check reads /proc; elsewhere nothing is removed).
    #[cfg(target_os = "linux")]
    #[test]
    fn stale_temporaries_of_dead_processes_are_removed() {
        let d = tempfile::tempdir().unwrap();
        // A PID that was just freed: a child that exited and was waited for.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        let names = [
            format!(".tokenizer.json.tmp-{dead}"),
            format!(".model.safetensors.tmp-{dead}"),
            format!(".config.json.tmp-{me}"),
            format!("tokenizer.json.tmp-{dead}"),
            format!(".x.tmp-{dead}a"),
            ".x.tmp-".to_string(),
            "tokenizer.json".to_string(),
        ];
        for n in &names {
            std::fs::write(d.path().join(n), "x").unwrap();
        }
        let removed = remove_stale_temporaries(d.path());
        let want: Vec<PathBuf> = vec![d.path().join(&names[1]), d.path().join(&names[0])];
        assert_eq!(removed, want);
        for n in &names[2..] {
            assert!(d.path().join(n).exists(), "{n}");
        }
        assert!(remove_stale_temporaries(&d.path().join("missing")).is_empty());
    }

    /// One file's temporaries: a dead writer's of that name go; another name's, a live writer's
    /// and the file itself stay.
    #[cfg(target_os = "linux")]
    #[test]
    fn stale_temporaries_of_one_file_are_removed_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        let names = [
            format!(".items.jsonl.tmp-{dead}"),
            format!(".items.jsonl.tmp-{me}"),
            format!(".other.jsonl.tmp-{dead}"),
            "items.jsonl".to_string(),
        ];
        for n in &names {
            std::fs::write(d.path().join(n), "x").unwrap();
        }
        let removed = remove_stale_temporaries_of(&d.path().join("items.jsonl"));
        assert_eq!(removed, vec![d.path().join(&names[0])]);
        for n in &names[1..] {
            assert!(d.path().join(n).exists(), "{n}");
        }
    }

    /// Any naming scheme: a dead writer's files and whole directories go; a live writer's, names
    /// without a PID and symbolic links stay.
    #[cfg(target_os = "linux")]
    #[test]
    fn stale_entries_of_dead_writers_are_removed_directories_included() {
        let d = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        let pid_of = |n: &str| n.strip_prefix("tmp-")?.parse::<u32>().ok();
        let dir = d.path().join(format!("tmp-{dead}"));
        std::fs::create_dir_all(dir.join("inner")).unwrap();
        std::fs::write(dir.join("inner/model.safetensors"), "x").unwrap();
        std::fs::write(d.path().join(format!("tmp-{me}")), "live").unwrap();
        std::fs::create_dir(d.path().join("tmp-x")).unwrap();
        let target = d.path().join("target");
        std::fs::create_dir(&target).unwrap();
        let link_dir = tempfile::tempdir().unwrap();
        let link = link_dir.path().join(format!("tmp-{dead}"));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let removed = remove_stale_entries(d.path(), pid_of);
        assert_eq!(removed, vec![(dir.clone(), StaleKind::Dir)]);
        assert!(!dir.exists());
        assert!(d.path().join(format!("tmp-{me}")).is_file());
        assert!(d.path().join("tmp-x").is_dir());
        // A link named as a dead writer's temporary is left, and so is what it points to.
        assert!(remove_stale_entries(link_dir.path(), pid_of).is_empty());
        assert!(link.symlink_metadata().is_ok() && target.is_dir());
    }
}
