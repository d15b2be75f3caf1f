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
        max_stdout: rlvr_reward::external::MAX_STDOUT_BYTES,
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

#[test]
fn a_verifier_flooding_stdout_is_killed_at_the_limit_not_the_timeout() {
    // Issue 49, item 10: `yes` writes without end; the batch fails once 1 MiB is passed, long
    // before the 60 s timeout, and the program's group (the shell and `yes`) is killed.
    let d = tempfile::tempdir().unwrap();
    let pidfile = d.path().join("yes.pid");
    let mut v = verifier(format!("yes & echo $! > {}; wait", pidfile.display()), 60.0);
    v.max_stdout = 1 << 20;
    let t0 = Instant::now();
    let e = v.score(&Sample::new("1", "1")).unwrap_err().to_string();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(
        e.contains(
            "wrote more than 1048576 bytes of stdout for a batch of 1 (the limit; it was killed \
             and the rest was not read)"
        ),
        "{e}"
    );
    assert!(e.contains("sh -c yes &"), "names the program: {e}");
    let child = read_pid(&pidfile);
    assert!(wait_dead(child), "`yes` ({child}) survived");
}

#[test]
fn a_verifier_flooding_stderr_keeps_only_its_tail() {
    // 8 MiB of stderr, then a clean reply: the batch scores, and a failing one shows the end of
    // its stderr, not the start.
    let ok = verifier(
        "head -c 8388608 /dev/zero | tr '\\0' x >&2; read l; echo '{\"reward\": 1}'".into(),
        60.0,
    );
    let s = ok.score(&Sample::new("1", "1")).unwrap();
    assert_eq!(s.reward, 1.0);
    let bad = verifier(
        "head -c 8388608 /dev/zero | tr '\\0' x >&2; echo THE-END >&2; exit 3".into(),
        60.0,
    );
    let e = bad.score(&Sample::new("1", "1")).unwrap_err().to_string();
    assert!(e.contains("exited with exit status: 3; stderr: …"), "{e}");
    assert!(
        e.ends_with("xxxxTHE-END"),
        "{}",
        &e[e.len().saturating_sub(80)..]
    );
    assert!(e.len() < 3000, "{} bytes", e.len());
}
