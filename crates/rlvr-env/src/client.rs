//! The process client: an environment program in any language, started once and spoken to in
//! lock-step batches of JSON lines (docs/DESIGN.md section 14).
//!
//! Supervision is rlvr-reward's [`LineProcess`], the one persistent verifiers use: the program
//! leads its own process group, gets a minimal environment (`PATH HOME LANG TMPDIR` plus the
//! names in `env.env`), runs in the config file's directory, dies with rlvr (Linux), and is
//! killed with its group when the client is dropped. A reply line longer than
//! [`ProcessSettings::max_reply_bytes`] (or, for a request of n episodes, n ×
//! [`ProcessSettings::episode_reply_bytes`] when that is more) is refused without being read
//! into memory.
//!
//! Faults:
//! - the program dies (stdout closes, stdin is closed) or a request runs past
//!   [`ProcessSettings::timeout`]: it is killed, started again (`hello` first) and the same
//!   request is sent again, at most [`ProcessSettings::restarts`] times in the client's life;
//!   then the run stops with its exit status and stderr tail. (Addition to §14: a timeout counts
//!   as a death, so a stuck tool costs one timeout, not the run.)
//! - replay: the client keeps each live episode's `reset` and `step` requests and replies
//!   ([`crate::replay`]; dropped when the episode ends). Before a request reaches a program, the
//!   episodes of it whose state lived in a program that died are replayed to it: their `reset`,
//!   then each earlier `step` in order (lock-step batches over those episodes), then the request.
//!   A replayed reply whose observations (`reset`: messages and tools; `step`: messages and
//!   `done`) differ from the original's, or that fails the episode, makes that episode
//!   unscorable (the environment is not deterministic across a restart) and it is left out of the
//!   request; unless the program failed it itself, the program is then sent `finish` with reason
//!   `error` for it (it holds the episode's replayed state, and no later request names it). A
//!   death during a replay is a restart like any other (bounded by the same limit), and the
//!   replay starts again on the next program.
//! - closing: every episode the client fails itself while the program holds it (a replay that
//!   differed, an observation refused for a special token) is sent
//!   `finish` with reason `error` at once, so an `Err` result always means the program knows
//!   the episode ended (it failed it, or was told); rlvr's own later failures of an episode
//!   are closed by the caller with [`Environment::finish`]. Such a `finish` (reason `error`) is
//!   not preceded by a replay: an episode whose program died since is forgotten unsent (answered
//!   with an empty reply), as the program that held it is gone.
//!   Once the run is asked to stop ([`Environment::watch_stop`], the first Ctrl-C), a dead or
//!   silent program is not restarted: the run stops at once rather than after every restart's
//!   timeout.
//! - `hello` unanswered within the timeout, or answered with another version: the run stops.
//! - a reply that is not one JSON object, answers other episode ids, carries a top-level
//!   `error`, or is too long; an episode entry whose fields break the protocol (a `reward` that
//!   is not a finite number, a `done` that is not a boolean, a message of a wrong role); a line
//!   written between requests: the run stops (the program is killed, its command, exit status,
//!   stderr tail and log file named).
//! - an episode's `{"id", "error"}`, or an observation that will be rendered holding one of
//!   [`ProcessSettings::special_tokens`]: that episode is unscorable (the latter closed, above).
//!   A `step` reply that ends the episode (`done`, or the answer to turn
//!   [`ProcessSettings::max_turns`]) is not rendered, so it is not checked.
//!
//! (Over 600 lines: supervision and replay share the process and its restart count; the history
//! replayed is [`crate::replay`]'s.)
//!
//! Its stderr: the last [`rlvr_reward::process::STDERR_KEEP`] bytes go into error messages; with
//! [`ProcessSettings::stderr_log`] all of it is also written to that file (a line of rlvr's own
//! before each start), up to [`STDERR_LOG_CAP`] bytes.

use crate::json::Json;
use crate::protocol::{
    self, check_hello, EpisodeResult, FinishEpisode, FinishReply, Kind, ResetEpisode, ResetReply,
    StepEpisode, StepReply,
};
use crate::replay::{self, History};
use crate::validate::{check_groups, refuse_special_tokens};
use crate::{EnvError, Environment, Faults};
use rlvr_reward::process::{LineFault, LineProcess, StderrLog};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a program gets to exit after its stdin is closed before its group is killed.
pub const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Added to the error of a `hello` unanswered in time: the usual cause when a new environment
/// never answers (a program that answered `hello` flushes its replies).
pub const FLUSH_HINT: &str = "a program that writes its replies without flushing them never \
    answers through a pipe (Python buffers stdout there): flush after each line, e.g. \
    `print(json.dumps(reply), flush=True)`, or run `python3 -u`";

/// Where and how the environment program runs (the `[env]` keys it comes from in brackets).
#[derive(Debug, Clone)]
pub struct ProcessSettings {
    /// Program and arguments, no shell (`env.command`, its relative paths already resolved
    /// against the config file's directory).
    pub command: Vec<String>,
    /// The working directory (the config file's), or rlvr's own when `None`.
    pub dir: Option<PathBuf>,
    /// Environment variables passed besides `PATH HOME LANG TMPDIR` (`env.env`).
    pub env: Vec<String>,
    /// The longest wait for one reply, `hello`'s included (`env.timeout_s`).
    pub timeout: Duration,
    /// Restarts allowed in the client's life (`env.restarts`), at most [`MOST_RESTARTS`].
    pub restarts: u32,
    /// The longest reply line read, in bytes, whatever the request: at least this; see
    /// [`ProcessSettings::episode_reply_bytes`].
    pub max_reply_bytes: usize,
    /// Bytes of reply line allowed per episode of a request: a request of `n` episodes accepts
    /// a reply line of `max(max_reply_bytes, n × episode_reply_bytes)` bytes, so a large batch
    /// of legitimate observations is not refused by a fixed limit. 0: the fixed limit alone.
    pub episode_reply_bytes: usize,
    /// The `[env.options]` table handed to `hello` (an object).
    pub options: Json,
    /// Token strings refused in observations: the run passes its tokenizer's added tokens
    /// (special or not, e.g. Qwen's `<|im_end|>` and `<tool_call>`), which an encoder would
    /// turn into those tokens, so they are refused by default; empty allows all. Only
    /// observations that are rendered are checked: every `reset` reply's, and a `step` reply's
    /// unless it says `done` or answers turn [`ProcessSettings::max_turns`] (the episode ends
    /// there, and its messages only reach the transcript as text).
    pub special_tokens: Vec<String>,
    /// The last turn an episode may take (`env.max_turns`): a `step` reply to it is never
    /// rendered (the episode is finished with reason `max_turns`), so its messages are not
    /// checked for [`ProcessSettings::special_tokens`]. `None`: every reply that is not `done` is
    /// rendered.
    pub max_turns: Option<u32>,
    /// A file the program's stderr is also written to, in full up to [`STDERR_LOG_CAP`] bytes,
    /// appended to (a training run's `RUN_DIR/env.stderr`); `None` keeps only the tail that
    /// error messages show.
    pub stderr_log: Option<PathBuf>,
}

/// The most bytes of the program's stderr one client writes to [`ProcessSettings::stderr_log`]
/// (64 MiB): a program that floods stderr cannot fill the disk.
pub const STDERR_LOG_CAP: u64 = 64 << 20;

impl ProcessSettings {
    /// Settings for `command` with the defaults: no extra variables, 60 s per request, 3
    /// restarts, replies up to 16 MiB, no options, no special tokens refused.
    pub fn new(command: Vec<String>) -> Self {
        ProcessSettings {
            command,
            dir: None,
            env: Vec::new(),
            timeout: Duration::from_secs(60),
            restarts: 3,
            max_reply_bytes: 16 << 20,
            episode_reply_bytes: 0,
            options: Json::Object(Vec::new()),
            special_tokens: Vec::new(),
            max_turns: None,
            stderr_log: None,
        }
    }
}

/// The most restarts `env.restarts` may allow (the persistent verifier's bound,
/// `rlvr_reward::combine::MOST_RESTARTS`): a larger number means "forever", which would hold a
/// run on a program that can never answer.
pub const MOST_RESTARTS: u32 = rlvr_reward::combine::MOST_RESTARTS;

/// An environment program (see the module docs).
pub struct ProcessEnvironment {
    settings: ProcessSettings,
    log: Option<StderrLog>,
    proc: Option<LineProcess>,
    starts: u32,
    restarts: u32,
    /// `kind key` of the unread reply keys already warned about (once each per client).
    warned: std::collections::HashSet<String>,
    /// Set when the run is asked to stop ([`Environment::watch_stop`]): no more restarts.
    stop: Option<Arc<AtomicBool>>,
    /// The live episodes' requests and replies, replayed to a restarted program.
    history: History,
    /// Episodes replayed, and of them those whose replay differed, over the client's life.
    replayed: u64,
    diverged: u64,
    /// Of those, the ones closed with `finish` (reason `error`) on the program holding them.
    closed: u64,
}

/// Why one exchange failed.
enum Failure {
    /// The program is gone or stuck: restart it if restarts remain.
    Died(String),
    /// The run stops.
    Fatal(EnvError),
}

impl ProcessEnvironment {
    /// Starts the program and says `hello` (the start-up probe).
    ///
    /// # Errors
    /// [`EnvError::Process`] when it cannot start or does not answer `hello` in time,
    /// [`EnvError::Protocol`] for a wrong version, [`EnvError::Config`] for `restarts` above
    /// [`MOST_RESTARTS`] or an empty command.
    pub fn start(settings: ProcessSettings) -> Result<Self, EnvError> {
        if settings.restarts > MOST_RESTARTS {
            return Err(EnvError::Config(format!(
                "env.restarts = {} is out of range: at most {MOST_RESTARTS}",
                settings.restarts
            )));
        }
        if settings.command.is_empty() {
            return Err(EnvError::Config(
                "env.command is empty: give the program and its arguments as a list".into(),
            ));
        }
        let log = match &settings.stderr_log {
            Some(path) => Some(StderrLog::append(path, STDERR_LOG_CAP).map_err(|e| {
                EnvError::Config(format!(
                    "cannot open {} for the environment's stderr: {e}",
                    path.display()
                ))
            })?),
            None => None,
        };
        let mut env = ProcessEnvironment {
            settings,
            log,
            proc: None,
            starts: 0,
            restarts: 0,
            warned: std::collections::HashSet::new(),
            stop: None,
            history: History::default(),
            replayed: 0,
            diverged: 0,
            closed: 0,
        };
        env.ensure_started()?;
        Ok(env)
    }

    /// How many times the program was started (1 while it never died).
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// Episodes whose requests are kept for a replay (the live ones, [`crate::replay`]): 0
    /// once every episode sent ended.
    pub fn kept_episodes(&self) -> usize {
        self.history.len()
    }

    /// The program's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(LineProcess::id)
    }

    fn command_line(&self) -> String {
        self.settings.command.join(" ")
    }

    /// The error of a process fault: the command, `reason`, and the file holding the program's
    /// whole stderr when there is one ([`ProcessSettings::stderr_log`]).
    fn process_error(&self, reason: String) -> EnvError {
        let reason = match &self.log {
            Some(log) => format!("{reason}; its whole stderr is in {}", log.path().display()),
            None => reason,
        };
        EnvError::Process {
            command: self.command_line(),
            reason,
        }
    }

    fn ensure_started(&mut self) -> Result<(), EnvError> {
        if self.proc.is_some() {
            return Ok(());
        }
        let s = &self.settings;
        if let Some(log) = &self.log {
            log.write(
                format!(
                    "[rlvr: starting `{}` (start {})]\n",
                    s.command.join(" "),
                    self.starts + 1
                )
                .as_bytes(),
            );
        }
        let p = LineProcess::start_logged(
            &s.command,
            &s.env,
            s.dir.as_deref(),
            s.max_reply_bytes,
            self.log.clone(),
        )
        .map_err(|e| self.process_error(e))?;
        self.starts += 1;
        let hello = protocol::hello_line(&s.options);
        let answer = if p.send(hello) {
            p.recv_line(Instant::now() + s.timeout)
        } else {
            Err(LineFault::Closed)
        };
        // Why hello failed, as text: the command is named once, by the error made below.
        let checked = match answer {
            Ok(line) => check_hello(&line).map_err(|e| e.to_string()),
            Err(LineFault::Timeout) => Err(format!(
                "no answer to hello within {:.1} s (env.timeout_s; {FLUSH_HINT})",
                s.timeout.as_secs_f64()
            )),
            Err(f) => Err(format!("{f} before answering hello")),
        };
        match checked {
            Ok(()) => {
                self.proc = Some(p);
                Ok(())
            }
            Err(e) => {
                let ended = p.end(Duration::from_millis(200));
                Err(self.process_error(format!("{e} (it was stopped: {ended})")))
            }
        }
    }

    /// Sends one request line and reads its reply, once.
    fn exchange_once(
        &mut self,
        kind: Kind,
        line: &str,
        ids: &[&str],
    ) -> Result<Vec<EpisodeResult<Json>>, Failure> {
        let p = self.proc.as_ref().expect("started before exchanging");
        match p.pending_line() {
            Ok(None) => {}
            Ok(Some(l)) => {
                return Err(Failure::Fatal(EnvError::Protocol(format!(
                    "the environment wrote a line between requests (exactly one reply line per \
                     request expected): {:?}",
                    l.chars().take(200).collect::<String>()
                ))))
            }
            Err(LineFault::Closed) => return Err(Failure::Died("its stdout closed".into())),
            Err(f) => return Err(Failure::Fatal(EnvError::Protocol(f.to_string()))),
        }
        let s = &self.settings;
        p.set_max_line(
            s.max_reply_bytes
                .max(ids.len().saturating_mul(s.episode_reply_bytes)),
        );
        if !p.send(line.to_string()) {
            return Err(Failure::Died("its stdin is closed".into()));
        }
        match p.recv_line(Instant::now() + self.settings.timeout) {
            Ok(reply) => protocol::parse_reply(kind, &reply, ids).map_err(Failure::Fatal),
            Err(LineFault::Closed) => Err(Failure::Died(format!(
                "its stdout closed before the reply to {}",
                kind.as_str()
            ))),
            Err(LineFault::Timeout) => Err(Failure::Died(format!(
                "no reply to {} within {:.1} s (env.timeout_s)",
                kind.as_str(),
                self.settings.timeout.as_secs_f64()
            ))),
            Err(f) => Err(Failure::Fatal(EnvError::Protocol(format!(
                "the reply to {}: {f}",
                kind.as_str()
            )))),
        }
    }

    /// The error of an episode entry that breaks the protocol (a reward that is not a number, a
    /// message of a wrong role, ...): the program is killed, and the error names its command,
    /// exit status, stderr tail and log file, as a malformed reply line's does.
    fn malformed(&mut self, e: EnvError) -> EnvError {
        let ended = match self.proc.take() {
            Some(p) => p.end(Duration::ZERO),
            None => "not running".into(),
        };
        self.process_error(format!("{e} (it was killed: {ended})"))
    }

    /// Warns, once per request kind and key, of the keys of `raw`'s episode entries that rlvr
    /// does not read ([`protocol::unread_keys`]): on rlvr's stderr and in the program's stderr
    /// log, naming the key it probably stands for.
    fn warn_unread(&mut self, kind: Kind, raw: &[EpisodeResult<Json>]) {
        for v in raw.iter().filter_map(|r| r.as_ref().ok()) {
            for (key, meant) in protocol::unread_keys(kind, v) {
                if !self.warned.insert(format!("{} {key}", kind.as_str())) {
                    continue;
                }
                let hint = match meant {
                    Some(m) => format!("; did you mean {m:?}?"),
                    None => String::new(),
                };
                let read = protocol::reply_keys(kind).join(", ");
                let line = format!(
                    "warning: environment `{}`: its {} reply carries {key:?}, which rlvr does \
                     not read (an episode entry's keys: {read}){hint}",
                    self.command_line(),
                    kind.as_str()
                );
                eprintln!("{line}");
                if let Some(log) = &self.log {
                    log.write(format!("[rlvr: {line}]\n").as_bytes());
                }
            }
        }
    }

    /// One batch request with restarts and replay (see the module docs): the episodes of it
    /// whose state lived in a program that died are replayed first ([`Self::replay`]); one
    /// whose replay differs is left out of the request and answered with its error.
    ///
    /// `closing[k]` (a `finish` with reason `error`; empty: none): episode `k` is not replayed
    /// to a program that never held it only to be closed: it is forgotten and answered with an
    /// empty reply, unsent (the program that held it is gone, and its state with it).
    fn exchange(
        &mut self,
        kind: Kind,
        episodes: Vec<Json>,
        ids: &[&str],
        closing: &[bool],
    ) -> Result<Vec<EpisodeResult<Json>>, EnvError> {
        let mut lost: Vec<Option<String>> = vec![None; ids.len()];
        let mut unsent = vec![false; ids.len()];
        loop {
            self.ensure_started()?;
            for (k, id) in ids.iter().enumerate() {
                let stale = || !self.history.stale(&[id], self.starts).is_empty();
                if closing.get(k) == Some(&true) && !unsent[k] && stale() {
                    self.history.forget(id);
                    unsent[k] = true;
                }
            }
            let attempt = self.replay(ids, &mut lost).and_then(|()| {
                let keep: Vec<usize> = (0..ids.len())
                    .filter(|&k| lost[k].is_none() && !unsent[k])
                    .collect();
                if keep.is_empty() {
                    return Ok(Vec::new());
                }
                let sent: Vec<Json> = keep.iter().map(|&k| episodes[k].clone()).collect();
                let sent_ids: Vec<&str> = keep.iter().map(|&k| ids[k]).collect();
                self.exchange_once(kind, &protocol::request_line(kind, sent), &sent_ids)
            });
            match attempt {
                Ok(replies) => {
                    let mut replies = replies.into_iter();
                    return Ok(lost
                        .into_iter()
                        .zip(ids.iter().zip(unsent))
                        .map(|(l, (id, unsent))| match l {
                            Some(why) => Err(why),
                            None if unsent => Ok(Json::object([("id", Json::from(*id))])),
                            None => replies.next().expect("one reply per episode sent"),
                        })
                        .collect());
                }
                Err(f) => self.recover(kind, f, true)?,
            }
        }
    }

    /// Replays to the running program the episodes of `ids` whose state lived in a program that
    /// died: their `reset`, then their `step`s in order, one lock-step batch per step index.
    /// An episode whose replayed replies differ from the originals (or fail it) gets its error in
    /// `lost` (at its index in `ids`) and is forgotten; the others now live in this program.
    fn replay(&mut self, ids: &[&str], lost: &mut [Option<String>]) -> Result<(), Failure> {
        let stale = self.history.stale(ids, self.starts);
        if stale.is_empty() {
            return Ok(());
        }
        let mut failed: std::collections::HashMap<&str, String> = Default::default();
        // Of those, the ones the program failed itself (an `error` entry): it knows they ended.
        let mut own: std::collections::HashSet<&str> = Default::default();
        let resets: Vec<ResetEpisode> = stale
            .iter()
            .map(|id| self.history.get(id).expect("kept").reset.clone())
            .collect();
        let line = protocol::request_line(Kind::Reset, protocol::reset_episodes(&resets));
        let raw = self.exchange_once(Kind::Reset, &line, &stale)?;
        for (id, r) in stale.iter().zip(raw) {
            let why = match r {
                Err(m) => {
                    own.insert(id);
                    Some(format!("its replayed reset failed the episode: {m}"))
                }
                Ok(v) => {
                    let reply = protocol::parse_reset(&v, id).map_err(Failure::Fatal)?;
                    let original = &self.history.get(id).expect("kept").reset_reply;
                    replay::reset_differs(original, &reply).map(|f| {
                        format!("its replayed reset reply gives other {f} than the original")
                    })
                }
            };
            if let Some(why) = why {
                failed.insert(id, why);
            }
        }
        let mut steps = 0;
        for j in 0.. {
            let these: Vec<&str> = stale
                .iter()
                .copied()
                .filter(|id| !failed.contains_key(id))
                .filter(|id| self.history.get(id).is_some_and(|k| k.steps.len() > j))
                .collect();
            if these.is_empty() {
                break;
            }
            let sent: Vec<(StepEpisode, StepReply)> = these
                .iter()
                .map(|id| self.history.get(id).expect("kept").steps[j].clone())
                .collect();
            let reqs: Vec<StepEpisode> = sent.iter().map(|(e, _)| e.clone()).collect();
            let line = protocol::request_line(Kind::Step, protocol::step_episodes(&reqs));
            let raw = self.exchange_once(Kind::Step, &line, &these)?;
            steps += these.len();
            for ((id, (e, original)), r) in these.iter().zip(&sent).zip(raw) {
                let why = match r {
                    Err(m) => {
                        own.insert(id);
                        Some(format!(
                            "its replayed step {} failed the episode: {m}",
                            e.turn
                        ))
                    }
                    Ok(v) => {
                        let reply = protocol::parse_step(&v, id).map_err(Failure::Fatal)?;
                        replay::step_differs(original, &reply).map(|f| {
                            format!(
                                "its replayed step {} reply gives another {f} than the original",
                                e.turn
                            )
                        })
                    }
                };
                if let Some(why) = why {
                    failed.insert(id, why);
                }
            }
        }
        self.replayed += stale.len() as u64;
        self.diverged += failed.len() as u64;
        let differed = failed.len();
        // The failed episodes the program did not fail itself: it holds their state (their
        // replayed reset, maybe steps), and no later request names them. Closed below.
        let close: Vec<&str> = stale
            .iter()
            .copied()
            .filter(|id| failed.contains_key(id) && !own.contains(id))
            .collect();
        for id in &stale {
            match failed.remove(id) {
                Some(why) => {
                    let k = ids
                        .iter()
                        .position(|i| i == id)
                        .expect("stale ids are the request's");
                    lost[k] = Some(format!(
                        "the environment is not deterministic across a restart: replayed to the \
                         restarted program (start {}), {why}; the model's later turns were \
                         conditioned on the original replies, so the episode cannot be scored \
                         (make the program's replies depend only on the episode's requests and \
                         its seed)",
                        self.starts
                    ));
                    self.history.forget(id);
                }
                None => self.history.moved(id, self.starts),
            }
        }
        let line = format!(
            "[rlvr: replayed {} episodes ({} steps) to start {}; {} differed]\n",
            stale.len(),
            steps,
            self.starts,
            differed
        );
        if let Some(log) = &self.log {
            log.write(line.as_bytes());
        }
        self.close(&close)
    }

    /// Sends `finish` with reason `error` for the episodes `ids`, which rlvr failed while the
    /// running program holds their state (their replay differed, or the client refused their
    /// observation), so that it frees what it keeps for them (DESIGN.md section 14's additions,
    /// "Closing failed replays"). They are already forgotten: a death here restarts the program
    /// without replaying them. The replies' rewards and episode errors are not read (the
    /// episodes are unscorable already); a malformed reply stops the run, as any reply's.
    fn close(&mut self, ids: &[&str]) -> Result<(), Failure> {
        if ids.is_empty() {
            return Ok(());
        }
        let eps: Vec<FinishEpisode> = ids
            .iter()
            .map(|id| FinishEpisode {
                id: (*id).to_string(),
                reason: protocol::FinishReason::Error,
            })
            .collect();
        let line = protocol::request_line(Kind::Finish, protocol::finish_episodes(&eps));
        let raw = self.exchange_once(Kind::Finish, &line, ids)?;
        for (id, r) in ids.iter().zip(raw) {
            if let Ok(v) = r {
                protocol::parse_finish(&v, id).map_err(Failure::Fatal)?;
            }
        }
        self.closed += ids.len() as u64;
        Ok(())
    }

    /// Sends `finish` with reason `error` for the episodes `ids` of the request just answered
    /// that the client failed itself although the program answered them (an observation holding
    /// a special token): the program still holds their state (DESIGN.md section 14's additions,
    /// "Closing failed replays"). They are already forgotten. A death here restarts the
    /// program (counted against the restarts) without sending it again: the new program never
    /// held them.
    ///
    /// # Errors
    /// A malformed reply, or a death past the restarts (as [`Self::recover`]).
    fn close_refused(&mut self, ids: &[&str]) -> Result<(), EnvError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.ensure_started()?;
        match self.close(ids) {
            Ok(()) => Ok(()),
            Err(f) => self.recover(Kind::Finish, f, false),
        }
    }

    /// After a failed exchange of a `kind` request: a fatal fault, a death past the restarts or
    /// a death once the run is asked to stop is the run's error; another death kills the
    /// program, counts a restart and warns (the next exchange starts a new one). `resend`: the
    /// request is sent again to the new program after the replay (every request but the
    /// `finish` that closes episodes the client refused, whose state died with the program).
    fn recover(&mut self, kind: Kind, failure: Failure, resend: bool) -> Result<(), EnvError> {
        let p = self.proc.take().expect("started before exchanging");
        match failure {
            Failure::Fatal(e) => {
                let ended = p.end(Duration::ZERO);
                Err(self.process_error(format!("{e} (it was killed: {ended})")))
            }
            Failure::Died(why) => {
                let ended = p.end(Duration::from_millis(200));
                if self.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) {
                    return Err(self.process_error(format!(
                        "{why} ({ended}); not restarted, as the run was asked to stop (it \
                         stops with the last completed step's checkpoint; `rlvr train \
                         --resume` continues from it)"
                    )));
                }
                if self.restarts >= self.settings.restarts {
                    return Err(self.process_error(format!(
                        "{why} ({ended}) after {} restarts (the limit, env.restarts); fix \
                         the environment, then run again (`rlvr train --resume` continues a \
                         training run from its last checkpoint)",
                        self.restarts
                    )));
                }
                self.restarts += 1;
                let next = match resend {
                    true => format!(
                        "replaying to it the live episodes of the {} request (their reset and \
                         earlier steps) and sending the request again",
                        kind.as_str()
                    ),
                    false => "the episodes it was told to finish (reason error) are not sent \
                              again: their state died with it"
                        .to_string(),
                };
                eprintln!(
                    "warning: environment `{}`: {why} ({}); restarting it (restart {} of at most \
                     {}), {next}",
                    self.command_line(),
                    ended.chars().take(2000).collect::<String>(),
                    self.restarts,
                    self.settings.restarts,
                );
                Ok(())
            }
        }
    }
}

impl Drop for ProcessEnvironment {
    fn drop(&mut self) {
        if let Some(p) = self.proc.take() {
            p.end(EXIT_GRACE);
        }
    }
}

impl Environment for ProcessEnvironment {
    fn watch_stop(&mut self, stop: Arc<AtomicBool>) {
        self.stop = Some(stop);
    }

    fn faults(&self) -> Faults {
        Faults {
            restarts: u64::from(self.restarts),
            replayed: self.replayed,
            diverged: self.diverged,
            closed: self.closed,
        }
    }

    fn reset(
        &mut self,
        episodes: &[ResetEpisode],
    ) -> Result<Vec<EpisodeResult<ResetReply>>, EnvError> {
        if episodes.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = episodes.iter().map(|e| e.id.as_str()).collect();
        let raw = self.exchange(Kind::Reset, protocol::reset_episodes(episodes), &ids, &[])?;
        self.warn_unread(Kind::Reset, &raw);
        let mut out = Vec::with_capacity(raw.len());
        // The episodes the client itself fails (the program answered them): closed below.
        let mut refused: Vec<&str> = Vec::new();
        for (r, id) in raw.into_iter().zip(&ids) {
            out.push(match r {
                Ok(v) => {
                    let reply = protocol::parse_reset(&v, id).map_err(|e| self.malformed(e))?;
                    let ms = reply.messages.as_deref().unwrap_or_default();
                    let checked =
                        refuse_special_tokens(ms, &self.settings.special_tokens).map(|()| reply);
                    if checked.is_err() {
                        refused.push(id);
                    }
                    checked
                }
                Err(e) => Err(e),
            });
        }
        check_groups(episodes, &out)?;
        for (e, r) in episodes.iter().zip(&out) {
            match r {
                Ok(reply) => self.history.reset(e, reply, self.starts),
                Err(_) => self.history.forget(&e.id),
            }
        }
        self.close_refused(&refused)?;
        Ok(out)
    }

    fn step(
        &mut self,
        episodes: &[StepEpisode],
    ) -> Result<Vec<EpisodeResult<StepReply>>, EnvError> {
        if episodes.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = episodes.iter().map(|e| e.id.as_str()).collect();
        let raw = self.exchange(Kind::Step, protocol::step_episodes(episodes), &ids, &[])?;
        self.warn_unread(Kind::Step, &raw);
        let mut out = Vec::with_capacity(raw.len());
        // The episodes the client itself fails (the program did not end them): closed below.
        let mut refused: Vec<&str> = Vec::new();
        for ((r, id), e) in raw.into_iter().zip(&ids).zip(episodes) {
            out.push(match r {
                Ok(v) => {
                    let reply = protocol::parse_step(&v, id).map_err(|e| self.malformed(e))?;
                    // A reply that ends the episode (`done`, or the last turn's) is never
                    // rendered: a special token in it reaches no encoder.
                    let last = self.settings.max_turns.is_some_and(|m| e.turn >= m);
                    let checked = match reply.done || last {
                        true => Ok(reply),
                        false => {
                            refuse_special_tokens(&reply.messages, &self.settings.special_tokens)
                                .map(|()| reply)
                        }
                    };
                    if checked.is_err() {
                        refused.push(id);
                    }
                    checked
                }
                Err(e) => Err(e),
            });
        }
        for (e, r) in episodes.iter().zip(&out) {
            match r {
                Ok(reply) => self.history.step(e, reply),
                Err(_) => self.history.forget(&e.id),
            }
        }
        self.close_refused(&refused)?;
        Ok(out)
    }

    fn finish(
        &mut self,
        episodes: &[FinishEpisode],
    ) -> Result<Vec<EpisodeResult<FinishReply>>, EnvError> {
        if episodes.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = episodes.iter().map(|e| e.id.as_str()).collect();
        let closing: Vec<bool> = episodes
            .iter()
            .map(|e| e.reason == protocol::FinishReason::Error)
            .collect();
        let raw = self.exchange(
            Kind::Finish,
            protocol::finish_episodes(episodes),
            &ids,
            &closing,
        )?;
        for id in &ids {
            self.history.forget(id);
        }
        self.warn_unread(Kind::Finish, &raw);
        let mut out = Vec::with_capacity(raw.len());
        for (r, id) in raw.into_iter().zip(&ids) {
            out.push(match r {
                Ok(v) => Ok(protocol::parse_finish(&v, id).map_err(|e| self.malformed(e))?),
                Err(e) => Err(e),
            });
        }
        Ok(out)
    }
}
