//! `rlvr reward --task math --explain`: the explanation goes to the log (stderr), stdout keeps the
//! DESIGN.md section 10 format.

use clap::Parser;
use rlvr_reward::cli::{run_with_log, RewardArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: RewardArgs,
}

fn reward(argv: &[&str]) -> (Vec<serde_json::Value>, String) {
    let cli = Cli::try_parse_from(std::iter::once("reward").chain(argv.iter().copied())).unwrap();
    let (mut out, mut log) = (Vec::new(), Vec::new());
    run_with_log(&cli.args, &mut out, &mut log).unwrap();
    let lines = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (lines, String::from_utf8(log).unwrap())
}

#[test]
fn explain_goes_to_the_log_and_stdout_is_unchanged() {
    let base = [
        "--task",
        "math",
        "--completion",
        "so $\\boxed{x \\ge 5}$",
        "--reference",
        "[5, \\infty)",
    ];
    let (plain, log) = reward(&base);
    assert!(log.is_empty(), "no explanation without --explain: {log}");
    let mut with = base.to_vec();
    with.push("--explain");
    let (explained, log) = reward(&with);
    assert_eq!(plain, explained, "stdout must not change with --explain");
    assert_eq!(
        explained[0],
        serde_json::json!({"reward": 1.0, "extracted": "x \\ge 5", "gold": "[5, \\infty)"})
    );
    for needle in [
        "gold:",
        "interval or tuple",
        "extracted:",
        "relation",
        "verdict:   equal",
        "compared as sets of intervals",
    ] {
        assert!(log.contains(needle), "{needle:?} missing from:\n{log}");
    }
}

#[test]
fn explain_says_why_not() {
    let (v, log) = reward(&[
        "--task",
        "math",
        "--completion",
        "\\boxed{11a+c}",
        "--reference",
        "7 = 11a+c",
        "--explain",
    ]);
    assert_eq!(v[0]["reward"], 0.0);
    assert!(log.contains("verdict:   not equal"), "{log}");
    assert!(log.contains("gold is an equation without a label"), "{log}");
    let (_, log) = reward(&[
        "--task",
        "math",
        "--completion",
        "no box here",
        "--reference",
        "7",
        "--explain",
    ]);
    assert!(log.contains("no complete \\boxed{}"), "{log}");
}

#[test]
fn explain_per_input_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.jsonl");
    std::fs::write(
        &path,
        "{\"completion\": \"\\\\boxed{-2} and \\\\boxed{1}\", \"reference\": \"1,-2\"}\n{\"completion\": \"\\\\boxed{3}\", \"reference\": \"4\"}\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let (v, log) = reward(&["--task", "math", "--input", p, "--explain"]);
    assert_eq!(v.len(), 2);
    assert_eq!(
        v[0],
        serde_json::json!({"reward": 1.0, "extracted": "-2, 1", "gold": "1,-2"})
    );
    assert_eq!(v[1]["reward"], 0.0);
    assert!(
        log.contains("== line 1") && log.contains("== line 2"),
        "{log}"
    );
    assert!(log.contains("all 2 boxes read as one list"), "{log}");
    // Other tasks explain the extracted values.
    let (_, log) = reward(&["--completion", "#### 5", "--reference", "5", "--explain"]);
    assert!(log.contains("verdict:   equal"), "{log}");
}
