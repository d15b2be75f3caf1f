//! An external verifier's children end with it: on timeout the whole process group is killed, and a
//! child left in the background after a clean exit does not outlive the batch (a verifier
//! script that forks must not leave processes behind a long run).
#![cfg(unix)]

use std::path::Path;
use std::time::{Duration, Instant};

use rlvr_reward::external::ExternalVerifier;
use rlvr_reward::{Sample, Verifier};

/// Whether process `pid` is gone (no /proc entry, or a zombie nobody reaped yet).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // Field 3 (after "pid (comm)") is the state; Z = zombie, X = dead.
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|st| st == "Z" || st == "X"),
    }
}

fn wait_dead(pid: u32) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if dead(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn read_pid(path: &Path) -> u32 {
    let t0 = Instant::now();
    loop {
        if let Some(p) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return p;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "no pid written");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn verifier(script: String, timeout_s: f64) -> ExternalVerifier {
    ExternalVerifier {
        command: vec!["sh".into(), "-c".into(), script],
        timeout: Duration::from_secs_f64(timeout_s),
        env: Vec::new(),
    }
}

#[test]
fn a_timed_out_verifier_and_its_child_are_both_killed() {
    let d = tempfile::tempdir().unwrap();
    let pidfile = d.path().join("child.pid");
    // The shell starts a long child and waits for it: only killing the group ends the child.
    let v = verifier(
        format!("sleep 300 & echo $! > {}; wait", pidfile.display()),
        0.5,
    );
    let t0 = Instant::now();
    let e = v.score(&Sample::new("1", "1")).unwrap_err().to_string();
    assert!(e.contains("timed out after 0.5 s"), "{e}");
    // The error comes at the timeout, not when the child would have finished.
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let child = read_pid(&pidfile);
    assert!(wait_dead(child), "the verifier's child {child} still runs");
}

#[test]
fn a_child_left_in_the_background_does_not_outlive_the_batch() {
    let d = tempfile::tempdir().unwrap();
    let pidfile = d.path().join("child.pid");
    // Replies correctly, but leaves a background child holding stdout open.
    let v = verifier(
        format!(
            "cat >/dev/null; sleep 300 & echo $! > {}; echo '{{\"reward\": 1}}'",
            pidfile.display()
        ),
        30.0,
    );
    let t0 = Instant::now();
    let s = v.score(&Sample::new("1", "1")).unwrap();
    assert_eq!(s.reward, 1.0);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let child = read_pid(&pidfile);
    assert!(wait_dead(child), "the verifier's child {child} still runs");
}
