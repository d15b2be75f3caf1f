//! One run per server (issue 34): a vLLM server holds one set of weights, so two processes
//! pushing weights to it would each sample with the other's policy. Two guards:
//!
//! - **The lease** ([`ServerLease`]): an exclusive `flock` on a lease file per server URL in a
//!   directory shared by one user's processes on one machine ([`default_lease_dir`]:
//!   `$RLVR_LEASE_DIR`, else `rlvr-vllm-leases-UID` in the temporary directory). `rlvr train` takes it for its whole life
//!   and rewrites the file with its run and policy version at every weight refresh
//!   ([`ServerLease::tag`]); `rlvr eval` and `rlvr generate` take it while they run unless told
//!   `--share-server`. A second taker is refused with a message naming the holder (its run
//!   directory, pid, host and version). The kernel releases a dead holder's lock, so no stale lease
//!   is ever left. It only sees processes that share the lease directory (one machine, or a shared
//!   filesystem through `$RLVR_LEASE_DIR`); servers spelled by two URLs (`localhost` and
//!   `127.0.0.1` are folded together) are two leases.
//! - **The weights' fingerprint**, which holds across machines: after every successful refresh the
//!   client remembers the refresh check (a fixed sequence and its log-probs under the pushed
//!   weights) and, after every sampling call, scores it again on every server
//!   ([`crate::VllmClient::sample`]). A server whose weights changed since the refresh (another
//!   process reloaded it) fails the call, so its samples are never used.
//!
//! The lease directory usually lies in a world-writable `/tmp`, so it is treated like ssh's and
//! tmux's socket directories (issue 49): rlvr creates it with mode 0700, and uses an existing one
//! only if it is a real directory (not a symbolic link) owned by the current user and not writable
//! by group or others ([`check_lease_dir`]); otherwise it refuses, naming the path and the ways
//! out. Lease files are opened with `O_NOFOLLOW` (a planted symbolic link is refused, never written
//! through) and must be regular files owned by the current user.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rlvr_rundir::lock::try_flock;
use rlvr_rundir::stamp::host;

use crate::error::{io, Result, VllmError};

/// Who takes a lease: written into the lease file for the refusal message of the next taker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// What holds it, e.g. `training run /abs/run` or `rlvr eval`.
    pub owner: String,
    /// Whether the holder is a training run (its weights change at every sync).
    pub training: bool,
    /// The directory of the lease files ([`default_lease_dir`] unless a test says otherwise).
    pub dir: PathBuf,
}

impl LeaseHolder {
    /// A holder `owner` with the lease files in [`default_lease_dir`].
    pub fn new(owner: impl Into<String>, training: bool) -> Self {
        Self {
            owner: owner.into(),
            training,
            dir: default_lease_dir(),
        }
    }
}

/// `$RLVR_LEASE_DIR`, else `rlvr-vllm-leases-UID` (UID: the effective user id) under the
/// system's temporary directory. One directory per user: another user's directory is never used
/// ([`check_lease_dir`]).
pub fn default_lease_dir() -> PathBuf {
    match std::env::var_os("RLVR_LEASE_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => std::env::temp_dir().join(format!("rlvr-vllm-leases-{}", euid())),
    }
}

/// The effective user id of this process: the owner of `/proc/self` (Linux gives a process's
/// `/proc` entry its effective uid; this crate forbids the `unsafe` a `geteuid` call needs).
/// `u32::MAX` (nobody's) when `/proc` cannot be read, so that every ownership check fails closed.
fn euid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

/// Why a lease directory with these properties must not be used, or `None` when it may: the rule
/// of ssh's and tmux's socket directories, a real directory (not a symbolic link) owned by the
/// user `uid` and writable by nobody else (no group or other write bit in `mode`).
pub fn lease_dir_problem(
    is_symlink: bool,
    is_dir: bool,
    owner: u32,
    mode: u32,
    uid: u32,
) -> Option<String> {
    if is_symlink {
        Some("is a symbolic link".into())
    } else if !is_dir {
        Some("is not a directory".into())
    } else if owner != uid {
        Some(format!(
            "is owned by uid {owner}, not by this user (uid {uid})"
        ))
    } else if mode & 0o022 != 0 {
        Some(format!(
            "is writable by group or others (mode {:o})",
            mode & 0o7777
        ))
    } else {
        None
    }
}

/// Creates the lease directory `dir` with mode 0700 if it does not exist (its parents with the
/// default mode), then checks it by [`lease_dir_problem`].
///
/// # Errors
/// [`VllmError::Config`] naming the directory, what is wrong with it and the ways out (remove
/// it, `chmod 700` it, or set `RLVR_LEASE_DIR` to a directory of one's own);
/// [`VllmError::Io`] when it cannot be created or read.
pub fn check_lease_dir(dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {}
                // Another process made it meanwhile: checked below like any existing one.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(dir)(e)),
            }
        }
        Err(e) => return Err(io(dir)(e)),
    }
    let m = std::fs::symlink_metadata(dir).map_err(io(dir))?;
    match lease_dir_problem(
        m.file_type().is_symlink(),
        m.is_dir(),
        m.uid(),
        m.mode(),
        euid(),
    ) {
        None => Ok(()),
        Some(why) => Err(VllmError::Config(format!(
            "lease directory {} {why}: refused, since another user could make rlvr write through \
             it into any file of yours; remove it (rlvr makes it again with mode 0700), `chmod 700` \
             it if it is yours, or set RLVR_LEASE_DIR to a directory of your own that only you can \
             write",
            dir.display()
        ))),
    }
}

/// Opens (creating with mode 0600) the lease file `path` without following a symbolic link, and
/// checks that it is a regular file owned by this user.
fn open_lease_file(path: &Path) -> Result<File> {
    let refuse = |why: &str| {
        VllmError::Config(format!(
            "lease file {} {why}: refused (nothing was written to it); remove it, or set \
             RLVR_LEASE_DIR to a directory of your own that only you can write",
            path.display()
        ))
    };
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(refuse("is a symbolic link"))
        }
        Err(e) => return Err(io(path)(e)),
    };
    let m = file.metadata().map_err(io(path))?;
    if !m.is_file() {
        return Err(refuse("is not a regular file"));
    }
    if m.uid() != euid() {
        return Err(refuse(&format!(
            "is owned by uid {}, not by this user (uid {})",
            m.uid(),
            euid()
        )));
    }
    Ok(file)
}

/// The lease file of the server `url` under `dir`: the URL lowercased, without a trailing `/`,
/// `localhost` and `0.0.0.0` as `127.0.0.1`, every character other than letters and digits as `_`.
pub fn lease_file(dir: &Path, url: &str) -> PathBuf {
    let u = url
        .trim()
        .trim_end_matches('/')
        .to_ascii_lowercase()
        .replace("://localhost", "://127.0.0.1")
        .replace("://0.0.0.0", "://127.0.0.1");
    let name: String = u
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    dir.join(format!("{name}.lease"))
}

/// The lease of every server of a client; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct ServerLease {
    files: Vec<(String, File)>,
    holder: LeaseHolder,
}

impl ServerLease {
    /// Takes the lease of every server of `urls` for `holder`, without waiting.
    ///
    /// # Errors
    /// [`VllmError::Check`] naming the server and what holds it (owner, pid, host, the version
    /// of its weights) and the ways out; [`VllmError::Config`] for a lease directory or file
    /// that is unsafe to use ([`check_lease_dir`]: a symbolic link, another user's, writable by
    /// others; a lease file that is a symbolic link or not a regular file); [`VllmError::Io`]
    /// for the lease directory or file.
    pub fn acquire(urls: &[String], holder: LeaseHolder) -> Result<ServerLease> {
        check_lease_dir(&holder.dir)?;
        let mut files = Vec::new();
        for url in urls {
            let path = lease_file(&holder.dir, url);
            let mut file = open_lease_file(&path)?;
            match try_flock(&file) {
                Ok(true) => files.push((url.clone(), file)),
                Ok(false) => {
                    let mut text = String::new();
                    let _ = file.read_to_string(&mut text);
                    return Err(VllmError::Check {
                        server: url.clone(),
                        msg: busy_message(&text, &holder, &path),
                    });
                }
                Err(e) => return Err(io(&path)(e)),
            }
        }
        let mut lease = ServerLease { files, holder };
        lease.write(None)?;
        Ok(lease)
    }

    /// Records that the servers now hold version `version` of the holder's weights (called after
    /// every successful refresh).
    ///
    /// # Errors
    /// [`VllmError::Io`] writing a lease file.
    pub fn tag(&mut self, version: u64) -> Result<()> {
        self.write(Some(version))
    }

    /// The holder.
    pub fn holder(&self) -> &LeaseHolder {
        &self.holder
    }

    fn write(&mut self, version: Option<u64>) -> Result<()> {
        let record = serde_json::json!({
            "owner": self.holder.owner,
            "training": self.holder.training,
            "pid": std::process::id(),
            "host": host(),
            "version": version,
        })
        .to_string();
        for (url, file) in &mut self.files {
            let path = lease_file(&self.holder.dir, url);
            file.set_len(0)
                .and_then(|_| file.seek(SeekFrom::Start(0)))
                .and_then(|_| file.write_all(record.as_bytes()))
                .and_then(|_| file.sync_data())
                .map_err(io(&path))?;
        }
        Ok(())
    }
}

/// What a held lease file says, in words: `training run R (pid P on host H, weights at version
/// V)`; an unreadable record is shown as it is.
pub fn describe_record(text: &str) -> String {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text.trim()) else {
        let t = text.trim();
        return if t.is_empty() {
            "a process that has not written its name yet".into()
        } else {
            t.to_string()
        };
    };
    let s = |k: &str| {
        v.get(k)
            .map(|x| x.to_string().trim_matches('"').to_string())
    };
    let version = match v.get("version").and_then(|x| x.as_u64()) {
        Some(n) => format!(", weights at version {n}"),
        None => String::new(),
    };
    format!(
        "{} (pid {} on host {}{version})",
        s("owner").unwrap_or_else(|| "?".into()),
        s("pid").unwrap_or_else(|| "?".into()),
        s("host").unwrap_or_else(|| "?".into()),
    )
}

/// The refusal of `taker` on a lease another process holds (its record `text`).
fn busy_message(text: &str, taker: &LeaseHolder, path: &Path) -> String {
    let held_by = describe_record(text);
    let training = serde_json::from_str::<serde_json::Value>(text.trim())
        .ok()
        .and_then(|v| v.get("training")?.as_bool())
        .unwrap_or(false);
    let way_out = if taker.training {
        "a server serves one training run at a time: start another vLLM server for this run (or \
         wait for that one to end)"
    } else if training {
        "pushing this model would replace that run's weights under it: use another server, wait \
         for the run to end, or pass --share-server (the training run then stops at its next \
         weight check)"
    } else {
        "wait for it to end, use another server, or pass --share-server"
    };
    format!(
        "is leased to {held_by}; {way_out} (lease file {})",
        path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_file_names_fold_spellings_of_one_server() {
        let d = Path::new("/l");
        assert_eq!(
            lease_file(d, "http://LOCALHOST:8000/"),
            lease_file(d, "http://127.0.0.1:8000")
        );
        assert_ne!(
            lease_file(d, "http://127.0.0.1:8000"),
            lease_file(d, "http://127.0.0.1:8001")
        );
        assert_eq!(
            lease_file(d, "http://127.0.0.1:8000"),
            Path::new("/l/http___127_0_0_1_8000.lease")
        );
    }

    #[test]
    fn a_second_taker_is_refused_naming_the_holder_and_its_version() {
        let tmp = tempfile::tempdir().unwrap();
        let urls = vec!["http://127.0.0.1:9".to_string()];
        let holder = |owner: &str, training| LeaseHolder {
            owner: owner.into(),
            training,
            dir: tmp.path().to_path_buf(),
        };
        let mut a = ServerLease::acquire(&urls, holder("training run /runs/a", true)).unwrap();
        a.tag(7).unwrap();
        let e = ServerLease::acquire(&urls, holder("training run /runs/b", true))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("http://127.0.0.1:9")
                && e.contains("training run /runs/a")
                && e.contains(&format!("pid {}", std::process::id()))
                && e.contains("weights at version 7")
                && e.contains("start another vLLM server"),
            "{e}"
        );
        let e = ServerLease::acquire(&urls, holder("rlvr eval", false))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("training run /runs/a") && e.contains("--share-server"),
            "{e}"
        );
        drop(a);
        ServerLease::acquire(&urls, holder("rlvr eval", false)).unwrap();
    }

    fn holder_in(dir: &Path) -> LeaseHolder {
        LeaseHolder {
            owner: "rlvr eval".into(),
            training: false,
            dir: dir.to_path_buf(),
        }
    }

    fn mode_of(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_new_lease_directory_is_private_and_the_lease_works() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/leases");
        let urls = vec!["http://127.0.0.1:9".to_string()];
        let lease = ServerLease::acquire(&urls, holder_in(&dir)).unwrap();
        assert_eq!(mode_of(&dir), 0o700);
        let file = lease_file(&dir, &urls[0]);
        assert_eq!(mode_of(&file), 0o600);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains("\"owner\":\"rlvr eval\""), "{text}");
        drop(lease);
        // An existing private directory is used again.
        ServerLease::acquire(&urls, holder_in(&dir)).unwrap();
    }

    #[test]
    fn a_planted_symlink_as_lease_file_is_refused_and_its_target_unchanged() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("leases");
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let victim = tmp.path().join("victim.txt");
        std::fs::write(&victim, "precious").unwrap();
        let urls = vec!["http://127.0.0.1:9".to_string()];
        let file = lease_file(&dir, &urls[0]);
        std::os::unix::fs::symlink(&victim, &file).unwrap();
        let e = ServerLease::acquire(&urls, holder_in(&dir))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&file.display().to_string())
                && e.contains("symbolic link")
                && e.contains("RLVR_LEASE_DIR"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        // A dangling link is not followed either (nothing is created at its target).
        let absent = tmp.path().join("absent.txt");
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&absent, &file).unwrap();
        assert!(ServerLease::acquire(&urls, holder_in(&dir)).is_err());
        assert!(!absent.exists());
        // A directory in place of the lease file is not a regular file.
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir(&file).unwrap();
        let e = ServerLease::acquire(&urls, holder_in(&dir))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("regular file") || e.contains("Is a directory"),
            "{e}"
        );
    }

    #[test]
    fn unsafe_lease_directories_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let urls = vec!["http://127.0.0.1:9".to_string()];
        // World-writable (what another user's `mkdir -m 777` gives).
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let e = ServerLease::acquire(&urls, holder_in(&open))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&open.display().to_string())
                && e.contains("writable by group or others (mode 777)")
                && e.contains("RLVR_LEASE_DIR"),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0);
        // A symbolic link to a private directory.
        let real = tmp.path().join("real");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&real)
            .unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = ServerLease::acquire(&urls, holder_in(&link))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);
        // A file where the directory should be.
        let file = tmp.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let e = ServerLease::acquire(&urls, holder_in(&file))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a directory"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    }

    #[test]
    fn the_directory_rule_is_that_of_ssh_and_tmux() {
        let me = 1000;
        assert_eq!(lease_dir_problem(false, true, me, 0o40700, me), None);
        assert_eq!(lease_dir_problem(false, true, me, 0o40755, me), None);
        assert_eq!(
            lease_dir_problem(false, true, 0, 0o41777, me).unwrap(),
            "is owned by uid 0, not by this user (uid 1000)"
        );
        assert_eq!(
            lease_dir_problem(false, true, me, 0o40770, me).unwrap(),
            "is writable by group or others (mode 770)"
        );
        assert_eq!(
            lease_dir_problem(false, true, me, 0o41777, me).unwrap(),
            "is writable by group or others (mode 1777)"
        );
        assert_eq!(
            lease_dir_problem(true, false, me, 0o120777, me).unwrap(),
            "is a symbolic link"
        );
        assert_eq!(
            lease_dir_problem(false, false, me, 0o100600, me).unwrap(),
            "is not a directory"
        );
    }

    #[test]
    fn the_default_lease_directory_is_per_user() {
        if std::env::var_os("RLVR_LEASE_DIR").is_none() {
            assert_eq!(
                default_lease_dir(),
                std::env::temp_dir().join(format!("rlvr-vllm-leases-{}", euid()))
            );
        }
    }
}
