//! Persistent external verifiers: the examples in `examples/` score the same in both modes and see
//! the row's columns and index; a persistent program starts once, is restarted a bounded number of
//! times when it dies, fails a batch on a timeout, a bad reply or an error reply, and is gone with
//! its children when the verifier is dropped.
#![cfg(unix)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rlvr_reward::combine::{
    ComponentConfig, ExternalMode, RewardConfig, RewardFunction, VerifierConfig,
};
use rlvr_reward::external::ExternalVerifier;
use rlvr_reward::persistent::PersistentVerifier;
use rlvr_reward::{Sample, Score, Verifier};

fn example(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name);
    assert!(p.is_file(), "{} is missing", p.display());
    p.display().to_string()
}

fn python() -> bool {
    let ok = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "python3 is needed by this test and was not found (Debian: apt-get install python3); a test does not pass without running");
    ok
}

fn persistent(command: &[&str], timeout_s: f64, restarts: u32) -> PersistentVerifier {
    PersistentVerifier::new(
        command.iter().map(|s| s.to_string()).collect(),
        Duration::from_secs_f64(timeout_s),
        restarts,
    )
}

fn rewards(s: &[Score]) -> Vec<f64> {
    s.iter().map(|s| s.reward).collect()
}

/// Three samples; the first row has a `points` column of 2.
fn samples(cols: &[Vec<(String, String)>]) -> Vec<Sample<'_>> {
    vec![
        Sample {
            prompt: "2+2=",
            completion: "so\n4",
            reference: "4",
            columns: &cols[0],
            index: Some(7),
        },
        Sample {
            prompt: "2+3=",
            completion: "6",
            reference: "5",
            columns: &cols[1],
            index: Some(8),
        },
        Sample {
            prompt: "1+1=",
            completion: "2",
            reference: "2",
            columns: &cols[1],
            index: None,
        },
    ]
}

fn columns() -> Vec<Vec<(String, String)>> {
    vec![
        vec![
            ("question".into(), "2+2".into()),
            ("points".into(), "2".into()),
        ],
        vec![("question".into(), "q".into())],
    ]
}

#[test]
fn both_examples_score_alike_and_the_persistent_one_starts_once() {
    if !python() {
        return;
    }
    let cols = columns();
    let s = samples(&cols);
    let per_batch = ExternalVerifier {
        command: vec!["python3".into(), example("reward_per_batch.py")],
        timeout: Duration::from_secs(60),
        env: Vec::new(),
        max_stdout: rlvr_reward::external::MAX_STDOUT_BYTES,
    };
    let p = persistent(&["python3", &example("reward_persistent.py")], 60.0, 0);
    assert_eq!(p.starts(), 0, "nothing starts before the first batch");
    let want = [2.0, 0.0, 1.0];
    let a = per_batch.score_batch(&s).unwrap();
    assert_eq!(rewards(&a), want);
    for _ in 0..3 {
        let b = p.score_batch(&s).unwrap();
        assert_eq!(b, a);
    }
    assert_eq!(p.starts(), 1);
    assert_eq!(a[1].extracted.as_deref(), Some("6"));
    assert!(!a[1].correct && a[2].correct);
}

#[test]
fn items_carry_the_index_and_every_column() {
    if !python() {
        return;
    }
    let cols = columns();
    let s = samples(&cols);
    // Reward: the index (-1 when null) plus 100 × the number of columns.
    let prog = r#"
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    out = [(-1 if it["index"] is None else it["index"]) + 100 * len(it["row"]) for it in req["items"]]
    assert req["version"] == 1
    print(json.dumps({"rewards": out}), flush=True)
"#;
    let p = persistent(&["python3", "-c", prog], 60.0, 0);
    assert_eq!(rewards(&p.score_batch(&s).unwrap()), [207.0, 108.0, 99.0]);
}

#[test]
fn a_dying_program_is_restarted_a_bounded_number_of_times() {
    // Answers one batch, then exits.
    let p = persistent(
        &["sh", "-c", r#"read -r l; echo '{"rewards": [1, 0.5]}'"#],
        10.0,
        3,
    );
    let s = [Sample::new("a", "1"), Sample::new("b", "2")];
    for k in 1..=4 {
        assert_eq!(
            rewards(&p.score_batch(&s).unwrap()),
            [1.0, 0.5],
            "batch {k}"
        );
        assert_eq!(p.starts(), k);
    }
    let e = p.score_batch(&s).unwrap_err().to_string();
    assert!(e.contains("after 3 restarts"), "{e}");
    assert_eq!(p.starts(), 4);
}

#[test]
fn bad_replies_fail_the_batch_with_the_cause() {
    let s = [Sample::new("a", "1"), Sample::new("b", "2")];
    let check = |script: &str, timeout_s: f64, want: &str| {
        let p = persistent(&["sh", "-c", script], timeout_s, 3);
        let t0 = Instant::now();
        let e = p.score_batch(&s).unwrap_err().to_string();
        assert!(e.contains(want), "{script}: {e}");
        assert!(e.contains("external verifier `sh -c"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{script}");
        // A fatal failure does not count as a restart.
        assert_eq!(p.starts(), 1, "{script}");
    };
    check(
        "read -r l; sleep 30",
        0.3,
        "timed out after 0.3 s on a batch of 2",
    );
    check(
        r#"read -r l; echo '{"rewards": [1]}'; sleep 30"#,
        10.0,
        "1 rewards for 2 items",
    );
    check(
        r#"read -r l; echo '{"error": "no GPU"}'; sleep 30"#,
        10.0,
        "reported an error: no GPU",
    );
    check(
        r#"read -r l; echo '{"version": 2, "rewards": [1, 1]}'; sleep 30"#,
        10.0,
        "protocol version 2",
    );
    check(
        r#"read -r l; echo 'hello'; sleep 30"#,
        10.0,
        "expected {\"rewards\"",
    );
    check(
        r#"read -r l; echo '{"rewards": [1, {"correct": true}]}'; sleep 30"#,
        10.0,
        "reply",
    );
}

#[test]
fn an_exit_status_and_stderr_are_reported() {
    let p = persistent(
        &["sh", "-c", "echo 'cannot load model' >&2; exit 4"],
        10.0,
        1,
    );
    let e = p.score(&Sample::new("a", "1")).unwrap_err().to_string();
    assert!(
        e.contains("exit status: 4") && e.contains("cannot load model"),
        "{e}"
    );
    assert_eq!(p.starts(), 2);
}

fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|st| st == "Z" || st == "X"),
    }
}

#[test]
fn dropping_the_verifier_ends_the_program_and_its_children() {
    let d = tempfile::tempdir().unwrap();
    let pidfile = d.path().join("child.pid");
    // A background child that would outlive the program, and a program that ignores the end of
    // its stdin (it must be killed after the grace period).
    let script = format!(
        r#"sleep 300 & echo $! > {}; while true; do read -r l && echo '{{"rewards": [1]}}'; sleep 0.05; done"#,
        pidfile.display()
    );
    let p = persistent(&["sh", "-c", &script], 10.0, 0);
    assert_eq!(
        rewards(&p.score_batch(&[Sample::new("a", "1")]).unwrap()),
        [1.0]
    );
    let child: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!dead(child));
    let t0 = Instant::now();
    drop(p);
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(4), "drop took {waited:?}");
    let t0 = Instant::now();
    while !dead(child) && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        dead(child),
        "the program's background child outlived the verifier"
    );
}

/// A persistent verifier through the config, as a run builds it; prints the time per batch of
/// both modes for the guide's closing note (`--nocapture`).
#[test]
fn config_builds_a_persistent_verifier_and_times_both_modes() {
    if !python() {
        return;
    }
    let cfg: RewardConfig = toml_like(&example("reward_persistent.py"), "persistent");
    assert_eq!(
        cfg.components[0].verifier,
        VerifierConfig::External {
            command: vec!["python3".into(), example("reward_persistent.py")],
            timeout_s: 60.0,
            mode: ExternalMode::Persistent,
            restarts: 3,
            env: Vec::new(),
        }
    );
    let cols = columns();
    let s = samples(&cols);
    let mut times = Vec::new();
    for (file, mode) in [
        ("reward_per_batch.py", "per_batch"),
        ("reward_persistent.py", "persistent"),
    ] {
        let f =
            RewardFunction::from_config(&toml_like(&example(file), mode), &VerifierConfig::Math {})
                .unwrap();
        // The first batch pays the persistent program's start-up; the next ten are timed.
        f.score_batch(&s).unwrap();
        let batches = 10;
        let t0 = Instant::now();
        for _ in 0..batches {
            let r = f.score_batch(&s).unwrap();
            assert_eq!(
                r.iter().map(|b| b.reward).collect::<Vec<_>>(),
                [2.0, 0.0, 1.0]
            );
        }
        times.push(t0.elapsed().as_secs_f64() * 1000.0 / batches as f64);
    }
    eprintln!(
        "time per batch of 3: per_batch {:.1} ms, persistent {:.1} ms",
        times[0], times[1]
    );
}

/// `[reward]` with one external component in `mode`, read from JSON as the TOML loader would.
fn toml_like(script: &str, mode: &str) -> RewardConfig {
    let mut verifier = serde_json::json!({"kind": "external", "command": ["python3", script]});
    if mode != "per_batch" {
        verifier["mode"] = mode.into();
    }
    let cfg: RewardConfig =
        serde_json::from_value(serde_json::json!({"components": [{"verifier": verifier}]}))
            .unwrap();
    let _: &ComponentConfig = &cfg.components[0];
    cfg
}
