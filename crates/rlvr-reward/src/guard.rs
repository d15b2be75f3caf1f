//! The guard: a small process between rlvr and each program it starts (verifiers, environments),
//! so that the program's whole process tree dies with rlvr, even when rlvr is killed by `SIGKILL`
//! and runs no code of its own (issue 49, item 3).
//!
//! Why a process: the kernel's parent-death signal (`PR_SET_PDEATHSIG`) reaches only a direct child,
//! so a verifier that runs the model's code in a subprocess, or a shell's background job, outlived a
//! `kill -9` of rlvr. The guard is rlvr's own executable started again with [`GUARD_ARG`] (no extra
//! binary to ship, and no copy of rlvr's memory kept alive, as a `fork` without `exec` would):
//!
//! ```text
//! rlvr ──spawn──▶ guard (its own process group; parent-death signal SIGTERM)
//!                   └──spawn──▶ program (same group; parent-death signal SIGKILL)
//!                                 └── its children (same group unless they leave it)
//! ```
//!
//! The program inherits the guard's standard streams (rlvr's pipes), its environment and working
//! directory; the guard then points its own streams at `/dev/null`, so that the program closing
//! its output is seen by rlvr as before. The guard waits for the program and exits as it did (the
//! same exit code, or the same signal). When rlvr dies, the kernel sends the guard `SIGTERM`, and
//! the guard kills its whole process group with `SIGKILL`: the program and every process it
//! started that stayed in the group. `SIGINT` and `SIGHUP` to the guard do the same. When rlvr
//! itself ends a program, it kills the guard's group ([`crate::external::kill_group`]), as it did
//! before the guard existed.
//!
//! Not covered: a descendant that leaves the process group on purpose (`setsid`, a daemon) is not
//! in the group the guard kills; only a cgroup would hold it, which an unprivileged rlvr cannot
//! count on having.
//!
//! The guard is used once the binary calls [`enable`] (the `rlvr` binary does at start); a library
//! user that does not (unit tests) gets the program started directly, with its own parent-death
//! signal as before.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The first argument that makes `rlvr` run as a guard: `rlvr __rlvr-guard RLVR_PID PROGRAM
/// [ARGS...]`. Not a subcommand a user types (it is not in `--help`).
pub const GUARD_ARG: &str = "__rlvr-guard";

static GUARD_EXE: OnceLock<PathBuf> = OnceLock::new();

/// Starts every later program through the guard: `exe` is the executable that runs [`main`] when
/// its first argument is [`GUARD_ARG`] (the `rlvr` binary passes its own path). A second call is
/// ignored.
pub fn enable(exe: PathBuf) {
    let _ = GUARD_EXE.set(exe);
}

/// The guard's executable, once [`enable`]d.
pub(crate) fn exe() -> Option<&'static Path> {
    GUARD_EXE.get().map(PathBuf::as_path)
}

/// The exit code of a guard whose program could not be started (as a shell's "command not found").
pub const CANNOT_START: i32 = 127;

/// Runs the guard (see the module docs) with `args` = `RLVR_PID PROGRAM [ARGS...]`, the arguments
/// after [`GUARD_ARG`]; never returns. Exits 127 ([`CANNOT_START`]) with the reason on stderr when
/// the program cannot be started, 1 when the arguments are malformed or rlvr is already gone, and
/// otherwise as the program did.
pub fn main(args: &[OsString]) -> ! {
    use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM};
    // Registered before the program starts, so that neither its end nor rlvr's is missed.
    let mut signals = match signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGCHLD])
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rlvr guard: cannot watch signals: {e}");
            std::process::exit(1);
        }
    };
    let parent = args
        .first()
        .and_then(|a| a.to_str())
        .and_then(|a| a.parse::<i32>().ok());
    let (Some(parent), Some(program)) = (parent, args.get(1)) else {
        eprintln!("rlvr guard: usage: rlvr {GUARD_ARG} RLVR_PID PROGRAM [ARGS...]");
        std::process::exit(1);
    };
    // rlvr asked the kernel for our SIGTERM at its death before exec (asked again here, for a
    // guard started otherwise); rlvr may have died before that.
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM));
    if rustix::process::getppid().map(|p| p.as_raw_nonzero().get()) != Some(parent) {
        std::process::exit(1);
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(&args[2..]);
    die_with_parent(&mut cmd, rustix::process::Signal::KILL);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("could not start it: {e} (check the path and that it is executable)");
            std::process::exit(CANNOT_START);
        }
    };
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = rustix::stdio::dup2_stdin(&null);
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
    }
    for signal in signals.forever() {
        if signal != SIGCHLD {
            // rlvr died (our parent-death signal) or someone ends us: the whole group goes,
            // this process included.
            let _ = rustix::process::kill_current_process_group(rustix::process::Signal::KILL);
            std::process::exit(128 + signal);
        }
        match child.try_wait() {
            Ok(Some(status)) => exit_as(status),
            Ok(None) => {}
            Err(_) => std::process::exit(1),
        }
    }
    std::process::exit(1)
}

/// Ends this process as `status` ended the program: the same code, or the same signal.
fn exit_as(status: std::process::ExitStatus) -> ! {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        std::process::exit(code);
    }
    if let Some(signal) = status.signal() {
        let _ = signal_hook::low_level::emulate_default_handler(signal);
        std::process::exit(128 + signal);
    }
    std::process::exit(1)
}

/// Makes `cmd`'s child ask for `signal` when its parent dies (`prctl(PR_SET_PDEATHSIG)`), and
/// exit at once if the parent already died between the fork and that call.
pub(crate) fn die_with_parent(cmd: &mut std::process::Command, signal: rustix::process::Signal) {
    use rustix::process::{getpid, getppid, set_parent_process_death_signal};
    use std::os::unix::process::CommandExt;
    let rlvr = getpid();
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // calls are allowed: it makes two system calls (prctl, getppid) through rustix, which are
    // plain syscalls, and allocates nothing (an `Errno` converts to `io::Error` without a heap
    // allocation).
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            set_parent_process_death_signal(Some(signal))?;
            if getppid() != Some(rlvr) {
                return Err(rustix::io::Errno::SRCH.into());
            }
            Ok(())
        });
    }
}
