//! Chat templates rendered in a separate process with bounded memory (issue 49, item 9).
//!
//! A chat template ships with every downloaded model and is a program: minijinja's fuel bounds
//! the instructions it runs ([`crate::tokenizer::TEMPLATE_FUEL`]), but not the memory or the stack
//! a few instructions can take. `{% set ns.s = ns.s ~ ns.s %}` forty times asks for a terabyte,
//! `indent(100000)` or `replace` blow up a string, a 100,000-deep `tojson` overflows the stack;
//! in rlvr's own process each of these aborts the run (Rust cannot recover from a failed
//! allocation or a stack overflow). So the `rlvr` binary renders every chat template in a worker
//! process: rlvr's own executable started again with [`RENDER_ARG`], its address space limited to
//! [`WORKER_MEMORY_BYTES`] (`RLIMIT_AS`), its rendered text to [`MAX_RENDERED_BYTES`]. A template
//! that passes a bound kills the worker, not rlvr: the prompt's rendering fails with an error that
//! says so ([`crate::ModelError::Template`]), and the next rendering starts a fresh worker.
//!
//! The worker speaks JSON lines on its stdin and stdout: one request per rendering
//! (`{"template", "messages", "add_generation_prompt", "bos_token", "eos_token"}`) and one answer
//! (`{"text": ...}` or `{"error": ...}`). It renders with the same code as the in-process path
//! ([`crate::tokenizer::render_chat_template`]), so the text is the same byte for byte. Renderings are serialised through one worker (a mutex): a prompt
//! renders in tens of microseconds, far from a bottleneck beside tokenization and sampling.
//!
//! The worker exits when its stdin closes (rlvr exited or dropped it) and, on Linux, when rlvr
//! dies (`PR_SET_PDEATHSIG`). Library users that do not call [`enable`] (unit tests) render in
//! their own process as before.

use crate::tokenizer::Message;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The first argument that makes `rlvr` run as the template worker (not a command users type).
pub const RENDER_ARG: &str = "__rlvr-render";

/// The worker's address-space limit (`RLIMIT_AS`), in bytes: 2 GiB, about twenty times what the
/// longest released chat template needs for a long conversation, and small enough that a
/// template's blow-up ends the worker within a second.
pub const WORKER_MEMORY_BYTES: u64 = 2 << 30;

/// The most bytes a rendered prompt may have (16 MiB, thousands of times a long prompt).
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

static WORKER_EXE: OnceLock<PathBuf> = OnceLock::new();
static WORKER: Mutex<Option<Worker>> = Mutex::new(None);
/// Workers started so far ([`worker_starts`]).
static STARTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many worker processes this process has started (a dead worker is replaced by the next
/// rendering; tests use this to see that a worker lived on).
pub fn worker_starts() -> u64 {
    STARTS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Renders every later chat template in a worker process started from `exe` (the executable that
/// calls [`main`] when its first argument is [`RENDER_ARG`]; the `rlvr` binary passes its own). A
/// second call is ignored.
pub fn enable(exe: PathBuf) {
    if WORKER_EXE.set(exe).is_ok() {
        let _ = crate::tokenizer::RENDERER.set(render);
    }
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Request<'a> {
    /// Another renderer's request ([`call`]): its kind and its payload, handed to the worker's
    /// [`Extra`] renderer; `None` for a chat template.
    #[serde(borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    payload: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    template: std::borrow::Cow<'a, str>,
    messages: std::borrow::Cow<'a, [Message]>,
    add_generation_prompt: bool,
    bos_token: Option<std::borrow::Cow<'a, str>>,
    eos_token: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answer {
    Text(String),
    Error(String),
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn start(exe: &PathBuf) -> std::io::Result<Self> {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(exe);
        cmd.arg0("rlvr-render")
            .arg(RENDER_ARG)
            .arg(std::process::id().to_string())
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        // Forked by a thread that never ends: the worker's parent-death signal follows the
        // forking thread, and a worker forked by, say, an explorer thread would be killed when
        // that thread ends, possibly while another thread's request is in flight.
        let mut child = rlvr_rundir::spawn::from_lasting_thread(cmd)?;
        STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Renders in the worker (see the module docs); the in-process renderer's error text otherwise.
///
/// # Errors
/// The template's own errors, as the in-process renderer words them; or, when the worker died
/// while rendering (memory, stack) or answered past the size limit, a message naming the bound.
fn render(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: Option<&str>,
    eos_token: Option<&str>,
) -> Result<String, String> {
    let request = Request {
        template: template.into(),
        messages: messages.into(),
        add_generation_prompt,
        bos_token: bos_token.map(Into::into),
        eos_token: eos_token.map(Into::into),
        ..Request::default()
    };
    exchange_request(&request)
}

/// A renderer the worker runs besides chat templates, given by the binary to [`main`]: `(kind,
/// payload)` to the rendered text or the error's message (rlvr-env's tool-calling templates, whose
/// code this crate cannot name).
pub type Extra = fn(&str, &str) -> Result<String, String>;

/// Renders `payload` (JSON text) with the worker's [`Extra`] renderer of `kind`, under the same
/// bounds as a chat template.
///
/// # Errors
/// The renderer's own error; the worker died or answered past the size bound (named); the worker
/// is not [`enable`]d.
pub fn call(kind: &str, payload: &str) -> Result<String, String> {
    if WORKER_EXE.get().is_none() {
        return Err("the template worker is not enabled".into());
    }
    exchange_request(&Request {
        kind: Some(kind.into()),
        payload: Some(payload.into()),
        ..Request::default()
    })
}

fn exchange_request(request: &Request<'_>) -> Result<String, String> {
    let exe = WORKER_EXE.get().expect("render is called once enabled");
    let mut line = serde_json::to_string(request).map_err(|e| e.to_string())?;
    line.push('\n');
    let mut slot = WORKER.lock().unwrap_or_else(|e| e.into_inner());
    // A worker that ended between renderings (killed from outside) is replaced; so is one that
    // could not take the request.
    for attempt in 0..2 {
        if slot
            .as_mut()
            .is_some_and(|w| !matches!(w.child.try_wait(), Ok(None)))
        {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(Worker::start(exe).map_err(|e| {
                format!(
                    "could not start the chat-template worker {}: {e}",
                    exe.display()
                )
            })?);
        }
        let worker = slot.as_mut().expect("just set");
        match exchange(worker, &line) {
            Ok(Answer::Text(t)) => return Ok(t),
            Ok(Answer::Error(e)) => return Err(e),
            Err(Fault::NotSent) if attempt == 0 => *slot = None,
            Err(Fault::NotSent) => {
                *slot = None;
                return Err("the chat-template worker does not take requests".into());
            }
            Err(Fault::Died(why)) => {
                // It died rendering this prompt: the next rendering starts a fresh one.
                *slot = None;
                return Err(why);
            }
        }
    }
    unreachable!("the second attempt returns")
}

/// Why a request got no answer.
enum Fault {
    /// The request could not be written: the worker was gone before it read it.
    NotSent,
    /// The worker took the request and died, or answered past the size bound (the message).
    Died(String),
}

fn exchange(worker: &mut Worker, line: &str) -> Result<Answer, Fault> {
    let died = |what: &str| {
        format!(
            "rendering the chat template {what}: the template needed more than the {} GiB of \
             memory, the stack depth or the {} MiB of output that rendering one prompt may take \
             (a string or list doubled in a loop, a huge `indent`/`replace`, a deeply nested \
             value?), so its worker process was stopped",
            WORKER_MEMORY_BYTES >> 30,
            MAX_RENDERED_BYTES >> 20
        )
    };
    if worker.stdin.write_all(line.as_bytes()).is_err() || worker.stdin.flush().is_err() {
        return Err(Fault::NotSent);
    }
    let mut reply = Vec::new();
    // The answer line is at most the text's JSON (escapes at most 6 bytes per byte) plus a little.
    let limit = (MAX_RENDERED_BYTES * 6 + 4096) as u64;
    match (&mut worker.stdout)
        .take(limit)
        .read_until(b'\n', &mut reply)
    {
        Ok(0) | Err(_) => return Err(Fault::Died(died("failed"))),
        Ok(_) if !reply.ends_with(b"\n") => {
            return Err(Fault::Died(died("gave too long an answer")))
        }
        Ok(_) => {}
    }
    serde_json::from_slice(&reply)
        .map_err(|e| Fault::Died(format!("the chat-template worker's answer: {e}")))
}

/// The worker's main (`rlvr __rlvr-render RLVR_PID`): limits its own memory, then answers
/// requests until stdin closes (chat templates, and `extra`'s kinds through [`call`]); never
/// returns.
pub fn main(args: &[std::ffi::OsString], extra: Option<Extra>) -> ! {
    let parent = args
        .first()
        .and_then(|a| a.to_str())
        .and_then(|a| a.parse::<i32>().ok());
    #[cfg(target_os = "linux")]
    // SAFETY: plain system calls with integer arguments and a pointer to a local struct.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
            std::process::exit(1);
        }
        if parent.is_some_and(|p| libc::getppid() != p) {
            std::process::exit(1);
        }
        let limit = libc::rlimit {
            rlim_cur: WORKER_MEMORY_BYTES as libc::rlim_t,
            rlim_max: WORKER_MEMORY_BYTES as libc::rlim_t,
        };
        if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
            std::process::exit(1);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = parent;
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    let mut line = String::new();
    let mut input = stdin.lock();
    loop {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) | Err(_) => std::process::exit(0),
            Ok(_) => {}
        }
        let answer = match serde_json::from_str::<Request>(&line) {
            Err(e) => Answer::Error(format!("a malformed request to the worker: {e}")),
            Ok(r) => match match (&r.kind, extra) {
                (Some(kind), Some(extra)) => extra(kind, r.payload.as_deref().unwrap_or("")),
                (Some(kind), None) => Err(format!("this worker renders no `{kind}`")),
                (None, _) => crate::tokenizer::render_in_process(
                    &r.template,
                    &r.messages,
                    r.add_generation_prompt,
                    r.bos_token.as_deref(),
                    r.eos_token.as_deref(),
                ),
            } {
                Ok(t) if t.len() > MAX_RENDERED_BYTES => Answer::Error(format!(
                    "the rendered prompt is {} bytes, more than the {} MiB one prompt may have",
                    t.len(),
                    MAX_RENDERED_BYTES >> 20
                )),
                Ok(t) => Answer::Text(t),
                Err(e) => Answer::Error(e),
            },
        };
        let mut out = serde_json::to_vec(&answer).unwrap_or_default();
        out.push(b'\n');
        if stdout
            .write_all(&out)
            .and_then(|()| stdout.flush())
            .is_err()
        {
            std::process::exit(0);
        }
    }
}
