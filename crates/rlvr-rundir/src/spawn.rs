//! Child processes forked from one thread that lives as long as the process.
//!
//! Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`), which rlvr's template-worker process
//! asks for so that it dies with rlvr (rlvr-reward's guard processes too, through that crate's
//! own copy of this function: both crates are in layer 0), fires when the *thread* that
//! forked them exits, not the process. A program started from a thread that later ends (an
//! explorer or evaluation thread, a test's thread) would be killed while rlvr goes on, possibly
//! in the middle of a request. [`from_lasting_thread`] forks every such child from one thread
//! that never ends, so they die with the process only.

use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type Request = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` from the process's spawner thread (started on first use, named
/// `rlvr-spawner`, never ending), and returns the child as [`Command::spawn`] does.
///
/// # Errors
/// As [`Command::spawn`]. Should the spawner thread fail to start (the OS refused a thread), the
/// child is spawned on the caller's thread, with a warning on stderr.
pub fn from_lasting_thread(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        let started = std::thread::Builder::new()
            .name("rlvr-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            });
        if let Err(e) = started {
            // No thread: the sends below fail and each spawn happens on the caller's thread.
            eprintln!("warning: could not start the process spawner thread: {e}");
        }
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    let sent = spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply));
    match sent {
        Ok(()) => answer
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the process spawner thread is gone"))),
        Err(mpsc::SendError((mut cmd, _))) => cmd.spawn(),
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Child, Command};
    use std::time::Duration;

    /// `sleep 30` that asks for SIGKILL when its parent thread dies (util-linux's `setpriv`).
    fn sleeper() -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "sleep", "30"]);
        cmd
    }

    fn alive_after_its_thread(spawn: fn(Command) -> std::io::Result<Child>) -> bool {
        let mut child = std::thread::spawn(move || {
            let child = spawn(sleeper()).unwrap();
            // Until `setpriv` has asked for the signal (a parent gone before that sends none).
            std::thread::sleep(Duration::from_millis(200));
            child
        })
        .join()
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let alive = matches!(child.try_wait(), Ok(None));
        let _ = child.kill();
        let _ = child.wait();
        alive
    }

    /// A child that asked for a parent-death signal, spawned for a thread that then ends: killed
    /// when forked by that thread (the kernel's rule), alive when forked by the spawner thread.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_child_outlives_the_thread_that_asked_for_it() {
        let have = Command::new("setpriv").arg("--version").output();
        assert!(
            have.is_ok_and(|o| o.status.success()),
            "setpriv (util-linux) is needed by this test; a test does not pass without running"
        );
        assert!(!alive_after_its_thread(|mut c| c.spawn()));
        assert!(alive_after_its_thread(super::from_lasting_thread));
    }
}
