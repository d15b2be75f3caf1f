//! External verifiers: a user command that scores completions over JSON lines.
//!
//! Protocol: for each batch the command is started once; it reads one JSON object per line on stdin,
//! `{"prompt": str, "completion": str, "reference": str, "index": int|null, "row": {str: str}}`
//! ([`item_json`]), and must write exactly one JSON object per
//! input line on stdout, in order, `{"reward": number}` (optionally with `"correct": bool`,
//! `"extracted": str`, `"gold": str`, `"extra": {name: number}`; without `correct` an answer
//! counts as correct when reward > 0; `extra`'s numbers are logged, [`extra_numbers`]).
//! stdin is closed after the last line. The command fails (a [`RewardError::External`] naming the
//! command and what happened, with the tail of its stderr) when it cannot start, runs past the timeout
//! (it is killed), exits non-zero, writes a line that is not such an object, writes a non-finite reward,
//! or writes too few or too many lines.
//!
//! On Unix the command runs in its own process group, which ends with the batch: when the command
//! exits, or is killed at the timeout, every process it started that is still in its group (a
//! shell's children, a `sleep` in the background) is killed too, so nothing keeps running, holds
//! the output pipe open or piles up from batch to batch. On Linux the command and its group also
//! die with rlvr, even by `kill -9`: in the `rlvr` binary it runs under a guard process
//! ([`crate::guard`]) that the kernel signals at rlvr's death (`PR_SET_PDEATHSIG`) and that kills
//! the whole group; without the guard (a library user that did not enable it) the command itself
//! gets `SIGKILL` at rlvr's death. An exit of rlvr that skips the verifiers' clean-up (a second
//! Ctrl-C) kills their whole groups first ([`kill_all_groups`]).
//!
//! The command gets a minimal environment: [`BASE_ENV`] (`PATH`, `HOME`, `LANG`, `TMPDIR`) and the
//! variables its config's `env` list names, not rlvr's whole environment (which may hold API
//! keys). The user guide is docs/external-verifier.md.

use crate::{truncate, RewardError, Sample, Score, Verifier};
use serde::Deserialize;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A verifier that runs a command (see the module docs).
#[derive(Debug, Clone)]
pub struct ExternalVerifier {
    /// Program and arguments (no shell: use `["sh", "-c", "..."]` for one).
    pub command: Vec<String>,
    /// Wall-clock limit for one batch.
    pub timeout: Duration,
    /// Names of environment variables passed to the program besides [`BASE_ENV`] (config key
    /// `env`); every other variable of rlvr's environment is withheld.
    pub env: Vec<String>,
    /// The most bytes of stdout read for one batch ([`MAX_STDOUT_BYTES`] from the config): a
    /// program that writes more is killed and the batch fails, without the rest being read.
    pub max_stdout: usize,
}

/// The most stdout a per-batch verifier may write for one batch, in bytes (64 MiB, the limit of
/// a persistent verifier's reply line, [`crate::persistent::MAX_REPLY_BYTES`]): past it the
/// program's process group is killed and the batch fails naming the limit, instead of rlvr
/// reading the output into memory until the timeout.
pub const MAX_STDOUT_BYTES: usize = 64 << 20;

/// The most of a per-batch verifier's stderr kept for its error messages, in bytes (64 KiB,
/// its last ones); the rest is read and dropped as it comes.
pub const STDERR_TAIL_BYTES: usize = 64 << 10;

/// Characters of the kept stderr shown in an error message (its last ones).
const STDERR_SHOWN_CHARS: usize = 2000;

/// The environment variables every verifier program gets from rlvr's environment (when set):
/// where programs are found, the home directory, the locale, and the temporary directory. All
/// others (API keys such as `OPENAI_API_KEY` or the vLLM key of `rollout.api_key_env`, cloud
/// credentials) are withheld unless the verifier's `env` list names them.
pub const BASE_ENV: [&str; 4] = ["PATH", "HOME", "LANG", "TMPDIR"];

/// The process groups (leader pids) of verifier programs started and not yet killed, so that an
/// exit that skips the verifiers' own clean-up ([`kill_all_groups`]) still ends them.
static LIVE_GROUPS: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

fn live_groups() -> std::sync::MutexGuard<'static, Vec<u32>> {
    LIVE_GROUPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Kills the process group of every verifier program still running (on Unix; elsewhere nothing).
/// For exits that skip the verifiers' clean-up: a second Ctrl-C or SIGTERM, or an error exit,
/// calls it just before `std::process::exit`. (A `kill -9` of rlvr runs no code: there only the
/// program itself dies, by its parent-death signal, not the children it started.)
pub fn kill_all_groups() {
    let groups = std::mem::take(&mut *live_groups());
    #[cfg(unix)]
    for pid in groups {
        use rustix::process::{kill_process_group, Pid, Signal};
        if let Some(pid) = Pid::from_raw(pid as i32) {
            let _ = kill_process_group(pid, Signal::KILL);
        }
    }
    #[cfg(not(unix))]
    let _ = groups;
}

/// Checks a verifier's `env` list (`key` names it in the message): each entry must be a variable
/// name (not empty, no `=` and no NUL).
///
/// # Errors
/// The first bad entry, with `key` and its index.
pub fn check_env_names(key: &str, env: &[String]) -> Result<(), RewardError> {
    for (i, name) in env.iter().enumerate() {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(RewardError::Config(format!(
                "{key}[{i}] = {:?} is not an environment variable name (expected e.g. \"OPENAI_API_KEY\")",
                truncate(name, 60)
            )));
        }
    }
    Ok(())
}

#[derive(Deserialize)]
pub(crate) struct Reply {
    reward: f64,
    correct: Option<bool>,
    extracted: Option<String>,
    gold: Option<String>,
    /// Extra numbers to log beside the reward (any JSON values; see [`extra_numbers`]).
    extra: Option<serde_json::Value>,
}

impl Reply {
    /// A bare reward.
    pub(crate) fn number(reward: f64) -> Self {
        Reply {
            reward,
            correct: None,
            extracted: None,
            gold: None,
            extra: None,
        }
    }

    /// The score, or why the reward is refused.
    pub(crate) fn into_score(self) -> Result<Score, String> {
        if !self.reward.is_finite() {
            return Err("reward is not finite".into());
        }
        Ok(Score {
            reward: self.reward,
            correct: self.correct.unwrap_or(self.reward > 0.0),
            extracted: self.extracted,
            gold: self.gold,
            extra: self.extra.as_ref().map(extra_numbers).unwrap_or_default(),
        })
    }
}

/// The numbers of a reply's `"extra"` object (docs/external-verifier.md, "Extra numbers"): each
/// key whose value is a finite number, or a boolean (1 or 0). Other values (strings, lists,
/// objects, null) and a non-object `extra` are ignored, never an error: a program written for a
/// peer (verl's `reward_extra_info` holds strings too) runs as it is.
pub fn extra_numbers(extra: &serde_json::Value) -> std::collections::BTreeMap<String, f64> {
    let Some(m) = extra.as_object() else {
        return Default::default();
    };
    m.iter()
        .filter_map(|(k, v)| {
            let x = match v {
                serde_json::Value::Bool(b) => f64::from(u8::from(*b)),
                serde_json::Value::Number(n) => n.as_f64()?,
                _ => return None,
            };
            x.is_finite().then(|| (k.clone(), x))
        })
        .collect()
}

/// The JSON object an external program receives for one sample, in both modes: `prompt`,
/// `completion`, `reference`, `index` (the row's index in its split, or null), `row` (the
/// row's string and number columns, [`Sample::columns`], as an object of strings) and `columns`
/// (every column with its JSON type, [`crate::typed_columns`]: lists, booleans, objects and
/// numbers as such). Programs ignore keys they do not know, so keys may be added without a
/// protocol version change.
pub fn item_json(s: &Sample<'_>) -> serde_json::Value {
    let row: serde_json::Map<String, serde_json::Value> = crate::visible_columns(s.columns)
        .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
        .collect();
    serde_json::json!({
        "prompt": s.prompt, "completion": s.completion, "reference": s.reference,
        "index": s.index, "row": row, "columns": crate::typed_columns(s.columns),
    })
}

impl ExternalVerifier {
    fn fail(&self, reason: String) -> RewardError {
        RewardError::External {
            command: self.command.join(" "),
            reason,
        }
    }
}

/// Starts `prog args` with piped stdin, stdout and stderr in its own process group (pgid = its
/// pid), so [`kill_group`] reaches its children too, and with a minimal environment: the
/// variables of [`BASE_ENV`] and those `env` names, as far as rlvr's environment sets them. On
/// Linux the program also dies with rlvr: it asks the kernel for `SIGKILL` when its parent goes
/// (`PR_SET_PDEATHSIG`), which covers a `kill -9` of rlvr that no cleanup code of ours outlives.
/// The group is recorded for [`kill_all_groups`] until [`kill_group`] ends it.
///
/// `cwd` is the program's working directory (rlvr's own when `None`).
///
/// # Errors
/// The program cannot be started: the reason, worded for a verifier error.
pub fn spawn_in_group(
    prog: &str,
    args: &[String],
    env: &[String],
    cwd: Option<&std::path::Path>,
) -> Result<std::process::Child, String> {
    #[cfg(target_os = "linux")]
    let guard = crate::guard::exe();
    #[cfg(not(target_os = "linux"))]
    let guard: Option<&std::path::Path> = None;
    let mut cmd = match guard {
        #[cfg(target_os = "linux")]
        Some(exe) => {
            // The guard reports a program it cannot start only by its exit code; the usual
            // causes (not found, not executable) keep their error here.
            check_program(prog, cwd).map_err(|e| {
                format!("could not start it: {e} (check the path and that it is executable)")
            })?;
            use std::os::unix::process::CommandExt;
            let mut c = Command::new(exe);
            c.arg0("rlvr-guard")
                .arg(crate::guard::GUARD_ARG)
                .arg(std::process::id().to_string())
                .arg(prog);
            c
        }
        _ => Command::new(prog),
    };
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    cmd.env_clear();
    for name in BASE_ENV
        .iter()
        .copied()
        .chain(env.iter().map(String::as_str))
    {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    // Without a guard the program dies with rlvr by SIGKILL; the guard gets SIGTERM instead, on
    // which it kills its whole group (crate::guard).
    #[cfg(target_os = "linux")]
    crate::guard::die_with_parent(
        &mut cmd,
        if guard.is_some() {
            rustix::process::Signal::TERM
        } else {
            rustix::process::Signal::KILL
        },
    );
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = spawn_from_long_lived_thread(cmd).map_err(|e| {
        format!("could not start it: {e} (check the path and that it is executable)")
    })?;
    live_groups().push(child.id());
    Ok(child)
}

/// Checks that `prog` names a program that can be started, as `execvp` would look for it: a name
/// with a `/` relative to `cwd` (or rlvr's directory), any other in the directories of `PATH`.
///
/// # Errors
/// `NotFound` when no such file is found, `PermissionDenied` when the file found is not an
/// executable regular file.
#[cfg(target_os = "linux")]
fn check_program(prog: &str, cwd: Option<&std::path::Path>) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if prog.is_empty() {
        return Err(Error::from(ErrorKind::NotFound));
    }
    if prog.contains('/') {
        let path = match cwd {
            Some(dir) => dir.join(prog),
            None => std::path::PathBuf::from(prog),
        };
        return match executable(&path)? {
            true => Ok(()),
            false => Err(Error::from(ErrorKind::PermissionDenied)),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/bin:/usr/bin".into());
    let mut denied = false;
    for dir in std::env::split_paths(&path) {
        let dir = match (dir.is_relative(), cwd) {
            (true, Some(c)) => c.join(dir),
            _ => dir,
        };
        match executable(&dir.join(prog)) {
            Ok(true) => return Ok(()),
            Ok(false) => denied = true,
            Err(_) => {}
        }
    }
    Err(Error::from(if denied {
        ErrorKind::PermissionDenied
    } else {
        ErrorKind::NotFound
    }))
}

/// Spawns `cmd` from one thread that lives as long as the process. The kernel's "parent death"
/// of `PR_SET_PDEATHSIG` is the exit of the *thread* that forked the child, so a persistent
/// verifier started from, say, the explorer thread would be killed when that thread ends while
/// rlvr goes on (its last evaluation would find it dead); forked from this thread, it dies with
/// the process only.
fn spawn_from_long_lived_thread(cmd: Command) -> std::io::Result<std::process::Child> {
    use std::sync::mpsc;
    type Request = (Command, mpsc::Sender<std::io::Result<std::process::Child>>);
    static SPAWNER: std::sync::OnceLock<std::sync::Mutex<mpsc::Sender<Request>>> =
        std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        let started = std::thread::Builder::new()
            .name("rlvr-verifier-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            });
        if let Err(e) = started {
            // No thread: the senders below fail and each spawn happens on the caller's thread.
            eprintln!("warning: could not start the verifier spawner thread: {e}");
        }
        std::sync::Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    let sent = spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply));
    match sent {
        Ok(()) => answer
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the verifier spawner thread is gone"))),
        Err(mpsc::SendError((mut cmd, _))) => cmd.spawn(),
    }
}

/// Kills the process group that `child` leads (its descendants that did not leave it); no-op
/// when it is already gone. Elsewhere than Unix, kills the child only.
pub fn kill_group(child: &std::process::Child) {
    live_groups().retain(|&pid| pid != child.id());
    #[cfg(unix)]
    {
        use rustix::process::{kill_process_group, Pid, Signal};
        if let Some(pid) = Pid::from_raw(child.id() as i32) {
            // ESRCH (nothing left in the group) is the normal case after a clean exit.
            let _ = kill_process_group(pid, Signal::KILL);
        }
    }
    #[cfg(not(unix))]
    let _ = child;
}

impl Verifier for ExternalVerifier {
    fn score(&self, sample: &Sample<'_>) -> Result<Score, RewardError> {
        let mut v = self.score_batch(std::slice::from_ref(sample))?;
        v.pop()
            .ok_or_else(|| self.fail("no reply for the sample".into()))
    }

    // About 100 lines: spawn, feed, wait with a deadline, then validate every reply line; each step
    // has its own error message, which is the point of this function.
    fn score_batch(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        if samples.is_empty() {
            return Ok(Vec::new());
        }
        let (prog, args) = self
            .command
            .split_first()
            .ok_or_else(|| self.fail("empty command".into()))?;
        let mut input = String::new();
        for s in samples {
            input.push_str(&item_json(s).to_string());
            input.push('\n');
        }
        let mut child = spawn_in_group(prog, args, &self.env, None).map_err(|e| self.fail(e))?;
        let mut stdin = child.stdin.take().expect("stdin was piped");
        let mut stdout = child.stdout.take().expect("stdout was piped");
        let mut stderr = child.stderr.take().expect("stderr was piped");
        // Separate threads so a command that writes before reading everything cannot deadlock us.
        let writer = std::thread::spawn(move || {
            let r = stdin.write_all(input.as_bytes());
            drop(stdin);
            r
        });
        let limit = self.max_stdout;
        let over = Arc::new(AtomicBool::new(false));
        let over_flag = Arc::clone(&over);
        let out_reader = std::thread::spawn(move || read_bounded(&mut stdout, limit, &over_flag));
        let err_reader = std::thread::spawn(move || read_tail(&mut stderr, STDERR_TAIL_BYTES));
        let too_much = || {
            self.fail(format!(
                "wrote more than {limit} bytes of stdout for a batch of {} (the limit; it was \
                 killed and the rest was not read): write one {{\"reward\": R}} line per input",
                samples.len()
            ))
        };
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            if over.load(Ordering::Acquire) {
                kill_group(&child);
                let _ = child.kill();
                let _ = child.wait();
                return Err(too_much());
            }
            match child.try_wait() {
                Ok(Some(st)) => {
                    // Leftover children would hold stdout open (the reader would never finish).
                    kill_group(&child);
                    break st;
                }
                Ok(None) if Instant::now() >= deadline => {
                    kill_group(&child);
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(self.fail(format!(
                        "timed out after {:.1} s on a batch of {} (raise timeout_s or speed the command up)",
                        self.timeout.as_secs_f64(),
                        samples.len()
                    )));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    kill_group(&child);
                    let _ = child.kill();
                    return Err(self.fail(format!("could not wait for it: {e}")));
                }
            }
        };
        let stderr_text = err_reader.join().unwrap_or_default();
        let stderr_tail = last_chars(stderr_text.trim_end(), STDERR_SHOWN_CHARS);
        let _ = writer.join();
        let out = out_reader
            .join()
            .map_err(|_| self.fail("stdout reader panicked".into()))?;
        if over.load(Ordering::Acquire) {
            return Err(too_much());
        }
        if !status.success() {
            return Err(self.fail(format!("exited with {status}; stderr: {stderr_tail}")));
        }
        let out = out
            .map_err(|e| self.fail(format!("reading its stdout failed: {e}")))
            .and_then(|b| {
                String::from_utf8(b)
                    .map_err(|e| self.fail(format!("stdout is not UTF-8 text: {}", e.utf8_error())))
            })?;
        let lines: Vec<&str> = out.split('\n').filter(|l| !l.trim().is_empty()).collect();
        if lines.len() != samples.len() {
            return Err(self.fail(format!(
                "wrote {} reply lines for {} inputs (one {{\"reward\": R}} per input line expected); stderr: {stderr_tail}",
                lines.len(),
                samples.len()
            )));
        }
        lines
            .iter()
            .enumerate()
            .map(|(k, line)| {
                let r: Reply = serde_json::from_str(line).map_err(|e| {
                    self.fail(format!(
                        "stdout line {}: {e}: {:?} (expected {{\"reward\": number}})",
                        k + 1,
                        truncate(line, 200)
                    ))
                })?;
                r.into_score()
                    .map_err(|e| self.fail(format!("stdout line {}: {e}", k + 1)))
            })
            .collect()
    }
}

/// Reads `r` to its end, at most `limit` bytes: one byte more sets `over` and stops reading
/// (what was read is returned; the caller fails the batch).
fn read_bounded(r: &mut impl Read, limit: usize, over: &AtomicBool) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 64 << 10];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if out.len() + n > limit {
            over.store(true, Ordering::Release);
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// Reads `r` to its end, keeping its last `keep` bytes, lossily decoded.
fn read_tail(r: &mut impl Read, keep: usize) -> String {
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = [0u8; 16 << 10];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                tail.extend_from_slice(&buf[..n]);
                let excess = tail.len().saturating_sub(keep);
                tail.drain(..excess);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&tail).into_owned()
}

/// The last `n` characters of `s`, after `…` when some were cut.
fn last_chars(s: &str, n: usize) -> String {
    match s.char_indices().rev().nth(n.saturating_sub(1)) {
        Some((i, _)) if i > 0 => format!("…{}", &s[i..]),
        _ => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_reads_stop_one_chunk_past_the_limit() {
        let over = AtomicBool::new(false);
        let got = read_bounded(&mut &b"abcdef"[..], 6, &over).unwrap();
        assert_eq!(
            (got.as_slice(), over.load(Ordering::Acquire)),
            (&b"abcdef"[..], false)
        );
        let got = read_bounded(&mut &b"abcdefg"[..], 6, &over).unwrap();
        assert_eq!((got.len(), over.load(Ordering::Acquire)), (0, true));
    }

    #[test]
    fn tails_keep_the_last_bytes_and_chars() {
        let data: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let t = read_tail(&mut data.as_slice(), 10);
        assert_eq!(t.as_bytes(), &data[data.len() - 10..]);
        assert_eq!(last_chars("héllo wörld", 5), "…wörld");
        assert_eq!(last_chars("wörld", 5), "wörld");
    }
}
