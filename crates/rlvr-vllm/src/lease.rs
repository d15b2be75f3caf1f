//! One run per server (issue 34): a vLLM server holds one set of weights, so two processes
//! pushing weights to it would each sample with the other's policy. Two guards:
//!
//! - **The lease** ([`ServerLease`]): an exclusive `flock` on a lease file per server URL in a
//!   directory shared by the processes of one machine ([`default_lease_dir`]: `$RLVR_LEASE_DIR`,
//!   else `rlvr-vllm-leases` in the temporary directory). `rlvr train` takes it for its whole life
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

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use fs4::{FileExt, TryLockError};

use crate::error::{Result, VllmError};
use crate::refresh::io;

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

/// `$RLVR_LEASE_DIR`, else `rlvr-vllm-leases` under the system's temporary directory.
pub fn default_lease_dir() -> PathBuf {
    match std::env::var_os("RLVR_LEASE_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => std::env::temp_dir().join("rlvr-vllm-leases"),
    }
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

/// The machine's host name (for the lease record), or `unknown`.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
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
    /// of its weights) and the ways out; [`VllmError::Io`] for the lease directory or file.
    pub fn acquire(urls: &[String], holder: LeaseHolder) -> Result<ServerLease> {
        std::fs::create_dir_all(&holder.dir).map_err(io(&holder.dir))?;
        let mut files = Vec::new();
        for url in urls {
            let path = lease_file(&holder.dir, url);
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io(&path))?;
            match FileExt::try_lock(&file) {
                Ok(()) => files.push((url.clone(), file)),
                Err(TryLockError::WouldBlock) => {
                    let mut text = String::new();
                    let _ = file.read_to_string(&mut text);
                    return Err(VllmError::Check {
                        server: url.clone(),
                        msg: busy_message(&text, &holder, &path),
                    });
                }
                Err(TryLockError::Error(e)) => return Err(io(&path)(e)),
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
}
