//! The guard process between rlvr and the programs it starts (rlvr-reward's `guard` module, issue
//! 49 item 3), run directly as `rlvr __rlvr-guard PARENT_PID PROGRAM ARGS...` with this test
//! process as the parent: it exits as its program did, says why a program cannot start, and kills
//! its whole process group when it is told to end.
#![cfg(target_os = "linux")]

use crate::common::{alive, left_after, rlvr};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn guard(program: &[&str]) -> Command {
    let mut c = rlvr();
    c.arg("__rlvr-guard")
        .arg(std::process::id().to_string())
        .args(program);
    c
}

#[test]
fn the_guard_exits_as_its_program_did_and_passes_its_streams_through() {
    let out = guard(&["sh", "-c", "read x; echo \"got $x\"; echo oops >&2; exit 3"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b"hello\n")?;
            c.wait_with_output()
        })
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "got hello\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");
    // A program killed by a signal: the guard ends by the same signal.
    let st = guard(&["sh", "-c", "kill -USR1 $$"]).status().unwrap();
    assert_eq!(st.signal(), Some(10), "SIGUSR1 (10 on Linux): {st:?}");
}

#[test]
fn a_program_that_cannot_start_is_named_with_exit_127() {
    let out = guard(&["/nonexistent/verifier"]).output().unwrap();
    assert_eq!(out.status.code(), Some(127));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("could not start it") && err.contains("No such file"),
        "{err}"
    );
    // A wrong parent pid (rlvr already gone): nothing is started.
    let out = rlvr()
        .args(["__rlvr-guard", "1", "sh", "-c", "echo started"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
}

#[test]
fn a_terminated_guard_kills_its_programs_whole_group() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let script = format!(
        "sleep 1005 & echo $! $$ > {0}.tmp; mv {0}.tmp {0}; sleep 1006",
        pids.display()
    );
    let mut g = guard(&["sh", "-c", &script])
        .process_group(0)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !pids.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the program did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pids: Vec<String> = std::fs::read_to_string(&pids)
        .unwrap()
        .split_whitespace()
        .map(String::from)
        .collect();
    assert!(pids.iter().all(|p| alive(p)), "{pids:?}");
    // What the kernel sends the guard when rlvr dies.
    Command::new("kill")
        .args(["-TERM", &g.id().to_string()])
        .status()
        .unwrap();
    let st = g.wait().unwrap();
    assert_eq!(
        st.signal(),
        Some(9),
        "the guard ends with its group: {st:?}"
    );
    let left = left_after(&pids, 5);
    assert!(left.is_empty(), "{left:?} outlived the guard");
}
