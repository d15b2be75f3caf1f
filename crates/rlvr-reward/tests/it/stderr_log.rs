//! `LineProcess::start_logged`: a program's stderr written in full to a `StderrLog` (a training
//! run's `env.stderr`), beyond the tail that error messages keep, and cut at the log's cap.

use rlvr_reward::process::{LineProcess, StderrLog, STDERR_KEEP};
use std::time::{Duration, Instant};

/// Starts `sh -c script` with `log`, reads its one stdout line, and ends it.
fn run(script: &str, log: &StderrLog) {
    let cmd = ["sh".to_string(), "-c".into(), script.into()];
    let p = LineProcess::start_logged(&cmd, &[], None, 1 << 20, Some(log.clone())).unwrap();
    let line = p
        .recv_line(Instant::now() + Duration::from_secs(30))
        .unwrap();
    assert_eq!(line, "ready");
    p.end(Duration::from_secs(2));
}

/// What the program wrote: `line 1` to `line N`, one per line.
fn lines(n: usize) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}

/// The reader thread writes as it reads: wait until the file is `want` long (bounded).
fn read_when(path: &std::path::Path, len: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = std::fs::read_to_string(path).unwrap_or_default();
        if got.len() >= len || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_whole_stderr_is_logged_and_appended_across_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("env.stderr");
    let log = StderrLog::append(&path, 1 << 20).unwrap();
    let script =
        "i=1; while [ $i -le 2000 ]; do echo \"line $i\" >&2; i=$((i+1)); done; echo ready";
    run(script, &log);
    let want = lines(2000);
    assert!(want.len() > 4 * STDERR_KEEP, "more than the tail keeps");
    assert_eq!(read_when(&path, want.len()), want);
    // A second start (a restart) and rlvr's own line: appended, in order.
    log.write(b"[rlvr: again]\n");
    run("echo 'second start' >&2; echo ready", &log);
    let want = format!("{want}[rlvr: again]\nsecond start\n");
    assert_eq!(read_when(&path, want.len()), want);
    // A new log on the same file (a resumed run) appends too.
    let again = StderrLog::append(&path, 1 << 20).unwrap();
    again.write(b"resumed\n");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        format!("{want}resumed\n")
    );
    assert_eq!(again.path(), path);
}

#[test]
fn a_log_stops_at_its_cap_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("env.stderr");
    let log = StderrLog::append(&path, 100).unwrap();
    run(
        "i=1; while [ $i -le 50 ]; do echo \"line $i\" >&2; i=$((i+1)); done; echo ready",
        &log,
    );
    let note = "\n[rlvr: this log reached its cap of 100 bytes; the rest of the program's stderr is not kept here]\n";
    let want = format!("{}{note}", &lines(50)[..100]);
    assert_eq!(read_when(&path, want.len()), want);
    // Nothing more once closed.
    log.write(b"more\n");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
}
