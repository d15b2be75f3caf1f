//! A long-lived child program spoken to in lines: the supervision shared by persistent verifiers
//! ([`crate::persistent`]) and multi-turn environments (the rlvr-env crate).
//!
//! [`LineProcess::start`] starts a program through [`crate::external::spawn_in_group`] (its own
//! process group, a minimal environment, death with rlvr on Linux) and keeps three threads beside
//! it: one writes the requests to its stdin, one turns its stdout into lines, one keeps the last
//! [`STDERR_KEEP`] bytes of its stderr for error messages (and, given a [`StderrLog`], writes all
//! of it to a file, up to that log's cap). A stdout line longer than the
//! process's `max_line` bytes is refused as soon as the limit is passed, without reading the rest
//! of it into memory ([`LineFault::TooLong`]), so a program that floods stdout cannot make rlvr
//! allocate without bound. [`LineProcess::end`] closes stdin, waits a grace period and kills the
//! whole group.

use crate::external::{kill_group, spawn_in_group};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes of the program's stderr kept for error messages (its last ones).
pub const STDERR_KEEP: usize = 4000;

/// A file that a program's stderr is also written to, in full up to a cap (a training run's
/// `env.stderr`): opened for appending, so a resumed run and every restart of the program add to
/// it. Shared by clones (the restarts of one program write one file, in order). Past the cap
/// one line says so and the rest is not kept; a failed write (a full disk) ends the log the same
/// way, never the run.
#[derive(Clone, Debug)]
pub struct StderrLog(Arc<Mutex<LogState>>);

#[derive(Debug)]
struct LogState {
    file: std::fs::File,
    path: std::path::PathBuf,
    written: u64,
    cap: u64,
    closed: bool,
}

impl StderrLog {
    /// Opens (creating it) `path` for appending; at most `cap` bytes are written by this log.
    ///
    /// # Errors
    /// The file cannot be opened (the OS error).
    pub fn append(path: &Path, cap: u64) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(StderrLog(Arc::new(Mutex::new(LogState {
            file,
            path: path.to_path_buf(),
            written: 0,
            cap,
            closed: false,
        }))))
    }

    /// Writes `bytes` (the program's stderr, or a line of rlvr's own), as much as the cap leaves.
    pub fn write(&self, bytes: &[u8]) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if s.closed {
            return;
        }
        let room = usize::try_from(s.cap - s.written).unwrap_or(usize::MAX);
        let part = &bytes[..bytes.len().min(room)];
        let ok = s.file.write_all(part).is_ok();
        s.written += part.len() as u64;
        if !ok || part.len() < bytes.len() {
            let why = match ok {
                true => format!("reached its cap of {} bytes", s.cap),
                false => "could not be written".to_string(),
            };
            let _ = writeln!(
                s.file,
                "\n[rlvr: this log {why}; the rest of the program's stderr is not kept here]"
            );
            s.closed = true;
        }
    }

    /// The file's path.
    pub fn path(&self) -> std::path::PathBuf {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .path
            .clone()
    }
}

/// Why no line came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineFault {
    /// Its stdout closed (the program exited or closed it).
    Closed,
    /// Nothing came before the deadline.
    Timeout,
    /// The line is not UTF-8 text (the reader's message).
    NotUtf8(String),
    /// The line passed this many bytes without a newline; the rest was not read.
    TooLong(usize),
    /// Reading stdout failed (the OS error).
    Io(String),
}

impl std::fmt::Display for LineFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineFault::Closed => write!(f, "its stdout closed"),
            LineFault::Timeout => write!(f, "no reply before the timeout"),
            LineFault::NotUtf8(e) => write!(f, "stdout is not UTF-8 text: {e}"),
            LineFault::TooLong(n) => write!(
                f,
                "a reply line passed {n} bytes without a newline (the limit; the rest was not read)"
            ),
            LineFault::Io(e) => write!(f, "reading its stdout failed: {e}"),
        }
    }
}

/// A running program with line-based stdin/stdout (see the module docs).
pub struct LineProcess {
    child: Child,
    input: Option<Sender<String>>,
    lines: Receiver<Result<String, LineFault>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Closed (its sender dropped) when the stderr reader has read to the end of the pipe.
    stderr_done: Receiver<()>,
    /// The longest stdout line accepted, in bytes ([`LineProcess::set_max_line`]).
    max_line: Arc<AtomicUsize>,
}

/// The longest [`LineProcess::end`] waits, after the group is killed, for the stderr reader to
/// reach the end of the pipe, so that the tail it reports holds the program's last words (without
/// it, a loaded machine could report a tail read before the dying program's last line). Bounded:
/// a descendant that left the group could hold the pipe open.
const STDERR_DRAIN: Duration = Duration::from_secs(2);

impl LineProcess {
    /// Starts `command` (program and arguments, no shell) with the environment variables `env`
    /// names besides [`crate::external::BASE_ENV`], in `cwd` (rlvr's own when `None`); stdout
    /// lines longer than `max_line` bytes are refused.
    ///
    /// # Errors
    /// The command is empty or cannot be started (the reason, as a sentence).
    pub fn start(
        command: &[String],
        env: &[String],
        cwd: Option<&Path>,
        max_line: usize,
    ) -> Result<Self, String> {
        Self::start_logged(command, env, cwd, max_line, None)
    }

    /// [`LineProcess::start`], with the program's stderr also written to `log` as it comes.
    ///
    /// # Errors
    /// As [`LineProcess::start`].
    pub fn start_logged(
        command: &[String],
        env: &[String],
        cwd: Option<&Path>,
        max_line: usize,
        log: Option<StderrLog>,
    ) -> Result<Self, String> {
        let (prog, args) = command
            .split_first()
            .ok_or_else(|| "empty command".to_string())?;
        let mut child = spawn_in_group(prog, args, env, cwd)?;
        let mut stdin = child.stdin.take().expect("stdin was piped");
        let stdout = child.stdout.take().expect("stdout was piped");
        let mut stderr = child.stderr.take().expect("stderr was piped");
        let (input, requests) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for r in requests {
                if stdin.write_all(r.as_bytes()).is_err() || stdin.flush().is_err() {
                    break;
                }
            }
        });
        let (tx, lines) = mpsc::channel();
        let max_line = Arc::new(AtomicUsize::new(max_line));
        let limit = Arc::clone(&max_line);
        std::thread::spawn(move || read_lines(BufReader::new(stdout), &limit, &tx));
        let tail = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&tail);
        let (done, stderr_done) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            let _done = done;
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Some(log) = &log {
                    log.write(&buf[..n]);
                }
                let mut t = keep.lock().unwrap_or_else(|e| e.into_inner());
                t.extend_from_slice(&buf[..n]);
                let excess = t.len().saturating_sub(STDERR_KEEP);
                t.drain(..excess);
            }
        });
        Ok(LineProcess {
            child,
            input: Some(input),
            lines,
            stderr: tail,
            stderr_done,
            max_line,
        })
    }

    /// Sets the longest stdout line accepted from now on, in bytes (a line being read is checked
    /// against the new limit as it grows): for a program whose replies grow with its requests
    /// (an environment's batch of episodes), set before each request.
    pub fn set_max_line(&self, bytes: usize) {
        self.max_line.store(bytes, Ordering::SeqCst);
    }

    /// Queues `text` (one or more whole lines, newline included) for the program's stdin.
    /// `false` when its stdin is already known to be closed.
    pub fn send(&self, text: String) -> bool {
        matches!(self.input.as_ref().map(|i| i.send(text)), Some(Ok(())))
    }

    /// The next non-blank stdout line, waiting until `deadline`.
    ///
    /// # Errors
    /// [`LineFault`]: closed, timed out, not UTF-8, too long.
    pub fn recv_line(&self, deadline: Instant) -> Result<String, LineFault> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(Ok(l)) if l.trim().is_empty() => continue,
                Ok(r) => return r,
                Err(RecvTimeoutError::Disconnected) => return Err(LineFault::Closed),
                Err(RecvTimeoutError::Timeout) => return Err(LineFault::Timeout),
            }
        }
    }

    /// A non-blank line already written and not yet read (`Ok(None)`: none), for checking that a
    /// program wrote nothing between requests.
    ///
    /// # Errors
    /// As [`LineProcess::recv_line`] ([`LineFault::Closed`] when stdout closed meanwhile).
    pub fn pending_line(&self) -> Result<Option<String>, LineFault> {
        loop {
            match self.lines.try_recv() {
                Ok(Ok(l)) if l.trim().is_empty() => continue,
                Ok(Ok(l)) => return Ok(Some(l)),
                Ok(Err(e)) => return Err(e),
                Err(TryRecvError::Disconnected) => return Err(LineFault::Closed),
                Err(TryRecvError::Empty) => return Ok(None),
            }
        }
    }

    /// The last [`STDERR_KEEP`] bytes of its stderr so far, lossily decoded.
    pub fn stderr_tail(&self) -> String {
        let tail = self.stderr.lock().map(|t| t.clone()).unwrap_or_default();
        String::from_utf8_lossy(&tail).trim_end().to_string()
    }

    /// The program's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Ends the program (at once, or after `grace` once its stdin is closed), kills its whole
    /// process group, and describes how it ended: exit status and stderr tail.
    pub fn end(mut self, grace: Duration) -> String {
        drop(self.input.take());
        let t0 = Instant::now();
        let mut status = None;
        while t0.elapsed() < grace {
            if let Ok(Some(s)) = self.child.try_wait() {
                status = Some(s);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        kill_group(&self.child);
        let _ = self.child.kill();
        let status = match status {
            Some(s) => Ok(s),
            None => self.child.wait(),
        };
        // The reader sends nothing; the wait ends when it drops its sender at the pipe's end.
        let _ = self.stderr_done.recv_timeout(STDERR_DRAIN);
        let tail = self.stderr_tail();
        let status = status.map_or_else(|e| format!("unknown status ({e})"), |s| s.to_string());
        format!("{status}; stderr: {tail}")
    }
}

/// Splits `r` into lines of at most `max_line` bytes (newline and a trailing `\r` removed) and
/// sends them; stops at the end of input, at the first fault, or when nobody listens.
fn read_lines(mut r: impl BufRead, max_line: &AtomicUsize, tx: &Sender<Result<String, LineFault>>) {
    let mut line: Vec<u8> = Vec::new();
    loop {
        let (used, complete) = match r.fill_buf() {
            Ok([]) => {
                if !line.is_empty() {
                    let _ = tx.send(finish(std::mem::take(&mut line)));
                }
                return;
            }
            Ok(buf) => match buf.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    line.extend_from_slice(&buf[..i]);
                    (i + 1, true)
                }
                None => {
                    line.extend_from_slice(buf);
                    (buf.len(), false)
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = tx.send(Err(LineFault::Io(e.to_string())));
                return;
            }
        };
        r.consume(used);
        let max = max_line.load(Ordering::SeqCst);
        if line.len() > max {
            let _ = tx.send(Err(LineFault::TooLong(max)));
            return;
        }
        if complete && tx.send(finish(std::mem::take(&mut line))).is_err() {
            return;
        }
    }
}

fn finish(mut line: Vec<u8>) -> Result<String, LineFault> {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line).map_err(|e| LineFault::NotUtf8(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<Result<String, LineFault>> {
        let (tx, rx) = mpsc::channel();
        read_lines(
            BufReader::with_capacity(7, input),
            &AtomicUsize::new(max),
            &tx,
        );
        drop(tx);
        rx.into_iter().collect()
    }

    #[test]
    fn splits_and_bounds_lines() {
        assert_eq!(
            lines(b"ab\r\ncd\n\nlast", 10),
            vec![
                Ok("ab".into()),
                Ok("cd".into()),
                Ok(String::new()),
                Ok("last".into())
            ]
        );
        // The 12-byte line is refused once 10 bytes have passed; nothing after it is read.
        assert_eq!(
            lines(b"ok\n0123456789ab\nnext\n", 10),
            vec![Ok("ok".into()), Err(LineFault::TooLong(10))]
        );
        assert!(matches!(
            lines(b"\xff\xfe\n", 10)[0],
            Err(LineFault::NotUtf8(_))
        ));
    }

    /// The tail [`LineProcess::end`] reports holds the program's last stderr line, also when the
    /// program exits right after writing a burst (the reader is then still draining the pipe:
    /// without the drain wait this test failed within its 30 runs each time it was tried).
    #[test]
    fn the_reported_tail_holds_the_last_words() {
        let burst = "head -c 60000 /dev/zero | tr '\\0' x >&2; echo; echo 'last words' >&2; exit 3";
        for _ in 0..30 {
            let cmd = ["sh".to_string(), "-c".to_string(), burst.to_string()];
            let p = LineProcess::start(&cmd, &[], None, 1 << 10).unwrap();
            while p
                .recv_line(Instant::now() + Duration::from_secs(10))
                .is_ok()
            {}
            let ended = p.end(Duration::from_secs(10));
            assert!(
                ended.ends_with("last words"),
                "{}",
                &ended[ended.len() - 40..]
            );
            assert!(ended.contains("exit status: 3"), "{}", &ended[..40]);
        }
    }
}
