//! SIGINT (Ctrl-C) and SIGTERM for `rlvr train`: the first asks the run to save a checkpoint after
//! the current step and stop; a second one exits at once, killing the external verifiers' process
//! groups first. During start-up (loading the model and the data, rendering the prompts: nothing
//! to save yet, and it may take minutes) the first signal exits at once, saying so. An interrupted run exits with the shell's
//! code for the signal, 128 + its number (130 for SIGINT, 143 for SIGTERM), so that
//! `rlvr train ... && rlvr eval ...` does not go on after an interruption.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM};

/// The first signal received (0 = none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// Whether a run of this process has finished its start-up ([`started`]): a first signal before
/// then exits at once, as there is no step to finish and nothing to save.
static STARTED: AtomicBool = AtomicBool::new(false);

/// Marks the end of start-up: from now on a first signal saves after the current step.
pub(crate) fn started() {
    STARTED.store(true, Ordering::SeqCst);
}

/// The first of SIGINT/SIGTERM received since [`install`], if any.
pub(crate) fn received() -> Option<i32> {
    Some(RECEIVED.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

/// `SIGINT`, `SIGTERM` or `signal N`.
pub(crate) fn name(sig: i32) -> String {
    match sig {
        SIGINT => "SIGINT".into(),
        SIGTERM => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// Handles SIGINT and SIGTERM from now on: the first sets `stop` (the loop saves a checkpoint and
/// returns), the second exits at once with 128 + its number; before [`started`], the first
/// exits at once. The handler runs on its own thread,
/// so printing there is safe. When the handler cannot be installed, the default behaviour (the
/// process dies) stays and a warning says so.
pub(crate) fn install(stop: Arc<AtomicBool>) {
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
        Ok(s) => s,
        Err(e) => {
            crate::log::say(&format!(
                "warning: cannot handle SIGINT/SIGTERM ({e}); an interruption will not save a checkpoint"
            ));
            return;
        }
    };
    std::thread::spawn(move || {
        for sig in signals.forever() {
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
