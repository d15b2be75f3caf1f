//! SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal went away: a dropped SSH session without
//! `nohup`) for `rlvr train`: the first asks the run to save a checkpoint after
//! the current step and stop; a second one exits at once, killing the external verifiers' process
//! groups first. During start-up (loading the model and the data, rendering the prompts: nothing
//! to save yet, and it may take minutes) the first signal exits at once, saying so. An interrupted run exits with the shell's
//! code for the signal, 128 + its number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), so that
//! `rlvr train ... && rlvr eval ...` does not go on after an interruption.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// The first signal received (0 = none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// Whether a run of this process has finished its start-up ([`started`]): a first signal before
/// then exits at once, as there is no step to finish and nothing to save.
static STARTED: AtomicBool = AtomicBool::new(false);

/// Marks the end of start-up: from now on a first signal saves after the current step.
pub(crate) fn started() {
    STARTED.store(true, Ordering::SeqCst);
}

/// The first of SIGINT/SIGTERM/SIGHUP received since [`install`], if any.
pub(crate) fn received() -> Option<i32> {
    Some(RECEIVED.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

/// `SIGINT`, `SIGTERM`, `SIGHUP` or `signal N`.
pub(crate) fn name(sig: i32) -> String {
    match sig {
        SIGINT => "SIGINT".into(),
        SIGTERM => "SIGTERM".into(),
        SIGHUP => "SIGHUP".into(),
        n => format!("signal {n}"),
    }
}

/// Handles SIGINT, SIGTERM and SIGHUP from now on (SIGHUP first points the standard streams
/// that are terminals at /dev/null, see [`detach_from_terminal`]): the first sets `stop` (the loop saves a checkpoint and
/// returns), the second exits at once with 128 + its number; before [`started`], the first
/// exits at once. The handler runs on its own thread,
/// so printing there is safe. When the handler cannot be installed, the default behaviour (the
/// process dies) stays and a warning says so.
pub(crate) fn install(stop: Arc<AtomicBool>) {
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(s) => s,
        Err(e) => {
            crate::log::say(&format!(
                "warning: cannot handle SIGINT/SIGTERM/SIGHUP ({e}); an interruption will not save a checkpoint"
            ));
            return;
        }
    };
    std::thread::spawn(move || {
        for sig in signals.forever() {
            if sig == SIGHUP {
                detach_from_terminal();
            }
            let _ = RECEIVED.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
            if !STARTED.load(Ordering::SeqCst) {
                eprintln!(
                    "\n{}: stopping during start-up (loading the model or the data, rendering the \
                     prompts): no step has run, so there is nothing to save",
                    name(sig)
                );
                rlvr_reward::external::kill_all_groups();
                std::process::exit(128 + sig);
            }
            if stop.swap(true, Ordering::SeqCst) {
                // No clean-up of ours runs after exit: end the verifiers' process groups first
                // (the parent-death signal would reach their programs, not their children).
                rlvr_reward::external::kill_all_groups();
                std::process::exit(128 + sig);
            }
            eprintln!(
                "\n{}: saving a checkpoint after the current step, then stopping (again to quit now)",
                name(sig)
            );
        }
    });
}

/// After an interrupted run printed its summary: flushes `out` and exits with 128 + the signal's
/// number. Returns when `interrupted` is false (or no signal was recorded, e.g. the stop flag was
/// set by a caller).
pub(crate) fn exit_if_interrupted(interrupted: bool, out: &mut dyn Write) {
    if let (true, Some(sig)) = (interrupted, received()) {
        let _ = out.flush();
        let _ = std::io::stderr().flush();
        rlvr_reward::external::kill_all_groups();
        std::process::exit(128 + sig);
    }
}

/// After SIGHUP the terminal is gone: a write to it fails (EIO), and Rust's `eprintln!` panics on
/// a failed write. Every standard stream that is a terminal is pointed at /dev/null, so the run
/// saves and stops quietly; train.log keeps what it would have shown. Streams redirected to files
/// or pipes are left alone.
fn detach_from_terminal() {
    use std::io::IsTerminal;
    let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    else {
        return;
    };
    if std::io::stdin().is_terminal() {
        let _ = rustix::stdio::dup2_stdin(&null);
    }
    if std::io::stdout().is_terminal() {
        let _ = rustix::stdio::dup2_stdout(&null);
    }
    if std::io::stderr().is_terminal() {
        let _ = rustix::stdio::dup2_stderr(&null);
    }
}
