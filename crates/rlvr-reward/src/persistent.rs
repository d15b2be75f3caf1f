//! Persistent external verifiers: a user program started once per run that scores one batch per
//! JSON line.
//!
//! Protocol (version [`PROTOCOL_VERSION`]): for each batch rlvr writes one line
//! `{"version": 1, "items": [ITEM, ...]}` to the program's stdin, where an ITEM is
//! [`crate::external::item_json`] (prompt, completion, reference, index, row), and reads one line
//! from its stdout: `{"rewards": [R, ...]}` with one entry per item in order, each a number or an
//! object `{"reward": number, "correct"?: bool, "extracted"?: str, "gold"?: str, "extra"?:
//! {name: number}}` (`extra`: numbers logged beside the reward,
//! [`crate::external::extra_numbers`]; an addition that needs no version change). Blank lines are
//! skipped. A reply `{"error": "..."}` stops the run with that message, and a reply carrying a
//! `"version"` other than [`PROTOCOL_VERSION`] is refused.
//!
//! Lifetime: the program starts at the first batch. When it dies (its stdout closes, or its stdin
//! is closed when a batch is written), the batch is sent again to a fresh start, with a message on
//! stderr, at most `max_restarts` times in a run; then the batch fails with the exit status and
//! the tail of its stderr. A timeout, a malformed reply or a wrong count fails the batch at once
//! (and the program is killed, so that a later batch starts it afresh). On Unix the program leads
//! its own process group; dropping the verifier closes its stdin, waits up to
//! [`EXIT_GRACE`] for it to exit, then kills the whole group. Its environment is minimal, as for
//! per-batch programs ([`crate::external::BASE_ENV`] and the config's `env` list). The user guide
//! is docs/external-verifier.md.

use crate::external::{item_json, Reply};
use crate::process::{LineFault, LineProcess};
use crate::{truncate, RewardError, Sample, Score, Verifier};
use serde::Deserialize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The protocol version written in every request as `"version"`. It changes only when a change
/// would break a program written for the previous one; new keys in an item do not change it.
pub const PROTOCOL_VERSION: u64 = 1;

/// How long a program gets to exit after its stdin is closed, at the end of a run, before its
/// process group is killed.
pub const EXIT_GRACE: Duration = Duration::from_secs(2);

/// The longest reply line read from a program, in bytes (64 MiB): a longer one fails the batch
/// without being read into memory.
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// A verifier that keeps one program running for the whole run (see the module docs).
pub struct PersistentVerifier {
    command: Vec<String>,
    env: Vec<String>,
    timeout: Duration,
    max_restarts: u32,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    proc: Option<LineProcess>,
    starts: u32,
    restarts: u32,
}

/// Why one exchange failed.
enum Failure {
    /// The program is gone: start it again if restarts remain.
    Died(String),
    /// The batch fails (timeout, protocol violation).
    Fatal(String),
}

#[derive(Deserialize)]
struct BatchReply {
    version: Option<u64>,
    rewards: Option<Vec<Entry>>,
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Entry {
    Number(f64),
    Full(Reply),
}

impl PersistentVerifier {
    /// A verifier for `command` (program and arguments, no shell) with `timeout` per batch
    /// (the first batch's includes the program's start-up) and at most `max_restarts` restarts
    /// in its lifetime. Nothing starts until the first batch.
    pub fn new(command: Vec<String>, timeout: Duration, max_restarts: u32) -> Self {
        PersistentVerifier {
            command,
            env: Vec::new(),
            timeout,
            max_restarts,
            state: Mutex::new(State::default()),
        }
    }

    /// The verifier with the environment variables `env` names passed to its program besides
    /// [`crate::external::BASE_ENV`] (the config's `env` list; all others are withheld).
    pub fn with_env(mut self, env: Vec<String>) -> Self {
        self.env = env;
        self
    }

    /// How many times the program has been started so far (1 for a run where it never died).
    pub fn starts(&self) -> u32 {
        self.lock().starts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves no half-written state worth refusing.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fail(&self, reason: String) -> RewardError {
        RewardError::External {
            command: self.command.join(" "),
            reason,
        }
    }

    fn spawn(&self) -> Result<LineProcess, RewardError> {
        LineProcess::start(&self.command, &self.env, None, MAX_REPLY_BYTES)
            .map_err(|e| self.fail(e))
    }

    /// Sends one request and reads its reply line.
    fn exchange(
        &self,
        p: &mut LineProcess,
        request: &str,
        n: usize,
    ) -> Result<Vec<Score>, Failure> {
        // A line left over from the last batch means the program and rlvr disagree on the count.
        match p.pending_line() {
            Ok(None) => {}
            Ok(Some(l)) => {
                return Err(Failure::Fatal(format!(
                    "wrote a line between batches (one reply line per request expected): {:?}",
                    truncate(&l, 200)
                )))
            }
            Err(LineFault::Closed) => {
                return Err(Failure::Died("its stdout closed between batches".into()))
            }
            Err(e) => return Err(Failure::Fatal(e.to_string())),
        }
        if !p.send(request.to_string()) {
            return Err(Failure::Died("its stdin is closed".into()));
        }
        let line = match p.recv_line(Instant::now() + self.timeout) {
            Ok(l) => l,
            Err(LineFault::Closed) => {
                return Err(Failure::Died("its stdout closed before the reply".into()))
            }
            Err(LineFault::Timeout) => {
                return Err(Failure::Fatal(format!(
                    "timed out after {:.1} s on a batch of {n} (raise timeout_s or speed the program up)",
                    self.timeout.as_secs_f64()
                )))
            }
            Err(e) => return Err(Failure::Fatal(e.to_string())),
        };
        parse_reply(&line, n).map_err(Failure::Fatal)
    }
}

/// The scores of one reply line for `n` items, or what is wrong with it.
fn parse_reply(line: &str, n: usize) -> Result<Vec<Score>, String> {
    let shown = || truncate(line, 200);
    let r: BatchReply = serde_json::from_str(line).map_err(|e| {
        format!(
            "reply {:?}: {e} (expected {{\"rewards\": [number, ...]}})",
            shown()
        )
    })?;
    if let Some(v) = r.version.filter(|v| *v != PROTOCOL_VERSION) {
        return Err(format!(
            "replied with protocol version {v}; this rlvr speaks version {PROTOCOL_VERSION}"
        ));
    }
    if let Some(e) = r.error {
        return Err(format!("reported an error: {e}"));
    }
    let rewards = r
        .rewards
        .ok_or_else(|| format!("reply {:?} has neither \"rewards\" nor \"error\"", shown()))?;
    if rewards.len() != n {
        return Err(format!(
            "replied with {} rewards for {n} items (one per item, in order, expected)",
            rewards.len()
        ));
    }
    rewards
        .into_iter()
        .enumerate()
        .map(|(k, e)| {
            let score = match e {
                Entry::Number(x) => Reply::number(x).into_score(),
                Entry::Full(r) => r.into_score(),
            };
            score.map_err(|e| format!("reward {} of the reply: {e}", k + 1))
        })
        .collect()
}

impl Drop for PersistentVerifier {
    fn drop(&mut self) {
        if let Some(p) = self.lock().proc.take() {
            p.end(EXIT_GRACE);
        }
    }
}

impl Verifier for PersistentVerifier {
    fn score(&self, sample: &Sample<'_>) -> Result<Score, RewardError> {
        let mut v = self.score_batch(std::slice::from_ref(sample))?;
        v.pop()
            .ok_or_else(|| self.fail("no reply for the sample".into()))
    }

    fn score_batch(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        if samples.is_empty() {
            return Ok(Vec::new());
        }
        let items: Vec<serde_json::Value> = samples.iter().map(item_json).collect();
        let request = serde_json::json!({"version": PROTOCOL_VERSION, "items": items});
        let request = format!("{request}\n");
        let mut st = self.lock();
        loop {
            if st.proc.is_none() {
                st.proc = Some(self.spawn()?);
                st.starts += 1;
            }
            let p = st.proc.as_mut().expect("started above");
            let failure = match self.exchange(p, &request, samples.len()) {
                Ok(scores) => return Ok(scores),
                Err(f) => f,
            };
            let p = st.proc.take().expect("started above");
            match failure {
                Failure::Fatal(why) => {
                    // rlvr ends the program itself here (it reported an error, broke the
                    // protocol or timed out): say so, lest its SIGKILL read as a crash.
                    let ended = p.end(Duration::ZERO);
                    return Err(
                        self.fail(format!("{why} (rlvr then stopped the program: {ended})"))
                    );
                }
                Failure::Died(why) => {
                    let ended = p.end(Duration::from_millis(500));
                    if st.restarts >= self.max_restarts {
                        return Err(self.fail(format!(
                            "died ({why}: {ended}) after {} restarts in this run (the limit, \
                             `restarts`); fix the program and resume",
                            st.restarts
                        )));
                    }
                    st.restarts += 1;
                    eprintln!(
                        "warning: external verifier `{}` died ({why}: {}); restarting it \
                         (restart {} of at most {})",
                        self.command.join(" "),
                        truncate(&ended, 2000),
                        st.restarts,
                        self.max_restarts
                    );
                }
            }
        }
    }
}
